"""Binary ops with broadcasting by name, against NumPy, under every standard
layout (operands of the same shape: those that reach a distinct lowering
path) and mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

A, B = 8, 16
DIMS = ["a", "b"]
PARAMS = mtf_testing.layout_mode_params(DIMS)
# For operands that all have dims [a, b]: one processor, a split, both split
# (see slicewise_layout_ids). Broadcasting keeps every layout: there an
# operand without the split dimension is replicated or not.
SAME_SHAPE_PARAMS = mtf_testing.layout_mode_params(
    DIMS, layouts=mtf_testing.slicewise_layout_ids(DIMS))


def _uniform(shape, low=-2.0, high=2.0, seed=0):
  x = np.random.RandomState(seed).uniform(low, high, size=shape)
  return x.astype(np.float32)


def _away_from_zero(x):
  return np.where(np.abs(x) < 0.25, 0.5, x).astype(np.float32)


def _ints(shape, low, high, seed, nonzero=False):
  x = np.random.RandomState(seed).randint(low, high, size=shape)
  if nonzero:
    x = np.where(x == 0, 3, x)
  return x.astype(np.int32)


X = _uniform((A, B), seed=0)
# Differs from X by at least 0.1 everywhere, so that min/max/comparisons are
# away from ties (a numeric gradient across a tie is meaningless).
Y = (X + np.where(np.random.RandomState(1).rand(A, B) < 0.5, -1, 1) *
     _uniform((A, B), 0.1, 1.0, seed=2)).astype(np.float32)
Y_NONZERO = _away_from_zero(_uniform((A, B), seed=3))
# Equal to X at about half of the positions, for equal/not_equal.
Y_TIES = np.where(np.random.RandomState(4).rand(A, B) < 0.5, X, Y).astype(
    np.float32)
XA = _uniform((A,), seed=5)
XB = _uniform((B,), seed=6)
XB_NONZERO = _away_from_zero(_uniform((B,), seed=7))
XT = _uniform((B, A), seed=8)  # x[b, a]
P = np.random.RandomState(9).rand(A, B) < 0.5
Q = np.random.RandomState(10).rand(A, B) < 0.5
QB = np.random.RandomState(11).rand(B) < 0.5
INT_X = _ints((A, B), -20, 20, seed=12)
INT_Y = _ints((A, B), -6, 7, seed=13, nonzero=True)
INT_YB = _ints((B,), -6, 7, seed=14, nonzero=True)

AB = ["a", "b"]
XY = {"x": (X, AB), "y": (Y, AB)}
X_ONLY = {"x": (X, AB)}
IJ = {"i": (INT_X, AB), "j": (INT_Y, AB)}


def _case(mtf_fn, np_fn, inputs):
  """One table entry: y = mtf_fn(*tensors) against y = np_fn(*arrays), both
  taking the inputs in the order of the `inputs` dict."""
  return (mtf_fn, np_fn, inputs)


# Element-wise float ops on operands of the same shape.
FLOAT_BINARY = {
    "add": _case(lambda x, y: mtf.add(x, y), np.add, XY),
    "sub": _case(lambda x, y: mtf.sub(x, y), np.subtract, XY),
    "multiply": _case(lambda x, y: mtf.multiply(x, y), np.multiply, XY),
    "divide": _case(lambda x, y: mtf.divide(x, y), np.divide,
                    {"x": (X, AB), "y": (Y_NONZERO, AB)}),
    "minimum": _case(lambda x, y: mtf.minimum(x, y), np.minimum, XY),
    "maximum": _case(lambda x, y: mtf.maximum(x, y), np.maximum, XY),
}

# Ops with boolean or integer outputs (values only, no gradients).
NO_GRAD_BINARY = {
    "less": _case(mtf.less, np.less, XY),
    "greater": _case(mtf.greater, np.greater, XY),
    "less_equal": _case(mtf.less_equal, np.less_equal,
                        {"x": (X, AB), "y": (Y_TIES, AB)}),
    "greater_equal": _case(mtf.greater_equal, np.greater_equal,
                           {"x": (X, AB), "y": (Y_TIES, AB)}),
    "equal": _case(mtf.equal, np.equal, {"x": (X, AB), "y": (Y_TIES, AB)}),
    "not_equal": _case(mtf.not_equal, np.not_equal,
                       {"x": (X, AB), "y": (Y_TIES, AB)}),
    "logical_and": _case(mtf.logical_and, np.logical_and,
                         {"x": (P, AB), "y": (Q, AB)}),
    "logical_or": _case(mtf.logical_or, np.logical_or,
                        {"x": (P, AB), "y": (Q, AB)}),
    "floordiv": _case(lambda i, j: mtf.floordiv(i, j), np.floor_divide, IJ),
    "mod": _case(lambda i, j: mtf.mod(i, j), np.mod, IJ),
}

# Python operators, including reflected forms with Python scalars. Each case
# chains several operators into one output: the cost of a case is mostly per
# exported tensor, not per operation.
OPERATORS = {
    "tensor_tensor": _case(lambda x, y, z: (x + y) * (x - z) + y / z,
                           lambda x, y, z: (x + y) * (x - z) + y / z,
                           {"x": (X, AB), "y": (Y, AB), "z": (Y_NONZERO, AB)}),
    "tensor_scalar": _case(
        lambda x: (x + 1.5) * 3 - x / 4.0 - 0.5 + mtf.maximum(x, 0.25),
        lambda x: (x + 1.5) * 3 - x / 4.0 - 0.5 + np.maximum(x, 0.25),
        X_ONLY),
    "scalar_tensor": _case(
        lambda z: 1.5 + 3.0 * (2.0 - z) + 1.0 / z,
        lambda z: 1.5 + 3.0 * (2.0 - z) + 1.0 / z, {"z": (Y_NONZERO, AB)}),
    "int_tensor_tensor": _case(lambda i, j: (i // j) * 100 + i % j,
                               lambda i, j: (i // j) * 100 + i % j, IJ),
    "int_with_scalars": _case(
        lambda i, j: (i // 3) * 1000 + (i % 3) * 100 + (7 // j) * 10 + 7 % j
        - (5 - i * 2),
        lambda i, j: (i // 3) * 1000 + (i % 3) * 100 + (7 // j) * 10 + 7 % j
        - (5 - i * 2), IJ),
}


def _shape(*names):
  sizes = {"a": A, "b": B}
  return [mtf.Dimension(n, sizes[n]) for n in names]


# Operands with different dimension subsets and orders, and output_shape=.
BROADCAST = {
    "ab_plus_b": _case(lambda x, yb: x + yb, lambda x, yb: x + yb,
                       {"x": (X, AB), "yb": (XB, ["b"])}),
    "b_minus_ab": _case(lambda x, yb: yb - x, lambda x, yb: yb - x,
                        {"x": (X, AB), "yb": (XB, ["b"])}),
    "a_times_b": _case(lambda xa, yb: xa * yb,
                       lambda xa, yb: xa[:, None] * yb[None, :],
                       {"xa": (XA, ["a"]), "yb": (XB, ["b"])}),
    "ba_plus_ab": _case(lambda xt, y: xt + y, lambda xt, y: xt + y.T,
                        {"xt": (XT, ["b", "a"]), "y": (Y, AB)}),
    "divide": _case(lambda x, y, yb: x / yb + yb / y,
                    lambda x, y, yb: x / yb + yb / y,
                    {"x": (X, AB), "y": (Y_NONZERO, AB),
                     "yb": (XB_NONZERO, ["b"])}),
    "minimum_maximum": _case(
        lambda x, yb, xt: mtf.maximum(x, yb) + mtf.minimum(yb, xt),
        lambda x, yb, xt: np.maximum(x, yb) + np.minimum(yb[:, None], xt).T,
        {"x": (X, AB), "yb": (XB, ["b"]), "xt": (XT, ["b", "a"])}),
    "add_output_shape_ba": _case(
        lambda x, yb: mtf.add(x, yb, output_shape=_shape("b", "a")),
        lambda x, yb: (x + yb).T, {"x": (X, AB), "yb": (XB, ["b"])}),
    "multiply_output_shape_ba": _case(
        lambda xa, yb: mtf.multiply(xa, yb, output_shape=_shape("b", "a")),
        lambda xa, yb: yb[:, None] * xa[None, :],
        {"xa": (XA, ["a"]), "yb": (XB, ["b"])}),
    "less_a_b": _case(lambda xa, yb: mtf.less(xa, yb),
                      lambda xa, yb: xa[:, None] < yb[None, :],
                      {"xa": (XA, ["a"]), "yb": (XB, ["b"])}),
    "int_mod_ab_b": _case(lambda i, jb: i % jb, np.mod,
                          {"i": (INT_X, AB), "jb": (INT_YB, ["b"])}),
}

# where(condition, x, y): tensor and scalar branches, broadcasting.
WHERE = {
    "tensors": _case(lambda p, x, y: mtf.where(p, x, y),
                     np.where, {"p": (P, AB), "x": (X, AB), "y": (Y, AB)}),
    "scalar_branches": _case(
        lambda p, q, x, y: mtf.where(p, x, 0.5) * mtf.where(q, -1.0, y),
        lambda p, q, x, y: np.where(p, x, 0.5) * np.where(q, -1.0, y),
        {"p": (P, AB), "q": (Q, AB), "x": (X, AB), "y": (Y, AB)}),
    "broadcast_b_condition": _case(
        lambda qb, x, yb: mtf.where(qb, x, yb),
        lambda qb, x, yb: np.where(qb[None, :], x, yb[None, :]),
        {"qb": (QB, ["b"]), "x": (X, AB), "yb": (XB, ["b"])}),
    "output_shape_ba": _case(
        lambda p, x, y: mtf.where(p, x, y, output_shape=_shape("b", "a")),
        lambda p, x, y: np.where(p, x, y).T,
        {"p": (P, AB), "x": (X, AB), "y": (Y, AB)}),
    "int": _case(lambda p, i, j: mtf.where(p, i, j), np.where,
                 {"p": (P, AB), "i": (INT_X, AB), "j": (INT_Y, AB)}),
}


def _check(table, mesh_shape, layout, mode):
  """Every case of `table` under one layout and mode, in one program (see
  mtf_testing.check_ops: each case is checked as if alone)."""
  mtf_testing.check_op_table(table, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_float_binary(mesh_shape, layout, mode):
  """Values and gradients of the float element-wise binary ops."""
  _check(FLOAT_BINARY, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_no_grad_binary(mesh_shape, layout, mode):
  """Comparisons, logical ops and integer floordiv/mod."""
  _check(NO_GRAD_BINARY, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", SAME_SHAPE_PARAMS)
def test_operators(mesh_shape, layout, mode):
  """Python operators on Tensors and scalars, reflected forms included."""
  _check(OPERATORS, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_broadcast(mesh_shape, layout, mode):
  """Operands are lined up by dimension name, not position."""
  _check(BROADCAST, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_where(mesh_shape, layout, mode):
  """where with tensor and scalar branches; gradients flow to x and y."""
  _check(WHERE, mesh_shape, layout, mode)


@pytest.mark.parametrize("x_names,y_names,want", [
    (["a", "b"], ["b"], ["a", "b"]),
    (["b"], ["a", "b"], ["a", "b"]),
    (["a"], ["b"], ["a", "b"]),
    (["b", "a"], ["a", "b"], ["b", "a"]),
    ([], ["b", "a"], ["b", "a"]),
])
def test_broadcast_output_shape(x_names, y_names, want):
  """The default output shape of a broadcasting binary op."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _shape(*x_names))
  y = mtf.zeros(mesh, _shape(*y_names))
  assert (x + y).shape == mtf.Shape(_shape(*want))
  assert mtf.maximum(x, y).shape == mtf.Shape(_shape(*want))


