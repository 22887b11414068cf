"""Uneven splits: the padding of a dimension its mesh dimension does not divide.

With `LayoutRules(..., allow_uneven=True)` a tensor dimension of size n split
over a mesh dimension of size k is held as k slices of ceil(n/k): the full
tensor is padded at its end to ceil(n/k)*k, so processor i holds logical
positions [i*s, (i+1)*s) of which those at n or beyond are padding (a
processor may hold only padding, e.g. n=5 on k=8).

The lowering keeps one invariant: the padding of every laid-out tensor is
zero (False for booleans). Operations that mix values along a padded
dimension rely on it (a sum adds zeros, a contraction multiplies by
zeros); those that need another neutral value (a max needs -inf) fill it
themselves with `fill_slice`. These helpers work on one slice, with the
slice's offsets either Python ints (PlacementMeshImpl, where each slice's
place is known when lowering) or scalar int tensors (SimdMeshImpl, where
one program serves every processor).
"""

import collections

import numpy as np
import tensorflow as tf

from mesh_tensorflow.backend import slice_utils

PaddedAxis = collections.namedtuple(
    "PaddedAxis",
    ["tensor_axis", "mesh_axis", "size", "slice_size", "pieces"])
PaddedAxis.__doc__ = """A tensor axis split unevenly in `pieces`: its logical
`size` and the `slice_size` = ceil(size / pieces) each processor holds."""


def slice_size(size, pieces, allow_uneven):
  """The slice size of a dimension of `size` split in `pieces`, or None if
  that needs padding and `allow_uneven` is off."""
  if size % pieces == 0:
    return size // pieces
  if not allow_uneven:
    return None
  return -(-size // pieces)


def padded_size(axis):
  """The full size of a padded axis: slice size times the pieces."""
  return axis.slice_size * axis.pieces


def _valid_length(axis, begin):
  """How many of the slice's positions along `axis` are real, for a slice
  starting at `begin` (an int, or an int tensor)."""
  if isinstance(begin, (int, np.integer)):
    return max(0, min(axis.slice_size, axis.size - int(begin)))
  begin = tf.cast(begin, tf.int32)
  return tf.clip_by_value(axis.size - begin, 0, axis.slice_size)


def neutral_value(dtype, reduction):
  """The value padding must hold for a `reduction` ("MAX", "MIN", "ALL",
  ...) to ignore it."""
  dtype = tf.as_dtype(dtype)
  if reduction in ("MAX", "ARGMAX"):
    if dtype.is_bool:
      return False
    return -np.inf if dtype.is_floating else dtype.min
  if reduction in ("MIN", "ARGMIN"):
    if dtype.is_bool:
      return True
    return np.inf if dtype.is_floating else dtype.max
  if reduction == "ALL":
    return True
  if reduction == "PROD":
    return 1
  return 0


def fill_slice(x, axes, begins, fill=0):
  """`x` (one slice) with its padding set to `fill`.

  Args:
    x: a tf.Tensor, one processor's slice.
    axes: the PaddedAxis list of its tensor.
    begins: per tensor axis, where the slice starts (ints or int tensors).
    fill: the value to put in the padding.
  """
  if not axes:
    return x
  fill = _as_dtype(fill, x.dtype)
  rank = x.shape.rank
  mask = None
  for axis in axes:
    valid = _valid_length(axis, begins[axis.tensor_axis])
    if isinstance(valid, int):
      if valid == axis.slice_size:
        continue
      if valid == 0:
        return tf.fill(tf.shape(x), fill)
    shape = [1] * rank
    shape[axis.tensor_axis] = axis.slice_size
    keep = tf.reshape(tf.range(axis.slice_size) < valid, shape)
    mask = keep if mask is None else tf.logical_and(mask, keep)
  if mask is None:
    return x
  return slice_utils.broadcasting(tf.where, [mask, x, fill])


def _as_dtype(value, dtype):
  """`value` as a scalar tensor of `dtype` (0 is False for booleans)."""
  if dtype.is_bool:
    return tf.constant(bool(value))
  return tf.constant(value, dtype)


def pad_full(x, axes):
  """A full tensor padded with zeros at the end of each padded axis.

  One axis at a time: TF's Pad takes at most 6 groups of padded and
  unpadded axes (docs/kernel_limits.md), which three padded axes of a
  rank-7 tensor would pass.
  """
  for axis in axes:
    x = pad_axis(x, axis.tensor_axis, axis.size, padded_size(axis))
  return x


def strip_full(x, axes):
  """The logical part of a padded full tensor (or of any tensor whose
  padded axes are whole)."""
  if not axes:
    return x
  begin = [0] * x.shape.rank
  size = [-1] * x.shape.rank
  for axis in axes:
    size[axis.tensor_axis] = axis.size
  return slice_utils.tf_slice(x, begin, size)


def pad_axis(x, tensor_axis, size, to_size):
  """Pads a slice along `tensor_axis` from `size` to `to_size` with zeros."""
  if to_size == size:
    return x
  paddings = [[0, 0] for _ in range(x.shape.rank)]
  paddings[tensor_axis][1] = to_size - size
  return slice_utils.tf_pad(x, paddings)


def strip_axis(x, tensor_axis, size):
  """The first `size` positions of a slice along `tensor_axis`."""
  if x.shape[tensor_axis] == size:
    return x
  begin = [0] * x.shape.rank
  sizes = [-1] * x.shape.rank
  sizes[tensor_axis] = size
  return slice_utils.tf_slice(x, begin, sizes)


def clip_block(axes, begin, size):
  """The logical part of a block (begin, size) of a padded tensor: (begin,
  size) clipped to the logical extent, or None if it is all padding."""
  size = list(size)
  for axis in axes:
    valid = _valid_length(axis, begin[axis.tensor_axis])
    if valid == 0:
      return None
    size[axis.tensor_axis] = valid
  return list(begin), size


def padding_fraction(shape_sizes, slice_shape, pieces):
  """The share of a laid-out tensor's elements that are padding.

  Args:
    shape_sizes: the logical sizes of its axes.
    slice_shape: the slice sizes of its axes.
    pieces: per axis, in how many pieces it is split (1 if not).
  """
  logical = float(np.prod(shape_sizes, dtype=np.float64))
  held = float(np.prod([s * p for s, p in zip(slice_shape, pieces)],
                       dtype=np.float64))
  return 0.0 if held == 0 else 1.0 - logical / held
