"""Reductions and softmax against NumPy, under every standard layout (which
split each reduced dimension in turn) and mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

SIZES = {"a": 8, "b": 16, "c": 8}
ABC = ["a", "b", "c"]
PARAMS = mtf_testing.layout_mode_params(ABC)

X = np.random.RandomState(0).uniform(-2.0, 2.0, size=(8, 16, 8)).astype(
    np.float32)
MOSTLY_TRUE = np.random.RandomState(1).rand(8, 16, 8) < 0.9
MOSTLY_FALSE = np.random.RandomState(2).rand(8, 16, 8) < 0.1
EXTRA = np.random.RandomState(3).uniform(-1.0, 3.0, size=(8, 8)).astype(
    np.float32)  # extra_logit[a, c]


def _dims(names):
  return [mtf.Dimension(n, SIZES[n]) for n in names]


def _axes(names):
  return tuple(ABC.index(n) for n in names)


def _np_reduce(np_fn, reduced, out):
  """NumPy reduction of x[a, b, c] over `reduced`, transposed to `out`."""
  def fn(x):
    kept = [n for n in ABC if n not in reduced]
    y = np_fn(x, axis=_axes(reduced))
    return np.transpose(y, [kept.index(n) for n in out])
  return fn


def _logsumexp(x, axis):
  m = np.max(x, axis=axis, keepdims=True)
  return np.log(np.sum(np.exp(x - m), axis=axis)) + np.squeeze(m, axis)


# name -> (mtf fn, NumPy fn).
_REDUCTIONS = {
    "sum": (mtf.reduce_sum, np.sum),
    "mean": (mtf.reduce_mean, np.mean),
    "max": (mtf.reduce_max, np.max),
    "min": (mtf.reduce_min, np.min),
}
# How each reduction is asked for: (kwargs builder, reduced dims, out dims).
_FORMS = {
    "one_dim": (lambda: {"reduced_dim": _dims("b")[0]}, "b", "ac"),
    "several_dims": (lambda: {"reduced_dim": _dims("ac")}, "ac", "b"),
    "all_dims": (lambda: {}, "abc", ""),
    "output_shape_reordered": (lambda: {"output_shape": _dims("ca")}, "b",
                               "ca"),
}
# sum (lazy allreduce) and max (immediate allreduce) in every form; mean and
# min, which share their code paths, in two forms each.
_PAIRS = ([("sum", f) for f in _FORMS] + [("max", f) for f in _FORMS] +
          [("mean", "several_dims"), ("mean", "output_shape_reordered"),
           ("min", "one_dim"), ("min", "all_dims")])
FLOAT_CASES = {
    f"{r}_{f}": (_REDUCTIONS[r][0], _FORMS[f][0],
                 _np_reduce(_REDUCTIONS[r][1], _FORMS[f][1], _FORMS[f][2]))
    for r, f in _PAIRS
}


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_reduce(mesh_shape, layout, mode):
  """reduce_sum/mean/max/min: values and gradients (every case in one
  program; mtf_testing.check_ops checks each as if alone)."""
  mtf_testing.check_ops(
      {case: (lambda mesh, t, fn=mtf_fn, kwargs=kwargs: {
          "y": fn(t["x"], **kwargs())},
              lambda x, np_fn=np_fn: {"y": np_fn(x)},
              {"x": (X, ABC)})
       for case, (mtf_fn, kwargs, np_fn) in sorted(FLOAT_CASES.items())},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_reduce_all_any(mesh_shape, layout, mode):
  """reduce_all/reduce_any on bool, over one, several and all dims."""
  def build(mesh, t):
    p, q = t["p"], t["q"]
    return {
        "all_b": mtf.reduce_all(p, reduced_dim=_dims("b")[0]),
        "all_ca": mtf.reduce_all(p, output_shape=_dims("ca")),
        "all": mtf.reduce_all(p),
        "any_ac": mtf.reduce_any(q, reduced_dim=_dims("ac")),
        "any_ca": mtf.reduce_any(q, output_shape=_dims("ca")),
        "any": mtf.reduce_any(q),
    }

  def reference(p, q):
    return {
        "all_b": np.all(p, axis=1),
        "all_ca": np.all(p, axis=1).T,
        "all": np.all(p),
        "any_ac": np.any(q, axis=(0, 2)),
        "any_ca": np.any(q, axis=1).T,
        "any": np.any(q),
    }

  mtf_testing.check_op(build, reference,
                       {"p": (MOSTLY_TRUE, ABC), "q": (MOSTLY_FALSE, ABC)},
                       mesh_shape, layout, mode)


def _softmax(x, axis):
  e = np.exp(x - np.max(x, axis=axis, keepdims=True))
  return e / np.sum(e, axis=axis, keepdims=True)


SOFTMAX_CASES = {
    "logsumexp": (
        lambda x: mtf.reduce_logsumexp(x, _dims("b")[0]),
        lambda x: _logsumexp(x, 1), {"x": (X, ABC)}),
    "logsumexp_several": (
        lambda x: mtf.reduce_logsumexp(x, _dims("ac")),
        lambda x: _logsumexp(x, (0, 2)), {"x": (X, ABC)}),
    "logsumexp_extra_scalar": (
        lambda x: mtf.reduce_logsumexp(x, _dims("b")[0], extra_logit=2.5),
        lambda x: np.log(np.sum(np.exp(x), axis=1) + np.exp(2.5)),
        {"x": (X, ABC)}),
    "logsumexp_extra_tensor": (
        lambda x, e: mtf.reduce_logsumexp(x, _dims("b")[0], extra_logit=e),
        lambda x, e: np.log(np.sum(np.exp(x), axis=1) + np.exp(e)),
        {"x": (X, ABC), "e": (EXTRA, ["a", "c"])}),
    "softmax": (
        lambda x: mtf.softmax(x, _dims("b")[0]),
        lambda x: _softmax(x, 1), {"x": (X, ABC)}),
    "softmax_first_dim": (
        lambda x: mtf.softmax(x, _dims("a")[0]),
        lambda x: _softmax(x, 0), {"x": (X, ABC)}),
    "softmax_last_dim": (
        lambda x: mtf.softmax(x, _dims("c")[0]),
        lambda x: _softmax(x, 2), {"x": (X, ABC)}),
    "softmax_extra_logit": (
        lambda x: mtf.softmax(x, _dims("b")[0], extra_logit=0.5),
        lambda x: np.exp(x) / (np.sum(np.exp(x), axis=1, keepdims=True) +
                               np.exp(0.5)),
        {"x": (X, ABC)}),
    "log_softmax": (
        lambda x: mtf.log_softmax(x, _dims("a")[0]),
        lambda x: np.log(_softmax(x, 0)), {"x": (X, ABC)}),
}


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_softmax(mesh_shape, layout, mode):
  """reduce_logsumexp (with and without extra_logit), softmax, log_softmax
  (every case in one program; mtf_testing.check_ops checks each as if
  alone)."""
  mtf_testing.check_op_table(dict(sorted(SOFTMAX_CASES.items())),
                             mesh_shape, layout, mode)


def _softmax_grad_of_grad(x, g, h):
  """d/dx of sum(h * dsoftmax(x)^T g) for softmax over axis 1, by hand."""
  y = _softmax(x, 1)
  # dx(g) = y * (g - sum(y * g)); its derivative along x, contracted with h.
  s = np.sum(y * g, axis=1, keepdims=True)
  t = np.sum(h * y, axis=1, keepdims=True)
  d_y = h * (g - s) - g * t
  return y * (d_y - np.sum(y * d_y, axis=1, keepdims=True))


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_softmax_second_order(mesh_shape, layout, mode):
  """The gradient of softmax's gradient (its own gradient operation)."""
  g = np.random.RandomState(4).uniform(-1, 1, X.shape).astype(np.float32)
  h = np.random.RandomState(5).uniform(-1, 1, X.shape).astype(np.float32)

  def build(mesh, t):
    del mesh
    b = _dims("b")[0]
    y = mtf.softmax(t["x"], b)
    [dx] = mtf.gradients([mtf.reduce_sum(y * t["g"])], [t["x"]])
    [ddx] = mtf.gradients([mtf.reduce_sum(dx * t["h"])], [t["x"]])
    return {"dx": dx, "ddx": ddx}

  def expected(x, g, h):
    y = _softmax(x, 1)
    return {"dx": y * (g - np.sum(y * g, axis=1, keepdims=True)),
            "ddx": _softmax_grad_of_grad(x, g, h)}

  mtf_testing.check_op(build, expected,
                       {"x": (X, ABC), "g": (g, ABC), "h": (h, ABC)},
                       mesh_shape, layout, mode, grad_wrt=[])


