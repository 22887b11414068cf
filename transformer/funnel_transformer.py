"""The Funnel Transformer (https://arxiv.org/abs/2006.03236) as an encoder.

The original's `mesh_tensorflow.transformer.funnel_transformer`. The encoder's
layers form blocks; every block after the first starts by pooling the
sequence ("length") by `pooling_size`, so deeper blocks run on shorter
sequences. As in the original, and unlike the paper:

- only the encoder of a `BitransformerFunnel` is a funnel (the paper's
  source-side compression for encoder-decoder models), and its decoder
  attends to the shortened encoder output;
- pooling follows the first layer of a block (the whole self-attention
  runs, then its output is pooled), instead of pooling only the queries;
- relative attention is T5's scalar bias, not Transformer-XL's.
"""

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer.models import layer_stack

_GIN_MODULE = "mesh_tensorflow.transformer.funnel_transformer"

_POOL_FNS = {"mean": mtf.reduce_mean, "max": mtf.reduce_max,
             "min": mtf.reduce_min}


@gin.configurable(module=_GIN_MODULE)
class FunnelTransformerLayerStack(layer_stack.SublayerRunner):
  """A layer stack whose blocks shorten the sequence (see the module).

  Block b has block_param_size[b] groups of `n_submodules` layers (e.g.
  SelfAttention and DenseReluDense); each group runs block_repeat_size[b]
  times with the same parameters. Layers are named
  "funnel_block_<b>/param_idx_<p>/submodule_<s>" (their variable scopes),
  overriding make_layer_stack's names. Every layer is wrapped in the
  sublayer pipelines, run by the code `transformer.LayerStack` runs them
  with (their base, `SublayerRunner`; like the original's, this stack is a
  TransformerLayer and no LayerStack). The stack updates the
  Context it is called with (length_dim, position, sequence_id) to the
  pooled sequence and keeps it (`context`), where a BitransformerFunnel
  finds the encoder's pooled sequence ids.
  """

  def __init__(self,
               layers,
               n_blocks=gin.REQUIRED,
               block_param_size=gin.REQUIRED,
               block_repeat_size=gin.REQUIRED,
               pooling_size=2,
               sublayers_initial=None,
               sublayers_per_layer=None,
               sublayers_final=None,
               pooling_type="mean",
               n_submodules=2):
    """Creates a FunnelTransformerLayerStack.

    Args:
      layers: a list of sum(block_param_size) * n_submodules
        TransformerLayers, in order.
      n_blocks: an integer, the number of blocks.
      block_param_size: a list of n_blocks integers: the groups of layers
        (each with its own parameters) of each block.
      block_repeat_size: a list of n_blocks integers: how many times each
        group of a block runs (the repeats share parameters).
      pooling_size: an integer, the pooling window and stride; the length
        must divide by pooling_size ** (n_blocks - 1).
      sublayers_initial: an optional list of sublayer functions (default
        as transformer.LayerStack's).
      sublayers_per_layer: an optional list of sublayer functions.
      sublayers_final: an optional list of sublayer functions.
      pooling_type: "mean", "max" or "min".
      n_submodules: an integer, the layers in a group.

    Raises:
      ValueError: the sizes do not match each other or the layers, or the
        pooling type is unknown.
    """
    for name, value in (("n_blocks", n_blocks),
                        ("block_param_size", block_param_size),
                        ("block_repeat_size", block_repeat_size)):
      if value is gin.REQUIRED:
        raise ValueError(f"FunnelTransformerLayerStack needs {name}.")
    if len(block_param_size) != n_blocks:
      raise ValueError(
          f"FunnelTransformerLayerStack: block_param_size {block_param_size} "
          f"must have n_blocks={n_blocks} entries.")
    if len(block_repeat_size) != n_blocks:
      raise ValueError(
          f"FunnelTransformerLayerStack: block_repeat_size "
          f"{block_repeat_size} must have n_blocks={n_blocks} entries.")
    if len(layers) != sum(block_param_size) * n_submodules:
      raise ValueError(
          f"FunnelTransformerLayerStack: {len(layers)} layers given, but "
          f"block_param_size {block_param_size} with n_submodules="
          f"{n_submodules} needs {sum(block_param_size) * n_submodules}.")
    if pooling_type not in _POOL_FNS:
      raise ValueError(
          f"FunnelTransformerLayerStack: unknown pooling_type "
          f"{pooling_type!r}; choose among {sorted(_POOL_FNS)}.")
    self._layers = layers
    self.n_blocks = n_blocks
    self.block_param_size = block_param_size
    self.block_repeat_size = block_repeat_size
    self.pooling_size = pooling_size
    self._set_sublayers(
        sublayers_initial, sublayers_per_layer, sublayers_final)
    self.pool_fn = _POOL_FNS[pooling_type]
    self.n_submodules = n_submodules
    self._context = None

  def update_context(self, context, x, pool_dim_name):
    """Points `context` at the pooled sequence of `x`.

    The new length is x's `pool_dim_name` dimension. Positions are the
    first ones (0, 1, ...), not every pooling_size-th: a pooled token's
    position is its index in the shorter sequence. A token of the pooled
    sequence belongs to the example of the first token of its window.

    Args:
      context: the Context to update.
      x: the pooled Tensor.
      pool_dim_name: the name of the pooled dimension ("length").
    """
    new_length_dim = x.shape.get_dim_by_name(pool_dim_name)
    if isinstance(context.position, mtf.Tensor):
      context.position = mtf.slice(context.position, begin=0,
                                   size=new_length_dim.size,
                                   slice_dim_name=pool_dim_name)
    if isinstance(context.sequence_id, mtf.Tensor):
      context.sequence_id = mtf.stride_tensor_1d(
          context.sequence_id, pool_dim=context.length_dim,
          pool_size=self.pooling_size)
    context.length_dim = new_length_dim

  def call(self, context, x):
    """Runs the blocks, pooling at the start of every block after the
    first; returns the pooled output and updates `context`."""
    x = self._call_sublayers(self._sublayers_initial, x, context)
    layer_stack.append_layer_output(context, x)
    total_calls = sum(p * r for p, r in zip(self.block_param_size,
                                            self.block_repeat_size))
    total_calls *= self.n_submodules
    first_group = 0
    calls = 0
    for block in range(self.n_blocks):
      repeats = self.block_repeat_size[block]
      for param in range(self.block_param_size[block]):
        for repeat in range(repeats):
          for sub in range(self.n_submodules):
            layer = self._layers[(first_group + param) * self.n_submodules
                                 + sub]
            layer.set_name(f"funnel_block_{block:03d}/param_idx_{param:03d}/"
                           f"submodule_{sub:03d}")
            with layer_stack.layer_scope(layer):
              x = self._layer_fn(x, layer, context)
            if block > 0 and param == 0 and repeat == 0 and sub == 0:
              x = mtf.pool_tensor_1d(x, pool_dim=context.length_dim,
                                     reduce_fn=self.pool_fn,
                                     pool_size=self.pooling_size)
              self.update_context(context, x, context.length_dim.name)
            calls += 1
            if calls != total_calls:
              layer_stack.append_layer_output(context, x)
            context.layer_index += 1
      first_group += self.block_param_size[block]
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = transformer.sublayer_mask_padding(x, self, context)
    layer_stack.append_layer_output(context, x)
    self.set_context(context)
    return x

  def set_context(self, context):
    self._context = context

  @property
  def context(self):
    """The Context of the last call (with the pooled length)."""
    return self._context


