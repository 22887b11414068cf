"""The mtf graph: Graph, Mesh, Tensor, Operation and VariableDType.

An `mtf.Graph` is a pure-Python list of operations in creation order (which is
a topological order). Nothing here touches TensorFlow's runtime; `Lowering`
turns a graph into TensorFlow ops later.
"""

import contextlib
import copy as _copy
import re
import types

import tensorflow as tf
from tensorflow.python.ops import variable_scope as tf_variable_scope  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import errors
from mesh_tensorflow import extensions
from mesh_tensorflow import shape as shape_lib


def _forget_default_scope_names(scope):
  """Makes layers' default scope names in `scope` start afresh ("dense",
  not "dense_4") in eager and tf.function mode.

  TF1 counts default names per tf.Graph, and the original built one mtf
  graph per tf.Graph; eager and tf.function share one process-wide count,
  so a retraced function would otherwise name new variables. A tf.Graph
  of the program's own (tf.compat.v1 mode) keeps TF1's counting, as in the
  original.
  """
  if not tf.compat.v1.executing_eagerly_outside_functions():
    return
  store = tf_variable_scope.get_variable_scope_store()
  store.close_variable_subscopes(scope or None)


class Graph:
  """A container of mtf operations, tensors and variables.

  Args:
    batch_gradients: whether `mtf.gradients` sums the repeated gradient
      terms of a weight from einsums marked for it (`mtf.pipeline(...,
      batch_weight_gradients=True)`, see mtf.strategies.gradient_batching)
      with one einsum each, as it does by default; False computes every
      term on its own. The same sums either way, up to float round-off.
      Also an attribute, which a program may set before `mtf.gradients`.
  """

  def __init__(self, batch_gradients=True):
    self.batch_gradients = bool(batch_gradients)
    # Creators of this graph's variables that the program switched on (see
    # add_variable_creator).
    self._variable_creators = []
    self._operations = []
    self._trainable_variables = []
    self._all_variables = []
    self._name_to_variable = {}
    self._name_to_variable_view = types.MappingProxyType(
        self._name_to_variable)
    # member name -> the layer-stacked Variable one of whose rows it is.
    self._member_to_variable = {}
    self._names_in_use = {}
    self._name_prefixes = []
    self._captured_variable_scope = tf.compat.v1.get_variable_scope().name
    self._stacking_limits = None
    _forget_default_scope_names(self._captured_variable_scope)

  def __repr__(self):
    return f"<mtf.Graph with {len(self._operations)} operations>"

  @property
  def operations(self):
    return list(self._operations)

  @property
  def trainable_variables(self):
    return list(self._trainable_variables)

  @property
  def all_variables(self):
    return list(self._all_variables)

  @property
  def name_to_variable(self):
    """{full name: Variable} of the variables, as a read-only live view:
    get_variable looks up every name here, so reading it copies nothing."""
    return self._name_to_variable_view

  @property
  def variable_creators(self):
    """The creators `add_variable_creator` gave this graph, in order."""
    return tuple(self._variable_creators)

  def add_variable_creator(self, creator):
    """Runs every later variable creation in this graph through `creator`.

    `creator(next_creator, request)` is as in
    `extensions.variable_creator_scope`; it runs after the scoped creators
    and before the mesh's extensions. A strategy adds one when the program
    uses it on this graph (layer stacking, for the optimizer slots of its
    variables). Adding the same creator twice adds it once.
    """
    if creator not in self._variable_creators:
      self._variable_creators.append(creator)
    return creator

  @property
  def captured_variable_scope(self):
    return self._captured_variable_scope

  def current_name_prefix(self):
    """The prefix new names get: the innermost `name_scope` of this graph,
    else the current `tf.compat.v1.variable_scope`."""
    if self._name_prefixes:
      return self._name_prefixes[-1]
    return tf.compat.v1.get_variable_scope().name

  @contextlib.contextmanager
  def name_scope(self, prefix):
    """Gives operations created inside names under the absolute `prefix`
    (used for gradients: "<op name>/gradients/...")."""
    self._name_prefixes.append(prefix)
    try:
      yield
    finally:
      self._name_prefixes.pop()

  def unique_name(self, name, mark_as_used=True, absolute=False):
    """A TensorFlow-style unique name under the current scope (or exactly
    `name` when `absolute`).

    Names compare case-insensitively; repeats get suffixes `_1`, `_2`, ...
    """
    prefix = "" if absolute else self.current_name_prefix()
    if prefix:
      name = prefix + "/" + name
    count = self._names_in_use.get(name.lower(), 0)
    if mark_as_used:
      self._names_in_use[name.lower()] = count + 1
    if count == 0:
      return name
    base = name
    while name.lower() in self._names_in_use:
      name = f"{base}_{count}"
      count += 1
    if mark_as_used:
      self._names_in_use[base.lower()] = count
      self._names_in_use[name.lower()] = 1
    return name

  def reserve_name(self, name):
    """Marks an exact (already scoped) name as used; raises if taken."""
    if self._names_in_use.get(name.lower()):
      raise ValueError(f"Name {name!r} is already used in this mtf.Graph.")
    self._names_in_use[name.lower()] = 1

  def _add_operation(self, operation):
    self._operations.append(operation)

  def variable_of_member(self, name):
    """The layer-stacked Variable a row of which is variable `name`, or
    None (see mtf.stack_layer_variables)."""
    return self._member_to_variable.get(name)

  def _add_variable(self, variable):
    if variable.name in self._name_to_variable:
      raise errors.ShapeError(f"Variable {variable.name!r} already exists.")
    members = getattr(variable, "member_names", None) or []
    for name in [variable.name] + members:
      owner = self._member_to_variable.get(name)
      if owner is not None:
        raise errors.ShapeError(
            f"Variable {name!r} is already row "
            f"{owner.member_names.index(name)} of layer-stacked variable "
            f"{owner.name!r}; it cannot be created again.")
    for name in members:
      if name in self._name_to_variable:
        raise errors.ShapeError(
            f"Layer-stacked variable {variable.name!r}: its member "
            f"{name!r} already exists as a variable of its own.")
    for name in members:
      self._member_to_variable[name] = variable
    self._name_to_variable[variable.name] = variable
    self._all_variables.append(variable)
    if variable.trainable:
      self._trainable_variables.append(variable)

  @property
  def to_string(self):
    """One line per operation (see Operation.to_string)."""
    return "\n".join(op.to_string for op in self._operations)

  def make_variables_untrainable(self, variables):
    """Removes `variables` from the trainable list (they stay variables)."""
    ids = {id(v) for v in variables}
    for v in variables:
      v._trainable = False  # pylint: disable=protected-access
    self._trainable_variables = [
        v for v in self._trainable_variables if id(v) not in ids]

  def capture_operations(self, fn=None):
    """The operations that running `fn` adds to this graph.

    Args:
      fn: a function of no arguments; None gives a context manager instead.

    Returns:
      with `fn`, as in the original: (what fn returns, the list of
      operations it created). Without: a context manager yielding a list
      that, after the block, holds the operations the block created.
    """
    if fn is None:
      return self._capture()
    with self._capture() as captured:
      output = fn()
    return output, captured

  @contextlib.contextmanager
  def _capture(self):
    start = len(self._operations)
    captured = []
    yield captured
    captured.extend(self._operations[start:])

  # Graph rewrites. These two methods own every change to the operation list
  # after construction; invariant: `operations` stays in a topological order.

  def clone_operations(self, ops, input_mapping):
    """Appends copies of `ops` whose inputs are remapped.

    Used to recompute a forward pass (recompute_grad). An input not in
    `input_mapping` is used as it is. Variables are not copied: their
    tensors map to themselves. Random operations are copied with their seed,
    so the copies draw the same values.

    Args:
      ops: operations in topological order.
      input_mapping: dict from Tensor to the Tensor the copies should use.

    Returns:
      (copied operations, dict from every original Tensor to its copy,
      including `input_mapping`).

    Raises:
      ValueError: `input_mapping` maps an output of one of `ops`.
    """
    mapping = dict(input_mapping)
    for op in ops:
      for t in op.outputs:
        if t in mapping:
          raise ValueError(
              f"clone_operations: input_mapping maps {t.name}, an output of "
              f"the cloned operation {op.name!r}; map only their inputs.")
    copies = []
    for op in ops:
      if not op.cloneable:
        mapping.update({t: t for t in op.outputs})
        continue
      copy = op._copy_with_inputs(  # pylint: disable=protected-access
          [mapping.get(t, t) for t in op.inputs],
          self.unique_name(op.name, absolute=True))
      self._operations.append(copy)
      mapping.update(zip(op.outputs, copy.outputs))
      copies.append(copy)
    return copies, mapping

  def rewrite_stack_variables(self, max_combined_variable_size=2**30,
                              max_combined_slice_size=2**27,
                              mesh_to_impl=None):
    """Asks for same-shaped variables to be stored stacked (faster start-up).

    In the original this replaced groups of variables in the graph by
    StackedVariables. Here stacking is a storage decision of the mesh
    implementation, taken by every Lowering of this graph (see
    `Lowering.autostack`): variables of one mesh with the same shape,
    dtypes and trainability, written by the same Assign operations (use
    `combine_assignments` or an optimizer's apply_grads), share one TF
    variable per processor. The graph, its variable list and checkpoints
    stay as they are.

    Args:
      max_combined_variable_size: at most this many elements per stack.
      max_combined_slice_size: at most this many elements per processor
        per stack.
      mesh_to_impl: accepted for compatibility; each Lowering uses its own.

    Raises:
      ValueError: it was called before on this graph.
    """
    del mesh_to_impl
    if self._stacking_limits is not None:
      raise ValueError("rewrite_stack_variables should not be called twice "
                       "on one mtf.Graph.")
    self._stacking_limits = {
        "max_combined_variable_size": max_combined_variable_size,
        "max_combined_slice_size": max_combined_slice_size,
    }

  @property
  def stacking_limits(self):
    """The limits given to rewrite_stack_variables, or None."""
    return (None if self._stacking_limits is None else
            dict(self._stacking_limits))

  def combine_assignments(self, assignments):
    """Merges Assign operations with the same `assign_fn` into one each.

    Variables written by the same Assign ops can be stacked by the
    Lowering (autostack). The originals are removed from the graph; other
    entries of `assignments` are returned unchanged. A variable is never
    assigned twice by one merged op.

    Returns:
      the list of merged and untouched operations.
    """
    result = []
    open_groups = {}  # assign_fn -> index into result of the growing group
    for op in assignments:
      fn = getattr(op, "assign_fn", None)
      if fn is None or not hasattr(op, "variables"):
        result.append(op)
        continue
      index = open_groups.get(fn)
      if index is not None and any(
          v in result[index][0] for v in op.variables):
        index = None
      if index is None:
        open_groups[fn] = len(result)
        result.append(([], [], [], fn))
        index = len(result) - 1
      variables, values, originals, _ = result[index]
      variables.extend(op.variables)
      values.extend(op.inputs)
      originals.append(op)
    merged = []
    for entry in result:
      if not isinstance(entry, tuple):
        merged.append(entry)
        continue
      variables, values, originals, fn = entry
      if len(originals) == 1:
        merged.append(originals[0])
        continue
      self.remove_operations(originals)
      merged.append(type(originals[0])(variables, values, assign_fn=fn,
                                       name="combined_assign"))
    return merged

  def remove_operations(self, operations):
    """Takes `operations` out of the graph (a while loop lowers its body
    itself); their outputs become unusable elsewhere."""
    removed = {id(op) for op in operations}
    self._operations = [op for op in self._operations
                        if id(op) not in removed]
    for op in operations:
      for t in op.outputs:
        t.usable = False


