"""Re-partitioning one split dimension: out[j] = in[j + shift].

A slice (shift = begin) or a pad (shift = -before) of a dimension split k
ways over a mesh axis changes its size from n to n_out, and the layout rules
lay the result out in blocks of ceil(n_out / k) (padded when uneven). Output
block p needs the input rows [p * B_out + shift, (p + 1) * B_out + shift)
that exist; they lie on a few input blocks q, at offsets o = p - q that take
few distinct values. For each non-zero offset every processor cuts the rows
it owes processor q + o into a piece of one fixed width (zeros where it owes
fewer: a SIMD program needs equal shapes everywhere), the pieces move with
one `receive` (a collective permute between the processors that exchange
rows; processors owed nothing at that offset take no part), and each processor
assembles its block from its own rows and the pieces it received with one
gather, zeros in the padding.

Example: the first 100 rows of 128 split 8 ways (blocks of 16) are laid out
in blocks of 13 (the last padded by 4): output block p holds rows
[13p, 13p + 13), which lie on input blocks p - 1 and p (p - 2 and p - 1 for
the last two), so two receives (offsets 1 and 2) move 101 rows and no
processor gathers the dimension. When the permutes would send more bytes,
or take more calls than a ring allconcat has steps (`Plan.gathers`), the
lowering gathers the dimension (allconcat), slices locally and keeps its
own block instead.

`plan_windows` plans windows that may overlap (a convolution's input rows
with their halo, ops/spatial_windows.py) the same way, and `scatter_add`
is the transpose of `regrid` (their gradients): the rows go back where
they came from, and overlapping rows add.
"""

import dataclasses
from typing import Dict, Tuple

import numpy as np
import tensorflow as tf

from mesh_tensorflow.backend import slice_utils


@dataclasses.dataclass(frozen=True)
class Plan:
  """How the blocks of out[j] = in[j + shift] are assembled.

  Attributes:
    block: input rows per processor (ceil(n / k)).
    out_block: output rows per processor (ceil(n_out / k), or the width
      of a window: `plan_windows`).
    widths: {offset o != 0: rows of the piece each processor q sends to
      processor q + o}.
    pieces: {offset: {output block p: (first row in input block p - o,
      first row in output block p, rows)}}, offset 0 included.
    receivers: {offset o != 0: processors that receive a piece (those
      owed rows by processor p - o; the others receive nothing).
  """
  block: int
  out_block: int
  widths: Dict[int, int]
  pieces: Dict[int, Dict[int, Tuple[int, int, int]]]
  receivers: Dict[int, int]

  def permute_rows(self):
    """Input rows the permutes send, summed over all processors of one
    group (what their wire bytes count)."""
    return sum(self.receivers[o] * w for o, w in self.widths.items())

  def gather_rows(self, k):
    """Input rows an allconcat of the dimension sends in one group."""
    return k * (k - 1) * self.block

  def gathers(self, k):
    """Whether gathering the dimension is cheaper than the permutes: they
    send more rows, or take more calls than the k - 1 steps of a ring
    allconcat."""
    return (self.permute_rows() > self.gather_rows(k) or
            len(self.widths) > k - 1)


