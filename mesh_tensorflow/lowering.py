"""Lowering: translates an mtf Graph into TensorFlow ops on slices.

`Lowering(graph, {mesh: mesh_impl})` lowers every operation, in order, into
per-slice TF ops plus collectives. It works the same eagerly (ops run as they
are lowered), inside a `tf.function` trace, and in `tf.compat.v1` graph mode.
"""

import collections
import contextlib
import re

from absl import logging
import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import stacking

_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


class Lowering:
  """The TF lowering of an mtf Graph.

  Args:
    graph: the mtf.Graph.
    mesh_to_impl: dict from each mtf.Mesh the graph uses to a MeshImpl.
    autostack: store same-shaped variables that are always assigned
      together as one stacked TF variable per processor, where the mesh
      implementation supports it (see `stacking`): fewer TF variables and
      ops, same results and checkpoints.
    log_file: optional path; the variable table and counters are appended.

  Attributes:
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
    self._check_meshes_and_layouts()
    self.autostack = autostack
    self._stack_groups = (
        stacking.plan(graph, self.mesh_to_impl)
        if autostack else {})
    with self._counting():
      for op in graph.operations:
        self.lower_operation(op)
    self._log(log_file)

  def lower_operation(self, op):
    """Lowers one operation, in its name scope, counting its outputs.

    Operations that lower other operations themselves (the condition and
    body of a while loop) call this for each of them, so that an operation
    is lowered the same way inside a body as outside.
    """
    if op.lower_in_name_scope:
      with tf.name_scope(_scope_name(op.name)):
        op.lower(self)
    else:
      op.lower(self)
    for t in op.outputs:
      if t not in self.tensors:
        continue
      kind = type(op).__name__
      self.add_counter(f"compute/{kind}/ops", 1)
      self.add_counter(f"compute/{kind}/output_elements",
                       self.laid_out_size(t))

  @contextlib.contextmanager
  def _counting(self):
    """Routes the mesh implementations' collective counts to this lowering."""
    impls = set(self.mesh_to_impl.values())
    previous = {impl: impl.set_counter_fn(self.add_counter) for impl in impls}
    try:
      yield
    finally:
      for impl, fn in previous.items():
        impl.set_counter_fn(fn)

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
      for t in op.outputs:
        try:
          impl.slice_shape(t.shape)
        except errors.LayoutError as e:
          raise type(e)(f"Tensor {t.name} ({t.shape}) on mesh "
                        f"{impl.shape.to_string}: {e}") from None
      op.check_splits(self)

  def stack_group(self, variable):
    """The group `variable` is stacked with in this lowering, or None."""
    return self._stack_groups.get(variable)

  def mesh_impl(self, m):
    """The MeshImpl of an mtf Mesh, Tensor or Operation."""
    mesh = m if not hasattr(m, "mesh") else m.mesh
    return self.mesh_to_impl[mesh]

  def export_to_tf_tensor(self, x):
    """The full value of mtf Tensor `x` as one tf.Tensor."""
    with self._counting():
      return self.mesh_impl(x).export_to_tf_tensor(
          self.laid_out_tensor(x), x.shape)

  def lowered_operation(self, op):
    """The TF op of an mtf Operation (an Assign, say); None when eager."""
    return self.operations[op]

  def laid_out_tensor(self, x):
    """The materialised laid-out value of mtf Tensor `x`."""
    with self._counting():
      return self.tensors[x].to_laid_out_tensor()

  def set_tensor_lowering(self, tensor, laid_out_tensor):
    """Records the lowered value of `tensor`, checking its slice shape."""
    impl = self.mesh_impl(tensor)
    expected = impl.slice_shape(tensor.shape)
    if isinstance(laid_out_tensor, mesh_impl_lib.LaidOutTensor):
      first = laid_out_tensor.tensor_list[0]
      actual = first.shape.as_list() if hasattr(first, "shape") else None
    else:
      actual = laid_out_tensor.slice_shape
    if actual is not None and actual != expected:
      raise errors.ShapeError(
          f"Lowering of {tensor.operation.name!r} produced slices of shape "
          f"{actual} for {tensor.name} {tensor.shape}; expected {expected}.")
    self.tensors[tensor] = laid_out_tensor

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
    if mesh_impl not in self._random_steps:
      self._random_steps[mesh_impl] = mesh_impl.next_random_step()
    return self._random_steps[mesh_impl]

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
    """(key, value) pairs: `comm/<collective>/<mesh dims>/calls|bytes` and
    `compute/<Operation class>/ops|output_elements`."""
    return list(self._counters.items())

  def laid_out_size(self, tensor):
    return self.mesh_impl(tensor).laid_out_size(tensor.shape)

  def _log(self, log_file):
    lines = variable_size_table(self.graph.all_variables, self.mesh_to_impl)
    lines += pretty_print_counters(self._counters)
    for line in lines:
      logging.info(line)
    if log_file:
      with tf.io.gfile.GFile(log_file, "a") as f:
        f.write("\n".join(lines) + "\n")


def variable_size_table(variables, mesh_to_impl):
  """Lines of a table: each variable's shape, size and per-slice size."""
  if not variables:
    return []
  lines = ["Variables (name, shape, elements, elements per processor):"]
  total = 0
  for v in variables:
    impl = mesh_to_impl.get(v.mesh)
    per_slice = impl.slice_size(v.shape) if impl is not None else v.size
    total += v.size
    lines.append(f"  {v.name:40s} {str(v.shape.to_integer_list):24s} "
                 f"{v.size:>12d} {per_slice:>12d}")
  lines.append(f"  total: {total} elements in {len(variables)} variables")
  return lines


def pretty_print_counters(counters):
  """Lines listing counters, sorted, with the total communication bytes."""
  lines = ["Counters:"]
  for key in sorted(counters):
    lines.append(f"  {key}: {counters[key]}")
  comm_bytes = sum(v for k, v in counters.items()
                   if k.startswith("comm/") and k.endswith("/bytes"))
  lines.append(f"  comm/total_bytes: {comm_bytes}")
  return lines


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
