"""Prices every operation of a graph under every assignment of its
dimension names: the table the layout optimizer's time objective sums.

An operation's cost (cost_model.operation_cost: per-processor FLOPs,
element-wise bytes, lowered ops and collectives) depends only on how the
names it reads are split (cost_model.cost_dimension_names: its own, and
those of neighbours that keep sums pending), so operations are grouped by
that set of names, and within a group by their cost_model.cost_signature
(rule, attributes, shapes, dtypes and the neighbours the cost reads), which
repeated layers share: each distinct operation is priced once per
assignment, under one cost_model.Pricer per assignment.
"""

import collections

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.auto_mtf import cost_model


def operation_seconds(cost, machine, num_processors):
  """Predicted seconds of one cost_model.OperationCost on `machine`, when
  `num_processors` processors compute distinct slices."""
  compute, collectives = operation_seconds_parts(cost, machine,
                                                 num_processors)
  return compute + collectives


def operation_seconds_parts(cost, machine, num_processors):
  """(compute seconds, collective seconds) of operation_seconds."""
  compute = machine.compute_seconds(cost.flops, cost.elementwise_bytes,
                                    cost.num_ops, num_processors,
                                    cost.matmul_bytes)
  collectives = 0.0
  for collective in cost.collectives:
    calls = max(int(collective.calls), 1)
    collectives += calls * machine.collective_seconds(
        collective.kind, tuple(collective.mesh_dimension_names),
        collective.wire_bytes / calls)
  return compute, collectives


def cost_table(estimator, validator, machine, assignments_of, scale=None):
  """{dimension set: [(assignment, seconds)]}.

  Operations are grouped by the splittable names their cost depends on
  (cost_model.cost_dimension_names: their own, and those of producers and
  consumers that keep sums pending); each group is priced under every
  allowed assignment of its names.

  Args:
    estimator: a memory_estimator.MemoryEstimator (its graph and mesh).
    validator: its valid_layouts.LayoutValidator.
    machine: a machine.MachineConstants (compute_seconds and
      collective_seconds).
    assignments_of: fn(dimension set) -> the allowed assignments (dicts)
      of those names, as the layout optimizer has them.
    scale: optional proxy_layers.Scale of a proxy graph: each operation's
      seconds count as many times as its layer stands for.
  """
  mesh_sizes = validator.mesh_dimension_name_to_size
  num_processors = shape_lib.list_product(mesh_sizes.values())
  splittable = validator.splittable_mtf_dimension_names
  share_replicas = bool(getattr(machine, "share_replicas", False))
  graph = estimator.mtf_graph
  # Signatures interned in one table for every graph are comparable across
  # graphs (they are made of rules, shapes, dtypes and neighbours' such
  # signatures), so the prices of the operations that graphs share (the
  # planner's structures: recompute variants, say) are reused. Only for a
  # graph none of whose signatures were interned yet.
  facts = cost_model._facts(graph)  # pylint: disable=protected-access
  if not facts.signature_ids:
    facts.signature_ids = _SHARED_SIGNATURE_IDS
  shared = facts.signature_ids is _SHARED_SIGNATURE_IDS
  if len(_SHARED_SECONDS) > _MAX_SHARED_SECONDS:
    _SHARED_SECONDS.clear()
  context = (repr(machine), tuple(mesh_sizes.items()),
             bool(validator.allow_uneven))
  groups = collections.defaultdict(list)
  for operation in cost_model.all_operations(graph):
    names = frozenset(cost_model.cost_dimension_names(operation) & splittable)
    groups[names].append(operation)
  table = {}
  for dimension_set, operations in groups.items():
    signatures = [cost_model.cost_signature(op) for op in operations]
    distinct = dict(zip(signatures, operations))
    own_names = {signature: _own_names(operation)
                 for signature, operation in distinct.items()}
    # Operations of one term share their signature's price (times their
    # factor); the others' terms are priced one by one.
    factors = [1] * len(operations)
    extra = [None] * len(operations)
    if scale is not None:
      for i, operation in enumerate(operations):
        terms = scale.terms(operation)
        if len(terms) == 1:
          factors[i] = terms[0][1]
        else:
          factors[i], extra[i] = 0, terms
    costs = []
    for assignment in assignments_of(dimension_set):
      pricer = cost_model.Pricer(graph, assignment, mesh_sizes,
                                 validator.allow_uneven)
      seconds_of = {}
      assignment_key = tuple(sorted(assignment.items()))
      for signature, operation in distinct.items():
        key = (context, signature, assignment_key) if shared else None
        found = _SHARED_SECONDS.get(key) if shared else None
        if found is not None:
          seconds_of[signature] = found
          continue
        processors = num_processors
        if share_replicas:
          processors = _distinct_slices(own_names[signature], assignment,
                                        mesh_sizes)
        seconds_of[signature] = operation_seconds(
            pricer.cost(operation), machine, processors)
        if shared:
          _SHARED_SECONDS[key] = seconds_of[signature]
      # Summed in graph order, as pricing every operation would.
      seconds = 0.0
      for signature, factor, terms in zip(signatures, factors, extra):
        seconds += factor * seconds_of[signature]
        for term, term_factor in terms or ():
          processors = num_processors
          if share_replicas:
            processors = _distinct_slices(_own_names(term), assignment,
                                          mesh_sizes)
          seconds += term_factor * operation_seconds(
              pricer.cost(term), machine, processors)
      costs.append((assignment, seconds))
    table[dimension_set] = costs
  return table


# Shared by the graphs cost_table prices (see there); the seconds of
# (machine, mesh, uneven, signature, assignment), cleared when large.
_SHARED_SIGNATURE_IDS = {}
_SHARED_SECONDS = {}
_MAX_SHARED_SECONDS = 2_000_000


def computing_processors(operation, assignment, mesh_sizes, machine):
  """How many processors compute distinct slices of `operation`: all of
  them, or with a machine whose replicas share work (share_replicas), one
  per distinct slice."""
  if getattr(machine, "share_replicas", False):
    return _distinct_slices(_own_names(operation), assignment, mesh_sizes)
  return shape_lib.list_product(mesh_sizes.values())


def _own_names(operation):
  """(the dimension names of an operation's inputs and outputs, those of
  them whose split unshares replicas: cost_model.unshared_replica_names);
  None for one every processor runs even with shared replicas (an
  Assign)."""
  if cost_model.runs_on_every_processor(operation):
    return None
  return (frozenset(name for tensor in operation.inputs + operation.outputs
                    for name in tensor.shape.dimension_names),
          cost_model.unshared_replica_names(operation))


def _distinct_slices(own_names, assignment, mesh_sizes):
  """How many processors compute an operation of `own_names` (_own_names)
  with shared replicas: one per distinct slice (the product of the sizes
  of the mesh dimensions its own dimensions are split over); all of them
  for None or when a name that unshares replicas is split."""
  if own_names is not None and any(
      name in assignment for name in own_names[1]):
    own_names = None
  if own_names is None:
    return shape_lib.list_product(mesh_sizes.values())
  own_names = own_names[0]
  used = {assignment[name] for name in own_names if name in assignment}
  return shape_lib.list_product(mesh_sizes[m] for m in used)