class Mesh:
  """A named placeholder for a mesh of processors.

  The Mesh has no shape: a `Lowering` maps it to a mesh implementation that
  says how many processors there are and how tensors are laid out on them.
  """

  def __init__(self, graph, name, variable_placer=None):
    if not isinstance(graph, Graph):
      raise TypeError(f"Mesh {name!r} needs an mtf.Graph, got {graph!r}.")
    self._graph = graph
    self._name = name
    self._variable_placer = variable_placer
    self._extensions = []

  @property
  def graph(self):
    return self._graph

  @property
  def extensions(self):
    """The MeshExtensions attached to this mesh, in order (see
    mesh_tensorflow.extensions)."""
    return tuple(self._extensions)

  def add_extension(self, extension):
    """Attaches `extension` (an extensions.MeshExtension), replacing one of
    its class."""
    if not isinstance(extension, extensions.MeshExtension):
      raise TypeError(f"Mesh {self._name!r}: {extension!r} is not an mtf "
                      "extensions.MeshExtension.")
    self.remove_extension(type(extension))
    self._extensions.append(extension)

  def remove_extension(self, extension_class):
    """Detaches the extension of class `extension_class`, if any."""
    self._extensions = [e for e in self._extensions
                        if type(e) is not extension_class]

  def extension(self, extension_class):
    """The extension of class `extension_class`, or None."""
    return next((e for e in self._extensions
                 if type(e) is extension_class), None)

  @property
  def name(self):
    return self._name

  @property
  def variable_placer_fn(self):
    """Where master variables live (compat graph mode): a device function."""
    if self._variable_placer is not None:
      return self._variable_placer.device_function
    return "cpu:0"

  def __repr__(self):
    return f"<mtf.Mesh {self._name!r}>"


