"""Random tensors and dropout, the same under every layout.

Random values come from a counter-based generator (see
`mesh_tensorflow.randomness.stateless_random`): each element is a pure function of the
op's seed and the element's position in the full tensor. The same seed
therefore gives the same full tensor under every mesh and layout, replicated
slices agree, different blocks differ, and nothing is communicated.

Seeds. `seed=None` derives the seed from the operation's name (unique within
its mtf graph) and the run seed, if one is set (see
`mesh_tensorflow.randomness.run_seed`); an explicit int or scalar integer
tensor is used as given.
Every execution of a lowering then mixes in a step count kept by the mesh
implementation (`Lowering.random_step`), so each training step draws fresh
values, as TensorFlow's stateful random ops do, while a program stays
reproducible: the same program gives the same values in eager mode, under
tf.function and in graph mode, on any layout, and on every run (the count
starts at 0, where the values are those of the seed alone).
"""

import numbers

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.randomness import run_seed
from mesh_tensorflow.randomness import stateless_random
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise

__all__ = [
    "dropout",
    "random_normal",
    "random_uniform",
    "RandomOperation",
]


def random_uniform(mesh, shape, **kwargs):
  """Uniform random values on [minval, maxval), output shape `shape`.

  Takes tf.random.uniform's arguments, as the original did.

  Args:
    mesh: the Mesh.
    shape: the output Shape (or anything convertible to one).
    **kwargs: minval (default 0), maxval (default 1; required for integer
      dtypes), dtype (bfloat16, float16, float32 (default), float64, int32
      or int64), seed (None: derived from the op name, an int, or a scalar
      integer tf.Tensor; see the module docstring) and name. For float
      dtypes minval and maxval may be scalar tf.Tensors; for integers they
      must be ints with maxval > minval.

  Returns:
    an mtf Tensor of `shape` and `dtype`.
  """
  kwargs = dict(kwargs, name=kwargs.get("name") or "random_uniform")
  return RandomOperation(mesh, shape, tf.random.uniform,
                         **kwargs).outputs[0]


def random_normal(mesh, shape, **kwargs):
  """Normal random values with `mean` and `stddev`, output shape `shape`.

  Takes tf.random.normal's arguments, as the original did.

  Args:
    mesh: the Mesh.
    shape: the output Shape (or anything convertible to one).
    **kwargs: mean (default 0), stddev (default 1), Python numbers or scalar
      tf.Tensors; dtype (bfloat16, float16, float32 (default) or float64);
      seed (None: derived from the op name, an int, or a scalar integer
      tf.Tensor; see the module docstring) and name.

  Returns:
    an mtf Tensor of `shape` and `dtype`.
  """
  kwargs = dict(kwargs, name=kwargs.get("name") or "random_normal")
  return RandomOperation(mesh, shape, tf.random.normal, **kwargs).outputs[0]


_FLOATS = (tf.bfloat16, tf.float16, tf.float32, tf.float64)
_DTYPES = {
    "uniform": _FLOATS + (tf.int32, tf.int64),
    "normal": _FLOATS,
    "truncated_normal": _FLOATS,
}


_GOLDEN_64 = 0x9E3779B97F4A7C15 - 2**64  # 2^64 / golden ratio, as int64


def step_seed(seed, step):
  """Mixes the execution count `step` into `seed` (unchanged at step 0)."""
  seed = tf.cast(seed, tf.int64)
  return tf.bitwise.bitwise_xor(
      seed, tf.cast(step, tf.int64) * tf.constant(_GOLDEN_64, tf.int64))


