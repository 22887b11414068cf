"""Variables and assignments.

`get_variable` adds a Variable operation to the mtf graph; its TF variables
(one slice per processor) are created or found by the mesh implementation when
the graph is lowered. `assign` and friends update the slices in place.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import extensions
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.randomness import tf_initializers
from mesh_tensorflow.storage import variable_store
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import reshapes


_HOST = "/cpu:0"


class Variable(graph_lib.Operation):
  """A trainable or non-trainable mtf variable; its output is its value.

  Its TF variables (one slice per processor, and in compat graph mode a
  master copy on the host) are made by the mesh implementation when the
  graph is lowered, not when the Variable is built as in the original; so
  `get_master`, `assign_to_master` and `master_device` refer to the most
  recent Lowering of this variable and raise before there is one.

  With `member_names` (one name per entry of its first dimension, the stack
  dimension) it is a layer-stacked variable: row i is the variable
  member_names[i] in checkpoints and optimizer slots, while the whole is
  one variable whose stack dimension layout rules may split (see
  mtf.stack_layer_variables).
  """

  handles_padding = True
  padding_stays_zero = True  # stored padded with zeros

  lower_in_name_scope = False
  cloneable = False
  # Whether the mesh implementation stores it (a StackedVariable reads and
  # writes its members' storage instead).
  has_own_storage = True

  def __init__(self, mesh, name, shape, dtype, initializer, trainable,
               member_names=None, **kwargs):
    if not isinstance(dtype, graph_lib.VariableDType):
      raise TypeError(f"Variable {name!r}: dtype must be a VariableDType.")
    member_names = check_member_names(
        name, shape_lib.convert_to_shape(shape), member_names)
    mesh.graph.reserve_name(name)
    super().__init__([], mesh=mesh, name="Variable")
    self._name = name
    self._member_names = member_names
    self._shape = shape_lib.convert_to_shape(shape)
    self._variable_dtype = dtype
    self._initializer = initializer
    self._trainable = trainable
    self._extra_kwargs = kwargs
    self._outputs = [graph_lib.Tensor(self, self._shape,
                                      dtype.activation_dtype)]
    # (mesh_impl, laid-out variable) of the latest lowering.
    self._lowered_as = None
    mesh.graph._add_variable(self)  # pylint: disable=protected-access

  @property
  def value(self):
    return self._outputs[0]

  @property
  def member_names(self):
    """The per-layer variable name of each row (a list), or None if this is
    not a layer-stacked variable."""
    return None if self._member_names is None else list(self._member_names)

  @property
  def shape(self):
    return self._shape

  @property
  def size(self):
    return self._shape.size

  @property
  def dtype(self):
    return self._variable_dtype

  @property
  def variable_dtype(self):
    return self._variable_dtype

  @property
  def master_dtype(self):
    return self._variable_dtype.master_dtype

  @property
  def slice_dtype(self):
    return self._variable_dtype.slice_dtype

  @property
  def activation_dtype(self):
    return self._variable_dtype.activation_dtype

  @property
  def initializer(self):
    return self._initializer

  @property
  def trainable(self):
    return self._trainable

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    laid_out_variable = mesh_impl.make_laid_out_variable(
        self, lowering.stack_group(self))
    self._lowered_as = (mesh_impl, laid_out_variable)
    lowering.variables[self] = laid_out_variable
    lowering.set_tensor_lowering(self._outputs[0],
                                 laid_out_variable.laid_out_tensor)

  def _lowered(self, what):
    if self._lowered_as is None:
      raise ValueError(
          f"Variable {self.name!r}: {what} needs the variable's TF variables, "
          "which the mesh implementation makes when the graph is lowered; "
          "build an mtf.Lowering of the graph first.")
    return self._lowered_as

  def _master_variable(self, what):
    _, laid_out = self._lowered(what)
    return getattr(laid_out, "master", None)

  def _member_masters(self, what):
    """Compat graph mode, layer-stacked: the masters of the rows."""
    _, laid_out = self._lowered(what)
    return getattr(laid_out, "masters", None)

  @property
  def master_device(self):
    """Where the master copy lives: the master variable's device in compat
    graph mode; otherwise the host, where get_master assembles the value."""
    masters = self._member_masters("master_device")
    if masters:
      return masters[0].device
    master = self._master_variable("master_device")
    return master.device if master is not None else _HOST

  def get_master(self):
    """The variable's full value in its master dtype (what checkpoints hold).

    In compat graph mode, the master TF variable itself (fill it from the
    slices with `Lowering.copy_slices_to_masters()`); in eager and
    tf.function mode, where the slices are the variables, a tensor
    assembled from them on the host.
    """
    masters = self._member_masters("get_master")
    if masters:
      with tf.device(masters[0].device):
        return tf.stack([m.value() for m in masters])
    master = self._master_variable("get_master")
    if master is not None:
      return master
    mesh_impl, laid_out = self._lowered("get_master")
    storage = laid_out.storage
    slices = [storage.slice_value(pnum) for pnum in range(mesh_impl.size)]
    with tf.device(_HOST):
      full = mesh_impl.combine_slices(slices, self.shape, device=_HOST)
      return tf.cast(full, self.master_dtype)

  def assign_to_master(self, val):
    """Sets the master value to `val` (a tf.Tensor of the full shape).

    In compat graph mode this assigns the master variable (copy it to the
    slices with `Lowering.copy_masters_to_slices()`) and returns the TF op;
    in eager and tf.function mode it assigns every processor's slice at once
    (and returns None eagerly, the grouped op in a tf.function).
    """
    masters = self._member_masters("assign_to_master")
    if masters:
      rows = tf.unstack(tf.convert_to_tensor(val), num=len(masters))
      return tf.group(*[m.assign(tf.cast(r, m.dtype), read_value=False)
                        for m, r in zip(masters, rows)])
    master = self._master_variable("assign_to_master")
    if master is not None:
      return master.assign(tf.cast(val, master.dtype), read_value=False)
    mesh_impl, laid_out = self._lowered("assign_to_master")
    storage = laid_out.storage
    value = tf.cast(tf.convert_to_tensor(val), self.master_dtype)
    pieces = mesh_impl.make_slices(value, self.shape)
    ops = [storage.assign_slice(pnum, piece)
           for pnum, piece in enumerate(pieces)]
    return _group(ops)


def _variable_dtype(dtype, master_dtype, slice_dtype, activation_dtype):
  if isinstance(dtype, graph_lib.VariableDType):
    return dtype
  dtype = tf.as_dtype(dtype)
  return graph_lib.VariableDType(master_dtype or dtype, slice_dtype or dtype,
                                 activation_dtype or dtype)


def get_variable(mesh, name, shape, dtype=tf.float32, master_dtype=None,
                 slice_dtype=None, activation_dtype=None, initializer=None,
                 trainable=True, **kwargs):
  """Creates (or returns, by full scoped name) an mtf variable's value.

  Args:
    mesh: the mtf.Mesh.
    name: the name within the current `tf.compat.v1.variable_scope`.
    shape: the mtf Shape.
    dtype: a tf.DType or a VariableDType.
    master_dtype, slice_dtype, activation_dtype: override parts of dtype.
    initializer: fn(shape, dtype) -> full initial value (any TF or Keras
      initializer), or a value. Default: TF's Glorot uniform
      (`tf.compat.v1.glorot_uniform_initializer`, looked up now) seeded by
      the variable's name, so every layout starts from the same values. A
      TF or Keras random initializer made without a seed is seeded by the
      name likewise (see `tf_initializers.seed_unseeded`).
    trainable: whether it is in `graph.trainable_variables`.
    **kwargs: accepted for compatibility with `tf.get_variable` arguments.

  Variable creation goes through the creators of
  `mtf.extensions.variable_creator_scope` (and those a strategy registered,
  e.g. `mtf.stack_layer_variables` or `mtf.shard_data_parallel`), which may
  rewrite its name, shape and storage.

  Returns:
    the variable's value, an mtf Tensor in the activation dtype.
  """
  prefix = mesh.graph.current_name_prefix()
  full_name = f"{prefix}/{name}" if prefix else name
  request = extensions.VariableRequest(
      mesh=mesh, name=full_name, shape=shape_lib.convert_to_shape(shape),
      variable_dtype=_variable_dtype(dtype, master_dtype, slice_dtype,
                                     activation_dtype),
      initializer=tf_initializers.seed_unseeded(initializer, full_name),
      trainable=trainable, kwargs=dict(kwargs))
  return extensions.create_variable(request, _create)


def _create(request):
  """The last creator: reuses the variable of that name or makes it."""
  storage_shape = request.storage_shape or request.shape
  member_names = (None if request.member_names is None else
                  list(request.member_names))
  existing = request.mesh.graph.name_to_variable.get(request.name)
  if existing is not None:
    if existing.member_names != member_names:
      raise errors.ShapeError(
          f"Variable {request.name!r} exists with members "
          f"{existing.member_names}; it cannot be reused with members "
          f"{member_names}.")
    if existing.shape != storage_shape:
      raise errors.ShapeError(
          f"Variable {request.name!r} exists with shape {existing.shape}; "
          f"it cannot be reused with shape {storage_shape}.")
    return reshapes.reshape(existing.outputs[0], request.shape)
  initializer = request.initializer
  if initializer is None:
    # Chosen now, as the original did: a program that replaces TF's
    # initializer while it builds its graph gets its replacement.
    initializer = variable_store.default_initializer(request.name)
  value = Variable(request.mesh, request.name, storage_shape,
                   request.variable_dtype, initializer, request.trainable,
                   member_names=member_names, **request.kwargs).outputs[0]
  return reshapes.reshape(value, request.shape)


def create_slot(variable, name, shape, dtype, initializer):
  """A non-trainable optimizer slot of `variable`, of `shape` (its value).

  Created through the variable creators (see `get_variable`) with
  `slot_of=variable`, outside any variable scope, so that strategies store
  it as they store `variable`'s state.
  """
  request = extensions.VariableRequest(
      mesh=variable.mesh, name=name, shape=shape_lib.convert_to_shape(shape),
      variable_dtype=_variable_dtype(dtype, None, None, None),
      initializer=initializer, trainable=False, slot_of=variable)
  return extensions.create_variable(request, _create)


def check_member_names(name, shape, member_names):
  """Validates a Variable's member names; returns them as a list or None."""
  if member_names is None:
    return None
  member_names = list(member_names)
  if not shape.dims:
    raise errors.ShapeError(
        f"Variable {name!r}: member_names need a leading stack dimension, "
        "but the variable is a scalar.")
  stack_dim = shape.dims[0]
  if len(member_names) != stack_dim.size:
    raise errors.ShapeError(
        f"Variable {name!r}: {len(member_names)} member names for stack "
        f"dimension {stack_dim.name!r} of size {stack_dim.size}; give one "
        "name per row.")
  if not all(isinstance(m, str) and m for m in member_names):
    raise TypeError(f"Variable {name!r}: member names must be non-empty "
                    f"strings, got {member_names!r}.")
  if len(set(member_names)) != len(member_names):
    raise ValueError(f"Variable {name!r}: member names repeat: "
                     f"{member_names!r}.")
  return member_names