def test_softmax_bfloat16():
  """bfloat16 softmax runs on CPU and stays close to float32."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "", [""])
  x = mtf.import_tf_tensor(mesh, tf.constant(X, tf.bfloat16),
                           mtf.Shape(_dims("abc")))
  y = mtf.softmax(x, _dims("b")[0])
  lowering = mtf.Lowering(mesh.graph, {mesh: impl})
  result = lowering.export_to_tf_tensor(y)
  assert result.dtype == tf.bfloat16
  np.testing.assert_allclose(tf.cast(result, tf.float32).numpy(),
                             _softmax(X, 1), atol=1e-2)


def test_output_shapes():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("abc"))
  assert mtf.reduce_sum(x).shape == mtf.Shape([])
  assert mtf.reduce_max(x, reduced_dim=_dims("b")[0]).shape == mtf.Shape(
      _dims("ac"))
  assert mtf.reduce_mean(x, reduced_dim=_dims("ca")).shape == mtf.Shape(
      _dims("b"))
  assert mtf.reduce_min(x, output_shape=_dims("cb")).shape == mtf.Shape(
      _dims("cb"))
  assert mtf.reduce_logsumexp(x, _dims("b")[0]).shape == mtf.Shape(
      _dims("ac"))
  assert mtf.softmax(x, _dims("b")[0]).shape == x.shape


def test_bad_reductions():
  """Reducing a missing dimension, or to a shape with new dimensions."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("ab"))
  with pytest.raises(mtf.ShapeError, match="'c'"):
    mtf.reduce_sum(x, reduced_dim=_dims("c")[0])
  with pytest.raises(mtf.ShapeError, match="'c'"):
    mtf.reduce_max(x, output_shape=_dims("ac"))
  with pytest.raises(ValueError):
    mtf.reduce_sum(x, output_shape=_dims("a"), reduced_dim=_dims("b")[0])


