"""Lowering with TensorFlow 1's TensorShape behaviour on.

Programs written for the original call `tf.compat.v1.disable_v2_behavior()`,
under which `tf.Tensor.shape[i]` is a v1 `Dimension` rather than an int.
The op tests run every op in mtf_testing.V1_SHAPES_MODE on some layouts;
these tests cover the cases the original's own tests hit: a shift by a
negative offset on an unsplit dimension, and a fully replicated import
split by the layout (allsplit) feeding top_k and recompute_grad, as in the
original's ops_test.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.backend import slice_utils
from tests import mtf_testing

V1 = mtf_testing.V1_SHAPES_MODE
MODES = ("graph", V1)


def _is_v1_dimension(size):
  return isinstance(size, tf.compat.v1.Dimension)


def test_mode_turns_v1_shapes_on_and_restores_them():
  seen = []

  def build(mesh):
    seen.append(tf.zeros([3]).shape[0])
    return {"x": mtf.constant(mesh, 1.0)}, None, {}

  got, _ = mtf_testing.run_program("all:1", "", V1, build)
  assert got["x"] == 1.0
  assert _is_v1_dimension(seen[0])
  assert tf.zeros([3]).shape[0] == 3
  assert not _is_v1_dimension(tf.zeros([3]).shape[0])


def test_mode_restores_v2_shapes_after_an_error():
  def build_and_lower():
    raise RuntimeError("boom")

  with pytest.raises(RuntimeError, match="boom"):
    mtf_testing.run_in_mode(V1, build_and_lower)
  assert not _is_v1_dimension(tf.zeros([3]).shape[0])


def test_static_shape_gives_ints_in_both_behaviours():
  x = tf.zeros([2, 3])
  with mtf_testing.v1_tensor_shapes():
    assert _is_v1_dimension(x.shape[0])
    sizes = slice_utils.static_shape(x)
    # A v1 Dimension compares equal to its int: check the types too.
    assert sizes == [2, 3] and [type(s) for s in sizes] == [int, int]
    assert slice_utils.static_shape(
        tf.TensorShape([None, 4])) == [None, 4]
  assert slice_utils.static_shape(x) == [2, 3]
  with pytest.raises(ValueError, match="rank"):
    slice_utils.static_shape(tf.TensorShape(None))


def _np_shift(x, offset, axis, wrap):
  if wrap:
    return np.roll(x, offset, axis=axis)
  y = np.zeros_like(x)
  n = x.shape[axis]
  src = [slice(None)] * x.ndim
  dst = [slice(None)] * x.ndim
  if offset >= 0:
    src[axis], dst[axis] = slice(0, n - offset), slice(offset, n)
  else:
    src[axis], dst[axis] = slice(-offset, n), slice(0, n + offset)
  y[tuple(dst)] = x[tuple(src)]
  return y


# "a" is never split: the shift is local to each slice.
@pytest.mark.parametrize("mesh_shape,layout", [
    pytest.param("all:1", "", id="1proc"),
    pytest.param("all:8", "b:all", id="b_split"),
])
@pytest.mark.parametrize("mode", MODES)
def test_shift_by_negative_offset_on_unsplit_dim(mesh_shape, layout, mode):
  def build(mesh, t):
    del mesh
    return {"left": mtf.shift(t["x"], -1, "a", wrap=False),
            "left_wrap": mtf.shift(t["x"], -3, "a", wrap=True),
            "right": mtf.shift(t["x"], 2, "a", wrap=False)}

  def np_fn(x):
    return {"left": _np_shift(x, -1, 0, False),
            "left_wrap": _np_shift(x, -3, 0, True),
            "right": _np_shift(x, 2, 0, False)}

  x = np.random.RandomState(0).uniform(-1, 1, size=[5, 8]).astype(np.float32)
  mtf_testing.check_op(build, np_fn, {"x": (x, ["a", "b"])}, mesh_shape,
                       layout, mode)


# The original's ops_test: inputs imported fully replicated, then split
# (allsplit) by the layout.
TOP_K_X = np.array([[1, 10], [2, 9], [3, 8], [4, 7], [5, 6], [6, 5]],
                   np.float32)
TOP_K_DY = np.array([[11, 12], [13, 14]], np.float32)  # [b, k]
A = mtf.Dimension("a", 6)
B = mtf.Dimension("b", 2)
K = mtf.Dimension("k", 2)


@pytest.mark.parametrize("mode", MODES)
def test_top_k_of_fully_replicated_import_split_on_2d_mesh(mode):
  def build(mesh):
    x = mtf.import_fully_replicated(mesh, tf.constant(TOP_K_X),
                                    mtf.Shape([A, B]))
    values, indices = mtf.top_k(x, reduced_dim=A, k_dim=K)
    dy = mtf_testing.import_array(mesh, TOP_K_DY, [B, K])
    return ({"values": values, "indices": indices},
            mtf.reduce_sum(values * dy), {"x": x})

  got, _ = mtf_testing.run_program("rows:2;cols:2", "a:rows;b:cols", mode,
                                   build)
  np.testing.assert_array_equal(got["values"], [[6, 5], [10, 9]])
  np.testing.assert_array_equal(got["indices"], [[5, 4], [0, 1]])
  np.testing.assert_array_equal(
      got["d_x"], [[0, 13], [0, 14], [0, 0], [0, 0], [12, 0], [11, 0]])


@pytest.mark.parametrize("mode", MODES)
def test_recompute_grad_of_fully_replicated_import_split(mode):
  two = mtf.Dimension("two", 2)

  def build(mesh):
    x = mtf.import_fully_replicated(
        mesh, tf.constant([5.0, 10.0]), mtf.Shape([two]))
    y = mtf.recompute_grad(lambda x: x * x + x, [x])
    dy = mtf_testing.import_array(mesh, np.array([2.0, 3.0], np.float32),
                                  [two])
    return {"y": y}, mtf.reduce_sum(y * dy), {"x": x}

  got, _ = mtf_testing.run_program("processors:2", "two:processors", mode,
                                   build)
  np.testing.assert_array_equal(got["y"], [30, 110])
  np.testing.assert_array_equal(got["d_x"], [22, 63])


def test_serving_receiver_fills_an_unknown_batch_with_v1_shapes():
  """An unknown batch dimension reads as Dimension(None), not None, with
  TF1's shapes; the receiver still fills in default_batch_size."""
  with mtf_testing.v1_tensor_shapes():
    receiver = mtf.estimator.build_raw_serving_input_receiver_fn(
        {"x": tf.TensorSpec([None, 3], tf.float32)}, default_batch_size=4)()
    shape = receiver.receiver_tensors["x"].shape
  assert shape.as_list() == [4, 3]
