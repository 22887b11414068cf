"""Concatenation, slicing and padding along one named dimension.

Each acts on each slice locally when its dimension is whole. Along a split
dimension, even or uneven, slice and pad re-partition it (`shifted`,
`backend.regrid`), moving only the rows that change processor, or gather it
when the plan finds that cheaper; concat re-partitions each input into its
place in the output and adds them. Under uneven splits the other
dimensions may be padded: the padding keeps its place in each slice and
stays zero (pad adds zeros).
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import regrid
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules


class ConcatOperation(graph_lib.Operation):
  """Concatenates tensors along the dimension named `concat_dim_name`."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, xs, concat_dim_name, name=None):
    super().__init__(xs, name=name or "concat")
    self._dim_name = concat_dim_name
    first = xs[0].shape
    self._axis = first.index(
        shape_lib.dimension_of(first, concat_dim_name, self.name))
    for x in xs:
      if (x.shape.dimension_names != first.dimension_names or
          (x.shape - [x.shape[self._axis]]) != (first - [first[self._axis]])):
        raise errors.ShapeError(
            f"concat {self.name!r}: all inputs must have the shape of "
            f"{first} except along {concat_dim_name!r}; got {x.shape}.")
      if x.dtype != xs[0].dtype:
        raise TypeError(f"concat {self.name!r}: inputs must share a dtype.")
    total = sum(x.shape[self._axis].size for x in xs)
    out_shape = first.resize_dimension(concat_dim_name, total)
    self._outputs = [graph_lib.Tensor(self, out_shape, xs[0].dtype)]
    self._initialize_splittable_and_unsplittable_dims("splittable")

  @property
  def axis(self):
    """The tensor axis of the concatenated dimension."""
    return self._axis

  def offsets(self):
    """Where each input starts along the output's dimension."""
    begins, begin = [], 0
    for x in self._inputs:
      begins.append(begin)
      begin += x.shape[self._axis].size
    return begins

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    grads = []
    begin = 0
    for x in self._inputs:
      size = x.shape[self._axis].size
      grads.append(mtf_slice(dy, begin, size, self._dim_name))
      begin += size
    return grads

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis = self._axis
    out_shape = self._outputs[0].shape
    if impl.tensor_dimension_to_mesh_axis(out_shape[axis]) is None:
      lowering.set_tensor_lowering(
          self._outputs[0],
          impl.slicewise(lambda *xs: tf.concat(xs, axis=axis),
                         *[lowering.tensors[x] for x in self._inputs]))
      return
    # Split: each input padded to the output's extent (re-partitioned by
    # `shifted`), then summed (or or-ed); the pieces do not overlap.
    total = out_shape[axis].size
    parts = []
    for x, begin in zip(self._inputs, self.offsets()):
      pads = [begin, total - begin - x.shape[axis].size]

      def fn(s, pads=pads):
        paddings = [[0, 0]] * s.shape.rank
        paddings[axis] = pads
        return slice_utils.tf_pad(s, paddings)

      parts.append(shifted(impl, lowering.laid_out_tensor(x), x.shape,
                           out_shape, axis, -begin, fn))
    combine = (tf.logical_or if self._outputs[0].dtype.is_bool else tf.add)

    def add(*slices):
      result = slices[0]
      for other in slices[1:]:
        result = combine(result, other)
      return result

    lowering.set_tensor_lowering(self._outputs[0], impl.slicewise(add, *parts))


@cost_rules.rule_for(ConcatOperation)
class _ConcatCost(cost_rules.AlongDimensionCost):
  """Along a split dimension: `shifted_collectives` of each input (as
  ConcatOperation.lower lowers)."""

  def dimension(self, info):
    return info.out_dims[0][info.op.axis]

  def attributes(self, info):
    return (tuple(self.dimension(info)),)

  def collectives_along(self, info, layout, mesh_dim):
    op = info.op
    total = self.dimension(info)[1]
    return [c for dims, itemsize, begin in zip(
        info.in_dims, info.in_itemsize, op.offsets())
            for c in shifted_collectives(layout, mesh_dim, dims, itemsize,
                                         op.axis, total, -begin)]


