"""Where the TensorFlow variables behind mtf variables live, in every mode.

An mtf program may be lowered many times: once per trace of a `tf.function`,
or once per `tf.Graph` in `tf.compat.v1` graph mode. The TF variables must be
created once and found again by name, so they are kept in a store:

- eager and `tf.function`: one store per mesh implementation; variables are
  created eagerly (lifted out of any trace with `tf.init_scope`), hence on the
  first trace only, and are the per-processor slices themselves;
- compat graph mode: one store per (mesh implementation, tf.Graph); as in the
  original library each variable also has a *master* copy on the host, in the
  global-variables collection, that `tf.compat.v1.train.Saver` saves and that
  `Lowering.copy_masters_to_slices()` copies into the slices.
"""

import contextlib
import weakref
import zlib

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import variables as tf_variables  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import checkpointing
from mesh_tensorflow import errors
from mesh_tensorflow import slice_utils


def outer_context_is_eager():
  """True unless the outermost context is a compat-mode tf.Graph."""
  with tf.init_scope():
    return tf.executing_eagerly()


def _bypass_strategy_creators(next_creator, **kwargs):
  del next_creator
  return tf_variables.default_variable_creator_v2(None, **kwargs)


def plain_variable(initial_value, **kwargs):
  """tf.Variable(initial_value, **kwargs), never a distributed variable.

  A mesh implementation's variables are per-processor slices on devices it
  picks. Made inside a tf.distribute strategy's scope or replica context
  (SimdMeshImpl's programs run in `strategy.run`, where the first trace
  creates the variables) tf.Variable would give the strategy's mirrored
  variable instead; this goes past the strategy's variable creators.
  """
  with tf.variable_creator_scope(_bypass_strategy_creators):
    return tf.Variable(initial_value, **kwargs)


def _outer_graph():
  with tf.init_scope():
    return tf.compat.v1.get_default_graph()


@contextlib.contextmanager
def root_name_scope():
  """Clears the name scope, so TF variables are named exactly as in mtf."""
  if tf.executing_eagerly():
    with tf.name_scope(""):
      yield
  else:
    with tf.compat.v1.get_default_graph().name_scope(None):
      yield


class VariableStore:
  """Maps mtf variable names to their TF variables, per execution context.

  Args:
    checkpoint_root: the trackable object (the mesh implementation) under
      which eager / tf.function variables are checkpointed by mtf name.
  """

  def __init__(self, checkpoint_root=None):
    self._eager = {}
    self._graphs = weakref.WeakKeyDictionary()
    self._checkpoint_root = checkpoint_root

  def _entries(self):
    if outer_context_is_eager():
      return self._eager
    return self._graphs.setdefault(_outer_graph(), {})

  def get(self, name):
    return self._entries().get(name)

  def put(self, name, entry):
    entries = self._entries()
    if name in entries:
      raise errors.ShapeError(f"Variable {name!r} is already in the store.")
    entries[name] = entry

  def track(self, name, node):
    """Makes `node` (a trackable) the checkpoint entry of variable `name`.

    Only eager / tf.function variables are tracked; compat graph mode
    checkpoints the master variables with `tf.compat.v1.train.Saver`.
    """
    if self._checkpoint_root is not None and outer_context_is_eager():
      with tf.init_scope():
        checkpointing.track(self._checkpoint_root, name, node)

  def counter(self, name):
    """A scalar int64 variable starting at 0, created on first use (on the
    host; in graph mode it is a global variable, so checkpoints hold it)."""
    entries = self._entries()
    if name not in entries:
      with tf.init_scope(), root_name_scope(), tf.device("/cpu:0"):
        if tf.executing_eagerly():
          entries[name] = plain_variable(tf.constant(0, tf.int64),
                                         name=name, trainable=False)
          self.track(name, entries[name])
        else:
          entries[name] = tf.compat.v1.Variable(
              tf.constant(0, tf.int64), name=name, trainable=False,
              use_resource=True)
    return entries[name]

  def eager_entries(self):
    """The variables created in eager / tf.function mode, by name."""
    return dict(self._eager)


def default_initializer(name):
  """Glorot-uniform initialisation seeded by the variable name.

  Seeding by name makes the initial value independent of the layout and of
  how many times the program is traced, so every layout trains identically.
  """
  seed = zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF

  def initializer(shape, dtype=tf.float32):
    shape = list(shape)
    receptive_field = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    if not shape:
      fan_in = fan_out = 1
    elif len(shape) == 1:
      fan_in = fan_out = shape[0]
    else:
      fan_in = shape[-2] * receptive_field
      fan_out = shape[-1] * receptive_field
    limit = float(np.sqrt(6.0 / max(1, fan_in + fan_out)))
    values = tf.random.stateless_uniform(
        shape, seed=[seed, 0], minval=-limit, maxval=limit, dtype=tf.float32)
    return tf.cast(values, dtype)

  return initializer


def initial_value(variable):
  """The full initial value of mtf `variable`, in its master dtype."""
  shape = variable.shape.to_integer_list
  dtype = variable.master_dtype
  init = variable.initializer
  if init is None:
    init = default_initializer(variable.name)
  if callable(init):
    try:
      value = init(shape, dtype=dtype)
    except TypeError:
      value = init(shape, dtype)
  else:
    value = init
  value = tf.cast(tf.convert_to_tensor(value), dtype)
  got = slice_utils.static_shape(value)
  if got != shape:
    if not got:
      value = tf.fill(shape, value)
    else:
      raise errors.ShapeError(
          f"Initializer of variable {variable.name!r} gave a value of shape "
          f"{got}, but the variable has shape "
          f"{variable.shape}.")
  return value
