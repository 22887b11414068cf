"""TPU collective back end of SimdMeshImpl.

Every TPU core runs the same program under replication; collectives name
their groups with replica ids. Mesh TensorFlow numbers processors
logically, so each group assignment and source/target pair is mapped
through `logical_to_physical` before it reaches a TPU op (member order is
kept: it is the concatenation order).

TF 2.21 exposes four TPU collectives (`CrossReplicaSum`, `AllToAll`,
`CollectivePermute`, and XLA's `XlaReduceScatter`), with limited dtypes.
The rest is built on them, exactly:
  * all_gather: every member writes its x into its own block of a zero
    tensor and the group sums; one non-zero term per element, and the data
    travel as int32 words (bitcast), so every dtype arrives bit for bit
    (including -0.0, NaNs and denormals, which a float sum could change).
  * MAX / MIN (and SUM of 64-bit types): all_gather, then reduce locally.
  * all_to_all / permute of dtypes the TPU may not move (bool, 64-bit,
    8/16-bit): packed into int32 words and unpacked after.
  * reduce_scatter of float32, int32 and bfloat16 (summed as all_reduce
    sums it) is XlaReduceScatter; other dtypes, or primitives without
    `reduce_scatter`, all_reduce and keep the member's block.
Unlike the original library, float32 all_to_all is not rounded to bfloat16
and int32 sums are not computed in float32.
"""

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.ops import gen_xla_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu.ops import tpu_ops  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow.backend import slice_utils

_REDUCTIONS = ("SUM", "MAX", "MIN")

# Dtypes that AllToAll / CollectivePermute move as they are on TPU.
_NATIVE_MOVE_DTYPES = (tf.float32, tf.bfloat16, tf.int32)

# Dtypes summed after widening to int32 (and narrowed back: wrap-around
# arithmetic, as the dtype's own addition).
_SMALL_INT_DTYPES = (tf.int8, tf.uint8, tf.int16, tf.uint16)


class TpuPrimitives:
  """The TPU collective ops (physical replica ids); replaced in tests."""

  def cross_replica_sum(self, x, group_assignment):
    return tpu_ops.cross_replica_sum(x, group_assignment)

  def all_to_all(self, x, concat_dimension, split_dimension, split_count,
                 group_assignment):
    return tpu_ops.all_to_all(
        x, concat_dimension=concat_dimension, split_dimension=split_dimension,
        split_count=split_count, group_assignment=group_assignment)

  def collective_permute(self, x, source_target_pairs):
    return tpu_ops.collective_permute(x, source_target_pairs)

  def reduce_scatter(self, x, scatter_dimension, group_assignment,
                     reduce_op):
    """XLA ReduceScatter: member k of a group gets block k of the
    reduction ("Add", "Max", "Min") on `scatter_dimension`."""
    return gen_xla_ops.xla_reduce_scatter(
        x, group_assignment, scatter_dimension, reduce_op)


# ---------------------------------------------------------------- packing


def _bitcast_unit(dtype):
  """The integer dtype (1 or 2 bytes) that dtype is bitcast through."""
  return {1: tf.uint8, 2: tf.int16}[dtype.size]


def _pack_rows(rows):
  """[r, c] of any dtype -> [r, w] int32 words holding the same bits.

  Elements of 4 bytes or more are bitcast (8-byte elements give two
  words); 1- and 2-byte elements are packed 4 or 2 to a word, padding the
  row with zeros.
  """
  dtype = rows.dtype
  if dtype == tf.int32:
    return rows
  if dtype == tf.bool:
    rows = tf.cast(rows, tf.uint8)
    dtype = tf.uint8
  if dtype.size >= 4:
    words = tf.bitcast(rows, tf.int32)
    if dtype.size == 4:
      return words
    return tf.reshape(words, [tf.shape(rows)[0], -1])
  per_word = 4 // dtype.size
  units = rows if dtype == _bitcast_unit(dtype) else tf.bitcast(
      rows, _bitcast_unit(dtype))
  pad = (-tf.shape(units)[1]) % per_word
  units = tf.pad(units, [[0, 0], [0, pad]])
  return tf.bitcast(tf.reshape(units, [tf.shape(units)[0], -1, per_word]),
                    tf.int32)


