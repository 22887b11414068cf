"""Variables and assignments.

`get_variable` adds a Variable operation to the mtf graph; its TF variables
(one slice per processor) are created or found by the mesh implementation when
the graph is lowered. `assign` and friends update the slices in place.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib


class Variable(graph_lib.Operation):
  """A trainable or non-trainable mtf variable; its output is its value."""

  lower_in_name_scope = False
  cloneable = False

  def __init__(self, mesh, name, shape, dtype, initializer, trainable,
               **kwargs):
    if not isinstance(dtype, graph_lib.VariableDType):
      raise TypeError(f"Variable {name!r}: dtype must be a VariableDType.")
    mesh.graph.reserve_name(name)
    super().__init__([], mesh=mesh, name="Variable")
    self._name = name
    self._shape = shape_lib.convert_to_shape(shape)
    self._variable_dtype = dtype
    self._initializer = initializer
    self._trainable = trainable
    self._extra_kwargs = kwargs
    self._outputs = [graph_lib.Tensor(self, self._shape,
                                      dtype.activation_dtype)]
    mesh.graph._add_variable(self)  # pylint: disable=protected-access

  @property
  def value(self):
    return self._outputs[0]

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
    laid_out_variable = lowering.mesh_impl(self).make_laid_out_variable(
        self, lowering.stack_group(self))
    lowering.variables[self] = laid_out_variable
    lowering.set_tensor_lowering(self._outputs[0],
                                 laid_out_variable.laid_out_tensor)


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
      initializer), or a value. Default: Glorot uniform seeded by the
      variable's name, so every layout starts from the same values.
    trainable: whether it is in `graph.trainable_variables`.
    **kwargs: accepted for compatibility with `tf.get_variable` arguments.

  Returns:
    the variable's value, an mtf Tensor in the activation dtype.
  """
  graph = mesh.graph
  prefix = graph.current_name_prefix()
  full_name = f"{prefix}/{name}" if prefix else name
  shape = shape_lib.convert_to_shape(shape)
  variable_dtype = _variable_dtype(dtype, master_dtype, slice_dtype,
                                   activation_dtype)
  existing = graph.name_to_variable.get(full_name)
  if existing is not None:
    if existing.shape != shape:
      raise errors.ShapeError(
          f"Variable {full_name!r} exists with shape {existing.shape}; it "
          f"cannot be reused with shape {shape}.")
    return existing.outputs[0]
  return Variable(mesh, full_name, shape, variable_dtype, initializer,
                  trainable, **kwargs).outputs[0]


class ReadVariable(graph_lib.Operation):
  """Reads a variable's current slices again (e.g. after an assignment)."""

  def __init__(self, var, dependencies=(), name=None):
    super().__init__(var.outputs, name=name or "read_variable")
    self._var = var
    self._dependencies = list(dependencies)
    self._outputs = [graph_lib.Tensor(self, var.shape, var.activation_dtype)]

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
  return ReadVariable(_as_variable(var), dependencies).outputs[0]


def assign_slice(variable, value):
  """Slice-level assignment (cast to the slice dtype)."""
  return variable.assign(tf.cast(value, variable.dtype), read_value=False)


def assign_add_slice(variable, value):
  return variable.assign_add(tf.cast(value, variable.dtype), read_value=False)


def assign_sub_slice(variable, value):
  return variable.assign_sub(tf.cast(value, variable.dtype), read_value=False)


class Assign(graph_lib.Operation):
  """Assigns new values to one or more variables with `assign_fn`.

  Several assignments with the same `assign_fn` may share one Assign, so
  that they are lowered (and later stacked) together.
  """

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
    laid_out_variables = [lowering.variables[v] for v in self._variables]
    values = [lowering.laid_out_tensor(x) for x in self._inputs]
    lowering.operations[self] = lowering.mesh_impl(
        self).assign_to_variables(laid_out_variables, values,
                                  self._assign_fn)


def _as_variable(var):
  """The Variable behind `var`: a Variable, its value, or a unary chain."""
  if isinstance(var, Variable):
    return var
  if isinstance(var, graph_lib.Tensor):
    op = var.operation
    while not isinstance(op, Variable):
      if len(op.inputs) != 1:
        raise ValueError(f"{var.name} is not the value of a variable.")
      op = op.inputs[0].operation
    return op
  raise TypeError(f"Expected an mtf Variable or its value, got {var!r}.")


def assign(var, new_val, assign_fn=assign_slice, name=None):
  """Assigns `new_val` to variable `var`; returns the Assign operation."""
  var = _as_variable(var)
  return Assign([var], [new_val], assign_fn=assign_fn, name=name)


def assign_add(var, new_val, name=None):
  return assign(var, new_val, assign_fn=assign_add_slice,
                name=name or "assign_add")


def assign_sub(var, new_val, name=None):
  return assign(var, new_val, assign_fn=assign_sub_slice,
                name=name or "assign_sub")
