"""Top_k, argmax, nth largest/smallest, sampling.

`top_k(x, reduced_dim, k_dim)` keeps the k largest entries of `x` along
`reduced_dim` (and their positions). When `reduced_dim` is split over a mesh
dimension, each processor takes the top k of its own block (at most the
block size), turns the positions into global ones, and the candidates are
gathered (allconcat) along that mesh dimension; a second, local top k picks
the answer. Only k values and k indices per block cross the mesh, unless
gathering the blocks themselves moves fewer bytes (a block of at most about
2k entries): then the dimension is gathered whole (one allconcat) and each
processor takes the top k of it. The cost rule makes the same choice, and
the lowering's counters show it (two allconcats or one). A split k_dim is
cut from the merged result (no communication).

Example on mesh "rows:2;cols:2" with rules "batch:rows;vocab:cols", top 3 of
logits[batch=4, vocab=8]: processor (r, c) holds batch rows 2r..2r+1 and
vocab entries 4c..4c+3; it takes the top 3 of its 4 entries per row (indices
+4c), the two processors of each row exchange their 3 candidates, and both
pick the top 3 of the 6. The output [batch, k=3] is split by "rows" and
replicated along "cols".

Ties are broken towards the smaller index, as `tf.math.top_k` does, under
every layout.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise
from mesh_tensorflow.ops import indexing
from mesh_tensorflow.ops import random_ops
from mesh_tensorflow.ops import reshapes

__all__ = [
    "TopKOperation",
    "argmax",
    "nth_largest_element",
    "nth_smallest_element",
    "sample_with_temperature",
    "top_1",
    "top_k",
]

_INDEX_DTYPES = (tf.int32, tf.int64)


class TopKOperation(graph_lib.Operation):
  """The k largest entries of `x` along `reduced_dim`, and their indices.

  Outputs `values` (dtype of `x`) and `indices` (`index_dtype`, int32 by
  default as in the original), both of shape `x.shape - reduced_dim +
  k_dim`, sorted by decreasing value. With `k_dim=None`, k is 1 and the
  output shape is `x.shape - reduced_dim`.
  Both `reduced_dim` and `k_dim` may be split across the mesh, also
  unevenly: the padding of `reduced_dim` is filled with the dtype's lowest
  value first, and comes after every real entry, so it is never chosen
  over one; a split `k_dim` is cut from the whole result, its padding zero.
  """

  handles_padding = True

  def __init__(self, x, reduced_dim, k_dim, name=None, index_dtype=tf.int32):
    super().__init__([x], name=name or "top_k")
    reduced_dim = shape_lib.convert_to_dimension(reduced_dim)
    if reduced_dim not in x.shape.dims:
      raise errors.ShapeError(
          f"{self.name}: reduced_dim {reduced_dim} is not a dimension of "
          f"{x.name} {x.shape}.")
    rest = x.shape - [reduced_dim]
    if k_dim is None:
      out_shape = rest
      k = 1
    else:
      k_dim = shape_lib.convert_to_dimension(k_dim)
      if k_dim.name in x.shape.dimension_names:
        raise errors.ShapeError(
            f"{self.name}: k_dim {k_dim} must be a new dimension, but "
            f"{x.name} {x.shape} already has a dimension named "
            f"{k_dim.name!r}; give k_dim another name.")
      out_shape = rest + k_dim
      k = k_dim.size
    if not 1 <= k <= reduced_dim.size:
      raise errors.ShapeError(
          f"{self.name}: k = {k} (the size of k_dim {k_dim}) must be between "
          f"1 and the size of reduced_dim {reduced_dim}.")
    index_dtype = tf.as_dtype(index_dtype)
    if index_dtype not in _INDEX_DTYPES:
      raise TypeError(f"{self.name}: index dtype must be int32 or int64, "
                      f"got {index_dtype.name}.")
    self._reduced_dim = reduced_dim
    self._k_dim = k_dim
    self._k = k
    self._outputs = [graph_lib.Tensor(self, out_shape, x.dtype, index=0),
                     graph_lib.Tensor(self, out_shape, index_dtype, index=1)]
    self._initialize_splittable_and_unsplittable_dims("splittable")

  @property
  def reduced_dim(self):
    return self._reduced_dim

  @property
  def k_dim(self):
    return self._k_dim

  @property
  def k(self):
    """How many entries are kept (1 when k_dim is None)."""
    return self._k

  def gradient(self, grad_ys):
    """Scatters the values' gradient back to the chosen positions."""
    dy = grad_ys[0]
    if dy is None:
      return [None]
    x = self._inputs[0]
    indices = self._outputs[1]
    if self._k_dim is not None:
      # The one-hot below has both k_dim and reduced_dim, which a layout may
      # split over one mesh dimension (no tensor of top_k has both): k_dim
      # gets a name of its own, which layouts leave unsplit (the k entries
      # are gathered).
      unsplit = self._k_dim.name + "_top_k_grad"
      while unsplit in x.shape.dimension_names:
        unsplit += "_"
      indices = reshapes.rename_dimension(indices, self._k_dim.name, unsplit)
      dy = reshapes.rename_dimension(dy, self._k_dim.name, unsplit)
    hits = indexing.one_hot(indices, self._reduced_dim, dtype=dy.dtype)
    return [contractions.einsum([hits, dy], output_shape=x.shape,
                                name=self.name + "_grad")]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self._inputs[0]
    rest = x.shape - [self._reduced_dim]
    # Slices are worked on as [rest..., reduced_dim]; top_k works on the
    # last axis and leaves [rest..., k], which is the output order.
    work_shape = rest + self._reduced_dim
    k = self._k
    index_dtype = self._outputs[1].dtype
    squeeze = self._k_dim is None

    def finish(values, indices):
      indices = tf.cast(indices, index_dtype)
      if squeeze:
        return tf.squeeze(values, -1), tf.squeeze(indices, -1)
      return values, indices

    mesh_axis = impl.tensor_dimension_to_mesh_axis(self._reduced_dim)
    x_lowered = lowering.tensors[x]

    def local_top_k(s):
      values, indices = tf.math.top_k(
          slice_utils.transpose_to(s, x.shape, work_shape), k)
      return finish(values, indices)

    if mesh_axis is None:
      values, indices = impl.slicewise(local_top_k, x_lowered)
    elif gathers_whole_dimension(self._reduced_dim.size,
                                 impl.shape[mesh_axis].size, k,
                                 x.dtype.size, index_dtype.size):
      # Padding is cut off: the top k of the whole dimension, as on one
      # processor.
      x_lowered = impl.gather_dimensions(x_lowered, x.shape,
                                         [self._reduced_dim.name])
      values, indices = impl.slicewise(local_top_k, x_lowered)
    else:
      if any(a.tensor_axis == x.shape.dims.index(self._reduced_dim)
             for a in impl.padded_axes(x.shape)):
        x_lowered = impl.fill_padding(
            x_lowered, x.shape, names=[self._reduced_dim.name],
            fill=padding.neutral_value(x.dtype, "MAX"))
      block = impl.slice_shape(shape_lib.Shape([self._reduced_dim]))[0]
      block_k = min(k, block)

      def block_top_k(s, pcoord):
        values, indices = tf.math.top_k(
            slice_utils.transpose_to(s, x.shape, work_shape), block_k)
        # Global positions, so that blocks can be compared.
        indices = tf.cast(indices, index_dtype) + tf.cast(
            pcoord * block, index_dtype)
        return values, indices

      values, indices = impl.slicewise(block_top_k, x_lowered,
                                       impl.laid_out_pcoord(mesh_axis))
      # Blocks concatenate in coordinate order, so among equal values the
      # smaller global index still comes first.
      values = impl.allconcat(values, mesh_axis, rest.ndims)
      indices = impl.allconcat(indices, mesh_axis, rest.ndims)

      def merge(values, indices):
        values, positions = tf.math.top_k(values, k)
        return finish(values, tf.gather(indices, positions,
                                        batch_dims=rest.ndims))

      values, indices = impl.slicewise(merge, values, indices)
    if not squeeze and impl.tensor_dimension_to_mesh_axis(
        self._k_dim) is not None:
      # The result is whole along k_dim on every processor: each keeps its
      # block (zero-padded when uneven).
      out_shape = self._outputs[0].shape
      values = impl.split_dimensions(values, out_shape, [self._k_dim.name])
      indices = impl.split_dimensions(indices, out_shape,
                                      [self._k_dim.name])
    lowering.set_tensor_lowering(self._outputs[0], values)
    lowering.set_tensor_lowering(self._outputs[1], indices)


