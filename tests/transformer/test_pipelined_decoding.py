"""A PipelinedLayerStack decodes with its own (layer-stacked) variables.

In the decoding modes the stack runs its layers one after another on the
whole batch, layer s * L/S + j reading row s of the stacked weights. A
tiny pipelined LM of 4 layers (4 stages) and the plain LayerStack LM of
the same layers start from the same values (same per-layer names), so
their greedy samples, beam searches and "infer"-mode logits must agree,
on one processor and with the stage dimension split over "stage:4".
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing as mt
from tests.transformer import tiny_layers

NUM_LAYERS = 4
PREFIX = 3
BEAM = mtf.Dimension("beam", 2)


def _layers():
  return mt.block_layers(NUM_LAYERS)


def _lm(stack):
  return mt.lm_on_stack(stack)


def _pipelined_stack(num_stages=4):
  return transformer.PipelinedLayerStack(
      _layers(), num_stages=num_stages, num_microbatches=2,
      recompute_grads=True)


def _decodes(stack, mesh_shape, layout, mode="function"):
  """Greedy samples (from scratch and from a prefix), a beam search and
  the "infer"-mode logits of the LM on `stack`."""
  lm = _lm(stack)

  def build(mesh):
    prefix = mt.import_ids(
        mesh, np.where(np.arange(mt.L) < PREFIX, mt.TARGETS, 0))
    outputs = {
        "greedy": lm.sample_autoregressive(
            mtf.zeros(mesh, [mt.BATCH, mt.LENGTH], tf.int32),
            stop_at_token=None, has_partial_sequences=False,
            temperature=0.0),
        "prefixed": lm.sample_autoregressive(prefix, stop_at_token=None),
        "beam": lm.beam_search(
            mtf.zeros(mesh, [mt.BATCH, BEAM, mt.LENGTH], tf.int32),
            decode_length=mtf.constant(mesh, 5, dtype=tf.int32)),
    }
    targets = mt.import_ids(mesh, mt.TARGETS)
    outputs["logits"], _ = lm.call_simple(
        transformer.autoregressive_inputs(targets), targets, False,
        mode="infer")
    return outputs, None, {}

  return mtf_testing.run_program(mesh_shape, layout, mode, build,
                                 fetch_variables=False)


@pytest.fixture(scope="module")
def plain():
  values, _ = _decodes(transformer.LayerStack(_layers()), "all:1", "")
  return values


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    ("all:1", "", "function"),
    ("stage:4", "stage:stage", "function")])
def test_pipelined_lm_decodes_like_the_plain_one(plain, mesh_shape, layout,
                                                 mode):
  values, graph = _decodes(_pipelined_stack(), mesh_shape, layout, mode)
  # The decodes are not trivial: tokens past the prefix, and not all one.
  assert (plain["prefixed"][:, PREFIX:] > 0).any()
  assert len(np.unique(plain["greedy"])) > 1
  for key in ("greedy", "prefixed", "beam"):
    np.testing.assert_array_equal(values[key], plain[key], err_msg=key)
  np.testing.assert_allclose(values["logits"], plain["logits"], rtol=1e-5,
                             atol=1e-6)
  # Only the layer-stacked variables: decoding made no per-layer ones.
  blocks = [v for v in graph.all_variables if "block_" in v.name]
  assert blocks and all(v.member_names for v in blocks), [
      v.name for v in blocks]


def _first_part(stack):
  """(layer_outputs count, layer_index, recorded states count) after one
  call of `stack` in "first_part" mode."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  model = layer_testing.ModelStub(mt.D)
  context = layer_testing.make_context(
      mesh, model, mt.BATCH, mt.LENGTH, mode="first_part", states=[],
      new_states=[], layer_outputs=[],
      sequence_id=mtf.ones(mesh, [mt.BATCH, mt.LENGTH], tf.int32))
  x = mtf.zeros(mesh, [mt.BATCH, mt.LENGTH, model.model_dim])
  stack.call(context, x)
  return (len(context.layer_outputs), context.layer_index,
          len(context.new_states))


def test_decoding_context_is_a_layer_stacks():
  assert _first_part(_pipelined_stack(2)) == _first_part(
      transformer.LayerStack(_layers()))


class _LossLayer(tiny_layers.TinyDenseRelu):
  """A feed-forward layer that adds an auxiliary loss, as a MoE does."""

  def call(self, context, x):
    if context.losses is not None:
      context.losses.append(mtf.reduce_mean(x))
    return super().call(context, x)


def test_an_auxiliary_loss_in_a_stage_names_the_layer_and_the_fix():
  layers = transformer.make_layer_stack(
      [tiny_layers.TinySelfAttention, _LossLayer], num_layers=2).layers
  stack = transformer.PipelinedLayerStack(layers, num_stages=2,
                                          num_microbatches=2)
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  targets = mt.import_ids(mesh, mt.TARGETS)
  with pytest.raises(ValueError, match=(
      r"layer block_000/layer_001 \(_LossLayer\) added an auxiliary loss.*"
      r"layer_stack_cls = @transformer.LayerStack")):
    _lm(stack).call_simple(transformer.autoregressive_inputs(targets),
                           targets, True)


def _bitransformer(stack_fn):
  """The tiny Bitransformer of model_testing, its stacks made by
  stack_fn(layers)."""
  bi = mt.make_bitransformer(num_layers=2)
  return transformer.Bitransformer(
      transformer.Unitransformer(
          stack_fn(bi.encoder.layer_stack.layers), d_model=mt.D,
          input_vocab_size=mt.V, output_vocab_size=None,
          autoregressive=False, max_length=mt.L,
          vocab_divisor=mt.VOCAB_DIVISOR, name="encoder"),
      transformer.Unitransformer(
          stack_fn(bi.decoder.layer_stack.layers), d_model=mt.D,
          input_vocab_size=mt.V, output_vocab_size=mt.V, autoregressive=True,
          max_length=mt.L, vocab_divisor=mt.VOCAB_DIVISOR, name="decoder"))


def _bi_decodes(stack_fn):
  bi = _bitransformer(stack_fn)

  def build(mesh):
    inputs = mt.import_ids(mesh, mt.INPUTS)
    return {"greedy": bi.decode(inputs),
            "beam": bi.decode(inputs, beam_size=2,
                              decode_length_multiplier=0.0,
                              decode_length_constant=4)}, None, {}

  values, _ = mtf_testing.run_program("all:1", "", "function", build,
                                      fetch_variables=False)
  return values


def test_pipelined_bitransformer_decodes_like_the_plain_one():
  """The encoder runs pipelined ("infer" mode), the decoder layer by
  layer; greedy and beam decodes equal the plain model's."""
  plain = _bi_decodes(transformer.LayerStack)
  pipelined = _bi_decodes(lambda layers: transformer.PipelinedLayerStack(
      layers, num_stages=2, num_microbatches=4))
  assert (plain["greedy"] > 0).any()
  for key in plain:
    np.testing.assert_array_equal(pipelined[key], plain[key], err_msg=key)
