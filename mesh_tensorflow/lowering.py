"""Lowering: translates an mtf Graph into TensorFlow ops on slices.

`Lowering(graph, {mesh: mesh_impl})` lowers every operation, in order, into
per-slice TF ops plus collectives. It works the same eagerly (ops run as they
are lowered), inside a `tf.function` trace, and in `tf.compat.v1` graph mode.

The mesh implementations are not changed by lowering: each operation is
lowered with `mesh_impl(op)`, the implementation bound to this lowering's
current context (see `lowering_context`): its layout view, idle processors
and this lowering's counters. So one implementation can serve several
lowerings at once.
"""

import collections
import contextlib
import re

from absl import logging
import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import extensions
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.storage import autostack as autostack_lib

_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


class Lowering:
  """The TF lowering of an mtf Graph.

  Args:
    graph: the mtf.Graph.
    mesh_to_impl: dict from each mtf.Mesh the graph uses to a MeshImpl.
    autostack: store same-shaped variables that are always assigned
      together as one stacked TF variable per processor, where the mesh
      implementation supports it (see `mesh_tensorflow.storage.autostack` and
      `autostack()`): fewer TF variables and ops, same results and
      checkpoints. A graph on which
      `rewrite_stack_variables` was called is stacked with the limits given
      there, whatever this says.
    log_file: optional path; the variable sizes and counters are appended.

  Attributes:
    mesh_to_impl: dict from mtf Mesh to its MeshImpl, as given.
    tensors: dict from mtf Tensor to its laid-out value.
    operations: dict from mtf Operation (e.g. an Assign) to its TF op.
    variables: dict from mtf Variable to its LaidOutVariable.
  """

  def __init__(self, graph, mesh_to_impl, autostack=True, log_file=None):
    self.graph = graph
    self.mesh_to_impl = dict(mesh_to_impl)
    self.tensors = {}
    self.operations = {}
    self.variables = {}
    self._counters = collections.OrderedDict()
    self._scalar_summaries = collections.OrderedDict()
    self._random_steps = {}
    # The implementation each mesh's operations are lowered with now: its
    # implementation counting to this lowering, in the current context.
    self._bound = {mesh: impl.counting(self.add_counter)
                   for mesh, impl in self.mesh_to_impl.items()}
    self._check_meshes_and_layouts()
    self._stack_groups = {}
    self._num_consumers = _count_consumers(graph.operations)
    if autostack or graph.stacking_limits is not None:
      self.autostack()
    for op in graph.operations:
      self.lower_operation(op)
    self._log(log_file)

  def lower_operation(self, op):
    """Lowers one operation, in its name scope, counting its outputs.

    Operations that lower other operations themselves (the condition and
    body of a while loop) call this for each of them, so that an operation
    is lowered the same way inside a body as outside.
    """
    with contextlib.ExitStack() as scopes:
      for annotation in op.annotations:
        scopes.enter_context(annotation.lowering_scope(op, self))
      if op.lower_in_name_scope:
        scopes.enter_context(tf.name_scope(_scope_name(op.name)))
      padded_names = self._padded_names(op)
      if padded_names and not op.handles_padding_of(padded_names):
        self._lower_gathering(op, padded_names)
      else:
        op.lower(self)
      if padded_names and not op.padding_stays_zero:
        self._zero_padding(op)
    for t in op.outputs:
      if t not in self.tensors:
        continue
      if (isinstance(self.tensors[t], mesh_impl_lib.LazyAllreduceSum) and
          self._num_consumers.get(t, 0) > 1):
        # A pending sum read by several operations is reduced once, here:
        # left pending, a linear consumer (x * 2) would carry its own copy
        # of the partial sums to its own allreduce, besides the one
        # another consumer needs.
        self.tensors[t] = self.tensors[t].to_laid_out_tensor()
      kind = type(op).__name__
      self.add_counter(f"compute/{kind}/ops", 1)
      self.add_counter(f"compute/{kind}/output_elements",
                       self.laid_out_size(t))

  def _padded_names(self, op):
    """Names of the dimensions split unevenly (padded) in `op`'s inputs or
    outputs on its mesh."""
    impl = self._bound.get(op.mesh)
    if impl is None or not impl.layout_rules.allow_uneven:
      return frozenset()
    names = set()
    for t in list(op.inputs) + list(op.outputs):
      if self._bound.get(t.mesh) is impl:
        names.update(t.shape.dims[a.tensor_axis].name
                     for a in impl.padded_axes(t.shape))
    return frozenset(names)

  def _lower_gathering(self, op, names):
    """Lowers `op`, whose lowering does not handle padding, with the
    dimensions named in `names` gathered whole: its inputs are gathered
    (their padding cut off), it is lowered as if they were replicated, and
    its outputs are split (and padded) again. Correct for any operation, at
    the cost of the gathering; operations that matter get their own padded
    lowering (`Operation.handles_padding`)."""
    impl = self.mesh_impl(op)
    saved = {}
    for t in set(op.inputs):
      if t in self.tensors and self._bound.get(t.mesh) is impl:
        saved[t] = self.tensors[t]
        self.tensors[t] = impl.gather_dimensions(saved[t], t.shape, names)
    try:
      with self.using(impl.replicating(names)):
        op.lower(self)
        produced = {t: self.tensors[t].to_laid_out_tensor()
                    for t in op.outputs if t in self.tensors}
    finally:
      self.tensors.update(saved)
    for t, value in produced.items():
      self.tensors[t] = impl.split_dimensions(value, t.shape, names)

  def _zero_padding(self, op):
    """Zeroes the padding of `op`'s outputs (the lowering's invariant, see
    `backend.padding`)."""
    impl = self.mesh_impl(op)
    for t in op.outputs:
      if t in self.tensors and impl.padded_axes(t.shape):
        self.tensors[t] = impl.fill_padding(self.tensors[t], t.shape)

  @contextlib.contextmanager
  def using(self, mesh_impl):
    """Lowers the operations inside with `mesh_impl`, a view of the
    implementation of some meshes of this lowering in another context
    (`mesh_impl(op).replicating(names)`, `.idle_processors(pnums)`), as
    theirs; this lowering's own state, not the implementation, changes."""
    unbound = mesh_impl.unbound
    meshes = [m for m, impl in self.mesh_to_impl.items()
              if impl.unbound is unbound]
    if not meshes:
      raise ValueError(f"{mesh_impl!r} is not a view of a mesh "
                       "implementation of this Lowering.")
    previous = {m: self._bound[m] for m in meshes}
    self._bound.update({m: mesh_impl for m in meshes})
    try:
      yield
    finally:
      self._bound.update(previous)

  def _check_meshes_and_layouts(self):
    """Validates every tensor's layout before any TF op is created.

    Operations internal to another one (a while loop's condition and body,
    found through its `internal_operations`) are checked exactly like the
    graph's own, at the place of the operation that holds them.
    """
    for op in _with_internal_operations(self.graph.operations):
      if op.mesh not in self.mesh_to_impl:
        raise errors.LayoutError(
            f"Operation {op.name!r} is on mesh {op.mesh.name!r}, which has no "
            "mesh implementation in this Lowering (pass "
            "{mesh: mesh_impl} for every mesh).")
      impl = self.mesh_to_impl[op.mesh]
      for extension in op.mesh.extensions:
        extension.check_lowering(impl, op.mesh)
      for t in op.outputs:
        try:
          impl.slice_shape(t.shape)
        except errors.LayoutError as e:
          raise type(e)(f"Tensor {t.name} ({t.shape}) on mesh "
                        f"{impl.shape.to_string}: {e}") from None
      op.check_splits(self)

  def autostack(self):
    """Plans which variables are stored stacked (faster start-up).

    Variables of one mesh with the same shape, dtypes and trainability that
    the same Assign operations write are kept as one TF variable per
    processor with a leading stack axis, within the size limits of
    `graph.rewrite_stack_variables` if it was called, else the original's
    defaults (small slices only, unless there are very many slices). Unlike
    the original this leaves the graph unchanged: only the storage differs.
    It takes effect for variables this lowering has not created yet, so it
    runs from the constructor.
    """
    limits = self.graph.stacking_limits or {}
    self._stack_groups = autostack_lib.plan(self.graph, self.mesh_to_impl,
                                            **limits)

  def stack_group(self, variable):
    """The group `variable` is stacked with in this lowering, or None."""
    return self._stack_groups.get(variable)

  def mesh_impl(self, m):
    """The MeshImpl of an mtf Mesh, Tensor or Operation, bound to this
    lowering's current context (its `unbound` is the one given)."""
    mesh = m if not hasattr(m, "mesh") else m.mesh
    return self._bound[mesh]

  def export_to_tf_tensor(self, x):
    """The full value of mtf Tensor `x` as one tf.Tensor."""
    return self.mesh_impl(x).export_to_tf_tensor(x, self.laid_out_tensor(x))

  def lowered_operation(self, op):
    """The TF op of an mtf Operation (an Assign, say); None when eager."""
    return self.operations[op]

  def laid_out_tensor(self, x):
    """The materialised laid-out value of mtf Tensor `x`."""
    return self.tensors[x].to_laid_out_tensor()

  def set_tensor_lowering(self, tensor, laid_out_tensor):
    """Records the lowered value of `tensor`, checking its slice shape."""
    self.verify_slice_shapes(tensor, laid_out_tensor)
    self.tensors[tensor] = laid_out_tensor

  def verify_slice_shapes(self, tensor, laid_out_tensor):
    """Raises ShapeError unless `laid_out_tensor` (a LaidOutTensor or a
    lazy one) has the slice shape the layout gives `tensor`."""
    impl = self.mesh_impl(tensor)
    expected = impl.slice_shape(tensor.shape)
    if isinstance(laid_out_tensor, mesh_impl_lib.LaidOutTensor):
      first = laid_out_tensor.tensor_list[0]
      actual = (slice_utils.static_shape(first) if hasattr(first, "shape")
                else None)
    else:
      actual = laid_out_tensor.slice_shape
    if actual is not None and actual != expected:
      raise errors.ShapeError(
          f"Lowering of {tensor.operation.name!r} produced slices of shape "
          f"{actual} for {tensor.name} {tensor.shape}; expected {expected}.")

  def copy_masters_to_slices(self):
    """Compat graph mode: a TF op filling slice variables from masters.

    Run it after `tf.compat.v1.global_variables_initializer()` and after
    restoring a checkpoint. In eager / tf.function mode the slices are the
    variables and this returns None.
    """
    return _group([v.copy_master_to_slices() for v in self.variables.values()])

  def copy_slices_to_masters(self):
    """Compat graph mode: a TF op writing slice values to the masters.

    Run it before saving a checkpoint with `tf.compat.v1.train.Saver`.
    """
    return _group([v.copy_slices_to_master() for v in self.variables.values()])

  def random_step(self, mesh_impl):
    """A scalar int64 tensor: how often random ops of `mesh_impl` ran before.

    The mesh implementation keeps a counter variable that advances once per
    execution of each lowering that draws random numbers; random ops mix it
    into their seeds, so dropout draws a new mask every step, reproducibly
    (the counter starts at 0 and lives with the model's variables).
    """
    key = mesh_impl.unbound
    if key not in self._random_steps:
      self._random_steps[key] = mesh_impl.next_random_step()
    return self._random_steps[key]

  def add_scalar_summary(self, name, value):
    """Records a scalar tf.Tensor to be written as summary `name`."""
    self._scalar_summaries[name] = value

  @property
  def scalar_summaries(self):
    """Dict from summary name to the scalar tf.Tensor of mtf.scalar_summary
    calls in the graph."""
    return dict(self._scalar_summaries)

  def add_counter(self, key, value):
    self._counters[key] = self._counters.get(key, 0) + value

  @property
  def counters(self):
    """(key, value) pairs: `comm/<collective>/<mesh dims>/calls|bytes|
    wire_bytes` (see MeshImpl._count_collective) and
    `compute/<Operation class>/ops|output_elements`."""
    return list(self._counters.items())

  def laid_out_size(self, tensor):
    return self.mesh_impl(tensor).laid_out_size(tensor.shape)

  def _log(self, log_file):
    if log_file:
      with tf.io.gfile.GFile(log_file, "a") as f:
        self._log_to(f)
    else:
      self._log_to(None)

  def _log_to(self, f):
    log_variable_sizes(self.graph.trainable_variables, "Trainable Variables",
                       verbose=True, mesh_to_impl=self.mesh_to_impl,
                       log_file=f)
    log_variable_sizes(self.graph.all_variables, "All Variables",
                       verbose=False, mesh_to_impl=self.mesh_to_impl,
                       log_file=f)
    _log_lines(pretty_print_counters(self._counters), f)


