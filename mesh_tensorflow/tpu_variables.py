"""A variable over per-core TPU variables, for SimdMeshImpl on TPU.

The SPMD program is the same on every core but each core holds its own
slice of an mtf variable, in a TF variable of its own. `ReplicatedVariable`
wraps those variables as one: inside a TPU replicate context (the step
function of `TPUStrategy.run`, or `tpu.replicate`) its handle is a
replicated input (TPUReplicatedInput) of the per-core handles, so the one
program reads and writes each core's own variable. In the replica context
of another tf.distribute strategy (e.g. MirroredStrategy, which stands in
for TPUStrategy in tests) it stands for that replica's variable, and
elsewhere for the first variable.
"""

import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_replication  # pylint: disable=g-direct-tensorflow-import


def enclosing_tpu_context():
  """The TPUReplicateContext being built into, or None.

  Looks through the control-flow contexts of the default graph and of the
  graphs enclosing it (a tf.function or v2 control-flow body traced inside
  a replicated step function is a FuncGraph whose outer graph holds the
  context).
  """
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    context = graph._get_control_flow_context()  # pylint: disable=protected-access
    while context is not None:
      if isinstance(context, tpu_replication.TPUReplicateContext):
        return context
      context = context.outer_context
    graph = getattr(graph, "outer_graph", None)
  return None


def current_replica_index():
  """The replica id of an enclosing non-default tf.distribute replica
  context, as an int, or None (cross-replica, no strategy, or not static)."""
  if (not tf.distribute.has_strategy() or
      tf.distribute.in_cross_replica_context()):
    return None
  replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
  value = tf.get_static_value(replica_id)
  return None if value is None else int(value)


class ReplicatedVariable:
  """One variable-like object over per-replica (per-core) variables.

  Args:
    name: the common name (used for the replicated handle's op name).
    variables: resource variables, one per replica, in replica order, of
      one dtype and shape.
  """

  def __init__(self, name, variables):
    variables = list(variables)
    if not variables:
      raise ValueError(f"ReplicatedVariable {name!r} needs at least one "
                       "variable.")
    first = variables[0]
    for v in variables[1:]:
      if v.dtype != first.dtype or v.shape != first.shape:
        raise ValueError(
            f"ReplicatedVariable {name!r}: variables differ in dtype or "
            f"shape ({first.dtype} {first.shape} vs {v.dtype} {v.shape}).")
    self._name = name
    self._vars = variables
    # Key of the replicated handle in the context's cache.
    self._handle_id = f"{name}_{id(first)}"

  def __repr__(self):
    return (f"<ReplicatedVariable {self._name!r} shape={self.shape} "
            f"dtype={self.dtype.name} replicas={len(self._vars)}>")

  @property
  def name(self):
    return self._name

  @property
  def variables(self):
    return list(self._vars)

  @property
  def dtype(self):
    return self._vars[0].dtype

  @property
  def shape(self):
    return self._vars[0].shape

  def get_shape(self):
    return self.shape

  @property
  def graph(self):
    return self._vars[0].graph

  @property
  def op(self):
    return self._vars[0].op

  @property
  def device(self):
    return self._vars[0].device

  def get(self):
    """The first (primary) variable."""
    return self._vars[0]

  def _local(self):
    """The variable this object stands for outside a TPU context."""
    index = current_replica_index()
    return self._vars[0 if index is None else index]

  @property
  def handle(self):
    """The replicated handle in a TPU replicate context, else the local
    variable's (see the module docstring)."""
    context = enclosing_tpu_context()
    if context is None or tf.executing_eagerly():
      return self._local().handle
    return context.get_replicated_var_handle(
        self._name, self._handle_id, self._vars, is_mirrored=False)

  @property
  def initializer(self):
    """The variables' initializers, grouped (None in eager mode)."""
    if tf.executing_eagerly():
      return None
    initializers = [v.initializer for v in self._vars
                    if v.initializer is not None]
    return tf.group(*initializers) if initializers else None

  # --------------------------------------------------------------- reads

  def _replicated(self):
    return enclosing_tpu_context() is not None and not tf.executing_eagerly()

  def read_value(self):
    if not self._replicated():
      return self._local().read_value()
    return gen_resource_variable_ops.read_variable_op(self.handle, self.dtype)

  def value(self):
    if not self._replicated():
      return self._local().value()
    return gen_resource_variable_ops.read_variable_op(self.handle, self.dtype)

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    """For tensor conversion: the value (or, as_ref, the handle)."""
    if not self._replicated():
      return self._local()._dense_var_to_tensor(  # pylint: disable=protected-access
          dtype=dtype, name=name, as_ref=as_ref)
    if dtype is not None and not self.dtype.is_compatible_with(dtype):
      raise ValueError(
          f"Cannot convert ReplicatedVariable {self._name!r} of dtype "
          f"{self.dtype.name} to {tf.as_dtype(dtype).name}.")
    if as_ref:
      return self.handle
    return self.read_value()

  # -------------------------------------------------------------- writes

  def _update(self, method, raw_op, value, use_locking, name, read_value):
    if not self._replicated():
      return getattr(self._local(), method)(
          value, use_locking=use_locking, name=name, read_value=read_value)
    handle = self.handle
    with tf.name_scope(name or method):
      update = raw_op(handle, tf.convert_to_tensor(value, dtype=self.dtype))
      if not read_value:
        return update
      with tf.control_dependencies([update]):
        return gen_resource_variable_ops.read_variable_op(handle, self.dtype)

  def assign(self, value, use_locking=None, name=None, read_value=True):
    """Assigns `value` to this replica's variable.

    `use_locking` is accepted for the original's signature; resource
    variables ignore it. `name` names the op; `read_value` returns the new
    value (else the assign op).
    """
    return self._update("assign", gen_resource_variable_ops.assign_variable_op,
                        value, use_locking, name, read_value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    """Adds `delta` to this replica's variable (see `assign`)."""
    return self._update("assign_add",
                        gen_resource_variable_ops.assign_add_variable_op,
                        delta, use_locking, name, read_value)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    """Subtracts `delta` from this replica's variable (see `assign`)."""
    return self._update("assign_sub",
                        gen_resource_variable_ops.assign_sub_variable_op,
                        delta, use_locking, name, read_value)

  # ---------------------------------------------------------- metadata

  @property
  def constraint(self):
    """None: replicated slice variables carry no constraint function."""
    return None

  def to_proto(self, export_scope=None):
    """The VariableDef of the first (primary) variable.

    As in the original, whose ReplicatedVariable saved its primary
    variable's proto. Only graph-mode variables have one: TF raises for
    eager variables.
    """
    return self._vars[0].to_proto(export_scope=export_scope)


def _to_tensor(var, dtype=None, name=None, as_ref=False):
  return var._dense_var_to_tensor(dtype=dtype, name=name, as_ref=as_ref)  # pylint: disable=protected-access


tf.register_tensor_conversion_function(ReplicatedVariable, _to_tensor)
