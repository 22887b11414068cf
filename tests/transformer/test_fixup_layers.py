"""Fixup layers: initial scales against NumPy, layouts, a gin-built model."""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import fixup_layers
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing as mt

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = 16
D_FF = 32
X = np.random.RandomState(0).normal(size=[8, 4, D_MODEL]).astype(np.float32)
LOSS_WEIGHTS = np.random.RandomState(1).normal(
    size=[8, 4, D_MODEL]).astype(np.float32)


def _builder(layer, mode="eval", wrt_variables=False):
  return layer_testing.weighted_sum_builder(
      layer, X, LOSS_WEIGHTS, BATCH, LENGTH, mode, wrt_variables)


def _assert_same_under_layouts(build):
  """Every layout in tf.function, and graph mode on the 2-D layout."""
  reference = layer_testing.assert_same_under_layouts(build,
                                                      modes=("function",))
  layer_testing.assert_same_under_layouts(
      build, layouts=layer_testing.LAYOUTS[3:], modes=("graph",))
  return reference


def _uniform_std(limit):
  return limit / np.sqrt(3.0)


@pytest.mark.parametrize("default_init,scale,fan", [
    ("he", lambda n: 2.0 / n, D_MODEL),
    ("glorot", lambda n: 1.0 / n, (D_MODEL + D_FF) / 2)],
                         ids=["he", "glorot"])
def test_dense_relu_dense_fixup_initial_scales(default_init, scale, fan):
  num_blocks = 6
  layer = fixup_layers.DenseReluDenseFixup(
      hidden_size=D_FF, default_init=default_init, num_blocks=num_blocks)
  got, graph = mtf_testing.run_program("all:1", "", "function",
                                       _builder(layer))
  assert sorted(v.name for v in graph.trainable_variables) == [
      "shift", "wi/kernel", "wo/kernel"]
  limit = np.sqrt(3.0 * scale(num_blocks) / fan)
  wi = got["wi/kernel"]
  assert np.abs(wi).max() <= limit
  np.testing.assert_allclose(wi.std(), _uniform_std(limit), rtol=0.1)
  assert not got["wo/kernel"].any() and not got["shift"].any()
  # wo starts at zero: the branch starts as nothing (Fixup's point).
  assert not got["y"].any()


def test_dense_relu_dense_fixup_matches_numpy():
  layer = fixup_layers.DenseReluDenseFixup(hidden_size=D_FF, num_blocks=4)
  # A nonzero wo, so that the output says something.
  layer.downproject_initializer = mtf.layers.VarianceScalingInitializer()
  got, _ = mtf_testing.run_program("all:1", "", "function", _builder(layer))
  h = np.maximum(X.astype(np.float64) @ got["wi/kernel"], 0) + got["shift"]
  np.testing.assert_allclose(got["y"], h @ got["wo/kernel"], rtol=1e-4,
                             atol=1e-5)


def test_dense_relu_dense_fixup_same_under_layouts():
  layer = fixup_layers.DenseReluDenseFixup(hidden_size=D_FF, num_blocks=4,
                                           dropout_rate=0.25)
  layer.downproject_initializer = mtf.layers.VarianceScalingInitializer()
  _assert_same_under_layouts(
      _builder(layer, mode="train", wrt_variables=True))


@pytest.mark.parametrize("default_init,he", [("glorot", False), ("he", True)],
                         ids=["glorot", "he"])
def test_attention_params_fixup_initial_scales(default_init, he):
  num_blocks = 8
  layer = fixup_layers.SelfAttentionFixup(
      num_blocks=num_blocks, default_init=default_init, num_heads=8,
      key_value_size=4)
  got, graph = mtf_testing.run_program("all:1", "", "function",
                                       _builder(layer))
  assert sorted(v.name for v in graph.trainable_variables) == [
      "k_fixup", "o_fixup", "q_fixup", "v_fixup"]
  factor = num_blocks ** (-1.0 / 3)
  heads_kv = 8 * 4
  variance = (2 * factor / D_MODEL if he
              else factor / ((D_MODEL + heads_kv) / 2))
  limit = np.sqrt(3.0 * variance)
  for name in ("q_fixup", "k_fixup", "v_fixup"):
    assert got[name].shape == (D_MODEL, heads_kv)
    assert np.abs(got[name]).max() <= limit
    np.testing.assert_allclose(got[name].std(), _uniform_std(limit),
                               rtol=0.1)
  assert not got["o_fixup"].any()


