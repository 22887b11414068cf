"""TensorFlow helpers that act on one slice of a laid-out tensor.

Slices have static shapes, so these helpers compute permutations and reshapes
in Python from the mtf shapes involved.

`static_shape` is where the shape of a TensorFlow tensor enters the lowering:
every lowering reads a slice's shape through it and gets Python ints. Under
`tf.compat.v1.disable_v2_behavior()` (or `disable_v2_tensorshape()`), which
programs written for TensorFlow 1 call, `tf.Tensor.shape[i]` is a v1
`Dimension`, which neither arithmetic with ints nor `tf.slice` accepts.
"""

import tensorflow as tf

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
