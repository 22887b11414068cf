"""Local attention with the `length` dimension split over the mesh.

Issue 48 item 5: `attention.local_attention_1d` (and the Transformer's
LocalSelfAttention on it) and `mtf.layers.masked_local_attention_1d` give
the one-processor outputs and gradients when a layout splits "length" in
any way: evenly, unevenly (12 over 8, 7 over 4), with parts shorter than
the radius, and whatever length hint (length_dim_num_splits /
length_per_split) the caller passes. Every case runs in one program per
layout; "all8" runs eagerly, "b2m4" in graph mode.

Incremental decoding (sample_autoregressive of a language model with
local self-attention, Bitransformer.decode) with "length" and the
caches' "memory_length" split gives the one-processor tokens.
"""

import functools

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
from tests.transformer import layer_testing
from tests.transformer import model_testing as mt


def _u(shape, seed):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


def _rules(pairs):
  return mtf.LayoutRules(pairs, allow_uneven=True)


LAYOUTS = {
    "all8": ("all:8", _rules([("length", "all")])),
    "b2m4": ("b:2;m:4", _rules([("batch", "b"), ("length", "m")])),
}
PARAMS = [("all8", "eager"), ("b2m4", "graph")]

# (length, radius, length_dim_num_splits, fully_autoregressive)
LOCAL_CASES = [
    (12, 5, 1, True),     # 12 over 8 or 4 (uneven), radius above a part,
                          # the hint says unsplit: one block of 12
    (12, 2, 8, False),    # a hint that does not divide the length
    (7, 2, 4, True),      # 7 over 4 or 8: padded parts
]
# (length, window_size, length_per_split)
MASKED_CASES = [(7, 2, None)]


def _build(mesh, local_cases=tuple(LOCAL_CASES),
           masked_cases=tuple(MASKED_CASES)):
  batch = mtf.Dimension("batch", 2)
  heads = mtf.Dimension("heads", 2)
  d_kv = mtf.Dimension("d_kv", 3)
  outputs, wrt = {}, {}
  loss = None
  for i, (n, radius, splits, fully) in enumerate(local_cases):
    length = mtf.Dimension("length", n)
    dims = [batch, length, heads, d_kv]
    q, k, v = (layer_testing.mtf_testing.import_array(
        mesh, _u([2, n, 2, 3], 10 * i + j), dims) for j in range(3))
    ids = np.ones([2, n], np.int32)
    ids[0, n // 2:] = 2
    o = attention.local_attention_1d(
        q, k, v, length, d_kv, d_kv, fully_autoregressive=fully,
        length_dim_num_splits=splits, radius=radius,
        sequence_id=layer_testing.mtf_testing.import_array(
            mesh, ids, [batch, length]))
    outputs[f"local{i}"] = o
    wrt.update({f"q{i}": q, f"k{i}": k, f"v{i}": v})
    term = mtf.reduce_sum(o * o)
    loss = term if loss is None else loss + term
  io = mtf.Dimension("io", 4)
  weights = [layer_testing.mtf_testing.import_array(
      mesh, _u([2, 4, 3], 100 + j), [heads, io, d_kv]) for j in range(4)]
  for i, (n, window, per_split) in enumerate(masked_cases):
    length = mtf.Dimension("length", n)
    x = layer_testing.mtf_testing.import_array(
        mesh, _u([2, n, 4], 200 + i), [batch, length, io])
    y = mtf.layers.masked_local_attention_1d(
        x, d_kv, heads, window_size=window, length_per_split=per_split,
        params=weights)
    outputs[f"masked{i}"] = y
    wrt[f"x{i}"] = x
    loss += mtf.reduce_sum(y * y)
  return outputs, loss, wrt


@functools.lru_cache(maxsize=None)
def _one_processor(traced):
  return layer_testing.run_under("all:1", "", "eager", _builder(traced))


def _builder(traced):
  """All cases; the traced mode (slow to optimize) runs the first local
  case and the masked one."""
  if traced:
    return functools.partial(_build, local_cases=tuple(LOCAL_CASES[:1]))
  return _build


@pytest.mark.parametrize("layout_id,mode", PARAMS)
def test_local_attention_with_length_split(layout_id, mode):
  """Outputs and gradients equal one processor's (the hints of 8 parts
  for a length of 12 raised IndivisibleError before)."""
  mesh_shape, layout = LAYOUTS[layout_id]
  traced = mode != "eager"
  got = layer_testing.run_under(mesh_shape, layout, mode, _builder(traced))
  want = _one_processor(traced)
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5,
                               err_msg=f"{key} under {layout_id} in {mode}")



