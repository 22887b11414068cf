"""TensorFlow's initializers, seeded by a variable's name.

The original's layers created their variables with TF1 initializers
(`tf.compat.v1.random_normal_initializer(stddev=...)` and the like), called
on the variable's full master shape; programs and tests written for it
replace those names (a test mocks `tf.random_normal_initializer` to fix the
initial values). We call the same names, looked up when the variable is
made, on the full shape, with a seed taken from the variable's name.

TF1's own seeded initializers draw with stateful random ops: in eager mode
their values depend on how often the seed was used before in the process,
so two layouts of one model would start apart. For TF's own classes we
therefore call their TF2 twins, which draw with stateless random ops (the
same values for the same seed and shape, on every layout and every trace).
A replaced name (a user's initializer or a test's mock) is called as given.
"""

import zlib

import tensorflow as tf
from tensorflow.python.ops import init_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import init_ops_v2  # pylint: disable=g-direct-tensorflow-import

# TF1 name -> (TF's own TF1 class, its stateless TF2 twin, the parameters
# passed on). The twins' defaults differ (TF2's normal has stddev 0.05, TF1's
# 1.0), so the TF1 object's parameters, defaults included, are passed on.
_TWINS = {
    "random_normal_initializer": (init_ops.RandomNormal,
                                  init_ops_v2.RandomNormal,
                                  ("mean", "stddev")),
    "truncated_normal_initializer": (init_ops.TruncatedNormal,
                                     init_ops_v2.TruncatedNormal,
                                     ("mean", "stddev")),
    "random_uniform_initializer": (init_ops.RandomUniform,
                                   init_ops_v2.RandomUniform,
                                   ("minval", "maxval")),
    "glorot_uniform_initializer": (init_ops.GlorotUniform,
                                   init_ops_v2.GlorotUniform, ()),
    "glorot_normal_initializer": (init_ops.GlorotNormal,
                                  init_ops_v2.GlorotNormal, ()),
}


def name_seed(name):
  """A seed from the full name variable `name` gets in the current scope."""
  scope = tf.compat.v1.get_variable_scope().name
  full_name = f"{scope}/{name}" if scope else name
  return zlib.crc32(full_name.encode("utf-8")) & 0x7FFFFFFF


def seeded(tf1_name, seed, **kwargs):
  """`tf.compat.v1.<tf1_name>(seed=seed, **kwargs)`, stateless if TF's own.

  Args:
    tf1_name: one of the keys of _TWINS, e.g. "random_normal_initializer".
    seed: a Python int (see `name_seed`).
    **kwargs: the initializer's parameters (stddev, minval, ...).

  Returns:
    an initializer fn(shape, dtype) giving the full initial value.
  """
  if tf1_name not in _TWINS:
    raise ValueError(f"No seeded form of tf.compat.v1.{tf1_name}; use one of "
                     f"{sorted(_TWINS)}.")
  factory = getattr(tf.compat.v1, tf1_name)
  tf1_class, twin, passed_on = _TWINS[tf1_name]
  if factory is not tf1_class:
    return factory(seed=seed, **kwargs)
  config = tf1_class(seed=seed, **kwargs).get_config()
  params = {k: config[k] for k in passed_on}
  if "maxval" in params and params["maxval"] is None:
    params["maxval"] = 1.0  # TF1's uniform default for floats: [0, 1).
  initializer = twin(seed=seed, **params)

  def call(shape, dtype=tf.float32, **unused_kwargs):
    # Drawn in float32 whatever the master dtype (TF2's random initializers
    # refuse integer dtypes), then cast.
    values = initializer(list(shape), dtype=tf.float32)
    return tf.cast(values, tf.as_dtype(dtype or tf.float32))

  return call
