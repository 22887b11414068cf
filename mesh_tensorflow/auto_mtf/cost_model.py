"""Per-processor cost of an mtf graph under a layout, without lowering it.

The layout search (`layout_optimizer`) chooses, for each tensor-dimension
name, the mesh dimension it is split over. It needs the cost of every
operation under every assignment of that operation's dimension names;
`operation_cost` gives it, per processor:

- compute: the FLOPs of einsums (2 x the product of the sizes of all their
  dimensions, divided by the mesh dimensions splitting them) and
  convolutions, the bytes einsums read and write (their operands and
  result: a skinny matmul, such as the weight gradient of a few rows,
  costs its bytes more than its FLOPs, and at a lower rate than
  element-wise work streams them), the bytes element-wise and other slice
  work reads and writes, and the number of lowered TF ops (one per
  slicewise operation);
- collectives: what the lowering of the operation emits under the layout,
  by kind and mesh dimensions, with the wire bytes the lowering's counters
  give them (`collective_wire_bytes` of module mesh_impl).

What one operation's lowering does is its cost rule's to say: each
operation module registers its rules beside its lowerings
(`mesh_tensorflow.ops.cost_rules`), so that a change to a lowering and to
its cost are made in one file. This module aggregates them: who is charged
a pending sum (below), the graph's total, and the step time.

For the search's many calls, a `Pricer` prices many operations under one
assignment (the pending sums found for one serve the next), and
`cost_signature` tells which operations cost alike under every assignment
(repeated layers), so that each is priced once.

Replication is costed as it runs: an operation none of whose dimensions is
split over a mesh dimension runs whole on every processor of it.

Pending sums. An einsum or reduce_sum over a split dimension leaves partial
sums (`LazyAllreduceSum`). Linear consumers (add, add_n, scalar multiply,
reduce_sum, a reshape that keeps the layout, stop_gradient) keep them
pending; any other consumer reduces them (one allreduce); a reshape that
newly splits a pending mesh dimension reduce-scatters it; a pending sum read
by several operations is reduced when it is made. The rule here:

- the allreduce of a plainly reduced pending sum is charged to the operation
  that produced the pending tensor (the einsum, in the common case where its
  consumer is not linear): its output's slice bytes and pending mesh
  dimensions are what is reduced;
- a pending sum a linear consumer keeps pending is charged nowhere at that
  producer; it travels on to the consumer's output, and is charged there;
- what a reshape does with a pending input (reduce-scatter, allreduce of the
  scattered remainder) is charged to the reshape.

So the sum of `operation_cost` over a graph (`graph_cost`) counts every
collective of the lowering exactly once. Whether an input is pending
depends on how its producers' summed-over dimensions are assigned, and
whether an output stays pending on its linear consumer's other inputs:
names that may lie outside the operation. `operation_cost` reads them from
`assignment` (names absent are not split); `cost_dimension_names(op)` lists
every name the cost of `op` can depend on (on the tiny Transformer's
training graph at most 8, 1.7 on average, against 7 and 1.5 of the
operations' own names). Given only the operation's own names, the sum
misses the allreduces of sums kept pending through linear chains (most
gradient allreduces, which a scalar multiply of the optimizer reads): pass
the names `cost_dimension_names` gives.

Uneven splits (rules with allow_uneven; the search's allow_uneven). A
dimension of size n split k ways has slices of ceil(n/k), padding included,
in every rule (`CostLayout`). An operation with padded dimensions whose
lowering does not handle them (`Operation.handles_padding_of`) is priced
as `Lowering._lower_gathering` lowers it: an allconcat of each input's
padded dimensions, its rule under the layout without them (on the gathered
slices, every input plain, its pending sums reduced there), and the local
split of its outputs. An operation that does not keep its outputs' padding
zero (`padding_stays_zero`) pays a slicewise op per padded output, which
reduces a pending sum first (its allreduce charged to the operation).

`graph_cost` equals the lowering's counters (calls and wire bytes per kind
and mesh dimensions) for the operations modelled here; see
tests/auto_mtf/test_cost_model.py. Modelled without a check against
the lowering: top_k, cumsum and unstack over a split dimension, and
convolutions (their pending sums: summed-over split dimensions of their
inputs). Not modelled (costed as slicewise work without collectives, as
their modules register): while loops and the export collectives of
summaries of split tensors on SimdMeshImpl (the placement implementation
has none; the prediction follows it).
"""