class ReadVariable(graph_lib.Operation):
  """Reads a variable's current slices again (e.g. after an assignment).

  Args:
    var: the Variable.
    name: an optional name.
    dependencies: Assign operations the read must follow (needed in compat
      graph mode, where TF does not order a read after a write by itself).
  """

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, var, name=None, dependencies=()):
    super().__init__(var.outputs, name=name or "read_variable")
    self._var = var
    self._dependencies = list(dependencies)
    self._outputs = [graph_lib.Tensor(self, var.shape, var.activation_dtype)]

  @property
  def variable(self):
    return self._var

  def gradient(self, grad_ys):
    return grad_ys

  def lower(self, lowering):
    control = [lowering.lowered_operation(op) for op in self._dependencies]
    with tf.control_dependencies([c for c in control if c is not None]):
      value = lowering.variables[self._var].read()
    lowering.set_tensor_lowering(self._outputs[0], value)


def read_variable(var, dependencies=()):
  """The variable's value, read again after `dependencies` (Assign ops).

  Reading after an assignment needs the dependency in graph mode, where TF
  does not otherwise order a read after a write; eager and tf.function
  code runs in program order anyway.
  """
  return ReadVariable(_as_variable(var, "read_variable"),
                      dependencies=dependencies).outputs[0]


def assign_slice(variable, slice_var, val):
  """Sets one processor's slice: `slice_var` (a TF variable holding a slice
  of mtf Variable `variable`) to `val`, cast to the slice dtype.

  This is the default `assign_fn` of `Assign`; an assign_fn takes the same
  three arguments and returns the TF op (None when eager).
  """
  return slice_var.assign(tf.cast(val, variable.slice_dtype),
                          read_value=False)


