"""slicewise and cwise: custom TF functions per slice, and their gradients."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

DIMS = ["a", "b"]
PARAMS = mtf_testing.layout_mode_params(DIMS)


def _x(seed=0):
  return np.random.RandomState(seed).uniform(-1, 1, (8, 16)).astype(np.float32)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_cwise_with_generic_gradient(mesh_shape, layout, mode):
  """Without a grad_function, gradients come from a per-slice tape."""
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.cwise(lambda a, b: tf.sin(a) * b,
                                      [t["x"], t["z"]])},
      lambda x, z: {"y": np.sin(x) * z},
      {"x": (_x(), DIMS), "z": (_x(1), DIMS)}, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_slicewise_multiple_outputs(mesh_shape, layout, mode):
  def build(mesh, t):
    x = t["x"]
    s, c = mtf.slicewise(lambda v: (tf.sin(v), tf.cos(v)), [x],
                         output_dtype=[tf.float32, tf.float32],
                         splittable_dims=x.shape.dims)
    return {"s": s, "c": c}

  mtf_testing.check_op(build, lambda x: {"s": np.sin(x), "c": np.cos(x)},
                       {"x": (_x(), DIMS)}, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a"]))
def test_slicewise_with_output_shape_and_grad_function(mesh_shape, layout,
                                                       mode):
  """A slicewise op that reduces a replicated dimension locally."""
  def build(mesh, t):
    x = t["x"]
    a = x.shape.get_dim_by_name("a")

    def grad_function(op, dy):
      return [mtf.broadcast(dy, op.inputs[0].shape) * 2.0]

    y = mtf.slicewise(lambda v: 2.0 * tf.reduce_sum(v, axis=1), [x],
                      output_shape=[a], splittable_dims=[a],
                      grad_function=grad_function)
    return {"y": y}

  mtf_testing.check_op(build, lambda x: {"y": 2.0 * x.sum(1)},
                       {"x": (_x(), ["a", "c"])}, mesh_shape, layout, mode)


def test_slicewise_refuses_a_split_unsplittable_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:8")
  mtf.slicewise(lambda v: tf.reduce_sum(v, axis=1), [x],
                output_shape="a:8", splittable_dims=["a"])
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "b:all")
  with pytest.raises(mtf.LayoutError, match="'b' \\(size 8\\).*'all'"):
    mtf.Lowering(graph, {mesh: impl})


def test_cwise_requires_equal_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(mtf.ShapeError, match="same shape"):
    mtf.cwise(tf.add, [mtf.zeros(mesh, "a:2"), mtf.zeros(mesh, "b:2")])


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a"]))
def test_slicewise_operation_with_the_originals_lists(mesh_shape, layout,
                                                      mode):
  """SlicewiseOperation(tf_fn, inputs, output_shapes, output_dtypes, ...):
  outputs of different shapes and dtypes; grad_function=0 means none."""
  def build(mesh, t):
    x = t["x"]
    a = x.shape.get_dim_by_name("a")
    op = mtf.SlicewiseOperation(
        lambda v: (tf.reduce_max(v, axis=1),
                   tf.cast(tf.argmax(v, axis=1), tf.int32)),
        inputs=[x], output_shapes=[mtf.Shape([a]), mtf.Shape([a])],
        output_dtypes=[tf.float32, tf.int32], splittable_dims=[a],
        grad_function=0, name="max_argmax")
    assert not op.has_gradient and op.name.startswith("max_argmax")
    return {"max": op.outputs[0], "argmax": op.outputs[1]}

  mtf_testing.check_op(
      build,
      lambda x: {"max": x.max(1), "argmax": x.argmax(1).astype(np.int32)},
      {"x": (_x(), ["a", "c"])}, mesh_shape, layout, mode, grad_wrt=[])


def test_slicewise_operation_needs_matching_lists():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, "a:8")
  with pytest.raises(mtf.ShapeError, match="one output shape per"):
    mtf.SlicewiseOperation(tf.identity, [x], [x.shape], [tf.float32,
                                                         tf.float32], [])


def test_generic_gradient_marks_every_dimension_splittable():
  # As in the original; the forward operation's refusals still apply when
  # lowering.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:16")
  y = mtf.slicewise(tf.exp, [x], splittable_dims=[x.shape[0]])
  grad_op = mtf.GenericGradOperation(y.operation, [x])
  assert grad_op.splittable_dims == {"a", "b"}
  assert not grad_op.unsplittable_dims
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "b:all")
  with pytest.raises(mtf.LayoutError, match="'b'"):
    mtf.Lowering(graph, {mesh: impl})
