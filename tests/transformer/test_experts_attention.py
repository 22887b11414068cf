"""ExpertsSelfAttention / ExpertsEncDecAttention: layouts and meaning."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import transformer_layers
from tests import mtf_testing
from tests.transformer import layer_testing

BATCH, LENGTH, MEMORY, D_MODEL = 8, 8, 4, 16
# (The experts-on-batch layout alone is covered by test_moe.py.)
LAYOUTS = (
    ("2d", "batch:2;model:4", "batch:batch;experts:batch;heads:model"),
)


def _build(mesh_shape, layout, layer_cls, **kwargs):
  """build(mesh): the layer on a batch; the loss reads the last position
  only, so d_x at earlier positions shows that positions are mixed."""
  rng = np.random.RandomState(3)
  x = rng.randn(BATCH, LENGTH, D_MODEL).astype(np.float32)
  enc = rng.randn(BATCH, MEMORY, D_MODEL).astype(np.float32)
  params = dict(num_experts=8, group_size=8, hidden_size=16,
                min_expert_capacity=1, capacity_factor_train=2.0,
                num_heads=4, key_value_size=2, moe_gating="switch")
  params.update(kwargs)

  def build(mesh):
    batch = mtf.Dimension("batch", BATCH)
    length = mtf.Dimension("length", LENGTH)
    d_model = mtf.Dimension("d_model", D_MODEL)
    xt = mtf_testing.import_array(mesh, x, [batch, length, d_model])
    enc_t = mtf_testing.import_array(
        mesh, enc, [batch, mtf.Dimension("memory_length", MEMORY), d_model])
    model = layer_testing.ModelStub(D_MODEL)
    model.layout, model.mesh_shape = layout, mesh_shape
    context = layer_testing.make_context(mesh, model, batch, length,
                                         encoder_output=enc_t)
    with tf.compat.v1.variable_scope("att"):
      y = layer_cls(**params).call(context, xt)
    (aux,) = context.losses
    loss = mtf.reduce_sum(mtf.gather(y, LENGTH - 1, length)) + aux
    wrt = {"x": xt}
    if layer_cls is transformer_layers.ExpertsEncDecAttention:
      wrt["enc"] = enc_t
    return {"y": y, "aux": aux}, loss, wrt

  return build


def _run(mesh_shape, layout, layer_cls, **kwargs):
  return layer_testing.run_under(
      mesh_shape, layout, "function",
      _build(mesh_shape, layout, layer_cls, **kwargs))


@pytest.mark.parametrize("layer_cls,kwargs", [
    (transformer_layers.ExpertsSelfAttention, {}),
    (transformer_layers.ExpertsEncDecAttention, {}),
    (transformer_layers.ExpertsSelfAttention,
     {"expert_computation": "kv", "moe_gating": "top_2"}),
], ids=["self_qkv", "enc_dec_q", "self_kv_top_2"])
def test_experts_attention_same_under_layouts(layer_cls, kwargs):
  want = _run("all:1", "", layer_cls, **kwargs)
  for case_id, mesh_shape, layout in LAYOUTS:
    got = _run(mesh_shape, layout, layer_cls, **kwargs)
    for key, value in want.items():
      np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5,
                                 err_msg=f"{key} under {case_id}")
  # Attention mixes positions: the last position's output depends on the
  # earlier ones (self-attention) or on the encoder output (enc-dec).
  if layer_cls is transformer_layers.ExpertsSelfAttention:
    assert np.abs(want["d_x"][:, :LENGTH - 1]).max() > 0
  else:
    assert np.abs(want["d_enc"]).max() > 0
  assert want["aux"] > 0
  assert any(k.endswith("_gating/kernel") for k in want), sorted(want)


def test_experts_attention_params_is_reexported():
  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer.layers import experts_attention_params
  assert (attention.ExpertsAttentionParams
          is experts_attention_params.ExpertsAttentionParams)


def test_qkv_refuses_multi_query():
  with pytest.raises(ValueError, match="as many memory heads"):
    _run("all:1", "", transformer_layers.ExpertsSelfAttention,
         num_memory_heads=1)
