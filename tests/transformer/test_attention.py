"""Tests of mesh_tensorflow.transformer.attention against NumPy.

`attention` and `local_attention_1d` are checked with gradients under
layouts splitting heads, batch, memory length and (for local attention) the
length itself, where the halo exchange spans several blocks and
processors; T5's relative position buckets against a NumPy re-computation.
"""

import inspect
import math

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import fixup_layers
from mesh_tensorflow.transformer import transformer_layers
from tests import mtf_testing
from tests.transformer import layer_testing


def _rand(shape, seed):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


def _np_softmax(x, extra_logit=None):
  m = np.max(x, axis=-1, keepdims=True)
  if extra_logit is not None:
    m = np.maximum(m, extra_logit)
  e = np.exp(x - m)
  total = np.sum(e, axis=-1, keepdims=True)
  if extra_logit is not None:
    total = total + np.exp(extra_logit - m)
  return e / total


# ---------------------------------------------------------------- attention

ATTENTION_INPUTS = {
    "q": (_rand([2, 8, 4, 3], 1), ["batch", "heads", "length", "d_kv"]),
    "k": (_rand([2, 8, 4, 3], 2),
          ["batch", "heads", "memory_length", "d_kv"]),
    "v": (_rand([2, 8, 4, 5], 3),
          ["batch", "heads", "memory_length", "d_v"]),
    "bias": (_rand([4, 4], 4) * 3, ["length", "memory_length"]),
}


def _np_attention(q, k, v, bias, extra_logit=None):
  logits = np.einsum("bhlk,bhmk->bhlm", q, k) + bias
  return np.einsum("bhlm,bhmv->bhlv", _np_softmax(logits, extra_logit), v)


@pytest.mark.parametrize("extra_logit,float32_logits", [(None, True),
                                                        (0.5, False)])
@pytest.mark.parametrize("mesh_shape,layout,mode", [
    ("all:1", "", "function"),
    ("all:8", "heads:all", "graph"),
    ("rows:2;cols:4", "batch:rows;heads:cols", "function"),
    ("rows:2;cols:2", "memory_length:rows;heads:cols", "simd"),
])
def test_attention_matches_numpy(extra_logit, float32_logits, mesh_shape,
                                 layout, mode):
  def build(mesh, t):
    del mesh
    dims = {d.name: d for x in t.values() for d in x.shape.dims}
    return {"o": attention.attention(
        t["q"], t["k"], t["v"], dims["memory_length"], dims["d_kv"],
        dims["d_v"], bias=t["bias"], extra_logit=extra_logit,
        float32_logits=float32_logits)}

  mtf_testing.check_op(
      build,
      lambda q, k, v, bias: {"o": _np_attention(q, k, v, bias, extra_logit)},
      ATTENTION_INPUTS, mesh_shape, layout, mode)


def test_attention_names_a_missing_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  q = mtf.zeros(mesh, mtf.Shape([mtf.Dimension("length", 2),
                                 mtf.Dimension("d_kv", 3)]))
  k = mtf.zeros(mesh, mtf.Shape([mtf.Dimension("length", 2),
                                 mtf.Dimension("d_kv", 3)]))
  with pytest.raises(mtf.ShapeError, match="memory_length"):
    attention.attention(q, k, k, mtf.Dimension("memory_length", 2),
                        mtf.Dimension("d_kv", 3), mtf.Dimension("d_kv", 3))


