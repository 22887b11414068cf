"""Local (blocked) self-attention: 1-D sequences and 2-D images.

Part of `mesh_tensorflow.layers` (re-exported there), as in the original.

A long dimension is cut into blocks; each block attends to itself and to
its neighbouring blocks. The blocks dimension may be split across the mesh:
`mtf.halo_exchange` / `mtf.left_halo_exchange` bring each processor the
neighbouring keys and values it needs, so a split layout gives the
one-processor answer while only neighbours talk. Past the ends of the
sequence (or image) the exchanged keys and values are zeros; as in the
original, these zero memory positions are not masked (they enter the
softmax with logit 0 and contribute nothing to the output).

Variables are those of `multihead_attention_vars` (one "qkvo" variable) in
the layer's scope.
"""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import attention_layers
from mesh_tensorflow.layers import layer_helpers

__all__ = [
    "attention_bias_local_2d_block",
    "local_1d_halo_exchange",
    "local_2d_halo_exchange",
    "local_2d_self_attention_spatial_blocks",
    "local_self_attention_spatial_blocks",
    "masked_local_attention_1d",
    "masked_local_attention_1d_incremental",
]

_MASKED = -1e9


def _self_attention_qkvo(x, params, heads, kv_channels, master_dtype,
                         slice_dtype, qkv_dims):
  """(q, k, v, wo) of self-attention over x, q, k and v shaped qkv_dims.

  The weights are `params` or, when it is None, the layer's variables.
  """
  if params is None:
    params = attention_layers.layer_attention_vars(
        x, heads, kv_channels, master_dtype, slice_dtype)
  wq, wk, wv, wo = params
  q, k, v = attention_layers.project_qkv(wq, wk, wv, x, x,
                                         mtf.Shape(qkv_dims))
  return q, k, v, wo