def plan(size, out_size, k, shift):
  """The Plan of out[j] = in[j + shift] (zero where j + shift is outside
  [0, size)), for a dimension of `size` and one of `out_size`, both split
  `k` ways."""
  out_block = -(-out_size // k)
  return plan_windows(
      size, -(-size // k),
      {p: (p * out_block + shift, min(out_block, out_size - p * out_block))
       for p in range(k)}, out_block)


def plan_windows(size, block, windows, out_block):
  """The Plan that gives processor p the input rows [start, start + rows)
  for windows {p: (start, rows)} (zeros outside [0, size)), as the first
  rows of a block of `out_block`, from a dimension of `size` split in
  blocks of `block`. Windows may overlap (a convolution's halo)."""
  pieces = {}
  for p, (start, rows) in windows.items():
    first, last = max(start, 0), min(start + rows, size)
    if first >= last:
      continue
    for q in range(first // block, (last - 1) // block + 1):
      a, b = max(first, q * block), min(last, (q + 1) * block)
      pieces.setdefault(p - q, {})[p] = (a - q * block, a - start, b - a)
  widths = {o: max(n for _, _, n in by_p.values())
            for o, by_p in pieces.items() if o}
  receivers = {o: len(pieces[o]) for o in widths}
  return Plan(block, out_block, widths, pieces, receivers)


def _send_table(the_plan, k, offset):
  """[k, width]: the rows processor q sends for `offset` (block = zero
  row)."""
  width = the_plan.widths[offset]
  table = np.full([k, width], the_plan.block, np.int32)
  for p, (src, _, n) in the_plan.pieces[offset].items():
    table[p - offset, :n] = np.arange(src, src + n)
  return table


def _receive_table(the_plan, k, offsets):
  """[k, out_block]: for each output row, its row in the concatenation of
  the input block, the pieces of `offsets` and one zero row."""
  base = {0: 0}
  end = the_plan.block
  for o in offsets:
    base[o] = end
    end += the_plan.widths[o]
  table = np.full([k, the_plan.out_block], end, np.int32)
  for o, by_p in the_plan.pieces.items():
    for p, (src, dst, n) in by_p.items():
      first = src if o == 0 else base[o]
      table[p, dst:dst + n] = np.arange(first, first + n)
  return table


def row(table, pcoord):
  """Row `pcoord` (an int, or an int tensor in a SIMD program) of table."""
  if isinstance(pcoord, (int, np.integer)):
    return tf.constant(table[int(pcoord)])
  return tf.gather(tf.constant(table), pcoord)


def with_zero_row(s, axis):
  """Slice `s` with one zero row appended along `axis`."""
  shape = slice_utils.static_shape(s)
  shape[axis] = 1
  return tf.concat([s, tf.zeros(shape, s.dtype)], axis=axis)


def regrid(impl, x, axis, mesh_axis, the_plan):
  """Laid-out `x`, split over `mesh_axis` along tensor `axis`, re-split as
  `the_plan` says, by permutes of the rows that move."""
  k = impl.shape[mesh_axis].size
  pcoord = impl.laid_out_pcoord(mesh_axis)
  offsets = sorted(the_plan.widths)
  parts = []
  for o in offsets:
    table = _send_table(the_plan, k, o)
    piece = impl.slicewise(
        lambda s, c, t=table: tf.gather(with_zero_row(s, axis), row(t, c),
                                        axis=axis), x, pcoord)
    sources = [p - o if p in the_plan.pieces[o] else None for p in range(k)]
    parts.append(impl.receive(piece, mesh_axis, sources))
  table = _receive_table(the_plan, k, offsets)

  def assemble(c, *slices):
    return tf.gather(with_zero_row(tf.concat(slices, axis=axis), axis),
                     row(table, c), axis=axis)

  return impl.slicewise(assemble, pcoord, x, *parts)


def scatter_add(impl, g, axis, mesh_axis, the_plan):
  """The transpose of `regrid`: laid-out `g`, whose blocks along tensor
  `axis` are the plan's output blocks (out_block rows), summed back into
  the input blocks (block rows): each row goes back to where `regrid`
  took it from, overlapping windows add, rows it did not take from
  anywhere are dropped. Moves the same rows as `regrid`, the other way."""
  k = impl.shape[mesh_axis].size
  pcoord = impl.laid_out_pcoord(mesh_axis)
  offsets = sorted(the_plan.widths)
  parts, tables = [], []
  for o in offsets:
    width = the_plan.widths[o]
    send = np.full([k, width], the_plan.out_block, np.int32)
    back = np.full([k, the_plan.block], width, np.int32)
    for p, (src, dst, n) in the_plan.pieces[o].items():
      send[p, :n] = np.arange(dst, dst + n)
      back[p - o, src:src + n] = np.arange(n)
    piece = impl.slicewise(
        lambda s, c, t=send: tf.gather(with_zero_row(s, axis), row(t, c),
                                       axis=axis), g, pcoord)
    sources = [q + o if q + o in the_plan.pieces[o] else None
               for q in range(k)]
    parts.append(impl.receive(piece, mesh_axis, sources))
    tables.append(back)
  own = np.full([k, the_plan.block], the_plan.out_block, np.int32)
  for p, (src, dst, n) in the_plan.pieces.get(0, {}).items():
    own[p, src:src + n] = np.arange(dst, dst + n)

  def assemble(c, s, *received):
    total = tf.gather(with_zero_row(s, axis), row(own, c), axis=axis)
    for r, table in zip(received, tables):
      total += tf.gather(with_zero_row(r, axis), row(table, c), axis=axis)
    return total

  return impl.slicewise(assemble, pcoord, g, *parts)
