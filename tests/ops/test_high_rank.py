"""Operations on tensors of rank 6 to 8, against NumPy, with gradients.

TensorFlow kernels have rank limits that tensors of rank <= 5 never meet:
oneDNN's Softmax takes at most 5 dimensions, and the broadcasting kernels
(Add, Mul, SelectV2, BroadcastTo, ...) at most 5 groups of axes that
broadcast alike. The lowerings keep within them (slice_utils.along_axis,
slice_utils.broadcastable); tools/kernel_rank_audit.py lists the limits.
These tests pass with TF_ENABLE_ONEDNN_OPTS at 1 and at 0.

Dimensions have size 2, but 4 for the two that the layouts split, so
that slices keep every axis (an axis of size 1 breaks no broadcast
pattern): a rank-8 tensor has 1,024 entries. The layouts split the reduced
dimension, other dimensions, or nothing.
"""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import mtf_testing

NAMES = [f"d{i}" for i in range(8)]
SIZES = dict({n: 2 for n in NAMES}, d0=4, d1=4)
LAYOUTS = [
    ("all:1", ""),
    ("all:2", "d1:all"),
    ("rows:2;cols:2", "d0:rows;d1:cols"),
]
PARAMS = mtf_testing.mesh_layout_mode_params(LAYOUTS) + [
    pytest.param("rows:2;cols:2", "d0:rows;d1:cols",
                 mtf_testing.V1_SHAPES_MODE,
                 id="rows:2;cols:2-d0:rows;d1:cols-graph_v1_shapes")]


def _array(names, seed):
  return np.random.RandomState(seed).uniform(
      -2.0, 2.0, size=[SIZES[n] for n in names]).astype(np.float32)


def _dim(name):
  return mtf.Dimension(name, SIZES[name])


def _np_softmax(x, axis):
  e = np.exp(x - np.max(x, axis=axis, keepdims=True))
  return e / np.sum(e, axis=axis, keepdims=True)


# case -> (rank, reduced dimension index, log_softmax?)
SOFTMAX_CASES = {
    "softmax_rank6_middle": (6, 2, False),
    "softmax_rank7_first": (7, 0, False),
    "softmax_rank8_last": (8, 7, False),
    "log_softmax_rank7_middle": (7, 5, True),
}


@pytest.mark.parametrize("case", sorted(SOFTMAX_CASES))
@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_softmax_high_rank(case, mesh_shape, layout, mode):
  """mtf.softmax and mtf.log_softmax over one of 6 to 8 dimensions."""
  rank, axis, log = SOFTMAX_CASES[case]
  names = NAMES[:rank]
  mtf_fn = mtf.log_softmax if log else mtf.softmax

  def np_fn(x):
    y = _np_softmax(x, axis)
    return {"y": np.log(y) if log else y}

  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf_fn(t["x"], _dim(names[axis]))},
      np_fn, {"x": (_array(names, rank), names)}, mesh_shape, layout, mode)


def _np_aligned(x, names, out_names):
  """x[names] transposed and expanded to broadcast against out_names."""
  kept = [n for n in out_names if n in names]
  x = np.transpose(x, [names.index(n) for n in kept])
  return np.reshape(x, [SIZES[n] if n in names else 1 for n in out_names])


# Operands whose dimensions alternate in the output: 6 to 8 groups of axes
# that broadcast alike, more than TensorFlow's broadcasting kernels take.
EVEN, ODD = NAMES[0:8:2], NAMES[1:8:2]
BROADCAST_CASES = {
    # mtf.add: BinaryOpWithBroadcasting.
    "add": (mtf.add, np.add, (EVEN[:3], ODD[:3]), NAMES[:6]),
    # mtf.multiply: the element-wise einsum product.
    "multiply": (mtf.multiply, np.multiply, (EVEN, ODD), NAMES),
    "maximum": (mtf.maximum, np.maximum, (EVEN[:4], ODD[:3]), NAMES[:7]),
    # mtf.add_n broadcasts each operand to the output.
    "add_n": (lambda x, y, output_shape: mtf.add_n(
        [x, y], output_shape=output_shape), np.add, (EVEN, ODD), NAMES),
}


@pytest.mark.parametrize("case", sorted(BROADCAST_CASES))
@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_broadcast_alternating_dims(case, mesh_shape, layout, mode):
  """Binary operations whose operands' dimensions interleave."""
  mtf_fn, np_op, (x_names, y_names), out_names = BROADCAST_CASES[case]
  x_names, y_names = list(x_names), list(y_names)

  def np_fn(x, y):
    return {"z": np_op(_np_aligned(x, x_names, out_names),
                       _np_aligned(y, y_names, out_names))}

  out_shape = mtf.Shape([_dim(n) for n in out_names])
  mtf_testing.check_op(
      lambda mesh, t: {"z": mtf_fn(t["x"], t["y"], output_shape=out_shape)},
      np_fn,
      {"x": (_array(x_names, 1), x_names), "y": (_array(y_names, 2), y_names)},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_where_and_broadcast_alternating_dims(mesh_shape, layout, mode):
  """mtf.where of interleaved operands, and mtf.broadcast to a shape that
  interleaves new dimensions (both via BroadcastTo before the guard)."""
  c_names, x_names, y_names = EVEN[:3], ODD[:3], ["d0", "d5"]
  out_names = NAMES[:6]

  def build(mesh, t):
    del mesh
    out_shape = mtf.Shape([_dim(n) for n in out_names])
    return {"w": mtf.where(mtf.greater(t["c"], 0.0), t["x"], t["y"],
                           output_shape=out_shape),
            "b": mtf.broadcast(t["x"], out_shape)}

  def np_fn(c, x, y):
    w = np.where(_np_aligned(c, c_names, out_names) > 0,
                 _np_aligned(x, x_names, out_names),
                 _np_aligned(y, y_names, out_names))
    return {"w": w, "b": np.broadcast_to(
        _np_aligned(x, x_names, out_names), [SIZES[n] for n in out_names])}

  mtf_testing.check_op(
      build, np_fn,
      {"c": (_array(c_names, 3), c_names), "x": (_array(x_names, 4), x_names),
       "y": (_array(y_names, 5), y_names)},
      mesh_shape, layout, mode, grad_wrt=["x", "y"])