def masked_local_attention_1d(x, kv_channels, heads, is_training=False,
                              window_size=128, master_dtype=tf.float32,
                              slice_dtype=tf.float32, length_per_split=None,
                              return_kv=None, params=None, name=None):
  """Causal local self-attention over blocks of the length dimension.

  The length is cut into blocks of block_length positions, the largest
  divisor of length_per_split not above max(window_size, 128). Each block
  sees itself and the `window_size` positions before it (left halo
  exchange); position p attends to the positions q with
  p - block_length < q <= p among those, i.e. to (p - window_size, p] when
  block_length equals window_size. Positions before the sequence start
  are zero keys and values, not masked (the original's choice).

  The blocks dimension takes the length dimension's name, so a layout that
  splits the length splits the blocks in the same way; pass
  length_per_split (the length each processor holds) so that no block
  straddles two processors.

  Args:
    x: an mtf Tensor batch_dims + [length, io_channels].
    kv_channels: the per-head key/value Dimension.
    heads: the heads Dimension.
    is_training: unused (no dropout here); the original's parameter.
    window_size: how many earlier positions a block sees.
    master_dtype, slice_dtype: the variables' dtypes (when params is None).
    length_per_split: the length each processor holds when the length
      dimension is split; default the whole length.
    return_kv: optional list; the full-length keys and values
      batch_dims + [heads, length, kv_channels] are appended to it (e.g. to
      fill the cache of `masked_local_attention_1d_incremental`).
    params: optional (wq, wk, wv, wo), each [heads, io_channels,
      kv_channels], used instead of creating variables.
    name: the variable scope; None for "masked_local_attention_1d" made
      unique.

  Returns:
    an mtf Tensor of x's shape.

  Raises:
    ShapeError: length_per_split does not divide the length.
  """
  del is_training
  batch_dims = x.shape.dims[:-2]
  length, io_channels = x.shape.dims[-2:]
  if length_per_split is None:
    length_per_split = length.size
  if length_per_split < 1 or length.size % length_per_split:
    raise mtf.ShapeError(
        f"masked_local_attention_1d of {x.name} {x.shape}: length_per_split "
        f"{length_per_split} must divide {length}.")
  block_length = max(window_size, 128)
  while length_per_split % block_length:
    block_length -= 1
  with layer_helpers.variable_scope(
      x.mesh, name, "masked_local_attention_1d"):
    q, k, v, wo = _self_attention_qkvo(
        x, params, heads, kv_channels, master_dtype, slice_dtype,
        batch_dims + [heads, length, kv_channels])
    if return_kv is not None:
      return_kv.extend([k, v])
    num_blocks = mtf.Dimension(length.name, length.size // block_length)
    query_block = mtf.Dimension("query_block_length", block_length)
    memory_block = mtf.Dimension("memory_block_length", block_length)
    q = mtf.reshape(q, batch_dims + [heads, num_blocks, query_block,
                                     kv_channels])
    kv_shape = batch_dims + [heads, num_blocks, memory_block, kv_channels]
    k = mtf.left_halo_exchange(mtf.reshape(k, kv_shape), num_blocks,
                               memory_block, window_size)
    v = mtf.left_halo_exchange(mtf.reshape(v, kv_shape), num_blocks,
                               memory_block, window_size)
    # In a block's memory, query r sits at r + window_size.
    memory_pos = mtf.range(
        x.mesh, mtf.Dimension(memory_block.name, window_size + block_length),
        tf.int32)
    query_pos = mtf.range(x.mesh, query_block, tf.int32) + window_size
    hidden = (mtf.cast(mtf.greater(memory_pos, query_pos), x.dtype)
              + mtf.cast(mtf.less_equal(memory_pos, query_pos - block_length),
                         x.dtype))
    o = attention_layers.dot_product_attention(q, k, v, hidden * _MASKED)
    o = mtf.reshape(o, batch_dims + [heads, length, kv_channels])
    return mtf.einsum([o, wo], x.shape)


def masked_local_attention_1d_incremental(x, prev_k, prev_v, step_num,
                                          master_dtype=None, slice_dtype=None,
                                          params=None, name=None):
  """One decoding step of `masked_local_attention_1d`.

  The caches hold the keys and values of the last window_length positions
  in a ring: position step_num is written at step_num mod window_length
  and the query attends to the whole cache (zeros before the sequence
  start, as in the full layer). With window_length equal to the full
  layer's window_size and block length, decoding step by step gives the
  full layer's outputs.

  Args:
    x: this step's input, batch_dims + [io_channels].
    prev_k: the key cache batch_dims + [heads, window_length, kv_channels].
    prev_v: the value cache, shaped as prev_k.
    step_num: the position being decoded: a scalar integer mtf Tensor or a
      Python int.
    master_dtype, slice_dtype: the variables' dtypes (when params is None;
      default float32 master, float32 slices).
    params: optional (wq, wk, wv, wo) used instead of creating variables.
    name: the variable scope; None for "masked_local_attention_1d" made
      unique (use the full layer's name to share its variables).

  Returns:
    (y, k, v): y of x's shape and the updated caches.
  """
  batch_dims = x.shape.dims[:-1]
  heads, window_length, kv_channels = prev_k.shape.dims[-3:]
  step_num = attention_layers.as_step(x.mesh, step_num)
  with layer_helpers.variable_scope(
      x.mesh, name, "masked_local_attention_1d"):
    q, k, v, wo = _self_attention_qkvo(
        x, params, heads, kv_channels, master_dtype, slice_dtype,
        batch_dims + [heads, kv_channels])
    current = mtf.equal(mtf.range(x.mesh, window_length, dtype=tf.int32),
                        mtf.mod(step_num, window_length.size))
    k = mtf.where(current, k, prev_k, output_shape=prev_k.shape)
    v = mtf.where(current, v, prev_v, output_shape=prev_v.shape)
    o = attention_layers.dot_product_attention(q, k, v, None)
    return mtf.einsum([o, wo], x.shape), k, v


def _halo(t, blocks_dim, block_dim, halo_size, mask_right):
  """t's blocks grown by halo_size neighbouring entries: from the left
  only when mask_right, else from both sides; zero padding when blocks_dim
  is None (one block)."""
  if halo_size <= 0:
    return t
  if blocks_dim is not None:
    exchange = mtf.left_halo_exchange if mask_right else mtf.halo_exchange
    return exchange(t, blocks_dim, block_dim, halo_size)
  return mtf.pad(t, [halo_size, 0 if mask_right else halo_size],
                 block_dim.name)


def local_1d_halo_exchange(k, v, num_w_blocks, w_dim, mask_right):
  """Keys and values of local 1-D attention grown by their neighbours.

  Each block of w_dim positions gets the whole previous block prepended
  (and, unless mask_right, the whole next block appended): w_dim grows to
  2 (or 3) times its size. With num_w_blocks None there is one block,
  padded with zeros.

  Args:
    k, v: mtf Tensors with dimensions [num_w_blocks,] w_dim.
    num_w_blocks: the Dimension numbering the blocks (may be split across
      the mesh), or None.
    w_dim: the Dimension inside a block (must not be split).
    mask_right: whether only the left neighbour is needed (causal).

  Returns:
    (k, v) grown along w_dim.
  """
  return (_halo(k, num_w_blocks, w_dim, w_dim.size, mask_right),
          _halo(v, num_w_blocks, w_dim, w_dim.size, mask_right))


def local_2d_halo_exchange(k, v, num_h_blocks, h_dim, num_w_blocks, w_dim,
                           mask_right):
  """`local_1d_halo_exchange` along the height blocks, then the width
  blocks: each block also gets its diagonal neighbours' entries.

  Args:
    k, v: mtf Tensors with dimensions [num_h_blocks, num_w_blocks,] h_dim,
      w_dim.
    num_h_blocks, num_w_blocks: the Dimensions numbering the blocks (may be
      split), or None for one block (zero padding).
    h_dim, w_dim: the Dimensions inside a block.
    mask_right: whether only the blocks above and to the left are needed.

  Returns:
    (k, v) with h_dim and w_dim grown 2 (mask_right) or 3 times.
  """
  for blocks_dim, block_dim in [(num_h_blocks, h_dim),
                                (num_w_blocks, w_dim)]:
    k = _halo(k, blocks_dim, block_dim, block_dim.size, mask_right)
    v = _halo(v, blocks_dim, block_dim, block_dim.size, mask_right)
  return k, v


def _memory_name(dim):
  return "memory_" + dim.name


def _spatial_blocks_qkv(query_antecedent, heads, kv_channels, master_dtype,
                        slice_dtype, blocks_dims, block_dims):
  """(q, k, v, wo) of self-attention within spatial blocks, before halos.

  The memory is the query with each dimension of `block_dims` (the
  positions inside a block) renamed "memory_" + its name. q is [batch,
  heads, blocks_dims..., block_dims..., kv_channels]; k and v have the
  memory's dimensions in place of block_dims.
  """
  wq, wk, wv, wo = attention_layers.layer_attention_vars(
      query_antecedent, heads, kv_channels, master_dtype, slice_dtype)
  memory = query_antecedent
  for dim in block_dims:
    memory = mtf.rename_dimension(memory, dim.name, _memory_name(dim))
  memory_dims = [memory.shape.get_dim_by_name(_memory_name(dim))
                 for dim in block_dims]
  blocks = [query_antecedent.shape.dims[0], heads] + blocks_dims
  q, k, v = attention_layers.project_qkv(
      wq, wk, wv, query_antecedent, memory,
      mtf.Shape(blocks + block_dims + [kv_channels]),
      mtf.Shape(blocks + memory_dims + [kv_channels]))
  return q, k, v, wo


def local_self_attention_spatial_blocks(
    query_antecedent, kv_channels, heads, is_training=False,
    memory_w_dim=None, mask_right=False, master_dtype=tf.float32,
    slice_dtype=tf.float32, name=None):
  """Self-attention within blocks of a sequence and their neighbours.

  Each block of w_dim positions attends to itself and the previous block
  (mask_right: causally, see `attention_bias_local_block`) or to the
  previous, own and next blocks (not mask_right, no mask).

  Args:
    query_antecedent: an mtf Tensor [batch, num_w_blocks, w_dim,
      io_channels]; num_w_blocks may be split across the mesh.
    kv_channels: the per-head key/value Dimension.
    heads: the heads Dimension.
    is_training: unused (no dropout here); the original's parameter.
    memory_w_dim: unused, as in the original: the memory dimension is named
      "memory_" + w_dim.name.
    mask_right: whether a position may not attend to later positions.
    master_dtype, slice_dtype: the variables' dtypes.
    name: the variable scope; None for "multihead_attention" made unique.

  Returns:
    an mtf Tensor of query_antecedent's shape.

  Raises:
    ShapeError: query_antecedent is not 4-D.
  """
  del is_training, memory_w_dim
  if query_antecedent.shape.ndims != 4:
    raise mtf.ShapeError(
        f"local_self_attention_spatial_blocks: query_antecedent "
        f"{query_antecedent.shape} must be [batch, num_w_blocks, w_dim, "
        "io_channels].")
  _, num_w_blocks, w_dim, _ = query_antecedent.shape.dims
  mesh = query_antecedent.mesh
  with layer_helpers.variable_scope(
      mesh, name, "multihead_attention"):
    q, k, v, wo = _spatial_blocks_qkv(
        query_antecedent, heads, kv_channels, master_dtype, slice_dtype,
        [num_w_blocks], [w_dim])
    memory_w_dim = k.shape.dims[-2]
    k, v = local_1d_halo_exchange(k, v, num_w_blocks, memory_w_dim,
                                  mask_right)
    mask = None
    if mask_right:
      mask = attention_layers.attention_bias_local_block(mesh, w_dim,
                                                         memory_w_dim)
    o = attention_layers.dot_product_attention(q, k, v, mask)
    return mtf.einsum([o, wo], query_antecedent.shape)


def attention_bias_local_2d_block(mesh, h_dim, w_dim, memory_h_dim,
                                  memory_w_dim, dtype=tf.int32):
  """The causal bias for 2-D local attention over blocks in raster order.

  The memory of a block is, after a left halo exchange in height and in
  width, the 2x2 blocks ending in the query's own: memory rows [0, h) are
  the blocks above, columns [0, w) the blocks to the left, and
  [h, 2h) x [w, 2w) the query's own block. Everything in the neighbouring
  blocks comes earlier and is visible; in its own block a query sees the
  positions up to itself in raster (row-major) order.

  (The original builds this bias from a comparison of memory rows with
  memory columns that does not involve the query and does not lower; this
  is the bias its docstring describes.)

  Args:
    mesh: an mtf Mesh.
    h_dim, w_dim: the query Dimensions within a block.
    memory_h_dim, memory_w_dim: Dimensions whose names the memory takes;
      their sizes become 2 * h_dim.size and 2 * w_dim.size.
    dtype: the integer dtype of the position comparisons.

  Returns:
    a float32 mtf Tensor [h_dim, w_dim, memory_h_dim, memory_w_dim]: -1e9
    where a query may not attend, else 0.
  """
  memory_h = mtf.Dimension(memory_h_dim.name, 2 * h_dim.size)
  memory_w = mtf.Dimension(memory_w_dim.name, 2 * w_dim.size)
  # Memory coordinates relative to the query's block (negative: before).
  row = mtf.range(mesh, memory_h, dtype) - h_dim.size
  col = mtf.range(mesh, memory_w, dtype) - w_dim.size
  query_row = mtf.range(mesh, h_dim, dtype)
  query_col = mtf.range(mesh, w_dim, dtype)

  def flag(t):
    return mtf.cast(t, dtype)

  in_own_block = flag(mtf.greater_equal(row, 0)) * flag(
      mtf.greater_equal(col, 0))
  later = flag(mtf.greater(row, query_row)) + flag(
      mtf.equal(row, query_row)) * flag(mtf.greater(col, query_col))
  hidden = mtf.greater(
      mtf.multiply(in_own_block, later,
                   output_shape=mtf.Shape([h_dim, w_dim, memory_h,
                                           memory_w])), 0)
  return mtf.cast(hidden, tf.float32) * _MASKED


def local_2d_self_attention_spatial_blocks(
    query_antecedent, kv_channels, heads, is_training=False,
    memory_h_dim=None, memory_w_dim=None, mask_right=False,
    master_dtype=tf.float32, slice_dtype=tf.float32, name=None):
  """Self-attention within 2-D blocks of an image and their neighbours.

  Each block of h_dim x w_dim positions attends over the blocks around it:
  with mask_right the 2x2 blocks ending in its own (above-left, above,
  left, own; causal in raster order, see `attention_bias_local_2d_block`),
  else the 3x3 blocks centred on it (no mask). The softmax runs over all of
  these memory positions together. (The original contracts the memory
  height before its softmax, attending over memory columns only; this is
  the 2-D attention its docstring describes.)

  Args:
    query_antecedent: an mtf Tensor [batch, num_h_blocks, num_w_blocks,
      h_dim, w_dim, io_channels]; the blocks dimensions may be split.
    kv_channels, heads, is_training, mask_right, master_dtype, slice_dtype,
      name: as in `local_self_attention_spatial_blocks`.
    memory_h_dim, memory_w_dim: unused, as in the original: the memory
      dimensions are named "memory_" + h_dim.name and "memory_" +
      w_dim.name.

  Returns:
    an mtf Tensor of query_antecedent's shape.

  Raises:
    ShapeError: query_antecedent is not 6-D.
  """
  del is_training, memory_h_dim, memory_w_dim
  if query_antecedent.shape.ndims != 6:
    raise mtf.ShapeError(
        f"local_2d_self_attention_spatial_blocks: query_antecedent "
        f"{query_antecedent.shape} must be [batch, num_h_blocks, "
        "num_w_blocks, h_dim, w_dim, io_channels].")
  batch, num_h_blocks, num_w_blocks, h_dim, w_dim, _ = (
      query_antecedent.shape.dims)
  mesh = query_antecedent.mesh
  with layer_helpers.variable_scope(
      mesh, name, "multihead_attention"):
    q, k, v, wo = _spatial_blocks_qkv(
        query_antecedent, heads, kv_channels, master_dtype, slice_dtype,
        [num_h_blocks, num_w_blocks], [h_dim, w_dim])
    memory_h_dim, memory_w_dim = k.shape.dims[-3:-1]
    k, v = local_2d_halo_exchange(k, v, num_h_blocks, memory_h_dim,
                                  num_w_blocks, memory_w_dim, mask_right)
    # One memory dimension over both memory axes, for one softmax.
    memory_h_dim, memory_w_dim = k.shape.dims[-3:-1]
    blocks = [batch, heads, num_h_blocks, num_w_blocks]
    memory_dim = mtf.Dimension(
        f"memory_{h_dim.name}_{w_dim.name}",
        memory_h_dim.size * memory_w_dim.size)
    k = mtf.reshape(k, blocks + [memory_dim, kv_channels])
    v = mtf.reshape(v, blocks + [memory_dim, kv_channels])
    mask = None
    if mask_right:
      mask = mtf.reshape(
          attention_bias_local_2d_block(mesh, h_dim, w_dim, memory_h_dim,
                                        memory_w_dim),
          [h_dim, w_dim, memory_dim])
    o = attention_layers.dot_product_attention(q, k, v, mask)
    return mtf.einsum([o, wo], query_antecedent.shape)
