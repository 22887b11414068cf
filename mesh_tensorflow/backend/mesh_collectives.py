"""The collectives of a mesh implementation, and how they are counted.

Backends provide four collectives (`allreduce`, `allconcat`, `alltoall`,
`receive`); `MeshCollectives` derives the others from them (`allsplit`,
`reduce_scatter`, `shift_by_n_processors`, ...) and counts every call's
traffic (`collective_wire_bytes`) for the Lowering's counters.
"""

import tensorflow as tf

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import laid_out
from mesh_tensorflow.backend import slice_utils


COLLECTIVE_KINDS = ("allreduce", "reduce_scatter", "allconcat", "alltoall",
                    "receive")


def collective_wire_bytes(kind, group_size, num_groups, slice_bytes,
                          receivers=0):
  """Wire bytes of one collective call, summed over all processors.

  What a bandwidth-optimal algorithm sends for `num_groups` groups of
  `group_size` members, each member holding a `slice_bytes` input: per
  group, allreduce 2(n-1)/n s per member, reduce_scatter and alltoall
  (n-1)/n s, allconcat (n-1) s, and receive s for each of the group's
  `receivers` members that gets another member's slice. Every figure is an
  exact integer (n members times (n-1)/n s is (n-1) s), and a
  reduce_scatter plus the allconcat of its result has the wire bytes of
  the allreduce it replaces. The lowering's counters
  (`comm/<kind>/<mesh dims>/wire_bytes`) and the layout search's cost
  model both use this formula.

  Args:
    kind: one of COLLECTIVE_KINDS.
    group_size: n, the members of each group.
    num_groups: how many groups take part (mesh size / n).
    slice_bytes: s, bytes of one member's input slice.
    receivers: receive only: members per group that get a slice.

  Returns:
    an int.
  """
  n, s = group_size, slice_bytes
  per_group = {
      "allreduce": 2 * (n - 1) * s,
      "reduce_scatter": (n - 1) * s,
      "alltoall": (n - 1) * s,
      "allconcat": n * (n - 1) * s,
      "receive": receivers * s,
  }
  if kind not in per_group:
    raise ValueError(f"Unknown collective {kind!r}; expected one of "
                     f"{list(COLLECTIVE_KINDS)}.")
  return num_groups * per_group[kind]


class MeshCollectives:
  """Collectives and their counters (a MeshImpl base).

  Reads `self._shape`, `self._context` (its counter_fn), `self.slicewise` and
  `self.laid_out_pnum`.
  """

  def _count(self, key, value):
    counter_fn = self._context.counter_fn
    if counter_fn is not None:
      counter_fn(key, value)

  def _count_collective(self, kind, mesh_axes, x, source_pcoord=None):
    """Counts one collective call, the bytes its inputs hold on all
    processors together and its wire bytes (see `collective_wire_bytes`;
    the same whichever implementation lowers it). `source_pcoord` is
    receive's argument."""
    axes = "_".join(self._shape[a].name for a in mesh_axes) or "none"
    first = x.tensor_list[0]
    slice_bytes = first.dtype.size * first.shape.num_elements()
    n = shape_lib.list_product(self._shape[a].size for a in mesh_axes)
    receivers = sum(1 for i, source in enumerate(source_pcoord or ())
                    if source is not None and source != i)
    wire_bytes = collective_wire_bytes(kind, n, self.size // n, slice_bytes,
                                       receivers)
    self._count(f"comm/{kind}/{axes}/calls", 1)
    self._count(f"comm/{kind}/{axes}/bytes", slice_bytes * self.size)
    self._count(f"comm/{kind}/{axes}/wire_bytes", wire_bytes)

  def allreduce(self, x, mesh_axes, reduction_fn_string):
    """Sums ("SUM") or takes "MAX"/"MIN" of `x` within groups along
    `mesh_axes`; every member of a group gets the result."""
    raise self._not_implemented("allreduce")

  def allconcat(self, x, mesh_axis, concat_axis):
    """Concatenates the slices of each group along `mesh_axis` on tensor
    axis `concat_axis`, in coordinate order; every member gets the result."""
    raise self._not_implemented("allconcat")

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    """Within groups along `mesh_axis`: splits each slice into group-size
    pieces on `split_axis` and gives piece k to member k, which
    concatenates what it receives on `concat_axis` in coordinate order."""
    raise self._not_implemented("alltoall")

  def receive(self, x, mesh_axis, source_pcoord):
    """Member i of each group along `mesh_axis` gets the slice of member
    `source_pcoord[i]`, or zeros where that is None."""
    raise self._not_implemented("receive")

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    """Keeps, on each processor, its own piece along `split_axis`.

    The inverse of allconcat; no communication. `which` (a laid-out integer)
    defaults to the processor's coordinate along `mesh_axis`.
    """
    if which is None:
      which = self.laid_out_pcoord(mesh_axis)
    num_splits = self._shape[mesh_axis].size

    def my_piece(x, which):
      size = slice_utils.static_shape(x)
      piece = size[split_axis] // num_splits
      begin = [0] * len(size)
      size[split_axis] = piece
      if isinstance(which, int):
        begin[split_axis] = which * piece
      else:
        begin = tf.one_hot(split_axis, len(size), dtype=tf.int32) * (
            tf.cast(which, tf.int32) * piece)
      return slice_utils.tf_slice(x, begin, size)

    return self.slicewise(my_piece, x, which)

  def reduce_scatter(self, x, mesh_axis, split_axis,
                     reduction_fn_string="SUM"):
    """Within groups along `mesh_axis`: reduces ("SUM", "MAX", "MIN") the
    members' slices elementwise and gives member k (in coordinate order)
    the k-th of group-size equal pieces of the result along tensor axis
    `split_axis`: allreduce followed by allsplit, with half the wire
    bytes. A size-1 mesh axis returns `x`.

    This default is exactly that allreduce and allsplit (so a backend
    with only the other collectives still lowers everything); backends
    override it with a real reduce-scatter.
    """
    if self._shape[mesh_axis].size == 1:
      return x.to_laid_out_tensor()
    return self.allsplit(self.allreduce(x, [mesh_axis], reduction_fn_string),
                         mesh_axis, split_axis)

  def shift_by_n_processors(self, x, mesh_axis, offset, wrap):
    """Member i of each group along `mesh_axis` gets member i-offset's
    slice (wrapping around the ring if `wrap`, else zeros)."""
    n = self._shape[mesh_axis].size
    source_pcoord = []
    for i in range(n):
      c = i - offset
      if not 0 <= c < n:
        c = c % n if wrap else None
      source_pcoord.append(c)
    return self.receive(x, mesh_axis, source_pcoord)

  def laid_out_pcoord(self, mesh_axis):
    """A laid-out integer: each processor's coordinate along `mesh_axis`."""
    stride = shape_lib.list_product(
        self._shape.to_integer_list[mesh_axis + 1:])
    size = self._shape[mesh_axis].size
    return self.slicewise(lambda pnum: (pnum // stride) % size,
                          self.laid_out_pnum())

  def slicewise_delay_allreduce(self, fn, *inputs):
    """slicewise for a function that is linear in its laid-out inputs.

    If every input is a lazy sum over the same mesh axes, applies `fn` to the
    partial sums and keeps the result lazy.
    """
    if laid_out.compatible_lazy_allreduce_sums(inputs):
      return laid_out.LazyAllreduceSum(
          self, self.slicewise(fn, *[x.laid_out_input for x in inputs]),
          inputs[0].mesh_axes)
    return self.slicewise(
        fn, *laid_out.convert_args_to_laid_out_tensors(inputs))
