"""Random initializers seeded by the variable's scoped name.

A layer that asks for a plain TF initializer (`tf.random_uniform_initializer`
and the like, as some of the original's layers do) would start from other
values on every run, so two layouts of one model would not train alike.
These call TF's initializers on the full shape with a seed taken from the
variable's full name (through TF's stateless random ops, see
mtf.randomness.tf_initializers), the way `mtf.get_variable`'s default initializer does.
"""

from mesh_tensorflow.randomness import tf_initializers


def name_seed(name):
  """A seed from the full name `name` gets in the current variable scope."""
  return tf_initializers.name_seed(name)


def uniform(name, minval=0.0, maxval=1.0):
  """fn(shape, dtype): tf.random_uniform_initializer(minval, maxval), seeded
  by `name`."""
  return tf_initializers.seeded("random_uniform_initializer", name_seed(name),
                                stream=2, minval=minval, maxval=maxval)


def normal(name, stddev=1.0):
  """fn(shape, dtype): tf.random_normal_initializer(stddev), seeded by
  `name`."""
  return tf_initializers.seeded("random_normal_initializer", name_seed(name),
                                stream=2, stddev=stddev)
