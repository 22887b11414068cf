"""Classic (T2T-style) attention layers: masks, dot-product and multihead.

Pure mtf code, as in the original `mesh_tensorflow/layers.py`: functions take
and return mtf Tensors and create their variables with `mtf.get_variable`
inside a `tf.compat.v1.variable_scope`. As in the original, a multihead
attention layer owns one variable "multihead_attention/qkvo" [4, heads,
io_channels, kv_channels] (`multihead_attention_vars`).

Masks are additive biases: 0 where attention is allowed and -1e9 where it is
not. Queries run along a dimension named "length" and memories along one
named "memory_length"; `rename_length_to_memory_length` converts.

`mesh_tensorflow.layers` re-exports the public functions, so users call
e.g. `mtf.layers.multihead_attention`; this module takes its shared helpers
from `layer_helpers`, not from `layers`. Local (blocked) attention lives in
`local_attention_layers`.
"""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import layer_helpers
from mesh_tensorflow.randomness import tf_initializers

__all__ = [
    "attention_bias_local_block",
    "attention_mask_autoregressive",
    "attention_mask_ignore_padding",
    "attention_mask_same_segment",
    "compress_mean",
    "dot_product_attention",
    "multihead_attention",
    "multihead_attention_params",
    "multihead_attention_vars",
    "multihead_encdec_attention_incremental",
    "multihead_self_attention_incremental",
    "multihead_self_attention_memory_compressed",
    "rename_length_to_memory_length",
]

# The bias that removes a position from a softmax.
_MASKED = -1e9


def rename_length_to_memory_length(x, length_name="length",
                                   memory_length_name="memory_length"):
  """`x` with its dimension `length_name` renamed `memory_length_name`."""
  return mtf.rename_dimension(x, length_name, memory_length_name)


def attention_mask_ignore_padding(inputs, dtype=tf.float32):
  """A bias that hides padding (id 0) memory positions.

  Args:
    inputs: an integer mtf Tensor of token ids with a "length" dimension
      (e.g. [batch, length]); 0 is padding.
    dtype: the bias dtype.

  Returns:
    an mtf Tensor of inputs' shape with "length" renamed "memory_length":
    -1e9 at padding, else 0.
  """
  inputs = rename_length_to_memory_length(inputs)
  return mtf.cast(mtf.equal(inputs, 0), dtype) * _MASKED


def attention_mask_autoregressive(query_pos, dtype=tf.float32):
  """A bias that hides memory positions after the query position.

  Args:
    query_pos: an integer mtf Tensor of positions with a "length" dimension
      (e.g. `mtf.range(mesh, length, tf.int32)`).
    dtype: the bias dtype.

  Returns:
    an mtf Tensor with query_pos's dimensions plus "memory_length": -1e9
    where memory_pos > query_pos, else 0.
  """
  memory_pos = rename_length_to_memory_length(query_pos)
  return mtf.cast(mtf.less(query_pos, memory_pos), dtype) * _MASKED


def attention_mask_same_segment(query_segment, memory_segment=None,
                                dtype=tf.float32):
  """A bias that hides memory positions in another segment (packed inputs).

  Args:
    query_segment: an integer mtf Tensor of segment ids with a "length"
      dimension.
    memory_segment: the memory's segment ids, with a "length" dimension
      (renamed here); default query_segment (self-attention).
    dtype: the bias dtype.

  Returns:
    an mtf Tensor with the dimensions of both (memory's "length" as
    "memory_length"): -1e9 where the segments differ, else 0.
  """
  if memory_segment is None:
    memory_segment = query_segment
  memory_segment = rename_length_to_memory_length(memory_segment)
  return mtf.cast(mtf.not_equal(query_segment, memory_segment),
                  dtype) * _MASKED