class Tensor:
  """A distributed tensor: the output of an mtf operation.

  It has a mesh, a Shape of named dimensions and a tf.DType; its values exist
  only after lowering, as slices on the processors of the mesh.

  Its arithmetic operators (+, -, *, /, //, % and unary -) build mtf
  operations; the ops package installs them when it is imported (see
  `mesh_tensorflow.ops.tensor_methods`), which importing any part of
  mesh_tensorflow does, so that this module needs no operation.
  """

  def __init__(self, operation, shape, dtype, name=None, index=0):
    if not isinstance(dtype, tf.DType):
      raise TypeError(
          f"Tensor dtype must be a tf.DType, got {dtype!r} for the output of "
          f"{operation.name!r}.")
    self._operation = operation
    self._shape = shape_lib.convert_to_shape(shape)
    self._dtype = dtype
    self._name = name or f"{operation.name}:{index}"
    self.usable = True

  @property
  def operation(self):
    return self._operation

  @property
  def shape(self):
    return self._shape

  @property
  def size(self):
    return self._shape.size

  @property
  def mesh(self):
    return self._operation.mesh

  @property
  def graph(self):
    return self._operation.graph

  @property
  def dtype(self):
    return self._dtype

  @property
  def name(self):
    return self._name

  @property
  def to_string(self):
    return f"Tensor[{self._name}, {self._shape.to_string}, {self._dtype.name}]"

  def __repr__(self):
    return self.to_string