def test_reduce_operation_reduction_names():
  # The original's names are capitals but its tests wrote "sum"; any case
  # works, and an unknown name lists the known ones.
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("ab"))
  op = mtf.ReduceOperation(x, mtf.Shape(_dims("b")), "sum")
  assert op.reduction_fn_string == "SUM"
  with pytest.raises(ValueError, match="'MEDIAN'.*'SUM'"):
    mtf.ReduceOperation(x, mtf.Shape(_dims("b")), "median")


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_lazy_sum_of_contraction(mode):
  """reduce_sum of a pending partial sum stays lazy: one allreduce."""
  a, b, c = _dims("abc")
  xv = X[:, :, 0]
  wv = X[0, :, :]
  lowerings = []

  impl = mtf_testing.make_impl(mode, "all:8", "b:all")

  def build_and_lower():
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), [a, b])
    w = mtf.import_tf_tensor(mesh, tf.constant(wv), [b, c])
    y = mtf.reduce_mean(mtf.einsum([x, w], output_shape=[a, c]))
    lowering = mtf.Lowering(mesh.graph, {mesh: impl})
    lowerings.append(lowering)
    return lowering, lowering.export_to_tf_tensor(y)

  y = mtf_testing.run_in_mode(mode, build_and_lower, impl)
  np.testing.assert_allclose(y, np.mean(xv @ wv), rtol=1e-5, atol=1e-5)
  counters = dict(lowerings[-1].counters)
  assert counters.get("comm/allreduce/all/calls") == 1, counters
  # The scalar, not the [a, c] matrix, crosses the mesh.
  assert counters["comm/allreduce/all/bytes"] == 4 * 8, counters


XI = np.random.RandomState(4).randint(-50, 50, size=(8, 16, 8)).astype(
    np.int32)


def _np_int_mean(x, axis):
  """tf.reduce_mean of integers: the integer sum divided by the count,
  truncated towards zero (C++ integer division)."""
  total = np.sum(x.astype(np.int64), axis=axis)
  count = np.prod([x.shape[a] for a in np.atleast_1d(axis)])
  return (np.sign(total) * (np.abs(total) // count)).astype(x.dtype)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_reduce_mean_of_integers_follows_tf(mesh_shape, layout, mode):
  assert int(tf.reduce_mean(tf.constant([-3, 0]))) == -1  # TF's meaning
  a, b, c = _dims("abc")
  mtf_testing.check_op(
      lambda mesh, t: {"b": mtf.reduce_mean(t["x"], reduced_dim=b),
                       "ac": mtf.reduce_mean(t["x"], output_shape=[b]),
                       "all": mtf.reduce_mean(t["x"])},
      lambda x: {"b": _np_int_mean(x, 1), "ac": _np_int_mean(x, (0, 2)),
                 "all": _np_int_mean(x, (0, 1, 2))},
      {"x": (XI, ABC)}, mesh_shape, layout, mode)


def test_reduce_mean_refuses_bool_naming_op_and_dtype():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  p = mtf.cast(mtf.zeros(mesh, _dims("ab")), tf.bool)
  with pytest.raises(TypeError, match="reduce_mean.*bool"):
    mtf.reduce_mean(p, reduced_dim=_dims("a")[0])


@pytest.mark.parametrize("fn", [mtf.reduce_sum, mtf.reduce_mean,
                                mtf.reduce_max, mtf.reduce_min,
                                mtf.reduce_all, mtf.reduce_any])
def test_reductions_refuse_positional_arguments_beyond_x(fn):
  """As in the original: reduce_sum(x, shape) is a mistake (is the shape
  the output or the reduced one?), so only x may be positional."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("ab"))
  if fn in (mtf.reduce_all, mtf.reduce_any):
    x = mtf.cast(x, tf.bool)
  with pytest.raises(ValueError, match=f"{fn.__name__}.*keyword"):
    fn(x, mtf.Shape(_dims("a")))
  y = fn(x, output_shape=mtf.Shape(_dims("a")))
  assert y.shape == mtf.Shape(_dims("a"))
  assert fn(x, disable_positional_args=None, reduced_dim=_dims("a")[0],
            name="r").shape == mtf.Shape(_dims("b"))