def test_size_mismatch_names_dimension():
  """Same name, different sizes: a ShapeError that names the dimension."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, [mtf.Dimension("a", 8), mtf.Dimension("b", 16)])
  y = mtf.zeros(mesh, [mtf.Dimension("b", 4)])
  for fn in (mtf.add, mtf.sub, mtf.multiply, mtf.divide, mtf.maximum,
             mtf.less):
    with pytest.raises(mtf.ShapeError, match="'b'"):
      fn(x, y)


def test_output_shape_must_keep_input_dims():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _shape("a", "b"))
  y = mtf.zeros(mesh, _shape("b"))
  with pytest.raises(mtf.ShapeError, match="a"):
    mtf.add(x, y, output_shape=_shape("b"))


def test_scalar_operands():
  """Two scalars are refused; an integer tensor is not true-divided."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  i = mtf.zeros(mesh, _shape("a"), dtype=tf.int32)
  with pytest.raises(TypeError, match="mtf Tensor"):
    mtf.divide(1.0, 2.0)
  with pytest.raises(TypeError, match="mtf Tensor"):
    mtf.add(1.0, 2.0)
  with pytest.raises(TypeError, match="floordiv"):
    mtf.divide(i, i)


def test_dtype_mismatch_is_type_error():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _shape("a"))
  i = mtf.zeros(mesh, _shape("a"), dtype=tf.int32)
  with pytest.raises(TypeError, match="int32"):
    mtf.add(x, i)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_original_binary_names(mesh_shape, layout, mode):
  """binary_op_with_broadcasting, MinMaxOperation and where(if_true=...,
  if_false=...) under the original's parameter names."""
  inputs = {"x": (X, AB), "y": (Y, AB), "xb": (XB, ["b"])}
  # No gradient: binary_op_with_broadcasting.
  mtf_testing.check_op(
      lambda mesh, t: {
          "atan2": mtf.binary_op_with_broadcasting(tf.math.atan2, t["x"],
                                                   t["xb"]),
          "gt": mtf.binary_op_with_broadcasting(
              tf.greater, t["x"], 0.5, output_dtype=tf.bool)},
      lambda x, y, xb: {"atan2": np.arctan2(x, xb), "gt": x > 0.5},
      inputs, mesh_shape, layout, mode, grad_wrt=[])

  def build(mesh, t):
    x, y, xb = t["x"], t["y"], t["xb"]
    return {
        "min": mtf.MinMaxOperation(tf.minimum, x, y, x.shape).outputs[0],
        "max_b": mtf.MinMaxOperation(tf.maximum, x, xb,
                                     output_shape=x.shape).outputs[0],
        "where": mtf.where(condition=mtf.greater(x, y), if_true=x,
                           if_false=xb, output_shape=x.shape),
    }

  def reference(x, y, xb):
    return {"min": np.minimum(x, y), "max_b": np.maximum(x, xb),
            "where": np.where(x > y, x, xb)}

  mtf_testing.check_op(build, reference, inputs, mesh_shape, layout, mode)


def test_binary_op_with_broadcasting_has_no_gradient():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.ones(mesh, _shape("a"))
  y = mtf.binary_op_with_broadcasting(tf.math.atan2, x, x)
  assert not y.operation.has_gradient
  assert mtf.gradients([y], [x]) == [None]
  assert y.operation.gradient(unused_grad_ys=[x]) == [None, None]
  with pytest.raises(mtf.DTypeError, match="same dtype"):
    mtf.BinaryOpWithBroadcasting(
        tf.add, x, mtf.cast(x, tf.int32), x.shape, tf.float32)
  op = mtf.AddOperation(x, x, x.shape, "my_add")
  assert op.name.startswith("my_add") and op.has_gradient
