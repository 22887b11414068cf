"""Reshape and renaming (broadcast, the adjoint of a sum, is in `reduce`).

A reshape keeps the elements in row-major order and changes the dimensions.
Because layouts are chosen by dimension name, a reshape (including a rename)
can change how the tensor is laid out, and then it communicates:

- a mesh dimension that splits the old shape but not the new one: allconcat;
- one that splits the new shape but not the old one: allsplit (local);
- one that splits both at different positions: alltoall;
- one the input is a pending sum over (a partial sum, e.g. from an einsum
  that summed a split batch dimension) and that splits the new shape:
  reduce_scatter, which sums and splits at once with half the bytes of
  allreduce then allsplit. Other pending sums stay pending when the rest
  of the reshape is local.

Example on mesh "all:2": reshaping x[a=4, b=6] with rules "a:all" to
y[c=24] with rules "c:all" is local (both split the outermost elements in
halves); renaming "a" to "d" with no rule for "d" allconcats.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib


class ReshapeOperation(graph_lib.Operation):
  """Reshapes `x` to `new_shape` (same number of elements)."""

  def __init__(self, x, new_shape, name=None):
    super().__init__([x], name=name or "reshape")
    new_shape = shape_lib.convert_to_shape(new_shape)
    if new_shape.size != x.shape.size:
      raise errors.ShapeError(
          f"Cannot reshape {x.name} {x.shape} ({x.shape.size} elements) to "
          f"{new_shape} ({new_shape.size} elements).")
    self._outputs = [graph_lib.Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [reshape(grad_ys[0], self._inputs[0].shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    old_shape = self._inputs[0].shape
    new_shape = self._outputs[0].shape
    x = lowering.tensors[self._inputs[0]]
    old_cumprod = impl.mesh_axis_to_cumprod(old_shape)
    new_cumprod = impl.mesh_axis_to_cumprod(new_shape)
    changed = [a for a in range(impl.ndims) if old_cumprod[a] != new_cumprod[a]]
    new_slice_shape = impl.slice_shape(new_shape)
    if not changed:
      y = impl.slicewise_delay_allreduce(
          lambda s: tf.reshape(s, new_slice_shape), x)
      lowering.set_tensor_lowering(self._outputs[0], y)
      return

    lazy = x if isinstance(x, mesh_impl_lib.LazyAllreduceSum) else None
    # `current` tracks, per old tensor axis, the mesh axis splitting it.
    current = list(impl.tensor_layout(old_shape))
    mesh_sizes = impl.shape.to_integer_list

    def splittable_old_axis(mesh_axis):
      """The unsplit old axis that starts where the new split starts.

      Size-1 axes start where the next axis does; they cannot be split, so
      the axis after them is the candidate.
      """
      start = new_cumprod[mesh_axis]
      axis = next((a for a, c in enumerate(old_shape.cumprod)
                   if c == start and old_shape[a].size > 1), None)
      if (axis is not None and current[axis] is None and
          old_shape[axis].size % mesh_sizes[mesh_axis] == 0):
        return axis
      return None

    # As in the original: split first (local, and it shrinks what the
    # collectives below carry), then all-to-all, then concatenate. A move
    # whose target axis is still split waits until the concatenations have
    # freed it; failing that it concatenates and splits after the reshape.
    splits = [a for a in changed
              if old_cumprod[a] is None and new_cumprod[a] is not None]
    alltoalls = [a for a in changed
                 if old_cumprod[a] is not None and new_cumprod[a] is not None]
    concats = [a for a in changed
               if old_cumprod[a] is not None and new_cumprod[a] is None]
    split_after = []

    if lazy is not None:
      x, splits, pending = self._reduce_scatter_pending_sums(
          impl, lazy, splits, splittable_old_axis, current)
      if pending and not alltoalls and not concats and all(
          a not in pending and splittable_old_axis(a) is not None
          for a in splits):
        # The rest is local and linear: the sum stays pending.
        for mesh_axis in splits:
          split_axis = splittable_old_axis(mesh_axis)
          x = impl.allsplit(x, mesh_axis, split_axis)
          current[split_axis] = mesh_axis
        x = impl.slicewise(lambda s: tf.reshape(s, new_slice_shape), x)
        lowering.set_tensor_lowering(
            self._outputs[0], mesh_impl_lib.LazyAllreduceSum(
                impl, x, pending, add_counter_fn=lazy.add_counter_fn))
        return
      if pending:
        x = mesh_impl_lib.LazyAllreduceSum(
            impl, x, pending, add_counter_fn=lazy.add_counter_fn)
    x = x.to_laid_out_tensor()

    def try_split(mesh_axis):
      split_axis = splittable_old_axis(mesh_axis)
      if split_axis is None:
        return False
      nonlocal x
      x = impl.allsplit(x, mesh_axis, split_axis)
      current[split_axis] = mesh_axis
      return True

    def try_alltoall(mesh_axis):
      concat_axis = current.index(mesh_axis)
      current[concat_axis] = None
      split_axis = splittable_old_axis(mesh_axis)
      if split_axis is None:
        current[concat_axis] = mesh_axis
        return False
      nonlocal x
      x = impl.alltoall(x, mesh_axis, split_axis, concat_axis)
      current[split_axis] = mesh_axis
      return True

    splits = [a for a in splits if not try_split(a)]
    alltoalls = [a for a in alltoalls if not try_alltoall(a)]
    for mesh_axis in concats:
      concat_axis = current.index(mesh_axis)
      x = impl.allconcat(x, mesh_axis, concat_axis)
      current[concat_axis] = None
    for mesh_axis in alltoalls:
      if not try_alltoall(mesh_axis):
        concat_axis = current.index(mesh_axis)
        x = impl.allconcat(x, mesh_axis, concat_axis)
        current[concat_axis] = None
        split_after.append(mesh_axis)
    split_after += [a for a in splits if not try_split(a)]

    new_layout = impl.tensor_layout(new_shape)
    intermediate = [
        d.size if mesh_axis is None or mesh_axis in split_after else s
        for d, s, mesh_axis in zip(new_shape, new_slice_shape, new_layout)]
    x = impl.slicewise(lambda s: tf.reshape(s, intermediate), x)
    for mesh_axis in split_after:
      x = impl.allsplit(x, mesh_axis, list(new_layout).index(mesh_axis))
    lowering.set_tensor_lowering(self._outputs[0], x)

  @staticmethod
  def _reduce_scatter_pending_sums(impl, lazy, splits, splittable_old_axis,
                                   current):
    """Reduce-scatters the pending sums of `lazy` that the reshape splits.

    A mesh axis the sum is pending over that newly splits an unsplit old
    tensor axis is reduced and split at once (reduce_scatter), instead of
    allreduced and then split: half the bytes. Updates `current`.

    Returns:
      (the partial sums after the reduce-scatters, or `lazy` itself if there
      were none; the splits left to do; the mesh axes still pending).
    """
    scattered = []
    x = lazy.laid_out_input
    for mesh_axis in splits:
      if mesh_axis not in lazy.mesh_axes:
        continue
      split_axis = splittable_old_axis(mesh_axis)
      if split_axis is None:
        continue
      x = impl.reduce_scatter(x, mesh_axis, split_axis, "SUM")
      current[split_axis] = mesh_axis
      scattered.append(mesh_axis)
    if not scattered:
      return lazy, splits, []
    return (x, [a for a in splits if a not in scattered],
            [a for a in lazy.mesh_axes if a not in scattered])


def reshape(x, new_shape, name=None):
  """Reshapes `x` (row-major order kept) to `new_shape`."""
  new_shape = shape_lib.convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return ReshapeOperation(x, new_shape, name=name).outputs[0]


def rename_dimension(x, old_name, new_name, name=None):
  """Renames one dimension of a Tensor (or Shape). May re-layout."""
  if isinstance(x, shape_lib.Shape):
    return x.rename_dimension(old_name, new_name)
  return reshape(x, x.shape.rename_dimension(old_name, new_name),
                 name=name or "rename_dimension")


def replace_dimensions(tensor_or_shape, old_dim_or_dims, new_dim_or_dims):
  """Replaces consecutive dimensions by others of the same total size.

  Works on a Shape (returns a Shape) or a Tensor (returns a reshape).
  """
  if isinstance(tensor_or_shape, graph_lib.Tensor):
    return reshape(tensor_or_shape, replace_dimensions(
        tensor_or_shape.shape, old_dim_or_dims, new_dim_or_dims))
  shape = shape_lib.convert_to_shape(tensor_or_shape)
  as_list = lambda d: ([d] if isinstance(d, shape_lib.Dimension) else
                       [shape_lib.convert_to_dimension(e) for e in d])
  old_dims = as_list(old_dim_or_dims)
  new_dims = as_list(new_dim_or_dims)
  for d in old_dims:
    if d not in shape.dims:
      raise errors.ShapeError(
          f"replace_dimensions: {d} is not a dimension of {shape}.")
  positions = [shape.dims.index(d) for d in old_dims]
  if positions != list(range(positions[0], positions[0] + len(positions))):
    raise errors.ShapeError(
        f"replace_dimensions: {old_dims} must be consecutive and in order in "
        f"{shape}.")
  if shape_lib.list_product(d.size for d in old_dims) != (
      shape_lib.list_product(d.size for d in new_dims)):
    raise errors.ShapeError(
        f"replace_dimensions: {old_dims} and {new_dims} have different total "
        "sizes.")
  dims = shape.dims
  return shape_lib.Shape(dims[:positions[0]] + new_dims +
                         dims[positions[-1] + 1:])


def combined_dimension(dims, name=None):
  """One Dimension whose size is the product of the sizes of `dims`.

  Used to flatten consecutive dimensions with `reshape`. The default name is
  that of the first (outermost) dimension, as in the original Mesh
  TensorFlow: a layout rule that splits it then still applies to the
  flattened dimension, so reshaping [batch, length] to [batch * length]
  under the rule "batch:rows" stays local.

  Args:
    dims: a non-empty list of Dimensions (or (name, size) pairs).
    name: optional name of the new dimension.

  Returns:
    a Dimension.
  """
  dims = [shape_lib.convert_to_dimension(d) for d in dims]
  if not dims:
    raise errors.ShapeError(
        "combined_dimension: dims must be a list of one or more Dimensions.")
  return shape_lib.Dimension(name or dims[0].name,
                             shape_lib.list_product(d.size for d in dims))


def anonymize(x, name=None):
  """`x` reshaped to anonymous dimension names, so it is fully replicated.

  No layout rule matches an anonymous name (see `mtf.anonymous_shape`), so
  every processor ends up with the whole tensor: each mesh dimension that
  split `x` allconcatenates. The original needed this before exporting from
  an SIMD mesh implementation.
  """
  return reshape(x, shape_lib.anonymous_shape(x.shape),
                 name=name or "anonymize")
