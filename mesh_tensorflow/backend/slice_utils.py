"""TensorFlow helpers that act on one slice of a laid-out tensor.

Slices have static shapes, so these helpers compute permutations and reshapes
in Python from the mtf shapes involved.

`static_shape` is where the shape of a TensorFlow tensor enters the lowering:
every lowering reads a slice's shape through it and gets Python ints. Under
`tf.compat.v1.disable_v2_behavior()` (or `disable_v2_tensorshape()`), which
programs written for TensorFlow 1 call, `tf.Tensor.shape[i]` is a v1
`Dimension`, which neither arithmetic with ints nor `tf.slice` accepts.

The guards at the end (`softmax`, `broadcastable`, `broadcast_to`,
`broadcasting`, `elementwise`, `tf_slice`, `tf_pad`) keep what reaches
TensorFlow within its kernels' rank limits, with oneDNN on or off
(docs/kernel_limits.md; tools/kernel_rank_audit.py checks them all).
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import shape as shape_lib


def static_shape(x):
  """The static shape of TF tensor (or TensorShape) `x` as a list.

  Each entry is a Python int, or None where the size is unknown, whichever
  TensorShape behaviour (v1 or v2) is on.

  Raises:
    ValueError: the rank of `x` is unknown.
  """
  shape = x if isinstance(x, tf.TensorShape) else x.shape
  if shape.rank is None:
    raise ValueError(f"The rank of {x!r} is unknown; the lowering needs "
                     "slices of known rank.")
  return shape.as_list()


def transpose_to(x, old_shape, new_shape):
  """Transposes slice `x` of `old_shape` to the dimension order `new_shape`.

  Both shapes hold the same dimensions.
  """
  old_names = old_shape.dimension_names
  perm = [old_names.index(name) for name in new_shape.dimension_names]
  if perm == list(range(len(perm))):
    return x
  return tf.transpose(x, perm)


def expand_to(x, old_shape, new_shape, leading_ones=True):
  """Lines slice `x` of `old_shape` up with `new_shape` for broadcasting.

  The dimensions of `old_shape` (a subset of `new_shape`'s) are put in the
  order of `new_shape` and size-1 axes are inserted for the others, so that
  TensorFlow broadcasting against a slice of `new_shape` is correct. With
  `leading_ones=False` none are inserted in front (broadcasting adds them),
  which saves a reshape when x's dimensions end `new_shape`; the result
  then has lower rank.
  """
  new_names = new_shape.dimension_names
  missing = [n for n in old_shape.dimension_names if n not in new_names]
  if missing:
    raise ValueError(f"Cannot expand {old_shape} to {new_shape}: "
                     f"{missing} are not in the target shape.")
  ordered = shape_lib.Shape(
      [d for d in new_shape if d.name in old_shape.dimension_names])
  x = transpose_to(x, old_shape, ordered)
  if len(ordered) == len(new_shape):
    return x
  slice_sizes = dict(zip(ordered.dimension_names, static_shape(x)))
  target = [slice_sizes.get(name, 1) for name in new_names]
  if not leading_ones:
    first = new_names.index(ordered.dimension_names[0]) if ordered else len(
        new_names)
    target = target[first:]
    if len(target) == len(ordered):
      return x
  return tf.reshape(x, target)


def reduce_to(x, old_shape, new_shape, reduce_fn=tf.reduce_sum):
  """Reduces slice `x` over the dimensions missing from `new_shape`, then
  transposes the rest to the order of `new_shape`."""
  new_names = new_shape.dimension_names
  axes = [i for i, name in enumerate(old_shape.dimension_names)
          if name not in new_names]
  if axes:
    x = reduce_fn(x, axis=axes)
  kept = shape_lib.Shape([d for d in old_shape if d.name in new_names])
  return transpose_to(x, kept, new_shape)


# Kernel rank limits. Each guard below changes nothing at or under its limit.
#
# oneDNN's Softmax kernel, which TensorFlow runs on CPUs with AVX-512 (or
# wherever TF_ENABLE_ONEDNN_OPTS=1), aborts on more than 5 dimensions:
# "Input dims must be <= 5 and >=1".
MAX_SOFTMAX_RANK = 5
# TensorFlow's broadcasting kernels (the binary element-wise ops and
# BroadcastTo; SelectV2 takes 8), with oneDNN on or off, first merge
# neighbouring axes that broadcast alike and then handle at most 5 of the
# resulting groups:
# "Broadcast between [2,1,2,1,2,1] and [1,2,1,2,1,2] is not supported yet."
MAX_BROADCAST_GROUPS = 5


def _product(sizes, dynamic_sizes):
  """The product of `sizes` (ints, or None where unknown statically)."""
  if None in sizes:
    return tf.reduce_prod(dynamic_sizes)
  return shape_lib.list_product(sizes)


def along_axis(fn, x, axis, max_rank):
  """fn(x', axis') for `fn` acting along one axis of x, within `max_rank`.

  An op that mixes entries along `axis` only (softmax, ...) gives the same
  result on x reshaped to [prod(axes before), n, prod(axes after)], with
  the axes after merged away when `axis` is last, or those before when it
  is first; the result is reshaped back to x's shape. That is how kernels
  with a rank limit see tensors of any rank. Ranks within `max_rank` pass
  through unchanged (no reshape). Sizes unknown statically (graph mode)
  are read at run time.
  """
  shape = static_shape(x)
  rank = len(shape)
  axis %= rank
  if rank <= max_rank:
    return fn(x, axis)
  dynamic = tf.shape(x) if None in shape else None
  before, after = shape[:axis], shape[axis + 1:]
  merged = []
  if before:
    merged.append(_product(before, None if dynamic is None else
                           dynamic[:axis]))
  merged.append(shape[axis] if shape[axis] is not None else dynamic[axis])
  if after:
    merged.append(_product(after, None if dynamic is None else
                           dynamic[axis + 1:]))
  if dynamic is not None:
    merged = tf.stack(merged)
  y = fn(tf.reshape(x, merged), 1 if before else 0)
  return tf.reshape(y, shape if dynamic is None else dynamic)


def softmax(x, axis):
  """tf.nn.softmax of slice `x` along `axis`, at any rank (see
  MAX_SOFTMAX_RANK and `along_axis`)."""
  return along_axis(lambda t, a: tf.nn.softmax(t, axis=a), x, axis,
                    MAX_SOFTMAX_RANK)


def broadcast_groups(shapes):
  """How many axis groups TensorFlow's broadcasting kernels would see.

  `shapes` are the static shapes of the operands (ints, or None where
  unknown; shorter ones are aligned on the right, as TensorFlow does).
  Axes of size 1 in the result are dropped and neighbouring axes in which
  the same operands broadcast are merged, as tensorflow/core/util/bcast.h
  does; an unknown size counts as not broadcast.
  """
  rank = max(len(s) for s in shapes)
  padded = [[1] * (rank - len(s)) + list(s) for s in shapes]
  groups, previous = 0, None
  for sizes in zip(*padded):
    if all(n == 1 for n in sizes):
      continue
    pattern = tuple(n == 1 for n in sizes)
    if pattern != previous:
      groups, previous = groups + 1, pattern
  return groups


def _tile_to(x, target):
  """Tiles slice `x` (axes of size 1 or of target's size; shorter shapes
  align on the right) to the static shape `target`."""
  shape = static_shape(x)
  if len(shape) < len(target):
    x = tf.reshape(x, [1] * (len(target) - len(shape)) + shape)
    shape = static_shape(x)
  return tf.tile(x, [t if s == 1 else 1 for s, t in zip(shape, target)])


def broadcastable(slices):
  """`slices` made fit for one TensorFlow broadcasting op, within
  MAX_BROADCAST_GROUPS.

  They broadcast against each other as they are when their broadcast
  pattern has at most MAX_BROADCAST_GROUPS groups (always, up to rank 5),
  and come back unchanged. Otherwise the operands that break the pattern
  most are tiled to the full result shape, one at a time, until it fits
  (Tile has no rank limit). Shapes unknown statically are left as they
  are: the lowering's slices have static shapes.
  """
  slices = list(slices)
  shapes = [static_shape(s) for s in slices]
  if (broadcast_groups(shapes) <= MAX_BROADCAST_GROUPS or
      any(None in s for s in shapes)):
    return slices
  rank = max(len(s) for s in shapes)
  padded = [[1] * (rank - len(s)) + s for s in shapes]
  target = [max(sizes) for sizes in zip(*padded)]
  while broadcast_groups(shapes) > MAX_BROADCAST_GROUPS:
    # Tile the operand whose tiling leaves the fewest groups.
    i = min((i for i, s in enumerate(shapes) if s != target),
            key=lambda i: broadcast_groups(shapes[:i] + [target] +
                                           shapes[i + 1:]))
    slices[i] = _tile_to(slices[i], target)
    shapes[i] = target
  return slices


def broadcast_to(x, shape):
  """tf.broadcast_to(x, shape) for slice `x` and a static `shape`, also
  beyond MAX_BROADCAST_GROUPS (see `broadcastable`)."""
  x_shape = static_shape(x)
  if (broadcast_groups([x_shape, list(shape)]) <= MAX_BROADCAST_GROUPS or
      None in x_shape):
    return tf.broadcast_to(x, shape)
  return _tile_to(x, list(shape))


# TensorFlow's default kernels of Slice, StridedSlice, Pad, SelectV2,
# ReverseV2 and of the activation gradients (ReluGrad, EluGrad, SeluGrad,
# LeakyReluGrad, SoftplusGrad) take at most 8 dimensions, with oneDNN on or
# off: "SliceOp : Unhandled input dimensions", "We only handle up to
# Tensor::dims() up to 8, not 9", "Broadcast between [...] is not supported
# yet" (SelectV2, even of equal shapes). The guards below merge
# neighbouring axes that the kernel treats alike, so that slices of any
# rank run; at or under the limit they change nothing.
MAX_KERNEL_RANK = 8
# TensorFlow's Pad takes at most 6 groups of padded and unpadded axes
# ("Only ranks up to 6 supported").
MAX_PAD_GROUPS = 6


def _static_or_error(x, what):
  """static_shape(x), which must be fully known for a guard to merge axes
  of a slice beyond MAX_KERNEL_RANK."""
  shape = static_shape(x)
  if None in shape:
    raise errors.ShapeError(
        f"{what} of a slice of rank {len(shape)} with sizes unknown "
        f"statically ({shape}): TensorFlow's kernel takes at most "
        f"{MAX_KERNEL_RANK} dimensions, and merging axes needs static "
        "sizes.")
  return shape


def broadcasting(fn, slices):
  """fn(*slices) for an element-wise, broadcasting `fn` (tf.where, a
  binary op, an activation gradient), at any rank.

  Up to MAX_KERNEL_RANK dimensions it is `fn(*slices)`. Beyond, slices
  are first tiled to at most MAX_BROADCAST_GROUPS groups of neighbouring
  axes that broadcast alike (`broadcastable`), each group is merged into
  one axis (slices of one shape become 1-D), `fn` runs on those, and the
  result is reshaped to the full broadcast shape.
  """
  slices = list(slices)
  shapes = [static_shape(s) for s in slices]
  rank = max(len(s) for s in shapes)
  if rank <= MAX_KERNEL_RANK:
    return fn(*slices)
  shapes = [_static_or_error(s, "An element-wise op") for s in slices]
  slices = broadcastable(slices)
  shapes = [static_shape(s) for s in slices]
  padded = [[1] * (rank - len(s)) + s for s in shapes]
  target = [max(sizes) for sizes in zip(*padded)]
  merged = [[] for _ in slices]
  previous = None
  for axis, sizes in enumerate(zip(*padded)):
    if target[axis] == 1:
      continue
    pattern = tuple(n == 1 for n in sizes)
    for m, n in zip(merged, sizes):
      if pattern == previous:
        m[-1] *= n
      else:
        m.append(n)
    previous = pattern
  y = fn(*[tf.reshape(s, m) for s, m in zip(slices, merged)])
  return tf.reshape(y, target)


def elementwise(fn, *slices):
  """fn(*slices) for an element-wise `fn` of slices of one shape (or
  broadcast against each other), at any rank (see `broadcasting`)."""
  return broadcasting(fn, slices)


def _merge_untouched(shape, touched):
  """Groups of axes for a kernel acting on axes `touched` only.

  Each group is a touched axis (or the first axis) followed by the
  untouched axes after it: merged row-major, an untouched (whole) axis
  only scales the positions of the axis before it. Returns the groups as
  lists of axes.
  """
  groups = []
  for axis in range(len(shape)):
    if axis in touched or not groups:
      groups.append([axis])
    else:
      groups[-1].append(axis)
  return groups


def _scale(value, factor):
  """value * factor for an int or a scalar tensor `value`."""
  if factor == 1:
    return value
  return value * factor


def tf_slice(x, begin, size):
  """tf.slice(x, begin, size) at any rank.

  Beyond MAX_KERNEL_RANK dimensions, runs of axes taken whole merge into
  the axis before them (in stages of MAX_KERNEL_RANK - 1 partly taken
  axes, when there are more). `begin` holds ints or is an int tensor of
  shape [rank]; `size` holds ints (-1: to the end). Sizes must be static.
  """
  shape = static_shape(x)
  rank = len(shape)
  if rank <= MAX_KERNEL_RANK:
    return tf.slice(x, begin, size)
  shape = _static_or_error(x, "Slice")
  if isinstance(begin, (list, tuple)):
    begins = list(begin)
  else:
    begins = [begin[i] for i in range(rank)]
  sizes = [n - b if s == -1 else s for n, b, s in zip(shape, begins, size)]
  partial = [i for i in range(rank) if sizes[i] != shape[i]]
  if len(partial) > MAX_KERNEL_RANK - 1:
    # Slice the first axes now, the others (taken whole here) after.
    later = set(partial[MAX_KERNEL_RANK - 1:])
    first = tf_slice(x, [0 if i in later else b for i, b in enumerate(begins)],
                     [shape[i] if i in later else s
                      for i, s in enumerate(sizes)])
    return tf_slice(first, [b if i in later else 0
                            for i, b in enumerate(begins)],
                    [s if i in later else -1 for i, s in enumerate(sizes)])
  groups = _merge_untouched(shape, set(partial))
  merged_shape, merged_begin, merged_size = [], [], []
  for group in groups:
    rest = shape_lib.list_product([shape[i] for i in group[1:]])
    merged_shape.append(shape[group[0]] * rest)
    merged_begin.append(_scale(begins[group[0]], rest))
    merged_size.append(sizes[group[0]] * rest)
  if not all(isinstance(b, int) for b in merged_begin):
    merged_begin = tf.stack([tf.cast(b, tf.int32) for b in merged_begin])
  y = tf.slice(tf.reshape(x, merged_shape), merged_begin, merged_size)
  return tf.reshape(y, sizes)


def _pad_groups(paddings):
  """Groups of neighbouring axes that Pad sees: padded or not alike."""
  groups, previous = 0, None
  for before, after in paddings:
    pattern = (before, after) != (0, 0)
    if pattern or pattern != previous:
      groups += 1
    previous = pattern
  return groups


def tf_pad(x, paddings, constant_values=0):
  """tf.pad(x, paddings, constant_values=...) at any rank.

  Within MAX_KERNEL_RANK dimensions and MAX_PAD_GROUPS groups of padded
  and unpadded axes it is tf.pad. Otherwise runs of unpadded axes merge
  into the axis before them (an unpadded axis only scales its padding),
  padding at most MAX_PAD_GROUPS - 1 axes at a time. `paddings` holds
  [before, after] pairs of ints; sizes must be static.
  """
  shape = static_shape(x)
  rank = len(shape)
  paddings = [list(p) for p in paddings]
  if rank <= MAX_KERNEL_RANK and _pad_groups(paddings) <= MAX_PAD_GROUPS:
    return tf.pad(x, paddings, constant_values=constant_values)
  shape = _static_or_error(x, "Pad")
  padded = [i for i in range(rank) if paddings[i] != [0, 0]]
  if len(padded) > MAX_PAD_GROUPS - 1:
    later = set(padded[MAX_PAD_GROUPS - 1:])
    first = tf_pad(x, [[0, 0] if i in later else p
                       for i, p in enumerate(paddings)], constant_values)
    return tf_pad(first, [p if i in later else [0, 0]
                          for i, p in enumerate(paddings)], constant_values)
  groups = _merge_untouched(shape, set(padded))
  merged_shape, merged_paddings = [], []
  for group in groups:
    rest = shape_lib.list_product([shape[i] for i in group[1:]])
    merged_shape.append(shape[group[0]] * rest)
    merged_paddings.append([p * rest for p in paddings[group[0]]])
  y = tf.pad(tf.reshape(x, merged_shape), merged_paddings,
             constant_values=constant_values)
  return tf.reshape(y, [n + sum(p) for n, p in zip(shape, paddings)])
