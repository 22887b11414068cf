"""Peak memory of an mtf graph, estimated from its mtf tensors.

A lowered mtf operation may make several TF tensors, temporaries included,
but the mtf tensors' per-processor sizes under a layout are a close, cheap
stand-in that needs no lowering. `MemoryEstimator` bundles what the layout
optimizer reads: a `LayoutValidator` (which assignments are allowed) and a
`GraphInterface` (operations, tensors, sizes) with the graph's outputs
marked final, so that the schedule never frees them.

Changed from the original: variables (weights and optimizer slots) are
marked final too, since they stay in memory for the whole step; the outputs
of operations whose lowering passes a tensor on unchanged (`passed_on`) are
aliases of it, not new buffers. With `as_lowered` (plan_pricing's
account), as TF runs the lowering: an mtf.Assign reads its new values
apart, each as TF assigns it, as soon as it exists (autostacked variables'
values together, given `stack_groups`); a variable whose activation dtype
is not its slices' is read through a cast, a copy freed after its last
reader (`read_through_cast`), not held.
"""

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import control_flow
from mesh_tensorflow.ops import debug
from mesh_tensorflow.ops import variables as variables_lib
from mesh_tensorflow.auto_mtf import graph_interface
from mesh_tensorflow.auto_mtf import valid_layouts


class MemoryEstimator(object):
  """Estimates the per-processor memory of an mtf graph under a layout.

  Example:
    estimator = MemoryEstimator(mtf_graph, mesh_shape, [loss])
    validator = estimator.get_layout_validator()
    graph = estimator.get_graph_interface()

  Attributes:
    mtf_graph: the mtf.Graph.
    mesh_shape: the mesh's mtf.Shape.
    mtf_outputs: the output mtf Tensors (kept in memory to the end).
    allow_uneven: whether layouts may split a dimension unevenly.
  """

  def __init__(self, mtf_graph, mesh_shape, mtf_outputs=(),
               allow_uneven=False, as_lowered=False, stack_groups=None):
    """Args: an mtf.Graph, the mesh shape (mtf.Shape or spec), an
    optional iterable of the computation's output mtf Tensors, whether
    layouts may split dimensions unevenly (padded; LayoutValidator),
    whether to mark the graph as TF runs its lowering (see the module
    docstring; plan_pricing's account: the layout search, whose proxies
    and LIST schedule assume one read per Assign, keeps the original's),
    and optionally
    {mtf Variable: its autostack group} (storage.autostack.plan under the
    layout: their new values are stacked, each group once all of its
    values exist, before they are assigned)."""
    self.mtf_graph = mtf_graph
    self.as_lowered = bool(as_lowered)
    self.stack_groups = stack_groups or {}
    self.mesh_shape = shape_lib.convert_to_shape(mesh_shape)
    self.mtf_outputs = tuple(mtf_outputs)
    self.allow_uneven = bool(allow_uneven)
    self._layout_validator = None
    self._graph_interface = None

  def get_layout_validator(self):
    """The valid_layouts.LayoutValidator of the graph and mesh (made once)."""
    if self._layout_validator is None:
      self._layout_validator = valid_layouts.LayoutValidator(
          self.mtf_graph, self.mesh_shape, self.allow_uneven)
    return self._layout_validator

  def get_graph_interface(self):
    """The graph_interface.GraphInterface of the graph, outputs and
    variables final (made once)."""
    if self._graph_interface is None:
      interface = graph_interface.GraphInterface(self.mtf_graph)
      for output in self.mtf_outputs:
        interface.set_tensor_final(output.name)
      for variable in self.mtf_graph.all_variables:
        if not (self.as_lowered and read_through_cast(variable)):
          interface.set_tensor_final(variable.outputs[0].name)
      for op in self.mtf_graph.operations:
        for output, source in passed_on(op):
          interface.set_tensor_alias(output.name, source.name)
        if self.as_lowered and isinstance(op, variables_lib.Assign):
          interface.set_operation_reads_apart(
              op.name, assign_groups(op, self.stack_groups))
      self._graph_interface = interface
    return self._graph_interface


def read_through_cast(variable):
  """Whether the lowering reads the mtf Variable's slices through a cast
  (to its activation dtype): a new buffer, its output, apart from the
  slices held for the step."""
  return variable.slice_dtype != variable.activation_dtype


def assign_groups(op, stack_groups):
  """[[input names]] of an mtf.Assign's new values stacked together (those
  of variables of one group of `stack_groups`, {Variable: group})."""
  groups = {}
  for var, value in zip(op.variables, op.inputs):
    group = stack_groups.get(getattr(var, "variable", var))
    if group is not None:
      groups.setdefault(id(group), []).append(value.name)
  return [g for g in groups.values() if len(g) > 1]


def passed_on(op):
  """[(output, the input whose lowering it is)] of an mtf operation that
  lowers to its input's slices or to tf.identity of them, which TF hands
  out as the same buffer: mtf.depend, a pipeline iteration's marker, a
  scalar summary.

  Not a custom gradient's operation, though it passes on its forward
  outputs: it does not read them, so a schedule may run it first, and the
  source must exist before its alias is read."""
  # Imported here: the strategies import the operations.
  from mesh_tensorflow.strategies import pipelining  # pylint: disable=g-import-not-at-top
  if isinstance(op, (control_flow.Depend, debug.ScalarSummaryOperation)):
    return [(op.outputs[0], op.inputs[0])]
  if isinstance(op, pipelining.PipelineIterationOperation):
    return list(zip(op.outputs, op.inputs))
  return []