_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")


class Operation:
  """Base class of mtf operations.

  A subclass validates its inputs, sets `self._outputs`, declares which
  dimensions may be split when it is lowered, and implements `lower(lowering)`
  and `gradient(grad_ys)`.
  """

  # Variables are lowered outside a name scope so that their TF variables
  # get exactly the mtf name.
  lower_in_name_scope = True
  # Whether Graph.clone_operations copies this operation (variables: no).
  cloneable = True
  # Uneven splits (LayoutRules.allow_uneven): whether `lower` handles
  # padded dimensions itself. If not, the Lowering gathers the padded
  # dimensions whole around it (correct for any lowering, but it
  # communicates); see Lowering.lower_operation.
  handles_padding = False
  # Whether `lower` leaves its outputs' padding zero when its inputs' is
  # (a product, a sum); if not, the Lowering zeroes it afterwards, which
  # keeps the invariant every padded lowering relies on.
  padding_stays_zero = False

  def handles_padding_of(self, padded_names):
    """Whether `lower` is right with the dimensions named in `padded_names`
    padded (`handles_padding` by default). Operations that mix values
    along one dimension only need that one whole."""
    del padded_names
    return self.handles_padding

  def __init__(self, inputs, mesh=None, name=None):
    inputs = list(inputs)
    if mesh is None:
      if not inputs:
        raise ValueError(
            f"Operation {name or type(self).__name__} has no inputs, so it "
            "needs an explicit mesh.")
      mesh = inputs[0].mesh
    for t in inputs:
      if not isinstance(t, Tensor):
        raise TypeError(
            f"Inputs of {name or type(self).__name__} must be mtf Tensors, "
            f"got {t!r}.")
      if not t.usable:
        raise ValueError(
            f"Tensor {t.name} is internal to a custom gradient and cannot be "
            "used outside it.")
      if t.mesh.graph is not mesh.graph:
        raise ValueError(
            f"Tensor {t.name} belongs to another mtf.Graph than mesh "
            f"{mesh.name!r}.")
    self._inputs = inputs
    self._outputs = []
    self._mesh = mesh
    # Annotation class -> the Annotation (see mesh_tensorflow.extensions).
    self._annotations = {}
    self._name = mesh.graph.unique_name(
        _NAME_CHARS.sub("_", name or type(self).__name__))
    self._initialize_all_dimensions_as_splittable()
    mesh.graph._add_operation(self)  # pylint: disable=protected-access

  def _copy_with_inputs(self, inputs, name):
    """A shallow copy of this operation reading `inputs`, with new outputs."""
    copy = _copy.copy(self)
    copy._inputs = list(inputs)  # pylint: disable=protected-access
    copy._name = name  # pylint: disable=protected-access
    copy._annotations = dict(self._annotations)  # pylint: disable=protected-access
    copy._outputs = [  # pylint: disable=protected-access
        Tensor(copy, t.shape, t.dtype, index=i)
        for i, t in enumerate(self._outputs)]
    return copy

  def annotate(self, annotation):
    """Attaches `annotation` (an extensions.Annotation), replacing one of
    its class."""
    if not isinstance(annotation, extensions.Annotation):
      raise TypeError(f"Operation {self._name!r}: {annotation!r} is not an "
                      "mtf extensions.Annotation.")
    self._annotations[type(annotation)] = annotation

  def annotation(self, annotation_class):
    """The annotation of class `annotation_class`, or None."""
    return self._annotations.get(annotation_class)

  @property
  def annotations(self):
    """The operation's annotations, in the order they were attached."""
    return tuple(self._annotations.values())

  def __repr__(self):
    return "{}[{}]({}) -> {}".format(
        type(self).__name__, self._name,
        ", ".join(t.name for t in self._inputs),
        ", ".join(str(t.shape) for t in self._outputs))

  @property
  def graph(self):
    return self._mesh.graph

  @property
  def mesh(self):
    return self._mesh

  @property
  def name(self):
    return self._name

  @property
  def inputs(self):
    return list(self._inputs)

  @property
  def outputs(self):
    return list(self._outputs)

  @property
  def to_string(self):
    """"Kind[Inputs=(...) Outputs=(...)]" with each tensor's to_string."""
    return "{}[Inputs=({}) Outputs=({})]".format(
        type(self).__name__, ", ".join(t.to_string for t in self._inputs),
        ", ".join(t.to_string for t in self._outputs))

  @property
  def splittable_dims(self):
    """Frozenset of the names of dimensions that lowering may split."""
    explicit = self.__dict__.get("_splittable_dims")
    if explicit is not None:
      return explicit
    return self._splittability()[0]

  @property
  def unsplittable_dims(self):
    """Frozenset of the names of dimensions this operation cannot lower
    while split."""
    explicit = self.__dict__.get("_unsplittable_dims")
    if explicit is not None:
      return explicit
    return self._splittability()[1]

  def _splittability(self):
    default_dims = set()
    for t in self._inputs + self._outputs:
      default_dims.update(t.shape.dimension_names)
    default_dims -= self._split_exceptions
    if self._split_default == "splittable":
      return frozenset(default_dims), self._split_exceptions
    return self._split_exceptions, frozenset(default_dims)

  def _initialize_splittable_and_unsplittable_dims(
      self, default_splittability, exception_dims_iterable=None):
    """Marks every dimension of the inputs and outputs splittable or
    unsplittable (`default_splittability`), except the names in
    `exception_dims_iterable`, which get the other mark.

    Automatic layout and `check_splits` read the marks through
    `splittable_dims` and `unsplittable_dims`, which follow outputs set
    after this call. As in the original it also returns the two frozensets
    (splittable, unsplittable) as they are now, so that subclasses written
    for the original may assign them to `self._splittable_dims,
    self._unsplittable_dims` (those then take precedence).

    Raises:
      ValueError: default_splittability is not "splittable" or
        "unsplittable".
    """
    if default_splittability not in ("splittable", "unsplittable"):
      raise ValueError(
          f"default_splittability must be 'splittable' or 'unsplittable', "
          f"got {default_splittability!r}.")
    self._split_default = default_splittability
    self._split_exceptions = frozenset(exception_dims_iterable or ())
    return self._splittability()

  def _initialize_all_dimensions_as_splittable(self):
    return self._initialize_splittable_and_unsplittable_dims("splittable")

  @property
  def has_gradient(self):
    return (any(t.dtype.is_floating for t in self._inputs) and
            any(t.dtype.is_floating for t in self._outputs))

  def gradient(self, unused_grad_ys):
    """The gradients of the inputs (mtf Tensors or None), given those of
    the outputs; subclasses with a gradient override it."""
    raise NotImplementedError(
        f"{type(self).__name__} ({self._name}) has no gradient.")

  def lower(self, lowering):
    raise NotImplementedError(
        f"{type(self).__name__} ({self._name}) cannot be lowered.")

  def check_splits(self, lowering):
    """Raises if a dimension this operation cannot split is split."""
    self._refuse_splits(lowering, self.unsplittable_dims)

  def _refuse_splits(self, lowering, unsplittable):
    """Raises a LayoutError if a dimension named in `unsplittable` is split
    in this operation's inputs or outputs."""
    if not unsplittable:
      return
    for t in self._inputs + self._outputs:
      mesh_impl = lowering.mesh_impl(t)
      for d in t.shape:
        if (d.name in unsplittable and
            mesh_impl.tensor_dimension_to_mesh_axis(d) is not None):
          mesh_dim = mesh_impl.shape[
              mesh_impl.tensor_dimension_to_mesh_axis(d)]
          raise errors.LayoutError(
              f"{type(self).__name__} {self._name!r} cannot lower with "
              f"dimension {d.name!r} (size {d.size}) split over mesh "
              f"dimension {mesh_dim.name!r} (size {mesh_dim.size}); change "
              f"the layout rules so that {d.name!r} is not split.")