def attention_bias_local_block(mesh, block_length, memory_length,
                               dtype=tf.int32):
  """The bias for local attention from a block to itself and the one before.

  Memory is the previous block (all visible) followed by the query's own
  block (visible up to the query position).

  Args:
    mesh: an mtf Mesh.
    block_length: the query Dimension within a block.
    memory_length: a Dimension whose name the memory takes; its size
      becomes 2 * block_length.size.
    dtype: the dtype of the position comparison (an integer type).

  Returns:
    a float32 mtf Tensor [block_length, memory_length(2 * block)], -1e9
    where a query may not attend, else 0.
  """
  memory_length = mtf.Dimension(memory_length.name, block_length.size)
  previous_block = mtf.zeros(mesh, [block_length, memory_length], dtype=dtype)
  own_block = mtf.cast(
      mtf.less(mtf.range(mesh, block_length, dtype=dtype),
               mtf.range(mesh, memory_length, dtype=dtype)), dtype)
  mask = mtf.concat([previous_block, own_block], memory_length.name)
  return mtf.cast(mask, tf.float32) * _MASKED


def dot_product_attention(q, k, v, mask, is_training=False, dropout=0.0,
                          dropout_broadcast_dims=None, extra_logit=None):
  """softmax(q k + mask) v over the memory dimension.

  Args:
    q: an mtf Tensor [..., length_q, depth_k].
    k: an mtf Tensor [..., length_kv, depth_k].
    v: an mtf Tensor [..., length_kv, depth_v].
    mask: an additive bias broadcastable to the logits
      [..., length_q, length_kv], or None.
    is_training: dropout is applied only when training.
    dropout: the rate of dropout on the attention weights.
    dropout_broadcast_dims: Dimensions over which the dropout mask is shared.
    extra_logit: optional float: a logit for an extra, always-zero memory
      position (lets a query attend to nothing).

  Returns:
    an mtf Tensor [..., length_q, depth_v].

  Raises:
    ShapeError: q and k do not share their last (depth) dimension.
  """
  depth_k = q.shape.dims[-1]
  if k.shape.dims[-1] != depth_k:
    raise mtf.ShapeError(
        f"dot_product_attention: q {q.name} {q.shape} and k {k.name} "
        f"{k.shape} must end in the same depth dimension.")
  length_kv = k.shape.dims[-2]
  logits = mtf.einsum([q, k], mtf.Shape(q.shape.dims[:-1] + [length_kv]))
  if mask is not None:
    logits += mtf.cast(mask, logits.dtype)
  weights = mtf.softmax(logits, length_kv, extra_logit=extra_logit)
  if is_training and dropout != 0.0:
    broadcast_dims = layer_helpers.as_list(
        dropout_broadcast_dims)
    weights = mtf.dropout(weights, is_training, rate=dropout,
                          noise_shape=weights.shape - broadcast_dims)
  depth_v = v.shape.dims[-1]
  return mtf.einsum([weights, v], mtf.Shape(q.shape.dims[:-1] + [depth_v]))


def _normal_initializer(stddev, seed):
  """N(0, stddev^2) values, the same on every layout and every trace: the
  original's tf.random_normal_initializer, seeded (see tf_initializers)."""
  return tf_initializers.seeded("random_normal_initializer", seed, stream=2,
                                stddev=stddev)


def multihead_attention_params(mesh, heads, io_channels, kv_channels,
                               variable_dtype, combine=False):
  """The variables of a multihead attention layer, in the current scope.

  As in the original, all four have shape [heads, io_channels, kv_channels]
  (einsum does not mind the order). They are normal with standard
  deviations io^-0.5 kv^-0.25 (q, k: the logits get variance ~1), io^-0.5
  (v) and (io heads)^-0.5 (o, the original's choice), seeded by the
  variables' scoped names so every layout and trace starts alike.

  Args:
    mesh: an mtf Mesh.
    heads: the heads Dimension.
    io_channels: the model Dimension.
    kv_channels: the per-head key/value Dimension.
    variable_dtype: an mtf.VariableDType.
    combine: one variable "qkvo" [qkvo(4), heads, io_channels, kv_channels]
      instead of four "q", "k", "v", "o" (fewer, larger variables),
      unstacked here.

  Returns:
    (wq, wk, wv, wo) mtf Tensors in variable_dtype.activation_dtype.
  """
  qk_stddev = (io_channels.size ** -0.5) * (kv_channels.size ** -0.25)
  v_stddev = io_channels.size ** -0.5
  o_stddev = (io_channels.size * heads.size) ** -0.5
  shape = mtf.Shape([heads, io_channels, kv_channels])
  if combine:
    qkvo = mtf.Dimension("qkvo", 4)
    seed = layer_helpers.name_seed("qkvo")

    def qkvo_initializer(shape, dtype=tf.float32):
      shape = list(shape)
      stddevs = tf.reshape(
          tf.constant([qk_stddev, qk_stddev, v_stddev, o_stddev],
                      tf.float32), [4] + [1] * (len(shape) - 1))
      values = tf.random.stateless_normal(shape, seed=[seed, 2]) * stddevs
      return tf.cast(values, dtype)

    var = mtf.get_variable(mesh, "qkvo", mtf.Shape([qkvo]) + shape,
                           initializer=qkvo_initializer, dtype=variable_dtype)
    params = mtf.unstack(var, qkvo)
  else:
    params = []
    for name, stddev in [("q", qk_stddev), ("k", qk_stddev),
                         ("v", v_stddev), ("o", o_stddev)]:
      init = _normal_initializer(
          stddev, layer_helpers.name_seed(name))
      params.append(mtf.get_variable(mesh, name, shape, initializer=init,
                                     dtype=variable_dtype))
  return tuple(mtf.cast(p, variable_dtype.activation_dtype) for p in params)


