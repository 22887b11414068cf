"""Tests of mesh_tensorflow.layers.attention_layers against NumPy.

Attention is checked on one processor and model-parallel (heads split over
`all:8`, or batch and heads split on a 2-D mesh), eagerly, and in
tf.function mode on the 2-D mesh. Multihead layers export their variables
so the NumPy references can reproduce the math; gradients are checked
against float64 central differences. Local (blocked) attention is tested
in test_local_attention_layers.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import attention_layers
from tests import mtf_testing

MODES = ("eager", "function")
BATCH = mtf.Dimension("batch", 2)
HEADS = mtf.Dimension("heads", 8)
LENGTH = mtf.Dimension("length", 4)
MEMORY_LENGTH = mtf.Dimension("memory_length", 4)
IO = mtf.Dimension("io", 4)
KV = mtf.Dimension("kv", 4)

HEADS_LAYOUTS = [("all:1", ""), ("all:8", "heads:all"),
                 ("rows:2;cols:4", "batch:rows;heads:cols")]


def _params(layouts, modes=MODES):
  # Every layout eagerly, the traced modes on the first 2-D layout (on
  # every layout when there is none): tracing is the same Python code
  # whatever the split.
  return mtf_testing.mesh_layout_mode_params(layouts, modes)


def _rand(shape, seed, low=-1.0, high=1.0):
  return np.random.RandomState(seed).uniform(
      low, high, size=shape).astype(np.float32)


def _np_softmax(x, axis=-1):
  x = x - np.max(x, axis=axis, keepdims=True)
  e = np.exp(x)
  return e / np.sum(e, axis=axis, keepdims=True)


def _np_causal_mask(n):
  return np.where(np.arange(n)[:, None] < np.arange(n)[None, :], -1e9,
                  0.0).astype(np.float32)


# ------------------------------------------------------------------ masks


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    [("all:1", ""), ("rows:2;cols:4", "batch:rows;memory_length:cols")]))
def test_masks(mesh_shape, layout, mode):
  ids = np.array([[3, 5, 0, 0], [1, 0, 2, 0]], np.int32)
  segments = np.array([[1, 1, 2, 2], [1, 2, 2, 2]], np.int32)

  def build_fn(mesh, t):
    pos = mtf.range(mesh, LENGTH, tf.int32)
    return {
        "padding": attention_layers.attention_mask_ignore_padding(t["ids"]),
        "causal": attention_layers.attention_mask_autoregressive(pos),
        "segment": attention_layers.attention_mask_same_segment(
            t["segments"]),
        "cross_segment": attention_layers.attention_mask_same_segment(
            t["segments"], t["segments"] * 2),
    }

  def np_fn(ids, segments):
    return {
        "padding": np.where(ids == 0, -1e9, 0.0).astype(np.float32),
        "causal": _np_causal_mask(4),
        "segment": np.where(segments[:, :, None] != segments[:, None, :],
                            -1e9, 0.0).astype(np.float32),
        "cross_segment": np.where(
            segments[:, :, None] != 2 * segments[:, None, :], -1e9,
            0.0).astype(np.float32),
    }

  mtf_testing.check_op(
      build_fn, np_fn,
      {"ids": (ids, ["batch", "length"]),
       "segments": (segments, ["batch", "length"])},
      mesh_shape, layout, mode, grad_wrt=[])


def test_mask_dimensions():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  pos = mtf.range(mesh, LENGTH, tf.int32)
  mask = attention_layers.attention_mask_autoregressive(pos)
  assert mask.shape == mtf.Shape([LENGTH, MEMORY_LENGTH])
  assert mask.dtype == tf.float32
  mask = attention_layers.attention_mask_autoregressive(pos, tf.bfloat16)
  assert mask.dtype == tf.bfloat16


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    [("all:1", ""), ("all:4", "block_length:all")]))
def test_attention_bias_local_block(mesh_shape, layout, mode):
  block = mtf.Dimension("block_length", 4)
  memory = mtf.Dimension("memory_length", 99)

  def build_fn(mesh, t):
    del t
    bias = attention_layers.attention_bias_local_block(mesh, block, memory)
    assert bias.shape == mtf.Shape([block, mtf.Dimension("memory_length", 8)])
    return {"bias": bias}

  want = np.concatenate([np.zeros([4, 4], np.float32), _np_causal_mask(4)],
                        axis=1)
  mtf_testing.check_op(build_fn, lambda: {"bias": want}, {}, mesh_shape,
                       layout, mode, grad_wrt=[])


# --------------------------------------------------- dot_product_attention

Q = _rand([2, 8, 4, 4], 0)
K = _rand([2, 8, 4, 4], 1)
V = _rand([2, 8, 4, 4], 2)


def _np_dot_product_attention(q, k, v, mask=None, extra_logit=None):
  logits = np.einsum("bhqd,bhmd->bhqm", q, k)
  if mask is not None:
    logits = logits + mask
  if extra_logit is None:
    weights = _np_softmax(logits)
  else:
    m = np.maximum(np.max(logits, axis=-1, keepdims=True), extra_logit)
    e = np.exp(logits - m)
    weights = e / (np.sum(e, axis=-1, keepdims=True) + np.exp(extra_logit - m))
  return np.einsum("bhqm,bhmd->bhqd", weights, v)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(HEADS_LAYOUTS))
@pytest.mark.parametrize("masked,extra_logit", [(True, None), (False, 0.5)])
def test_dot_product_attention(mesh_shape, layout, mode, masked,
                               extra_logit):
  def build_fn(mesh, t):
    mask = None
    if masked:
      mask = attention_layers.attention_mask_autoregressive(
          mtf.range(mesh, LENGTH, tf.int32))
    # Dropout is off when not training, whatever the rate.
    return {"y": attention_layers.dot_product_attention(
        t["q"], t["k"], t["v"], mask, dropout=0.5, extra_logit=extra_logit)}

  def np_fn(q, k, v):
    mask = _np_causal_mask(4) if masked else None
    return {"y": _np_dot_product_attention(q, k, v, mask, extra_logit)}

  mtf_testing.check_op(
      build_fn, np_fn,
      {"q": (Q, ["batch", "heads", "length", "kv"]),
       "k": (K, ["batch", "heads", "memory_length", "kv"]),
       "v": (V, ["batch", "heads", "memory_length", "kv"])},
      mesh_shape, layout, mode)


def test_dot_product_attention_dropout_when_training():
  def build_fn(mesh, t):
    del mesh
    return {"y": attention_layers.dot_product_attention(
        t["q"], t["k"], t["v"], None, dropout=0.5, is_training=True,
        dropout_broadcast_dims=[BATCH])}

  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  dims = [BATCH, HEADS, LENGTH, KV]
  mdims = [BATCH, HEADS, MEMORY_LENGTH, KV]
  # The same queries and keys in both batch rows: only dropout could make
  # the rows differ, and its mask is shared over the batch.
  t = {"q": mtf.import_tf_tensor(mesh, tf.constant(Q[[0, 0]]),
                                 mtf.Shape(dims)),
       "k": mtf.import_tf_tensor(mesh, tf.constant(K[[0, 0]]),
                                 mtf.Shape(mdims)),
       "v": mtf.import_tf_tensor(mesh, tf.constant(np.ones_like(V)),
                                 mtf.Shape(mdims))}
  y = build_fn(mesh, t)["y"]
  lowering = mtf.Lowering(graph, {mesh: impl})
  got = lowering.export_to_tf_tensor(y).numpy()
  # With v all ones, each output is (kept weights) / keep_prob: some
  # differ from 1.
  assert not np.allclose(got, 1.0)
  np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-5)


def test_dot_product_attention_rejects_mismatched_depth():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  q = mtf.zeros(mesh, [LENGTH, KV])
  k = mtf.zeros(mesh, [MEMORY_LENGTH, IO])
  with pytest.raises(mtf.ShapeError, match="depth"):
    attention_layers.dot_product_attention(q, k, k, None)


# ----------------------------------------------------- multihead_attention

X = _rand([2, 4, 4], 3)
MEMORY = _rand([2, 4, 4], 4)
QKVO = mtf.Dimension("qkvo", 4)


def _run(mesh_shape, layout, mode, build):
  return mtf_testing.run_program(mesh_shape, layout, mode, build)


_import = mtf_testing.import_array


def _np_multihead(x, memory, wq, wk, wv, wo, mask):
  """Weights [heads, io, kv], as the original lays them out."""
  q = np.einsum("bli,hik->bhlk", x, wq)
  k = np.einsum("bmi,hik->bhmk", memory, wk)
  v = np.einsum("bmi,hik->bhmk", memory, wv)
  o = _np_dot_product_attention(q, k, v, mask)
  return np.einsum("bhlk,hik->bli", o, wo)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(HEADS_LAYOUTS))
@pytest.mark.parametrize("self_attention", [True, False])
def test_multihead_attention(mesh_shape, layout, mode, self_attention):
  cotangent = _rand([2, 4, 4], 5)

  def build(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    wrt = {"x": x}
    if self_attention:
      memory = None
      mask = attention_layers.attention_mask_autoregressive(
          mtf.range(mesh, LENGTH, tf.int32))
    else:
      memory = _import(mesh, MEMORY, [BATCH, MEMORY_LENGTH, IO])
      wrt["memory"] = memory
      mask = None
    y = attention_layers.multihead_attention(x, memory, mask, KV, HEADS)
    assert y.shape == x.shape
    wrt["qkvo"] = mesh.graph.name_to_variable[
        "multihead_attention/qkvo"].outputs[0]
    loss = mtf.reduce_sum(y * _import(mesh, cotangent, y.shape.dims))
    return {"y": y}, loss, wrt

  got, graph = _run(mesh_shape, layout, mode, build)
  # One variable holding the four weights, as in the original.
  assert [v.name for v in graph.trainable_variables] == [
      "multihead_attention/qkvo"]
  assert graph.name_to_variable["multihead_attention/qkvo"].shape == (
      mtf.Shape([QKVO, HEADS, IO, KV]))
  mask = _np_causal_mask(4) if self_attention else None

  def np_fn(x, memory, qkvo):
    if self_attention:
      memory = x
    return {"y": _np_multihead(x, memory, *qkvo, mask)}

  inputs = {"x": X, "memory": MEMORY,
            "qkvo": got["multihead_attention/qkvo"].astype(np.float64)}
  want = np_fn(**inputs)
  np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
  wrt = ["x", "qkvo"] if self_attention else ["x", "memory", "qkvo"]
  grads = mtf_testing.numeric_gradients(np_fn, inputs, {"y": cotangent}, wrt)
  for name in wrt:
    np.testing.assert_allclose(got["d_" + name], grads[name], rtol=1e-4,
                               atol=1e-4, err_msg=name)


def test_multihead_attention_dropout_only_when_training():
  def build(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    kwargs = dict(dropout=0.5, name="att")
    return {"eval": attention_layers.multihead_attention(
                x, None, None, KV, HEADS, False, **kwargs),
            "eval2": attention_layers.multihead_attention(
                x, None, None, KV, HEADS, **kwargs),
            "train": attention_layers.multihead_attention(
                x, None, None, KV, HEADS, True, **kwargs)}, None, {}

  got, graph = _run("all:1", "", "eager", build)
  assert len(graph.trainable_variables) == 1
  np.testing.assert_array_equal(got["eval"], got["eval2"])
  assert not np.allclose(got["eval"], got["train"])


def test_multihead_attention_variables_are_deterministic():
  """The same names give the same initial values on any layout."""
  def build(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    attention_layers.multihead_attention(x, None, None, KV, HEADS, name=None)
    attention_layers.multihead_attention(x, None, None, KV, HEADS, name=None)
    return {}, None, {}

  one, graph = _run("all:1", "", "eager", build)
  split, _ = _run("all:8", "heads:all", "eager", build)
  assert [v.name for v in graph.trainable_variables] == [
      "multihead_attention/qkvo", "multihead_attention_1/qkvo"]
  for name, value in one.items():
    np.testing.assert_array_equal(value, split[name], err_msg=name)
  # Each variable has its own seed, from its scoped name.
  assert not np.array_equal(one["multihead_attention/qkvo"],
                            one["multihead_attention_1/qkvo"])
  # Standard deviations: io^-0.5 kv^-0.25 (q, k), io^-0.5 (v) and
  # (io heads)^-0.5 (o), as in the original.
  stds = np.std(one["multihead_attention/qkvo"].reshape(4, -1), axis=1)
  want = [4 ** -0.5 * 4 ** -0.25] * 2 + [4 ** -0.5, (4 * 8) ** -0.5]
  np.testing.assert_allclose(stds, want, rtol=0.3)


def test_multihead_attention_params_separate_and_combined():
  def build(mesh):
    with tf.compat.v1.variable_scope("sep"):
      sep = attention_layers.multihead_attention_params(
          mesh, HEADS, IO, KV, mtf.VariableDType())
    with tf.compat.v1.variable_scope("att"):
      q, k, v, o = attention_layers.multihead_attention_params(
          mesh, HEADS, IO, KV, mtf.VariableDType(), combine=True)
    with tf.compat.v1.variable_scope("old"):
      old = attention_layers.multihead_attention_vars(
          mesh, HEADS, IO, KV, tf.float32, tf.float32, tf.bfloat16)
    assert [t.shape for t in sep] == [mtf.Shape([HEADS, IO, KV])] * 4
    assert [t.dtype for t in old] == [tf.bfloat16] * 4
    return {"q": q, "k": k, "v": v, "o": o}, None, {}

  got, graph = _run("all:8", "heads:all", "eager", build)
  assert [v.name for v in graph.trainable_variables] == [
      "sep/q", "sep/k", "sep/v", "sep/o", "att/qkvo", "old/qkvo"]
  combined = got["att/qkvo"]
  assert combined.shape == (4, 8, 4, 4)
  for i, n in enumerate("qkvo"):
    np.testing.assert_array_equal(got[n], combined[i])


def test_multihead_attention_rejects_mismatched_memory():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, IO])
  memory = mtf.zeros(mesh, [BATCH, MEMORY_LENGTH, KV])
  with pytest.raises(mtf.ShapeError, match="channels"):
    attention_layers.multihead_attention(x, memory, None, KV, HEADS)
  memory = mtf.zeros(mesh, [MEMORY_LENGTH, IO])
  with pytest.raises(mtf.ShapeError, match="batch"):
    attention_layers.multihead_attention(x, memory, None, KV, HEADS)


# ------------------------------------- multihead_self_attention_incremental


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(HEADS_LAYOUTS))
def test_multihead_self_attention_incremental(mesh_shape, layout, mode):
  step = 2
  prev_k = _rand([2, 8, 4, 4], 6)
  prev_v = _rand([2, 8, 4, 4], 7)
  # The cache holds zeros from the decoded step on.
  prev_k[:, :, step:] = 0.0
  prev_v[:, :, step:] = 0.0
  x = X[:, step]

  def build(mesh):
    y, k, v = attention_layers.multihead_self_attention_incremental(
        _import(mesh, x, [BATCH, IO]),
        _import(mesh, prev_k, [BATCH, HEADS, MEMORY_LENGTH, KV]),
        _import(mesh, prev_v, [BATCH, HEADS, MEMORY_LENGTH, KV]),
        mtf.constant(mesh, step, mtf.Shape([]), dtype=tf.int32))
    assert y.shape == mtf.Shape([BATCH, IO])
    return {"y": y, "k": k, "v": v}, None, {}

  got, _ = _run(mesh_shape, layout, mode, build)
  wq, wk, wv, wo = got["multihead_attention/qkvo"]
  q = np.einsum("bi,hik->bhk", x, wq)
  k = prev_k.copy()
  v = prev_v.copy()
  k[:, :, step] = np.einsum("bi,hik->bhk", x, wk)
  v[:, :, step] = np.einsum("bi,hik->bhk", x, wv)
  mask = np.where(np.arange(4) > step, -1e9, 0.0)
  weights = _np_softmax(np.einsum("bhk,bhmk->bhm", q, k) + mask)
  y = np.einsum("bhk,hik->bi",
                np.einsum("bhm,bhmk->bhk", weights, v), wo)
  np.testing.assert_allclose(got["k"], k, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["v"], v, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-5)


def test_incremental_matches_full_self_attention():
  """Decoding step by step reproduces causal self-attention."""
  def build_full(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    mask = attention_layers.attention_mask_autoregressive(
        mtf.range(mesh, LENGTH, tf.int32))
    return {"y": attention_layers.multihead_attention(
        x, None, mask, KV, HEADS)}, None, {}

  full, _ = _run("all:1", "", "eager", build_full)

  def build_steps(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    k = mtf.zeros(mesh, [BATCH, HEADS, MEMORY_LENGTH, KV])
    v = mtf.zeros(mesh, [BATCH, HEADS, MEMORY_LENGTH, KV])
    outputs = {}
    for step in range(LENGTH.size):
      # The same name reuses the variable of the first step.
      y, k, v = attention_layers.multihead_self_attention_incremental(
          mtf.gather(x, step, LENGTH), k, v, step)
      outputs[f"y{step}"] = y
    return outputs, None, {}

  got, graph = _run("all:8", "heads:all", "function", build_steps)
  assert len(graph.trainable_variables) == 1
  for step in range(LENGTH.size):
    np.testing.assert_allclose(got[f"y{step}"], full["y"][:, step],
                               rtol=1e-5, atol=1e-5, err_msg=f"step {step}")


# ---------------------------------- multihead_encdec_attention_incremental


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    HEADS_LAYOUTS + [("all:2", "memory_length:all")]))
def test_encdec_incremental_matches_full_attention(mesh_shape, layout, mode):
  """Each decoding step's attention over a precomputed memory equals the
  full layer's output at that position."""
  padding = np.array([[1, 2, 3, 0], [4, 5, 0, 0]], np.int32)

  def build_full(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    memory = _import(mesh, MEMORY, [BATCH, MEMORY_LENGTH, IO])
    mask = attention_layers.attention_mask_ignore_padding(
        _import(mesh, padding, [BATCH, LENGTH]))
    return {"y": attention_layers.multihead_attention(
        x, memory, mask, KV, HEADS, name="encdec")}, None, {}

  full, _ = _run("all:1", "", "eager", build_full)

  def build_steps(mesh):
    x = _import(mesh, X, [BATCH, LENGTH, IO])
    memory = _import(mesh, MEMORY, [BATCH, MEMORY_LENGTH, IO])
    mask = attention_layers.attention_mask_ignore_padding(
        _import(mesh, padding, [BATCH, LENGTH]))
    wq, wk, wv, wo = mtf.unstack(
        _import(mesh, full["encdec/qkvo"], [QKVO, HEADS, IO, KV]), QKVO)
    kv_shape = mtf.Shape([BATCH, HEADS, MEMORY_LENGTH, KV])
    k = mtf.einsum([memory, wk], kv_shape)
    v = mtf.einsum([memory, wv], kv_shape)
    return {f"y{step}": attention_layers.multihead_encdec_attention_incremental(
        mtf.gather(x, step, LENGTH), wq, wo, k, v, mask)
            for step in range(LENGTH.size)}, None, {}

  got, graph = _run(mesh_shape, layout, mode, build_steps)
  assert not graph.trainable_variables
  for step in range(LENGTH.size):
    np.testing.assert_allclose(got[f"y{step}"], full["y"][:, step],
                               rtol=1e-5, atol=1e-5, err_msg=f"step {step}")


# --------------------------------------------- memory-compressed attention


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    [("all:1", ""), ("all:2", "length:all"),
     ("rows:2;cols:2", "batch:rows;memory_length:cols")],
    modes=("eager", "function", "graph")))
