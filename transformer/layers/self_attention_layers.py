"""Multi-head self-attention and encoder-decoder attention layers.

`SelfAttention` is the Transformer's attention layer with the original's
hooks (`make_params`, `compute_bias`, `memory_length`,
`min/max_relative_position`, `attention_kwargs_from_context`,
`layer_output_from_attention_output`, `expected_attention_output_shape`,
`attention_fn`), which the attention variants override. Keys and values use
the dimension "memory_length" (the length renamed) so that they do not
collide with the queries' "length". Re-exported by `transformer_layers`;
gin knows these names under that module.

Where this differs from the original: incremental decoding with shared_kv
works (the original multiplied the list of states); with packed sequences
an incremental step compares the sequence id at the query's position; the
visibility masks become one bias (same weights, fewer ops);
keep_query_heads_dims also works with combine_dims (see AttentionParams).
"""

import copy
import math

import gin
import mesh_tensorflow as mtf
import tensorflow as tf

from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"


def _ensemble_dim(context):
  return getattr(context.model, "ensemble_dim", None)


def _ensemble_dims(context):
  return list(getattr(context.model, "ensemble_dims", None) or [])


def _relative_bias_variable(context, name, dims, shared_key):
  """The relative-attention bias variable `name` [ensemble..., dims].

  With a `shared_key` ("bias_shared"), the layers of a call that ask with
  the same key share one variable (kept in context.cache); with None every
  layer has its own.
  """
  values = None if shared_key is None else context.cache.get(shared_key)
  if values is None:
    values = mtf.get_variable(context.mesh, name,
                              _ensemble_dims(context) + dims,
                              dtype=context.variable_dtype)
  if shared_key is not None:
    context.cache[shared_key] = values
  return values


def _position(context):
  """The query positions: [batch] in "incremental" mode, else [.., length]."""
  if context.position is not None:
    return context.position
  return context.get_position()


def _query_sequence_id(context, sequence_id):
  """The sequence ids of the queries: `sequence_id`, or in "incremental"
  mode (one query position, no length dimension) its entry at the current
  position."""
  if (context.mode != transformer.INCREMENTAL or
      context.length_dim not in sequence_id.shape.dims):
    return sequence_id
  at_position = mtf.one_hot(context.position, context.length_dim,
                            dtype=sequence_id.dtype)
  return mtf.reduce_sum(sequence_id * at_position,
                        reduced_dim=context.length_dim)


def attention_params(context,
                     kv_dim,
                     num_heads,
                     num_memory_heads=0,
                     shared_kv=False,
                     no_query=False,
                     combine_dims=True,
                     keep_query_heads_dims=False,
                     fold_scaling_into_initializer=True):
  """AttentionParams for a Transformer layer with `num_heads` read-heads.

  num_memory_heads=0 is the usual multi-head attention ("heads" for queries,
  keys and values). num_memory_heads=1 is multi-query attention: one key and
  one value head shared by all query heads, which makes the decoding state
  small. num_memory_heads > 1 groups the query heads: keys and values have
  "heads" of that size, queries also "query_heads" of num_heads /
  num_memory_heads. num_heads=1 makes no heads dimension at all.

  Args:
    context: a transformer.Context.
    kv_dim: a Dimension (channels of keys and values).
    num_heads: an integer.
    num_memory_heads: an optional integer.
    shared_kv: a boolean.
    no_query: a boolean (no query variable).
    combine_dims: a boolean.
    keep_query_heads_dims: a boolean.
    fold_scaling_into_initializer: a boolean.

  Returns:
    an attention.AttentionParams.
  """
  return _attention_params(
      attention.AttentionParams, "attention_params", context, kv_dim,
      num_heads, num_memory_heads,
      shared_kv=shared_kv,
      no_query=no_query,
      combine_dims=combine_dims,
      keep_query_heads_dims=keep_query_heads_dims,
      fold_scaling_into_initializer=fold_scaling_into_initializer)