import dataclasses
import math
from typing import Tuple

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import variables as variables_ops

Collective = cost_rules.Collective


@dataclasses.dataclass(frozen=True)
class OperationCost:
  """Per-processor cost of one or more operations (see the module doc)."""
  flops: int = 0
  elementwise_bytes: int = 0
  num_ops: int = 0
  collectives: Tuple[Collective, ...] = ()
  matmul_bytes: int = 0

  def __add__(self, other):
    return OperationCost(self.flops + other.flops,
                         self.elementwise_bytes + other.elementwise_bytes,
                         self.num_ops + other.num_ops,
                         self.collectives + other.collectives,
                         self.matmul_bytes + other.matmul_bytes)

  @classmethod
  def zero(cls):
    return cls()


ZERO = OperationCost()


@dataclasses.dataclass
class GraphCost:
  """The cost of a whole graph under one layout.

  Attributes:
    total: the OperationCost summed over all operations.
    by_operation: list of (operation, OperationCost), in graph order.
    collectives: {(kind, mesh dimension names joined by "_"):
      {"calls": int, "wire_bytes": int}}, keyed like the lowering's
      counters ("comm/<kind>/<mesh dims>/...").
  """
  total: OperationCost
  by_operation: list
  collectives: dict

# -------------------------------------------------------- static op facts


class _OpInfo:
  """What the cost of an operation needs that depends only on the graph."""

  __slots__ = ("op", "rule", "inputs", "outputs", "in_dims", "out_dims",
               "in_itemsize", "out_itemsize", "producers", "consumers",
               "names", "run_signature", "signature")

  def __init__(self, op, facts):
    self.op = op
    self.rule = cost_rules.rule_of(op)
    self.inputs = list(op.inputs)
    self.outputs = list(op.outputs)
    self.in_dims = [_dims(t.shape) for t in self.inputs]
    self.out_dims = [_dims(t.shape) for t in self.outputs]
    self.in_itemsize = [_itemsize(t) for t in self.inputs]
    self.out_itemsize = [_itemsize(t) for t in self.outputs]
    # Per input: the tensor's producing operation (None if not in graph).
    self.producers = [facts.producer.get(t) for t in self.inputs]
    # Per output: list of (consumer op, input index) pairs.
    self.consumers = [facts.consumers.get(t, []) for t in self.outputs]
    self.names = None
    self.run_signature = None
    self.signature = None


def _dims(shape):
  return tuple((d.name, d.size) for d in shape)


def _itemsize(t):
  try:
    return t.dtype.size
  except (AttributeError, TypeError):
    return 4


class _GraphFacts:
  """Producers and consumers of every tensor of one mtf graph."""

  def __init__(self, graph):
    self.graph = graph
    self.num_operations = len(graph.operations)
    self.producer = {}
    self.consumers = {}
    self.num_consumers = {}
    for op in _with_internal_operations(graph.operations):
      for t in op.outputs:
        self.producer[t] = op
      seen = set()
      for i, t in enumerate(op.inputs):
        self.consumers.setdefault(t, []).append((op, i))
        if t not in seen:
          seen.add(t)
          self.num_consumers[t] = self.num_consumers.get(t, 0) + 1
    self.infos = {}
    self.signature_ids = {}
    self.stage_names = None  # unshared_replica_names' pipelines.

  def intern(self, signature):
    """A small int standing for `signature` (a tuple of ints and facts):
    nested signatures stay flat, cheap to hash and compare."""
    return self.signature_ids.setdefault(signature, len(self.signature_ids))

  def info(self, op):
    info = self.infos.get(op)
    if info is None:
      info = self.infos[op] = _OpInfo(op, self)
    return info


