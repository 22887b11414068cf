"""How a mesh lays tensors out: slice shapes, where slices begin, padding.

`LayoutGeometry` is the part of MeshImpl that answers from the mesh shape
and the layout rules alone (plus `slicewise` and the collectives, for the
members that move laid-out values between layouts). An uneven split pads
each slice to ceil(size / pieces); see `backend.padding`.
"""

import numpy as np
import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import processors
from mesh_tensorflow.backend import slice_utils


class LayoutGeometry:
  """Slice and padding geometry of a mesh implementation (a MeshImpl base).

  Reads `self._shape` and `self._layout_rules`.
  """

  def tensor_dimension_to_mesh_axis(self, tensor_dimension):
    """The mesh axis (int) `tensor_dimension` is split over, or None."""
    return self._layout_rules.tensor_dimension_to_mesh_axis(
        tensor_dimension, self._shape)

  def tensor_layout(self, arg):
    """The TensorLayout of an mtf Tensor or a Shape on this mesh."""
    tensor_shape = arg.shape if hasattr(arg, "operation") else arg
    return self._layout_rules.tensor_layout(tensor_shape, self._shape)

  def mesh_axis_to_cumprod(self, tensor_shape):
    """For each mesh axis, the exclusive cumprod of the tensor axis split
    over it (None if none is): where that split sits in row-major order."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    cumprod = tensor_shape.cumprod
    return [None if tensor_axis is None else cumprod[tensor_axis]
            for tensor_axis in self.tensor_layout(
                tensor_shape).mesh_axis_to_tensor_axis(self.ndims)]

  def slice_shape(self, tensor_shape):
    """The static shape of one slice of a tensor of `tensor_shape`.

    A dimension split unevenly (allowed by `LayoutRules.allow_uneven`) has
    slices of ceil(size / pieces); see `padded_axes`.

    Raises:
      IndivisibleError: a split dimension does not divide by its mesh
        dimension, and the layout rules do not allow uneven splits.
    """
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    allow_uneven = self._layout_rules.allow_uneven
    result = []
    for dim, mesh_axis in zip(tensor_shape, self.tensor_layout(tensor_shape)):
      if mesh_axis is None:
        result.append(dim.size)
        continue
      mesh_dim = self._shape[mesh_axis]
      size = padding.slice_size(dim.size, mesh_dim.size, allow_uneven)
      if size is None:
        raise errors.IndivisibleError(
            f"Tensor dimension {dim.name!r} (size {dim.size}) of "
            f"{tensor_shape} is split over mesh dimension {mesh_dim.name!r} "
            f"(size {mesh_dim.size}) by the rule {dim.name}:{mesh_dim.name}, "
            f"but {dim.size} is not divisible by {mesh_dim.size}. Use a size "
            f"that is a multiple of {mesh_dim.size}, a layout that leaves "
            f"{dim.name!r} replicated, or allow uneven splits "
            "(mtf.LayoutRules(rules, allow_uneven=True); in the Transformer "
            "binary the gin binding `utils.run.allow_uneven_splits = True`), "
            f"which pads {dim.name!r} to "
            f"{-(-dim.size // mesh_dim.size) * mesh_dim.size}.")
      result.append(size)
    return result

  def padded_axes(self, tensor_shape):
    """The PaddedAxis of each unevenly split axis of `tensor_shape`."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    if not self._layout_rules.allow_uneven:
      return []
    result = []
    for tensor_axis, (dim, mesh_axis) in enumerate(
        zip(tensor_shape, self.tensor_layout(tensor_shape))):
      if mesh_axis is None:
        continue
      pieces = self._shape[mesh_axis].size
      if dim.size % pieces:
        result.append(padding.PaddedAxis(
            tensor_axis, mesh_axis, dim.size, -(-dim.size // pieces), pieces))
    return result

  def fill_padding(self, x, tensor_shape, fill=0, names=None):
    """Laid-out `x` of `tensor_shape` with its padding set to `fill` (only
    along the dimensions named in `names`, if given).

    Padding is kept zero by the lowering (see `backend.padding`); operations
    that need another neutral value there (a max, -inf) call this.
    """
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    axes = [a for a in self.padded_axes(tensor_shape)
            if names is None or tensor_shape[a.tensor_axis].name in names]
    x = x.to_laid_out_tensor()
    if not axes:
      return x
    def fn(s, pnum):
      return padding.fill_slice(s, axes, self._begins(tensor_shape, pnum),
                                fill)
    return self.slicewise(fn, x, self.laid_out_pnum())

  def _begins(self, tensor_shape, pnum):
    """slice_begin for an int pnum, or as int tensors for a tensor one."""
    if isinstance(pnum, (int, np.integer)):
      return self.slice_begin(tensor_shape, int(pnum))
    slice_shape = self.slice_shape(tensor_shape)
    begins = []
    for tensor_axis, mesh_axis in enumerate(self.tensor_layout(tensor_shape)):
      if mesh_axis is None:
        begins.append(0)
        continue
      stride = shape_lib.list_product(
          self._shape.to_integer_list[mesh_axis + 1:])
      pcoord = (pnum // stride) % self._shape[mesh_axis].size
      begins.append(pcoord * slice_shape[tensor_axis])
    return begins

  def gather_dimensions(self, x, tensor_shape, names):
    """Laid-out `x` with the split dimensions named in `names` gathered
    whole (and their padding cut off): its layout as if `names` were
    replicated."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    x = x.to_laid_out_tensor()
    padded = {a.tensor_axis: a for a in self.padded_axes(tensor_shape)}
    for tensor_axis, (dim, mesh_axis) in enumerate(
        zip(tensor_shape, self.tensor_layout(tensor_shape))):
      if mesh_axis is None or dim.name not in names:
        continue
      x = self.allconcat(x, mesh_axis, tensor_axis)
      if tensor_axis in padded:
        x = self.slicewise(
            lambda s, a=tensor_axis, n=dim.size: padding.strip_axis(s, a, n),
            x)
    return x

  def split_dimensions(self, x, tensor_shape, names):
    """The inverse of gather_dimensions: laid-out `x`, whose dimensions
    named in `names` are whole, split (and padded) as the layout says. No
    communication."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    x = x.to_laid_out_tensor()
    slice_shape = self.slice_shape(tensor_shape)
    for tensor_axis, (dim, mesh_axis) in enumerate(
        zip(tensor_shape, self.tensor_layout(tensor_shape))):
      if mesh_axis is None or dim.name not in names:
        continue
      full = slice_shape[tensor_axis] * self._shape[mesh_axis].size
      if full != dim.size:
        x = self.slicewise(
            lambda s, a=tensor_axis, n=dim.size, m=full: padding.pad_axis(
                s, a, n, m), x)
      x = self.allsplit(x, mesh_axis, tensor_axis)
    return x

  def slice_begin(self, tensor_shape, pnum):
    """Where processor `pnum`'s slice starts in the full tensor."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    coordinates = processors.pnum_to_processor_coordinates(self._shape, pnum)
    slice_shape = self.slice_shape(tensor_shape)
    return [0 if mesh_axis is None else
            coordinates[mesh_axis] * slice_shape[tensor_axis]
            for tensor_axis, mesh_axis in enumerate(
                self.tensor_layout(tensor_shape))]

  def replica_sources(self, tensor_shape):
    """Per processor, the processor whose copy of its slice of a tensor of
    `tensor_shape` it uses. Each its own here; PlacementMeshImpl on one
    host's CPUs lets replicas share the first copy."""
    del tensor_shape
    return list(range(self.size))

  def slice_size(self, tensor_shape):
    return shape_lib.list_product(self.slice_shape(tensor_shape))

  def laid_out_size(self, tensor_shape):
    """Elements held on all processors together, counting replicas."""
    return self.slice_size(tensor_shape) * self.size

  def processor_groups(self, mesh_axes):
    return processors.processor_groups(self._shape, mesh_axes)

  def laid_out_slice_num(self, tensor_shape):
    """A laid-out integer that is equal exactly for identical slices."""
    layout = self.tensor_layout(tensor_shape)
    split_axes = [a for a in layout if a is not None]
    def fn(pnum):
      num = 0
      for mesh_axis in range(self.ndims):
        if mesh_axis in split_axes:
          stride = shape_lib.list_product(
              self._shape.to_integer_list[mesh_axis + 1:])
          num = num * self._shape[mesh_axis].size + (
              pnum // stride) % self._shape[mesh_axis].size
      return num
    return self.slicewise(fn, self.laid_out_pnum())

  def broadcast_impl(self, old_slices, old_shape, new_shape):
    """Broadcasts laid-out `old_slices` of `old_shape` to `new_shape`."""
    old_shape = shape_lib.convert_to_shape(old_shape)
    new_shape = shape_lib.convert_to_shape(new_shape)
    new_slice_shape = self.slice_shape(new_shape)
    if old_shape == new_shape:
      return old_slices

    def fn(x):
      x = slice_utils.expand_to(x, old_shape, new_shape)
      if slice_utils.static_shape(x) == new_slice_shape:
        return x
      return slice_utils.broadcast_to(x, new_slice_shape)

    return self.slicewise(fn, old_slices)

  def make_slices(self, tf_tensor, tensor_shape):
    """The slice of a full tensor for every processor (in pnum order);
    padded with zeros where the split is uneven."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    slice_shape = self.slice_shape(tensor_shape)
    axes = self.padded_axes(tensor_shape)
    tf_tensor = padding.pad_full(tf_tensor, axes)
    # A dimension of size 1 split unevenly has slices of its full size but
    # is padded: only an unpadded tensor of the slice shape is whole.
    whole = not axes and slice_shape == tensor_shape.to_integer_list
    by_begin = {}
    result = []
    for pnum in range(self.size):
      begin = tuple(self.slice_begin(tensor_shape, pnum))
      if begin not in by_begin:
        by_begin[begin] = (
            tf_tensor if whole else
            slice_utils.tf_slice(tf_tensor, list(begin), slice_shape))
      result.append(by_begin[begin])
    return result

  def combine_slices(self, slices, tensor_shape, device=None):
    """Assembles the full tensor from per-processor slices (pnum order).

    Replicated copies are not read: each distinct block is taken from the
    first processor that holds it.
    """
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    layout = self.tensor_layout(tensor_shape)
    blocks = {}
    for pnum, s in enumerate(slices):
      blocks.setdefault(tuple(self.slice_begin(tensor_shape, pnum)), s)
    with tf.device(device):
      for tensor_axis in reversed(range(tensor_shape.ndims)):
        if layout[tensor_axis] is None:
          continue
        merged = {}
        for begin in sorted(blocks):
          key = begin[:tensor_axis] + (0,) + begin[tensor_axis + 1:]
          merged.setdefault(key, []).append(blocks[begin])
        blocks = {key: tf.concat(parts, axis=tensor_axis)
                  for key, parts in merged.items()}
      (result,) = blocks.values()
      return padding.strip_full(result, self.padded_axes(tensor_shape))
