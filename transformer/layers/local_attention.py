"""Local attention: each position attends to a window of its neighbours.

Re-exported from `mesh_tensorflow.transformer.attention`.
"""

import mesh_tensorflow as mtf
import tensorflow as tf

from mesh_tensorflow.transformer.layers import multihead_attention


def local_attention_1d(q,
                       k,
                       v,
                       length_dim,
                       key_dim,
                       value_dim,
                       fully_autoregressive=True,
                       length_dim_num_splits=1,
                       radius=128,
                       sequence_id=1,
                       write_priority=None,
                       read_priority=None,
                       attention_kwargs=None):
  """Attention to a neighbourhood of each position.

  If fully_autoregressive, query position p sees memory positions in
  (p - radius, p]; otherwise in (p - radius, p + radius]. Positions of
  different sequences (sequence_id) never see each other, and if
  read_priority and write_priority are given, p sees m only where
  read_priority[p] >= write_priority[m].

  The length dimension is cut into blocks: [num_blocks, block], where
  num_blocks keeps the length dimension's name so that a layout splitting
  "length" splits the blocks the same way. Each block of keys and values
  gets the `radius` positions before it (and after it, when not
  autoregressive) from its neighbours through `mtf.left_halo_exchange` /
  `mtf.halo_exchange`, so the answer does not depend on how "length" is
  split, even when a processor's part is shorter than the radius.

  Args:
    q: a Tensor with length_dim and key_dim.
    k: a Tensor with length_dim and key_dim.
    v: an optional Tensor with length_dim and value_dim; None means v = k.
    length_dim: a Dimension.
    key_dim: a Dimension (channels of q and k).
    value_dim: a Dimension (channels of v).
    fully_autoregressive: a boolean.
    length_dim_num_splits: an integer, a hint: in how many parts the layout
      splits length_dim, evenly or not (then the length is padded to
      equal parts). The block length is the largest divisor of one part
      not above max(radius, 128). The answer does not depend on it: any
      layout gives the same outputs; a matching hint keeps blocks from
      straddling processors, so that only the halos move.
    radius: an integer.
    sequence_id: a Tensor with length_dim, or an integer (one sequence).
    write_priority: an optional Tensor with length_dim.
    read_priority: an optional Tensor with length_dim.
    attention_kwargs: optional keyword arguments for `attention.attention`.

  Returns:
    a Tensor with the shape q.shape - key_dim + value_dim.
  """
  if length_dim_num_splits < 1:
    raise ValueError(f"local_attention_1d: length_dim_num_splits must be "
                     f">= 1, got {length_dim_num_splits}")
  if radius < 1:
    raise ValueError(f"local_attention_1d: radius must be >= 1, got {radius}")
  # A hint that does not divide the length (an uneven split) pads the
  # length to equal parts; the padding is never seen and sliced off.
  length = length_dim.size
  work_dim = mtf.Dimension(
      length_dim.name, -(-length // length_dim_num_splits) *
      length_dim_num_splits)
  padding = work_dim.size - length

  def to_work(x):
    if padding == 0 or length_dim not in x.shape.dims:
      return x
    return mtf.pad(x, [0, padding], length_dim.name)

  block_length = _block_length(work_dim.size, length_dim_num_splits,
                               max(radius, 128))
  query_block = mtf.Dimension("query_block_length", block_length)
  memory_block = mtf.Dimension("memory_block_length", block_length)
  num_blocks = mtf.Dimension(length_dim.name, work_dim.size // block_length)
  exchange = (mtf.left_halo_exchange if fully_autoregressive
              else mtf.halo_exchange)

  def reshape_query(x):
    return mtf.replace_dimensions(to_work(x), work_dim,
                                  [num_blocks, query_block])

  def reshape_memory(x):
    x = mtf.replace_dimensions(to_work(x), work_dim,
                               [num_blocks, memory_block])
    return exchange(x, num_blocks, memory_block, radius)

  mesh = q.mesh
  q = reshape_query(q)
  k = reshape_memory(k)
  v = k if v is None else reshape_memory(v)
  if sequence_id is None:
    sequence_id = 1
  if (not isinstance(sequence_id, mtf.Tensor) or
      length_dim not in sequence_id.shape.dims):
    sequence_id += mtf.zeros(mesh, [length_dim], tf.int32)
  pos = mtf.range(mesh, work_dim, dtype=tf.int32)
  q_pos = reshape_query(pos)
  # Positions are exchanged shifted by one so that the zeros the exchange
  # puts before the first block (and after the last) are told apart from
  # real positions and never seen.
  m_pos = reshape_memory(pos + 1)
  visible = mtf.greater(m_pos, 0)
  m_pos -= 1
  if padding:
    visible = mtf.logical_and(visible, mtf.less(m_pos, length))
  relative_position = m_pos - q_pos
  visible = mtf.logical_and(
      visible, mtf.equal(reshape_query(sequence_id),
                         reshape_memory(sequence_id)))
  visible = mtf.logical_and(visible, mtf.greater(relative_position, -radius))
  visible = mtf.logical_and(visible, mtf.less_equal(
      relative_position, 0 if fully_autoregressive else radius))
  if read_priority is not None:
    visible = mtf.logical_and(
        visible, mtf.greater_equal(reshape_query(read_priority),
                                   reshape_memory(write_priority)))
  padded_memory_block = mtf.Dimension(
      "memory_block_length",
      (1 if fully_autoregressive else 2) * radius + block_length)
  bias = multihead_attention.visibility_mask_to_attention_bias(
      visible, q.dtype)
  o = multihead_attention.attention(q, k, v, padded_memory_block, key_dim,
                                    value_dim, bias,
                                    **(attention_kwargs or {}))
  o = mtf.replace_dimensions(o, [num_blocks, query_block], work_dim)
  return mtf.slice(o, 0, length, length_dim.name) if padding else o


def _block_length(length, num_splits, longest):
  """The original's block length: the largest divisor of one part
  (length / num_splits, which num_splits divides) not above `longest`."""
  block = min(longest, length // num_splits)
  while (length // num_splits) % block:
    block -= 1
  return block
