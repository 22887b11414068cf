"""UTLayerStack: recurrence and ACT halting against NumPy, layouts, gin."""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
from mesh_tensorflow.transformer import universal_transformer
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing as mt

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = 16
EPS = 1e-6
X = np.random.RandomState(0).normal(size=[8, 4, D_MODEL]).astype(np.float32)
LOSS_WEIGHTS = np.random.RandomState(1).normal(
    size=[8, 4, D_MODEL]).astype(np.float32)

# Every argument the original requires from gin, with "off" values.
BASE = dict(
    act_type="basic", recurrence_type="basic", act_max_steps=3,
    act_epsilon=0.01, num_rec_steps=2, num_inrecurrence_layers=1,
    position_start_index=None, add_or_concat_timing_signal="add",
    step_timing_signal_type="learned", add_position_timing_signal=False,
    add_step_timing_signal=False, mix_with_transformer_before_ut=False,
    mix_with_transformer_after_ut=False, gates_inputs="s",
    gate_ffn_layer="dense", use_gated_transformer=False,
    gating_type="highway")


class HalveLayer(transformer.TransformerLayer):
  """y = x / 2: a layer without variables, easy to follow in NumPy."""

  def call(self, context, x):
    return x * 0.5


def _stack(layers, **kwargs):
  return universal_transformer.UTLayerStack(layers, **dict(BASE, **kwargs))


def _builder(stack, mode="eval", wrt_variables=False):
  return layer_testing.weighted_sum_builder(
      stack, X, LOSS_WEIGHTS, BATCH, LENGTH, mode, wrt_variables)


def _np_norm(x):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + EPS)


def _np_block(x):
  """One pass through [HalveLayer] as a pre-norm residual block."""
  return x + 0.5 * _np_norm(x)


def _np_timing(positions, channels):
  half = channels // 2
  inv = np.exp(np.arange(half) * -(np.log(1e4) / (half - 1)))
  scaled = positions[..., None] * inv
  return np.concatenate([np.sin(scaled), np.cos(scaled)], -1)


def _np_act(got, act_type, max_steps, epsilon):
  """ACT of tensor2tensor's universal transformer, in NumPy."""
  x = X.astype(np.float64)
  shape = x.shape[:1] if act_type == "global" else x.shape[:2]
  halting, remainders, n_updates = (np.zeros(shape) for _ in range(3))
  previous = np.zeros_like(x)
  state = x
  # One halting unit for every step, as in the original: each step
  # re-enters the scope, and TF1 forgets the default names used inside a
  # named scope when it closes, so the kernel is "dense" and the bias
  # "dense_1" every time.
  kernel = got["sigmoid_activation_for_pondering/dense/kernel"]
  bias = got["sigmoid_activation_for_pondering/dense_1/bias"]
  for _ in range(max_steps + 1):
    p = 1 / (1 + np.exp(-(state @ kernel + bias)))[..., 0]
    if act_type == "global":
      p = p.mean(1)
    running = (halting < 1.0).astype(np.float64)
    proposed = halting + p * running
    new_halted = (proposed > 1 - epsilon) * running
    still_running = (proposed <= 1 - epsilon) * running
    halting += p * still_running
    remainders += new_halted * (1 - halting)
    halting += new_halted * remainders
    n_updates += still_running + new_halted
    weights = p * still_running + new_halted * remainders
    if act_type == "global":
      weights = weights[:, None]
    state = _np_block(state)
    if act_type == "accumulated":
      previous = state * weights[..., None] + previous
    else:
      previous = (state * weights[..., None] +
                  previous * (1 - weights[..., None]))
  return _np_norm(previous), n_updates


@pytest.mark.parametrize("act_type", ["basic", "accumulated", "global"])
def test_act_halting_matches_numpy(act_type):
  stack = _stack([HalveLayer()], recurrence_type="act", act_type=act_type)
  got, _ = mtf_testing.run_program("all:1", "", "function", _builder(stack))
  want, n_updates = _np_act(got, act_type, max_steps=3, epsilon=0.01)
  # The case halts positions at different steps, some not at all.
  assert len(np.unique(n_updates)) > 1, n_updates
  np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)