def _attention_params(params_class, caller, context, kv_dim, num_heads,
                      num_memory_heads, /, **kwargs):
  """`params_class` (AttentionParams or a subclass) with the heads of
  `attention_params`, d_model in and out and `kv_dim` keys and values.

  `kwargs` go to its constructor (positional-only arguments leave room for
  ExpertsAttentionParams' own `context`); `caller` names it in errors.
  """
  if num_heads == 1:
    query_heads_dims = None
    memory_heads_dims = None
  elif num_memory_heads == 0:
    query_heads_dims = [mtf.Dimension("heads", num_heads)]
    memory_heads_dims = query_heads_dims
  elif num_memory_heads == 1:
    query_heads_dims = [mtf.Dimension("heads", num_heads)]
    memory_heads_dims = None
  else:
    if num_heads % num_memory_heads != 0:
      raise ValueError(
          f"{caller}: num_memory_heads={num_memory_heads} must "
          f"divide num_heads={num_heads}")
    memory_heads_dims = [mtf.Dimension("heads", num_memory_heads)]
    query_heads_dims = memory_heads_dims + [
        mtf.Dimension("query_heads", num_heads // num_memory_heads)]
  return params_class(
      context.mesh,
      query_input_dim=context.model.model_dim,
      memory_input_dim=context.model.model_dim,
      output_dim=context.model.model_dim,
      key_dim=kv_dim,
      value_dim=kv_dim,
      query_heads_dims=query_heads_dims,
      memory_heads_dims=memory_heads_dims,
      variable_dtype=context.variable_dtype,
      ensemble_dim=_ensemble_dim(context),
      **kwargs)


@gin.configurable(module=_GIN_MODULE)
class SelfAttention(transformer.TransformerLayer):
  """Multi-head self-attention.

  Variables (under the layer's scope): q, k, v (or kv) and o; with
  relative_attention_type "bias" also relative_attention_bias [heads,
  buckets], and with "contextual" relative_attention_ak. In "first_part"
  mode the layer records its keys and values over the whole length as
  decoding states; in "incremental" mode (one position, x without a length
  dimension) it writes the new key and value at the current position of
  those states and attends over them.
  """

  def __init__(self,
               num_heads=8,
               num_memory_heads=0,
               key_value_size=128,
               shared_kv=False,
               dropout_rate=0.0,
               attention_kwargs=None,
               relative_attention_type=None,
               relative_attention_num_buckets=32,
               attention_func=None,
               combine_dims=True,
               keep_query_heads_dims=False,
               fold_scaling_into_initializer=True):
    """Records the hyperparameters.

    Args:
      num_heads: an integer, the number of query heads.
      num_memory_heads: an optional integer (see `attention_params`; 1 is
        multi-query attention).
      key_value_size: an integer, the channels per head ("d_kv").
      shared_kv: a boolean: keys and values are one projection.
      dropout_rate: a float, dropout on the attention weights in training.
      attention_kwargs: a dictionary of extra arguments for the attention
        function (e.g. extra_logit, float32_logits).
      relative_attention_type: None, "bias" (a learned bias per head and
        relative-position bucket, as in T5), "bias_shared" (the same, one
        variable shared by the layers of a stack that ask for it) or
        "contextual" (the bias is a projection of the query).
      relative_attention_num_buckets: an integer.
      attention_func: None (dot-product attention) or "hybrid"
        (`attention.hybrid_attention`).
      combine_dims: a boolean (see `attention.AttentionParams`).
      keep_query_heads_dims: a boolean: the output keeps the heads
        dimensions (for layers that combine heads themselves).
      fold_scaling_into_initializer: a boolean.
    """
    if relative_attention_type not in (None, "bias", "bias_shared",
                                       "contextual"):
      raise ValueError(
          f"{type(self).__name__}: unrecognized relative_attention_type "
          f"{relative_attention_type!r}; expected None, 'bias', "
          "'bias_shared' or 'contextual'")
    if attention_func not in (None, "hybrid"):
      raise ValueError(
          f"{type(self).__name__}: unrecognized attention_func "
          f"{attention_func!r}; expected None or 'hybrid'")
    self.num_heads = num_heads
    self.num_memory_heads = num_memory_heads
    self.key_value_size = key_value_size
    self.shared_kv = shared_kv
    self.dropout_rate = dropout_rate
    self.attention_kwargs = attention_kwargs or {}
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.attention_func = attention_func
    self.combine_dims = combine_dims
    self.keep_query_heads_dims = keep_query_heads_dims
    self.fold_scaling_into_initializer = fold_scaling_into_initializer

  def layer_output_from_attention_output(self, context, attention_output,
                                         losses):
    """Hook: the layer's output from the projected attention output."""
    del context, losses
    return attention_output

  def expected_attention_output_shape(self, x, params):
    """The shape `compute_output` produces: x's, plus the query heads
    dimensions before the channels with keep_query_heads_dims."""
    if self.keep_query_heads_dims:
      return mtf.Shape(x.shape.dims[:-1] + params.query_heads_dims +
                       x.shape.dims[-1:])
    return x.shape

  def attention_kwargs_from_context(self, context):
    """The attention function's keyword arguments: attention_kwargs, and
    dropout (in training only) with its mask shared over the length."""
    kwargs = copy.copy(getattr(self, "attention_kwargs", None) or {})
    kwargs["dropout_rate"] = self.dropout_rate if context.train else 0.0
    if "dropout_broadcast_dims" not in kwargs:
      kwargs["dropout_broadcast_dims"] = [context.length_dim]
    return kwargs

  def make_params(self, context):
    """Hook: the layer's AttentionParams (creates the variables)."""
    return attention_params(
        context=context,
        kv_dim=self.kv_dim,
        num_heads=self.num_heads,
        num_memory_heads=self.num_memory_heads,
        shared_kv=self.shared_kv,
        combine_dims=self.combine_dims,
        keep_query_heads_dims=self.keep_query_heads_dims,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer)

  def call(self, context, x, losses=None):
    """Applies self-attention to x ([batch.., length, d_model], or
    [batch.., d_model] in "incremental" mode)."""
    params = self.make_params(context)
    q = params.compute_q(x)
    memory_length = self.memory_length(context)
    incremental = context.mode == transformer.INCREMENTAL
    if incremental:
      m = x
    else:
      m = mtf.replace_dimensions(x, context.length_dim, memory_length)
    if self.shared_kv:
      kv = params.compute_kv(m)
    else:
      k = params.compute_k(m)
      v = params.compute_v(m)
    if incremental:
      one_hot = mtf.one_hot(
          context.position, memory_length, dtype=context.activation_dtype)
      inv_one_hot = 1.0 - one_hot
      if self.shared_kv:
        old_kv, = context.get_states(1)
        kv = old_kv * inv_one_hot + kv * one_hot
      else:
        old_k, old_v = context.get_states(2)
        k = old_k * inv_one_hot + k * one_hot
        v = old_v * inv_one_hot + v * one_hot
      memory_position = mtf.range(context.mesh, memory_length, tf.int32)
    else:
      memory_position = self.rename_length_to_memory_length(
          _position(context), context)
    if context.mode in (transformer.INCREMENTAL, transformer.FIRST_PART):
      context.record_new_states([kv] if self.shared_kv else [k, v])
    if self.shared_kv:
      k = kv
      v = kv
    o = self.attention_fn(
        q, k, v, context=context, memory_length_dim=memory_length,
        key_dim=self.kv_dim, value_dim=self.kv_dim,
        bias=self.compute_bias(context, memory_position, x,
                               params.query_heads_dims, q),
        **self.attention_kwargs_from_context(context))
    attention_output_shape = self.expected_attention_output_shape(x, params)
    attention_output = params.compute_output(
        o, output_shape=attention_output_shape)
    return self.layer_output_from_attention_output(context, attention_output,
                                                   losses)

  def compute_bias(self, context, memory_position, x, heads_dims, q):
    """The attention bias: visibility masks plus relative position biases.

    Masks (-1e9 where hidden): relative positions outside
    [min_relative_position, max_relative_position]; read_priority of the
    query below write_priority of the memory position; a different
    sequence (subsequence_id if given, else sequence_id) in packed
    examples. Then, with relative_attention_type, a learned bias per
    head and relative-position bucket (T5).

    Args:
      context: a transformer.Context.
      memory_position: an int32 Tensor with the memory_length dimension.
      x: the query antecedent.
      heads_dims: a list of Dimensions (the query heads).
      q: the queries (for "contextual" relative attention).

    Returns:
      a Tensor, or None when there is nothing to add.
    """
    del x
    min_relative_position = self.min_relative_position(context)
    max_relative_position = self.max_relative_position(context)
    relative_position = memory_position - _position(context)
    # The masks are combined before they become one bias: fewer ops, and
    # the same attention weights as one -1e9 bias per mask.
    masks = []
    if min_relative_position is not None:
      masks.append(mtf.greater_equal(relative_position,
                                     min_relative_position))
    if max_relative_position is not None:
      masks.append(mtf.less_equal(relative_position, max_relative_position))
    if context.read_priority is not None:
      masks.append(mtf.greater_equal(
          context.read_priority,
          self.rename_length_to_memory_length(context.write_priority,
                                              context)))
    sequence_id = None
    # A subsequence id (several targets per input) limits each target to
    # itself; it is only set in decoders.
    if isinstance(context.subsequence_id, mtf.Tensor):
      sequence_id = context.subsequence_id
    elif isinstance(context.sequence_id, mtf.Tensor):
      sequence_id = context.sequence_id
    if sequence_id is not None and context.length_dim in sequence_id.shape:
      masks.append(mtf.equal(
          _query_sequence_id(context, sequence_id),
          self.rename_length_to_memory_length(sequence_id, context)))
    biases = []
    if masks:
      visible = masks[0]
      for mask in masks[1:]:
        visible = mtf.logical_and(visible, mask)
      biases.append(attention.visibility_mask_to_attention_bias(
          visible, context.activation_dtype))
    if self.relative_attention_type is not None:
      biases.append(self._relative_attention_bias(
          context, relative_position, heads_dims, q,
          (min_relative_position, max_relative_position)))
    return mtf.add_n(biases) if biases else None

  def _relative_attention_bias(self, context, relative_position, heads_dims,
                               q, visibility_key):
    """The learned bias of each head for each relative-position bucket."""
    buckets_dim = mtf.Dimension(
        "buckets", self.relative_attention_num_buckets)
    rp_bucket = relative_position_bucket(
        relative_position,
        bidirectional=not context.model.fully_autoregressive,
        num_buckets=buckets_dim.size)
    if self.relative_attention_type in ("bias", "bias_shared"):
      shared_key = None
      if self.relative_attention_type == "bias_shared":
        shared_key = ("self_attention_bias",) + tuple(visibility_key) + (
            tuple(heads_dims),)
      values = _relative_bias_variable(context, "relative_attention_bias",
                                       heads_dims + [buckets_dim], shared_key)
    else:  # "contextual"
      values = mtf.layers.dense(
          q, reduced_dims=[self.kv_dim],
          new_dims=[buckets_dim],
          variable_dtype=context.variable_dtype,
          name="relative_attention_ak",
          use_bias=False,
          expert_dims=_ensemble_dims(context) + heads_dims)
    return mtf.gather(values, rp_bucket, buckets_dim)

  @property
  def kv_dim(self):
    return mtf.Dimension("d_kv", self.key_value_size)

  def memory_length(self, context):
    """The keys' and values' length dimension ("memory_length")."""
    return mtf.Dimension("memory_length", context.length_dim.size)

  def rename_length_to_memory_length(self, x, context):
    """x with context.length_dim replaced by memory_length (x unchanged
    when it has no length dimension, as in "incremental" mode)."""
    if context.length_dim not in x.shape.dims:
      return x
    return mtf.replace_dimensions(
        x, context.length_dim, self.memory_length(context))

  def min_relative_position(self, context):
    """Hook: the smallest visible memory - query position, or None."""
    del context
    return None

  def max_relative_position(self, context):
    """Hook: the largest visible memory - query position, or None."""
    del context
    return None

  @property
  def attention_fn(self):
    if self.attention_func == "hybrid":
      return attention.hybrid_attention
    return attention.attention


def relative_position_bucket(relative_position,
                              bidirectional=True,
                              num_buckets=32,
                              max_distance=128):
  """T5's bucket of each relative position (memory - query position).

  Small distances get a bucket each; larger ones share logarithmically
  wider buckets; all distances from max_distance on share the last one.
  Bidirectional attention spends half the buckets on positive relative
  positions; otherwise positive relative positions count as 0.

  Args:
    relative_position: an int32 Tensor.
    bidirectional: a boolean.
    num_buckets: an integer.
    max_distance: an integer.

  Returns:
    an int32 Tensor like relative_position, with values in [0, num_buckets).
  """
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += mtf.to_int32(mtf.less(n, 0)) * num_buckets
    n = mtf.abs(n)
  else:
    n = mtf.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = mtf.less(n, max_exact)
  # max(n, max_exact) only keeps log() finite where the small branch wins.
  val_if_large = max_exact + mtf.to_int32(
      mtf.log(mtf.to_float(mtf.maximum(n, max_exact)) / max_exact)
      / math.log(max_distance / max_exact) * (num_buckets - max_exact))
  val_if_large = mtf.minimum(val_if_large, num_buckets - 1)
  ret += mtf.where(is_small, n, val_if_large)
  return ret


@gin.configurable(module=_GIN_MODULE)
def relative_position_spans(context, num_sentinels=gin.REQUIRED):
  """Relative positions from targets to inputs of a span-filling task.

  The inputs are a text with spans replaced by single sentinels (the last
  `num_sentinels` ids of the vocabulary); the targets are the dropped spans,
  each after its sentinel. A target token is placed at its sentinel in the
  inputs (tokens before any sentinel at the input's start), and the result
  is that place minus each input position. In "incremental" mode (the
  targets have no length) every target is placed at the start.

  Args:
    context: a transformer.Context (inputs, encoder_inputs, sequence ids).
    num_sentinels: an integer, as the vocabulary's extra_ids.

  Returns:
    an int32 Tensor with the encoder's "memory_length" dimension.
  """
  decoder_id = context.inputs
  encoder_id = context.encoder_inputs
  decoder_length = context.length_dim
  encoder_length = context.encoder_length_dim
  mesh = encoder_id.mesh
  encoder_pos = mtf.range(mesh, encoder_length, tf.int32)
  if decoder_length not in decoder_id.shape.dims:
    dec_to_enc_pos = 0
  else:
    vocab_size = context.model.input_vocab_size_unpadded

    def sentinel_mask(t):
      return mtf.cast(mtf.greater_equal(t, vocab_size - num_sentinels),
                      tf.int32)

    encoder_segment_id = mtf.cumsum(sentinel_mask(encoder_id), encoder_length)
    decoder_segment_id = mtf.cumsum(sentinel_mask(decoder_id), decoder_length)
    if context.encoder_sequence_id is not None:
      # Segments of different packed sequences must not match.
      multiplier = max(encoder_length.size, decoder_length.size)
      encoder_segment_id += context.encoder_sequence_id * multiplier
      decoder_segment_id += context.sequence_id * multiplier
    dec_to_enc_pos = mtf.reduce_sum(
        mtf.cast(mtf.less(encoder_segment_id, decoder_segment_id), tf.int32),
        reduced_dim=encoder_length)
  return dec_to_enc_pos - encoder_pos


@gin.configurable(module=_GIN_MODULE)
def enc_dec_attention_bias(layer,
                           context,
                           heads_dims,
                           relative_position_fn=relative_position_spans):
  """The bias of encoder-decoder attention.

  Hides encoder positions of other packed sequences, and with the layer's
  relative_attention_type "bias" or "bias_shared" adds a learned bias per
  head and bucket of `relative_position_fn(context)`.

  Args:
    layer: the attention layer (its relative_attention_* settings).
    context: a transformer.Context.
    heads_dims: a list of Dimensions.
    relative_position_fn: fn(context) -> int32 relative positions.

  Returns:
    a Tensor or None.
  """
  biases = []
  if isinstance(context.encoder_sequence_id, mtf.Tensor):
    if isinstance(context.sequence_id, mtf.Tensor):
      visible = mtf.equal(_query_sequence_id(context, context.sequence_id),
                          context.encoder_sequence_id)
    else:
      # Decoding: one sequence per row (sequence id the int 1), so the
      # decoder sees the encoder positions of sequence 1, never padding.
      visible = mtf.equal(context.encoder_sequence_id,
                          context.sequence_id or 1)
    biases.append(attention.visibility_mask_to_attention_bias(
        visible, context.activation_dtype))
  if layer.relative_attention_type in ("bias", "bias_shared"):
    buckets_dim = mtf.Dimension(
        "buckets", layer.relative_attention_num_buckets)
    shared_key = None
    if layer.relative_attention_type == "bias_shared":
      shared_key = ("enc_dec_relative_attention_bias", tuple(heads_dims))
    values = _relative_bias_variable(
        context, "enc_dec_relative_attention_bias", heads_dims + [buckets_dim],
        shared_key)
    rp_bucket = relative_position_bucket(
        relative_position_fn(context), bidirectional=True,
        num_buckets=buckets_dim.size)
    biases.append(mtf.gather(values, rp_bucket, buckets_dim))
  elif layer.relative_attention_type is not None:
    raise ValueError(
        f"enc_dec_attention_bias: unrecognized relative_attention_type "
        f"{layer.relative_attention_type!r} of {type(layer).__name__}")
  return mtf.add_n(biases) if biases else None


@gin.configurable(module=_GIN_MODULE)
def enc_dec_attention(self_attention_layer, memory_antecedent, context, x,
                      losses, attention_fn=attention.attention):
  """Multi-head attention from x to the encoder output memory_antecedent.

  The keys and values come from memory_antecedent (dimension
  "memory_length"); in "first_part" mode they are recorded as a constant
  decoding state, and in "incremental" mode read back from it.

  Args:
    self_attention_layer: the layer (a SelfAttention) whose parameters and
      hooks to use.
    memory_antecedent: a Tensor with "memory_length" and d_model.
    context: a transformer.Context.
    x: the query antecedent.
    losses: a list or None (passed to the layer's output hook).
    attention_fn: the attention function.

  Returns:
    a Tensor shaped like x.
  """
  memory_input_dim = memory_antecedent.shape[-1]
  if memory_input_dim != context.model.model_dim:
    raise NotImplementedError(
        f"enc_dec_attention: the encoder output's channels "
        f"{memory_input_dim} differ from the decoder's "
        f"{context.model.model_dim}; different d_model in encoder and "
        "decoder is not supported")
  layer = self_attention_layer
  params = layer.make_params(context)
  q = params.compute_q(x)
  if context.mode == transformer.INCREMENTAL:
    k, v, memory_length = context.get_constant_state()
  else:
    m = memory_antecedent
    if layer.shared_kv:
      k = v = params.compute_kv(m)
    else:
      k = params.compute_k(m)
      v = params.compute_v(m)
    memory_lengths = [d for d in m.shape.dims if d.name == "memory_length"]
    if len(memory_lengths) != 1:
      raise mtf.ShapeError(
          f"enc_dec_attention: the encoder output {m.shape} needs one "
          "'memory_length' dimension")
    memory_length, = memory_lengths
    if context.mode == transformer.FIRST_PART:
      context.record_constant_state((k, v, memory_length))
  bias = enc_dec_attention_bias(layer, context, params.query_heads_dims)
  a = attention_fn(
      q, k, v, memory_length, layer.kv_dim, layer.kv_dim, bias,
      context=context, **layer.attention_kwargs_from_context(context))
  attention_output = params.compute_output(
      a, output_shape=layer.expected_attention_output_shape(x, params))
  return layer.layer_output_from_attention_output(
      context, attention_output, losses)


class EncDecMixin:
  """Makes an attention layer attend to the encoder's output.

  Mixed in before a self-attention class: the memory is
  context.encoder_output, and the constructor takes the original's
  (relative_attention_type, **kwargs) of every encoder-decoder attention
  layer (`EncDecAttention` and the encoder-decoder variants of the other
  attention families).
  """

  def __init__(self, relative_attention_type=None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type,
                     **kwargs)

  def _get_memory_antecedent(self, context):
    return context.encoder_output


@gin.configurable(module=_GIN_MODULE)
class EncDecAttention(EncDecMixin, SelfAttention):
  """Multi-head attention over the encoder's output (context.encoder_output).

  Takes SelfAttention's arguments; relative_attention_type "bias" buckets
  `relative_position_spans` (see `enc_dec_attention_bias`).
  """

  def call(self, context, x, losses=None):
    """Attends from x to the encoder output."""
    return enc_dec_attention(self, self._get_memory_antecedent(context),
                             context, x, losses,
                             attention_fn=self.attention_fn)

  @property
  def attention_fn(self):
    return attention.attention