class RandomOperation(graph_lib.Operation):
  """A random tensor drawn as `tf_fn(shape, **kwargs)` would; every
  dimension may be split.

  `tf_fn` is tf.random.uniform, tf.random.normal or
  tf.random.truncated_normal (or a tf.compat.v1 name of one); the values
  come from this library's counter-based generator, so they are the same
  under every mesh and layout (see the module docstring). The seed is fixed
  when the operation is built (from the name when not given), so copies of
  the operation (e.g. for recomputation) draw the same values.

  Args:
    mesh: the Mesh.
    shape: the output Shape (or anything convertible to one).
    tf_fn: the TF random function (or a distribution name, see
      `stateless_random.distribution_of`).
    **kwargs: tf_fn's arguments: dtype (default float32), seed, name, and
      minval/maxval (uniform) or mean/stddev.

  Raises:
    ValueError: an unsupported tf_fn, or integer bounds with maxval <=
      minval.
    TypeError: an argument tf_fn does not take, an unsupported dtype or a
      seed that is not an int or integer tensor.
  """

  handles_padding = True

  def __init__(self, mesh, shape, tf_fn, **kwargs):
    super().__init__([], mesh=mesh, name=kwargs.get("name") or "random")
    shape = shape_lib.convert_to_shape(shape)
    seed = kwargs.get("seed")
    distribution, _, dtype, params = stateless_random.parse_tf_fn(
        tf_fn, kwargs, self.name)
    if dtype not in _DTYPES[distribution]:
      raise TypeError(
          f"{self.name}: random {distribution} does not support dtype "
          f"{dtype.name}; use one of "
          f"{[d.name for d in _DTYPES[distribution]]}.")
    if dtype.is_integer:
      minval, maxval = params.get("minval", 0), kwargs.get("maxval")
      if not all(isinstance(v, numbers.Integral) for v in (minval, maxval)):
        raise TypeError(f"{self.name}: integer random uniform needs int "
                        f"minval and maxval, got {minval!r} and {maxval!r}.")
      if maxval <= minval:
        raise ValueError(f"{self.name}: integer random uniform needs maxval "
                         f"> minval, got minval={minval}, maxval={maxval}.")
    if seed is None:
      seed = run_seed.name_crc32(self.name)
    elif isinstance(seed, bool) or not (
        isinstance(seed, numbers.Integral) or tf.is_tensor(seed)):
      raise TypeError(f"{self.name}: seed must be None, an int or a scalar "
                      f"integer tf.Tensor, got {seed!r}.")
    self._tf_fn = tf_fn
    self._distribution = distribution
    self._seed = seed
    self._kwargs = dict(kwargs, dtype=dtype, seed=seed)
    self._outputs = [graph_lib.Tensor(self, shape, dtype)]

  @property
  def tf_fn(self):
    return self._tf_fn

  @property
  def seed(self):
    return self._seed

  @property
  def distribution(self):
    """"uniform", "normal" or "truncated_normal"."""
    return self._distribution

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    y = self._outputs[0]
    seed = step_seed(self._seed, lowering.random_step(impl))
    lowering.set_tensor_lowering(
        y, impl.random(y.shape, self._tf_fn, dict(self._kwargs, seed=seed)))

  def gradient(self, grad_ys):
    return []


cost_rules.register(RandomOperation, cost_rules.SLICEWISE)


def dropout(x, is_training=True, keep_prob=None, rate=None, noise_shape=None,
            name=None, *, seed=None):
  """Randomly zeroes elements of `x` (inverted dropout).

  Each element is kept with probability `keep_prob` (= 1 - `rate`). For a
  float `x` kept values are scaled by 1 / keep_prob so the expectation is
  unchanged; an integer `x` is only masked. The gradient is dy times the same
  mask (and scale): the mask is one mtf tensor used by both passes.

  Args:
    x: an mtf Tensor.
    is_training: if False, returns `x` unchanged.
    keep_prob: probability of keeping an element, in (0, 1].
    rate: probability of dropping an element, in [0, 1). Give exactly one of
      `keep_prob` and `rate`.
    noise_shape: optional Shape whose dimensions are a subset of x's: the
      mask varies over these and is broadcast over the others (e.g. the
      same mask for every position of a sequence). Default: x.shape.
    name: optional name.
    seed: None (derived from the op name), an int, or a scalar integer
      tf.Tensor (see the module docstring).

  Returns:
    an mtf Tensor like `x`.

  Raises:
    ValueError: keep_prob/rate are both or neither given, or out of range.
    ShapeError: `noise_shape` has a dimension `x` lacks.
  """
  if (keep_prob is None) == (rate is None):
    raise ValueError(f"dropout of {x.name}: give exactly one of keep_prob "
                     f"and rate, got keep_prob={keep_prob}, rate={rate}.")
  if keep_prob is None:
    if not 0 <= rate < 1:
      raise ValueError(f"dropout of {x.name}: rate must be in [0, 1), got "
                       f"{rate}.")
    keep_prob = 1.0 - rate
  elif not 0 < keep_prob <= 1:
    raise ValueError(f"dropout of {x.name}: keep_prob must be in (0, 1], got "
                     f"{keep_prob}.")
  noise_shape = x.shape if noise_shape is None else (
      shape_lib.convert_to_shape(noise_shape))
  for dim in noise_shape:
    if dim not in x.shape.dims:
      raise errors.ShapeError(
          f"dropout of {x.name}: noise_shape {noise_shape} has dimension "
          f"{dim.name!r} (size {dim.size}), which {x.shape} lacks; "
          "noise_shape must be a subset of x's dimensions.")
  if not is_training or keep_prob == 1:
    return x
  name = name or "dropout"
  u = random_uniform(x.mesh, noise_shape, dtype=tf.float32, seed=seed,
                     name=f"{name}/uniform")
  mask = elementwise.cast(comparisons.less(u, float(keep_prob)), x.dtype)
  if x.dtype.is_floating:
    mask = binary.multiply(mask, 1.0 / keep_prob)
  return binary.multiply(x, mask, output_shape=x.shape, name=name)