def _unpack_rows(words, dtype, row_size):
  """Inverse of `_pack_rows`: [r, w] int32 -> [r, row_size] of dtype."""
  if dtype == tf.int32:
    return words
  wire_dtype = tf.uint8 if dtype == tf.bool else dtype
  if wire_dtype.size >= 4:
    per_element = wire_dtype.size // 4
    if per_element > 1:
      words = tf.reshape(words, [tf.shape(words)[0], -1, per_element])
    return tf.bitcast(words, wire_dtype)
  units = tf.bitcast(words, _bitcast_unit(wire_dtype))  # [r, w, per_word]
  units = tf.reshape(units, [tf.shape(units)[0], -1])[:, :row_size]
  if dtype == tf.bool:
    return tf.cast(units, tf.bool)
  if wire_dtype == _bitcast_unit(wire_dtype):
    return units
  return tf.bitcast(units, wire_dtype)


def _shape(t):
  """t's shape: a list of ints if known, else a tensor."""
  if t.shape.is_fully_defined():
    return slice_utils.static_shape(t)
  return tf.shape(t)


def _num_elements(t):
  """t's number of elements: an int if known, else a scalar tensor."""
  if t.shape.is_fully_defined():
    return t.shape.num_elements()
  return tf.size(t)


# ------------------------------------------------------------ collectives


