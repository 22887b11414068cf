"""Tiny models, data and a training loop for the Transformer model tests.

A decoder-only language model and an encoder-decoder Bitransformer built
from the layers of `tiny_layers` (sizes the layouts of
`layer_testing.LAYOUTS` divide), fixed example data, and `train_losses`,
which runs a few optimizer steps of a model under one mesh, layout and mode
and returns the loss of every step.
"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing
from tests import training_loop
from tests.transformer import tiny_layers

B, L, V, D = 8, 8, 30, 16
VOCAB_DIVISOR = 8  # The "vocab" dimension is 32: layouts split it.
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)


def make_lm(name="decoder", num_layers=1, **kwargs):
  """A causal language model: `num_layers` blocks of self-attention and a
  feed-forward layer."""
  stack = transformer.make_layer_stack(
      [tiny_layers.TinySelfAttention, tiny_layers.TinyDenseRelu],
      num_layers=num_layers)
  kwargs.setdefault("max_length", L)
  return transformer.Unitransformer(
      stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
      autoregressive=True, vocab_divisor=VOCAB_DIVISOR, name=name, **kwargs)


def block_layers(num_layers):
  """The layers of `num_layers` blocks of self-attention and a
  feed-forward layer (named block_<b>/layer_<n>)."""
  return transformer.make_layer_stack(
      [tiny_layers.TinySelfAttention, tiny_layers.TinyDenseRelu],
      num_layers=num_layers).layers


def lm_on_stack(stack, name="decoder"):
  """A causal language model of these sizes on a given layer stack."""
  return transformer.Unitransformer(
      stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
      autoregressive=True, max_length=L, vocab_divisor=VOCAB_DIVISOR,
      name=name)


def make_bitransformer(num_layers=1):
  """An encoder and a decoder of `num_layers` blocks sharing their
  embeddings."""
  encoder = transformer.Unitransformer(
      transformer.make_layer_stack(
          [tiny_layers.TinySelfAttention, tiny_layers.TinyDenseRelu],
          num_layers=num_layers),
      d_model=D, input_vocab_size=V, output_vocab_size=None,
      autoregressive=False, max_length=L, vocab_divisor=VOCAB_DIVISOR,
      name="encoder")
  decoder = transformer.Unitransformer(
      transformer.make_layer_stack(
          [tiny_layers.TinySelfAttention, tiny_layers.TinyEncDecAttention,
           tiny_layers.TinyDenseRelu], num_layers=num_layers),
      d_model=D, input_vocab_size=V, output_vocab_size=V,
      autoregressive=True, max_length=L, vocab_divisor=VOCAB_DIVISOR,
      name="decoder")
  return transformer.Bitransformer(encoder, decoder)


def _ids(seed, min_len):
  """Random ids in [2, V) with each row padded (0) after a random length."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(2, V, size=(B, L)).astype(np.int32)
  for row, n in enumerate(rng.randint(min_len, L + 1, size=B)):
    ids[row, n:] = 0
  return ids


TARGETS = _ids(0, 5)
INPUTS = _ids(1, 3)


def import_ids(mesh, ids):
  return mtf.import_tf_tensor(mesh, tf.constant(ids), [BATCH, LENGTH])


def lm_loss(model, mesh):
  targets = import_ids(mesh, TARGETS)
  _, loss = model.call_simple(
      transformer.autoregressive_inputs(targets), targets, True)
  return loss


def bi_loss(model, mesh):
  _, loss = model.call_simple(import_ids(mesh, INPUTS),
                              import_ids(mesh, TARGETS), True)
  return loss


def train_losses(make_loss, mesh_shape, layout, mode, steps, make_optimizer):
  """Losses of `steps` training steps (`training_loop.run_steps`) of
  make_loss(mesh) -> scalar loss."""
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)

  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = make_loss(mesh)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = make_optimizer().apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    train_ops = [lowering.lowered_operation(u) for u in updates]
    return lowering, train_ops, lowering.export_to_tf_tensor(loss)

  return [float(loss)
          for loss in training_loop.run_steps(step, impl, mode, steps)]


def stack_from_gin(config):
  """transformer.make_layer_stack() as the gin `config` text binds it (the
  gin configuration is cleared before and after)."""
  import gin  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config(config)
    try:
      return transformer.make_layer_stack()
    finally:
      gin.clear_config()


def assert_lm_on_stack_trains(stack, steps=6, drop=0.3):
  """A causal LM on `stack` lowers its loss by `drop` in `steps` Adam
  steps on one processor."""
  def make_loss(mesh):
    return lm_loss(lm_on_stack(stack), mesh)

  losses = train_losses(
      make_loss, "all:1", "", "function", steps,
      lambda: mtf.optimize.AdamWeightDecayOptimizer(learning_rate=0.01))
  assert losses[-1] < losses[0] - drop, losses