def test_attention_dropout_is_layout_independent():
  """Dropout on the weights (mask shared over the length) gives the same
  answer under every layout."""
  def build(mesh):
    dims = {}
    t = {}
    for name, (array, names) in ATTENTION_INPUTS.items():
      shape = [mtf.Dimension(n, s) for n, s in zip(names, array.shape)]
      dims.update({d.name: d for d in shape})
      t[name] = mtf_testing.import_array(mesh, array, shape)
    o = attention.attention(
        t["q"], t["k"], t["v"], dims["memory_length"], dims["d_kv"],
        dims["d_v"], bias=t["bias"], dropout_rate=0.5,
        dropout_broadcast_dims=[dims["length"]])
    return {"o": o}, mtf.reduce_sum(o * o), {"q": t["q"]}
  values = layer_testing.assert_same_under_layouts(
      build, layouts=(("heads", "all:8", "heads:all"),
                      ("2d", "rows:2;cols:4", "batch:rows;heads:cols")))
  # Some weights were dropped: the answer differs from no dropout.
  want = _np_attention(*(ATTENTION_INPUTS[n][0]
                         for n in ("q", "k", "v", "bias")))
  assert not np.allclose(values["o"], want, atol=1e-3)


# ------------------------------------------------------- local_attention_1d

LOCAL_LENGTH = 16
LOCAL_IDS = np.ones([2, LOCAL_LENGTH], np.int32)
LOCAL_IDS[0, 6:] = 2
LOCAL_IDS[0, 13:] = 3


def _np_local(q, k, v, sequence_id, radius, fully_autoregressive):
  pos = np.arange(LOCAL_LENGTH)
  rel = pos[None, :] - pos[:, None]  # memory - query
  visible = (rel > -radius) & (rel <= (0 if fully_autoregressive else radius))
  visible = visible[None] & (sequence_id[:, :, None] ==
                             sequence_id[:, None, :])
  logits = np.einsum("blhk,bmhk->bhlm", q, k)
  logits = logits + np.where(visible, 0.0, -1e9)[:, None]
  return np.einsum("bhlm,bmhv->blhv", _np_softmax(logits), v)


LOCAL_INPUTS = {
    "q": (_rand([2, LOCAL_LENGTH, 2, 3], 5),
          ["batch", "length", "heads", "d_kv"]),
    "k": (_rand([2, LOCAL_LENGTH, 2, 3], 6),
          ["batch", "length", "heads", "d_kv"]),
    "v": (_rand([2, LOCAL_LENGTH, 2, 4], 7),
          ["batch", "length", "heads", "d_v"]),
}


@pytest.mark.parametrize("fully_autoregressive", [True, False])
@pytest.mark.parametrize("mesh_shape,layout,num_splits,mode", [
    ("all:1", "", 1, "function"),
    # Blocks of 2 positions, one per processor; the radius of 3 reaches
    # two processors away.
    ("all:8", "length:all", 8, "function"),
    ("rows:2;cols:4", "heads:rows;length:cols", 4, "graph"),
    ("all:4", "length:all", 4, "simd"),
])
def test_local_attention_1d_matches_numpy(fully_autoregressive, mesh_shape,
                                          layout, num_splits, mode):
  radius = 3

  def build(mesh, t):
    dims = {d.name: d for x in t.values() for d in x.shape.dims}
    sequence_id = mtf_testing.import_array(
        mesh, LOCAL_IDS, [dims["batch"], dims["length"]])
    return {"o": attention.local_attention_1d(
        t["q"], t["k"], t["v"], dims["length"], dims["d_kv"], dims["d_v"],
        fully_autoregressive=fully_autoregressive,
        length_dim_num_splits=num_splits, radius=radius,
        sequence_id=sequence_id)}

  mtf_testing.check_op(
      build,
      lambda q, k, v: {"o": _np_local(q, k, v, LOCAL_IDS, radius,
                                      fully_autoregressive)},
      LOCAL_INPUTS, mesh_shape, layout, mode)


