"""Tests of mesh_tensorflow.layers.local_attention_layers against NumPy.

Local attention exists to split a long dimension: every layer is checked
with its blocks (or length) dimension split across the mesh, where halo
exchange must reproduce the one-processor answer, as well as with heads or
batch split, in eager and tf.function mode (graph and SIMD modes where cheap).
Decoding (`masked_local_attention_1d_incremental`) is checked step by step
against the full-sequence layer.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

MODES = ("eager", "function")
BATCH = mtf.Dimension("batch", 2)
HEADS = mtf.Dimension("heads", 2)
IO = mtf.Dimension("io", 4)
KV = mtf.Dimension("kv", 2)
LENGTH = mtf.Dimension("length", 8)

_import = mtf_testing.import_array


def _rand(shape, seed):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


def _np_softmax(x, axis=-1):
  e = np.exp(x - np.max(x, axis=axis, keepdims=True))
  return e / np.sum(e, axis=axis, keepdims=True)


def _np_attend(q, k, v, mask=None):
  """softmax(q k + mask) v over the second-to-last axis of k."""
  logits = np.einsum("...qd,...md->...qm", q, k)
  if mask is not None:
    logits = logits + mask
  return np.einsum("...qm,...md->...qd", _np_softmax(logits), v)


def _ids(cases):
  return [pytest.param(*c, id="-".join(str(x) or "none" for x in c))
          for c in cases]


# ------------------------------------------------ masked_local_attention_1d

X = _rand([2, 8, 4], 0)
WEIGHTS = {n: _rand([2, 4, 2], i + 1) for i, n in enumerate(
    ["wq", "wk", "wv", "wo"])}
W_DIMS = ["heads", "io", "kv"]


def _np_masked_local_1d(x, wq, wk, wv, wo, window_size, block_length):
  """The original's local attention: position p sees q in
  (p - block_length, p] from its block and the window before it, with zero
  keys and values before the start."""
  q = np.einsum("bli,hik->bhlk", x, wq)
  k = np.einsum("bli,hik->bhlk", x, wk)
  v = np.einsum("bli,hik->bhlk", x, wv)
  length = x.shape[1]
  o = np.zeros_like(q)
  for p in range(length):
    start = p // block_length * block_length
    memory = range(max(p - block_length + 1, start - window_size), p + 1)
    keys = np.stack([k[:, :, j] if j >= 0 else 0 * k[:, :, 0]
                     for j in memory], axis=2)
    values = np.stack([v[:, :, j] if j >= 0 else 0 * v[:, :, 0]
                       for j in memory], axis=2)
    o[:, :, p] = _np_attend(q[:, :, p:p + 1], keys, values)[:, :, 0]
  return np.einsum("bhlk,hik->bli", o, wo)


@pytest.mark.parametrize("mesh_shape,layout,length_per_split,window,mode",
                         _ids([
                             ("all:1", "", None, 3, "eager"),
                             ("all:1", "", 4, 4, "graph"),
                             ("all:2", "heads:all", 4, 2, "function"),
                             ("all:2", "length:all", 4, 2, "eager"),
                             ("all:2", "length:all", 4, 4, "function"),
                             ("all:2", "length:all", 4, 2, "simd"),
                             ("rows:2;cols:4", "batch:rows;length:cols", 2, 3,
                              "eager"),
                             ("rows:2;cols:4", "heads:rows;length:cols", 2, 1,
                              "function"),
                         ]))
def test_masked_local_attention_1d(mesh_shape, layout, length_per_split,
                                   window, mode):
  block = length_per_split or 8

  def build_fn(mesh, t):
    del mesh
    params = [t[n] for n in ["wq", "wk", "wv", "wo"]]
    return {"y": mtf.layers.masked_local_attention_1d(
        t["x"], KV, HEADS, False, window_size=window,
        length_per_split=length_per_split, params=params)}

  def np_fn(x, **w):
    return {"y": _np_masked_local_1d(x, w["wq"], w["wk"], w["wv"], w["wo"],
                                     window, block)}

  inputs = {"x": (X, ["batch", "length", "io"])}
  inputs.update({n: (w, W_DIMS) for n, w in WEIGHTS.items()})
  mtf_testing.check_op(build_fn, np_fn, inputs, mesh_shape, layout, mode)


def test_masked_local_attention_1d_variables_and_return_kv():
  def build(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    kv = []
    y = mtf.layers.masked_local_attention_1d(
        x, KV, HEADS, False, window_size=2, length_per_split=4,
        return_kv=kv)
    assert y.shape == x.shape
    assert [t.shape for t in kv] == [mtf.Shape([BATCH, HEADS, LENGTH, KV])] * 2
    return {"y": y, "k": kv[0], "v": kv[1]}, None, {}

  got, graph = mtf_testing.run_program("all:2", "length:all", "eager", build)
  assert [v.name for v in graph.trainable_variables] == [
      "masked_local_attention_1d/qkvo"]
  wq, wk, wv, wo = got["masked_local_attention_1d/qkvo"]
  np.testing.assert_allclose(got["k"], np.einsum("bli,hik->bhlk", X, wk),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["v"], np.einsum("bli,hik->bhlk", X, wv),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      got["y"], _np_masked_local_1d(X, wq, wk, wv, wo, 2, 4), rtol=1e-5,
      atol=1e-5)


def test_masked_local_attention_1d_rejects_bad_length_per_split():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, IO])
  with pytest.raises(mtf.ShapeError, match="length_per_split"):
    mtf.layers.masked_local_attention_1d(x, KV, HEADS, length_per_split=3)


@pytest.mark.parametrize("mesh_shape,layout,mode", _ids([
    ("all:1", "", "eager"), ("all:2", "heads:all", "function"),
    ("rows:2;cols:2", "batch:rows;heads:cols", "eager")]))
def test_masked_local_attention_1d_incremental_matches_full(mesh_shape,
                                                            layout, mode):
  """Decoding step by step with a 4-position ring cache gives the full
  layer's outputs when its window and blocks are 4 positions, its length
  split in two."""
  window = mtf.Dimension("window", 4)

  def build_full(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    kv = []
    y = mtf.layers.masked_local_attention_1d(
        x, KV, HEADS, False, window_size=4, length_per_split=4,
        return_kv=kv, name="local")
    return {"y": y}, None, {}

  full, _ = mtf_testing.run_program("all:2", "length:all", "eager",
                                    build_full)

  def build_steps(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    # The full run's variable, so both use the same weights.
    qkvo = _import(mesh, full["local/qkvo"],
                   [mtf.Dimension("qkvo", 4), HEADS, IO, KV])
    params = mtf.unstack(qkvo, qkvo.shape.dims[0])
    k = mtf.zeros(mesh, [BATCH, HEADS, window, KV])
    v = mtf.zeros(mesh, [BATCH, HEADS, window, KV])
    outputs = {}
    for step in range(LENGTH.size):
      step_num = mtf.constant(mesh, step, mtf.Shape([]), dtype=tf.int32)
      y, k, v = mtf.layers.masked_local_attention_1d_incremental(
          mtf.gather(x, step, LENGTH), k, v, step_num, params=params)
      outputs[f"y{step}"] = y
    return outputs, None, {}

  got, graph = mtf_testing.run_program(mesh_shape, layout, mode, build_steps)
  assert not graph.trainable_variables
  for step in range(LENGTH.size):
    np.testing.assert_allclose(got[f"y{step}"], full["y"][:, step],
                               rtol=1e-5, atol=1e-5, err_msg=f"step {step}")


def test_masked_local_attention_1d_incremental_shares_variables():
  def build(mesh):
    x = _import(mesh, X[:, 0], [BATCH, IO])
    cache = mtf.zeros(mesh, [BATCH, HEADS, mtf.Dimension("window", 4), KV])
    y, k, v = mtf.layers.masked_local_attention_1d_incremental(
        x, cache, cache, 0)
    y2, _, _ = mtf.layers.masked_local_attention_1d_incremental(
        x, k, v, 1, name="masked_local_attention_1d")
    return {"y": y, "k": k, "y2": y2}, None, {}

  got, graph = mtf_testing.run_program("all:1", "", "eager", build)
  assert [v.name for v in graph.trainable_variables] == [
      "masked_local_attention_1d/qkvo"]
  wq, wk, wv, wo = got["masked_local_attention_1d/qkvo"]
  x = X[:, 0]
  k = np.einsum("bi,hik->bhk", x, wk)
  want_k = np.zeros([2, 2, 4, 2], np.float32)
  want_k[:, :, 0] = k
  np.testing.assert_allclose(got["k"], want_k, rtol=1e-5, atol=1e-6)
  # Step 0 attends to its own key and three zero keys.
  q = np.einsum("bi,hik->bhk", x, wq)
  v = np.einsum("bi,hik->bhk", x, wv)
  logits = np.concatenate([np.einsum("bhk,bhk->bh", q, k)[..., None],
                           np.zeros([2, 2, 3])], axis=-1)
  o = _np_softmax(logits)[..., :1] * v
  np.testing.assert_allclose(got["y"], np.einsum("bhk,hik->bi", o, wo),
                             rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ halo exchange


def _np_halo(t, mask_right, axis, blocks_axis=None):
  """Blocks of size t.shape[axis], numbered along blocks_axis (default
  axis - 1), each grown by its whole left (and, unless mask_right, right)
  neighbour; zeros past the ends."""
  if blocks_axis is None:
    blocks_axis = axis - 1
  blocks = t.shape[blocks_axis]
  pad = [(0, 0)] * t.ndim
  pad[blocks_axis] = (1, 0 if mask_right else 1)
  padded = np.pad(t, pad)
  # Padded block s + b is block b's neighbour at offset s - 1.
  shifts = [0, 1] if mask_right else [0, 1, 2]
  return np.concatenate(
      [np.take(padded, range(s, s + blocks), axis=blocks_axis)
       for s in shifts], axis=axis)


KB = _rand([2, 4, 2, 3], 20)  # [batch, blocks, block, c]
VB = _rand([2, 4, 2, 3], 21)


@pytest.mark.parametrize("mask_right", [True, False])
@pytest.mark.parametrize("mesh_shape,layout,mode", _ids([
    ("all:1", "", "eager"), ("all:4", "blocks:all", "function"),
    ("all:4", "blocks:all", "graph"), ("all:4", "blocks:all", "simd"),
    ("rows:2;cols:2", "batch:rows;blocks:cols", "eager")]))
def test_local_1d_halo_exchange(mesh_shape, layout, mode, mask_right):
  def build_fn(mesh, t):
    del mesh
    blocks, block = t["k"].shape.dims[1:3]
    k, v = mtf.layers.local_1d_halo_exchange(t["k"], t["v"], blocks, block,
                                             mask_right)
    return {"k": k, "v": v}

  def np_fn(k, v):
    return {"k": _np_halo(k, mask_right, 2), "v": _np_halo(v, mask_right, 2)}

  dims = ["batch", "blocks", "block", "c"]
  mtf_testing.check_op(build_fn, np_fn, {"k": (KB, dims), "v": (VB, dims)},
                       mesh_shape, layout, mode)


@pytest.mark.parametrize("mask_right", [True, False])
def test_local_1d_halo_exchange_one_block_pads(mask_right):
  def build_fn(mesh, t):
    del mesh
    block = t["k"].shape.dims[1]
    k, v = mtf.layers.local_1d_halo_exchange(t["k"], t["v"], None, block,
                                             mask_right)
    return {"k": k, "v": v}

  def np_fn(k, v):
    return {n: _np_halo(a[:, None], mask_right, 2)[:, 0]
            for n, a in [("k", k), ("v", v)]}

  dims = ["batch", "block", "c"]
  mtf_testing.check_op(build_fn, np_fn,
                       {"k": (KB[:, 0], dims), "v": (VB[:, 0], dims)},
                       "all:2", "batch:all", "eager")


K2 = _rand([2, 2, 2, 3, 1], 22)  # [h_blocks, w_blocks, h, w, c]
V2 = _rand([2, 2, 2, 3, 1], 23)


def _np_halo_2d(t, mask_right):
  """[..., h_blocks, w_blocks, h, w, c] grown in h, then in w."""
  n = t.ndim
  t = _np_halo(t, mask_right, n - 3, n - 5)
  return _np_halo(t, mask_right, n - 2, n - 4)


@pytest.mark.parametrize("mask_right", [True, False])
@pytest.mark.parametrize("mesh_shape,layout,mode", _ids([
    ("all:1", "", "eager"), ("all:2", "h_blocks:all", "function"),
    ("rows:2;cols:2", "h_blocks:rows;w_blocks:cols", "eager"),
    ("rows:2;cols:2", "h_blocks:rows;w_blocks:cols", "graph"),
    ("rows:2;cols:2", "h_blocks:rows;w_blocks:cols", "simd")]))
def test_local_2d_halo_exchange(mesh_shape, layout, mode, mask_right):
  def build_fn(mesh, t):
    del mesh
    hb, wb, h, w, _ = t["k"].shape.dims
    k, v = mtf.layers.local_2d_halo_exchange(t["k"], t["v"], hb, h, wb, w,
                                             mask_right)
    return {"k": k, "v": v}

  def np_fn(k, v):
    return {"k": _np_halo_2d(k, mask_right), "v": _np_halo_2d(v, mask_right)}

  dims = ["h_blocks", "w_blocks", "h", "w", "c"]
  mtf_testing.check_op(build_fn, np_fn, {"k": (K2, dims), "v": (V2, dims)},
                       mesh_shape, layout, mode)


def test_local_2d_halo_exchange_unsplit_width_pads():
  def build_fn(mesh, t):
    del mesh
    hb, h, w, _ = t["k"].shape.dims
    k, v = mtf.layers.local_2d_halo_exchange(t["k"], t["v"], hb, h, None, w,
                                             True)
    return {"k": k, "v": v}

  def np_fn(k, v):
    return {n: _np_halo_2d(a[:, None], True)[:, 0]
            for n, a in [("k", k), ("v", v)]}

  dims = ["h_blocks", "h", "w", "c"]
  mtf_testing.check_op(build_fn, np_fn, {"k": (K2[:, 0], dims),
                                         "v": (V2[:, 0], dims)},
                       "all:2", "h_blocks:all", "function")


# ------------------------------------------------- attention_bias_local_2d


def _np_bias_2d(h, w):
  """-1e9 where memory (rows [h, 2h), cols [w, 2w) = the query's block) is
  after the query in raster order."""
  bias = np.zeros([h, w, 2 * h, 2 * w], np.float32)
  for qh in range(h):
    for qw in range(w):
      for mh in range(h, 2 * h):
        for mw in range(w, 2 * w):
          if (mh - h, mw - w) > (qh, qw):
            bias[qh, qw, mh, mw] = -1e9
  return bias


@pytest.mark.parametrize("mesh_shape,layout,mode", _ids([
    ("all:1", "", "eager"), ("all:2", "memory_h:all", "function"),
    ("rows:2;cols:2", "h:rows;memory_w:cols", "eager")]))
def test_attention_bias_local_2d_block(mesh_shape, layout, mode):
  h, w = mtf.Dimension("h", 2), mtf.Dimension("w", 3)

  def build_fn(mesh, t):
    del t
    bias = mtf.layers.attention_bias_local_2d_block(
        mesh, h, w, mtf.Dimension("memory_h", 2), mtf.Dimension("memory_w", 9))
    assert bias.shape == mtf.Shape([h, w, mtf.Dimension("memory_h", 4),
                                    mtf.Dimension("memory_w", 6)])
    assert bias.dtype == tf.float32
    return {"bias": bias}

  mtf_testing.check_op(build_fn, lambda: {"bias": _np_bias_2d(2, 3)}, {},
                       mesh_shape, layout, mode, grad_wrt=[])


# ------------------------------------------- spatial-block self-attention


def _run_spatial(mesh_shape, layout, mode, value, dims, layer):
  cotangent = _rand(value.shape, 30)

  def build(mesh):
    x = _import(mesh, value, dims)
    y = layer(x)
    assert y.shape == x.shape
    loss = mtf.reduce_sum(y * _import(mesh, cotangent, dims))
    return {"y": y}, loss, {"x": x}

  got, graph = mtf_testing.run_program(mesh_shape, layout, mode, build)
  assert [v.name for v in graph.trainable_variables] == [
      "multihead_attention/qkvo"]
  return got, cotangent


def _check_spatial(got, cotangent, value, np_fn):
  weights = got["multihead_attention/qkvo"].astype(np.float64)

  def fn(x):
    return {"y": np_fn(x, *weights)}

  np.testing.assert_allclose(got["y"], fn(value)["y"], rtol=1e-5, atol=1e-5)
  grads = mtf_testing.numeric_gradients(fn, {"x": value}, {"y": cotangent},
                                        ["x"])
  np.testing.assert_allclose(got["d_x"], grads["x"], rtol=1e-4, atol=1e-4)


X1 = _rand([2, 4, 2, 4], 31)  # [batch, w_blocks, w, io]
D1 = [BATCH, mtf.Dimension("w_blocks", 4), mtf.Dimension("w", 2), IO]


def _np_spatial_1d(x, wq, wk, wv, wo, mask_right):
  q = np.einsum("bnwi,hik->bhnwk", x, wq)
  k = _np_halo(np.einsum("bnwi,hik->bhnwk", x, wk), mask_right, 3)
  v = _np_halo(np.einsum("bnwi,hik->bhnwk", x, wv), mask_right, 3)
  mask = None
  if mask_right:
    w = x.shape[2]
    causal = np.where(np.arange(w)[:, None] < np.arange(w)[None, :], -1e9, 0)
    mask = np.concatenate([np.zeros([w, w]), causal], axis=1)
  return np.einsum("bhnwk,hik->bnwi", _np_attend(q, k, v, mask), wo)


@pytest.mark.parametrize("mask_right", [True, False])
@pytest.mark.parametrize("mesh_shape,layout,mode", _ids([
    ("all:1", "", "eager"), ("all:4", "w_blocks:all", "function"),
    ("rows:2;cols:4", "batch:rows;w_blocks:cols", "eager"),
    ("rows:2;cols:2", "heads:rows;w_blocks:cols", "function")]))
def test_local_self_attention_spatial_blocks(mesh_shape, layout, mode,
                                             mask_right):
  got, cotangent = _run_spatial(
      mesh_shape, layout, mode, X1, D1,
      lambda x: mtf.layers.local_self_attention_spatial_blocks(
          x, KV, HEADS, False, mask_right=mask_right))
  _check_spatial(got, cotangent, X1, lambda x, *w: _np_spatial_1d(
      x, *w, mask_right=mask_right))


X2 = _rand([1, 2, 2, 2, 2, 4], 32)  # [batch, h_blocks, w_blocks, h, w, io]
D2 = [mtf.Dimension("batch", 1), mtf.Dimension("h_blocks", 2),
      mtf.Dimension("w_blocks", 2), mtf.Dimension("h", 2),
      mtf.Dimension("w", 2), IO]


def _np_spatial_2d(x, wq, wk, wv, wo, mask_right):
  q = np.einsum("bnmxyi,hik->bhnmxyk", x, wq)

  def memory(w):
    t = _np_halo_2d(np.einsum("bnmxyi,hik->bhnmxyk", x, w), mask_right)
    return t.reshape(t.shape[:4] + (-1, t.shape[-1]))

  h, w = x.shape[3:5]
  q = q.reshape(q.shape[:4] + (h * w, q.shape[-1]))
  mask = None
  if mask_right:
    mask = _np_bias_2d(h, w).reshape(h * w, 4 * h * w)
  o = _np_attend(q, memory(wk), memory(wv), mask)
  o = o.reshape(o.shape[:4] + (h, w, o.shape[-1]))
  return np.einsum("bhnmxyk,hik->bnmxyi", o, wo)


@pytest.mark.parametrize("mask_right", [True, False])
@pytest.mark.parametrize("mesh_shape,layout,mode", _ids([
    ("all:1", "", "eager"), ("all:2", "h_blocks:all", "function"),
    ("rows:2;cols:2", "h_blocks:rows;w_blocks:cols", "eager"),
    ("rows:2;cols:2", "heads:rows;w_blocks:cols", "function")]))
def test_local_2d_self_attention_spatial_blocks(mesh_shape, layout, mode,
                                                mask_right):
  got, cotangent = _run_spatial(
      mesh_shape, layout, mode, X2, D2,
      lambda x: mtf.layers.local_2d_self_attention_spatial_blocks(
          x, KV, HEADS, False, mask_right=mask_right))
  _check_spatial(got, cotangent, X2, lambda x, *w: _np_spatial_2d(
      x, *w, mask_right=mask_right))


def test_local_2d_causal_first_position_sees_only_itself():
  """With mask_right, the image's first position attends to itself and
  zero memory only: its output does not depend on any other input."""
  def build(mesh):
    x = _import(mesh, X2, D2)
    y = mtf.layers.local_2d_self_attention_spatial_blocks(
        x, KV, HEADS, mask_right=True)
    # The gradient of the output's first position.
    first = np.zeros(X2.shape, np.float32)
    first[:, 0, 0, 0, 0] = 1.0
    first = mtf.reduce_sum(y * _import(mesh, first, D2))
    return {}, first, {"x": x}

  got, _ = mtf_testing.run_program("rows:2;cols:2",
                                   "h_blocks:rows;w_blocks:cols", "eager",
                                   build)
  dx = np.array(got["d_x"])
  assert np.any(dx[0, 0, 0, 0, 0] != 0)
  dx[0, 0, 0, 0, 0] = 0
  np.testing.assert_array_equal(dx, 0)


def test_spatial_blocks_reject_wrong_rank():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, IO])
  with pytest.raises(mtf.ShapeError, match="num_w_blocks"):
    mtf.layers.local_self_attention_spatial_blocks(x, KV, HEADS)
  with pytest.raises(mtf.ShapeError, match="num_h_blocks"):
    mtf.layers.local_2d_self_attention_spatial_blocks(x, KV, HEADS)
