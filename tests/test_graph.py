"""Graph, Mesh, Tensor, Operation, VariableDType and naming."""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf


@pytest.fixture
def mesh():
  return mtf.Mesh(mtf.Graph(), "mesh")


def test_unique_names_are_tf_style_and_case_insensitive():
  graph = mtf.Graph()
  assert graph.unique_name("foo") == "foo"
  assert graph.unique_name("Foo") == "Foo_1"
  assert graph.unique_name("foo") == "foo_2"
  assert graph.unique_name("foo_1") == "foo_1_1"
  assert graph.unique_name("bar", mark_as_used=False) == "bar"
  assert graph.unique_name("bar") == "bar"


def test_names_follow_variable_scope(mesh):
  x = mtf.zeros(mesh, "a:2")
  with tf.compat.v1.variable_scope("block"):
    y = mtf.relu(x)
    v = mtf.get_variable(mesh, "w", "a:2")
  assert y.operation.name == "block/relu"
  assert v.operation.name == "block/w"
  assert y.name == "block/relu:0"
  assert mesh.graph.name_to_variable["block/w"] is v.operation


def test_operations_in_creation_order(mesh):
  x = mtf.zeros(mesh, "a:2")
  y = mtf.exp(x)
  z = y + x
  ops = mesh.graph.operations
  assert ops[-3:] == [x.operation, y.operation, z.operation]
  assert z.operation.inputs == [y, x]
  assert z.mesh is mesh and z.graph is mesh.graph


def test_variables_lists(mesh):
  w = mtf.get_variable(mesh, "w", "a:2")
  s = mtf.get_variable(mesh, "step", [], dtype=tf.int32, trainable=False)
  graph = mesh.graph
  assert graph.trainable_variables == [w.operation]
  assert graph.all_variables == [w.operation, s.operation]
  assert mtf.get_variable(mesh, "w", "a:2") is w
  with pytest.raises(mtf.ShapeError, match="'w'.*shape"):
    mtf.get_variable(mesh, "w", "a:3")
  graph.make_variables_untrainable([w.operation])
  assert graph.trainable_variables == []


def test_name_to_variable_is_a_live_read_only_view(mesh):
  """get_variable looks every name up in it: reading it copies nothing
  (one view, which follows new variables), and it cannot be changed."""
  graph = mesh.graph
  view = graph.name_to_variable
  assert graph.name_to_variable is view
  assert len(view) == 0
  w = mtf.get_variable(mesh, "w", "a:2")
  assert dict(view) == {"w": w.operation}
  with pytest.raises(TypeError):
    view["v"] = w.operation
  with pytest.raises((TypeError, AttributeError)):
    view.pop("w")
  assert dict(graph.name_to_variable) == {"w": w.operation}
  assert graph.all_variables == [w.operation]


@pytest.mark.parametrize("expr,op_type", [
    (lambda x, y: x + y, mtf.AddOperation),
    (lambda x, y: x - y, mtf.AddOperation),
    (lambda x, y: x * y, mtf.EinsumOperation),
    (lambda x, y: x / y, mtf.BinaryOpWithBroadcasting),
    (lambda x, y: x + 1.0, mtf.ScalarAddOperation),
    (lambda x, y: 2.0 * x, mtf.ScalarMultiplyOperation),
    (lambda x, y: -x, mtf.SlicewiseOperation),
])
def test_tensor_operators(mesh, expr, op_type):
  x = mtf.ones(mesh, "a:2,b:3")
  y = mtf.ones(mesh, "b:3")
  out = expr(x, y)
  assert isinstance(out.operation, op_type)
  assert out.shape == x.shape


