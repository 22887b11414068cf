"""What every layer module shares: variable scopes, seeds, dimension lists.

The layer modules (`layers` and the attention, convolution and residual
modules it re-exports) import this one, and none imports `layers`, so the
layers form no import cycle.
"""

import contextlib
import weakref

import tensorflow as tf

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.randomness import tf_initializers

# Scope names already taken in each mtf.Graph, for layers called without a
# name. TensorFlow's own default-name counter lives in a process-wide store
# in eager and tf.function mode, so a retraced function would name its
# variables "dense_1" and create new ones; counting per mtf.Graph gives the
# same names on every trace.
_SCOPES_IN_USE = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def variable_scope(mesh, name, default_name):
  """A `tf.compat.v1.variable_scope` named `name`, else a unique default."""
  with tf.compat.v1.variable_scope(scope_name(mesh, name, default_name)):
    yield


def scope_name(mesh, name, default_name):
  """`name`, else `default_name` made unique in the current scope; marks the
  result as used (so a layer can name a scope before it opens it)."""
  used = _SCOPES_IN_USE.setdefault(mesh.graph, set())
  outer = tf.compat.v1.get_variable_scope().name
  if name is None:
    name = default_name
    count = 0
    while f"{outer}/{name}" in used:
      count += 1
      name = f"{default_name}_{count}"
  used.add(f"{outer}/{name}")
  return name


def name_seed(name):
  """A seed from the scoped name `name` would get in get_variable."""
  return tf_initializers.name_seed(name)


def as_list(dims):
  """`dims` (None, a Dimension, a Shape or a list) as a list."""
  if dims is None:
    return []
  if isinstance(dims, shape_lib.Dimension):  # A namedtuple: test before tuple.
    return [dims]
  if isinstance(dims, shape_lib.Shape):
    return dims.dims
  if isinstance(dims, (list, tuple)):
    return list(dims)
  return [dims]
