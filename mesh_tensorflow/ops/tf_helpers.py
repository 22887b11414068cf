"""Small TensorFlow-level helpers of the original's public API.

Functions that act on tf.Tensors (or plain Python lists), not on mtf
Tensors: running a function once per device, transposing a list of lists,
and looking up the TF function behind a reduction or pooling name. Mesh
implementations and user code written for the original use them.
"""

import tensorflow as tf

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils

__all__ = [
    "binary_reduction_fn",
    "parallel",
    "pool_fn",
    "reduction_fn",
    "transpose_list_of_lists",
]

_BINARY_REDUCTIONS = {"SUM": tf.add, "MAX": tf.maximum, "MIN": tf.minimum}
_REDUCTIONS = {"SUM": tf.reduce_sum, "MAX": tf.reduce_max,
               "MIN": tf.reduce_min}
# pool_fn_string -> (number of spatial dimensions, TF pooling function).
_POOLS = {
    "AVG_2D": (2, tf.nn.avg_pool2d),
    "AVG_3D": (3, tf.nn.avg_pool3d),
    "MAX_2D": (2, tf.nn.max_pool2d),
    "MAX_3D": (3, tf.nn.max_pool3d),
}


def parallel(devices, fn, *args, **kwargs):
  """Calls `fn` once per device, each call under `tf.device(device)`.

  Call i gets the i-th element of every positional and keyword argument,
  inside `tf.compat.v1.variable_scope("parallel_<i>")`.

  Args:
    devices: a list of n device strings.
    fn: the function to call.
    *args: lists of length n.
    **kwargs: lists of length n.

  Returns:
    the list of the n results.

  Raises:
    ValueError: `devices` is not a list, or an argument is not a list of
      the same length.
  """
  if not isinstance(devices, list):
    raise ValueError(f"parallel: devices must be a list, got {devices!r}.")
  for arg in list(args) + list(kwargs.values()):
    if not isinstance(arg, list) or len(arg) != len(devices):
      raise ValueError(
          f"parallel: every argument must be a list with one entry per "
          f"device ({len(devices)} devices), got {arg!r}.")
  results = []
  for i, device in enumerate(devices):
    with tf.device(device), tf.compat.v1.variable_scope(f"parallel_{i}"):
      results.append(fn(*[a[i] for a in args],
                        **{k: v[i] for k, v in kwargs.items()}))
  return results


def transpose_list_of_lists(lol):
  """[[a, b], [c, d]] -> [[a, c], [b, d]] (the lists must be equally long).

  Raises:
    ValueError: `lol` is empty.
  """
  if not lol:
    raise ValueError("transpose_list_of_lists: cannot transpose an empty "
                     "list.")
  return [list(x) for x in zip(*lol)]


def _lookup(table, key, what):
  if key not in table:
    raise ValueError(f"Unknown {what} {key!r}; use one of {sorted(table)}.")
  return table[key]


def binary_reduction_fn(reduction_fn_string):
  """tf.add, tf.maximum or tf.minimum for "SUM", "MAX" or "MIN"."""
  return _lookup(_BINARY_REDUCTIONS, reduction_fn_string,
                 "reduction_fn_string")


def reduction_fn(reduction_fn_string):
  """tf.reduce_sum, tf.reduce_max or tf.reduce_min for "SUM", "MAX", "MIN"."""
  return _lookup(_REDUCTIONS, reduction_fn_string, "reduction_fn_string")


def pool_fn(pool_fn_string):
  """The pooling function for "AVG_2D", "AVG_3D", "MAX_2D" or "MAX_3D".

  The returned fn(x, ksize, strides, padding) pools a tf.Tensor laid out as
  [batch..., spatial..., channels] with any number of leading batch
  dimensions (they are flattened into one for the TF kernel and restored).
  """
  rank, tf_pool = _lookup(_POOLS, pool_fn_string, "pool_fn_string")

  def pool(x, ksize, strides, padding):
    shape = slice_utils.static_shape(x)
    batch = shape[:len(shape) - rank - 1]
    flat = tf.reshape(x, [shape_lib.list_product(batch)] + shape[len(batch):])
    y = tf_pool(flat, ksize, strides, padding)
    return tf.reshape(y, batch + slice_utils.static_shape(y)[1:])

  return pool
