"""one_hot and gather over named dimensions.

`gather(weights, indices, dim)` looks rows of `weights` up along `dim`. When
`dim` is split across the mesh, every processor looks up the indices that fall
in its block (zeros elsewhere) and the results are summed over that mesh
dimension. The gradient scatters back with a segment sum, without building
the one-hot matrix, summed over the mesh dimensions that split the indices.
If `dim` and a dimension of `indices` are split over the same mesh dimension,
the indices are first gathered (allconcat) along it.
"""

import numpy as np
import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise


def _block_offset(impl, dim):
  """(mesh axis, laid-out offset of each processor's block) for `dim`."""
  mesh_axis = impl.tensor_dimension_to_mesh_axis(dim)
  if mesh_axis is None:
    return None, None
  block = impl.slice_shape(shape_lib.Shape([dim]))[0]  # ceil if uneven
  offset = impl.slicewise(lambda c: c * block, impl.laid_out_pcoord(mesh_axis))
  return mesh_axis, offset


def _indices_axis_on(mesh_axis_of, indices_shape, mesh_axis):
  """The axis of `indices_shape` split over `mesh_axis`, or None
  (`mesh_axis_of`: function of a dimension, the mesh axis splitting it)."""
  if mesh_axis is None:
    return None
  for axis, d in enumerate(indices_shape):
    if mesh_axis_of(d) == mesh_axis:
      return axis
  return None


class OneHotOperation(graph_lib.Operation):
  """indices[...] -> one-hot vectors along `output_dim`."""

  # Indices never point into the padding, so off_value lands there (and
  # is zeroed afterwards).
  handles_padding = True

  def __init__(self, indices, output_dim, on_value, off_value, dtype,
               name=None):
    super().__init__([indices], name=name or "one_hot")
    if not indices.dtype.is_integer:
      raise errors.DTypeError(
          f"one_hot {self.name!r}: indices {indices.name} must be integers, "
          f"got {indices.dtype.name}.")
    self._output_dim = shape_lib.convert_to_dimension(output_dim)
    self._on_value = on_value
    self._off_value = off_value
    self._outputs = [graph_lib.Tensor(
        self, indices.shape + self._output_dim, tf.as_dtype(dtype))]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dim = self._output_dim
    depth = impl.slice_shape(shape_lib.Shape([dim]))[0]
    dtype = self._outputs[0].dtype
    # tf.one_hot needs on/off values of the output dtype (1.0 for int32).
    on, off = (np.asarray(v).astype(dtype.as_numpy_dtype)
               for v in (self._on_value, self._off_value))
    _, offset = _block_offset(impl, dim)
    indices = lowering.tensors[self._inputs[0]]
    if offset is None:
      fn = lambda i: tf.one_hot(i, depth, on, off, dtype=dtype)
      y = impl.slicewise(fn, indices)
    else:
      fn = lambda i, o: tf.one_hot(i - tf.cast(o, i.dtype), depth, on, off,
                                   dtype=dtype)
      y = impl.slicewise(fn, indices, offset)
    lowering.set_tensor_lowering(self._outputs[0], y)


cost_rules.register(OneHotOperation, cost_rules.SLICEWISE)


def one_hot(indices, output_dim, on_value=1.0, off_value=0.0,
            dtype=tf.float32, name=None):
  """One-hot encoding; the output shape is indices.shape + output_dim."""
  return OneHotOperation(indices, output_dim, on_value, off_value, dtype,
                         name=name).outputs[0]


def _check_indices(indices, context):
  if indices.dtype not in (tf.int32, tf.int64):
    raise errors.DTypeError(
        f"{context}: indices {indices.name} must be int32 or int64, got "
        f"{indices.dtype.name}; cast them with mtf.cast or mtf.to_int32.")