def multihead_attention_vars(mesh, heads, io_channels, kv_channels,
                             master_dtype, slice_dtype, activation_dtype):
  """`multihead_attention_params(..., combine=True)` with the dtypes given
  one by one (the original's older interface): one variable "qkvo"."""
  return multihead_attention_params(
      mesh, heads, io_channels, kv_channels,
      mtf.VariableDType(master_dtype, slice_dtype, activation_dtype),
      combine=True)


def layer_attention_vars(x, heads, kv_channels, master_dtype, slice_dtype):
  """`multihead_attention_vars` for input x, whose last dim is io.

  The (wq, wk, wv, wo) of every attention layer here and in
  `local_attention_layers`.
  """
  return multihead_attention_vars(
      x.mesh, heads, x.shape.dims[-1], kv_channels,
      tf.float32 if master_dtype is None else master_dtype,
      slice_dtype, x.dtype)


def project_qkv(wq, wk, wv, query_antecedent, memory_antecedent, q_shape,
                kv_shape=None):
  """(q, k, v): the query projected by wq, the memory by wk and wv.

  Shared with `local_attention_layers`.

  Args:
    wq, wk, wv: weights, as `layer_attention_vars` returns them.
    query_antecedent: an mtf Tensor whose last dimension is io_channels.
    memory_antecedent: likewise (the query itself for self-attention).
    q_shape: the Shape of q.
    kv_shape: the Shape of k and v; default q_shape.

  Returns:
    (q, k, v) mtf Tensors.
  """
  kv_shape = q_shape if kv_shape is None else kv_shape
  return (mtf.einsum([query_antecedent, wq], q_shape),
          mtf.einsum([memory_antecedent, wk], kv_shape),
          mtf.einsum([memory_antecedent, wv], kv_shape))


def multihead_attention(query_antecedent, memory_antecedent, mask,
                        kv_channels, heads, is_training=False, dropout=0.0,
                        dropout_broadcast_dims=None, master_dtype=tf.float32,
                        slice_dtype=tf.float32, name="multihead_attention"):
  """Multihead dot-product attention with its own variables (unscaled:
  the q and k initializers carry the 1/sqrt(kv) factor).

  Variables: f"{name}/qkvo" (`multihead_attention_vars`), as in the
  original.

  Args:
    query_antecedent: an mtf Tensor [batch_dims..., query_length,
      io_channels].
    memory_antecedent: an mtf Tensor [batch_dims..., memory_length,
      io_channels], or None for self-attention (the query with its length
      dimension renamed "memory_length").
    mask: an additive bias broadcastable to [batch_dims..., heads,
      query_length, memory_length], or None.
    kv_channels: the per-head key/value Dimension.
    heads: the heads Dimension.
    is_training: dropout is applied only when training.
    dropout: the rate of dropout on the attention weights.
    dropout_broadcast_dims: Dimensions over which the dropout mask is shared.
    master_dtype, slice_dtype: the variables' dtypes.
    name: the variable scope; None for "multihead_attention" made unique.

  Returns:
    an mtf Tensor of query_antecedent's shape.

  Raises:
    ShapeError: the memory's batch or channel dimensions differ from the
      query's.
  """
  batch_dims = query_antecedent.shape.dims[:-2]
  query_length, io_channels = query_antecedent.shape.dims[-2:]
  if memory_antecedent is None:
    memory_antecedent = rename_length_to_memory_length(
        query_antecedent, query_length.name)
  memory_length, memory_channels = memory_antecedent.shape.dims[-2:]
  if memory_antecedent.shape.dims[:-2] != batch_dims:
    raise mtf.ShapeError(
        f"multihead_attention: memory_antecedent {memory_antecedent.shape} "
        f"must have the batch dimensions {batch_dims} of query_antecedent "
        f"{query_antecedent.shape}.")
  if memory_channels != io_channels:
    raise mtf.ShapeError(
        f"multihead_attention: memory_antecedent channels {memory_channels} "
        f"differ from query_antecedent channels {io_channels}.")
  with layer_helpers.variable_scope(
      query_antecedent.mesh, name, "multihead_attention"):
    wq, wk, wv, wo = layer_attention_vars(
        query_antecedent, heads, kv_channels, master_dtype, slice_dtype)
    q, k, v = project_qkv(
        wq, wk, wv, query_antecedent, memory_antecedent,
        mtf.Shape(batch_dims + [heads, query_length, kv_channels]),
        mtf.Shape(batch_dims + [heads, memory_length, kv_channels]))
    o = dot_product_attention(q, k, v, mask, is_training, dropout,
                              dropout_broadcast_dims)
    return mtf.einsum([o, wo], query_antecedent.shape)


