"""Element-wise ops against NumPy, under every standard layout (same-shape
ops: those that reach a distinct lowering path) and mode."""

import math

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import elementwise
from tests import mtf_testing

DIMS = ["a", "b"]
PARAMS = mtf_testing.layout_mode_params(DIMS)
# For ops whose inputs and output all have dims [a, b]: one processor, a
# split, both split (see slicewise_layout_ids). Ops that broadcast keep
# every layout: there an input without the split dimension is replicated.
SAME_SHAPE_PARAMS = mtf_testing.layout_mode_params(
    DIMS, layouts=mtf_testing.slicewise_layout_ids(DIMS))


def _x(low=-2.0, high=2.0, seed=0):
  x = np.random.RandomState(seed).uniform(low, high, size=(8, 16))
  return x.astype(np.float32)


def _gelu(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                (x + 0.044715 * x ** 3)))


def _away_from_zero(x):
  return np.where(np.abs(x) < 0.1, 0.5, x).astype(np.float32)


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _elu(x):
  return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


UNARY = {
    "relu": (mtf.relu, lambda x: np.maximum(x, 0), _away_from_zero(_x())),
    "exp": (mtf.exp, np.exp, _x()),
    "log": (mtf.log, np.log, _x(0.5, 3.0)),
    "sqrt": (mtf.sqrt, np.sqrt, _x(0.5, 3.0)),
    "rsqrt": (mtf.rsqrt, lambda x: 1 / np.sqrt(x), _x(0.5, 3.0)),
    "square": (mtf.square, np.square, _x()),
    "sigmoid": (mtf.sigmoid, lambda x: 1 / (1 + np.exp(-x)), _x()),
    "tanh": (mtf.tanh, np.tanh, _x()),
    "gelu": (mtf.gelu, _gelu, _x()),
    "negative": (mtf.negative, np.negative, _x()),
    "reciprocal": (mtf.reciprocal, np.reciprocal, _x(0.5, 3.0)),
    "identity": (mtf.identity, lambda x: x, _x()),
    "neg_operator": (lambda x: -x, np.negative, _x()),
    "sin": (elementwise.sin, np.sin, _x(-4.0, 4.0)),
    "cos": (elementwise.cos, np.cos, _x(-4.0, 4.0)),
    "elu": (elementwise.elu, _elu, _x()),
    "selu": (elementwise.selu, lambda x: _SELU_SCALE * np.where(
        x > 0, x, _SELU_ALPHA * np.expm1(np.minimum(x, 0))),
             _away_from_zero(_x())),
    "softplus": (elementwise.softplus, lambda x: np.log1p(np.exp(x)),
                 _x(-4.0, 4.0)),
    "swish": (elementwise.swish, lambda x: x * _sigmoid(x), _x(-4.0, 4.0)),
    "leaky_relu": (elementwise.leaky_relu,
                   lambda x: np.where(x > 0, x, 0.2 * x),
                   _away_from_zero(_x())),
    "leaky_relu_alpha": (lambda x: elementwise.leaky_relu(x, alpha=0.05),
                         lambda x: np.where(x > 0, x, 0.05 * x),
                         _away_from_zero(_x())),
    "abs": (elementwise.mtf_abs, np.abs, _away_from_zero(_x())),
    "pow_scalar": (lambda x: binary.mtf_pow(x, 3), lambda x: x ** 3, _x()),
    "pow_scalar_fraction": (lambda x: binary.mtf_pow(x, 0.5), np.sqrt,
                            _x(0.5, 3.0)),
}


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_unary(mesh_shape, layout, mode):
  """Every op of UNARY in one program (mtf_testing.check_ops checks each
  as if alone)."""
  mtf_testing.check_ops(
      {op_name: (lambda mesh, t, fn=mtf_fn: {"y": fn(t["x"])},
                 lambda x, np_fn=np_fn: {"y": np_fn(x)},
                 {"x": (x, DIMS)})
       for op_name, (mtf_fn, np_fn, x) in sorted(UNARY.items())},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_stop_gradient(mesh_shape, layout, mode):
  # d(stop_gradient(x) * x)/dx = x: only the second factor is differentiated.
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.stop_gradient(t["x"]) * t["x"]},
      lambda x: {"y": x * x},
      {"x": (_x(), DIMS)}, mesh_shape, layout, mode,
      np_grad_fn=lambda cot, x: {"x": cot["y"] * x})


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_cast(mesh_shape, layout, mode):
  x = _x()
  mtf_testing.check_op(
      lambda mesh, t: {"i": mtf.cast(t["x"] * 3.0, tf.int32),
                       "d": mtf.cast(t["x"], tf.float64)},
      lambda x: {"i": (x * 3.0).astype(np.int32),
                 "d": x.astype(np.float64)},
      {"x": (x, DIMS)}, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_sign(mesh_shape, layout, mode):
  # sign has no gradient: d(sign(x) * x)/dx is sign(x) from the product.
  x = _x()
  x[0, :4] = 0.0
  mtf_testing.check_op(
      lambda mesh, t: {"s": elementwise.sign(t["x"]),
                       "y": elementwise.sign(t["x"]) * t["x"]},
      lambda x: {"s": np.sign(x), "y": np.abs(x)},
      {"x": (x, DIMS)}, mesh_shape, layout, mode,
      np_grad_fn=lambda cot, x: {"x": cot["y"] * np.sign(x)})


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_pow_broadcast(mesh_shape, layout, mode):
  """x[a, b] ** y[b] and y[b] ** x[a, b]: values and both gradients."""
  x = _x(0.5, 2.0, seed=1)
  y = _x(-1.5, 1.5, seed=2)[0]
  mtf_testing.check_op(
      lambda mesh, t: {"xy": binary.mtf_pow(t["x"], t["y"]),
                       "yx": binary.mtf_pow(t["z"], t["x"])},
      lambda x, y, z: {"xy": x ** y, "yx": z ** x},
      {"x": (x, DIMS), "y": (y, ["b"]), "z": (np.abs(y) + 0.5, ["b"])},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_conversions(mesh_shape, layout, mode):
  """logical_not, to_float, to_int32, to_bfloat16 (values only)."""
  x = _x(-3.0, 3.0)
  mtf_testing.check_op(
      lambda mesh, t: {
          "not": elementwise.logical_not(comparisons.greater(t["x"], 0.0)),
          "float": elementwise.to_float(elementwise.to_int32(t["x"])),
          "int32": elementwise.to_int32(t["x"]),
          "bf16": elementwise.to_float(elementwise.to_bfloat16(t["x"])),
      },
      lambda x: {
          "not": np.logical_not(x > 0.0),
          "float": x.astype(np.int32).astype(np.float32),
          "int32": x.astype(np.int32),
          "bf16": x.astype(tf.bfloat16.as_numpy_dtype).astype(np.float32),
      },
      {"x": (x, DIMS)}, mesh_shape, layout, mode, grad_wrt=[])


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_add_n(mesh_shape, layout, mode):
  """Same shapes, broadcasting by name, and Python scalars in the list."""
  mtf_testing.check_op(
      lambda mesh, t: {
          "same": binary.add_n([t["x"], t["w"], t["x"]]),
          # [b] + [a] -> [b, a]; x[a, b] is transposed into it.
          "broadcast": binary.add_n([t["u"], t["v"], 1.5, t["x"], 2]),
      },
      lambda x, w, v, u: {
          "same": x + w + x,
          "broadcast": (v[:, None] + x + 1.5 + u[None, :] + 2).T,
      },
      {"x": (_x(seed=1), DIMS), "w": (_x(seed=2), DIMS),
       "v": (_x(seed=3)[:, 0], ["a"]), "u": (_x(seed=4)[0], ["b"])},
      mesh_shape, layout, mode)


def test_add_n_trivial_cases():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, [mtf.Dimension("a", 8)])
  assert binary.add_n([]) == 0
  assert binary.add_n([x]) is x
  assert binary.add_n([x, x], output_shape=[mtf.Dimension("b", 2),
                                            mtf.Dimension("a", 8)]).shape == (
                                                mtf.Shape([
                                                    mtf.Dimension("b", 2),
                                                    mtf.Dimension("a", 8)]))
  with pytest.raises(TypeError, match="same dtype"):
    binary.add_n([x, mtf.zeros(mesh, x.shape, dtype=tf.int32)])


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_add_n_of_partial_sums_stays_lazy(mode):
  """add_n of three contractions over a split dimension: one allreduce."""
  a, b, c = (mtf.Dimension(n, s) for n, s in (("a", 8), ("b", 16), ("c", 8)))
  xs = [np.random.RandomState(i).uniform(-1, 1, (8, 16)).astype(np.float32)
        for i in range(3)]
  w = np.random.RandomState(3).uniform(-1, 1, (16, 8)).astype(np.float32)
  lowerings = []

  impl = mtf_testing.make_impl(mode, "all:8", "b:all")

  def build_and_lower():
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    wt = mtf.import_tf_tensor(mesh, tf.constant(w), [b, c])
    terms = [mtf.einsum([mtf.import_tf_tensor(mesh, tf.constant(x), [a, b]),
                         wt], output_shape=[a, c]) for x in xs]
    y = binary.add_n(terms)
    lowering = mtf.Lowering(mesh.graph, {mesh: impl})
    lowerings.append(lowering)
    return lowering, lowering.export_to_tf_tensor(y)

  y = mtf_testing.run_in_mode(mode, build_and_lower, impl)
  np.testing.assert_allclose(y, sum(x @ w for x in xs), rtol=1e-5, atol=1e-5)
  counters = dict(lowerings[-1].counters)
  assert counters.get("comm/allreduce/all/calls") == 1, counters


def test_stop_gradient_is_a_stop_gradient_operation():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.ones(mesh, "a:8")
  y = mtf.stop_gradient(x)
  assert isinstance(y.operation, mtf.StopGradient)
  assert not y.operation.has_gradient
  z = mtf.StopGradient(x, name="stopped").outputs[0]
  assert z.operation.name.startswith("stopped") and z.shape == x.shape
  assert mtf.gradients([mtf.reduce_sum(z * z)], [x]) == [None]
