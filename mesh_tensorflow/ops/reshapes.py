"""Reshape and renaming (broadcast, the adjoint of a sum, is in `reduce`).

A reshape keeps the elements in row-major order and changes the dimensions.
Because layouts are chosen by dimension name, a reshape (including a rename)
can change how the tensor is laid out, and then it communicates:

- a mesh dimension that splits the old shape but not the new one: allconcat;
- one that splits the new shape but not the old one: allsplit (local);
- one that splits both at different positions: alltoall;
- one the input is a pending sum over (a partial sum, e.g. from an einsum
  that summed a split batch dimension) and that splits the new shape:
  reduce_scatter, which sums and splits at once with half the bytes of
  allreduce then allsplit. Other pending sums stay pending when the rest
  of the reshape is local.

Example on mesh "all:2": reshaping x[a=4, b=6] with rules "a:all" to
y[c=24] with rules "c:all" is local (both split the outermost elements in
halves); renaming "a" to "d" with no rule for "d" allconcats.

`reshape_plan` decides these steps from the layouts alone: the lowering
follows the plan and the cost rule prices it, so the two cannot differ.
"""

import dataclasses
import math
from typing import NamedTuple, Optional, Tuple

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import cost_rules


class ReshapeStep(NamedTuple):
  """One step of a reshape's plan, on the slices before they are reshaped.

  Attributes:
    kind: "reduce_scatter", "allreduce" (of the pending sums left),
      "allsplit" (local), "alltoall" or "allconcat".
    mesh_axes: the mesh axes it runs over (one, but for "allreduce").
    split_axis: the old tensor axis it splits, or None.
    concat_axis: the old tensor axis it concatenates, or None.
  """
  kind: str
  mesh_axes: Tuple[int, ...]
  split_axis: Optional[int] = None
  concat_axis: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class ReshapePlan:
  """What a reshape does to a laid-out tensor (see `reshape_plan`).

  Attributes:
    local: no mesh axis moves: each slice is reshaped, and a pending sum
      stays pending.
    reduces_input: the input's pending sum is first reduced as it is (the
      allreduce of the input, shared with its other readers).
    steps: ReshapeSteps, in order, before the slices are reshaped.
    split_after: mesh axes split (locally) after the slices are reshaped.
    pending: the mesh axes the output is a pending sum over.
  """
  local: bool = False
  reduces_input: bool = False
  steps: Tuple[ReshapeStep, ...] = ()
  split_after: Tuple[int, ...] = ()
  pending: Tuple[int, ...] = ()


def _exclusive_cumprod(sizes):
  result = []
  product = 1
  for size in sizes:
    result.append(product)
    product *= size
  return result


def _mesh_axis_to_cumprod(cumprod, layout, num_mesh_axes):
  """For each mesh axis, the exclusive cumprod of the tensor axis split over
  it (None if none is): where that split sits in row-major order."""
  result = [None] * num_mesh_axes
  for tensor_axis, mesh_axis in enumerate(layout):
    if mesh_axis is not None:
      result[mesh_axis] = cumprod[tensor_axis]
  return result