def assign_add_slice(variable, slice_var, val):
  """Adds `val` (cast to the slice dtype) to one processor's slice."""
  return slice_var.assign_add(tf.cast(val, variable.slice_dtype),
                              read_value=False)


def assign_sub_slice(variable, slice_var, val):
  """Subtracts `val` (cast to the slice dtype) from one processor's slice."""
  return slice_var.assign_sub(tf.cast(val, variable.slice_dtype),
                              read_value=False)


def _bind(assign_fn, variable):
  """The mesh implementations call fn(slice_var, value); bind `variable`."""
  def slice_assign(slice_var, value):
    return assign_fn(variable, slice_var, value)
  return slice_assign


class Assign(graph_lib.Operation):
  """Assigns new values to one or more variables with `assign_fn`.

  Several assignments with the same `assign_fn` may share one Assign, so
  that they are lowered (and later stacked) together.
  """

  handles_padding = True

  def __init__(self, variables, new_values, assign_fn=assign_slice,
               name=None):
    super().__init__(new_values, mesh=variables[0].mesh,
                     name=name or "assign")
    if len(variables) != len(new_values):
      raise ValueError("Assign needs one new value per variable.")
    for var, value in zip(variables, new_values):
      if value.shape != var.shape:
        raise errors.ShapeError(
            f"Cannot assign {value.name} {value.shape} to variable "
            f"{var.name!r} of shape {var.shape}.")
    self._variables = list(variables)
    self._assign_fn = assign_fn
    self._outputs = []

  @property
  def variables(self):
    return list(self._variables)

  @property
  def assign_fn(self):
    return self._assign_fn

  def lower(self, lowering):
    # assign_fn(variable, slice_var, value) needs its mtf variable, so the
    # variables go to the mesh implementation in groups that share one: a
    # variable alone, or the members of one autostack group (same dtypes,
    # assigned together in one call per processor; the first member stands
    # for the stack, as the StackedVariable did in the original).
    groups = {}
    for var, value in zip(self._variables, self._inputs):
      group = lowering.stack_group(var)
      key = ("stack", id(group)) if group is not None else ("var", id(var))
      groups.setdefault(key, []).append((var, value))
    impl = lowering.mesh_impl(self)
    ops = []
    for members in groups.values():
      ops.append(impl.assign_to_variables(
          [lowering.variables[v] for v, _ in members],
          [lowering.laid_out_tensor(x) for _, x in members],
          _bind(self._assign_fn, members[0][0])))
    lowering.operations[self] = _group(ops)