class TpuCollectives:
  """Collectives among TPU cores (one SPMD program, replicated).

  Args:
    logical_to_physical: permutation list, logical processor number ->
      physical replica id.
    pnum_fn: returns the logical processor number (int32 scalar tensor) of
      the program being traced.
    allreduce_in_bfloat16_max_group_size: bfloat16 sums over larger groups
      are done in float32 (precision), smaller ones in bfloat16 (speed).
    primitives: the TPU ops (default `TpuPrimitives()`); an object with
      `cross_replica_sum`, `all_to_all` and `collective_permute`, and
      optionally `reduce_scatter`.

  Raises:
    ValueError: if logical_to_physical is not a permutation of
      range(len(logical_to_physical)).
  """

  name = "tpu"

  def __init__(self, logical_to_physical, pnum_fn,
               allreduce_in_bfloat16_max_group_size=8, primitives=None):
    l2p = [int(p) for p in logical_to_physical]
    if sorted(l2p) != list(range(len(l2p))):
      raise ValueError(
          f"TpuCollectives: logical_to_physical={list(logical_to_physical)} "
          f"is not a permutation of range({len(l2p)}).")
    self._l2p = l2p
    self._pnum_fn = pnum_fn
    self._bf16_max_group_size = allreduce_in_bfloat16_max_group_size
    self._primitives = (TpuPrimitives() if primitives is None
                        else primitives)
    self._groups_cache = {}

  @property
  def logical_to_physical(self):
    return list(self._l2p)

  @property
  def primitives(self):
    return self._primitives

  # ---------------------------------------------------------- groups

  def _groups(self, group_assignment):
    """(group size, physical assignment, member-index table) of groups.

    The table gives, for each logical processor, its position in its
    group. Groups must partition the processors and be of equal size (as
    TPU collectives require).
    """
    key = tuple(tuple(int(m) for m in g) for g in group_assignment)
    cached = self._groups_cache.get(key)
    if cached is not None:
      return cached
    num = len(self._l2p)
    members = [m for g in key for m in g]
    sizes = {len(g) for g in key}
    if (len(sizes) != 1 or sorted(members) != list(range(num))):
      raise ValueError(
          f"TpuCollectives: group_assignment {[list(g) for g in key]} must "
          f"split the {num} processors into groups of equal size.")
    index = np.zeros([num], np.int32)
    for g in key:
      for position, member in enumerate(g):
        index[member] = position
    physical = [[self._l2p[m] for m in g] for g in key]
    cached = (sizes.pop(), physical, index)
    self._groups_cache[key] = cached
    return cached

  def _member_index(self, index_table):
    return tf.gather(tf.constant(index_table), self._pnum_fn())

  # ------------------------------------------------------- all_reduce

  def all_reduce(self, x, group_assignment, reduction):
    """Reduces x ("SUM", "MAX" or "MIN") within each group.

    Integer and bool results are exact; bool SUM is logical or.
    """
    if reduction not in _REDUCTIONS:
      raise ValueError(f"Unknown reduction {reduction!r}; expected one of "
                       f"{_REDUCTIONS}.")
    x = tf.convert_to_tensor(x)
    group_size, physical, _ = self._groups(group_assignment)
    if reduction != "SUM":
      stacked = self.all_gather(x[tf.newaxis], group_assignment)
      if x.dtype == tf.bool:
        fn = tf.reduce_any if reduction == "MAX" else tf.reduce_all
      else:
        fn = tf.reduce_max if reduction == "MAX" else tf.reduce_min
      return fn(stacked, axis=0)
    return self._sum(x, group_assignment, group_size, physical)

  def _sum(self, x, group_assignment, group_size, physical):
    """SUM all-reduce with the dtype policy of the module docstring."""
    crs = self._primitives.cross_replica_sum
    dtype = x.dtype
    if dtype in (tf.float32, tf.int32):
      return crs(x, physical)
    if dtype == tf.bfloat16:
      if group_size > self._bf16_max_group_size:
        return tf.cast(crs(tf.cast(x, tf.float32), physical), tf.bfloat16)
      return crs(x, physical)
    if dtype == tf.float16:
      return tf.cast(crs(tf.cast(x, tf.float32), physical), dtype)
    if dtype == tf.uint32:
      # Two's-complement addition is addition modulo 2**32.
      return tf.bitcast(crs(tf.bitcast(x, tf.int32), physical), tf.uint32)
    if dtype == tf.bool or dtype in _SMALL_INT_DTYPES:
      return tf.cast(crs(tf.cast(x, tf.int32), physical), dtype)
    # 64-bit and complex types: gather exactly, add locally.
    return tf.reduce_sum(self.all_gather(x[tf.newaxis], group_assignment),
                         axis=0)

  # --------------------------------------------------- reduce_scatter

  def reduce_scatter(self, x, group_assignment, reduction):
    """Member k of a group gets the reduction ("SUM", "MAX", "MIN") of
    block k (axis 0) of every member's x; axis 0 shrinks group-size
    times."""
    if reduction not in _REDUCTIONS:
      raise ValueError(f"Unknown reduction {reduction!r}; expected one of "
                       f"{_REDUCTIONS}.")
    x = tf.convert_to_tensor(x)
    n, physical, index_table = self._groups(group_assignment)
    first = slice_utils.static_shape(x)[0] if x.shape.rank else None
    if x.shape.rank == 0 or (first is not None and first % n):
      raise ValueError(
          f"TpuCollectives.reduce_scatter: axis 0 of x (shape {x.shape}) "
          f"must split into {n} blocks, one per group member.")
    scatter = getattr(self._primitives, "reduce_scatter", None)
    op = {"SUM": "Add", "MAX": "Max", "MIN": "Min"}[reduction]
    if scatter is not None and x.dtype in (tf.float32, tf.int32):
      return scatter(x, 0, physical, op)
    if scatter is not None and x.dtype == tf.bfloat16:
      if reduction == "SUM" and n > self._bf16_max_group_size:
        return tf.cast(scatter(tf.cast(x, tf.float32), 0, physical, op),
                       tf.bfloat16)
      return scatter(x, 0, physical, op)
    reduced = self.all_reduce(x, group_assignment, reduction)
    shape = _shape(x)
    if isinstance(shape, list):
      blocks = tf.reshape(reduced, [n, shape[0] // n] + shape[1:])
    else:
      blocks = tf.reshape(reduced,
                          tf.concat([[n, shape[0] // n], shape[1:]], 0))
    return tf.gather(blocks, self._member_index(index_table))

  # ------------------------------------------------------- all_gather

  def all_gather(self, x, group_assignment):
    """The group members' x concatenated on axis 0, in group order."""
    x = tf.convert_to_tensor(x)
    if x.shape.rank == 0:
      raise ValueError("TpuCollectives.all_gather needs a tensor of rank "
                       ">= 1 (it concatenates on axis 0).")
    n, physical, index_table = self._groups(group_assignment)
    row_size = _num_elements(x)
    words = _pack_rows(tf.reshape(x, [1, -1]))
    position = self._member_index(index_table)
    block = tf.pad(words, [[position, n - 1 - position], [0, 0]])
    summed = self._primitives.cross_replica_sum(block, physical)
    rows = _unpack_rows(summed, x.dtype, row_size)
    shape = _shape(x)
    if isinstance(shape, list):
      return tf.reshape(rows, [n * shape[0]] + shape[1:])
    gathered = tf.reshape(rows, tf.concat([[n * shape[0]], shape[1:]], 0))
    static = slice_utils.static_shape(x)
    gathered.set_shape([None if static[0] is None else n * static[0]] +
                       static[1:])
    return gathered

  # ------------------------------------------------------- all_to_all

  def all_to_all(self, x, group_assignment):
    """Member k gets block k (axis 0) of every member's x, concatenated on
    axis 0 in group order."""
    x = tf.convert_to_tensor(x)
    n, physical, _ = self._groups(group_assignment)
    rank = x.shape.rank
    first = slice_utils.static_shape(x)[0] if rank else None
    if rank == 0 or (first is not None and first % n):
      raise ValueError(
          f"TpuCollectives.all_to_all: axis 0 of x (shape {x.shape}) must "
          f"split into {n} blocks, one per group member.")
    send = self._primitives.all_to_all
    if x.dtype in _NATIVE_MOVE_DTYPES:
      result = send(x, 0, 0, n, physical)
      result.set_shape(x.shape)
      return result
    row_size = _num_elements(x) // n
    words = _pack_rows(tf.reshape(x, [n, -1]))
    received = send(words, 0, 0, n, physical)
    result = tf.reshape(_unpack_rows(received, x.dtype, row_size),
                        _shape(x))
    result.set_shape(x.shape)
    return result

  # ---------------------------------------------------------- permute

  def permute(self, x, source_target_pairs, group_assignment=None):
    """Sends x of each source to its target; non-targets get zeros.

    Args:
      x: a tf.Tensor.
      source_target_pairs: (source, target) logical processor numbers;
        each processor is at most one source and at most one target.
      group_assignment: the groups the pairs stay within (informational:
        the TPU op takes only pairs); checked when given.

    Returns:
      a tf.Tensor like x.
    """
    x = tf.convert_to_tensor(x)
    pairs = [(int(s), int(t)) for s, t in source_target_pairs]
    num = len(self._l2p)
    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    if (len(set(sources)) != len(sources) or
        len(set(targets)) != len(targets) or
        any(not 0 <= p < num for p in sources + targets)):
      raise ValueError(
          f"TpuCollectives.permute: bad source_target_pairs {pairs}: each "
          f"processor in range({num}) may be one source and one target.")
    if group_assignment is not None:
      self._groups(group_assignment)
      group_of = {m: i for i, g in enumerate(group_assignment) for m in g}
      if any(group_of[s] != group_of[t] for s, t in pairs):
        raise ValueError(
            f"TpuCollectives.permute: pairs {pairs} leave the groups "
            f"{[list(g) for g in group_assignment]}.")
    if not pairs:
      return tf.zeros_like(x)
    physical = [[self._l2p[s], self._l2p[t]] for s, t in pairs]
    send = self._primitives.collective_permute
    if x.dtype in _NATIVE_MOVE_DTYPES:
      return send(x, physical)
    row_size = _num_elements(x)
    received = send(_pack_rows(tf.reshape(x, [1, -1])), physical)
    result = tf.reshape(_unpack_rows(received, x.dtype, row_size),
                        _shape(x))
    result.set_shape(x.shape)
    return result