def reshape_plan(old_sizes, old_layout, new_sizes, new_layout, mesh_sizes,
                 pending=()):
  """The collectives and local splits a reshape does, in order.

  The lowering of ReshapeOperation follows the plan, and the cost rule
  prices it: one decision for both.

  As in the original: split first (local, and it shrinks what the
  collectives carry), then all-to-all, then concatenate. A move whose
  target axis is still split waits until the concatenations have freed it;
  failing that it concatenates and splits after the reshape. A pending sum
  over a mesh axis that newly splits an unsplit old tensor axis is reduced
  and split at once (reduce_scatter).

  Args:
    old_sizes: the input's tensor-dimension sizes.
    old_layout: per input tensor axis, the mesh axis splitting it or None.
    new_sizes: the output's tensor-dimension sizes.
    new_layout: per output tensor axis, the mesh axis splitting it or None.
    mesh_sizes: per mesh axis, its size.
    pending: the mesh axes (sorted) the input is a pending sum over.

  Returns:
    a ReshapePlan.
  """
  num_mesh_axes = len(mesh_sizes)
  old_starts = _exclusive_cumprod(old_sizes)
  old_cumprod = _mesh_axis_to_cumprod(old_starts, old_layout, num_mesh_axes)
  new_cumprod = _mesh_axis_to_cumprod(_exclusive_cumprod(new_sizes),
                                      new_layout, num_mesh_axes)
  changed = [a for a in range(num_mesh_axes)
             if old_cumprod[a] != new_cumprod[a]]
  pending = tuple(pending)
  if not changed:
    return ReshapePlan(local=True, pending=pending)
  # `current` tracks, per old tensor axis, the mesh axis splitting it.
  current = list(old_layout)
  steps = []

  def splittable_old_axis(mesh_axis):
    """The unsplit old axis that starts where the new split starts.

    Size-1 axes start where the next axis does; they cannot be split, so
    the axis after them is the candidate.
    """
    start = new_cumprod[mesh_axis]
    axis = next((a for a, c in enumerate(old_starts)
                 if c == start and old_sizes[a] > 1), None)
    if (axis is not None and current[axis] is None and
        old_sizes[axis] % mesh_sizes[mesh_axis] == 0):
      return axis
    return None

  def split(kind, mesh_axis):
    split_axis = splittable_old_axis(mesh_axis)
    if split_axis is None:
      return False
    steps.append(ReshapeStep(kind, (mesh_axis,), split_axis=split_axis))
    current[split_axis] = mesh_axis
    return True

  def try_alltoall(mesh_axis):
    concat_axis = current.index(mesh_axis)
    current[concat_axis] = None
    split_axis = splittable_old_axis(mesh_axis)
    if split_axis is None:
      current[concat_axis] = mesh_axis
      return False
    steps.append(ReshapeStep("alltoall", (mesh_axis,), split_axis,
                             concat_axis))
    current[split_axis] = mesh_axis
    return True

  def concat(mesh_axis):
    concat_axis = current.index(mesh_axis)
    steps.append(ReshapeStep("allconcat", (mesh_axis,),
                             concat_axis=concat_axis))
    current[concat_axis] = None

  splits = [a for a in changed
            if old_cumprod[a] is None and new_cumprod[a] is not None]
  alltoalls = [a for a in changed
               if old_cumprod[a] is not None and new_cumprod[a] is not None]
  concats = [a for a in changed
             if old_cumprod[a] is not None and new_cumprod[a] is None]
  reduces_input = False
  if pending:
    scattered = [a for a in splits
                 if a in pending and split("reduce_scatter", a)]
    if not scattered:
      reduces_input = True
    splits = [a for a in splits if a not in scattered]
    pending = tuple(a for a in pending if a not in scattered)
    if scattered and pending and not alltoalls and not concats and all(
        a not in pending and splittable_old_axis(a) is not None
        for a in splits):
      # The rest is local and linear: the sum stays pending.
      for mesh_axis in splits:
        split("allsplit", mesh_axis)
      return ReshapePlan(steps=tuple(steps), pending=pending)
    if scattered and pending:
      steps.append(ReshapeStep("allreduce", pending))
  splits = [a for a in splits if not split("allsplit", a)]
  alltoalls = [a for a in alltoalls if not try_alltoall(a)]
  for mesh_axis in concats:
    concat(mesh_axis)
  split_after = []
  for mesh_axis in alltoalls:
    if not try_alltoall(mesh_axis):
      concat(mesh_axis)
      split_after.append(mesh_axis)
  split_after += [a for a in splits if not split("allsplit", a)]
  return ReshapePlan(reduces_input=reduces_input, steps=tuple(steps),
                     split_after=tuple(split_after))


