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

`graph_cost` equals the lowering's counters (calls and wire bytes per kind
and mesh dimensions) for the operations modelled here; see
tests/auto_mtf/test_cost_model.py. Modelled without a check against
the lowering: top_k, cumsum and unstack over a split dimension, and
convolutions (their pending sums: summed-over split dimensions of their
inputs). Not modelled (costed as slicewise work without collectives):
while loops and the export collectives of summaries of split tensors on
SimdMeshImpl (the placement implementation has none; the prediction
follows it).
"""

import dataclasses
import math
from typing import Tuple

from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib


@dataclasses.dataclass(frozen=True)
class Collective:
  """One kind of collective on some mesh dimensions, per processor.

  Attributes:
    kind: "allreduce", "reduce_scatter", "alltoall", "allconcat" or
      "receive".
    mesh_dimension_names: the mesh dimensions it runs over, in mesh order.
    slice_bytes: the input bytes each processor holds, per call.
    wire_bytes: bytes sent, summed over all processors, over all calls
      (as the lowering's counters count them).
    calls: how many such calls.
  """
  kind: str
  mesh_dimension_names: Tuple[str, ...]
  slice_bytes: int
  wire_bytes: int
  calls: int = 1


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


# ------------------------------------------------------------------ layout


class _Layout:
  """Resolves dimension names to mesh dimensions, fast."""

  __slots__ = ("assignment", "sizes", "order", "num_processors", "resolved")

  def __init__(self, assignment, mesh_dimension_to_size):
    self.assignment = assignment
    self.sizes = mesh_dimension_to_size
    self.order = {m: i for i, m in enumerate(mesh_dimension_to_size)}
    self.num_processors = math.prod(mesh_dimension_to_size.values())
    self.resolved = {}  # {name: mesh_dim(name)}, filled as asked.

  def mesh_dim(self, name):
    """The mesh dimension `name` is split over, or None."""
    try:
      return self.resolved[name]
    except KeyError:
      pass
    m = self.assignment.get(name)
    if m is None and shape_lib.SHARD_MARK in name:
      m = shape_lib.split_shard_dimension_name(name)[1]
    m = self.resolved[name] = m if m in self.sizes else None
    return m

  def slice_sizes(self, dims):
    """Per-processor sizes of `dims` ((name, size) pairs)."""
    out = []
    for name, size in dims:
      m = self.mesh_dim(name)
      out.append(size // self.sizes[m] if m is not None else size)
    return out

  def slice_elements(self, dims):
    n = 1
    for name, size in dims:
      m = self.mesh_dim(name)
      n *= size // self.sizes[m] if m is not None else size
    return n

  def sort(self, mesh_dims):
    return tuple(sorted(set(mesh_dims), key=self.order.__getitem__))

  def group_size(self, mesh_dims):
    return math.prod(self.sizes[m] for m in mesh_dims)


def _collective(layout, kind, mesh_dims, slice_bytes, receivers=0):
  """A Collective as the lowering counts it, or None when it is skipped
  (a group of one member, except receive which is always counted)."""
  n = layout.group_size(mesh_dims)
  if n == 1 and kind != "receive":
    return None
  wire = mesh_impl_lib.collective_wire_bytes(
      kind, n, layout.num_processors // n, slice_bytes, receivers)
  return Collective(kind, tuple(mesh_dims), slice_bytes, wire)


# -------------------------------------------------------- static op facts


class _OpInfo:
  """What the cost of an operation needs that depends only on the graph."""

  __slots__ = ("op", "rule", "inputs", "outputs", "in_dims", "out_dims",
               "in_itemsize", "out_itemsize", "producers", "consumers",
               "names", "run_signature", "signature")

  def __init__(self, op, facts):
    self.op = op
    self.rule = _rule_for(op)
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
  for facts in _FACTS:
    if facts.graph is graph and facts.num_operations == len(
        graph.operations):
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
    consumers ask for its pending sums, and it is priced itself)."""
    result = self.results.get(op_info)
    if result is None:
      result = self.results[op_info] = op_info.rule.run(op_info, self)
    return result

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


class _Result:
  """What lowering one operation does (its own part)."""

  __slots__ = ("flops", "elementwise_bytes", "num_ops", "collectives",
               "pending", "matmul_bytes")

  def __init__(self, pending, collectives=(), flops=0, elementwise_bytes=0,
               num_ops=1, matmul_bytes=0):
    self.pending = pending
    self.collectives = [c for c in collectives if c is not None]
    self.flops = flops
    self.elementwise_bytes = elementwise_bytes
    self.num_ops = num_ops
    self.matmul_bytes = matmul_bytes


def _slice_bytes(layout, dims, itemsize):
  return layout.slice_elements(dims) * itemsize


def _io_bytes(info, layout):
  return (sum(_slice_bytes(layout, d, s)
              for d, s in zip(info.in_dims, info.in_itemsize)) +
          sum(_slice_bytes(layout, d, s)
              for d, s in zip(info.out_dims, info.out_itemsize)))


# ------------------------------------------------------------------ rules


class _Rule:
  """The default: every input is reduced plainly, slicewise work, no
  collectives, nothing pending."""

  # Whether an output can be a pending sum; whether that depends on the
  # inputs' pending sums (passes them on); whether the rule can keep an
  # input pending (else every pending input is reduced plainly). Only a
  # rule that passes or keeps reads its inputs' pending sums (ctx.state).
  may_pend = False
  passes = False
  may_keep = False

  def run(self, info, ctx):
    return _Result([()] * len(info.outputs),
                   elementwise_bytes=_io_bytes(info, ctx.layout))

  def keeps_pending(self, info, index, pending, ctx):
    del info, index, pending, ctx
    return False

  def attributes(self, info):
    """What run and keeps_pending read of the operation besides its
    shapes, dtypes and inputs' pending sums (part of its cost_signature)."""
    del info
    return ()

  def names(self, info):
    """Dimension names this operation's own lowering depends on."""
    names = set()
    for dims in info.in_dims + info.out_dims:
      names.update(n for n, _ in dims)
    return names


class _NoWork(_Rule):
  """Variables, constants, imports: one op, no element-wise work."""

  def run(self, info, ctx):
    return _Result([()] * len(info.outputs))


class _Einsum(_Rule):
  may_pend = True

  def run(self, info, ctx):
    layout = ctx.layout
    out = info.out_dims[0]
    out_names = {n for n, _ in out}
    all_dims = []
    for dims in info.in_dims:
      for d in dims:
        if d not in all_dims:
          all_dims.append(d)
    by_mesh = {}
    for d in all_dims:
      m = layout.mesh_dim(d[0])
      if m is not None:
        by_mesh.setdefault(m, []).append(d)
    replicate = set()
    for dims in by_mesh.values():
      if len(dims) > 1:
        keep = max(dims, key=lambda d: (d[0] in out_names, d[1]))
        replicate.update(d for d in dims
                         if d != keep and d[0] not in out_names)
    collectives = []
    if replicate:
      for dims, itemsize in zip(info.in_dims, info.in_itemsize):
        sizes = layout.slice_sizes(dims)
        for k, d in enumerate(dims):
          if d in replicate:
            m = layout.mesh_dim(d[0])
            collectives.append(_collective(
                layout, "allconcat", (m,), math.prod(sizes) * itemsize))
            sizes[k] = d[1]
    reduced = layout.sort(
        layout.mesh_dim(n) for (n, s) in all_dims
        if n not in out_names and (n, s) not in replicate and
        layout.mesh_dim(n) is not None)
    flops = 2
    for d in all_dims:
      m = layout.mesh_dim(d[0])
      whole = m is None or d in replicate
      flops *= d[1] if whole else d[1] // layout.sizes[m]
    pending = reduced
    intersection = [d for d in out if d in all_dims]
    if len(intersection) != len(out):
      # Broadcast to the output right away: the partial sums of the
      # intersection are reduced here.
      if reduced:
        collectives.append(_collective(
            layout, "allreduce", reduced,
            _slice_bytes(layout, intersection, info.out_itemsize[0])))
      pending = ()
    # Its operands and result pass through memory too: a skinny matmul
    # (a weight gradient of few rows) costs its bytes more than its FLOPs.
    return _Result([pending], collectives, flops=flops,
                   matmul_bytes=_io_bytes(info, layout))


class _Reduce(_Rule):
  may_pend = True
  passes = True
  may_keep = True

  def attributes(self, info):
    return (info.op.reduction_fn_string,)

  def _mesh_dims(self, info, layout):
    out_names = {n for n, _ in info.out_dims[0]}
    return layout.sort(layout.mesh_dim(n) for n, _ in info.in_dims[0]
                       if n not in out_names and
                       layout.mesh_dim(n) is not None)

  def run(self, info, ctx):
    layout = ctx.layout
    mesh_dims = self._mesh_dims(info, layout)
    kind = info.op.reduction_fn_string
    nbytes = _io_bytes(info, layout)
    if kind == "SUM":
      pending = ctx.state(info, 0)
      if pending and not set(pending) & set(mesh_dims):
        return _Result([layout.sort(pending + mesh_dims)],
                       elementwise_bytes=nbytes)
      return _Result([mesh_dims], elementwise_bytes=nbytes)
    collectives = []
    if mesh_dims:
      collectives.append(_collective(
          layout, "allreduce", mesh_dims,
          _slice_bytes(layout, info.out_dims[0], info.out_itemsize[0])))
    return _Result([()], collectives, elementwise_bytes=nbytes)

  def keeps_pending(self, info, index, pending, ctx):
    return (info.op.reduction_fn_string == "SUM" and
            not set(pending) & set(self._mesh_dims(info, ctx.layout)))


class _Linear(_Rule):
  """slicewise_delay_allreduce: pending when every input is pending over
  the same mesh dimensions."""

  may_pend = True
  passes = True
  may_keep = True

  def applies(self, info, layout):
    del layout
    return True

  def _common(self, info, ctx):
    states = [ctx.state(info, i) for i in range(len(info.inputs))]
    first = states[0]
    if first and all(s == first for s in states):
      return first
    return ()

  def run(self, info, ctx):
    if not self.applies(info, ctx.layout):
      return _Rule.run(self, info, ctx)
    return _Result([self._common(info, ctx)],
                   elementwise_bytes=_io_bytes(info, ctx.layout))

  def keeps_pending(self, info, index, pending, ctx):
    return (self.applies(info, ctx.layout) and
            self._common(info, ctx) == pending)


class _SameShapeLinear(_Linear):
  """add / add_n: linear only when every operand has the output's shape."""

  def applies(self, info, layout):
    out = info.out_dims[0]
    return all(d == out for d in info.in_dims)


class _Identity(_Rule):
  """stop_gradient: the output is the input's laid-out value."""

  may_pend = True
  passes = True
  may_keep = True

  def run(self, info, ctx):
    return _Result([ctx.state(info, 0)], num_ops=0)

  def keeps_pending(self, info, index, pending, ctx):
    return True


class _PassThrough(_Rule):
  """Markers that hand every input on as the same-index output, pending
  or not, with no TF op (a pipeline's iteration marker)."""

  may_pend = True
  passes = True
  may_keep = True

  def run(self, info, ctx):
    return _Result([ctx.state(info, i) for i in range(len(info.outputs))],
                   num_ops=0)

  def keeps_pending(self, info, index, pending, ctx):
    return True


class _Depend(_Rule):
  """depend: passes input 0 on (pending or not); waits for the others
  without reducing them."""

  may_pend = True
  passes = True
  may_keep = True

  def run(self, info, ctx):
    layout = ctx.layout
    nbytes = 2 * _slice_bytes(layout, info.in_dims[0], info.in_itemsize[0])
    return _Result([ctx.state(info, 0)], elementwise_bytes=nbytes)

  def keeps_pending(self, info, index, pending, ctx):
    return True


class _Softmax(_Rule):

  def attributes(self, info):
    return (info.op._reduced_dim.name,  # pylint: disable=protected-access
            type(info.op).__name__)

  def run(self, info, ctx):
    layout = ctx.layout
    dims = info.in_dims[0]
    reduced = info.op._reduced_dim.name  # pylint: disable=protected-access
    m = layout.mesh_dim(reduced)
    collectives = []
    if m is not None:
      sizes = layout.slice_sizes(dims)
      sizes[[n for n, _ in dims].index(reduced)] = 1
      nbytes = math.prod(sizes) * info.in_itemsize[0]
      count = 2 if type(info.op).__name__ == "SoftmaxOperation" else 1
      collectives = [_collective(layout, "allreduce", (m,), nbytes)] * count
    return _Result([()], collectives,
                   elementwise_bytes=_io_bytes(info, layout))


class _Shift(_Rule):

  def attributes(self, info):
    op = info.op
    # pylint: disable=protected-access
    return (op._dim.name, op._offset, op._wrap)

  def run(self, info, ctx):
    layout = ctx.layout
    op = info.op
    dims = info.in_dims[0]
    name = op._dim.name  # pylint: disable=protected-access
    m = layout.mesh_dim(name)
    collectives = []
    if m is not None:
      n = layout.sizes[m]
      size = dict(dims)[name]
      offset = op._offset  # pylint: disable=protected-access
      wrap = op._wrap  # pylint: disable=protected-access
      if wrap:
        offset %= size
      block = size // n
      blocks, rest = divmod(offset, block)
      whole = _slice_bytes(layout, dims, info.in_itemsize[0])
      per_row = whole // block
      if rest == 0:
        parts = [(blocks, whole)]
      else:
        parts = [(blocks + 1, per_row * rest),
                 (blocks, per_row * (block - rest))]
      for k, nbytes in parts:
        collectives.append(_collective(
            layout, "receive", (m,), nbytes, _receivers(n, k, wrap)))
    return _Result([()], collectives,
                   elementwise_bytes=_io_bytes(info, layout))


def _receivers(n, offset, wrap):
  count = 0
  for i in range(n):
    c = i - offset
    if not 0 <= c < n:
      c = c % n if wrap else None
    if c is not None and c != i:
      count += 1
  return count


def _indices_mesh_dim_axis(layout, dims, m):
  for axis, (name, _) in enumerate(dims):
    if m is not None and layout.mesh_dim(name) == m:
      return axis
  return None


class _Gather(_Rule):
  may_pend = True

  def attributes(self, info):
    return (info.op._dim.name,)  # pylint: disable=protected-access

  def run(self, info, ctx):
    layout = ctx.layout
    dim = info.op._dim.name  # pylint: disable=protected-access
    m = layout.mesh_dim(dim)
    nbytes = _io_bytes(info, layout)
    if m is None:
      return _Result([()], elementwise_bytes=nbytes)
    idx_dims = info.in_dims[1]
    shared = _indices_mesh_dim_axis(layout, idx_dims, m)
    if shared is None:
      return _Result([(m,)], elementwise_bytes=nbytes)
    n = layout.sizes[m]
    collectives = [_collective(
        layout, "allconcat", (m,),
        _slice_bytes(layout, idx_dims, info.in_itemsize[1]))]
    partial = _slice_bytes(layout, info.out_dims[0], info.out_itemsize[0]) * n
    collectives.append(_collective(layout, "reduce_scatter", (m,), partial))
    return _Result([()], collectives, elementwise_bytes=nbytes)


class _ScatterAdd(_Rule):
  may_pend = True

  def attributes(self, info):
    return (info.op._dim.name,)  # pylint: disable=protected-access

  def run(self, info, ctx):
    layout = ctx.layout
    dim = info.op._dim.name  # pylint: disable=protected-access
    m = layout.mesh_dim(dim)
    idx_dims, upd_dims = info.in_dims
    collectives = []
    shared = _indices_mesh_dim_axis(layout, idx_dims, m)
    if shared is not None:
      collectives.append(_collective(
          layout, "allconcat", (m,),
          _slice_bytes(layout, idx_dims, info.in_itemsize[0])))
      collectives.append(_collective(
          layout, "allconcat", (m,),
          _slice_bytes(layout, upd_dims, info.in_itemsize[1])))
    pending = layout.sort(
        layout.mesh_dim(n) for n, _ in idx_dims
        if layout.mesh_dim(n) is not None and layout.mesh_dim(n) != m)
    return _Result([pending], collectives,
                   elementwise_bytes=_io_bytes(info, layout))


class _Conv(_Rule):
  """Convolutions and their gradients: FLOPs of the direct algorithm (2 x
  the larger of image and output slice elements x filter elements per
  output channel); a split channel (batch, for the filter gradient) that
  is summed over leaves a pending sum."""

  may_pend = True

  def attributes(self, info):
    return (info.op._rank,)  # pylint: disable=protected-access

  def run(self, info, ctx):
    layout = ctx.layout
    rank = info.op._rank  # pylint: disable=protected-access
    filt = [d for d in info.in_dims if len(d) == rank + 2]
    sides = [d for d in info.in_dims + info.out_dims if len(d) != rank + 2]
    flops = 0
    if filt and sides:
      per_out = math.prod(s for _, s in filt[0][:-1])
      flops = 2 * per_out * max(layout.slice_elements(d) for d in sides)
    out_names = {n for n, _ in info.out_dims[0]}
    pending = layout.sort(
        layout.mesh_dim(n) for dims in info.in_dims for n, _ in dims
        if n not in out_names and layout.mesh_dim(n) is not None)
    # Like an einsum's, its operands and result are priced at the matmul
    # byte rate.
    return _Result([pending], flops=flops,
                   matmul_bytes=_io_bytes(info, layout))


class _Reshape(_Rule):
  """ReshapeOperation.lower, symbolically (see ops/reshapes.py)."""

  may_pend = True
  passes = True
  may_keep = True

  def _cumprods(self, dims, layout):
    """{mesh dim: exclusive cumprod of the tensor axis it splits}."""
    out = {}
    c = 1
    cum = []
    for _, size in reversed(dims):
      cum.append(c)
      c *= size
    cum.reverse()
    for axis, (name, _) in enumerate(dims):
      m = layout.mesh_dim(name)
      if m is not None:
        out[m] = cum[axis]
    return out, cum

  def run(self, info, ctx):
    return self._lower(info, ctx, ctx.state(info, 0))[0]

  def keeps_pending(self, info, index, pending, ctx):
    return self._lower(info, ctx, pending)[1]

  def _lower(self, info, ctx, pending):
    """(_Result, whether a pending input is not reduced plainly)."""
    layout = ctx.layout
    old, new = info.in_dims[0], info.out_dims[0]
    itemsize = info.in_itemsize[0]
    nbytes = _io_bytes(info, layout)
    old_c, old_cum = self._cumprods(old, layout)
    new_c, _ = self._cumprods(new, layout)
    mesh = list(layout.sizes)
    changed = [m for m in mesh if old_c.get(m) != new_c.get(m)]
    if not changed:
      return _Result([pending], elementwise_bytes=nbytes), True
    current = [layout.mesh_dim(n) for n, _ in old]
    sizes = layout.slice_sizes(old)
    collectives = []

    def splittable(m):
      start = new_c[m]
      axis = next((a for a, c in enumerate(old_cum)
                   if c == start and old[a][1] > 1), None)
      if (axis is not None and current[axis] is None and
          old[axis][1] % layout.sizes[m] == 0):
        return axis
      return None

    def nbytes_now():
      return math.prod(sizes) * itemsize

    splits = [m for m in changed if m not in old_c and m in new_c]
    alltoalls = [m for m in changed if m in old_c and m in new_c]
    concats = [m for m in changed if m in old_c and m not in new_c]
    split_after = []
    keeps = False
    if pending:
      scattered = []
      for m in splits:
        if m not in pending:
          continue
        axis = splittable(m)
        if axis is None:
          continue
        collectives.append(_collective(layout, "reduce_scatter", (m,),
                                       nbytes_now()))
        sizes[axis] //= layout.sizes[m]
        current[axis] = m
        scattered.append(m)
      if scattered:
        keeps = True
        splits = [m for m in splits if m not in scattered]
        rest = tuple(m for m in pending if m not in scattered)
        if rest and not alltoalls and not concats and all(
            m not in rest and splittable(m) is not None for m in splits):
          return _Result([rest], collectives,
                         elementwise_bytes=nbytes), True
        if rest:
          collectives.append(_collective(layout, "allreduce", rest,
                                         nbytes_now()))

    def try_split(m):
      axis = splittable(m)
      if axis is None:
        return False
      sizes[axis] //= layout.sizes[m]
      current[axis] = m
      return True

    def try_alltoall(m):
      concat_axis = current.index(m)
      current[concat_axis] = None
      axis = splittable(m)
      if axis is None:
        current[concat_axis] = m
        return False
      collectives.append(_collective(layout, "alltoall", (m,), nbytes_now()))
      n = layout.sizes[m]
      sizes[axis] //= n
      sizes[concat_axis] *= n
      current[axis] = m
      return True

    def concat(m):
      concat_axis = current.index(m)
      collectives.append(_collective(layout, "allconcat", (m,),
                                     nbytes_now()))
      sizes[concat_axis] *= layout.sizes[m]
      current[concat_axis] = None

    splits = [m for m in splits if not try_split(m)]
    alltoalls = [m for m in alltoalls if not try_alltoall(m)]
    for m in concats:
      concat(m)
    for m in alltoalls:
      if not try_alltoall(m):
        concat(m)
        split_after.append(m)
    return _Result([()], collectives, elementwise_bytes=nbytes), keeps


class _TopK(_Rule):
  """top_k over a split dimension: each block's top k, all-concatenated
  (values and indices), then merged."""

  def attributes(self, info):
    op = info.op
    # pylint: disable=protected-access
    return (op.reduced_dim.name, op.reduced_dim.size, op._k)

  def run(self, info, ctx):
    layout = ctx.layout
    op = info.op
    dims = info.in_dims[0]
    reduced = op.reduced_dim.name
    m = layout.mesh_dim(reduced)
    collectives = []
    if m is not None:
      k = op._k  # pylint: disable=protected-access
      block_k = min(k, op.reduced_dim.size // layout.sizes[m])
      rest = layout.slice_elements([d for d in dims if d[0] != reduced])
      for itemsize in info.out_itemsize:
        collectives.append(_collective(layout, "allconcat", (m,),
                                       rest * block_k * itemsize))
    return _Result([()] * len(info.outputs), collectives,
                   elementwise_bytes=_io_bytes(info, layout))


class _Cumsum(_Rule):
  """cumsum along a split dimension: block totals all-concatenated."""

  def attributes(self, info):
    return (info.op._dim.name,)  # pylint: disable=protected-access

  def run(self, info, ctx):
    layout = ctx.layout
    dims = info.in_dims[0]
    name = info.op._dim.name  # pylint: disable=protected-access
    m = layout.mesh_dim(name)
    collectives = []
    if m is not None:
      sizes = layout.slice_sizes(dims)
      sizes[[n for n, _ in dims].index(name)] = 1
      collectives.append(_collective(
          layout, "allconcat", (m,), math.prod(sizes) * info.in_itemsize[0]))
    return _Result([()], collectives,
                   elementwise_bytes=_io_bytes(info, layout))


class _Unstack(_Rule):
  """unstack along a split dimension all-concatenates it first."""

  def attributes(self, info):
    return (info.op._dim.name,)  # pylint: disable=protected-access

  def run(self, info, ctx):
    layout = ctx.layout
    dims = info.in_dims[0]
    m = layout.mesh_dim(info.op._dim.name)  # pylint: disable=protected-access
    collectives = []
    if m is not None:
      collectives.append(_collective(
          layout, "allconcat", (m,),
          _slice_bytes(layout, dims, info.in_itemsize[0])))
    return _Result([()] * len(info.outputs), collectives,
                   elementwise_bytes=_io_bytes(info, layout))


class _Summary(_Rule):
  """scalar_summary: exports (reduces) its input, passes it on."""

  def run(self, info, ctx):
    return _Result([()])


_RULES = {
    "EinsumOperation": _Einsum(),
    "ReduceOperation": _Reduce(),
    "ScalarMultiplyOperation": _Linear(),
    "AddOperation": _SameShapeLinear(),
    "AddNOperation": _SameShapeLinear(),
    "StopGradient": _Identity(),
    "Depend": _Depend(),
    "PipelineIterationOperation": _PassThrough(),
    "ReshapeOperation": _Reshape(),
    "SoftmaxOperation": _Softmax(),
    "SoftmaxGradOperation": _Softmax(),
    "ShiftOperation": _Shift(),
    "GatherOperation": _Gather(),
    "ScatterAddOperation": _ScatterAdd(),
    "Conv2dOperation": _Conv(),
    "Conv3dOperation": _Conv(),
    "Conv2or3dBackpropInputOperation": _Conv(),
    "Conv2or3dBackpropFilterOperation": _Conv(),
    "Conv2dTransposeOperation": _Conv(),
    "Conv3dTransposeOperation": _Conv(),
    "ScalarSummaryOperation": _Summary(),
    "TopKOperation": _TopK(),
    "CumsumOperation": _Cumsum(),
    "UnstackOperation": _Unstack(),
    "Variable": _NoWork(),
    "StackedVariable": _NoWork(),
    "Constant": _NoWork(),
    "ImportOperation": _NoWork(),
    "ImportLaidOutTensorOperation": _NoWork(),
    "RangeOperation": _NoWork(),
}
_DEFAULT = _Rule()


def _rule_for(op):
  for cls in type(op).__mro__:
    rule = _RULES.get(cls.__name__)
    if rule is not None:
      return rule
  return _DEFAULT


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
      if cinfo.rule.keeps_pending(cinfo, index, pending, ctx):
        continue
    c = _collective(layout, "allreduce", pending,
                    _slice_bytes(layout, info.out_dims[k],
                                 info.out_itemsize[k]))
    if c is not None:
      collectives.append(c)
  return OperationCost(result.flops, result.elementwise_bytes,
                       result.num_ops, tuple(collectives),
                       result.matmul_bytes)


def operation_cost(operation, assignment, mesh_dimension_to_size):
  """The per-processor OperationCost of `operation` under a layout.

  Args:
    operation: an mtf Operation of a graph.
    assignment: {tensor-dimension name: mesh-dimension name}; names absent
      are not split (shard names "<name>@<mesh dim>" split as they say).
    mesh_dimension_to_size: {mesh-dimension name: size} in mesh order (or
      an mtf.Shape / "b:2;m:4").

  Returns:
    an OperationCost (see the module doc for how pending sums are charged).
  """
  return Pricer(operation.graph, assignment,
                mesh_dimension_to_size).cost(operation)


class Pricer:
  """Prices operations of one graph under one layout, as operation_cost
  does; the pending sums found for one operation serve the next (the
  layout search prices many operations under each assignment)."""

  def __init__(self, mtf_graph, assignment, mesh_dimension_to_size):
    """See operation_cost for `assignment` and `mesh_dimension_to_size`."""
    self._facts = _facts(mtf_graph)
    self._context = _Context(self._facts, _Layout(
        assignment, _mesh_sizes(mesh_dimension_to_size)))

  def cost(self, operation):
    """The per-processor OperationCost of `operation` (of this graph)."""
    return _cost(self._facts.info(operation), self._context)


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
        type(info.rule).__name__, info.rule.attributes(info),
        tuple(info.in_dims), tuple(info.out_dims), tuple(info.in_itemsize),
        tuple(info.out_itemsize), states))
  return info.run_signature


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


def graph_cost(mtf_graph, mesh_shape, layout_rules):
  """The GraphCost of `mtf_graph` on `mesh_shape` under `layout_rules`
  (an mtf.LayoutRules or a string like "batch:b;d_ff:m")."""
  sizes = _mesh_sizes(mesh_shape)
  facts = _facts(mtf_graph)
  ctx = _Context(facts, _Layout(
      _assignment_from_rules(sizes, layout_rules, mtf_graph), sizes))
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


def predict_step_seconds(mtf_graph, mesh_shape, layout_rules, machine):
  """(predicted seconds of one step, breakdown dict).

  `machine` has compute_seconds(flops, elementwise_bytes, num_ops,
  num_processors, matmul_bytes) and collective_seconds(kind,
  mesh_dimension_names, wire_bytes) (one call's time). The step time is the
  compute time of the summed per-processor work plus the time of every
  collective call.
  """
  sizes = _mesh_sizes(mesh_shape)
  cost = graph_cost(mtf_graph, sizes, layout_rules)
  total = cost.total
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
