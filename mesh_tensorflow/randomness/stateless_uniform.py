"""Float32 uniform slices of TensorFlow's own stateless Philox stream.

A float32 uniform random tensor of shape S and seed s is defined as
`tf.raw_ops.StatelessRandomUniformV2(S, key=s, counter=0, alg=Philox)`: its
element with row-major index j is the low 23 bits of word j % 4 of
Philox-4x32-10(key s, counter j // 4), as a float in [0, 1). TensorFlow
computes a whole tensor of it in one fused kernel, where the per-element
Philox of `stateless_random` takes some sixty TF ops: most of a dropout's
cost, and at 8 processors a large share of a step's op count.

A processor gets its slice in one of three ways, all giving the same bits:

- whole: the full tensor by the kernel, then the slice (small tensors,
  such as dropout masks shared over a sequence: redundant work is cheap);
- run: the slice is one contiguous run of the full tensor (only its first
  split axis is split and the axes before it have size 1): the kernel from
  that run's counter;
- any other slice: `philox.philox4x32` on each element's counter.
"""

import numpy as np
import tensorflow as tf

from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.randomness import philox

_PHILOX = 1  # The `alg` of TF's stateless kernels.
# Slices of tensors up to this many elements come from the whole tensor.
WHOLE_TENSOR_ELEMENTS = 1 << 18
_FLOAT_BITS = 23


def _key(seed):
  """The uint64[1] key tensor of an int seed or scalar integer tensor."""
  if isinstance(seed, (int, np.integer)):
    value = np.array([int(seed) & 0xFFFFFFFFFFFFFFFF], np.uint64)
    return tf.constant(value, tf.uint64)
  seed = tf.convert_to_tensor(seed)
  if not seed.dtype.is_integer or seed.shape.rank not in (None, 0):
    raise TypeError(f"A random seed must be an int or a scalar integer "
                    f"tensor, got {seed!r}.")
  return tf.reshape(tf.bitcast(tf.cast(seed, tf.int64), tf.uint64), [1])


def _kernel(seed, size, counter):
  """`size` values of the stream from Philox counter `counter` (an int or
  uint64 scalar tensor): elements 4 * counter ... of the full stream."""
  counter = tf.stack([tf.cast(counter, tf.uint64),
                      tf.constant(0, tf.uint64)]) if isinstance(
                          counter, tf.Tensor) else tf.constant(
                              [int(counter), 0], tf.uint64)
  return tf.raw_ops.StatelessRandomUniformV2(
      shape=tf.constant([size], tf.int64), key=_key(seed), counter=counter,
      alg=_PHILOX, dtype=tf.float32)


def _linear_start(full_shape, begin):
  """The row-major index of the slice's first element (int or tensor)."""
  start = 0
  for full_size, b in zip(full_shape, begin):
    start = start * full_size + (
        tf.cast(b, tf.int64) if isinstance(b, tf.Tensor) else int(b))
  return start


def _is_one_run(full_shape, slice_shape):
  split = [i for i, (f, s) in enumerate(zip(full_shape, slice_shape))
           if f != s]
  if not split:
    return True
  first = split[0]
  return (all(full_shape[i] == 1 for i in range(first)) and
          all(full_shape[i] == slice_shape[i]
              for i in range(first + 1, len(full_shape))))


def is_fused(full_shape, slice_shape):
  """True if a slice comes from TF's fused kernel (whole or run)."""
  return (int(np.prod(full_shape, dtype=np.int64)) <= WHOLE_TENSOR_ELEMENTS
          or _is_one_run(full_shape, slice_shape))


def _from_words(seed, full_shape, slice_shape, begin):
  """Element by element: word j % 4 of Philox(seed, j // 4)."""
  index = tf.reshape(philox.global_linear_index(
      full_shape, slice_shape, begin), [-1])
  counter = tf.bitwise.right_shift(index, tf.constant(2, tf.uint64))
  low = tf.cast(counter, tf.uint32)
  high = tf.cast(tf.bitwise.right_shift(counter, tf.constant(32, tf.uint64)),
                 tf.uint32)
  zeros = tf.zeros_like(low)
  words = tf.stack(philox.philox4x32(
      (low, high, zeros, zeros), philox.seed_to_key(seed)), axis=1)
  lane = tf.cast(tf.bitwise.bitwise_and(index, tf.constant(3, tf.uint64)),
                 tf.int32)
  word = tf.gather(words, lane, axis=1, batch_dims=1)
  mantissa = tf.bitwise.bitwise_and(word, tf.constant(0x7FFFFF, tf.uint32))
  return tf.cast(mantissa, tf.float32) * 2.0**-_FLOAT_BITS


def _as_begin(b):
  return tf.cast(b, tf.int64) if isinstance(b, tf.Tensor) else int(b)


def _at_most(b, limit):
  if isinstance(b, tf.Tensor):
    return tf.minimum(tf.cast(b, tf.int64), limit)
  return min(int(b), limit)


def unit_uniform(seed, full_shape, slice_shape, begin):
  """The slice of the float32 [0, 1) stream of `seed` over `full_shape`
  that starts at `begin` (ints, or scalar integer tensors), flat."""
  if not len(full_shape) == len(slice_shape) == len(begin):
    raise ValueError(
        f"full_shape {full_shape}, slice_shape {slice_shape} and begin "
        f"{begin} must have one entry per tensor axis.")
  full_size = int(np.prod(full_shape, dtype=np.int64))
  size = int(np.prod(slice_shape, dtype=np.int64))
  if full_size <= WHOLE_TENSOR_ELEMENTS:
    values = tf.reshape(_kernel(seed, full_size, 0), full_shape)
    if list(full_shape) != list(slice_shape):
      # A slice of an uneven split may reach past the end, or lie wholly
      # beyond it: its padding, whose values do not matter (the lowering
      # zeroes it). So pad by a slice, and start at most at the end.
      # (Known to end inside, as every slice of an even split: no pad.)
      uneven = [isinstance(b, tf.Tensor) or int(b) + part > whole
                for b, part, whole in zip(begin, slice_shape, full_shape)]
      if any(uneven):
        values = slice_utils.tf_pad(values, [
            [0, part if pad else 0] for part, pad in zip(slice_shape,
                                                         uneven)])
      values = slice_utils.tf_slice(values, [
          _at_most(b, whole) if pad else _as_begin(b)
          for b, whole, pad in zip(begin, full_shape, uneven)], slice_shape)
    return tf.reshape(values, [-1])
  if _is_one_run(full_shape, slice_shape):
    start = _linear_start(full_shape, begin)
    if isinstance(start, int):
      lead = start % 4
      return _kernel(seed, size + lead, start // 4)[lead:]
    start = tf.bitcast(start, tf.uint64)
    lead = tf.cast(tf.bitwise.bitwise_and(start, tf.constant(3, tf.uint64)),
                   tf.int32)
    values = _kernel(seed, size + 3,
                     tf.bitwise.right_shift(start, tf.constant(2, tf.uint64)))
    return tf.slice(values, [lead], [size])
  return _from_words(seed, full_shape, slice_shape, begin)
