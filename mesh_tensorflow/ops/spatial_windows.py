"""Convolution and pooling along split spatial dimensions: window halos.

Along a spatial dimension of n rows split k ways (blocks of B = ceil(n / k),
the last padded when uneven), output block p of a convolution or pooling
(blocks of OB = ceil(out / k), the layout rules' layout of the output's
size) reads the input rows [p * OB * s - before, p * OB * s - before + W),
W = (OB - 1) * s + f, for stride s, filter (window) size f and the SAME
padding's leading zeros `before` (0 for VALID and for pooling). These
windows overlap their neighbours' blocks by the filter's reach (the halo)
or, for strides and windows that do not match the blocks, by whatever the
blocks drifted apart. `gather_windows` moves only those rows
(`regrid.plan_windows`: one receive per block offset, zeros past the ends
standing for SAME's zero padding) or gathers the dimension (one allconcat)
when the plan finds that cheaper; each processor then runs the kernel with
VALID padding on its window and gets its output block. The input
gradients go back the same way (`scatter_add_windows`: the rows return to
their blocks and overlapping halos add; always receives, since a gather
would need an allreduce of the whole dimension).

Example: conv2d SAME with a 3x3 filter, h = 12 split 4 ways (B = OB = 3):
window p is rows [3p - 1, 3p + 4), one row from each neighbour; two
receives (offsets 1 and -1) move one row each to 3 processors.
"""

import dataclasses
import math

import numpy as np
import tensorflow as tf

from mesh_tensorflow.backend import regrid
from mesh_tensorflow.ops import cost_rules


@dataclasses.dataclass(frozen=True)
class SplitWindow:
  """One split spatial dimension of a convolution or pooling.

  Attributes:
    index: which spatial dimension (0 for the first).
    size: the input rows n; out_size: the output rows.
    k: the mesh dimension's size; mesh_dim: its name.
    plan: the regrid.Plan of the windows.
  """
  index: int
  size: int
  out_size: int
  k: int
  mesh_dim: str
  plan: regrid.Plan

  @property
  def identity(self):
    """Whether each block already is its window (no rows move)."""
    p = self.plan
    return (not p.widths and p.block == p.out_block and
            all(src == dst for src, dst, _ in p.pieces.get(0, {}).values()))


def leading_padding(size, out_size, filter_size, stride, padding):
  """The zero rows TF puts before a dimension (SAME pads the total's
  smaller half first)."""
  if padding != "SAME":
    return 0
  return max((out_size - 1) * stride + filter_size - size, 0) // 2