class GatherOperation(graph_lib.Operation):
  """output[i..., rest...] = weights[rest with dim = indices[i...]]."""

  # Padded indices (zeros) look up row 0: the output's padding is zeroed.
  handles_padding = True

  def __init__(self, weights, indices, dim, output_shape, name=None):
    super().__init__([weights, indices], name=name or "gather")
    _check_indices(indices, f"GatherOperation {self.name!r}")
    self._dim = dim
    self._outputs = [graph_lib.Tensor(self, output_shape, weights.dtype)]

  @property
  def dim(self):
    """The dimension of the weights looked up."""
    return self._dim

  def gradient(self, grad_ys):
    weights, indices = self._inputs
    return [ScatterAddOperation(indices, grad_ys[0], self._dim,
                                weights.shape).outputs[0], None]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    weights, indices = self._inputs
    out_shape = self._outputs[0].shape
    axis = weights.shape.dims.index(self._dim)
    gathered_shape = shape_lib.Shape(
        weights.shape.dims[:axis] + indices.shape.dims +
        weights.shape.dims[axis + 1:])
    mesh_axis, offset = _block_offset(impl, self._dim)
    block = impl.slice_shape(shape_lib.Shape([self._dim]))[0]

    def fn(w, i, o=None):
      if o is None:
        g = tf.gather(w, i, axis=axis)
      else:
        local = i - tf.cast(o, i.dtype)
        valid = tf.logical_and(local >= 0, local < block)
        g = tf.gather(w, tf.where(valid, local, tf.zeros_like(local)),
                      axis=axis)
        mask = slice_utils.expand_to(
            tf.cast(valid, g.dtype), indices.shape, gathered_shape)
        g = g * mask
      return slice_utils.transpose_to(g, gathered_shape, out_shape)

    args = [lowering.tensors[weights], lowering.tensors[indices]]
    shared_axis = _indices_axis_on(impl.tensor_dimension_to_mesh_axis,
                                   indices.shape, mesh_axis)
    if offset is None:
      y = impl.slicewise(fn, *args)
    elif shared_axis is None:
      y = mesh_impl_lib.LazyAllreduceSum(
          impl, impl.slicewise(fn, *args, offset), [mesh_axis])
    else:
      # `dim` and an indices dimension are split over the same mesh axis:
      # each processor holds one block of `dim` but needs results for its
      # own block of indices, so every processor looks up all indices along
      # that mesh axis in its block of `dim`, and the partial results are
      # summed and split again (a reduce-scatter).
      args[1] = impl.allconcat(args[1].to_laid_out_tensor(), mesh_axis,
                               shared_axis)
      partial = impl.slicewise(fn, *args, offset)
      y = impl.reduce_scatter(
          partial, mesh_axis,
          out_shape.dims.index(indices.shape[shared_axis]), "SUM")
    lowering.set_tensor_lowering(self._outputs[0], y)


class ScatterAddOperation(graph_lib.Operation):
  """The gradient of gather: sums `updates` into rows `indices` of zeros."""

  # Padded indices (zeros) point at row 0 with zero updates; real indices
  # never point into the padding, which sums nothing.
  handles_padding = True
  padding_stays_zero = True

  def __init__(self, indices, updates, dim, weights_shape, name=None):
    super().__init__([indices, updates], name=name or "scatter_add")
    self._dim = dim
    self._outputs = [graph_lib.Tensor(self, weights_shape, updates.dtype)]

  @property
  def dim(self):
    """The dimension of the output the indices point along."""
    return self._dim

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    indices, updates = self._inputs
    weights_shape = self._outputs[0].shape
    rest = weights_shape - [self._dim]
    ordered = shape_lib.Shape(indices.shape.dims + rest.dims)
    segments_shape = shape_lib.Shape([self._dim] + rest.dims)
    block = impl.slice_shape(shape_lib.Shape([self._dim]))[0]
    mesh_axis, offset = _block_offset(impl, self._dim)

    def fn(i, u, o=None):
      u = slice_utils.transpose_to(u, updates.shape, ordered)
      flat_i = tf.reshape(i, [-1])
      u = tf.reshape(u, [-1] + slice_utils.static_shape(u)[i.shape.rank:])
      if o is not None:
        flat_i = flat_i - tf.cast(o, flat_i.dtype)
        flat_i = tf.where((flat_i >= 0) & (flat_i < block), flat_i,
                          -tf.ones_like(flat_i))
      summed = tf.math.unsorted_segment_sum(u, flat_i, block)
      return slice_utils.transpose_to(summed, segments_shape, weights_shape)

    args = [lowering.tensors[indices], lowering.tensors[updates]]
    shared_axis = _indices_axis_on(impl.tensor_dimension_to_mesh_axis,
                                   indices.shape, mesh_axis)
    if shared_axis is not None:
      # `dim` and an indices dimension are split over the same mesh axis:
      # gather all indices and updates along it, so that each processor
      # sums every update that lands in its block of `dim`.
      shared_dim = indices.shape[shared_axis]
      args = [impl.allconcat(args[0].to_laid_out_tensor(), mesh_axis,
                             shared_axis),
              impl.allconcat(args[1].to_laid_out_tensor(), mesh_axis,
                             updates.shape.dims.index(shared_dim))]
    y = impl.slicewise(fn, *args) if offset is None else impl.slicewise(
        fn, *args, offset)
    mesh_axes = sorted({impl.tensor_dimension_to_mesh_axis(d)
                        for d in indices.shape
                        if impl.tensor_dimension_to_mesh_axis(d) is not None}
                       - {mesh_axis})
    if mesh_axes:
      y = mesh_impl_lib.LazyAllreduceSum(impl, y, mesh_axes)
    lowering.set_tensor_lowering(self._outputs[0], y)