class VariableView:
  """A Variable seen with its dimensions renamed (same sizes, same order).

  Its `value` is the variable's value renamed to `shape` (which may lay it
  out differently: a shard dimension splits it), and assigning to the view
  assigns the variable the new value renamed back. Optimizers update a
  variable through the view a mesh extension gives
  (`MeshExtension.update_view`, e.g. sharded weight updates).
  """

  def __init__(self, variable, shape):
    shape = shape_lib.convert_to_shape(shape)
    if shape.to_integer_list != variable.shape.to_integer_list:
      raise errors.ShapeError(
          f"VariableView of {variable.name!r} {variable.shape}: {shape} does "
          "not have the same dimension sizes in the same order.")
    self.variable = variable
    self.shape = shape
    self.value = reshapes.reshape(variable.outputs[0], shape)

  def __getattr__(self, name):
    # name, mesh, dtypes, ...: those of the variable.
    return getattr(self.variable, name)


def _assign_target(var, context):
  """(Variable, function giving a new value the variable's shape)."""
  if isinstance(var, VariableView):
    variable = var.variable
    return variable, lambda x: reshapes.reshape(x, variable.shape)
  if (isinstance(var, graph_lib.Tensor) and
      isinstance(var.operation, reshapes.ReshapeOperation)):
    source = var.operation.inputs[0]
    if (isinstance(source.operation, (Variable, ReadVariable)) and
        source.shape.to_integer_list == var.shape.to_integer_list):
      # A renamed read (e.g. mtf.get_variable of a sharded parameter).
      variable = _as_variable(source, context)
      return variable, lambda x: reshapes.reshape(x, variable.shape)
  return _as_variable(var, context), lambda x: x


