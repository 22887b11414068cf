"""Counter-based random numbers for one slice of a full tensor.

Every element's value is a pure function of (seed, the element's row-major
linear index in the *full* tensor): the index is the counter of a
Philox-4x32-10 generator (Salmon et al., "Parallel random numbers: as easy as
1, 2, 3", SC 2011; the primitives are in `philox`) keyed by the seed. So a
processor computes its slice from nothing but the seed, the static full and
slice shapes and where its slice begins, at O(slice size) cost, and

- the full tensor is the same under every mesh and layout;
- replicated copies of a slice agree;
- different blocks differ.

`begin` may hold Python ints (PlacementMeshImpl) or scalar integer tensors
computed from the processor number (an SPMD program). Only integer arithmetic
(uint64 multiply, shifts, xor) is used, so the bits are the same on every
device.

For a 2x2 mesh "rows:2;cols:2" and a tensor [a=4, b=6] laid out "a:rows",
processors 0 and 1 both compute the elements with linear indices 0-11 (rows
0-1 of the full tensor) and get the same values; processors 2 and 3 compute
indices 12-23. No communication happens.

Float32 uniforms (dropout masks) are TensorFlow's own stateless Philox
stream instead, computed by its fused kernel where a slice allows it (see
`stateless_uniform`); the guarantees are the same.
"""

import math

import numpy as np
import tensorflow as tf

from mesh_tensorflow.randomness import philox
from mesh_tensorflow.randomness import stateless_uniform

DISTRIBUTIONS = ("uniform", "normal", "truncated_normal")

# The Philox primitives (module `philox`), also public here.
seed_to_key = philox.seed_to_key
global_linear_index = philox.global_linear_index
philox4x32 = philox.philox4x32
random_bits = philox.random_bits

# Significant bits of a uniform [0, 1) value per float dtype: every value
# k * 2**-bits (0 <= k < 2**bits) is exactly representable, so casting the
# float32 result to a narrower dtype never rounds up to 1.
_UNIFORM_BITS = {tf.bfloat16: 8, tf.float16: 11, tf.float32: 24}

# Slices are padded to a multiple of this many elements before log and cos
# (see `normal`): a multiple of every SIMD packet size.
_PACKET_MULTIPLE = 64


def _unit_uniform(word, dtype):
  """Uniform [0, 1) values from a uint64 random word, float32 or float64.

  float64 values use the top 53 bits, other dtypes the top
  `_UNIFORM_BITS[dtype]` bits, as exact multiples of 2**-bits.
  """
  bits = 53 if dtype == tf.float64 else _UNIFORM_BITS[dtype]
  compute_dtype = tf.float64 if dtype == tf.float64 else tf.float32
  top = tf.bitwise.right_shift(word, tf.constant(64 - bits, tf.uint64))
  return tf.cast(top, compute_dtype) * 2.0**-bits


def _check_float(dtype, distribution):
  if dtype not in _UNIFORM_BITS and dtype != tf.float64:
    raise TypeError(f"random {distribution} supports float dtypes (bfloat16, "
                    f"float16, float32, float64), got {dtype.name}.")


def uniform(seed, full_shape, slice_shape, begin, dtype=tf.float32,
            minval=0, maxval=1):
  """One slice of a uniform random tensor on [minval, maxval).

  Floats: minval + u * (maxval - minval) with u on [0, 1) (computed in
  float32 for 16-bit dtypes; as with tf.random.uniform, rounding can reach
  maxval). Integers (int32, int64): minval + (64 random bits mod
  (maxval - minval)); minval and maxval must be ints.
  """
  dtype = tf.as_dtype(dtype)
  if dtype in (tf.int32, tf.int64):
    if not all(isinstance(v, (int, np.integer)) for v in (minval, maxval)):
      raise TypeError(f"Integer random uniform needs int minval and maxval, "
                      f"got {minval!r} and {maxval!r}.")
    span = int(maxval) - int(minval)
    if span <= 0:
      raise ValueError(f"random uniform needs maxval > minval, got "
                       f"minval={minval}, maxval={maxval}.")
  else:
    _check_float(dtype, "uniform")
  if dtype == tf.float32:
    # TensorFlow's own fused Philox stream (see `stateless_uniform`).
    unit = stateless_uniform.unit_uniform(seed, full_shape, slice_shape,
                                          begin)
    minval, maxval = tf.cast(minval, tf.float32), tf.cast(maxval, tf.float32)
    value = minval + unit * (maxval - minval)
    return tf.reshape(value, slice_shape)
  word = random_bits(seed, full_shape, slice_shape, begin)[0]
  if dtype.is_integer:
    offset = tf.math.floormod(word, tf.constant(span, tf.uint64))
    # offset < span: adding minval in int64 wraps exactly as the integer
    # sum would, and the result fits in `dtype`.
    value = tf.bitcast(offset, tf.int64) + int(minval)
  else:
    compute_dtype = tf.float64 if dtype == tf.float64 else tf.float32
    minval = tf.cast(minval, compute_dtype)
    maxval = tf.cast(maxval, compute_dtype)
    value = minval + _unit_uniform(word, dtype) * (maxval - minval)
  return tf.reshape(tf.cast(value, dtype), slice_shape)


