"""Collectives on lists of per-device tensors (the original's ring functions).

Each function takes `xs`, one tf.Tensor per member of a group, and `devices`,
the member's device of each, and returns one result per member, computed on
that member's device. Members are arranged in a ring in list order: data
only moves between neighbours (member i and i +/- 1 mod n), which suits
links where neighbours are cheap (a ring or torus of accelerators). They are
re-exported by `placement_mesh_impl` under the original library's names;
PlacementMeshImpl uses `alltoall_pointtwise`, and the ring allreduce,
allconcat and reduce-scatter (`reduce_scatter_ring`, ours: the original had
none) with `allreduce_algorithm="ring"`.

For n members a ring function builds O(n^2) small ops (O(n) per member),
where a gather onto one member builds O(n).
"""

import functools

import tensorflow as tf

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils

# Below this many elements (or when the size does not divide by the group
# size) allreduce_ring reduces the whole tensor along one chain.
_MIN_SHARDED_SIZE = 1024


def binary_reduction(reduction_fn_string, dtype):
  """The pairwise function of "SUM", "MAX" or "MIN" for `dtype`.

  Booleans: MAX is logical or, MIN logical and (SUM is refused, as
  tf.add refuses booleans).

  Raises:
    ValueError: an unknown reduction.
  """
  dtype = tf.as_dtype(dtype)
  if dtype == tf.bool:
    table = {"MAX": tf.logical_or, "MIN": tf.logical_and}
  else:
    table = {"SUM": tf.add, "MAX": tf.maximum, "MIN": tf.minimum}
  if reduction_fn_string not in table:
    raise ValueError(
        f"Unknown reduction {reduction_fn_string!r} for dtype {dtype.name}; "
        f"expected one of {sorted(table)}.")
  return table[reduction_fn_string]


def _group_collective(fn):
  """Checks a collective's `xs` against its `devices`, as every one must.

  A group of one member needs no communication: it gets its tensor back.
  """

  @functools.wraps(fn)
  def checked(xs, devices, *args, **kwargs):
    what = fn.__name__
    if len(devices) != len(xs):
      raise ValueError(
          f"{what}: got {len(xs)} tensors but {len(devices)} devices; give "
          "one device per tensor.")
    if not xs:
      raise ValueError(f"{what}: needs at least one tensor.")
    if len(xs) == 1:
      return list(xs)
    return fn(xs, devices, *args, **kwargs)

  return checked


def _copy_to(device, x):
  with tf.device(device):
    return tf.identity(x)


def _on_each(devices, fn, *per_member):
  """[fn(per_member[0][i], ...) on devices[i] for every member i]."""
  out = []
  for i, device in enumerate(devices):
    with tf.device(device):
      out.append(fn(*(values[i] for values in per_member)))
  return out


def _split_each(xs, devices, axis):
  """Each member's tensor cut into len(xs) pieces on `axis`, on its device."""
  return _on_each(devices, lambda x: tf.split(x, len(xs), axis=axis), xs)


def _concat_each(devices, pieces, axis):
  """Each member's list of pieces concatenated on `axis`, on its device."""
  return _on_each(devices, lambda p: tf.concat(p, axis=axis), pieces)


@_group_collective
def allreduce_ring_single_shard(xs, devices, reduction_fn_string="SUM"):
  """Reduces `xs` and gives every member the result, along one chain.

  Partial results flow from both ends of the list towards the middle
  member(s), which combine them; the result then flows back out to both
  ends.

  Args:
    xs: n tf.Tensors of one shape and dtype.
    devices: n device strings.
    reduction_fn_string: "SUM", "MAX" or "MIN".

  Returns:
    n tf.Tensors, the i-th on devices[i].
  """
  n = len(xs)
  reduce_fn = binary_reduction(reduction_fn_string, xs[0].dtype)
  # The left chain takes members 0..left_middle, the right chain the rest;
  # the middle member(s) (one when n is odd) combine the two.
  left_middle, right_middle = (n - 1) // 2, n // 2
  left = xs[0]
  for i in range(1, left_middle + 1):
    with tf.device(devices[i]):
      left = reduce_fn(left, xs[i])
  right = xs[n - 1]
  for i in range(n - 2, left_middle, -1):
    with tf.device(devices[i]):
      right = reduce_fn(xs[i], right)
  out = [None] * n
  for middle in sorted({left_middle, right_middle}):
    with tf.device(devices[middle]):
      out[middle] = reduce_fn(left, right)
  for i in range(left_middle - 1, -1, -1):
    out[i] = _copy_to(devices[i], out[i + 1])
  for i in range(right_middle + 1, n):
    out[i] = _copy_to(devices[i], out[i - 1])
  return out