def concat(xs, concat_dim_name, name=None):
  """Concatenates `xs` along the dimension named `concat_dim_name`.

  The inputs may have different sizes of that dimension; the output has
  their sum. The dimension may be split across the mesh.
  """
  xs = list(xs)
  if len(xs) == 1:
    return xs[0]
  return ConcatOperation(xs, concat_dim_name, name=name).outputs[0]


class SliceOperation(graph_lib.Operation):
  """Takes `size` entries from `begin` along one dimension."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, begin, size, slice_dim_name, name=None):
    super().__init__([x], name=name or "slice")
    self._axis = x.shape.index(
        shape_lib.dimension_of(x.shape, slice_dim_name, self.name))
    dim = x.shape[self._axis]
    if not (0 <= begin and size >= 0 and begin + size <= dim.size):
      raise errors.ShapeError(
          f"slice {self.name!r}: [{begin}, {begin + size}) is outside "
          f"dimension {dim.name!r} of size {dim.size}.")
    self._begin = begin
    self._dim_name = slice_dim_name
    self._outputs = [graph_lib.Tensor(
        self, x.shape.resize_dimension(slice_dim_name, size), x.dtype)]
    self._initialize_splittable_and_unsplittable_dims("splittable")

  def gradient(self, grad_ys):
    dim_size = self._inputs[0].shape[self._axis].size
    size = self._outputs[0].shape[self._axis].size
    return [pad(grad_ys[0], [self._begin, dim_size - self._begin - size],
                self._dim_name)]

  @property
  def axis(self):
    """The tensor axis of the sliced dimension."""
    return self._axis

  @property
  def shift(self):
    """out[j] = in[j + shift] along the sliced dimension."""
    return self._begin

  def lower(self, lowering):
    axis, begin = self._axis, self._begin
    size = self._outputs[0].shape[axis].size

    def fn(x):
      starts = [0] * x.shape.rank
      sizes = [-1] * x.shape.rank
      starts[axis] = begin
      sizes[axis] = size
      return slice_utils.tf_slice(x, starts, sizes)

    _lower_along(self, lowering, fn)


def mtf_slice(x, begin, size, slice_dim_name, name=None):
  """Entries [begin, begin + size) of `x` along dimension `slice_dim_name`."""
  if begin == 0 and size == x.shape.get_dim_by_name(slice_dim_name).size:
    return x
  return SliceOperation(x, begin, size, slice_dim_name, name=name).outputs[0]


class PadOperation(graph_lib.Operation):
  """Pads with zeros before and after along one dimension."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, paddings, pad_dim_name, name=None):
    super().__init__([x], name=name or "pad")
    dim_name = pad_dim_name
    self._axis = x.shape.index(
        shape_lib.dimension_of(x.shape, dim_name, self.name))
    before, after = paddings
    if before < 0 or after < 0:
      raise errors.ShapeError(
          f"pad {self.name!r}: paddings must be non-negative, got {paddings}.")
    self._paddings = (before, after)
    self._dim_name = dim_name
    size = x.shape[self._axis].size + before + after
    self._outputs = [graph_lib.Tensor(
        self, x.shape.resize_dimension(dim_name, size), x.dtype)]
    self._initialize_splittable_and_unsplittable_dims("splittable")

  def gradient(self, grad_ys):
    return [mtf_slice(grad_ys[0], self._paddings[0],
                      self._inputs[0].shape[self._axis].size, self._dim_name)]

  @property
  def axis(self):
    """The tensor axis of the padded dimension."""
    return self._axis

  @property
  def shift(self):
    """out[j] = in[j + shift] along the padded dimension."""
    return -self._paddings[0]

  def lower(self, lowering):
    axis, paddings = self._axis, self._paddings

    def fn(x):
      pads = [[0, 0]] * x.shape.rank
      pads[axis] = list(paddings)
      return slice_utils.tf_pad(x, pads)

    _lower_along(self, lowering, fn)