def gathers_whole_dimension(size, pieces, k, value_itemsize,
                            index_itemsize):
  """Whether top_k along a dimension of `size` split `pieces` ways gathers
  the dimension (each block's entries: one allconcat) rather than merging
  each block's top k candidates (values and indices: two allconcats),
  because that moves no more bytes."""
  block = -(-size // pieces)
  return block * value_itemsize <= min(k, block) * (value_itemsize +
                                                    index_itemsize)


@cost_rules.rule_for(TopKOperation)
class _TopKCost(cost_rules.AlongDimensionCost):
  """top_k over a split dimension: each block's top k, all-concatenated
  (values and indices), then merged; or the blocks all-concatenated when
  that is cheaper (`gathers_whole_dimension`). A split k_dim costs no
  communication."""

  def dimension(self, info):
    return info.op.reduced_dim

  def attributes(self, info):
    return tuple(info.op.reduced_dim) + (info.op.k,)

  def collectives_along(self, info, layout, mesh_dim):
    reduced = info.op.reduced_dim
    pieces = layout.sizes[mesh_dim]
    block = -(-reduced.size // pieces)
    rest = layout.slice_elements(
        [d for d in info.in_dims[0] if d[0] != reduced.name])
    value_itemsize, index_itemsize = info.out_itemsize
    if gathers_whole_dimension(reduced.size, pieces, info.op.k,
                               value_itemsize, index_itemsize):
      return [cost_rules.collective(layout, "allconcat", (mesh_dim,),
                                    rest * block * value_itemsize)]
    block_k = min(info.op.k, block)
    return [cost_rules.collective(layout, "allconcat", (mesh_dim,),
                                  rest * block_k * itemsize)
            for itemsize in info.out_itemsize]


def top_k(x, reduced_dim, k_dim, name=None):
  """Like `tf.math.top_k` along a named dimension.

  Args:
    x: an mtf Tensor.
    reduced_dim: a Dimension of `x`.
    k_dim: a new Dimension; its size is k (at most `reduced_dim.size`).
    name: optional name.

  Returns:
    (values, indices): the k largest entries of `x` along `reduced_dim` in
    decreasing order, and their int32 positions, both of shape
    `x.shape - reduced_dim + k_dim`. The gradient of `values` flows back to
    the chosen entries of `x`.
  """
  op = TopKOperation(x, reduced_dim, k_dim, name=name)
  return op.outputs[0], op.outputs[1]


def top_1(x, reduced_dim, name=None, dtype=tf.int32):
  """Max and argmax along `reduced_dim`.

  Args:
    x: a Tensor.
    reduced_dim: a Dimension of `x`.
    name: an optional name.
    dtype: the dtype of the indices (int32, as in the original, or int64).

  Returns:
    (values, indices), in the original's order: `values` equals
    `reduce_max(x, reduced_dim=reduced_dim)`, `indices` are the positions
    (the smaller one on ties); both of shape `x.shape - reduced_dim`.
  """
  op = TopKOperation(x, reduced_dim, None, name=name or "top_1",
                     index_dtype=dtype)
  return op.outputs[0], op.outputs[1]


def argmax(x, reduced_dim, name=None, dtype=tf.int32):
  """The position of the largest entry along `reduced_dim` (smallest on
  ties), of shape `x.shape - reduced_dim` and dtype `dtype` (int32)."""
  return top_1(x, reduced_dim, name=name or "argmax", dtype=dtype)[1]


def _check_n(n, reduced_dim, what):
  reduced_dim = shape_lib.convert_to_dimension(reduced_dim)
  if not 0 <= n < reduced_dim.size:
    raise ValueError(f"{what}: n = {n} must be in [0, {reduced_dim.size}) "
                     f"for reduced_dim {reduced_dim} (n counts from 0).")
  return reduced_dim


def nth_largest_element(x, n, reduced_dim, name=None):
  """The n-th largest entry along `reduced_dim`, counting from 0 (n = 0 is
  the maximum); the output shape is `x.shape - reduced_dim`."""
  reduced_dim = _check_n(n, reduced_dim, "nth_largest_element")
  k_dim = shape_lib.Dimension("_top_k_", n + 1)
  values, _ = top_k(x, reduced_dim, k_dim,
                    name=name or "nth_largest_element")
  return indexing.gather(values, n, k_dim)


def nth_smallest_element(x, n, reduced_dim, name=None):
  """The n-th smallest entry along `reduced_dim`, counting from 0."""
  reduced_dim = _check_n(n, reduced_dim, "nth_smallest_element")
  return elementwise.negative(
      nth_largest_element(elementwise.negative(x), n, reduced_dim,
                          name=name or "nth_smallest_element"))


def sample_with_temperature(logits, dim, temperature=1.0, name=None):
  """Samples positions along `dim` with probabilities softmax(logits / T).

  Uses the Gumbel-max trick: argmax(logits + T * Gumbel noise), in float32
  (Gumbel noise in bfloat16 is too coarse). Temperature 0 is the argmax.
  `temperature` is a Python number or a scalar mtf Tensor.

  Returns:
    int32 indices of shape `logits.shape - dim`.
  """
  dim = shape_lib.convert_to_dimension(dim)
  name = name or "sample_with_temperature"
  if not isinstance(temperature, graph_lib.Tensor) and temperature == 0.0:
    return argmax(logits, dim, name=name)
  logits = elementwise.cast(logits, tf.float32)
  # The noise -log(-log(u)) needs u in (0, 1): 0 would give -inf.
  uniform = random_ops.random_uniform(logits.mesh, logits.shape,
                                      minval=1e-9, maxval=1.0,
                                      dtype=tf.float32)
  gumbel = elementwise.negative(elementwise.log(elementwise.negative(
      elementwise.log(uniform))))
  noisy = binary.add(logits, binary.multiply(gumbel, temperature),
                     output_shape=logits.shape)
  return argmax(noisy, dim, name=name)