def test_uneven_local_attention_moves_only_halos():
  """100 positions over 8 (13 a part, the last 9): each processor
  receives the 16 positions before its part of the keys, values,
  positions and sequence ids, and nothing is gathered (cutting the
  uneven length into blocks of 10 gathered it before)."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "all:8", _rules([("length", "all")]))
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  q = layer_testing.mtf_testing.import_array(
      mesh, _u([100, 2, 8], 0), [mtf.Dimension("length", 100),
                                 mtf.Dimension("heads", 2),
                                 mtf.Dimension("d_kv", 8)])
  length, _, d_kv = q.shape.dims
  o = attention.local_attention_1d(q, q, q, length, d_kv, d_kv, radius=16,
                                   length_dim_num_splits=8)
  lowering = mtf.Lowering(mesh.graph, {mesh: impl})
  assert lowering.export_to_tf_tensor(o).shape == (100, 2, 8)
  comm = {k: v for k, v in lowering.counters if k.startswith("comm/")}
  # 8 processors x 16 rows x (2 x 64 bytes of k and v + 2 x 4 of ints).
  assert comm == {"comm/receive/all/calls": 8,
                  "comm/receive/all/bytes": 8 * 16 * (2 * 64 + 2 * 4),
                  "comm/receive/all/wire_bytes": 14824}

# ------------------------------------------------ incremental decoding

DECODE_LAYOUTS = {
    # The length, 8 over 3 (the last part holds 2), and the keys/values
    # caches along memory_length over 2. The Transformer's local attention
    # reads the layout from the model: its hint of 3 parts raised
    # IndivisibleError before.
    "b2m3": ("b:2;m:3", _rules([("memory_length", "b"), ("length", "m")])),
}


def _decode_builder(mesh_shape, layout):
  """build(mesh): greedy decodes of a language model (local
  self-attention, a prefix of 3 tokens) and of an encoder-decoder (self-
  and encoder-decoder attention), made of the real layers, with the
  models knowing the layout."""

  def unitransformer(layers, name, autoregressive=True, vocab=mt.V):
    return transformer.Unitransformer(
        transformer.LayerStack(layers), d_model=mt.D, input_vocab_size=mt.V,
        output_vocab_size=vocab, autoregressive=autoregressive,
        max_length=mt.L, vocab_divisor=mt.VOCAB_DIVISOR, name=name,
        layout=layout, mesh_shape=mesh_shape)

  def attention_layer(cls, **kwargs):
    return cls(num_heads=2, key_value_size=4, **kwargs)

  lm = unitransformer([
      attention_layer(transformer_layers.LocalSelfAttention, radius=3,
                      full_attention_max_length=0)], "decoder")
  bi = transformer.Bitransformer(
      unitransformer([attention_layer(transformer_layers.SelfAttention)],
                     "encoder", autoregressive=False, vocab=None),
      unitransformer([attention_layer(transformer_layers.SelfAttention),
                      attention_layer(transformer_layers.EncDecAttention)],
                     "decoder"))

  def build(mesh):
    prefix = mt.import_ids(
        mesh, np.where(np.arange(mt.L) < 3, mt.TARGETS, 0))
    return {"lm": lm.sample_autoregressive(prefix, stop_at_token=None,
                                           temperature=0.0),
            "bi": bi.decode(mt.import_ids(mesh, mt.INPUTS),
                            temperature=0.0)}, None, {}
  return build


@functools.lru_cache(maxsize=None)
def _one_processor_decodes():
  return layer_testing.run_under("all:1", "", "eager",
                                 _decode_builder("all:1", ""))


@pytest.mark.parametrize("layout_id", sorted(DECODE_LAYOUTS))
def test_decoding_with_length_split(layout_id):
  """Greedy decodes with the length (and the caches' memory length)
  split equal one processor's, token for token."""
  mesh_shape, layout = DECODE_LAYOUTS[layout_id]
  got = layer_testing.run_under(mesh_shape, layout, "eager",
                                _decode_builder(mesh_shape, layout))
  want = _one_processor_decodes()
  for key in ("lm", "bi"):
    np.testing.assert_array_equal(got[key], want[key],
                                  err_msg=f"{key} under {layout_id}")