def all_operations(mtf_graph):
  """The graph's operations and, after each, those inside it (the
  operations a lowering lowers)."""
  return _with_internal_operations(mtf_graph.operations)


def _with_internal_operations(operations):
  for op in operations:
    yield op
    internal = getattr(op, "internal_operations", ())
    if internal:
      yield from _with_internal_operations(internal)


# The facts of the graphs costed last (a few: a search costs one graph).
_FACTS = []
_MAX_GRAPHS = 4


def _facts(graph):
  # The operations' count without a copy of their list (Graph.operations
  # copies it; this is called once per operation priced).
  num_operations = len(getattr(graph, "_operations", None) or
                       graph.operations)
  for facts in _FACTS:
    if facts.graph is graph and facts.num_operations == num_operations:
      return facts
  facts = _GraphFacts(graph)
  _FACTS[:] = [f for f in _FACTS if f.graph is not graph][-(_MAX_GRAPHS - 1):]
  _FACTS.append(facts)
  return facts


# ----------------------------------------------------------- the context


class _Context:
  """Pending-sum states of tensors and what rules' run gives under one
  layout (memoized)."""

  __slots__ = ("facts", "layout", "memo", "results")

  def __init__(self, facts, layout):
    self.facts = facts
    self.layout = layout
    self.memo = {}
    self.results = {}

  def run(self, op_info):
    """op_info.rule.run under this layout (computed once: an operation's
    consumers ask for its pending sums, and it is priced itself), with the
    padding's work and collectives (see _gathered_run, _zero_padding)."""
    result = self.results.get(op_info)
    if result is None:
      padded = self.layout.padded_names(op_info.in_dims + op_info.out_dims)
      if not padded:
        result = op_info.rule.run(op_info, self)
      elif op_info.op.handles_padding_of(padded):
        result = _zero_padding(op_info, self.layout,
                               op_info.rule.run(op_info, self))
      else:
        result = _gathered_run(op_info, self.layout, padded)
      self.results[op_info] = result
    return result

  def keeps_pending(self, op_info, index, pending):
    """Whether input `index` of an operation, a sum pending over
    `pending`, stays pending: never for an operation lowered with its
    padded dimensions gathered (the gathering reduces every input)."""
    if self.gathers(op_info):
      return False
    return op_info.rule.keeps_pending(op_info, index, pending, self)

  def gathers(self, op_info):
    """Whether the lowering gathers padded dimensions around the
    operation (it has some and does not handle them)."""
    padded = self.layout.padded_names(op_info.in_dims + op_info.out_dims)
    return bool(padded) and not op_info.op.handles_padding_of(padded)

  def state(self, op_info, i):
    """The pending mesh dims (tuple, mesh order) of input i of an op."""
    producer = op_info.producers[i]
    if producer is None:
      return ()
    t = op_info.inputs[i]
    if t in self.memo:
      return self.memo[t]
    pinfo = self.facts.info(producer)
    if not pinfo.rule.may_pend:
      state = ()
    else:
      index = pinfo.outputs.index(t)
      state = self.run(pinfo).pending[index]
      if state and self.facts.num_consumers.get(t, 0) > 1:
        state = ()  # Reduced when made.
    self.memo[t] = state
    return state


# ------------------------------------------------------- uneven splits


class _WholeInputs:
  """The context a rule runs in when the lowering gathers an operation's
  padded dimensions: the layout without them, and every input plain (the
  gathering reduced its pending sums)."""

  __slots__ = ("layout",)

  def __init__(self, layout):
    self.layout = layout

  def state(self, op_info, i):
    del op_info, i
    return ()