@gin.configurable(module=_GIN_MODULE)
class BitransformerFunnel(transformer.Bitransformer):
  """A Bitransformer whose encoder is a funnel (FunnelTransformerLayerStack).

  The decoder attends to the pooled encoder output, with the encoder's
  pooled sequence ids telling apart its examples and padding.
  """

  def _encoder_output_sequence_id(self, sequence_id):
    """The pooled sequence ids of the funnel's last call."""
    stack_context = getattr(self.encoder.layer_stack, "context", None)
    if stack_context is not None:
      sequence_id = stack_context.sequence_id
    return sequence_id

  @gin.configurable(module="BitransformerFunnel")
  def decode(self,
             inputs,
             variable_dtype=mtf.VariableDType(tf.float32),
             beam_size=1,
             alpha=0.6,
             temperature=0.0,
             sampling_keep_top_k=-1,
             decode_length_multiplier=1.5,
             decode_length_constant=10,
             max_decode_length=None):
    """Decodes the targets of `inputs` (see Bitransformer.decode), the
    decoder attending to the pooled encoder output. Configured in gin as
    `BitransformerFunnel.decode`, as in the original."""
    return super().decode(
        inputs, variable_dtype=variable_dtype, beam_size=beam_size,
        alpha=alpha, temperature=temperature,
        sampling_keep_top_k=sampling_keep_top_k,
        decode_length_multiplier=decode_length_multiplier,
        decode_length_constant=decode_length_constant,
        max_decode_length=max_decode_length)