class ReshapeOperation(graph_lib.Operation):
  """Reshapes `x` to `new_shape` (same number of elements).

  Uneven splits: a reshape that keeps each padded dimension (same name and
  size, as many elements before it, padded dimensions in the same order) is
  a reshape of the padded tensors, whose padding lies where it should: it is
  lowered as an even reshape of the padded sizes. Others (a padded
  dimension merged, cut or renamed) gather the padded dimensions first.
  """

  padding_stays_zero = True

  def __init__(self, x, new_shape, name=None):
    super().__init__([x], name=name or "reshape")
    new_shape = shape_lib.convert_to_shape(new_shape)
    if new_shape.size != x.shape.size:
      raise errors.ShapeError(
          f"Cannot reshape {x.name} {x.shape} ({x.shape.size} elements) to "
          f"{new_shape} ({new_shape.size} elements).")
    self._outputs = [graph_lib.Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [reshape(grad_ys[0], self._inputs[0].shape)]

  def handles_padding_of(self, padded_names):
    return _keeps_dimensions(self._inputs[0].shape, self._outputs[0].shape,
                             padded_names)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    old_shape = self._inputs[0].shape
    new_shape = self._outputs[0].shape
    x = lowering.tensors[self._inputs[0]]
    lazy = x if isinstance(x, mesh_impl_lib.LazyAllreduceSum) else None
    new_layout = list(impl.tensor_layout(new_shape))
    new_sizes = _padded_sizes(impl, new_shape)
    plan = reshape_plan(_padded_sizes(impl, old_shape),
                        list(impl.tensor_layout(old_shape)),
                        new_sizes, new_layout,
                        impl.shape.to_integer_list,
                        lazy.mesh_axes if lazy is not None else ())
    new_slice_shape = impl.slice_shape(new_shape)
    if plan.local:
      y = impl.slicewise_delay_allreduce(
          lambda s: tf.reshape(s, new_slice_shape), x)
      lowering.set_tensor_lowering(self._outputs[0], y)
      return
    if lazy is not None and not plan.reduces_input:
      x = lazy.laid_out_input
    else:
      x = x.to_laid_out_tensor()
    for step in plan.steps:
      x = _lower_step(impl, x, step, lazy)
    intermediate = [
        size if mesh_axis is None or mesh_axis in plan.split_after else s
        for size, s, mesh_axis in zip(new_sizes, new_slice_shape, new_layout)]
    x = impl.slicewise(lambda s: tf.reshape(s, intermediate), x)
    for mesh_axis in plan.split_after:
      x = impl.allsplit(x, mesh_axis, new_layout.index(mesh_axis))
    if plan.pending:
      x = mesh_impl_lib.LazyAllreduceSum(
          impl, x, plan.pending, add_counter_fn=lazy.add_counter_fn)
    lowering.set_tensor_lowering(self._outputs[0], x)


def _keeps_dimensions(old_shape, new_shape, names):
  """Whether reshaping `old_shape` to `new_shape` keeps each dimension named
  in `names`: present in both with one size, as many elements before it,
  and in the same order among them."""
  def positions(shape):
    found = []
    before = 1
    for d in shape:
      if d.name in names:
        found.append((d.name, d.size, before))
      before *= d.size
    return found

  old = positions(old_shape)
  return len(old) == len(names) and old == positions(new_shape)


def _padded_sizes(impl, shape):
  """The sizes of `shape` with each unevenly split dimension padded."""
  sizes = shape.to_integer_list
  for axis in impl.padded_axes(shape):
    sizes[axis.tensor_axis] = axis.slice_size * axis.pieces
  return sizes


def _lower_step(impl, x, step, lazy):
  """`x` after one ReshapeStep (`lazy`: the pending input, if any)."""
  mesh_axis = step.mesh_axes[0]
  if step.kind == "reduce_scatter":
    return impl.reduce_scatter(x, mesh_axis, step.split_axis, "SUM")
  if step.kind == "allreduce":
    return mesh_impl_lib.LazyAllreduceSum(
        impl, x, step.mesh_axes,
        add_counter_fn=lazy.add_counter_fn).to_laid_out_tensor()
  if step.kind == "allsplit":
    return impl.allsplit(x, mesh_axis, step.split_axis)
  if step.kind == "alltoall":
    return impl.alltoall(x, mesh_axis, step.split_axis, step.concat_axis)
  return impl.allconcat(x, mesh_axis, step.concat_axis)


@cost_rules.rule_for(ReshapeOperation)
class _ReshapeCost(cost_rules.CostRule):
  """The collectives of `reshape_plan`, priced; pending sums as it says."""

  may_pend = True
  passes = True
  may_keep = True

  def run(self, info, ctx):
    return self._price(info, ctx, ctx.state(info, 0))[0]

  def keeps_pending(self, info, index, pending, ctx):
    return self._price(info, ctx, pending)[1]

  def _price(self, info, ctx, pending):
    """(RuleResult, whether a pending input is not reduced plainly)."""
    layout = ctx.layout
    old, new = info.in_dims[0], info.out_dims[0]
    mesh = list(layout.sizes)
    mesh_sizes = [layout.sizes[m] for m in mesh]
    # The sizes the lowering plans with: padded ones (it lowers a reshape
    # with padded dimensions only when it keeps them, see ReshapeOperation).
    plan = reshape_plan(_padded_cost_sizes(layout, old),
                        [layout.mesh_axis(n) for n, _ in old],
                        _padded_cost_sizes(layout, new),
                        [layout.mesh_axis(n) for n, _ in new], mesh_sizes,
                        tuple(layout.order[m] for m in pending))
    nbytes = cost_rules.io_bytes(info, layout)
    sizes = layout.slice_sizes(old)
    collectives = []
    for step in plan.steps:
      n = layout.group_size(mesh[a] for a in step.mesh_axes)
      if step.kind != "allsplit":
        collectives.append(cost_rules.collective(
            layout, step.kind, tuple(mesh[a] for a in step.mesh_axes),
            math.prod(sizes) * info.in_itemsize[0]))
      if step.split_axis is not None:
        sizes[step.split_axis] //= n
      if step.concat_axis is not None:
        sizes[step.concat_axis] *= n
    pending_out = tuple(mesh[a] for a in plan.pending)
    return (cost_rules.RuleResult([pending_out], collectives,
                                  elementwise_bytes=nbytes),
            not plan.reduces_input)


def _padded_cost_sizes(layout, dims):
  """The sizes of (name, size) `dims` under a CostLayout, padded where it
  splits them unevenly."""
  sizes = []
  for name, size in dims:
    m = layout.mesh_dim(name)
    sizes.append(size if m is None else
                 layout.slice_size(name, size) * layout.sizes[m])
  return sizes


def reshape(x, new_shape, name=None):
  """Reshapes `x` (row-major order kept) to `new_shape`."""
  new_shape = shape_lib.convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return ReshapeOperation(x, new_shape, name=name).outputs[0]


def rename_dimension(x, old_name, new_name, name=None):
  """Renames one dimension of a Tensor (or Shape). May re-layout."""
  if isinstance(x, shape_lib.Shape):
    return x.rename_dimension(old_name, new_name)
  return reshape(x, x.shape.rename_dimension(old_name, new_name),
                 name=name or "rename_dimension")


def replace_dimensions(tensor_or_shape, old_dim_or_dims, new_dim_or_dims):
  """Replaces consecutive dimensions by others of the same total size.

  Works on a Shape (returns a Shape) or a Tensor (returns a reshape).
  """
  if isinstance(tensor_or_shape, graph_lib.Tensor):
    return reshape(tensor_or_shape, replace_dimensions(
        tensor_or_shape.shape, old_dim_or_dims, new_dim_or_dims))
  shape = shape_lib.convert_to_shape(tensor_or_shape)
  as_list = lambda d: ([d] if isinstance(d, shape_lib.Dimension) else
                       [shape_lib.convert_to_dimension(e) for e in d])
  old_dims = as_list(old_dim_or_dims)
  new_dims = as_list(new_dim_or_dims)
  for d in old_dims:
    if d not in shape.dims:
      raise errors.ShapeError(
          f"replace_dimensions: {d} is not a dimension of {shape}.")
  positions = [shape.dims.index(d) for d in old_dims]
  if positions != list(range(positions[0], positions[0] + len(positions))):
    raise errors.ShapeError(
        f"replace_dimensions: {old_dims} must be consecutive and in order in "
        f"{shape}.")
  if shape_lib.list_product(d.size for d in old_dims) != (
      shape_lib.list_product(d.size for d in new_dims)):
    raise errors.ShapeError(
        f"replace_dimensions: {old_dims} and {new_dims} have different total "
        "sizes.")
  dims = shape.dims
  return shape_lib.Shape(dims[:positions[0]] + new_dims +
                         dims[positions[-1] + 1:])


def combined_dimension(dims, name=None):
  """One Dimension whose size is the product of the sizes of `dims`.

  Used to flatten consecutive dimensions with `reshape`. The default name is
  that of the first (outermost) dimension, as in the original Mesh
  TensorFlow: a layout rule that splits it then still applies to the
  flattened dimension, so reshaping [batch, length] to [batch * length]
  under the rule "batch:rows" stays local.

  Args:
    dims: a non-empty list of Dimensions (or (name, size) pairs).
    name: optional name of the new dimension.

  Returns:
    a Dimension.
  """
  dims = [shape_lib.convert_to_dimension(d) for d in dims]
  if not dims:
    raise errors.ShapeError(
        "combined_dimension: dims must be a list of one or more Dimensions.")
  return shape_lib.Dimension(name or dims[0].name,
                             shape_lib.list_product(d.size for d in dims))


def anonymize(x, name=None):
  """`x` reshaped to anonymous dimension names, so it is fully replicated.

  No layout rule matches an anonymous name (see `mtf.anonymous_shape`), so
  every processor ends up with the whole tensor: each mesh dimension that
  split `x` allconcatenates. The original needed this before exporting from
  an SIMD mesh implementation.
  """
  return reshape(x, shape_lib.anonymous_shape(x.shape),
                 name=name or "anonymize")