def test_local_attention_1d_shared_kv_and_priorities():
  """v=None uses the keys as values; read/write priorities hide more."""
  radius = 5
  read = np.tile(np.arange(LOCAL_LENGTH) // 2, [2, 1]).astype(np.int32)
  write = np.tile(np.arange(LOCAL_LENGTH) % 5, [2, 1]).astype(np.int32)

  def build(mesh, t):
    dims = {d.name: d for x in t.values() for d in x.shape.dims}
    imp = lambda a: mtf_testing.import_array(  # pylint: disable=g-long-lambda
        mesh, a, [dims["batch"], dims["length"]])
    return {"o": attention.local_attention_1d(
        t["q"], t["k"], None, dims["length"], dims["d_kv"], dims["d_kv"],
        length_dim_num_splits=2, radius=radius, sequence_id=1,
        write_priority=imp(write), read_priority=imp(read))}

  def np_fn(q, k):
    pos = np.arange(LOCAL_LENGTH)
    rel = pos[None, :] - pos[:, None]
    visible = ((rel > -radius) & (rel <= 0))[None] & (
        read[:, :, None] >= write[:, None, :])
    logits = np.einsum("blhk,bmhk->bhlm", q, k)
    logits = logits + np.where(visible, 0.0, -1e9)[:, None]
    return {"o": np.einsum("bhlm,bmhk->blhk", _np_softmax(logits), k)}

  mtf_testing.check_op(build, np_fn,
                       {n: LOCAL_INPUTS[n] for n in ("q", "k")},
                       "all:2", "length:all", "function")


# ------------------------------------------------- relative position buckets

def _np_t5_bucket(relative_position, bidirectional, num_buckets,
                  max_distance):
  """T5's bucketing, computed independently in NumPy (float32 logs)."""
  out = np.zeros_like(relative_position)
  for i, rp in np.ndenumerate(relative_position):
    n = -int(rp)
    buckets = num_buckets
    ret = 0
    if bidirectional:
      buckets //= 2
      if n < 0:
        ret += buckets
      n = abs(n)
    else:
      n = max(n, 0)
    max_exact = buckets // 2
    if n < max_exact:
      ret += n
    else:
      scaled = (np.log(np.float32(n) / np.float32(max_exact)) /
                np.float32(math.log(max_distance / max_exact)) *
                np.float32(buckets - max_exact))
      ret += min(max_exact + int(np.float32(scaled)), buckets - 1)
    out[i] = ret
  return out


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", [
    (True, 32, 128), (False, 32, 128), (True, 8, 20)])
def test_relative_position_bucket_matches_t5(bidirectional, num_buckets,
                                             max_distance):
  # Distances where the log lands on a bucket boundary exactly are left
  # out: float32 logs of TF and NumPy may round them either way.
  rel = np.array([r for r in range(-300, 301)
                  if abs(r) not in (4, 8, 16, 20, 32, 64, 128)], np.int32)

  def build(mesh, t):
    del mesh
    return {"b": transformer_layers._relative_position_bucket(  # pylint: disable=protected-access
        t["rel"], bidirectional=bidirectional, num_buckets=num_buckets,
        max_distance=max_distance)}

  mtf_testing.check_op(
      build,
      lambda rel: {"b": _np_t5_bucket(rel, bidirectional, num_buckets,
                                      max_distance)},
      {"rel": (rel, ["pos"])}, "all:1", "", "function")
  buckets = _np_t5_bucket(rel, bidirectional, num_buckets, max_distance)
  assert buckets.min() == 0 and buckets.max() == num_buckets - 1


# ------------------------------------------- params and 2-D re-sharding