@_group_collective
def allreduce_ring(xs, devices, reduction_fn_string="SUM"):
  """Reduces `xs` and gives every member the result, over the whole ring.

  Each tensor is flattened and cut into n shards; shard k is reduced by
  `allreduce_ring_single_shard` on the ring rotated by k, so every member
  does an equal share of the work and every link carries about 2/n of the
  tensor each way. Small tensors (under 1024 elements) and sizes that do
  not divide by n take one chain.

  Args:
    xs: n tf.Tensors of one static shape and dtype.
    devices: n device strings.
    reduction_fn_string: "SUM", "MAX" or "MIN".

  Returns:
    n tf.Tensors, the i-th on devices[i].
  """
  n = len(xs)
  shape = slice_utils.static_shape(xs[0])
  size = None if None in shape else shape_lib.list_product(shape)
  if size is None or size < _MIN_SHARDED_SIZE or size % n:
    return allreduce_ring_single_shard(xs, devices, reduction_fn_string)
  # shards[i][k]: member i's shard k.
  shards = _split_each(
      _on_each(devices, lambda x: tf.reshape(x, [-1]), xs), devices, 0)
  reduced = [[None] * n for _ in range(n)]
  for k in range(n):
    order = [(i + k) % n for i in range(n)]
    ys = allreduce_ring_single_shard([shards[i][k] for i in order],
                                     [devices[i] for i in order],
                                     reduction_fn_string)
    for i, y in zip(order, ys):
      reduced[i][k] = y
  return _on_each(devices, lambda r: tf.reshape(tf.concat(r, axis=0), shape),
                  reduced)


@_group_collective
def reduce_scatter_ring(xs, devices, split_axis, reduction_fn_string="SUM"):
  """Member k gets piece k (of n on `split_axis`) of the reduction of `xs`.

  Piece k starts at member k+1 and travels once around the ring, each
  member on the way adding its own piece k, and ends at member k: every
  link carries (n-1)/n of a tensor, the bandwidth-optimal amount.

  Args:
    xs: n tf.Tensors of one shape and dtype; `split_axis` divides by n.
    devices: n device strings.
    split_axis: the axis to split on.
    reduction_fn_string: "SUM", "MAX" or "MIN".

  Returns:
    n tf.Tensors, the k-th on devices[k].
  """
  n = len(xs)
  reduce_fn = binary_reduction(reduction_fn_string, xs[0].dtype)
  pieces = _split_each(xs, devices, split_axis)
  out = []
  for k in range(n):
    total = pieces[(k + 1) % n][k]
    for hop in range(2, n + 1):
      member = (k + hop) % n
      with tf.device(devices[member]):
        total = reduce_fn(total, pieces[member][k])
    out.append(total)
  return out


