"""Prices every operation of a graph under every assignment of its
dimension names: the table the layout optimizer's time objective sums.

An operation's cost (cost_model.operation_cost: per-processor FLOPs,
element-wise bytes, lowered ops and collectives) depends only on how the
dimension names of its inputs and outputs are split, so operations are
grouped by that set of names, and within a group by their signature (class
and shapes), which repeated layers share: each distinct operation is priced
once per assignment, then multiplied by its count.
"""

import collections

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.auto_mtf import layout_optimizer


def operation_seconds(cost, machine, num_processors):
  """Predicted seconds of one cost_model.OperationCost on `machine`."""
  seconds = machine.compute_seconds(cost.flops, cost.elementwise_bytes,
                                    cost.num_ops, num_processors)
  for collective in cost.collectives:
    calls = max(int(collective.calls), 1)
    seconds += calls * machine.collective_seconds(
        collective.kind, tuple(collective.mesh_dimension_names),
        collective.wire_bytes / calls)
  return seconds


def cost_table(estimator, validator, machine):
  """{operation dimension set: {local variable name: seconds}}.

  Args:
    estimator: a memory_estimator.MemoryEstimator (its graph and mesh).
    validator: its valid_layouts.LayoutValidator.
    machine: a machine.MachineConstants (compute_seconds and
      collective_seconds).
  """
  mesh_sizes = validator.mesh_dimension_name_to_size
  num_processors = shape_lib.list_product(mesh_sizes.values())
  splittable = validator.splittable_mtf_dimension_names
  groups = collections.defaultdict(collections.Counter)
  representative = {}
  for operation in estimator.mtf_graph.operations:
    names = set()
    for tensor in list(operation.inputs) + list(operation.outputs):
      names.update(tensor.shape.dimension_names)
    dimension_set = frozenset(names & splittable)
    signature = _signature(operation)
    groups[dimension_set][signature] += 1
    representative.setdefault(signature, operation)
  table = {}
  for dimension_set, counts in groups.items():
    costs = {}
    for assignment in layout_optimizer._generate_assignments(  # pylint: disable=protected-access
        dimension_set, mesh_sizes):
      if not all(validator.is_valid_assignment(d, m)
                 for d, m in assignment.items()):
        continue
      seconds = 0.0
      for signature, count in counts.items():
        cost = cost_model.operation_cost(representative[signature],
                                         assignment, mesh_sizes)
        seconds += count * operation_seconds(cost, machine, num_processors)
      costs[layout_optimizer._local_var_name(  # pylint: disable=protected-access
          dimension_set, assignment)] = seconds
    table[dimension_set] = costs
  return table


def _signature(operation):
  """Operations with equal signatures cost the same under every layout."""
  custom = getattr(cost_model, "operation_signature", None)
  if custom is not None:
    return custom(operation)
  return (type(operation).__name__,
          tuple((t.shape, t.dtype) for t in operation.inputs),
          tuple((t.shape, t.dtype) for t in operation.outputs))