def _log_lines(lines, log_file):
  for line in lines:
    logging.info(line)
  if log_file is not None:
    log_file.write("\n".join(lines) + "\n")


def log_variable_sizes(var_list, tag, verbose=True, mesh_to_impl=None,
                       log_file=None):
  """Logs the sizes of `var_list` (at INFO level) and their total.

  Args:
    var_list: a list of mtf Variables.
    tag: what they are, e.g. "Trainable Variables".
    verbose: also log one line per variable (name, shape, elements,
      elements per processor), sorted by name.
    mesh_to_impl: optional {Mesh: MeshImpl}, for the per-processor sizes
      (else they are 0).
    log_file: an optional writable file (e.g. a tf.io.gfile.GFile) that
      gets the same lines.
  """
  if not var_list:
    return
  lines = []
  total = total_slice = 0
  for v in sorted(var_list, key=lambda v: v.name):
    impl = (mesh_to_impl or {}).get(v.mesh)
    slice_size = impl.slice_size(v.shape) if impl is not None else 0
    total += v.size
    total_slice += slice_size
    if verbose:
      lines.append(f"Variable {v.name:40s} size {v.size:<12d} slice_size "
                   f"{slice_size:<12d} {v.shape.to_integer_list}")
  lines.append(f"{tag} count: {len(var_list)}  Total size: {total}  Total "
               f"slice_size: {total_slice}")
  _log_lines(lines, log_file)