def window_plan(size, out_size, k, filter_size, stride, before):
  """The regrid.Plan of the windows output block p reads (see the module
  docstring), only the rows its real output rows read."""
  out_block = -(-out_size // k)
  width = (out_block - 1) * stride + filter_size
  windows = {}
  for p in range(k):
    real = min(out_block, out_size - p * out_block)
    if real > 0:
      windows[p] = (p * out_block * stride - before,
                    (real - 1) * stride + filter_size)
  return regrid.plan_windows(size, -(-size // k), windows, width)


def split_windows(sizes, out_sizes, filter_sizes, strides, padding,
                  mesh_dims, mesh_sizes):
  """The SplitWindow of each spatial dimension whose mesh dimension (in
  `mesh_dims`, None when whole) splits it."""
  result = []
  for i, (n, out, f, s, m) in enumerate(
      zip(sizes, out_sizes, filter_sizes, strides, mesh_dims)):
    if m is None:
      continue
    k = mesh_sizes[m]
    before = leading_padding(n, out, f, s, padding)
    result.append(SplitWindow(i, n, out, k, m,
                              window_plan(n, out, k, f, s, before)))
  return result


def split_windows_of(impl, spatial_dims, out_sizes, filter_sizes, strides,
                     padding):
  """split_windows under mesh implementation `impl`; the mesh dimensions
  are reported by mesh axis (an int) in SplitWindow.mesh_dim."""
  axes = [impl.tensor_dimension_to_mesh_axis(d) for d in spatial_dims]
  sizes = {a: impl.shape[a].size for a in axes if a is not None}
  return split_windows([d.size for d in spatial_dims], out_sizes,
                       filter_sizes, strides, padding, axes, sizes)


def _gathers(w):
  return not w.identity and w.plan.gathers(w.k)


def gather_windows(impl, x, first_spatial_axis, windows):
  """Laid-out `x` with each split spatial dimension of `windows` replaced
  by its windows (out_block rows each)."""
  for w in windows:
    axis = first_spatial_axis + w.index
    if w.identity:
      continue
    if not _gathers(w):
      x = regrid.regrid(impl, x, axis, w.mesh_dim, w.plan)
      continue
    # Gathered: the rows of block q start at q * block in the whole.
    whole = impl.allconcat(x, w.mesh_dim, axis)
    zero_row = w.k * w.plan.block
    table = np.full([w.k, w.plan.out_block], zero_row, np.int32)
    for o, by_p in w.plan.pieces.items():
      for p, (src, dst, n) in by_p.items():
        first = (p - o) * w.plan.block + src
        table[p, dst:dst + n] = np.arange(first, first + n)
    x = impl.slicewise(
        lambda s, c, a=axis, t=table: tf.gather(
            regrid.with_zero_row(s, a), regrid.row(t, c), axis=a),
        whole, impl.laid_out_pcoord(w.mesh_dim))
  return x


def scatter_add_windows(impl, g, first_spatial_axis, windows):
  """The transpose of gather_windows (by receives): laid-out `g` with
  window rows summed back into the blocks of each split dimension."""
  for w in windows:
    g = regrid.scatter_add(impl, g, first_spatial_axis + w.index,
                           w.mesh_dim, w.plan)
  return g


def cost_windows(layout, image_dims, out_dims, filter_sizes, strides,
                 padding, first_spatial_axis):
  """split_windows of an operation whose image side has `image_dims` and
  whose output side `out_dims` ((name, size) pairs), under `layout`."""
  rank = len(filter_sizes)
  spatial = image_dims[first_spatial_axis:first_spatial_axis + rank]
  outs = out_dims[first_spatial_axis:first_spatial_axis + rank]
  return split_windows([n for _, n in spatial], [n for _, n in outs],
                       filter_sizes, strides, padding,
                       [layout.mesh_dim(name) for name, _ in spatial],
                       layout.sizes)


def window_collectives(layout, dims, itemsize, first_spatial_axis, windows,
                       transpose=False):
  """The Collectives of gather_windows (or, `transpose`, of
  scatter_add_windows) of a tensor of `dims` ((name, size) pairs; its
  slices as the layout lays them out before the move)."""
  sizes = layout.slice_sizes(dims)
  if transpose:
    for w in windows:
      sizes[first_spatial_axis + w.index] = w.plan.out_block
  result = []
  for w in windows:
    axis = first_spatial_axis + w.index
    per_row = itemsize * math.prod(sizes[:axis] + sizes[axis + 1:])
    if transpose:
      result += _receives(layout, w, per_row)
      sizes[axis] = w.plan.block
      continue
    if w.identity:
      continue
    if _gathers(w):
      result.append(cost_rules.collective(layout, "allconcat", (w.mesh_dim,),
                                          per_row * w.plan.block))
    else:
      result += _receives(layout, w, per_row)
    sizes[axis] = w.plan.out_block
  return result


def _receives(layout, w, per_row):
  return [cost_rules.collective(layout, "receive", (w.mesh_dim,),
                                per_row * w.plan.widths[o],
                                w.plan.receivers[o])
          for o in sorted(w.plan.widths)]


def fill_output_padding(impl, y, shape):
  """`y` with the padding of its padded dimensions zeroed (an output block
  past the real rows convolves real halo rows)."""
  if impl.padded_axes(shape):
    return impl.fill_padding(y, shape)
  return y
