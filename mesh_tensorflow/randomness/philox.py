"""Philox-4x32-10 on TensorFlow integer ops, counted by linear index.

The primitives of the counter-based random numbers in `stateless_random`
and `stateless_uniform`: a seed's key words, each element's row-major index
in the full tensor (its counter), and the Philox rounds (Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC 2011). A leaf module:
it imports nothing of mesh_tensorflow.
"""

import numpy as np
import tensorflow as tf

# Philox-4x32 constants (Random123).
_M0 = 0xD2511F53
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_ROUNDS = 10
_MASK32 = 0xFFFFFFFF


def seed_to_key(seed):
  """The two uint32 Philox key words of an int seed or int scalar tensor."""
  if isinstance(seed, (int, np.integer)):
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return (tf.constant(seed & _MASK32, tf.uint32),
            tf.constant(seed >> 32, tf.uint32))
  seed = tf.convert_to_tensor(seed)
  if not seed.dtype.is_integer or seed.shape.rank not in (None, 0):
    raise TypeError(f"A random seed must be an int or a scalar integer "
                    f"tensor, got {seed!r}.")
  seed = tf.bitcast(tf.cast(seed, tf.int64), tf.uint64)
  return (tf.cast(seed & _MASK32, tf.uint32),
          tf.cast(tf.bitwise.right_shift(seed, tf.constant(32, tf.uint64)),
                  tf.uint32))


def global_linear_index(full_shape, slice_shape, begin):
  """The row-major index in the full tensor of each element of a slice.

  Args:
    full_shape: list of ints, the full tensor's shape.
    slice_shape: list of ints, the slice's shape.
    begin: one int or scalar integer tensor per axis: where the slice starts.

  Returns:
    a uint64 tensor of `slice_shape`.
  """
  if not (len(full_shape) == len(slice_shape) == len(begin)):
    raise ValueError(
        f"full_shape {full_shape}, slice_shape {slice_shape} and begin "
        f"{begin} must have one entry per tensor axis.")
  index = None
  for full_size, size, start in zip(full_shape, slice_shape, begin):
    if isinstance(start, (int, np.integer)):
      coordinate = tf.range(int(start), int(start) + size, dtype=tf.int64)
    else:
      coordinate = tf.range(size, dtype=tf.int64) + tf.cast(start, tf.int64)
    # Horner's rule: index = index * full_size + coordinate, one axis more.
    index = coordinate if index is None else (
        tf.expand_dims(index, -1) * full_size + coordinate)
  if index is None:
    index = tf.zeros([], tf.int64)
  return tf.bitcast(index, tf.uint64)


def round_keys(seed):
  """Per Philox round, the key words (k0, k1) as a [2, 1] uint64 tensor,
  each word shifted into the high half."""
  if isinstance(seed, (int, np.integer)):
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    k0, k1 = seed & _MASK32, seed >> 32
    return [tf.constant([[((k0 + r * _W0) & _MASK32) << 32],
                         [((k1 + r * _W1) & _MASK32) << 32]], tf.uint64)
            for r in range(_ROUNDS)]
  key = tf.reshape(tf.cast(tf.stack(seed_to_key(seed)), tf.uint64), [2, 1])
  shift = tf.constant(32, tf.uint64)
  keys = []
  for r in range(_ROUNDS):
    bumped = key + tf.constant([[r * _W0], [r * _W1]], tf.uint64)
    keys.append(tf.bitwise.left_shift(bumped, shift))  # Drops the carry.
  return keys


def philox_rounds(state, seed):
  """Philox-4x32-10 on a [2, n] uint64 state (c0:c1, c2:c3).

  Row 0 holds (c0 << 32) | c1 and row 1 (c2 << 32) | c3.

  One Philox round is
    (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2),
                         hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)).
  With two words packed in each uint64 the 64-bit product M0 c0 is already
  (hi << 32) | lo, so a round is six TF ops on the whole slice:
    state <- swap_rows((state >> 32) * (M0, M1)) ^ (state << 32)
             ^ (k0, k1) << 32.
  Few ops matter: lowering time grows with ops per slice times processors.
  The rows are swapped with a strided slice, whose GPU kernel (unlike
  ReverseV2's) takes 64-bit integers.
  """
  multipliers = tf.constant([[_M0], [_M1]], tf.uint64)
  shift = tf.constant(32, tf.uint64)
  begin, end, strides = (tf.constant([0, 0]), tf.constant([0, 0]),
                         tf.constant([-1, 1]))
  for key in round_keys(seed):
    product = tf.bitwise.right_shift(state, shift) * multipliers
    swapped = tf.strided_slice(product, begin, end, strides, begin_mask=3,
                               end_mask=3)
    state = tf.bitwise.bitwise_xor(
        swapped,
        tf.bitwise.bitwise_xor(tf.bitwise.left_shift(state, shift), key))
  return state


def _pack(high, low):
  return tf.bitwise.bitwise_or(
      tf.bitwise.left_shift(tf.cast(high, tf.uint64),
                            tf.constant(32, tf.uint64)),
      tf.cast(low, tf.uint64))


def philox4x32(counter, key):
  """Philox-4x32-10 of four uint32 counter tensors under two key words."""
  shape = tf.shape(counter[0])
  c0, c1, c2, c3 = [tf.reshape(c, [-1]) for c in counter]
  seed = tf.bitcast(_pack(key[1], key[0]), tf.int64)
  state = philox_rounds(tf.stack([_pack(c0, c1), _pack(c2, c3)]), seed)
  high = tf.cast(tf.bitwise.right_shift(state, tf.constant(32, tf.uint64)),
                 tf.uint32)
  low = tf.cast(state, tf.uint32)  # Truncates to the low 32 bits.
  return tuple(tf.reshape(w, shape)
               for w in (high[0], low[0], high[1], low[1]))


def random_bits(seed, full_shape, slice_shape, begin):
  """128 random bits per element: a [2, slice size] uint64 tensor.

  The Philox counter of the element with linear index i is
  (c0, c1, c2, c3) = (i >> 32, i & 0xFFFFFFFF, 0, 0), so the packed initial
  state is simply (i, 0). The two rows are independent 64-bit words.
  """
  index = tf.reshape(global_linear_index(full_shape, slice_shape, begin),
                     [1, -1])
  # (i, 0) by a broadcasting multiply: one op with uint64 kernels everywhere.
  return philox_rounds(index * tf.constant([[1], [0]], tf.uint64), seed)
