"""Shift, dynamic_shift and halo exchange along a named dimension.

`shift(x, offset, dim, wrap)` moves the entries of `x` by `offset` positions
along `dim`: y[..., i, ...] = x[..., i - offset, ...], with zeros (or the
wrapped-around entries when `wrap`) where i - offset falls outside.

Example on mesh "all:2" with rule "length:all": x[length=8] has blocks of
4 entries, x0..x3 on processor 0 and x4..x7 on processor 1. shift by 1 gives
processor 0 [0, x0, x1, x2] and processor 1 [x3, x4, x5, x6]: each processor
keeps its first three entries and receives the last entry of its left
neighbour (one `receive` along "all"). A shift by 5 (a block and one entry)
takes one entry from two blocks back and three from one block back: two
receives and a concat.

`halo_exchange` builds on `shift` for spatially partitioned convolutions and
local attention: each block gets `halo_size` entries of its neighbours.
"""

import numbers

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise
from mesh_tensorflow.ops import reshapes
from mesh_tensorflow.ops import slicing

__all__ = [
    "ShiftOperation",
    "dynamic_shift",
    "halo_exchange",
    "left_halo_exchange",
    "shift",
]


def _dim_of(x, dim, context):
  """The Dimension of `x` named by `dim` (a Dimension or a name)."""
  name = dim if isinstance(dim, str) else shape_lib.convert_to_dimension(
      dim).name
  if name not in x.shape.dimension_names:
    raise errors.ShapeError(
        f"{context}: {dim!r} is not a dimension of {x.name} {x.shape}.")
  found = x.shape.get_dim_by_name(name)
  if not isinstance(dim, str) and shape_lib.convert_to_dimension(
      dim) != found:
    raise errors.ShapeError(
        f"{context}: {dim} has the name of {found} in {x.name} {x.shape} but "
        "a different size.")
  return found


def _take(x, axis, begin, size):
  """Entries [begin, begin + size) of slice `x` along `axis`."""
  starts = [0] * len(slice_utils.static_shape(x))
  sizes = [-1] * len(starts)
  starts[axis] = begin
  sizes[axis] = size
  return slice_utils.tf_slice(x, starts, sizes)


def _local_shift(x, axis, offset, wrap):
  """shift of one slice whose `axis` is the whole dimension."""
  size = slice_utils.static_shape(x)[axis]
  if wrap:
    offset %= size
    if offset == 0:
      return x
    return tf.concat([_take(x, axis, size - offset, offset),
                      _take(x, axis, 0, size - offset)], axis=axis)
  if abs(offset) >= size:
    return tf.zeros_like(x)
  pads = [[0, 0]] * len(slice_utils.static_shape(x))
  if offset > 0:
    pads[axis] = [offset, 0]
    return slice_utils.tf_pad(_take(x, axis, 0, size - offset), pads)
  pads[axis] = [0, -offset]
  return slice_utils.tf_pad(_take(x, axis, -offset, size + offset), pads)


