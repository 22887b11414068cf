"""Cost rules: what an operation's lowering costs under a layout, symbolically.

The layout search (`auto_mtf`) prices an operation under many assignments
of tensor-dimension names to mesh dimensions without lowering it. Each
operation's rule says what its lowering would do per processor: the FLOPs,
the bytes it streams, the TF ops it emits, the collectives (kind, mesh
dimensions, bytes as the lowering's counters count them) and which outputs
are left as pending sums (`LazyAllreduceSum`). A rule sits in the module of
its operation, beside the lowering it mirrors, registered for the class:

    @cost_rules.rule_for(ShiftOperation)
    class _ShiftCost(cost_rules.CostRule):
      def run(self, info, ctx): ...

Lookup follows the class's MRO, so a rule serves subclasses too. An
operation class with no rule is costed as slicewise work (`SLICEWISE`); a
test checks that every operation class has one registered (or is listed as
slicewise), so that a new operation does not silently cost nothing.

What a rule reads. `info` holds what depends only on the graph: `op`,
`inputs`, `outputs`, `in_dims` / `out_dims` (per tensor, a tuple of
(name, size) pairs), `in_itemsize` / `out_itemsize` (bytes per element).
`ctx` holds what depends on the layout: `ctx.layout` (a `CostLayout`) and
`ctx.state(info, i)`, the mesh dimensions input i is a pending sum over.
The aggregation (who is charged a pending sum's allreduce, the graph's
total) is `auto_mtf.cost_model`'s.
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


class CostLayout:
  """Resolves tensor-dimension names to mesh dimensions, fast.

  A dimension of size n split k ways has slices of ceil(n/k) (n/k when k
  divides n, the only case without uneven splits): padding costs what the
  slices it lengthens cost.

  Attributes:
    assignment: {tensor-dimension name: mesh-dimension name}.
    sizes: {mesh-dimension name: size}, in mesh order.
    order: {mesh-dimension name: its mesh axis}.
    num_processors: the product of the sizes.
    allow_uneven: whether the layout may split a dimension unevenly
      (`LayoutRules.allow_uneven`): the lowering then pads it, and gathers
      it around operations that do not handle padding.
    replicated: names kept whole whatever the assignment or a shard name
      says (`LayoutRules.without`: an operation lowered with its padded
      dimensions gathered).
  """

  __slots__ = ("assignment", "sizes", "order", "num_processors", "resolved",
               "allow_uneven", "replicated")

  def __init__(self, assignment, mesh_dimension_to_size, allow_uneven=False,
               replicated=frozenset()):
    self.assignment = assignment
    self.sizes = mesh_dimension_to_size
    self.order = {m: i for i, m in enumerate(mesh_dimension_to_size)}
    self.num_processors = math.prod(mesh_dimension_to_size.values())
    self.resolved = {}  # {name: mesh_dim(name)}, filled as asked.
    self.allow_uneven = allow_uneven
    self.replicated = frozenset(replicated)

  def mesh_dim(self, name):
    """The mesh dimension `name` is split over, or None.

    Names absent from the assignment are not split, except shard names
    ("<name>@<mesh dim>"), which are split as they say (unless replicated).
    """
    try:
      return self.resolved[name]
    except KeyError:
      pass
    m = self.assignment.get(name)
    if m is None and shape_lib.SHARD_MARK in name:
      m = shape_lib.split_shard_dimension_name(name)[1]
    if name in self.replicated:
      m = None
    m = self.resolved[name] = m if m in self.sizes else None
    return m

  def slice_size(self, name, size):
    """The per-processor size of dimension `name` of `size`: ceil(size / k)
    when split k ways (padding included)."""
    m = self.mesh_dim(name)
    return size if m is None else -(-size // self.sizes[m])

  def padded_names(self, dims_lists):
    """The names in `dims_lists` (lists of (name, size) pairs) split over a
    mesh dimension that does not divide their size: the dimensions the
    lowering pads (none unless allow_uneven)."""
    if not self.allow_uneven:
      return frozenset()
    return frozenset(
        name for dims in dims_lists for name, size in dims
        if self.mesh_dim(name) is not None and
        size % self.sizes[self.mesh_dim(name)])

  def without(self, names):
    """This layout with the dimensions named in `names` whole (how the
    lowering lays them out around an operation that does not handle
    padding)."""
    return CostLayout(
        {n: m for n, m in self.assignment.items() if n not in names},
        self.sizes, self.allow_uneven, self.replicated | frozenset(names))

  def mesh_axis(self, name):
    """The mesh axis (int) `name` is split over, or None."""
    m = self.mesh_dim(name)
    return None if m is None else self.order[m]

  def slice_sizes(self, dims):
    """Per-processor sizes of `dims` ((name, size) pairs)."""
    return [self.slice_size(name, size) for name, size in dims]

  def slice_elements(self, dims):
    """Elements of one processor's slice of `dims` (padding included)."""
    n = 1
    for name, size in dims:
      n *= self.slice_size(name, size)
    return n

  def sort(self, mesh_dims):
    """The distinct `mesh_dims`, in mesh order (as a tuple)."""
    return tuple(sorted(set(mesh_dims), key=self.order.__getitem__))

  def group_size(self, mesh_dims):
    return math.prod(self.sizes[m] for m in mesh_dims)

  def summed_mesh_dims(self, in_dims, out_dims, skip=()):
    """The mesh dimensions splitting a dimension of `in_dims` (lists of
    (name, size) pairs) that `out_dims` lacks, except those of `skip`: what
    summing to the output leaves pending."""
    out_names = {n for n, _ in out_dims}
    return self.sort(
        self.mesh_dim(n) for dims in in_dims for (n, s) in dims
        if n not in out_names and (n, s) not in skip and
        self.mesh_dim(n) is not None)


