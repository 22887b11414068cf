"""What every layer module shares: variable scopes, seeds, dimension lists.

The layer modules (`layers` and the attention, convolution and residual
modules it re-exports) import this one, and none imports `layers`, so the
layers form no import cycle.
"""

import contextlib

import tensorflow as tf

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.randomness import tf_initializers
from mesh_tensorflow.storage import legacy_names


@contextlib.contextmanager
def variable_scope(mesh, name, default_name):
  """`tf.compat.v1.variable_scope(name, default_name=default_name)`.

  TensorFlow's own default names, as in the original: "dense", then
  "dense_1", ..., unique among the scopes opened in the current scope
  (layers' and the program's), forgotten when a named outer scope closes.
  (Each mtf.Graph starts counting afresh in eager and tf.function mode,
  see graph.py.) The scope's path in earlier versions of this project is
  recorded for restoring their checkpoints (storage/legacy_names.py).
  """
  outer = tf.compat.v1.get_variable_scope().name
  with tf.compat.v1.variable_scope(name, default_name=default_name):
    legacy_names.for_graph(mesh.graph).opened(
        outer, tf.compat.v1.get_variable_scope().name, name, default_name)
    yield


@contextlib.contextmanager
def one_earlier_scope(mesh, name, default_name):
  """Inside, the scopes `default_name` opened directly in the current scope
  share one path in earlier versions (their `dense` kept kernel and bias
  in one scope; the original's opens two). Names now are unaffected."""
  table = legacy_names.for_graph(mesh.graph)
  pin = table.pin(tf.compat.v1.get_variable_scope().name, name, default_name)
  try:
    yield
  finally:
    table.unpin(pin)


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