def test_attention_params_fixup_rejects_folded_scaling():
  with pytest.raises(ValueError, match="fold_scaling_into_initializer"):
    layer = fixup_layers.SelfAttentionFixup(
        num_blocks=2, fold_scaling_into_initializer=True)
    mtf_testing.run_program("all:1", "", "function", _builder(layer))


def test_unknown_default_init_is_named():
  with pytest.raises(ValueError, match="'xavier'"):
    fixup_layers.DenseReluDenseFixup(num_blocks=2, default_init="xavier")


def test_self_attention_fixup_same_under_layouts():
  # o_fixup starts at zero, so the gradients by q, k, v are zero: the
  # gradient by o_fixup carries the attention's answer.
  layer = fixup_layers.SelfAttentionFixup(
      num_blocks=4, num_heads=8, key_value_size=4, dropout_rate=0.5)
  ref = _assert_same_under_layouts(
      _builder(layer, mode="train", wrt_variables=True))
  assert np.abs(ref["d_o_fixup"]).max() > 0


def test_sublayers_fixup_scale_and_shift_match_numpy():
  def build(mesh):
    model = layer_testing.ModelStub(D_MODEL)
    context = layer_testing.make_context(mesh, model, BATCH, LENGTH)
    x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, model.model_dim])
    y = fixup_layers.sublayer_fixup_scale(
        fixup_layers.sublayer_fixup_shift(x, None, context), None, context)
    loss = mtf.reduce_sum(y * y)
    return ({"y": y}, loss,
            {v.name: v.outputs[0] for v in mesh.graph.trainable_variables})
  got = _assert_same_under_layouts(build)
  assert got["fixup_bias"].shape == (1,) and got["fixup_bias"][0] == 0
  assert got["fixup_scale_weight"].shape == (1,)
  assert got["fixup_scale_weight"][0] == 1
  np.testing.assert_allclose(got["y"], X)
  # d/db sum((s (x + b))^2) = 2 s^2 sum(x + b); d/ds = 2 s sum((x + b)^2).
  np.testing.assert_allclose(got["d_fixup_bias"], [2 * X.sum()], rtol=1e-4)
  np.testing.assert_allclose(got["d_fixup_scale_weight"],
                             [2 * (X.astype(np.float64) ** 2).sum()],
                             rtol=1e-4)


GIN_CONFIG = """
import mesh_tensorflow.transformer.fixup_layers

NUM_BLOCKS = 4
fixup_layers.SelfAttentionFixup.num_blocks = %NUM_BLOCKS
fixup_layers.SelfAttentionFixup.num_heads = 8
fixup_layers.SelfAttentionFixup.key_value_size = 4
fixup_layers.DenseReluDenseFixup.num_blocks = %NUM_BLOCKS
fixup_layers.DenseReluDenseFixup.hidden_size = 32
transformer.make_layer_stack.layers = [
    @fixup_layers.SelfAttentionFixup,
    @fixup_layers.DenseReluDenseFixup,
]
transformer.make_layer_stack.num_layers = 2
transformer.LayerStack.sublayers_initial = []
transformer.LayerStack.sublayers_per_layer = [
    @transformer.sublayer_call_layer,
    @fixup_layers.sublayer_fixup_scale,
    @transformer.sublayer_residual,
]
transformer.LayerStack.sublayers_final = [@fixup_layers.sublayer_fixup_shift]
"""


def test_gin_built_fixup_model_trains():
  stack = mt.stack_from_gin(GIN_CONFIG)
  assert [type(l).__name__ for l in stack.layers] == [
      "SelfAttentionFixup", "DenseReluDenseFixup"] * 2
  mt.assert_lm_on_stack_trains(stack)