def _gathered_run(info, layout, padded):
  """The RuleResult of an operation whose lowering does not handle its
  padded dimensions (named in `padded`), as Lowering._lower_gathering
  lowers it: each input's split dimensions of those names allconcatenated
  (padded slices) and their padding cut off; the operation run on those
  slices with the names whole (its pending sums reduced there); its outputs
  split and padded again (no communication); then their padding zeroed."""
  collectives = []
  num_ops = 0
  moved_bytes = 0
  seen = set()
  for i, t in enumerate(info.inputs):
    if t in seen:
      continue
    seen.add(t)
    dims = info.in_dims[i]
    sizes = layout.slice_sizes(dims)
    for axis, (name, size) in enumerate(dims):
      m = layout.mesh_dim(name)
      if m is None or name not in padded:
        continue
      collectives.append(cost_rules.collective(
          layout, "allconcat", (m,), math.prod(sizes) * info.in_itemsize[i]))
      sizes[axis] *= layout.sizes[m]
      if sizes[axis] != size:
        sizes[axis] = size  # The padding cut off: one slicewise op.
        num_ops += 1
        moved_bytes += 2 * math.prod(sizes) * info.in_itemsize[i]
  whole = layout.without(padded)
  result = info.rule.run(info, _WholeInputs(whole))
  collectives.extend(result.collectives)
  for k, pending in enumerate(result.pending):
    if pending:
      collectives.append(cost_rules.collective(
          whole, "allreduce", pending, cost_rules.slice_bytes(
              whole, info.out_dims[k], info.out_itemsize[k])))
  for k, dims in enumerate(info.out_dims):
    for name, size in dims:
      m = layout.mesh_dim(name)
      if m is not None and name in padded:
        # Padded (when uneven) and sliced locally.
        num_ops += 1 + (size % layout.sizes[m] != 0)
        moved_bytes += 2 * cost_rules.slice_bytes(whole, dims,
                                                  info.out_itemsize[k])
  return _zero_padding(info, layout, cost_rules.RuleResult(
      cost_rules.no_pending(info), collectives, flops=result.flops,
      elementwise_bytes=result.elementwise_bytes + moved_bytes,
      num_ops=result.num_ops + num_ops, matmul_bytes=result.matmul_bytes))


def _zero_padding(info, layout, result):
  """`result` with what Lowering._zero_padding adds after an operation
  that does not keep its outputs' padding zero: a slicewise op per padded
  output, which first reduces a pending sum (its allreduce charged here)."""
  if info.op.padding_stays_zero:
    return result
  pending = list(result.pending)
  collectives = list(result.collectives)
  num_ops = result.num_ops
  moved_bytes = 0
  for k, dims in enumerate(info.out_dims):
    if not layout.padded_names([dims]):
      continue
    out_bytes = cost_rules.slice_bytes(layout, dims, info.out_itemsize[k])
    if pending[k]:
      collectives.append(cost_rules.collective(layout, "allreduce",
                                               pending[k], out_bytes))
      pending[k] = ()
    num_ops += 1
    moved_bytes += 2 * out_bytes
  return cost_rules.RuleResult(
      pending, collectives, flops=result.flops,
      elementwise_bytes=result.elementwise_bytes + moved_bytes,
      num_ops=num_ops, matmul_bytes=result.matmul_bytes)


# -------------------------------------------------------------- public API


def _mesh_sizes(mesh_dimension_to_size):
  if isinstance(mesh_dimension_to_size, dict):
    return mesh_dimension_to_size
  shape = shape_lib.convert_to_shape(mesh_dimension_to_size)
  return {d.name: d.size for d in shape}


def _cost(info, ctx):
  """The OperationCost of one operation (see the module doc)."""
  result = ctx.run(info)
  collectives = list(result.collectives)
  layout = ctx.layout
  for k, pending in enumerate(result.pending):
    if not pending:
      continue
    t = info.outputs[k]
    n = ctx.facts.num_consumers.get(t, 0)
    if n == 0:
      continue
    if n == 1:
      consumer, index = info.consumers[k][0]
      cinfo = ctx.facts.info(consumer)
      if ctx.keeps_pending(cinfo, index, pending):
        continue
    c = cost_rules.collective(
        layout, "allreduce", pending,
        cost_rules.slice_bytes(layout, info.out_dims[k], info.out_itemsize[k]))
    if c is not None:
      collectives.append(c)
  return OperationCost(result.flops, result.elementwise_bytes,
                       result.num_ops, tuple(collectives),
                       result.matmul_bytes)