class VariableDType:
  """The three dtypes of a variable.

  master_dtype: what checkpoints hold. slice_dtype: the per-processor copy
  that optimizers update. activation_dtype: the dtype the variable's tensor
  has in the mtf graph. Low-precision slices (bfloat16) hurt training; keep
  the master dtype the same between training and evaluation.
  """

  def __init__(self, master_dtype=tf.float32, slice_dtype=None,
               activation_dtype=None):
    self._master_dtype = tf.as_dtype(master_dtype)
    self._slice_dtype = tf.as_dtype(slice_dtype or master_dtype)
    self._activation_dtype = tf.as_dtype(activation_dtype or master_dtype)

  @property
  def master_dtype(self):
    return self._master_dtype

  @property
  def slice_dtype(self):
    return self._slice_dtype

  @property
  def activation_dtype(self):
    return self._activation_dtype

  def __eq__(self, other):
    return isinstance(other, VariableDType) and (
        (self._master_dtype, self._slice_dtype, self._activation_dtype) ==
        (other._master_dtype, other._slice_dtype, other._activation_dtype))

  def __hash__(self):
    return hash((self._master_dtype, self._slice_dtype, self._activation_dtype))

  def __repr__(self):
    return (f"VariableDType(master_dtype={self._master_dtype.name}, "
            f"slice_dtype={self._slice_dtype.name}, "
            f"activation_dtype={self._activation_dtype.name})")