def normal(seed, full_shape, slice_shape, begin, dtype=tf.float32,
           mean=0, stddev=1):
  """One slice of a normal random tensor (Box-Muller on two uniforms).

  Computed in float64 and rounded to `dtype` at the end: graph optimizers
  may reorder the float arithmetic (seen: 1-ulp float32 differences between
  eager and tf.function), and float64 keeps such differences far below the
  rounding step of the result. With 24-bit uniforms (float32 and narrower)
  the largest magnitude is sqrt(2 ln 2**24) ~ 5.8 standard deviations.
  """
  dtype = tf.as_dtype(dtype)
  _check_float(dtype, "normal")
  compute_dtype = tf.float64
  uniform_dtype = tf.float64 if dtype == tf.float64 else tf.float32
  bits = random_bits(seed, full_shape, slice_shape, begin)
  first, second = bits[0], bits[1]
  # (0, 1]: log is finite. Uniforms keep the resolution of `dtype`.
  u1 = tf.cast(1.0 - _unit_uniform(first, uniform_dtype), compute_dtype)
  u2 = tf.cast(_unit_uniform(second, uniform_dtype), compute_dtype)
  # Padded: see _pad_to_packets.
  size = int(np.prod(slice_shape, dtype=np.int64))
  u1 = _pad_to_packets(u1, 1.0)
  u2 = _pad_to_packets(u2, 0.0)
  z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos((2.0 * math.pi) * u2)
  z = z[:size]
  mean = tf.cast(mean, compute_dtype)
  stddev = tf.cast(stddev, compute_dtype)
  return tf.reshape(tf.cast(mean + stddev * z, dtype), slice_shape)


def _pad_to_packets(values, pad_value):
  """Pads a flat tensor to a multiple of `_PACKET_MULTIPLE` elements.

  CPU kernels evaluate log, cos and erfinv with SIMD packets and a scalar
  loop for the remainder, which can differ in the last bit. Padding sends
  every element through the packet code, so an element's value does not
  depend on the size of the slice it is in.
  """
  size = int(values.shape[0])
  padding = -size % _PACKET_MULTIPLE
  if not padding:
    return values
  return tf.pad(values, [[0, padding]], constant_values=pad_value)


def truncated_normal(seed, full_shape, slice_shape, begin, dtype=tf.float32,
                     mean=0, stddev=1):
  """One slice of a normal tensor truncated to 2 standard deviations.

  As tf.random.truncated_normal: values more than two standard deviations
  from the mean do not occur. Drawn by inverting the normal distribution
  function on a uniform over (Phi(-2), Phi(2)) (no rejection loop, so each
  element stays a function of its own index), in float64.
  """
  dtype = tf.as_dtype(dtype)
  _check_float(dtype, "truncated_normal")
  uniform_dtype = tf.float64 if dtype == tf.float64 else tf.float32
  word = random_bits(seed, full_shape, slice_shape, begin)[0]
  u = tf.cast(_unit_uniform(word, uniform_dtype), tf.float64)
  size = int(np.prod(slice_shape, dtype=np.int64))
  # erf(x / sqrt(2)) = 2 Phi(x) - 1: a uniform on (-erf(sqrt 2), erf(sqrt 2))
  # maps through sqrt(2) erfinv onto (-2, 2) with the normal's density.
  bound = math.erf(math.sqrt(2.0))
  v = _pad_to_packets((2.0 * u - 1.0) * bound, 0.0)
  z = math.sqrt(2.0) * tf.math.erfinv(v)
  z = z[:size]
  mean = tf.cast(mean, tf.float64)
  stddev = tf.cast(stddev, tf.float64)
  return tf.reshape(tf.cast(mean + stddev * z, dtype), slice_shape)


_SAMPLERS = {"uniform": uniform, "normal": normal,
             "truncated_normal": truncated_normal}

# The TF random functions a random op may name, by distribution. In TF 2
# the tf.compat.v1 names (random_uniform, random.uniform, ...) are the same
# function objects.
_TF_FUNCTIONS = (
    (tf.random.uniform, "uniform"),
    (tf.random.normal, "normal"),
    (tf.random.truncated_normal, "truncated_normal"),
)
_PARAMS = {
    "uniform": ("minval", "maxval"),
    "normal": ("mean", "stddev"),
    "truncated_normal": ("mean", "stddev"),
}