def operation_cost(operation, assignment, mesh_dimension_to_size,
                   allow_uneven=False):
  """The per-processor OperationCost of `operation` under a layout.

  Args:
    operation: an mtf Operation of a graph.
    assignment: {tensor-dimension name: mesh-dimension name}; names absent
      are not split (shard names "<name>@<mesh dim>" split as they say).
    mesh_dimension_to_size: {mesh-dimension name: size} in mesh order (or
      an mtf.Shape / "b:2;m:4").
    allow_uneven: the assignment may split a dimension unevenly
      (`LayoutRules.allow_uneven`): padded slices, and the gathering around
      operations that do not handle padding, are priced.

  Returns:
    an OperationCost (see the module doc for how pending sums are charged).
  """
  return Pricer(operation.graph, assignment, mesh_dimension_to_size,
                allow_uneven).cost(operation)


class Pricer:
  """Prices operations of one graph under one layout, as operation_cost
  does; the pending sums found for one operation serve the next (the
  layout search prices many operations under each assignment)."""

  def __init__(self, mtf_graph, assignment, mesh_dimension_to_size,
               allow_uneven=False):
    """See operation_cost for the arguments."""
    self._facts = _facts(mtf_graph)
    self._context = _Context(self._facts, cost_rules.CostLayout(
        assignment, _mesh_sizes(mesh_dimension_to_size), allow_uneven))

  def cost(self, operation):
    """The per-processor OperationCost of `operation` (of this graph)."""
    return _cost(self._facts.info(operation), self._context)


def runs_on_every_processor(operation):
  """Whether every processor runs `operation` on its own copy even where
  replicas share their computation (PlacementMeshImpl on one task's CPUs,
  MachineConstants.share_replicas): an Assign writes each processor's own
  variables, replicated or not."""
  return isinstance(operation, variables_ops.Assign)


def unshared_replica_names(operation):
  """The names of `operation` whose split keeps replicas from sharing its
  computation (MachineConstants.share_replicas): the stage dimension of a
  pipeline it computes in. Split over the mesh, a pipeline gives each
  idle stage's processors their own zeros and hands each processor its
  own shifted copy, so every processor computes the stage's operations,
  replicas included; a variable's read stays shared."""
  if isinstance(operation, variables_ops.Variable):
    return frozenset()
  facts = _facts(operation.graph)
  if facts.stage_names is None:
    # Imported here: the strategies package imports the ops this module's
    # rules come from.
    from mesh_tensorflow.strategies import pipelining  # pylint: disable=g-import-not-at-top
    facts.stage_names = frozenset(
        info.stage_dim.name
        for info in pipelining.pipeline_infos(operation.graph))
  if not facts.stage_names:
    return frozenset()
  return facts.stage_names.intersection(
      name for t in operation.inputs + operation.outputs
      for name in t.shape.dimension_names)


def export_cost(mtf_graph, outputs, assignment, mesh_dimension_to_size,
                allow_uneven=False):
  """The OperationCost of exporting a step's `outputs` (its loss) at its
  end: an output left a pending sum that no operation reduces (a loss
  averaged over a split batch, which nothing in the graph reads) is
  allreduced by its export (Lowering.export_to_tf_tensor), a collective
  the operations' costs do not charge (see the module doc).

  Args:
    mtf_graph: the graph.
    outputs: mtf Tensors of it the step exports.
    assignment, mesh_dimension_to_size, allow_uneven: as operation_cost's.
  """
  facts = _facts(mtf_graph)
  ctx = _Context(facts, cost_rules.CostLayout(
      assignment, _mesh_sizes(mesh_dimension_to_size), allow_uneven))
  collectives = []
  for t in dict.fromkeys(outputs):
    producer = facts.producer.get(t)
    if producer is None:
      continue
    info = facts.info(producer)
    k = info.outputs.index(t)
    pending = ctx.run(info).pending[k]
    if not pending or not _left_pending(info, k, pending, ctx):
      continue
    c = cost_rules.collective(
        ctx.layout, "allreduce", pending,
        cost_rules.slice_bytes(ctx.layout, info.out_dims[k],
                               info.out_itemsize[k]))
    if c is not None:
      collectives.append(c)
  return OperationCost(collectives=tuple(collectives))


