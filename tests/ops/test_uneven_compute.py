"""The compute op families under uneven splits (issue 40), against float64
NumPy with gradients.

Tensors have sizes 5 and 7 (p, q: uneven on every layout of
`mtf_testing.uneven_layouts`, 5 over 8 leaving three processors wholly
padding) and 12 and 100 (s and v, split with p and q: uneven on `all:8`,
even on the 2-D meshes); r = 3 is never split. check_ops also asserts that
every output keeps its padding zero, the invariant padded lowerings rely on.
Each test batches a family's cases into one lowering per layout and mode.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from tests import mtf_testing

P, Q, S, V, R = 5, 7, 12, 100, 3
# s and v are split as p and q are.
_LIKE = {"s": "p", "v": "q"}


# SIMD programs cost ~20 times an eager run here (a tf.function of the
# whole table, inlined once per device). Their padding code (slice offsets
# as tensors) is the same on every layout, so they run on the 2-D layout
# and, for the families with padding code of their own (filled neutral
# values, block offsets, random slices), on all:8 with p = 5, where three
# processors hold only padding.
SIMD_LAYOUTS = ("b2m4",)
SIMD_LAYOUTS_OWN_PADDING = ("all8_p", "b2m4")


def _params(simd_layouts):
  """uneven_layout_mode_params of (p, q), with s and v split alike, SIMD
  on `simd_layouts` only."""
  params = []
  for param in mtf_testing.uneven_layout_mode_params(
      ["p", "q"], simd_mode_layouts=simd_layouts):
    mesh_shape, rules, mode = param.values
    mesh_of = dict(rules.pairs)
    pairs = rules.pairs + [(new, mesh_of[old]) for new, old in _LIKE.items()
                           if old in mesh_of]
    params.append(pytest.param(
        mesh_shape, mtf.LayoutRules(pairs, allow_uneven=True), mode,
        id=param.id))
  return params


PARAMS = _params(SIMD_LAYOUTS)
PARAMS_OWN_PADDING = _params(SIMD_LAYOUTS_OWN_PADDING)


def _uniform(shape, seed, low=-2.0, high=2.0):
  return np.random.RandomState(seed).uniform(low, high, shape).astype(
      np.float32)


def _ints(shape, seed, high):
  return np.random.RandomState(seed).randint(0, high, shape).astype(np.int32)


X = (_uniform([P, Q], 0), ["p", "q"])
Y = (_uniform([P, Q], 1), ["p", "q"])
POSITIVE = (_uniform([P, Q], 2, 0.5, 2.0), ["p", "q"])
NEGATIVE = (_uniform([P, Q], 3, -3.0, -0.5), ["p", "q"])
ROW = (_uniform([P], 4), ["p"])
COL = (_uniform([Q], 5), ["q"])
QR = (_uniform([Q, R], 6), ["q", "r"])
PQR = (_uniform([P, Q, R], 7), ["p", "q", "r"])
BIG = (_uniform([S, V], 8, -1.0, 1.0), ["s", "v"])
BIG_COL = (_uniform([V], 9, -1.0, 1.0), ["v"])
SR = (_uniform([S, R], 10), ["s", "r"])
MOSTLY_TRUE = (np.random.RandomState(11).rand(P, Q) < 0.9, ["p", "q"])
MOSTLY_FALSE = (np.random.RandomState(12).rand(P, Q) < 0.1, ["p", "q"])
INTS = (_ints([P, Q], 13, 4), ["p", "q"])
INTS2 = (_ints([P, Q], 14, 4), ["p", "q"])


def _dim(name):
  return mtf.Dimension(name, {"p": P, "q": Q, "s": S, "v": V, "r": R}[name])


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_elementwise_and_constants(mesh_shape, layout, mode):
  """Element-wise functions, casts and constants along padded dimensions.

  mtf's own functions with f(0) = 0 (relu, tanh, casts, ...) keep zero
  padding without the Lowering zeroing it again (`keeps_zero`): the
  harness's padding check holds them to it.
  """
  unary = {
      "exp": (mtf.exp, np.exp, X), "log": (mtf.log, np.log, POSITIVE),
      "sigmoid": (mtf.sigmoid, lambda x: 1 / (1 + np.exp(-x)), X),
      "relu": (mtf.relu, lambda x: np.maximum(x, 0), X),
      "tanh": (mtf.tanh, np.tanh, X), "sqrt": (mtf.sqrt, np.sqrt, POSITIVE),
      "square": (mtf.square, np.square, X), "sin": (mtf.sin, np.sin, X),
      "negative": (mtf.negative, np.negative, X),
      "abs": (mtf.abs, np.abs, X),
      "gelu": (mtf.gelu, lambda x: 0.5 * x * (1 + np.tanh(
          np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), X),
      "elu": (mtf.elu, lambda x: np.where(x > 0, x, np.expm1(x)), X),
      "selu": (mtf.selu, lambda x: 1.0507009873554805 * np.where(
          x > 0, x, 1.6732632423543772 * np.expm1(x)), X),
      "swish": (mtf.swish, lambda x: x / (1 + np.exp(-x)), X),
      "leaky_relu": (mtf.leaky_relu, lambda x: np.where(x > 0, x, 0.2 * x),
                     X),
      "identity": (mtf.identity, lambda x: x, X),
      "softplus": (mtf.softplus, lambda x: np.log1p(np.exp(x)), X),
      "rsqrt": (mtf.rsqrt, lambda x: 1 / np.sqrt(x), POSITIVE),
      # A user's function is not trusted to map 0 to 0, whatever its name.
      "user_cwise": (lambda x: mtf.cwise(lambda t: t + 1.0, [x], name="relu"),
                     lambda x: x + 1.0, X),
      "exp_big": (mtf.exp, np.exp, BIG),
      "tanh_big_col": (mtf.tanh, np.tanh, BIG_COL),
      # No gradients: bool and int inputs.
      "logical_not": (mtf.logical_not, np.logical_not, MOSTLY_FALSE),
      "int_to_float": (mtf.to_float, lambda x: x.astype(np.float32), INTS),
      "int_sign": (mtf.sign, np.sign, (INTS[0] - 2, INTS[1])),
      "float_to_int": (mtf.to_int32, lambda x: x.astype(np.int32),
                       POSITIVE),
      "bool_to_int": (mtf.to_int32, lambda x: x.astype(np.int32),
                      MOSTLY_TRUE),
  }
  table = {name: (fn, np_fn, {"x": x}) for name, (fn, np_fn, x)
           in unary.items()}
  # Constants have no input; one is multiplied in so that they have one.
  table.update({
      "ones_times_x": (
          lambda x: mtf.ones(x.mesh, x.shape) * x, lambda x: x, {"x": X}),
      "ones_big_plus": (
          lambda x: mtf.ones(x.mesh, x.shape) + x, lambda x: x + 1,
          {"x": BIG}),
      "zeros_plus_x": (lambda x: mtf.zeros(x.mesh, x.shape) + x,
                       lambda x: x, {"x": X}),
      "constant_minus_x": (
          lambda x: mtf.constant(x.mesh, 3.0, x.shape) - x,
          lambda x: 3.0 - x, {"x": X}),
      "array_constant": (
          lambda x: mtf.constant(x.mesh, Y[0], x.shape) * x,
          lambda x: Y[0] * x, {"x": X}),
      "range_p_times_x": (
          lambda x: mtf.cast(mtf.range(x.mesh, _dim("p"), tf.int32),
                             tf.float32) * x,
          lambda x: np.arange(P, dtype=np.float32)[:, None] * x, {"x": X}),
      "range_q": (lambda i: mtf.range(i.mesh, _dim("q"), tf.int32) + i,
                  lambda i: np.arange(Q, dtype=np.int32) + i,
                  {"i": INTS}),
      "range_v": (lambda x: mtf.range(x.mesh, _dim("v"), tf.float32) * x,
                  lambda x: np.arange(V, dtype=np.float32) * x,
                  {"x": BIG_COL}),
  })
  mtf_testing.check_op_table(table, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_binary_comparisons_and_where(mesh_shape, layout, mode):
  """Binary ops broadcasting by name (an operand without a padded
  dimension fills that dimension's padding, which must not leak), scalar
  ops, comparisons, where and add_n."""
  table = {
      "add": (lambda x, c: x + c, lambda x, c: x + c, {"x": X, "c": COL}),
      "add_row": (
          lambda r, c: mtf.add(r, c, output_shape=[_dim("p"), _dim("q")]),
          lambda r, c: r[:, None] + c, {"r": ROW, "c": COL}),
      "sub": (lambda x, r: x - r, lambda x, r: x - r[:, None],
              {"x": X, "r": ROW}),
      "multiply": (lambda x, y: x * y, lambda x, y: x * y, {"x": X, "y": Y}),
      "multiply_col": (lambda x, c: x * c, lambda x, c: x * c,
                       {"x": X, "c": COL}),
      "divide": (lambda x, y: x / y, lambda x, y: x / y,
                 {"x": X, "y": POSITIVE}),
      "divide_col": (lambda c, y: mtf.divide(c, y),
                     lambda c, y: c / y, {"c": COL, "y": POSITIVE}),
      "maximum": (mtf.maximum, np.maximum, {"x": X, "y": Y}),
      "maximum_col": (mtf.maximum, np.maximum, {"x": X, "c": COL}),
      "minimum_scalar": (lambda x: mtf.minimum(x, 0.5),
                         lambda x: np.minimum(x, 0.5), {"x": X}),
      "maximum_scalar": (lambda x: mtf.maximum(x, -0.5),
                         lambda x: np.maximum(x, -0.5), {"x": NEGATIVE}),
      "scalar_multiply": (lambda x: x * 2.5, lambda x: x * 2.5, {"x": X}),
      "scalar_add": (lambda x: x + 3.0, lambda x: x + 3.0, {"x": X}),
      "scalar_rsub": (lambda x: 2.0 - x, lambda x: 2.0 - x, {"x": X}),
      "scalar_divide": (lambda x: x / 4.0, lambda x: x / 4.0, {"x": X}),
      "pow": (lambda x: mtf.pow(x, 1.5), lambda x: x ** 1.5,
              {"x": POSITIVE}),
      "add_n": (lambda x, r, c: mtf.add_n([x, r, c]),
                lambda x, r, c: x + r[:, None] + c,
                {"x": X, "r": ROW, "c": COL}),
      "broadcast": (lambda c: mtf.broadcast(c, [_dim("p"), _dim("q")]),
                    lambda c: np.broadcast_to(c, (P, Q)), {"c": COL}),
      "add_big": (lambda x, c: x + c, lambda x, c: x + c,
                  {"x": BIG, "c": BIG_COL}),
      "where": (lambda x, y: mtf.where(mtf.greater(x, y), x, y),
                lambda x, y: np.where(x > y, x, y), {"x": X, "y": Y}),
      "where_col": (lambda x, c: mtf.where(mtf.greater(x, 0.0), x, c),
                    lambda x, c: np.where(x > 0, x, c), {"x": X, "c": COL}),
      "where_scalar": (lambda r, x: mtf.where(r, x, 2.0),
                       lambda r, x: np.where(r[:, None], x, 2.0),
                       {"r": (ROW[0] > 0, ["p"]), "x": X}),
      # Comparisons: bool outputs, no gradient.
      "greater": (mtf.greater, np.greater, {"x": X, "c": COL}),
      "equal": (mtf.equal, np.equal, {"i": INTS, "j": INTS2}),
      "logical_or": (mtf.logical_or, np.logical_or,
                     {"a": MOSTLY_TRUE, "b": MOSTLY_FALSE}),
  }
  mtf_testing.check_op_table(table, mesh_shape, layout, mode)


def _einsum(dims):
  return lambda *xs: mtf.einsum(list(xs), output_shape=[_dim(d) for d in dims])


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_contractions(mesh_shape, layout, mode):
  """einsum contracting over a padded dimension, into a padded output,
  both, and outer products of padded vectors."""
  table = {
      "matmul": (lambda x, w: mtf.matmul(x, w),
                 lambda x, w: x @ w, {"x": X, "w": QR}),
      "contract_p": (_einsum("q"), lambda x, y: np.sum(x * y, 0),
                     {"x": X, "y": Y}),
      "contract_all": (_einsum(""), lambda x, r, c: np.einsum(
          "pq,p,q->", x, r, c), {"x": X, "r": ROW, "c": COL}),
      "outer": (_einsum("pq"), np.outer, {"r": ROW, "c": COL}),
      "transpose": (_einsum("qp"), np.transpose, {"x": X}),
      # A dimension no input has: the output is broadcast along it.
      "broadcast": (_einsum("qp"), lambda r: np.broadcast_to(r, (Q, P)),
                    {"r": ROW}),
      "three_d": (_einsum("rp"), lambda t, c: np.einsum("pqr,q->rp", t, c),
                  {"t": PQR, "c": COL}),
      "elementwise": (_einsum("pq"), lambda x, y: x * y, {"x": X, "y": Y}),
      "big": (_einsum("s"), lambda b, c: b @ c, {"b": BIG, "c": BIG_COL}),
  }
  mtf_testing.check_op_table(table, mesh_shape, layout, mode,
                             rtol=1e-4, atol=1e-4)


def _reduction(fn, names, **kwargs):
  return lambda x: fn(x, reduced_dim=[_dim(n) for n in names], **kwargs)


def _logsumexp(x, axis):
  m = np.max(x, axis=axis, keepdims=True)
  return np.log(np.sum(np.exp(x - m), axis=axis)) + np.squeeze(m, axis)


def _softmax(x, axis):
  e = np.exp(x - np.max(x, axis=axis, keepdims=True))
  return e / np.sum(e, axis=axis, keepdims=True)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS_OWN_PADDING)
def test_reductions_and_softmax(mesh_shape, layout, mode):
  """Reductions over padded dimensions (sum ignores zero padding; max,
  min and mean must not count it), boolean any/all, logsumexp and
  softmax over a padded dimension and over another one."""
  table = {
      "sum_q": (_reduction(mtf.reduce_sum, "q"), lambda x: x.sum(1),
                {"x": X}),
      "mean_p": (_reduction(mtf.reduce_mean, "p"), lambda x: x.mean(0),
                 {"x": X}),
      "mean_all": (mtf.reduce_mean, np.mean, {"x": X}),
      "max_q": (_reduction(mtf.reduce_max, "q"), lambda x: x.max(1),
                {"x": NEGATIVE}),
      "max_all": (mtf.reduce_max, np.max, {"x": NEGATIVE}),
      "min_p": (_reduction(mtf.reduce_min, "p"), lambda x: x.min(0),
                {"x": POSITIVE}),
      "max_pq": (_reduction(mtf.reduce_max, "pq"), lambda t: t.max((0, 1)),
                 {"t": PQR}),
      "min_qr": (_reduction(mtf.reduce_min, "qr"), lambda t: t.min((1, 2)),
                 {"t": PQR}),
      "sum_pr": (_reduction(mtf.reduce_sum, "pr"), lambda t: t.sum((0, 2)),
                 {"t": PQR}),
      "max_v": (_reduction(mtf.reduce_max, "v"), lambda b: b.max(1),
                {"b": BIG}),
      "mean_s": (_reduction(mtf.reduce_mean, "s"), lambda b: b.mean(0),
                 {"b": BIG}),
      "logsumexp_q": (lambda x: mtf.reduce_logsumexp(x, _dim("q")),
                      lambda x: _logsumexp(x, 1), {"x": NEGATIVE}),
      "logsumexp_p": (lambda x: mtf.reduce_logsumexp(x, _dim("p")),
                      lambda x: _logsumexp(x, 0), {"x": X}),
      "softmax_q": (lambda x: mtf.softmax(x, _dim("q")),
                    lambda x: _softmax(x, 1), {"x": NEGATIVE}),
      "softmax_p": (lambda x: mtf.softmax(x, _dim("p")),
                    lambda x: _softmax(x, 0), {"x": X}),
      "softmax_r": (lambda t: mtf.softmax(t, _dim("r")),
                    lambda t: _softmax(t, 2), {"t": PQR}),
      "softmax_v": (lambda b: mtf.softmax(b, _dim("v")),
                    lambda b: _softmax(b, 1), {"b": BIG}),
      "log_softmax_q": (lambda x: mtf.log_softmax(x, _dim("q")),
                        lambda x: x - _logsumexp(x, 1)[:, None],
                        {"x": NEGATIVE}),
      "log_softmax_p": (lambda x: mtf.log_softmax(x, _dim("p")),
                        lambda x: x - _logsumexp(x, 0), {"x": X}),
      # Booleans and ints: no gradient.
      "any_q": (_reduction(mtf.reduce_any, "q"), lambda b: b.any(1),
                {"b": MOSTLY_FALSE}),
      "all_p": (_reduction(mtf.reduce_all, "p"), lambda b: b.all(0),
                {"b": MOSTLY_TRUE}),
      "all_pq": (mtf.reduce_all, np.all, {"b": MOSTLY_TRUE}),
      "any_pq": (mtf.reduce_any, np.any, {"b": MOSTLY_FALSE}),
      "int_max_q": (_reduction(mtf.reduce_max, "q"),
                    lambda i: i.max(1), {"i": (INTS[0] - 9, INTS[1])}),
  }
  mtf_testing.check_op_table(table, mesh_shape, layout, mode)


def _top_k(x, axis, k):
  """Values and indices of the k largest along `axis`, moved last (ties to
  the smaller index, as tf.math.top_k)."""
  x = np.moveaxis(x, axis, -1)
  order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
  return np.take_along_axis(x, order, -1), order.astype(np.int32)


def _pick(fn, index):
  return lambda *xs: fn(*xs)[index]


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS_OWN_PADDING)
def test_selection_and_scans(mesh_shape, layout, mode):
  """top_k, argmax and nth_largest over a padded dimension of negative
  values (zero padding would win), and cumsum along padded dimensions."""
  k3 = mtf.Dimension("k", 3)
  table = {
      "top_k_q": (lambda x: mtf.top_k(x, _dim("q"), k3)[0],
                  lambda x: _top_k(x, 1, 3)[0], {"x": NEGATIVE}),
      "top_k_q_indices": (lambda x: mtf.top_k(x, _dim("q"), k3)[1],
                          lambda x: _top_k(x, 1, 3)[1], {"x": NEGATIVE}),
      "top_k_p": (lambda x: mtf.top_k(x, _dim("p"), k3)[0],
                  lambda x: _top_k(x, 0, 3)[0], {"x": NEGATIVE}),
      "top_k_v": (lambda b: mtf.top_k(b, _dim("v"), mtf.Dimension("k", 4))[0],
                  lambda b: _top_k(b, 1, 4)[0], {"b": BIG}),
      "top_1_p": (lambda x: mtf.top_1(x, _dim("p"))[0],
                  lambda x: x.max(0), {"x": NEGATIVE}),
      "argmax_q": (lambda x: mtf.argmax(x, _dim("q")),
                   lambda x: np.argmax(x, 1).astype(np.int32),
                   {"x": NEGATIVE}),
      "argmax_p": (lambda x: mtf.argmax(x, _dim("p")),
                   lambda x: np.argmax(x, 0).astype(np.int32),
                   {"x": NEGATIVE}),
      "int_argmax_q": (lambda i: mtf.argmax(i, _dim("q")),
                       lambda i: np.argmax(i, 1).astype(np.int32),
                       {"i": (INTS[0] - 9, INTS[1])}),
      "nth_largest_q": (
          lambda x: mtf.nth_largest_element(x, 2, _dim("q")),
          lambda x: np.sort(x, 1)[:, -3], {"x": NEGATIVE}),
      "nth_smallest_p": (
          lambda x: mtf.nth_smallest_element(x, 1, _dim("p")),
          lambda x: np.sort(x, 0)[1], {"x": POSITIVE}),
      "cumsum_q": (lambda x: mtf.cumsum(x, _dim("q")),
                   lambda x: np.cumsum(x, 1), {"x": X}),
      "cumsum_p_exclusive": (
          lambda x: mtf.cumsum(x, _dim("p"), exclusive=True),
          lambda x: np.cumsum(x, 0) - x, {"x": X}),
      "cumsum_v": (lambda b: mtf.cumsum(b, _dim("v")),
                   lambda b: np.cumsum(b, 1), {"b": BIG}),
      "int_cumsum_q": (lambda i: mtf.cumsum(i, _dim("q")),
                       lambda i: np.cumsum(i, 1).astype(np.int32),
                       {"i": INTS}),
  }
  mtf_testing.check_op_table(table, mesh_shape, layout, mode,
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS_OWN_PADDING)
def test_one_hot_and_gather(mesh_shape, layout, mode):
  """one_hot into a padded dimension and of padded indices; gather of a
  padded weights dimension by padded indices (and its gradient,
  scatter_add), also with both on one mesh dimension (s and p on all:8)."""
  rows = (_ints([R], 20, P), ["r"])
  by_p = (_ints([P], 21, Q), ["p"])
  by_p_into_s = (_ints([P], 22, S), ["p"])
  repeated = (np.array([Q - 1, 0, Q - 1], np.int32), ["i"])

  def select(x, i):
    # x[p, i[p]]: an einsum with the one-hot of padded indices.
    return mtf.einsum([x, mtf.one_hot(i, _dim("q"))],
                      output_shape=[_dim("p")])

  table = {
      "one_hot_into_p": (lambda i: mtf.one_hot(i, _dim("p")),
                         lambda i: np.eye(P, dtype=np.float32)[i],
                         {"i": rows}),
      "one_hot_off_value": (
          lambda i: mtf.one_hot(i, _dim("p"), on_value=2.0, off_value=-0.5),
          lambda i: np.where(np.eye(P, dtype=bool)[i], 2.0, -0.5).astype(
              np.float32), {"i": rows}),
      "one_hot_of_p": (lambda i: mtf.one_hot(i, _dim("q"), dtype=tf.int32),
                       lambda i: np.eye(Q, dtype=np.int32)[i],
                       {"i": by_p}),
      "one_hot_select": (select, lambda x, i: x[np.arange(P), i],
                         {"x": X, "i": by_p}),
      "gather_q_by_p": (lambda w, i: mtf.gather(w, i, _dim("q")),
                        lambda w, i: w[i], {"w": QR, "i": by_p}),
      "gather_q_repeated": (lambda w, i: mtf.gather(w, i, _dim("q")),
                            lambda w, i: w[i], {"w": QR, "i": repeated}),
      "gather_s_by_p": (lambda w, i: mtf.gather(w, i, _dim("s")),
                        lambda w, i: w[i], {"w": SR, "i": by_p_into_s}),
      "gather_p_of_x": (lambda x, i: mtf.gather(x, i, _dim("p")),
                        lambda x, i: x[i], {"x": X, "i": (
                            _ints([R], 23, P), ["r"])}),
  }
  mtf_testing.check_op_table(table, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_stop_gradient(mesh_shape, layout, mode):
  """stop_gradient keeps the value and cuts its branch of the gradient."""
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.stop_gradient(t["x"]) * t["x"] + t["x"]},
      lambda x: {"y": x * x + x}, {"x": X}, mesh_shape, layout, mode,
      np_grad_fn=lambda cot, x: {"x": cot["y"] * (x + 1)})


_RANDOM_REFERENCE = {}


def _random_program(impl):
  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(X[0]),
                             [_dim("p"), _dim("q")])
    outputs = {
        "uniform": mtf.random_uniform(mesh, [_dim("p"), _dim("q")], seed=3,
                                      minval=-1.0, maxval=1.0),
        "normal_big": mtf.random_normal(mesh, [_dim("s"), _dim("v")],
                                        seed=4),
        "int": mtf.random_uniform(mesh, [_dim("q"), _dim("r")], seed=5,
                                  minval=0, maxval=100, dtype=tf.int32),
        "dropout": mtf.dropout(x, rate=0.5, seed=6),
    }
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, {k: lowering.export_to_tf_tensor(v)
                      for k, v in outputs.items()}
  return build_and_lower


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS_OWN_PADDING)
def test_random_values_do_not_depend_on_the_layout(mesh_shape, layout, mode):
  """Random tensors (and a dropout mask) under an uneven layout equal the
  one-processor values."""
  if not _RANDOM_REFERENCE:
    impl = mtf_testing.make_impl("eager", "all:1", "")
    _RANDOM_REFERENCE.update(mtf_testing.run_in_mode(
        "eager", _random_program(impl)))
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  got = mtf_testing.run_in_mode(mode, _random_program(impl), impl)
  for k, want in _RANDOM_REFERENCE.items():
    np.testing.assert_array_equal(
        got[k], want, err_msg=f"[{mesh_shape}, {layout}, {mode}] {k}")


def test_mixing_ops_lower_natively_on_padded_dimensions():
  """Ops that mix values along a padded dimension (softmax and its
  gradient, top_k, cumsum, gather's gradient scatter_add) handle the
  padding in their own lowering: the Lowering does not gather them whole."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(X[0]), [_dim("p"), _dim("q")])
  w = mtf.import_tf_tensor(mesh, tf.constant(QR[0]), [_dim("q"), _dim("r")])
  indices = mtf.import_tf_tensor(mesh, tf.constant(_ints([P], 21, Q)),
                                 [_dim("p")])
  loss = (mtf.reduce_sum(mtf.softmax(x, _dim("q"))) +
          mtf.reduce_sum(mtf.top_k(x, _dim("q"), mtf.Dimension("k", 2))[0]) +
          mtf.reduce_sum(mtf.cumsum(x, _dim("q"))) +
          mtf.reduce_sum(mtf.gather(w, indices, _dim("q"))))
  mtf.gradients([loss], [x, w])
  impl = mtf.MeshImpl("b:2;m:4", mtf.LayoutRules(
      [("p", "b"), ("q", "m")], allow_uneven=True))
  kinds = set()
  for op in graph.operations:
    padded = {t.shape.dims[a.tensor_axis].name for t in op.inputs + op.outputs
              for a in impl.padded_axes(t.shape)}
    kinds.add(type(op).__name__)
    assert not padded or op.handles_padding_of(padded), (
        f"{type(op).__name__} {op.name} is gathered around {padded}")
  assert {"SoftmaxOperation", "SoftmaxGradOperation", "TopKOperation",
          "CumsumOperation", "ScatterAddOperation"} <= kinds


def test_only_zero_preserving_functions_skip_the_zeroing():
  """padding_stays_zero for mtf's functions with f(0) = 0 (and their
  gradients, dy * f' with f' finite at 0), not for others or user ones."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [_dim("p"), _dim("q")])

  def stays_zero(y):
    return y.operation.padding_stays_zero

  for fn in (mtf.relu, mtf.tanh, mtf.abs, mtf.negative, mtf.sqrt,
             mtf.to_int32, mtf.gelu, mtf.elu):
    assert stays_zero(fn(x)), fn.__name__
  for fn in (mtf.exp, mtf.sigmoid, mtf.log, mtf.cos, mtf.softplus,
             mtf.logical_not):
    arg = mtf.cast(x, tf.bool) if fn is mtf.logical_not else x
    assert not stays_zero(fn(arg)), fn.__name__
  assert not stays_zero(mtf.cwise(tf.nn.relu, [x], name="relu"))
  # Gradients: log's dy / x and sqrt's dy / (2 y) are 0 / 0 in padding.
  for fn, keeps in ((mtf.exp, True), (mtf.tanh, True), (mtf.log, False),
                    (mtf.sqrt, False)):
    y = fn(x)
    grad_op = mtf.gradients([mtf.reduce_sum(y)], [x])[0].operation
    while not isinstance(grad_op, mtf.ops.slicewise_ops.SlicewiseOperation):
      grad_op = grad_op.inputs[0].operation
    assert grad_op.padding_stays_zero == keeps, fn.__name__


def test_einsum_cost_counts_padded_slices():
  """The cost rule prices the local einsum on the padded slices it runs."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  y = mtf.einsum([mtf.zeros(mesh, [_dim("p"), _dim("q")]),
                  mtf.zeros(mesh, [_dim("q"), _dim("r")])],
                 output_shape=[_dim("p"), _dim("r")])
  cost = cost_model.operation_cost(y.operation, {"p": "b", "q": "m"},
                                   {"b": 2, "m": 4})
  # Slices of ceil(5 / 2) = 3 by ceil(7 / 4) = 2, times r = 3.
  assert cost.flops == 2 * 3 * 2 * 3