def as_step(mesh, step_num):
  """`step_num` as an int32 mtf scalar (an int or one already)."""
  if isinstance(step_num, mtf.Tensor):
    return step_num
  return mtf.constant(mesh, step_num, mtf.Shape([]), dtype=tf.int32)


def multihead_self_attention_incremental(query_antecedent, prev_k, prev_v,
                                         step_num, master_dtype=tf.float32,
                                         slice_dtype=tf.float32,
                                         name="multihead_attention"):
  """One decoding step of autoregressive multihead self-attention.

  Uses the variables of `multihead_attention` with the same `name`.

  Args:
    query_antecedent: an mtf Tensor [batch_dims..., io_channels], this
      step's input.
    prev_k: the key cache [batch_dims..., heads, memory_length, kv_channels].
    prev_v: the value cache, shaped as prev_k.
    step_num: the position being decoded: a Python int or a scalar integer
      mtf Tensor.
    master_dtype, slice_dtype: the variables' dtypes.
    name: the variable scope.

  Returns:
    (y, k, v): y of query_antecedent's shape and the caches with this
    step's key and value written at position step_num.
  """
  batch_dims = query_antecedent.shape.dims[:-1]
  heads, memory_length, kv_channels = prev_k.shape.dims[-3:]
  mesh = query_antecedent.mesh
  step_num = as_step(mesh, step_num)
  with layer_helpers.variable_scope(
      mesh, name, "multihead_attention"):
    wq, wk, wv, wo = layer_attention_vars(
        query_antecedent, heads, kv_channels, master_dtype, slice_dtype)
    q, k, v = project_qkv(wq, wk, wv, query_antecedent, query_antecedent,
                          mtf.Shape(batch_dims + [heads, kv_channels]))
    one_hot = mtf.one_hot(step_num, memory_length, dtype=prev_k.dtype)
    k = prev_k + mtf.multiply(k, one_hot, output_shape=prev_k.shape)
    v = prev_v + mtf.multiply(v, one_hot, output_shape=prev_v.shape)
    mask = mtf.cast(
        mtf.greater(mtf.range(mesh, memory_length, dtype=tf.int32), step_num),
        q.dtype) * _MASKED
    o = dot_product_attention(q, k, v, mask)
    return mtf.einsum([o, wo], query_antecedent.shape), k, v