def _left_pending(info, k, pending, ctx):
  """Whether output k of an operation, a sum pending over `pending`, is
  reduced by no operation: nothing reads it, or its one reader keeps it
  pending (_cost charges neither)."""
  consumers = info.consumers[k]
  n = ctx.facts.num_consumers.get(info.outputs[k], 0)
  if n == 0:
    return True
  if n == 1:
    consumer, index = consumers[0]
    return ctx.keeps_pending(ctx.facts.info(consumer), index, pending)
  return False


def cost_signature(operation):
  """An int that two operations of one graph share only if operation_cost
  prices them alike under every assignment: the same rule, attributes,
  shapes and dtypes, and alike where the cost reads its neighbours (the
  pending sums of its inputs, from their producers up; the sole consumer
  that may keep its output pending). Repeated layers share signatures, so
  the layout search prices each distinct operation once."""
  facts = _facts(operation.graph)
  info = facts.info(operation)
  if info.signature is None:
    outputs = []
    for k, t in enumerate(info.outputs):
      n = facts.num_consumers.get(t, 0)
      if n == 1:
        # _cost asks this consumer whether it keeps a pending output.
        consumer, index = info.consumers[k][0]
        outputs.append((_run_signature(facts, facts.info(consumer)), index))
      else:
        outputs.append(min(n, 2))  # Never reduced, or reduced when made.
    info.signature = facts.intern(
        (_run_signature(facts, info), tuple(outputs)))
  return info.signature


def _run_signature(facts, info):
  """An int standing for everything info.rule.run and keeps_pending read:
  the rule, its attributes, the shapes and dtypes, and (for a rule that
  reads them) the signatures of its inputs' pending sums."""
  if info.run_signature is None:
    states = ()
    if info.rule.passes or info.rule.may_keep:
      states = tuple(_state_signature(facts, info, i)
                     for i in range(len(info.inputs)))
    info.run_signature = facts.intern((
        info.rule, info.rule.attributes(info), _padding_class(info.op),
        tuple(info.in_dims), tuple(info.out_dims), tuple(info.in_itemsize),
        tuple(info.out_itemsize), states))
  return info.run_signature


def _padding_class(operation):
  """What decides how the lowering treats an operation's padded dimensions
  (its class's handles_padding_of and padding_stays_zero): operations that
  share a rule may differ there."""
  cls = type(operation)
  return (cls.handles_padding, cls.handles_padding_of,
          cls.padding_stays_zero)


def _state_signature(facts, info, i):
  """What _Context.state of input i depends on: -1 if it is never pending,
  else its producer's run signature and output index."""
  producer = info.producers[i]
  if producer is None:
    return -1
  t = info.inputs[i]
  pinfo = facts.info(producer)
  if not pinfo.rule.may_pend or facts.num_consumers.get(t, 0) > 1:
    return -1
  return (_run_signature(facts, pinfo), pinfo.outputs.index(t))


def cost_dimension_names(operation):
  """Every tensor-dimension name `operation_cost(operation, ...)` can
  depend on: the operation's own; where a consumer may keep its pending
  output pending (add, scalar multiply, reduce_sum, reshape), that
  consumer's and the names its other inputs' pending sums depend on; and
  the summed-over names that can leave its inputs pending, upstream
  through chains of such linear operations."""
  facts = _facts(operation.graph)
  info = facts.info(operation)
  if info.names is None:
    names = set(info.rule.names(info))
    todo = list(info.inputs) if info.rule.passes or info.rule.may_keep else []
    if info.rule.may_pend:
      for consumers in info.consumers:
        for consumer, _ in consumers:
          cinfo = facts.info(consumer)
          if cinfo.rule.may_keep:
            names.update(cinfo.rule.names(cinfo))
            todo.extend(cinfo.inputs)
    seen = set()
    while todo:
      t = todo.pop()
      if t in seen:
        continue
      seen.add(t)
      producer = facts.producer.get(t)
      if producer is None:
        continue
      pinfo = facts.info(producer)
      if not pinfo.rule.may_pend:
        continue
      names.update(pinfo.rule.names(pinfo))
      if pinfo.rule.passes:
        todo.extend(pinfo.inputs)
    info.names = frozenset(names)
  return info.names


