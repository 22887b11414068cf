"""TensorFlow's initializers, seeded by a variable's name.

The original's layers created their variables with TF1 initializers
(`tf.compat.v1.random_normal_initializer(stddev=...)` and the like), called
on the variable's full master shape; programs and tests written for it
replace those names (a test mocks `tf.random_normal_initializer` to fix the
initial values). We look the same names up when a layer asks for its
initializer, build the initializer with a seed taken from the variable's
name, and call it on the full shape.

TF1's own seeded initializers draw with stateful random ops: in eager mode
their values depend on how often the seed was used before in the process,
so two layouts of one model would start apart. For TF's own classes we
therefore draw the same distribution, with the TF1 object's parameters
(defaults included), from TF's stateless random ops: the same values for
the same seed and shape, on every layout and every trace. A replaced name
(a user's initializer or a test's mock) is called as the original called
it: with the parameters, without a seed.

TF's and Keras's random initializers that a program makes without a seed
and gives to `mtf.get_variable` are seeded by the variable's name there
(`seed_unseeded`), so they too start alike on every layout.
"""

import math
import sys

import tensorflow as tf
from tensorflow.python.ops import init_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import init_ops_v2  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow.randomness import run_seed


def _normal(config, shape, seed):
  return tf.random.stateless_normal(shape, seed=seed, mean=config["mean"],
                                    stddev=config["stddev"])


def _truncated_normal(config, shape, seed):
  return tf.random.stateless_truncated_normal(
      shape, seed=seed, mean=config["mean"], stddev=config["stddev"])


def _uniform(config, shape, seed):
  maxval = config["maxval"]
  return tf.random.stateless_uniform(
      shape, seed=seed, minval=config["minval"],
      maxval=1.0 if maxval is None else maxval)  # TF1's default: [0, 1).


def _glorot_uniform(unused_config, shape, seed):
  receptive_field = 1
  for size in shape[:-2]:
    receptive_field *= size
  if not shape:
    fan_in = fan_out = 1
  elif len(shape) == 1:
    fan_in = fan_out = shape[0]
  else:
    fan_in = shape[-2] * receptive_field
    fan_out = shape[-1] * receptive_field
  limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
  return tf.random.stateless_uniform(shape, seed=seed, minval=-limit,
                                     maxval=limit)


# TF1 name -> (TF's own TF1 class, its stateless draw).
_DRAWS = {
    "random_normal_initializer": (init_ops.RandomNormal, _normal),
    "truncated_normal_initializer": (init_ops.TruncatedNormal,
                                     _truncated_normal),
    "random_uniform_initializer": (init_ops.RandomUniform, _uniform),
    "glorot_uniform_initializer": (init_ops.GlorotUniform, _glorot_uniform),
}


class NameSeed(int):
  """A seed computed from a full (scoped) variable name, the `origin` it
  keeps, so that the initializer it seeds can carry that name (see
  `seeded`). In every other respect it is the int it equals."""

  def __new__(cls, value, origin):
    seed = super().__new__(cls, value)
    seed.origin = origin
    return seed

  def __getnewargs__(self):
    return int(self), self.origin


def seed_of_name(full_name):
  """The seed of full (scoped) name `full_name` under the run seed (see
  run_seed), a NameSeed remembering `full_name`: the initializers it seeds
  carry the name as `seed_origin`, so that a layer-stacked variable can
  re-seed one per member (see mtf.strategies.layer_stacking)."""
  return NameSeed(run_seed.name_crc32(full_name) & 0x7FFFFFFF, full_name)


def seed_origin(seed):
  """The full name `seed` was computed from by seed_of_name, or None."""
  return getattr(seed, "origin", None)


def name_seed(name):
  """A seed from the full name variable `name` gets in the current scope."""
  scope = tf.compat.v1.get_variable_scope().name
  full_name = f"{scope}/{name}" if scope else name
  return seed_of_name(full_name)


