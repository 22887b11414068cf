"""The core's extension points (mesh_tensorflow.extensions), as a strategy
outside the package would use them."""

import contextlib
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import extensions

BATCH = mtf.Dimension("batch", 4)
D = mtf.Dimension("d", 3)


@dataclasses.dataclass(frozen=True)
class _Tag(extensions.Annotation):
  """Records the operations lowered under it and passes itself on to the
  operations of its operation's gradient."""
  label: str
  log: list = dataclasses.field(default_factory=list, compare=False)

  def lowering_scope(self, operation, lowering):
    @contextlib.contextmanager
    def scope():
      self.log.append(("lower", operation.name))
      yield
    return scope()

  def gradient_created(self, operation, created):
    for op in created:
      op.annotate(self)


def _graph():
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, "mesh")


def test_annotations_are_declared_typed_and_replaced_by_class():
  _, mesh = _graph()
  x = mtf.zeros(mesh, [BATCH, D])
  op = (x * 2.0).operation
  assert op.annotations == () and op.annotation(_Tag) is None
  op.annotate(_Tag("a"))
  op.annotate(_Tag("b"))
  assert op.annotation(_Tag).label == "b" and len(op.annotations) == 1
  with pytest.raises(TypeError, match="not an mtf extensions.Annotation"):
    op.annotate("a tag")


def test_the_lowering_and_gradients_call_annotation_hooks():
  graph, mesh = _graph()
  w = mtf.get_variable(mesh, "w", [D])
  x = mtf.ones(mesh, [BATCH, D])
  y = x * w
  tag = _Tag("t")
  y.operation.annotate(tag)
  loss = mtf.reduce_sum(y)
  [grad] = mtf.gradients([loss], [w])
  tagged = [op for op in graph.operations if op.annotation(_Tag) is tag]
  assert y.operation in tagged and len(tagged) > 1  # its gradient's too
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "batch:all")
  lowering = mtf.Lowering(graph, {mesh: impl})
  assert [name for _, name in tag.log] == [op.name for op in tagged]
  np.testing.assert_allclose(lowering.export_to_tf_tensor(grad), [4.0] * 3)


def test_variable_creators_run_innermost_first_and_may_rename():
  _, mesh = _graph()
  calls = []

  def prefixer(prefix):
    def creator(next_creator, request):
      calls.append(prefix)
      return next_creator(request.replace(name=prefix + request.name))
    return creator

  with extensions.variable_creator_scope(prefixer("outer_")):
    with extensions.variable_creator_scope(prefixer("inner_")):
      v = mtf.get_variable(mesh, "v", [D])
  assert calls == ["inner_", "outer_"]
  assert v.operation.name == "outer_inner_v"
  assert mtf.get_variable(mesh, "w", [D]).operation.name == "w"


class _Renamed(extensions.MeshExtension):
  """Stores every variable with its dimensions renamed ("<name>_stored"),
  and refuses meshes of 3 processors."""

  def create_variable(self, next_creator, request):
    return next_creator(request.replace(storage_shape=mtf.Shape(
        [mtf.Dimension(d.name + "_stored", d.size)
         for d in request.shape.dims])))

  def check_lowering(self, mesh_impl, mesh):
    if mesh_impl.size == 3:
      raise mtf.LayoutError(f"{mesh.name}: not on 3 processors")


def test_mesh_extensions_create_variables_and_check_the_lowering():
  graph, mesh = _graph()
  mesh.add_extension(_Renamed())
  assert isinstance(mesh.extension(_Renamed), _Renamed)
  v = mtf.get_variable(mesh, "v", [D], initializer=tf.ones_initializer())
  assert graph.name_to_variable["v"].shape.dimension_names == ["d_stored"]
  assert v.shape == mtf.Shape([D])
  # Reused by name: the same storage, the requested shape.
  assert mtf.get_variable(mesh, "v", [D]).operation.inputs[0] is (
      graph.name_to_variable["v"].outputs[0])
  with pytest.raises(mtf.LayoutError, match="not on 3 processors"):
    mtf.Lowering(graph, {mesh: mtf.placement_mesh_impl.PlacementMeshImpl(
        "all:3", "")})
  mesh.remove_extension(_Renamed)
  assert mesh.extensions == ()
  with pytest.raises(TypeError, match="MeshExtension"):
    mesh.add_extension(object())


def test_optimizer_slots_go_through_the_creators():
  _, mesh = _graph()
  seen = []

  def creator(next_creator, request):
    seen.append((request.name, request.slot_of is not None))
    return next_creator(request)

  w = mtf.get_variable(mesh, "w", [D])
  loss = mtf.reduce_sum(w * w)
  [grad] = mtf.gradients([loss], [w])
  with extensions.variable_creator_scope(creator):
    mtf.optimize.AdamWeightDecayOptimizer(0.1).apply_grads(
        [grad], [w.operation])
  assert ("w/adam_m", True) in seen and ("w/adam_v", True) in seen


def test_a_graphs_creators_run_for_its_variables_only():
  graph, mesh = _graph()
  seen = []

  def creator(next_creator, request):
    seen.append(request.name)
    return next_creator(request)

  graph.add_variable_creator(creator)
  graph.add_variable_creator(creator)  # once only
  assert graph.variable_creators == (creator,)
  mtf.get_variable(mesh, "v", [D])
  _, other_mesh = _graph()
  mtf.get_variable(other_mesh, "w", [D])
  assert seen == ["v"]