def _assignment_from_rules(mesh_sizes, layout_rules, graph):
  rules = shape_lib.convert_to_layout_rules(layout_rules)
  names = set()
  for op in _with_internal_operations(graph.operations):
    for t in list(op.inputs) + list(op.outputs):
      names.update(d.name for d in t.shape)
  assignment = {}
  for name in names:
    m = rules.mesh_dimension_for(name)
    if m is not None and m in mesh_sizes:
      assignment[name] = m
  return assignment


def counted_collectives(counters):
  """{(kind, mesh dims): {"calls", "wire_bytes"}} of a Lowering's counters:
  what `graph_cost(...).collectives` predicts, as the lowering counted it."""
  result = {}
  for key, value in counters.items():
    parts = key.split("/")
    if parts[0] == "comm" and parts[3] in ("calls", "wire_bytes"):
      result.setdefault((parts[1], parts[2]), {})[parts[3]] = value
  return result


def graph_cost(mtf_graph, mesh_shape, layout_rules):
  """The GraphCost of `mtf_graph` on `mesh_shape` under `layout_rules`
  (an mtf.LayoutRules or a string like "batch:b;d_ff:m"; rules with
  allow_uneven price their padding)."""
  sizes = _mesh_sizes(mesh_shape)
  facts = _facts(mtf_graph)
  rules = shape_lib.convert_to_layout_rules(layout_rules)
  ctx = _Context(facts, cost_rules.CostLayout(
      _assignment_from_rules(sizes, rules, mtf_graph), sizes,
      rules.allow_uneven))
  total = ZERO
  by_operation = []
  collectives = {}
  for op in _with_internal_operations(mtf_graph.operations):
    cost = _cost(facts.info(op), ctx)
    by_operation.append((op, cost))
    total = total + cost
    for c in cost.collectives:
      key = (c.kind, "_".join(c.mesh_dimension_names))
      entry = collectives.setdefault(key, {"calls": 0, "wire_bytes": 0})
      entry["calls"] += c.calls
      entry["wire_bytes"] += c.wire_bytes
  return GraphCost(total, by_operation, collectives)


def predict_step_seconds(mtf_graph, mesh_shape, layout_rules, machine,
                         outputs=()):
  """(predicted seconds of one step, breakdown dict).

  `machine` has compute_seconds(flops, elementwise_bytes, num_ops,
  num_processors, matmul_bytes) and collective_seconds(kind,
  mesh_dimension_names, wire_bytes) (one call's time). The step time is the
  compute time of the summed per-processor work plus the time of every
  collective call, those of exporting `outputs` (export_cost) included.
  """
  sizes = _mesh_sizes(mesh_shape)
  cost = graph_cost(mtf_graph, sizes, layout_rules)
  total = cost.total
  if outputs:
    rules = shape_lib.convert_to_layout_rules(layout_rules)
    total = total + export_cost(
        mtf_graph, outputs, _assignment_from_rules(sizes, rules, mtf_graph),
        sizes, rules.allow_uneven)
  num_processors = math.prod(sizes.values())
  compute = machine.compute_seconds(total.flops, total.elementwise_bytes,
                                    total.num_ops, num_processors,
                                    total.matmul_bytes)
  by_collective = {}
  for c in total.collectives:
    key = (c.kind, "_".join(c.mesh_dimension_names))
    seconds = c.calls * machine.collective_seconds(
        c.kind, c.mesh_dimension_names, c.wire_bytes // c.calls)
    by_collective[key] = by_collective.get(key, 0.0) + seconds
  seconds = compute + sum(by_collective.values())
  breakdown = {"compute_seconds": compute,
               "collective_seconds": by_collective,
               "flops": total.flops,
               "elementwise_bytes": total.elementwise_bytes,
               "matmul_bytes": total.matmul_bytes,
               "num_ops": total.num_ops,
               "collectives": cost.collectives}
  return seconds, breakdown