def pretty_print_counters(counters):
  """Lines listing counters, sorted, with the totals of the collectives'
  input bytes (keys ending "/bytes") and wire bytes ("/wire_bytes")."""
  lines = ["Counters:"]
  for key in sorted(counters):
    lines.append(f"  {key}: {counters[key]}")
  totals = {"bytes": 0, "wire_bytes": 0}
  for key, value in counters.items():
    last = key.rsplit("/", 1)[-1]
    if key.startswith("comm/") and last in totals:
      totals[last] += value
  lines.append(f"  comm/total_bytes: {totals['bytes']}")
  lines.append(f"  comm/total_wire_bytes: {totals['wire_bytes']}")
  return lines


def _count_consumers(operations):
  """{mtf Tensor: how many operations (internal ones included) read it}."""
  counts = collections.Counter()
  for op in _with_internal_operations(operations):
    for t in set(op.inputs):
      counts[t] += 1
  return counts


def _with_internal_operations(operations):
  """`operations` in order, each followed by its internal operations (and
  theirs, for nested loops)."""
  for op in operations:
    yield op
    internal = getattr(op, "internal_operations", ())
    if internal:
      yield from _with_internal_operations(internal)


def _scope_name(name):
  return _SCOPE_CHARS.sub("_", name)


def _group(ops):
  ops = [op for op in ops if op is not None]
  if tf.executing_eagerly():
    return None
  return tf.group(*ops) if ops else tf.no_op()
