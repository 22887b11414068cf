"""Slicewise functions along split dimensions they must see whole or with
neighbours: the `unsplittable="gather"` and `halo` options of `slicewise`.

A slicewise function sees one processor's slice of each input. A dimension
it does not declare splittable must be whole in that slice; by default the
lowering refuses a layout splitting it (LayoutError). Two opt-in ways:

- gather: each input's split dimensions the function did not declare
  splittable are gathered whole (one allconcat per such dimension and input)
  before the function runs; its results are split back as the layout says
  (locally, no communication).
- halo ({name: h}): the function is local along `name` with radius h. Each
  call sees its block of that dimension with h rows of the neighbouring
  blocks on either side (zeros past the ends of the dimension, as if it
  were zero-padded by h), moved by receives from the neighbours only, and
  returns that dimension at the same window length; the h rows at either
  side are cut from each result. Unsplit, the dimension is zero-padded by h
  around the call and cut the same way, so the answer is the same under
  every layout.
"""

import math

import tensorflow as tf

from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules

POLICIES = ("refuse", "gather")


def _take(x, axis, begin, size):
  starts = [0] * len(slice_utils.static_shape(x))
  sizes = [-1] * len(starts)
  starts[axis] = begin
  sizes[axis] = size
  return slice_utils.tf_slice(x, starts, sizes)


def halo_pieces(block, halo):
  """The pieces of a window of `halo` rows around a block of `block` rows:
  (processors away, rows, from the block's end) for the left side, then
  the right side, each side in window order. Left pieces are the last rows
  of blocks p - j, right pieces the first rows of blocks p + j."""
  left, right = [], []
  j = 1
  rest = halo
  while rest > 0:
    rows = min(block, rest)
    left.insert(0, (j, rows, True))
    right.append((-j, rows, False))
    rest -= rows
    j += 1
  return left, right


def with_halo(impl, x, shape, halos):
  """Laid-out `x` (of mtf `shape`) with each dimension named in `halos`
  widened by halos[name] rows on either side: neighbours' rows where it is
  split, zeros past the ends."""
  for axis, dim in enumerate(shape.dims):
    h = halos.get(dim.name, 0)
    if not h:
      continue
    mesh_axis = impl.tensor_dimension_to_mesh_axis(dim)
    if mesh_axis is None:
      def pad(s, axis=axis, h=h):
        pads = [[0, 0]] * len(slice_utils.static_shape(s))
        pads[axis] = [h, h]
        return slice_utils.tf_pad(s, pads)
      x = impl.slicewise(pad, x)
      continue
    block = impl.slice_shape(shape)[axis]
    left, right = halo_pieces(block, h)
    parts = []
    for j, rows, from_end in left:
      piece = impl.slicewise(
          lambda s, a=axis, b=block - rows, r=rows: _take(s, a, b, r), x)
      parts.append(impl.shift_by_n_processors(piece, mesh_axis, j, False))
    parts.append(x)
    for j, rows, from_end in right:
      piece = impl.slicewise(
          lambda s, a=axis, r=rows: _take(s, a, 0, r), x)
      parts.append(impl.shift_by_n_processors(piece, mesh_axis, j, False))
    x = impl.slicewise(lambda *ps, a=axis: tf.concat(ps, axis=a), *parts)
  return x


def cut_halo(impl, y, shape, halos, what):
  """Laid-out `y` (a result of mtf `shape` computed on windows) with
  halos[name] rows cut from either side of each dimension named there."""
  for axis, dim in enumerate(shape.dims):
    h = halos.get(dim.name, 0)
    if not h:
      continue
    block = impl.slice_shape(shape)[axis]

    def cut(s, axis=axis, h=h, block=block, name=dim.name):
      got = slice_utils.static_shape(s)[axis]
      if got != block + 2 * h:
        raise ValueError(
            f"{what}: with a halo of {h} along {name!r} the function must "
            f"return that dimension at its window length {block + 2 * h} "
            f"(block {block} + 2 * {h}), got {got}.")
      return _take(s, axis, h, block)
    y = impl.slicewise(cut, y)
  return y


def lower_windows(impl, fn, xs, in_shapes, out_shapes, gather, in_halos,
                  out_halos, what):
  """Lowers `fn` on laid-out `xs`: dimensions named in `gather` gathered
  whole, halos added (in_halos, one dict per input), `fn` applied, halos
  cut (out_halos, one per output) and gathered dimensions split back.
  Returns the laid-out results, a list."""
  xs = [impl.gather_dimensions(x, s, gather) if gather else x
        for x, s in zip(xs, in_shapes)]
  xs = [with_halo(impl, x, s, h) if h else x
        for x, s, h in zip(xs, in_shapes, in_halos)]
  values = impl.slicewise(fn, *xs)
  if not isinstance(values, (tuple, list)):
    values = (values,)
  out = []
  for v, s, h in zip(values, out_shapes, out_halos):
    if h:
      v = cut_halo(impl, v, s, h, what)
    if gather:
      v = impl.split_dimensions(v, s, gather)
    out.append(v)
  return out


def collectives(layout, in_dims, in_itemsize, gather, in_halos):
  """The Collectives `lower_windows` emits under `layout` (a CostLayout)."""
  result = []
  for dims, itemsize, halos in zip(in_dims, in_itemsize, in_halos):
    sizes = layout.slice_sizes(dims)
    for i, (name, size) in enumerate(dims):
      m = layout.mesh_dim(name)
      if name in gather and m is not None:
        result.append(cost_rules.collective(
            layout, "allconcat", (m,),
            math.prod(sizes) * itemsize))
        sizes[i] = size
    for i, (name, size) in enumerate(dims):
      h = halos.get(name, 0)
      m = layout.mesh_dim(name)
      if not h:
        continue
      if m is None:
        sizes[i] += 2 * h
        continue
      block = sizes[i]
      per_row = math.prod(sizes) * itemsize // block
      left, right = halo_pieces(block, h)
      n = layout.sizes[m]
      for j, rows, _ in left + right:
        receivers = sum(1 for p in range(n) if 0 <= p - j < n)
        result.append(cost_rules.collective(
            layout, "receive", (m,), per_row * rows, receivers))
      sizes[i] = block + 2 * h
  return result