@_group_collective
def allconcat_ring(xs, devices, concat_axis):
  """Gives every member the concatenation of `xs` on `concat_axis`.

  Each tensor travels around the ring in both directions, one hop at a
  time, until every member holds all of them.

  Args:
    xs: n tf.Tensors, equal in shape but for `concat_axis`.
    devices: n device strings.
    concat_axis: the axis to concatenate on.

  Returns:
    n tf.Tensors, the i-th on devices[i].
  """
  n = len(xs)
  have = [{i: xs[i]} for i in range(n)]  # have[member][source]
  for distance in range(1, n // 2 + 1):
    for member in range(n):
      for step in (1, -1):
        source = (member + step * distance) % n
        if source not in have[member]:
          neighbour = (member + step) % n
          have[member][source] = _copy_to(devices[member],
                                          have[neighbour][source])
  return _concat_each(devices, [[h[s] for s in range(n)] for h in have],
                      concat_axis)


@_group_collective
def alltoall_pointtwise(xs, devices, split_axis, concat_axis):
  """Member k gets piece k of every member's tensor, concatenated.

  Each member splits its tensor into n equal pieces on `split_axis`; piece
  k of member j goes straight to member k (point to point), which
  concatenates the pieces it gets in member order on `concat_axis`.

  Args:
    xs: n tf.Tensors of one shape; `split_axis` divides by n.
    devices: n device strings.
    split_axis: the axis to split on.
    concat_axis: the axis to concatenate on.

  Returns:
    n tf.Tensors, the i-th on devices[i].
  """
  n = len(xs)
  pieces = _split_each(xs, devices, split_axis)
  return _concat_each(devices, [[pieces[j][k] for j in range(n)]
                                for k in range(n)], concat_axis)


@_group_collective
def alltoall_ring(xs, devices, split_axis, concat_axis):
  """`alltoall_pointtwise`'s result, with data moving only between ring
  neighbours.

  Member i sends the pieces for the members 1, 2, ... hops ahead of it as
  one message forwards around the ring, and the pieces for those behind it
  as one message backwards; at every hop a member keeps the first piece of
  the message it receives (its own) and passes on the rest. The arguments
  and result are `alltoall_pointtwise`'s; the shape must be static.
  """
  n = len(xs)
  ahead = (n - 1) // 2  # Pieces travelling forwards (to i+1, ..., i+ahead).
  behind = n - 1 - ahead  # Pieces travelling backwards (to i-1, ...).
  received = [[None] * n for _ in range(n)]  # received[target][source]
  forward, backward = [], []
  for i, (x, device) in enumerate(zip(xs, devices)):
    with tf.device(device):
      pieces = tf.split(x, n, axis=split_axis)
      received[i][i] = pieces[i]
      forward.append(_join([pieces[(i + d) % n] for d in range(1, ahead + 1)],
                           split_axis))
      backward.append(_join(
          [pieces[(i - d) % n] for d in range(1, behind + 1)], split_axis))
  piece_size = slice_utils.static_shape(xs[0])[split_axis] // n
  for hop in range(1, max(ahead, behind) + 1):
    new_forward, new_backward = [None] * n, [None] * n
    for i, device in enumerate(devices):
      with tf.device(device):
        # A forward message comes from behind (i - 1), a backward one from
        # ahead (i + 1).
        for step, last_hop, messages, new_messages in (
            (-1, ahead, forward, new_forward),
            (1, behind, backward, new_backward)):
          if hop <= last_hop:
            mine, new_messages[i] = _split_first(
                messages[(i + step) % n], piece_size, split_axis)
            received[i][(i + step * hop) % n] = mine
    forward, backward = new_forward, new_backward
  return _concat_each(devices, received, concat_axis)


def _join(pieces, axis):
  if not pieces:
    return None
  return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=axis)


def _split_first(message, piece_size, axis):
  """(first piece, the rest or None) of a message on `axis`."""
  total = slice_utils.static_shape(message)[axis]
  if total == piece_size:
    return tf.identity(message), None
  mine, rest = tf.split(message, [piece_size, total - piece_size], axis=axis)
  return mine, rest


def reduce_list(xs, reduction_fn_string):
  """The reduction of same-shaped tensors `xs` on the current device."""
  if reduction_fn_string == "SUM" and xs[0].dtype != tf.bool:
    return tf.add_n(xs)
  return functools.reduce(binary_reduction(reduction_fn_string, xs[0].dtype),
                          xs)