class ShiftOperation(graph_lib.Operation):
  """Shifts `x` by a static `offset` along one dimension.

  The dimension may be split over a mesh dimension: then each processor's
  block is assembled from (at most two) blocks of other processors along that
  mesh dimension, received with `shift_by_n_processors`.

  Uneven splits: padding along other dimensions moves with its processors'
  blocks and stays zero. Along a padded dimension of size n, a shift
  without wrap is the shift of the padded tensor (zeros follow the logical
  end, so nothing but zeros comes in from it) with the entries shifted into
  the padding zeroed; a wrap by o (0 < o < n) is the sum of the shifts
  without wrap by o and by o - n, the second bringing the logical end's
  entries to the front.
  """

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, offset, dim, wrap, name=None):
    super().__init__([x], name=name or "shift")
    self._dim = _dim_of(x, dim, f"shift {self.name!r}")
    if not isinstance(offset, numbers.Integral) or isinstance(offset, bool):
      raise TypeError(
          f"shift {self.name!r}: offset must be a Python int, got "
          f"{offset!r}; use dynamic_shift for an offset held in a Tensor.")
    self._offset = int(offset)
    self._wrap = bool(wrap)
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  @property
  def dim(self):
    return self._dim

  @property
  def offset(self):
    return self._offset

  @property
  def wrap(self):
    return self._wrap

  def gradient(self, grad_ys):
    return [shift(grad_ys[0], -self._offset, self._dim, self._wrap)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = lowering.laid_out_tensor(self._inputs[0])
    axis = self._inputs[0].shape.index(self._dim)
    offset, wrap = self._offset, self._wrap
    mesh_axis = impl.tensor_dimension_to_mesh_axis(self._dim)
    if mesh_axis is None:
      y = impl.slicewise(lambda s: _local_shift(s, axis, offset, wrap), x)
      lowering.set_tensor_lowering(self._outputs[0], y)
      return
    shape = self._inputs[0].shape
    block = impl.slice_shape(shape)[axis]
    if block * impl.shape[mesh_axis].size == self._dim.size:
      y = _split_shift(impl, x, axis, mesh_axis, offset, self._dim.size,
                       block, wrap)
    else:
      size = self._dim.size
      if wrap:
        offset %= size
      y = _split_shift(impl, x, axis, mesh_axis, offset, size, block, False)
      if wrap:
        y = impl.slicewise(tf.add, y, _split_shift(
            impl, x, axis, mesh_axis, offset - size, size, block, False))
      y = impl.fill_padding(y, shape, names={self._dim.name})
    lowering.set_tensor_lowering(self._outputs[0], y)


def _split_shift(impl, x, axis, mesh_axis, offset, size, block, wrap):
  """Laid-out `x` shifted along tensor `axis`, split over `mesh_axis` in
  blocks of `block` entries."""
  pieces = _shift_pieces(offset, size, block, wrap)
  if len(pieces) == 1:
    return impl.shift_by_n_processors(x, mesh_axis, pieces[0][0], wrap)
  (tail_blocks, rest), (head_blocks, head_size) = pieces
  tail = impl.slicewise(lambda s: _take(s, axis, head_size, rest), x)
  head = impl.slicewise(lambda s: _take(s, axis, 0, head_size), x)
  tail = impl.shift_by_n_processors(tail, mesh_axis, tail_blocks, wrap)
  head = impl.shift_by_n_processors(head, mesh_axis, head_blocks, wrap)
  return impl.slicewise(lambda t, h: tf.concat([t, h], axis=axis), tail, head)


def _shift_pieces(offset, size, block, wrap):
  """How a shift along a split dimension assembles each block.

  With offset = blocks * block + rest (0 <= rest < block), output block p
  is the last `rest` entries of block p - blocks - 1 followed by the first
  block - rest entries of block p - blocks.

  Args:
    offset: the shift.
    size: the dimension's size.
    block: the entries of one block (one processor's slice).
    wrap: whether the shift wraps around.

  Returns:
    a list of (blocks to shift by, entries taken) pairs, in output order:
    one pair when the shift moves whole blocks, else two.
  """
  if wrap:
    offset %= size
  blocks, rest = divmod(offset, block)
  if rest == 0:
    return [(blocks, block)]
  return [(blocks + 1, rest), (blocks, block - rest)]


def _receivers(n, offset, wrap):
  """Members of a group of n that get a slice from another member when
  shifting by `offset` processors (as shift_by_n_processors counts)."""
  count = 0
  for i in range(n):
    c = i - offset
    if not 0 <= c < n:
      c = c % n if wrap else None
    if c is not None and c != i:
      count += 1
  return count


@cost_rules.rule_for(ShiftOperation)
class _ShiftCost(cost_rules.AlongDimensionCost):
  """Over a split dimension: a receive for each of `_shift_pieces`."""

  def dimension(self, info):
    return info.op.dim

  def attributes(self, info):
    op = info.op
    return (op.dim.name, op.offset, op.wrap)

  def collectives_along(self, info, layout, mesh_dim):
    op = info.op
    n = layout.sizes[mesh_dim]
    size = op.dim.size
    block = -(-size // n)
    per_entry = cost_rules.slice_bytes(layout, info.in_dims[0],
                                       info.in_itemsize[0]) // block
    if block * n == size:
      shifts = [(op.offset, op.wrap)]
    elif op.wrap:  # padded: two shifts without wrap (see ShiftOperation)
      shifts = [(op.offset % size, False), (op.offset % size - size, False)]
    else:
      shifts = [(op.offset, False)]
    return [cost_rules.collective(layout, "receive", (mesh_dim,),
                                  per_entry * entries,
                                  _receivers(n, blocks, wrap))
            for offset, wrap in shifts
            for blocks, entries in _shift_pieces(offset, size, block, wrap)]


def shift(x, offset, dim, wrap, name=None):
  """Shifts `x` by `offset` positions along `dim`.

  y[..., i, ...] = x[..., i - offset, ...]. Positions whose source lies
  outside the dimension are zero, or, if `wrap`, taken modulo its size.
  `dim` may be split across the mesh (the processors then exchange blocks
  with their neighbours along that mesh dimension).

  Args:
    x: a Tensor.
    offset: a Python int; positive shifts towards higher indices.
    dim: a Dimension of `x`, or its name.
    wrap: whether entries shifted out come back in at the other end.
    name: an optional name.

  Returns:
    a Tensor with the shape of `x`.
  """
  size = _dim_of(x, dim, "shift").size
  if offset == 0 or (wrap and isinstance(offset, numbers.Integral) and
                     offset % size == 0):
    return x
  return ShiftOperation(x, offset, dim, wrap, name=name).outputs[0]


def dynamic_shift(x, offset, dim, wrap, name=None):
  """Shifts `x` along `dim` by an offset held in an integer Tensor.

  y[..., i, ...] = x[..., i - offset, ...], where `offset` may vary over
  other dimensions of `x` (its shape is a subset of x's, without `dim`).
  Computed as an einsum with a 0/1 permutation matrix, so it costs
  O(dim.size^2) per entry of the other dimensions.

  Args:
    x: a float Tensor.
    offset: an integer Tensor whose dimensions are dimensions of `x` other
      than `dim`.
    dim: a Dimension of `x`, or its name.
    wrap: whether entries shifted out come back in at the other end.
    name: an optional name (unused; the op is built from other ops).

  Returns:
    a Tensor with the shape of `x`.
  """
  del name
  dim = _dim_of(x, dim, "dynamic_shift")
  if dim in offset.shape.dims:
    raise errors.ShapeError(
        f"dynamic_shift: offset {offset.shape} must not have the shifted "
        f"dimension {dim}.")
  for d in offset.shape:
    if d not in x.shape.dims:
      raise errors.ShapeError(
          f"dynamic_shift: offset dimensions {offset.shape} must be "
          f"dimensions of x {x.shape}; {d} is not.")
  if not offset.dtype.is_integer:
    raise TypeError(
        f"dynamic_shift: offset must be an integer Tensor, got "
        f"{offset.dtype.name}.")
  source_dim = shape_lib.Dimension(dim.name + "_dynamic_shift_source",
                                   dim.size)
  source = reshapes.replace_dimensions(x, dim, source_dim)
  target_pos = constants.mtf_range(x.mesh, dim, offset.dtype)
  source_pos = constants.mtf_range(x.mesh, source_dim, offset.dtype)
  moved_pos = source_pos + offset
  if wrap:
    moved_pos = comparisons.mod(moved_pos, dim.size)
  permutation = elementwise.cast(comparisons.equal(target_pos, moved_pos),
                                 x.dtype)
  return contractions.einsum([source, permutation], output_shape=x.shape)


def _halo_parts(x, blocks_dim, block_size_dim, halo_size, wrap, right):
  block_size_dim = _dim_of(x, block_size_dim, "halo_exchange")
  blocks_dim = _dim_of(x, blocks_dim, "halo_exchange")
  if halo_size < 0:
    raise ValueError(f"halo_exchange: halo_size must be >= 0, got "
                     f"{halo_size}.")
  block_size = block_size_dim.size
  whole_blocks, partial = divmod(halo_size, block_size)
  parts = [x]
  for i in range(1, whole_blocks + 1):
    parts.insert(0, shift(x, i, blocks_dim, wrap))
    if right:
      parts.append(shift(x, -i, blocks_dim, wrap))
  if partial:
    right_margin = slicing.mtf_slice(x, block_size - partial, partial,
                                     block_size_dim.name)
    parts.insert(0, shift(right_margin, whole_blocks + 1, blocks_dim, wrap))
    if right:
      left_margin = slicing.mtf_slice(x, 0, partial, block_size_dim.name)
      parts.append(shift(left_margin, -(whole_blocks + 1), blocks_dim, wrap))
  return slicing.concat(parts, block_size_dim.name)


def halo_exchange(x, blocks_dim, block_size_dim, halo_size, wrap=False):
  """Extends each block with `halo_size` entries of its neighbours.

  `x` holds a long dimension cut into blocks: position (b, i) of
  (blocks_dim, block_size_dim) is entry b * block_size + i. The result has
  block_size_dim grown to block_size + 2 * halo_size: each block is preceded
  by the last `halo_size` entries before it and followed by the first
  `halo_size` entries after it (zeros past the ends unless `wrap`).
  `blocks_dim` may be split across the mesh; `block_size_dim` must not be.
  The halo may be larger than a block.

  Args:
    x: a Tensor.
    blocks_dim: the Dimension (or name) numbering the blocks.
    block_size_dim: the Dimension (or name) inside a block.
    halo_size: an int >= 0.
    wrap: whether the first block's left neighbour is the last block.

  Returns:
    a Tensor like `x` with block_size_dim of size block_size + 2 * halo_size.
  """
  if halo_size == 0:
    return x
  return _halo_parts(x, blocks_dim, block_size_dim, halo_size, wrap,
                     right=True)


def left_halo_exchange(x, blocks_dim, block_size_dim, halo_size, wrap=False):
  """Like `halo_exchange` but only prepends the entries from the left.

  The result's block_size_dim has size block_size + halo_size.
  """
  if halo_size == 0:
    return x
  return _halo_parts(x, blocks_dim, block_size_dim, halo_size, wrap,
                     right=False)