def _as_variable(var, context):
  """The Variable behind `var`: a Variable, its value, or a read of it.

  Anything else is refused: in particular the output of another operation
  (mtf.negative(v), v * 2, mtf.identity(v), ...), which is a new value and
  not the variable; writing "to" it must not silently write to v.
  """
  if isinstance(var, Variable):
    return var
  if isinstance(var, graph_lib.Tensor):
    op = var.operation
    if isinstance(op, Variable):
      return op
    if isinstance(op, ReadVariable):
      return op.variable
    raise ValueError(
        f"{context}: {var.name} is the output of {type(op).__name__} "
        f"{op.name!r}, not the value of a variable; pass the variable (or "
        "the tensor mtf.get_variable returned) instead.")
  raise TypeError(f"{context}: expected an mtf Variable or its value, got "
                  f"{var!r}.")


def assign(var, new_val, assign_fn=assign_slice, name=None):
  """Assigns `new_val` to variable `var`; returns the Assign operation.

  Args:
    var: a Variable, its value (what mtf.get_variable returned), the
      output of mtf.read_variable of it, or a VariableView (or renamed
      read) of it, whose new value is renamed back.
    new_val: a Tensor of the variable's shape.
    assign_fn: fn(variable, slice_var, value) -> TF op, applied to every
      processor's slice (assign_slice, assign_add_slice, ...).
    name: an optional name.
  """
  var, to_variable_shape = _assign_target(var, name or "assign")
  return Assign([var], [to_variable_shape(new_val)], assign_fn=assign_fn,
                name=name)


def assign_add(var, new_val, name=None):
  return assign(var, new_val, assign_fn=assign_add_slice,
                name=name or "assign_add")


def assign_sub(var, new_val, name=None):
  return assign(var, new_val, assign_fn=assign_sub_slice,
                name=name or "assign_sub")


def _group(ops):
  ops = [op for op in ops if op is not None]
  if tf.executing_eagerly():
    return None
  return tf.group(*ops) if ops else tf.no_op()


# A variable's value is its slices (no work); reads and assignments are
# each processor's own.
cost_rules.register(Variable, cost_rules.NO_WORK)
cost_rules.register(ReadVariable, cost_rules.SLICEWISE)
class _AssignCost(cost_rules.CostRule):
  """One TF op per variable and processor (assign_to_slices), each reading
  the new value's slice and the variable's and writing the variable's."""

  def run(self, info, ctx):
    value_bytes = sum(cost_rules.slice_bytes(ctx.layout, d, s)
                      for d, s in zip(info.in_dims, info.in_itemsize))
    return cost_rules.RuleResult(cost_rules.no_pending(info),
                                 elementwise_bytes=3 * value_bytes,
                                 # One new value per variable.
                                 num_ops=max(1, len(info.in_dims)))


cost_rules.register(Assign, _AssignCost())