def collective(layout, kind, mesh_dims, slice_bytes, receivers=0):
  """A Collective as the lowering counts it, or None when it is skipped
  (a group of one member, except receive which is always counted)."""
  n = layout.group_size(mesh_dims)
  if n == 1 and kind != "receive":
    return None
  wire = mesh_impl_lib.collective_wire_bytes(
      kind, n, layout.num_processors // n, slice_bytes, receivers)
  return Collective(kind, tuple(mesh_dims), slice_bytes, wire)


class RuleResult:
  """What lowering one operation does (its own part).

  Attributes:
    pending: per output, the mesh dimensions it is a pending sum over
      (a tuple in mesh order, () when reduced).
    collectives: the Collectives it emits itself.
    flops: FLOPs of matrix work (einsums, convolutions), per processor.
    elementwise_bytes: bytes element-wise and other slice work streams.
    num_ops: TF ops it emits.
    matmul_bytes: bytes matrix work reads and writes.
  """

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


def slice_bytes(layout, dims, itemsize):
  """Bytes of one processor's slice of a tensor of `dims`."""
  return layout.slice_elements(dims) * itemsize


def slice_bytes_without(layout, dims, name, itemsize):
  """Bytes of one processor's slice with dimension `name` cut to size 1 (a
  reduction's partial result, kept for the other dimensions)."""
  sizes = layout.slice_sizes(dims)
  sizes[[n for n, _ in dims].index(name)] = 1
  return math.prod(sizes) * itemsize


def io_bytes(info, layout):
  """Bytes one processor's slices of the inputs and outputs hold."""
  return (sum(slice_bytes(layout, d, s)
              for d, s in zip(info.in_dims, info.in_itemsize)) +
          sum(slice_bytes(layout, d, s)
              for d, s in zip(info.out_dims, info.out_itemsize)))


def no_pending(info):
  """`RuleResult.pending` of an operation none of whose outputs pends."""
  return [()] * len(info.outputs)


class CostRule:
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
    """The RuleResult of lowering info.op under ctx.layout."""
    return RuleResult(no_pending(info),
                      elementwise_bytes=io_bytes(info, ctx.layout))

  def keeps_pending(self, info, index, pending, ctx):
    """Whether input `index`, a sum pending over `pending`, stays pending
    (is not reduced plainly before the operation)."""
    del info, index, pending, ctx
    return False

  def attributes(self, info):
    """What run and keeps_pending read of the operation besides its
    shapes, dtypes and inputs' pending sums (part of its cost signature)."""
    del info
    return ()

  def names(self, info):
    """Dimension names this operation's own lowering depends on."""
    names = set()
    for dims in info.in_dims + info.out_dims:
      names.update(n for n, _ in dims)
    return names


SLICEWISE = CostRule()


class NoWorkCost(CostRule):
  """Variables, constants, imports: one op, no element-wise work."""

  def run(self, info, ctx):
    return RuleResult(no_pending(info))


NO_WORK = NoWorkCost()


class AlongDimensionCost(CostRule):
  """Slicewise work, and when one dimension of the operation (`dimension`)
  is split, the collectives `collectives_along` gives over its mesh
  dimension (a softmax, a cumsum, a top_k along a split dimension)."""

  def dimension(self, info):
    """The (name, size) of the dimension the operation works along."""
    raise NotImplementedError

  def collectives_along(self, info, layout, mesh_dim):
    """The Collectives over `mesh_dim`, which splits `dimension`."""
    raise NotImplementedError

  def attributes(self, info):
    return tuple(self.dimension(info))

  def run(self, info, ctx):
    layout = ctx.layout
    m = layout.mesh_dim(self.dimension(info)[0])
    collectives = () if m is None else self.collectives_along(info, layout, m)
    return RuleResult(no_pending(info), collectives,
                      elementwise_bytes=io_bytes(info, layout))


class PassThroughCost(CostRule):
  """Hands every input on as the same-index output, pending or not, with
  no TF op (markers, stop_gradient)."""

  may_pend = True
  passes = True
  may_keep = True

  def run(self, info, ctx):
    return RuleResult([ctx.state(info, i) for i in range(len(info.outputs))],
                      num_ops=0)

  def keeps_pending(self, info, index, pending, ctx):
    return True


class LinearCost(CostRule):
  """A lowering through `slicewise_delay_allreduce` (when `applies`): the
  output is pending when every input is pending over the same mesh
  dimensions."""

  may_pend = True
  passes = True
  may_keep = True

  def applies(self, info):
    """Whether the lowering delays the allreduces (else it is slicewise)."""
    del info
    return True

  def _common(self, info, ctx):
    states = [ctx.state(info, i) for i in range(len(info.inputs))]
    first = states[0]
    if first and all(s == first for s in states):
      return first
    return ()

  def run(self, info, ctx):
    if not self.applies(info):
      return CostRule.run(self, info, ctx)
    return RuleResult([self._common(info, ctx)],
                      elementwise_bytes=io_bytes(info, ctx.layout))

  def keeps_pending(self, info, index, pending, ctx):
    return self.applies(info) and self._common(info, ctx) == pending


_RULES = {}


def register(operation_class, rule):
  """Makes `rule` (a CostRule) the cost rule of `operation_class` and, unless
  they have their own, of its subclasses."""
  if operation_class in _RULES:
    raise ValueError(f"{operation_class.__qualname__} already has the cost "
                     f"rule {_RULES[operation_class]!r}.")
  _RULES[operation_class] = rule


def rule_for(*operation_classes):
  """Class decorator: an instance of the decorated CostRule subclass is the
  rule of each of `operation_classes`."""

  def decorate(rule_class):
    rule = rule_class()
    for operation_class in operation_classes:
      register(operation_class, rule)
    return rule_class

  return decorate


def registered_rule(operation_class):
  """The rule registered for `operation_class` or its nearest base, or
  None."""
  for cls in operation_class.__mro__:
    rule = _RULES.get(cls)
    if rule is not None:
      return rule
  return None


def rule_of(operation):
  """The cost rule of `operation` (SLICEWISE when none is registered)."""
  return registered_rule(type(operation)) or SLICEWISE