def test_compress_mean(mesh_shape, layout, mode):
  def build_fn(mesh, t):
    del mesh
    return {"y": attention_layers.compress_mean(t["x"], t["x"].shape[1], 2)}

  def np_fn(x):
    return {"y": x.reshape(2, 4, 2, 4).mean(axis=2)}

  mtf_testing.check_op(build_fn, np_fn,
                       {"x": (_rand([2, 8, 4], 10), ["batch", "length", "io"])},
                       mesh_shape, layout, mode)


def test_compress_mean_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, IO])
  with pytest.raises(mtf.ShapeError, match="divisor"):
    attention_layers.compress_mean(x, LENGTH, 3)
  with pytest.raises(mtf.ShapeError, match="not a dimension"):
    attention_layers.compress_mean(x, KV, 2)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    [("all:1", ""), ("all:8", "heads:all"), ("all:2", "length:all"),
     ("rows:2;cols:4", "batch:rows;heads:cols")]))
@pytest.mark.parametrize("mask_right", [True, False])
def test_multihead_self_attention_memory_compressed(mesh_shape, layout, mode,
                                                    mask_right):
  long_length = mtf.Dimension("length", 8)
  x_value = _rand([2, 8, 4], 11)
  cotangent = _rand([2, 8, 4], 12)

  def build(mesh):
    x = _import(mesh, x_value, [BATCH, long_length, IO])
    y = attention_layers.multihead_self_attention_memory_compressed(
        x, mask_right, 2, KV, HEADS, dropout=0.5)  # Not training.
    assert y.shape == x.shape
    loss = mtf.reduce_sum(y * _import(mesh, cotangent, y.shape.dims))
    return {"y": y}, loss, {"x": x}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert [v.name for v in graph.trainable_variables] == [
      "multihead_attention/qkvo"]
  wq, wk, wv, wo = got["multihead_attention/qkvo"].astype(np.float64)
  # Group m ends at position 2 m + 1; an extra zero logit lets the first
  # position attend to nothing.
  mask = None
  if mask_right:
    mask = np.where(2 * np.arange(4)[None, :] + 1 > np.arange(8)[:, None],
                    -1e9, 0.0)

  def np_fn(x):
    memory = x.reshape(2, 4, 2, 4).mean(axis=2)
    q = np.einsum("bli,hik->bhlk", x, wq)
    k = np.einsum("bmi,hik->bhmk", memory, wk)
    v = np.einsum("bmi,hik->bhmk", memory, wv)
    o = _np_dot_product_attention(q, k, v, mask, extra_logit=0.0)
    return {"y": np.einsum("bhlk,hik->bli", o, wo)}

  np.testing.assert_allclose(got["y"], np_fn(x_value)["y"], rtol=1e-5,
                             atol=1e-5)
  grads = mtf_testing.numeric_gradients(np_fn, {"x": x_value},
                                        {"y": cotangent}, ["x"])
  np.testing.assert_allclose(got["d_x"], grads["x"], rtol=1e-4, atol=1e-4)