def test_basic_recurrence_with_timing_signals_matches_numpy():
  stack = _stack([HalveLayer()], recurrence_type="basic", num_rec_steps=3,
                 num_inrecurrence_layers=2, add_step_timing_signal=True,
                 add_position_timing_signal=True, position_start_index="step")
  got, graph = mtf_testing.run_program("all:1", "", "function",
                                       _builder(stack))
  # One step embedding table for all steps; the layer norm is shared.
  assert sorted(v.name for v in graph.trainable_variables) == [
      "layer_embedding", "layer_prepostprocess/layer_norm/layer_norm_bias",
      "layer_prepostprocess/layer_norm/layer_norm_scale"]
  assert got["layer_embedding"].shape == (3, D_MODEL)
  x = X.astype(np.float64)
  for step in range(3):
    start = int(4 * step / 3)
    x = x + _np_timing(np.arange(4) + start, D_MODEL)
    x = x + got["layer_embedding"][step] * np.sqrt(D_MODEL)
    x = _np_block(_np_block(x))
  np.testing.assert_allclose(got["y"], _np_norm(x), rtol=1e-4, atol=1e-4)


def _assert_same_under_layouts(build, layouts=layer_testing.LAYOUTS):
  """`layouts` in tf.function; graph mode on the 2-D layout (the
  recurrences make big programs: this keeps the file quick)."""
  layer_testing.assert_same_under_layouts(build, layouts, modes=("function",))
  layer_testing.assert_same_under_layouts(
      build, layouts=layer_testing.LAYOUTS[3:], modes=("graph",))


def _named(layers):
  for i, layer in enumerate(layers):
    layer.set_name(f"layer_{i:03d}")
  return layers


def test_act_with_timing_signals_same_under_layouts():
  stack = _stack(
      _named([transformer_layers.DenseReluDense(hidden_size=32)]),
      recurrence_type="act", act_max_steps=1, dropout_rate=0.1,
      add_step_timing_signal=True, add_position_timing_signal=True,
      position_start_index="step")
  _assert_same_under_layouts(_builder(stack, mode="train"))


def test_highway_with_gru_gates_and_concat_signals_same_under_2d_layout():
  # Every mesh dimension of the 2-D layout splits something (batch, d_ff),
  # so one layout stands for the others in this bigger program.
  stack = _stack(
      _named([transformer_layers.DenseReluDense(hidden_size=32)]),
      recurrence_type="highway", num_rec_steps=1, gates_inputs="sti",
      use_gated_transformer=True, gating_type="gru",
      gate_ffn_layer="dense_relu_dense", add_step_timing_signal=True,
      step_timing_signal_type="sinusoid", add_position_timing_signal=True,
      add_or_concat_timing_signal="concat")
  _assert_same_under_layouts(_builder(stack),
                             layouts=layer_testing.LAYOUTS[3:])


def test_random_halting_and_random_start_same_under_layouts():
  # Random halting probabilities and a random start position: mtf's random
  # ops draw the same numbers under every layout.
  stack = _stack([HalveLayer()], recurrence_type="act", act_type="random",
                 act_max_steps=2, add_position_timing_signal=True,
                 position_start_index="random")
  got = layer_testing.assert_same_under_layouts(_builder(stack),
                                                modes=("function",))
  assert np.all(np.isfinite(got["y"])) and np.abs(got["y"]).max() > 0


def test_unknown_recurrence_type_is_named():
  with pytest.raises(ValueError, match="'lstm'"):
    _stack([HalveLayer()], recurrence_type="lstm")


GIN_CONFIG = """
import mesh_tensorflow.transformer.transformer_layers
import mesh_tensorflow.transformer.universal_transformer

transformer_layers.SelfAttention.num_heads = 8
transformer_layers.SelfAttention.key_value_size = 4
transformer_layers.DenseReluDense.hidden_size = 32
transformer.make_layer_stack.layers = [
    @transformer_layers.SelfAttention,
    @transformer_layers.DenseReluDense,
]
transformer.make_layer_stack.num_layers = 1
transformer.make_layer_stack.layer_stack_cls = @universal_transformer.UTLayerStack
UTLayerStack.act_type = "basic"
UTLayerStack.recurrence_type = "basic"
UTLayerStack.act_max_steps = 2
UTLayerStack.act_epsilon = 0.01
UTLayerStack.num_rec_steps = 2
UTLayerStack.num_inrecurrence_layers = 1
UTLayerStack.position_start_index = None
UTLayerStack.add_or_concat_timing_signal = "add"
UTLayerStack.step_timing_signal_type = "learned"
UTLayerStack.add_position_timing_signal = False
UTLayerStack.add_step_timing_signal = True
UTLayerStack.mix_with_transformer_before_ut = False
UTLayerStack.mix_with_transformer_after_ut = False
UTLayerStack.gates_inputs = "s"
UTLayerStack.gate_ffn_layer = "dense"
UTLayerStack.use_gated_transformer = False
UTLayerStack.gating_type = "highway"
"""


def test_gin_built_universal_transformer_trains():
  stack = mt.stack_from_gin(GIN_CONFIG)
  assert isinstance(stack, universal_transformer.UTLayerStack)
  assert stack.num_layers == 2
  mt.assert_lm_on_stack_trains(stack)