def multihead_encdec_attention_incremental(query_antecedent, wq, wo, k, v,
                                           mask, name="multihead_attention"):
  """One decoding step of attention over an encoded memory.

  The memory's keys and values are computed once, before decoding (e.g.
  from `multihead_attention_vars` and the encoder output); each step only
  projects its query.

  Args:
    query_antecedent: an mtf Tensor query_dims + [io_channels].
    wq: the query weights [heads, io_channels, kv_channels].
    wo: the output weights [heads, io_channels, kv_channels].
    k: the memory keys memory_dims + [heads, memory_length, kv_channels];
      memory_dims are a subset of query_dims.
    v: the memory values, shaped as k.
    mask: an additive bias broadcastable to the logits, or None.
    name: the name scope (no variables are created).

  Returns:
    an mtf Tensor of query_antecedent's shape.
  """
  del name  # No variables: the scope would name nothing.
  heads, _, kv_channels = k.shape.dims[-3:]
  query_dims = query_antecedent.shape.dims[:-1]
  q = mtf.einsum([query_antecedent, wq],
                 mtf.Shape(query_dims + [heads, kv_channels]))
  o = dot_product_attention(q, k, v, mask)
  return mtf.einsum([o, wo], query_antecedent.shape)


def compress_mean(x, dim, compression_factor):
  """x with `dim` shortened by averaging groups of compression_factor
  consecutive positions.

  Args:
    x: an mtf Tensor.
    dim: a Dimension of x.
    compression_factor: a positive int dividing dim.size.

  Returns:
    an mtf Tensor like x with dim of size dim.size // compression_factor
    (same name).

  Raises:
    ShapeError: dim is not a dimension of x, or compression_factor does not
      divide it.
  """
  dims = x.shape.dims
  if dim not in dims:
    raise mtf.ShapeError(f"compress_mean: {dim} is not a dimension of "
                         f"{x.name} {x.shape}.")
  if compression_factor < 1 or dim.size % compression_factor:
    raise mtf.ShapeError(
        f"compress_mean of {x.name} {x.shape}: compression_factor "
        f"{compression_factor} must be a positive divisor of {dim}.")
  pos = dims.index(dim)
  compressed = mtf.Dimension(dim.name, dim.size // compression_factor)
  factor = mtf.Dimension("compression_factor", compression_factor)
  x = mtf.reshape(x, mtf.Shape(dims[:pos] + [compressed, factor]
                               + dims[pos + 1:]))
  return mtf.reduce_mean(x, reduced_dim=factor)


def multihead_self_attention_memory_compressed(
    x, mask_right, compression_factor, kv_channels, heads, is_training=False,
    dropout=0.0, dropout_broadcast_dims=None, master_dtype=tf.float32,
    slice_dtype=tf.float32, name="multihead_attention"):
  """Self-attention to a memory shortened by `compress_mean`.

  The memory is x averaged over groups of compression_factor positions;
  with mask_right, a query sees only the groups that end at or before it.
  An extra zero logit lets a query attend to nothing (the first positions
  see no complete group). Variables: f"{name}/qkvo".

  Args:
    x: an mtf Tensor [batch_dims..., length, io_channels].
    mask_right: whether to hide groups that end after the query.
    compression_factor: an int dividing length.
    kv_channels, heads, is_training, dropout, dropout_broadcast_dims,
      master_dtype, slice_dtype: as in `multihead_attention`.
    name: the variable scope; None for "compressed_attention" made unique.

  Returns:
    an mtf Tensor of x's shape.
  """
  batch_dims = x.shape.dims[:-2]
  length, io_channels = x.shape.dims[-2:]
  with layer_helpers.variable_scope(
      x.mesh, name, "compressed_attention"):
    wq, wk, wv, wo = layer_attention_vars(x, heads, kv_channels,
                                          master_dtype, slice_dtype)
    memory = compress_mean(x, length, compression_factor)
    memory = rename_length_to_memory_length(memory, length.name)
    memory_length = memory.shape.dims[-2]
    q, k, v = project_qkv(
        wq, wk, wv, x, memory,
        mtf.Shape(batch_dims + [heads, length, kv_channels]),
        mtf.Shape(batch_dims + [heads, memory_length, kv_channels]))
    mask = None
    if mask_right:
      query_pos = mtf.range(x.mesh, length, dtype=tf.int32)
      # A group ends at its last position.
      memory_pos = (mtf.range(x.mesh, memory_length, dtype=tf.int32)
                    * compression_factor + (compression_factor - 1))
      mask = mtf.cast(mtf.greater(memory_pos, query_pos), x.dtype) * _MASKED
    o = dot_product_attention(q, k, v, mask, is_training, dropout,
                              dropout_broadcast_dims, extra_logit=0.0)
    return mtf.einsum([o, wo], mtf.Shape(batch_dims + [length, io_channels]))