def test_attention_params_combine_dims_and_initial_scales():
  """q, k, v, o hold heads x d_kv as one "heads" dimension (combine_dims),
  or apart; q's initial scale has the 1/sqrt(d_kv) folded in."""
  shapes = {}

  def build(mesh):
    d_model = mtf.Dimension("d_model", 32)
    heads = mtf.Dimension("heads", 8)
    d_kv = mtf.Dimension("d_kv", 16)
    for combine in (True, False):
      with tf.compat.v1.variable_scope(f"combine_{combine}"):
        p = attention.AttentionParams(
            mesh, d_model, d_model, d_model, d_kv, d_kv, [heads], [heads],
            mtf.VariableDType(), combine_dims=combine)
      shapes[combine] = {n: getattr(p, "w" + n).shape for n in "qkvo"}
    return {}, None, {}

  values = layer_testing.run_under("all:1", "", "function", build)
  assert shapes[True]["q"] == mtf.Shape([mtf.Dimension("d_model", 32),
                                         mtf.Dimension("heads", 128)])
  assert shapes[True]["o"] == mtf.Shape([mtf.Dimension("heads", 128),
                                         mtf.Dimension("d_model", 32)])
  assert shapes[False]["k"].dimension_names == ["d_model", "heads", "d_kv"]
  stds = {n: values[f"combine_True/{n}"].std() for n in "qkvo"}
  np.testing.assert_allclose(stds["q"], (32 * 16) ** -0.5, rtol=0.1)
  np.testing.assert_allclose(stds["k"], 32 ** -0.5, rtol=0.1)
  np.testing.assert_allclose(stds["o"], (8 * 16) ** -0.5, rtol=0.1)


_SUBCLASSES = (attention.ExpertsAttentionParams,
               fixup_layers.AttentionParamsFixup)


@pytest.mark.parametrize("cls", _SUBCLASSES, ids=lambda c: c.__name__)
def test_attention_params_subclasses_write_none_of_its_parameters(cls):
  """AttentionParams' parameter list is written once: its subclasses'
  __init__ list only their own (their signatures are built from its)."""
  base = set(inspect.signature(attention.AttentionParams).parameters)
  written = inspect.signature(inspect.unwrap(cls.__init__)).parameters
  assert not base & set(written), sorted(base & set(written))


