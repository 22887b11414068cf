"""Split, stack and unstack along a named dimension.

`split` cuts one dimension into pieces (the inverse of `concat`); `stack`
adds a new dimension holding a list of same-shaped tensors; `unstack` removes
a dimension and returns its entries as a list.

Communication: `split` is local when its dimension is whole; when the mesh
splits it, each piece is re-partitioned as a slice (`slicing.shifted`: the
rows that change processor move by receives).
`stack` and `unstack` accept any layout: on mesh "all:2" with the rule
"s:all", `stack(xs, "s")` of four tensors stacks locally and keeps entries 0-1
on processor 0 and 2-3 on processor 1 (no communication); `unstack` of that
tensor first allconcatenates "s" over "all", since every output is needed on
every processor.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import slicing

__all__ = [
    "split",
    "SplitOperation",
    "stack",
    "StackOperation",
    "unstack",
    "UnstackOperation",
]


def split(x, split_dim, num_or_size_splits, name=None):
  """Splits `x` into pieces along `split_dim` (a Dimension or a name).

  Args:
    x: an mtf Tensor.
    split_dim: the dimension to cut (it may be split across the mesh).
    num_or_size_splits: an int (that many equal pieces; it must divide the
      dimension's size) or a list of piece sizes summing to that size.
    name: optional name of the operation.

  Returns:
    a list of Tensors: the shape of `x` with `split_dim` resized to each
    piece's size.
  """
  return SplitOperation(x, split_dim, num_or_size_splits, name=name).outputs


class SplitOperation(graph_lib.Operation):
  """Splits a tensor into pieces along one dimension (split over the mesh
  or not)."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, split_dim, num_or_size_splits, name=None):
    super().__init__([x], name=name or "split")
    self._split_dim = shape_lib.dimension_of(x.shape, split_dim, f"split {self.name!r}")
    size = self._split_dim.size
    self._axis = x.shape.dimension_names.index(self._split_dim.name)
    if isinstance(num_or_size_splits, (list, tuple)):
      sizes = [int(s) for s in num_or_size_splits]
      if not sizes or any(s < 0 for s in sizes) or sum(sizes) != size:
        raise errors.ShapeError(
            f"split {self.name!r}: sizes {sizes} must be non-negative and sum "
            f"to the size {size} of dimension {self._split_dim.name!r}.")
    else:
      num = int(num_or_size_splits)
      if num <= 0 or size % num:
        raise errors.ShapeError(
            f"split {self.name!r}: cannot cut dimension "
            f"{self._split_dim.name!r} of size {size} into {num} equal "
            "pieces; give a divisor of the size or a list of sizes.")
      sizes = [size // num] * num
    self._sizes = sizes
    self._outputs = [
        graph_lib.Tensor(self, x.shape.resize_dimension(
            self._split_dim.name, s), x.dtype, index=i)
        for i, s in enumerate(sizes)]
    self._initialize_splittable_and_unsplittable_dims("splittable")

  @property
  def axis(self):
    """The tensor axis of the split dimension."""
    return self._axis

  def offsets(self):
    """Where each output starts along the input's dimension."""
    return [sum(self._sizes[:i]) for i in range(len(self._sizes))]

  def gradient(self, grad_ys):
    grads = [g if g is not None else constants.zeros_like(y)
             for g, y in zip(grad_ys, self._outputs)]
    return [slicing.concat(grads, self._split_dim.name)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis, sizes = self._axis, self._sizes
    if impl.tensor_dimension_to_mesh_axis(self._split_dim) is not None:
      # Split over the mesh: each output is a slice (slicing.shifted).
      x = lowering.laid_out_tensor(self._inputs[0])
      for t, begin, size in zip(self._outputs, self.offsets(), sizes):

        def fn(s, begin=begin, size=size):
          starts = [0] * s.shape.rank
          lengths = [-1] * s.shape.rank
          starts[axis], lengths[axis] = begin, size
          return slice_utils.tf_slice(s, starts, lengths)

        lowering.set_tensor_lowering(t, slicing.shifted(
            impl, x, self._inputs[0].shape, t.shape, axis, begin, fn))
      return
    values = impl.slicewise(
        lambda s: tuple(tf.split(s, sizes, axis=axis)),
        lowering.tensors[self._inputs[0]])
    if not isinstance(values, tuple):
      values = (values,)
    for t, v in zip(self._outputs, values):
      lowering.set_tensor_lowering(t, v)


def stack(xs, dim_name, axis=0, name=None):
  """Stacks same-shaped tensors along a new dimension.

  Args:
    xs: a non-empty list of Tensors with one shape and dtype.
    dim_name: the name of the new dimension (or a Dimension of size
      `len(xs)`); its size is `len(xs)`.
    axis: where the new dimension goes among the output's dimensions
      (negative counts from the end, as in `tf.stack`).
    name: optional name of the operation.

  Returns:
    a Tensor of shape xs[0].shape with the new dimension inserted at `axis`.
  """
  return StackOperation(xs, dim_name, axis, name=name).outputs[0]


class StackOperation(graph_lib.Operation):
  """Stacks tensors along a new dimension (which may be split)."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, xs, dim_name, axis, name=None):
    xs = list(xs)
    if not xs:
      raise ValueError(f"stack {name or 'stack'!r} along {dim_name!r}: needs "
                       "at least one tensor.")
    super().__init__(xs, name=name or "stack")
    first = xs[0]
    for x in xs:
      if x.shape != first.shape:
        raise errors.ShapeError(
            f"stack {self.name!r}: all inputs must have the shape "
            f"{first.shape}; got {x.shape}.")
      if x.dtype != first.dtype:
        raise TypeError(f"stack {self.name!r}: inputs must share a dtype, got "
                        f"{first.dtype.name} and {x.dtype.name}.")
    if isinstance(dim_name, shape_lib.Dimension):
      if dim_name.size != len(xs):
        raise errors.ShapeError(
            f"stack {self.name!r}: {dim_name} has size {dim_name.size} but "
            f"{len(xs)} tensors are stacked.")
      dim_name = dim_name.name
    if dim_name in first.shape.dimension_names:
      raise errors.ShapeError(
          f"stack {self.name!r}: the new dimension {dim_name!r} is already "
          f"a dimension of the inputs {first.shape}.")
    ndims = first.shape.ndims
    if not -(ndims + 1) <= axis <= ndims:
      raise errors.ShapeError(
          f"stack {self.name!r}: axis {axis} is out of range for inputs of "
          f"rank {ndims}.")
    self._axis = axis if axis >= 0 else axis + ndims + 1
    self._new_dim = shape_lib.Dimension(dim_name, len(xs))
    dims = first.shape.dims
    self._outputs = [graph_lib.Tensor(
        self, shape_lib.Shape(dims[:self._axis] + [self._new_dim] +
                              dims[self._axis:]), first.dtype)]

  def gradient(self, grad_ys):
    return unstack(grad_ys[0], self._new_dim)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis = self._axis
    xs = [lowering.tensors[x] for x in self._inputs]
    mesh_axis = impl.tensor_dimension_to_mesh_axis(self._new_dim)
    if mesh_axis is None:
      y = impl.slicewise(lambda *xs: tf.stack(xs, axis=axis), *xs)
    else:
      # Every processor holds all inputs; it stacks only those of its block
      # of the new dimension (zeros past the end of an uneven split).
      block = impl.slice_shape(self._outputs[0].shape)[axis]
      y = impl.slicewise(
          lambda pcoord, *xs: _stack_block(xs, pcoord, block, axis),
          impl.laid_out_pcoord(mesh_axis), *xs)
    lowering.set_tensor_lowering(self._outputs[0], y)


def _stack_block(xs, pcoord, block, axis):
  """Entries [pcoord * block, (pcoord + 1) * block) of tf.stack(xs, axis),
  zeros past its end: picked by index where `pcoord` is a Python int (each
  processor's own program), gathered where it is a tensor (one program
  for all)."""
  n = len(xs)
  if isinstance(pcoord, int):
    zeros = None
    picked = []
    for i in range(pcoord * block, (pcoord + 1) * block):
      if i >= n and zeros is None:
        zeros = tf.zeros_like(xs[0])
      picked.append(xs[i] if i < n else zeros)
    return tf.stack(picked, axis=axis)
  stacked = tf.stack(list(xs) + [tf.zeros_like(xs[0])], axis=axis)
  index = tf.minimum(tf.cast(pcoord, tf.int32) * block + tf.range(block), n)
  return tf.gather(stacked, index, axis=axis)


def unstack(x, dim, name=None):
  """The entries of `x` along `dim` (a Dimension or a name), as a list.

  Returns:
    a list of `dim.size` Tensors of shape x.shape without `dim`.
  """
  return UnstackOperation(x, dim, name=name).outputs


class UnstackOperation(graph_lib.Operation):
  """Removes one dimension, returning its entries as separate tensors."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, dim, name=None):
    super().__init__([x], name=name or "unstack")
    self._dim = shape_lib.dimension_of(x.shape, dim, f"unstack {self.name!r}")
    self._axis = x.shape.dimension_names.index(self._dim.name)
    out_shape = x.shape - [self._dim]
    self._outputs = [graph_lib.Tensor(self, out_shape, x.dtype, index=i)
                     for i in range(self._dim.size)]

  def gradient(self, grad_ys):
    grads = [g if g is not None else constants.zeros_like(y)
             for g, y in zip(grad_ys, self._outputs)]
    return [stack(grads, self._dim.name, self._axis)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis, num = self._axis, self._dim.size
    x = lowering.tensors[self._inputs[0]]
    if impl.tensor_dimension_to_mesh_axis(self._dim) is not None:
      # Each output is needed whole on every processor (without the
      # padding of an uneven split).
      x = impl.gather_dimensions(x, self._inputs[0].shape, {self._dim.name})
    values = impl.slicewise(lambda s: tuple(tf.unstack(s, num, axis=axis)), x)
    if not isinstance(values, tuple):
      values = (values,)
    for t, v in zip(self._outputs, values):
      lowering.set_tensor_lowering(t, v)


@cost_rules.rule_for(SplitOperation)
class _SplitCost(cost_rules.AlongDimensionCost):
  """Along a split dimension: `slicing.shifted_collectives` of each output
  (as SplitOperation.lower lowers)."""

  def dimension(self, info):
    return info.in_dims[0][info.op.axis]

  def attributes(self, info):
    return (tuple(self.dimension(info)), tuple(info.op.offsets()))

  def collectives_along(self, info, layout, mesh_dim):
    op = info.op
    return [c for dims, begin in zip(info.out_dims, op.offsets())
            for c in slicing.shifted_collectives(
                layout, mesh_dim, info.in_dims[0], info.in_itemsize[0],
                op.axis, dims[op.axis][1], begin)]


# stack adds a new dimension: local.
cost_rules.register(StackOperation, cost_rules.SLICEWISE)


@cost_rules.rule_for(UnstackOperation)
class _UnstackCost(cost_rules.AlongDimensionCost):
  """unstack along a split dimension all-concatenates it first."""

  def dimension(self, info):
    # The unstacked dimension is the input's one the outputs lack.
    return next(d for d in info.in_dims[0] if d not in info.out_dims[0])

  def collectives_along(self, info, layout, mesh_dim):
    return [cost_rules.collective(
        layout, "allconcat", (mesh_dim,),
        cost_rules.slice_bytes(layout, info.in_dims[0], info.in_itemsize[0]))]