def seeded(tf1_name, seed, stream=0, **kwargs):
  """`tf.compat.v1.<tf1_name>(**kwargs)`, seeded and stateless if TF's own.

  Args:
    tf1_name: one of "random_normal_initializer",
      "truncated_normal_initializer", "random_uniform_initializer",
      "glorot_uniform_initializer".
    seed: a Python int (see `name_seed`; a seed from a name gives the
      initializer that name as `seed_origin`).
    stream: a Python int; TF's own initializers draw with the stateless seed
      [seed, stream] (layers keep apart the streams of their kinds of
      variables).
    **kwargs: the initializer's parameters (stddev, minval, ...).

  Returns:
    an initializer fn(shape, dtype) giving the full initial value (drawn in
    float32, then cast to dtype). TF's own carry `seed`, `seed_origin`
    (the name the seed was computed from, or None) and `with_seed(seed)`
    (the same initializer with another seed).
  """
  if tf1_name not in _DRAWS:
    raise ValueError(f"No seeded form of tf.compat.v1.{tf1_name}; use one of "
                     f"{sorted(_DRAWS)}.")
  factory = getattr(tf.compat.v1, tf1_name)
  tf1_class, draw = _DRAWS[tf1_name]
  if factory is not tf1_class:
    return factory(**kwargs)
  origin = seed_origin(seed)
  seed = int(seed)
  config = tf1_class(seed=seed, **kwargs).get_config()

  def initializer(shape, dtype=tf.float32, **unused_kwargs):
    values = draw(config, [int(s) for s in shape], [seed, stream])
    return tf.cast(values, tf.as_dtype(dtype or tf.float32))

  initializer.seed = seed
  initializer.seed_origin = origin
  initializer.with_seed = lambda new_seed: seeded(tf1_name, new_seed, stream,
                                                  **kwargs)
  return initializer


def _keras_initializer_classes():
  """The base classes of the Keras initializers a program may have made
  (Keras 3, tf_keras), without importing Keras when it has not."""
  classes = []
  for module in ("keras", "tf_keras"):
    initializers = getattr(sys.modules.get(module), "initializers", None)
    base = getattr(initializers, "Initializer", None)
    if isinstance(base, type):
      classes.append(base)
  return tuple(classes)


def _stateless_maker(initializer):
  """fn(seed) -> `initializer` with that seed, drawing with stateless ops;
  None if `initializer` is not a random TF or Keras initializer made
  without a seed."""
  if isinstance(initializer, init_ops.Initializer):
    # TF1's seeded draws are stateful (see the module docstring): its TF2
    # twin of the same name and parameters draws statelessly.
    twin = getattr(init_ops_v2, type(initializer).__name__, None)
    if twin is None or getattr(initializer, "seed", 0) is not None:
      return None
    config = initializer.get_config()
    config.pop("dtype", None)
    return lambda seed: twin(**dict(config, seed=seed))
  if not isinstance(initializer, (init_ops_v2.Initializer,) +
                    _keras_initializer_classes()):
    return None
  config = initializer.get_config()
  if "seed" not in config or config["seed"] is not None:
    return None
  return lambda seed: type(initializer).from_config(dict(config, seed=seed))


def seed_unseeded(initializer, full_name):
  """`initializer`, seeded by the variable name `full_name` if it is one of
  TF's or Keras's random initializers made without a seed.

  Unseeded, they draw new values at every call (TF) or at every
  construction (Keras), so the same program would start differently under
  each layout and on each trace. Seeded by the name (and the run seed, see
  seed_of_name) they give the same start everywhere, with their own
  distribution and parameters. The result carries `seed`, `seed_origin`
  and `with_seed(seed)`, as `seeded`'s initializers do, so that a
  layer-stacked variable seeds each member by its own name. Anything else
  (None, a value, a seeded or a user's own initializer) is returned
  unchanged.
  """
  make = _stateless_maker(initializer)
  if make is None:
    return initializer

  def seeded_copy(seed):
    copy = make(int(seed))
    copy.with_seed = seeded_copy
    copy.seed_origin = seed_origin(seed)
    return copy

  return seeded_copy(seed_of_name(full_name))
