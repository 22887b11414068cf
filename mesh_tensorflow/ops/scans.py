"""Cumulative sums, 1-d pooling and striding, reduce_first.

`cumsum` works along a dimension that is split across the mesh: each
processor sums its own block, then adds the total of the blocks before it.
Example on mesh "all:2" with the rule "d:all", x[d=4] = [1, 2, 3, 4]:
processor 0 holds [1, 2] and computes [1, 3]; processor 1 holds [3, 4] and
computes [3, 7]; the block totals [3, 7] are allconcatenated over "all" and
processor 1 adds 3 (the totals before it) to get [6, 10]. The communication
is one allconcat of the per-block totals (the slice size divided by the
dimension's block size).

`pool_tensor_1d`, `stride_tensor_1d` and `reduce_first` are built from
reshapes and reductions, so they work under every layout too.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import reduce as reduce_lib
from mesh_tensorflow.ops import reshapes
from mesh_tensorflow.ops import slicing

__all__ = [
    "cumsum",
    "CumsumOperation",
    "pool_tensor_1d",
    "reduce_first",
    "stride_tensor_1d",
]


def cumsum(x, dim, exclusive=False, name=None):
  """Cumulative sum of `x` along `dim` (a Dimension or a name).

  Args:
    x: a Tensor.
    dim: the dimension to sum along; it may be split across the mesh.
    exclusive: if True, entry i is the sum of the entries before i (entry 0
      is zero); otherwise it includes entry i.
    name: optional name of the operation.

  Returns:
    a Tensor with the shape and dtype of `x`.
  """
  return CumsumOperation(x, dim, exclusive=exclusive, name=name).outputs[0]


class CumsumOperation(graph_lib.Operation):
  """Cumulative sum along one dimension, forwards or (`reverse`) backwards.

  The reverse sum is the gradient of the forward one and vice versa.
  Uneven splits need nothing more: zero padding (at the end of the last
  blocks) adds nothing to the block totals or to the sums before it.
  """

  handles_padding = True

  def __init__(self, x, dim, exclusive=False, reverse=False, name=None):
    super().__init__([x], name=name or "cumsum")
    self._dim = shape_lib.dimension_of(x.shape, dim, f"cumsum {self.name!r}")
    if x.dtype == tf.bool:
      raise TypeError(f"cumsum {self.name!r}: cannot sum {x.name} of dtype "
                      "bool; cast it to a number first.")
    self._axis = x.shape.dimension_names.index(self._dim.name)
    self._exclusive = bool(exclusive)
    self._reverse = bool(reverse)
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  @property
  def dim(self):
    """The dimension summed along."""
    return self._dim

  def gradient(self, grad_ys):
    return [CumsumOperation(grad_ys[0], self._dim, exclusive=self._exclusive,
                            reverse=not self._reverse,
                            name=self.name + "_grad").outputs[0]]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis, exclusive, reverse = self._axis, self._exclusive, self._reverse
    x = lowering.tensors[self._inputs[0]]
    local = impl.slicewise(
        lambda s: tf.cumsum(s, axis=axis, exclusive=exclusive,
                            reverse=reverse), x)
    mesh_axis = impl.tensor_dimension_to_mesh_axis(self._dim)
    if mesh_axis is None or impl.shape[mesh_axis].size == 1:
      lowering.set_tensor_lowering(self._outputs[0], local)
      return
    # The total of each block, gathered on every processor in coordinate
    # order; each processor adds the totals of the blocks before it (after
    # it, for a reverse sum).
    totals = impl.slicewise(
        lambda s: tf.reduce_sum(s, axis=axis, keepdims=True), x)
    totals = impl.allconcat(totals, mesh_axis, axis)

    def add_offset(y, block_totals, pcoord):
      offsets = tf.cumsum(block_totals, axis=axis, exclusive=True,
                          reverse=reverse)
      index = tf.reshape(tf.cast(pcoord, tf.int32), [1])
      return y + tf.gather(offsets, index, axis=axis)

    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.slicewise(add_offset, local, totals,
                       impl.laid_out_pcoord(mesh_axis)))


@cost_rules.rule_for(CumsumOperation)
class _CumsumCost(cost_rules.AlongDimensionCost):
  """cumsum along a split dimension: block totals all-concatenated."""

  def dimension(self, info):
    return info.op.dim

  def collectives_along(self, info, layout, mesh_dim):
    return [cost_rules.collective(
        layout, "allconcat", (mesh_dim,), cost_rules.slice_bytes_without(
            layout, info.in_dims[0], info.op.dim.name, info.in_itemsize[0]))]


def _pool_shape(tensor, pool_dim, pool_size, context):
  """[..., pool_dim / pool_size, pool_size, ...] and the new inner dim."""
  pool_dim = shape_lib.dimension_of(tensor.shape, pool_dim, context)
  if pool_size <= 0 or pool_dim.size % pool_size:
    raise errors.ShapeError(
        f"{context}: dimension {pool_dim.name!r} of size {pool_dim.size} is "
        f"not divisible by the window size {pool_size}.")
  outer = shape_lib.Dimension(pool_dim.name, pool_dim.size // pool_size)
  # An anonymous name: no layout rule splits the window dimension.
  inner = shape_lib.Dimension(
      shape_lib.anonymous_dimension_name(pool_dim.name + "_window"),
      pool_size)
  if inner.name in tensor.shape.dimension_names:
    raise errors.ShapeError(
        f"{context}: {tensor.shape} already has a dimension named "
        f"{inner.name!r}, which pooling needs for the window.")
  return reshapes.replace_dimensions(tensor, pool_dim, [outer, inner]), inner


def pool_tensor_1d(tensor, pool_dim, reduce_fn=reduce_lib.reduce_mean,
                   pool_size=2):
  """Pools non-overlapping windows of `pool_size` entries along `pool_dim`.

  `pool_dim` is reshaped to [pool_dim.size / pool_size, pool_size] (the
  outer part keeping the name, so a split `pool_dim` stays split where the
  sizes allow) and `reduce_fn` reduces each window.

  Args:
    tensor: a Tensor with `pool_dim` among its dimensions.
    pool_dim: a Dimension or a name; its size must divide by `pool_size`.
    reduce_fn: an mtf reduction taking `reduced_dim=` (mtf.reduce_mean,
      mtf.reduce_max, mtf.reduce_sum, ...).
    pool_size: the window size.

  Returns:
    a Tensor like `tensor` with `pool_dim` of size pool_dim.size / pool_size.
  """
  reshaped, inner = _pool_shape(tensor, pool_dim, pool_size,
                                "pool_tensor_1d")
  return reduce_fn(reshaped, reduced_dim=inner)


def stride_tensor_1d(tensor, pool_dim, pool_size=2):
  """Keeps the first entry of every window of `pool_size` entries along
  `pool_dim` (entries 0, pool_size, 2 * pool_size, ...): pooling that takes
  the first element.

  Args:
    tensor: a Tensor with `pool_dim` among its dimensions.
    pool_dim: a Dimension or a name; its size must divide by `pool_size`.
    pool_size: the window size (the stride).

  Returns:
    a Tensor like `tensor` with `pool_dim` of size pool_dim.size / pool_size.
  """
  reshaped, inner = _pool_shape(tensor, pool_dim, pool_size,
                                "stride_tensor_1d")
  # The window dimension is never split, so taking its first entry is local.
  first = slicing.mtf_slice(reshaped, 0, 1, inner.name)
  return reshapes.reshape(
      first, first.shape - [first.shape.get_dim_by_name(inner.name)])


def reduce_first(tensor, reduced_dim):
  """The first entry of `tensor` along `reduced_dim` (which may be split).

  Other entries are masked out (with `where`, so non-finite values there do
  not leak in) and the result is a sum over `reduced_dim`: when it is split,
  only the processors holding entry 0 contribute, through a (lazy) allreduce.

  Args:
    tensor: a Tensor.
    reduced_dim: a Dimension or a name of one of its dimensions.

  Returns:
    a Tensor of shape tensor.shape without `reduced_dim`.
  """
  reduced_dim = shape_lib.dimension_of(tensor.shape, reduced_dim, "reduce_first")
  position = constants.mtf_range(tensor.mesh, reduced_dim, tf.int32)
  is_first = comparisons.equal(position, 0)
  masked = binary.where(is_first, tensor, 0, output_shape=tensor.shape)
  return reduce_lib.reduce_sum(masked, reduced_dim=reduced_dim)