def test_integer_operators(mesh):
  x = mtf.ones(mesh, "a:2", dtype=tf.int32)
  assert (x // 2).dtype == tf.int32
  assert (x % 2).dtype == tf.int32


def test_tensor_requires_tf_dtype(mesh):
  op = mtf.zeros(mesh, "a:2").operation
  with pytest.raises(TypeError, match="tf.DType"):
    mtf.Tensor(op, "a:2", "float32")


def test_splittable_dims(mesh):
  x = mtf.ones(mesh, "a:2,b:4")
  y = mtf.concat([x, x], "b")  # Lowers along a split "b" (regrid).
  assert y.operation.splittable_dims == {"a", "b"}
  assert not y.operation.unsplittable_dims
  z = mtf.relu(x)
  assert z.operation.splittable_dims == {"a", "b"}
  w = mtf.slicewise(tf.identity, [x], splittable_dims=[x.shape[0]])
  assert w.operation.unsplittable_dims == {"b"}


def test_inputs_from_another_graph_are_rejected(mesh):
  other = mtf.Mesh(mtf.Graph(), "other")
  x = mtf.ones(other, "a:2")
  y = mtf.ones(mesh, "a:2")
  with pytest.raises(ValueError, match="another mtf.Graph"):
    mtf.AddOperation(y, x)


def test_variable_dtype():
  vd = mtf.VariableDType(tf.float32, tf.bfloat16)
  assert vd.master_dtype == tf.float32
  assert vd.slice_dtype == tf.bfloat16
  assert vd.activation_dtype == tf.float32
  assert vd == mtf.VariableDType("float32", "bfloat16", "float32")


def test_get_variable_dtype_forms(mesh):
  v = mtf.get_variable(mesh, "v", "a:2", dtype=tf.float32,
                       activation_dtype=tf.bfloat16)
  assert v.dtype == tf.bfloat16
  assert v.operation.master_dtype == tf.float32
  u = mtf.get_variable(mesh, "u", "a:2",
                       dtype=mtf.VariableDType(tf.bfloat16, tf.float32,
                                               tf.float32))
  assert u.operation.master_dtype == tf.bfloat16
  assert u.operation.slice_dtype == tf.float32


def test_mesh_requires_graph():
  with pytest.raises(TypeError, match="mtf.Graph"):
    mtf.Mesh("not a graph", "m")


class _OriginalStyleOperation(mtf.Operation):
  """An operation written for the original: it assigns the frozensets that
  _initialize_splittable_and_unsplittable_dims returns."""

  def __init__(self, x, name=None):
    super().__init__([x], name=name or "original_style")
    self._outputs = [mtf.Tensor(self, x.shape, x.dtype)]
    self._splittable_dims, self._unsplittable_dims = (
        self._initialize_splittable_and_unsplittable_dims(
            "splittable", [x.shape.dims[0].name]))

  def lower(self, lowering):
    lowering.set_tensor_lowering(self.outputs[0],
                                 lowering.tensors[self.inputs[0]])


def test_splittability_protocol_of_the_original(mesh):
  x = mtf.ones(mesh, "a:2,b:4")
  op = _OriginalStyleOperation(x).outputs[0].operation
  assert op.splittable_dims == frozenset({"b"})
  assert op.unsplittable_dims == frozenset({"a"})
  # Returned as frozensets, as the original did; exceptions are kept even
  # when no tensor has them.
  assert op._initialize_splittable_and_unsplittable_dims(
      "unsplittable", ["b", "zzz"]) == (frozenset({"b", "zzz"}),
                                        frozenset({"a"}))
  assert op._initialize_all_dimensions_as_splittable() == (
      frozenset({"a", "b"}), frozenset())
  with pytest.raises(ValueError, match="default_splittability"):
    op._initialize_splittable_and_unsplittable_dims("sometimes")
  # The layout is checked against the assigned sets.
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "a:all")
  with pytest.raises(mtf.LayoutError, match="'a'"):
    mtf.Lowering(mesh.graph, {mesh: impl})


def test_to_string(mesh):
  x = mtf.ones(mesh, "a:2,b:4")
  y = mtf.relu(x, name="r")
  assert x.to_string == "Tensor[ones:0, Shape[a=2, b=4], float32]"
  assert repr(x) == x.to_string
  assert y.operation.to_string == (
      "SlicewiseOperation[Inputs=(Tensor[ones:0, Shape[a=2, b=4], float32]) "
      "Outputs=(Tensor[r:0, Shape[a=2, b=4], float32])]")
  assert mesh.graph.to_string.split("\n") == [
      op.to_string for op in mesh.graph.operations]


def test_capture_operations_of_a_function(mesh):
  x = mtf.ones(mesh, "a:2")
  output, ops = mesh.graph.capture_operations(lambda: mtf.exp(mtf.relu(x)))
  assert [type(op) for op in ops] == [mtf.SlicewiseOperation] * 2
  assert ops[-1].outputs == [output]
  with mesh.graph.capture_operations() as captured:
    y = mtf.relu(x)
  assert captured == [y.operation]


def test_clone_operations(mesh):
  x = mtf.ones(mesh, "a:2")
  x2 = mtf.zeros(mesh, "a:2")
  y = mtf.exp(mtf.relu(x))
  ops = mesh.graph.operations[-2:]
  copies, mapping = mesh.graph.clone_operations(ops=ops,
                                                input_mapping={x: x2})
  assert len(copies) == 2 and copies[0].inputs == [x2]
  assert mapping[y].operation is copies[-1] and mapping[x] is x2
  with pytest.raises(ValueError, match="input_mapping maps"):
    mesh.graph.clone_operations(ops, {y: x2})
