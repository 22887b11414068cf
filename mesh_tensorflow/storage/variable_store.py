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

Either way the variables are tracked by mtf name under a checkpoint root
(`VariableStore.checkpoint_root()`): the mesh implementation itself in eager
mode, one node per tf.Graph in graph mode, so `tf.train.Checkpoint` writes
the same keys in both modes (graph mode: in a Session).
"""

import contextlib
import threading
import weakref

import tensorflow as tf
from tensorflow.python.ops import variables as tf_variables  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow.storage import checkpointing
from mesh_tensorflow import errors
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.randomness import tf_initializers


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

  The store outlives a lowering (a retrace reuses its variables) and is
  shared by the lowerings of one mesh implementation, which may run on
  several threads: whoever looks a variable up and creates it if absent
  holds `lock` meanwhile (see `placement_variables.stored_entry`).

  Args:
    checkpoint_root: the trackable object (the mesh implementation) under
      which eager / tf.function variables are checkpointed by mtf name.
  """

  def __init__(self, checkpoint_root=None):
    self.lock = threading.RLock()
    self._eager = {}
    self._graphs = weakref.WeakKeyDictionary()
    self._graph_roots = weakref.WeakKeyDictionary()
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

  def checkpoint_root(self):
    """The trackable the variables of the current context are tracked
    under: the mesh implementation (eager / tf.function), else a node of
    the outermost tf.Graph (None if the store has no checkpoint root)."""
    if self._checkpoint_root is None or outer_context_is_eager():
      return self._checkpoint_root
    graph = _outer_graph()
    if graph not in self._graph_roots:
      self._graph_roots[graph] = checkpointing.ScopeNode()
    return self._graph_roots[graph]

  def track(self, name, node):
    """Makes `node` (a trackable) the checkpoint entry of variable `name`,
    under `checkpoint_root()`."""
    root = self.checkpoint_root()
    if root is not None:
      with tf.init_scope():
        checkpointing.track(root, name, node)

  def tf_variables(self):
    """Every TF variable of the current context's entries (slices, masters,
    counters), e.g. to initialise a compat graph's slices, which are in no
    collection."""
    found = {}
    for entry in self._entries().values():
      if isinstance(entry, tf.Variable):
        candidates = [entry]
      else:
        stack = getattr(entry, "stack", None)
        slices = stack.slices if stack is not None else getattr(
            entry, "slices", [])
        candidates = list(slices) + [getattr(entry, "master", None)]
        # A layer-stacked variable's masters, one per member.
        candidates += list(getattr(entry, "masters", None) or [])
      for variable in candidates:
        if variable is not None:
          found[id(variable)] = variable
    return list(found.values())

  def counter(self, name):
    """A scalar int64 variable starting at 0, created on first use (on the
    host; in graph mode it is a global variable, so checkpoints hold it)."""
    with self.lock:
      return self._counter(name)

  def _counter(self, name):
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
          self.track(name, entries[name])
    return entries[name]

  def eager_entries(self):
    """The variables created in eager / tf.function mode, by name."""
    return dict(self._eager)


def default_initializer(name):
  """Glorot-uniform initialisation seeded by the variable name.

  The original's default, `tf.compat.v1.glorot_uniform_initializer()`,
  seeded by the name (see tf_initializers): the initial value is independent
  of the layout and of how many times the program is traced, so every
  layout trains identically.
  """
  seed = tf_initializers.seed_of_name(name)
  return tf_initializers.seeded("glorot_uniform_initializer", seed)


def call_initializer(init, shape, dtype):
  """`init(shape, dtype)` (TF and Keras signatures alike), or `init` itself
  if it is a value, as a `dtype` tensor."""
  if callable(init):
    try:
      value = init(shape, dtype=dtype)
    except TypeError:
      value = init(shape, dtype)
  else:
    value = init
  return tf.cast(tf.convert_to_tensor(value), dtype)


def initial_value(variable):
  """The full initial value of mtf `variable`, in its master dtype."""
  shape = variable.shape.to_integer_list
  dtype = variable.master_dtype
  init = variable.initializer
  if init is None:
    init = default_initializer(variable.name)
  value = call_initializer(init, shape, dtype)
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


def initial_row_value(variable, row):
  """Row `row` (of the leading stack dimension) of the initial value of a
  layer-stacked `variable`, in its master dtype: its member's own initial
  value (a compat-mode master holds just that row)."""
  init = variable.initializer
  if hasattr(init, "row"):
    return init.row(row, variable.shape.to_integer_list[1:],
                    variable.master_dtype)
  return initial_value(variable)[row]