def distribution_of(tf_fn, what="random"):
  """The distribution name of TF random function (or name) `tf_fn`.

  Raises:
    ValueError: any other function, naming `what` and the supported ones.
  """
  if isinstance(tf_fn, str) and tf_fn in DISTRIBUTIONS:
    return tf_fn
  for fn, distribution in _TF_FUNCTIONS:
    if tf_fn is fn:
      return distribution
  name = getattr(tf_fn, "__name__", repr(tf_fn))
  raise ValueError(
      f"{what}: unsupported random function or distribution {name!r}. "
      "Random values here are the same under every layout, which needs a "
      "counter-based generator per distribution: use tf.random.uniform, "
      "tf.random.normal or tf.random.truncated_normal (or their "
      f"tf.compat.v1 names, or a distribution name in {DISTRIBUTIONS}).")


def parse_tf_fn(tf_fn, kwargs, what="random"):
  """Splits a TF-style random call into what `sample` takes.

  Args:
    tf_fn: a TF random function or distribution name (see
      `distribution_of`).
    kwargs: its keyword arguments: seed (default 0), dtype (default
      float32), name (ignored) and the distribution's parameters (minval,
      maxval for uniform; mean, stddev otherwise). tf.random.uniform's
      maxval=None means 1.
    what: the caller, named in errors.

  Returns:
    (distribution, seed, dtype, params).

  Raises:
    ValueError: an unsupported function.
    TypeError: an argument the distribution does not take.
  """
  distribution = distribution_of(tf_fn, what)
  kwargs = dict(kwargs)
  seed = kwargs.pop("seed", None)
  seed = 0 if seed is None else seed
  dtype = tf.as_dtype(kwargs.pop("dtype", tf.float32))
  kwargs.pop("name", None)
  allowed = _PARAMS[distribution]
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise TypeError(
        f"{what}: random {distribution} got unexpected argument(s) "
        f"{unknown}; it takes seed, dtype, name and {list(allowed)}.")
  if distribution == "uniform" and kwargs.get("maxval", 1) is None:
    kwargs["maxval"] = 1
  return distribution, seed, dtype, kwargs



def sample(distribution, seed, full_shape, slice_shape, begin,
           dtype=tf.float32, **params):
  """One slice of a random tensor of `distribution`.

  Args:
    distribution: "uniform" (params minval, maxval), "normal" or
      "truncated_normal" (params mean, stddev).
    seed: an int or a scalar integer tensor.
    full_shape: list of ints, the full tensor's shape.
    slice_shape: list of ints, this slice's shape.
    begin: per axis, an int or scalar integer tensor: the slice's offset in
      the full tensor.
    dtype: the output dtype.
    **params: the distribution's parameters.

  Returns:
    a tf.Tensor of `slice_shape` and `dtype`, equal to the corresponding
    block of the full tensor that the same call with
    `slice_shape=full_shape, begin=[0, ...]` returns.
  """
  if distribution not in _SAMPLERS:
    raise ValueError(f"Unknown random distribution {distribution!r}; "
                     f"expected one of {DISTRIBUTIONS}.")
  return _SAMPLERS[distribution](seed, list(full_shape), list(slice_shape),
                                 list(begin), dtype=dtype, **params)


# (distribution, dtype, full shape, slice shape, params) -> tf.function.
_COMPILED = {}


def compiled_sampler(distribution, full_shape, slice_shape, dtype=tf.float32,
                     **params):
  """`sample` for one slice shape as one function call: fn(seed, begin).

  A slice's random numbers take about a hundred TF ops (Philox rounds, the
  global index). Emitted inline for every processor of a mesh they were
  most of a Transformer's lowering time; as a call of one traced function
  (shared by every processor, layer and graph with the same shapes) they
  cost one op to emit. The values are the same: the function body is
  `sample`, with the seed and `begin` as int64 tensor arguments. Returns
  None when a parameter is not a plain number (then call `sample`).
  """
  if not all(isinstance(v, (int, float, np.integer, np.floating))
             for v in params.values()):
    return None
  dtype = tf.as_dtype(dtype)
  if (distribution, dtype) == ("uniform", tf.float32) and (
      stateless_uniform.is_fused(full_shape, slice_shape)):
    return None  # A few ops inline: cheaper than a function call.
  key = (distribution, dtype, tuple(full_shape), tuple(slice_shape),
         tuple(sorted(params.items())))
  fn = _COMPILED.get(key)
  if fn is None:
    rank = len(full_shape)

    def sample_slice(seed, begin):
      return sample(distribution, seed, full_shape, slice_shape,
                    [begin[i] for i in range(rank)], dtype=dtype, **params)

    fn = tf.function(sample_slice, autograph=False, input_signature=[
        tf.TensorSpec([], tf.int64), tf.TensorSpec([rank], tf.int64)])
    _COMPILED[key] = fn

  def call(seed, begin):
    seed = tf.cast(seed, tf.int64) if isinstance(seed, tf.Tensor) else (
        tf.constant(np.int64(np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
                             .view(np.int64))))
    begin = tf.stack([tf.cast(b, tf.int64) for b in begin]) if any(
        isinstance(b, tf.Tensor) for b in begin) else tf.constant(
            [int(b) for b in begin], tf.int64)
    return fn(seed, begin)

  return call