class _IndexingCost(cost_rules.CostRule):
  """What gather and scatter_add share: their lowering depends on the mesh
  dimension splitting `dim`, and on whether the indices are split over it
  too (`_indices_axis_on`)."""

  may_pend = True

  def attributes(self, info):
    return (info.op.dim.name,)

  def run(self, info, ctx):
    layout = ctx.layout
    m = layout.mesh_dim(info.op.dim.name)
    idx_dims = info.in_dims[self.indices_input]
    shared = _indices_axis_on(lambda d: layout.mesh_dim(d[0]), idx_dims, m)
    return self.price(info, layout, m, idx_dims, shared is not None)


@cost_rules.rule_for(GatherOperation)
class _GatherCost(_IndexingCost):
  """A split `dim` leaves a pending sum, or, with indices split over the
  same mesh dimension, allconcats them and reduce-scatters the result."""

  indices_input = 1

  def price(self, info, layout, m, idx_dims, shared):
    nbytes = cost_rules.io_bytes(info, layout)
    if m is None:
      return cost_rules.RuleResult([()], elementwise_bytes=nbytes)
    if not shared:
      return cost_rules.RuleResult([(m,)], elementwise_bytes=nbytes)
    partial = cost_rules.slice_bytes(layout, info.out_dims[0],
                                     info.out_itemsize[0]) * layout.sizes[m]
    indices_bytes = cost_rules.slice_bytes(layout, idx_dims,
                                           info.in_itemsize[1])
    collectives = [
        cost_rules.collective(layout, "allconcat", (m,), indices_bytes),
        cost_rules.collective(layout, "reduce_scatter", (m,), partial)]
    return cost_rules.RuleResult([()], collectives, elementwise_bytes=nbytes)


@cost_rules.rule_for(ScatterAddOperation)
class _ScatterAddCost(_IndexingCost):
  """Indices split over `dim`'s mesh dimension allconcat (with the
  updates); a sum pends over the other mesh dimensions of the indices."""

  indices_input = 0

  def price(self, info, layout, m, idx_dims, shared):
    collectives = []
    if shared:
      for dims, itemsize in zip(info.in_dims, info.in_itemsize):
        collectives.append(cost_rules.collective(
            layout, "allconcat", (m,),
            cost_rules.slice_bytes(layout, dims, itemsize)))
    pending = layout.sort(
        layout.mesh_dim(n) for n, _ in idx_dims
        if layout.mesh_dim(n) is not None and layout.mesh_dim(n) != m)
    return cost_rules.RuleResult([pending], collectives,
                                 elementwise_bytes=cost_rules.io_bytes(
                                     info, layout))


def gather(weights, indices, dim, output_shape=None, name=None):
  """Looks up entries of `weights` along `dim` at integer `indices`.

  The default output shape is indices.shape followed by the other
  dimensions of `weights`. Dimensions shared by `weights` and `indices` act
  as batch dimensions.
  """
  dim = shape_lib.convert_to_dimension(dim)
  if dim not in weights.shape.dims:
    raise errors.ShapeError(f"gather: {dim} is not a dimension of "
                            f"{weights.name} {weights.shape}.")
  if not isinstance(indices, graph_lib.Tensor):
    indices = constants.constant(weights.mesh, indices, dtype=tf.int32)
  _check_indices(indices, f"gather {name or ''}".rstrip())
  if weights.dtype == tf.bool:
    return elementwise.cast(
        gather(elementwise.to_float(weights), indices, dim, output_shape),
        tf.bool)
  rest = weights.shape - [dim]
  shared = [d for d in indices.shape if d in rest.dims]
  default_shape = shape_lib.Shape(
      indices.shape.dims + [d for d in rest if d not in indices.shape.dims])
  output_shape = shape_lib.convert_to_shape(output_shape) or default_shape
  if set(output_shape.dims) != set(default_shape.dims):
    raise errors.ShapeError(
        f"gather: output_shape {output_shape} must hold the dimensions "
        f"{default_shape}.")
  if shared:
    one_hot_indices = one_hot(indices, dim, dtype=weights.dtype)
    return contractions.einsum([one_hot_indices, weights],
                               output_shape=output_shape,
                               name=name or "gather")
  return GatherOperation(weights, indices, dim, output_shape,
                         name=name).outputs[0]