def test_attention_params_subclasses_bind_arguments_as_the_original():
  """Positional and keyword arguments land where the original's explicit
  parameter lists put them, and their checks name the class."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  d_model, heads, d_kv = (mtf.Dimension("d_model", 8),
                          mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 4))
  dims = (mesh, d_model, d_model, d_model, d_kv, d_kv, [heads], [heads],
          mtf.VariableDType())
  fixup = fixup_layers.AttentionParamsFixup(
      *dims, True, False, 3, "glorot", ensemble_dim=None, no_query=True)
  assert (fixup.shared_kv, fixup.fold_scaling_into_initializer,
          fixup.num_blocks, fixup.default_init, fixup.init_distribution,
          fixup.no_query) == (True, False, 3, "glorot", "uniform", True)
  assert not hasattr(fixup, "wq") and "kv_fixup" in fixup.wkv.name
  with pytest.raises(ValueError, match="AttentionParamsFixup: num_blocks"):
    fixup_layers.AttentionParamsFixup(*dims)
  with pytest.raises(ValueError, match="invalid expert_computation 'x'"):
    attention.ExpertsAttentionParams(
        *dims, True, False, True, None, False, True, None, None, "x")
  with pytest.raises(TypeError):
    attention.ExpertsAttentionParams(*dims, make_attention_vars=False)


class _LayoutModel:
  layout = "heads:cols;d_model:rows"
  mesh_shape = "rows:2;cols:4"


class _LayoutContext:
  model = _LayoutModel()


def test_maybe_reshape_for_2d_sharding_splits_over_the_unused_mesh_dim():
  """With heads on "cols" and nothing of q, k, v on "rows", batch is cut
  into [batch, d_model] so that "rows" splits the attention too, and the
  answer is unchanged."""
  batch = mtf.Dimension("batch", 4)
  heads = mtf.Dimension("heads", 8)
  length = mtf.Dimension("length", 4)
  memory_length = mtf.Dimension("memory_length", 4)
  d_kv = mtf.Dimension("d_kv", 3)
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  q = mtf.zeros(mesh, [batch, heads, length, d_kv])
  k = mtf.zeros(mesh, [batch, heads, memory_length, d_kv])
  context = _LayoutContext()
  q2, k2, _, bias2 = attention.maybe_reshape_attention_input_for_2d_sharding(
      context, q, k, k, None, [d_kv])
  assert q2.shape.dimension_names == ["batch", "d_model", "heads", "length",
                                      "d_kv"]
  assert q2.shape.get_dim_by_name("d_model").size == 4
  assert k2.shape.get_dim_by_name("batch").size == 1
  assert bias2 is None
  # Nothing to do without a layout.
  assert attention.maybe_reshape_attention_input_for_2d_sharding(
      None, q, k, k, None, [d_kv])[0] is q

  def build(mesh, t):
    del mesh
    dims = {d.name: d for x in t.values() for d in x.shape.dims}
    return {"o": attention.attention(
        t["q"], t["k"], t["v"], dims["memory_length"], dims["d_kv"],
        dims["d_v"], bias=t["bias"], context=context)}

  mtf_testing.check_op(
      build, lambda q, k, v, bias: {"o": _np_attention(q, k, v, bias)},
      ATTENTION_INPUTS, "rows:2;cols:4", context.model.layout, "function")


def test_2d_sharding_re_split_keeps_the_answer_with_length_before_heads():
  """q, k and v as SelfAttention makes them ([batch, length, heads, d_kv]),
  whose order differs from the logits': the re-split batch must be merged
  back after the outputs are put in q's order (a reshape alone scrambled
  length and heads when d_model was split)."""
  context = _LayoutContext()
  inputs = {
      "q": (ATTENTION_INPUTS["q"][0].transpose(0, 2, 1, 3),
            ["batch", "length", "heads", "d_kv"]),
      "k": (ATTENTION_INPUTS["k"][0].transpose(0, 2, 1, 3),
            ["batch", "memory_length", "heads", "d_kv"]),
      "v": (ATTENTION_INPUTS["v"][0].transpose(0, 2, 1, 3),
            ["batch", "memory_length", "heads", "d_v"]),
      "bias": ATTENTION_INPUTS["bias"],
  }

  def build(mesh, t):
    del mesh
    dims = {d.name: d for x in t.values() for d in x.shape.dims}
    return {"o": attention.attention(
        t["q"], t["k"], t["v"], dims["memory_length"], dims["d_kv"],
        dims["d_v"], bias=t["bias"], context=context)}

  def reference(q, k, v, bias):
    o = _np_attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                      v.transpose(0, 2, 1, 3), bias)
    return {"o": o.transpose(0, 2, 1, 3)}

  mtf_testing.check_op(build, reference, inputs, "rows:2;cols:4",
                       context.model.layout, "function")


def test_visibility_mask_to_attention_bias():
  def build(mesh, t):
    del mesh
    return {"b": attention.visibility_mask_to_attention_bias(
        mtf.greater(t["x"], 0.0), tf.float32)}
  x = np.array([[1.0, -1.0], [0.0, 2.0]], np.float32)
  mtf_testing.check_op(build, lambda x: {"b": np.where(x > 0, 0.0, -1e9)},
                       {"x": (x, ["a", "b"])}, "all:1", "", "function",
                       grad_wrt=[])


# ------------------------------------------------------ synthetic attention

@pytest.mark.parametrize("mode", ["random", "factorized", "dense_minus",
                                  "random_plus", "random_plus_alpha",
                                  "dense_plus", "dense_plus_alpha"])
def test_synthetic_attention_matches_numpy(mode):
  """Each synthesizer mode against NumPy, with its own variables (tables
  made for max_length=6 positions, sliced to 4)."""
  batch, heads, length, d_kv, d_model = 2, 8, 4, 3, 5
  x_np = _rand([batch, length, d_model], 1)
  q_np = _rand([batch, length, heads, d_kv], 2)
  k_np = _rand([batch, length, heads, d_kv], 3)
  v_np = _rand([batch, length, heads, d_kv], 4)

  def build(mesh):
    dims = {n: mtf.Dimension(n, s) for n, s in (
        ("batch", batch), ("heads", heads), ("length", length),
        ("memory_length", length), ("d_kv", d_kv), ("d_model", d_model))}
    imp = lambda a, names: mtf_testing.import_array(  # pylint: disable=g-long-lambda
        mesh, a, [dims[n] for n in names])
    no_query = mode in ("random", "factorized")
    q = (imp(x_np, ["batch", "length", "d_model"]) if no_query else
         imp(q_np, ["batch", "length", "heads", "d_kv"]))
    k = imp(k_np, ["batch", "memory_length", "heads", "d_kv"])
    v = imp(v_np, ["batch", "memory_length", "heads", "d_kv"])
    context = layer_testing.make_context(
        mesh, layer_testing.ModelStub(d_model), dims["batch"],
        dims["length"])
    o = attention.synthetic_attention(
        q, k, v, dims["memory_length"], dims["d_kv"], dims["d_kv"],
        synthesize_mode=mode, factorized_dim=2, max_length=6,
        context=context)
    return {"o": o}, None, {}

  got = layer_testing.run_under("all:1", "", "function", build)
  if mode == "random":
    logits = np.transpose(got["R"][:4, :, :4], [1, 0, 2])[None]
  elif mode == "factorized":
    r = np.einsum("thn,thm->nhm", got["R1"], got["R2"])
    logits = np.transpose(r[:4, :, :4], [1, 0, 2])[None]
  else:
    dot = np.einsum("blhk,bmhk->bhlm", q_np, k_np)
    if mode.startswith("random"):
      synthetic = np.transpose(got["R"][:4, :, :4], [1, 0, 2])[None]
    else:
      synthetic = np.einsum("blhk,km->bhlm", np.maximum(q_np, 0),
                            got["pi/kernel"])[..., :4]
    if mode == "dense_minus":
      logits = synthetic
    elif "alpha" in mode:
      alpha = 1 / (1 + np.exp(-got["alpha"][0]))
      logits = (1 - alpha) * dot + alpha * synthetic
    else:
      logits = dot + synthetic
  want = np.einsum("bhlm,bmhk->blhk", _np_softmax(logits), v_np)
  np.testing.assert_allclose(got["o"], want, rtol=1e-5, atol=1e-5)


def test_hybrid_attention_matches_numpy():
  """A 0.5 mix (doubly_coeff's initial value) of the softmax over memory
  positions and the doubly-normalised weights."""
  q_np, k_np, v_np, bias_np = (ATTENTION_INPUTS[n][0]
                               for n in ("q", "k", "v", "bias"))

  def build(mesh):
    t = {}
    dims = {}
    for name, (array, names) in ATTENTION_INPUTS.items():
      shape = [mtf.Dimension(n, s) for n, s in zip(names, array.shape)]
      dims.update({d.name: d for d in shape})
      t[name] = mtf_testing.import_array(mesh, array, shape)
    context = layer_testing.make_context(
        mesh, layer_testing.ModelStub(4), dims["batch"], dims["length"])
    o = attention.hybrid_attention(
        t["q"], t["k"], t["v"], context, dims["memory_length"],
        dims["d_kv"], dims["d_v"], bias=t["bias"])
    return {"o": o}, mtf.reduce_sum(o * o), {"q": t["q"]}

  got = layer_testing.assert_same_under_layouts(
      build, layouts=(("heads", "all:8", "heads:all"),))
  logits = np.einsum("bhlk,bhmk->bhlm", q_np, k_np) + bias_np
  upper = _np_softmax(logits)
  lower = np.log(_np_softmax(np.swapaxes(logits, -1, -2)))
  doubly = _np_softmax(np.swapaxes(lower, -1, -2))
  weights = 0.5 * doubly + 0.5 * upper
  want = np.einsum("bhlm,bhmv->bhlv", weights, v_np)
  np.testing.assert_allclose(got["o"], want, rtol=1e-5, atol=1e-5)
  assert got["doubly_coeff"] == 0.5