def _lower_along(op, lowering, local_fn):
  """Lowers a slice or pad `op` (out[j] = in[j + op.shift] along its
  dimension) with `shifted`."""
  impl = lowering.mesh_impl(op)
  lowering.set_tensor_lowering(op.outputs[0], shifted(
      impl, lowering.laid_out_tensor(op.inputs[0]), op.inputs[0].shape,
      op.outputs[0].shape, op.axis, op.shift, local_fn))


def shifted(impl, x, in_shape, out_shape, axis, shift, local_fn):
  """Laid-out out[j] = x[j + shift] along tensor `axis` (zeros where
  j + shift falls outside x), from laid-out `x` of `in_shape` to
  `out_shape`, which differ only in the size of that axis.

  `local_fn` (a tf.slice or tf.pad of a whole slice) on each slice when the
  dimension is whole; when it is split, a re-partition by receives
  (`regrid`) or, when its plan finds that cheaper, the dimension gathered,
  `local_fn`, and the result split again.
  """
  in_axis = impl.tensor_dimension_to_mesh_axis(in_shape[axis])
  out_axis = impl.tensor_dimension_to_mesh_axis(out_shape[axis])
  if in_axis is None and out_axis is None:
    return impl.slicewise(local_fn, x)
  if in_axis == out_axis:
    k = impl.shape[in_axis].size
    the_plan = regrid.plan(in_shape[axis].size, out_shape[axis].size, k,
                           shift)
    if not the_plan.gathers(k):
      return regrid.regrid(impl, x, axis, in_axis, the_plan)
  name = {in_shape[axis].name}
  y = impl.slicewise(local_fn, impl.gather_dimensions(x, in_shape, name))
  return impl.split_dimensions(y, out_shape, name)


def shifted_collectives(layout, mesh_dim, in_dims, itemsize, axis, out_size,
                        shift):
  """The Collectives of `shifted` along `mesh_dim` (which splits the axis)
  for an input of `in_dims` ((name, size) pairs) and `itemsize`: a receive
  per offset of `regrid.plan`, or one allconcat when the plan gathers."""
  k = layout.sizes[mesh_dim]
  the_plan = regrid.plan(in_dims[axis][1], out_size, k, shift)
  in_bytes = cost_rules.slice_bytes(layout, in_dims, itemsize)
  if the_plan.gathers(k):
    return [cost_rules.collective(layout, "allconcat", (mesh_dim,),
                                  in_bytes)]
  per_row = in_bytes // the_plan.block
  return [cost_rules.collective(layout, "receive", (mesh_dim,),
                                per_row * the_plan.widths[o],
                                the_plan.receivers[o])
          for o in sorted(the_plan.widths)]


@cost_rules.rule_for(SliceOperation, PadOperation)
class _AlongCost(cost_rules.AlongDimensionCost):
  """Along a split dimension: `shifted_collectives` (as `_lower_along`
  lowers)."""

  def dimension(self, info):
    return info.in_dims[0][info.op.axis]

  def attributes(self, info):
    op = info.op
    return (tuple(self.dimension(info)), info.out_dims[0][op.axis][1],
            op.shift)

  def collectives_along(self, info, layout, mesh_dim):
    op = info.op
    return shifted_collectives(layout, mesh_dim, info.in_dims[0],
                               info.in_itemsize[0], op.axis,
                               info.out_dims[0][op.axis][1], op.shift)


def pad(x, paddings, dim_name, name=None):
  """Zero-pads `x` by paddings=[before, after] along `dim_name`."""
  if isinstance(dim_name, shape_lib.Dimension):
    dim_name = dim_name.name
  if tuple(paddings) == (0, 0):
    return x
  return PadOperation(x, paddings, dim_name, name=name).outputs[0]
