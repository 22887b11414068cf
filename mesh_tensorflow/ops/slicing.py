"""Concatenation, slicing and padding along one named dimension.

These act on each slice locally, so the dimension they work along must not be
split across the mesh (a clear LayoutError says so at lowering). Under
uneven splits the other dimensions may be padded: the padding keeps its
place in each slice and stays zero (pad adds zeros).
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules


class ConcatOperation(graph_lib.Operation):
  """Concatenates tensors along the dimension named `concat_dim_name`."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, xs, concat_dim_name, name=None):
    super().__init__(xs, name=name or "concat")
    self._dim_name = concat_dim_name
    first = xs[0].shape
    self._axis = first.index(
        shape_lib.dimension_of(first, concat_dim_name, self.name))
    for x in xs:
      if (x.shape.dimension_names != first.dimension_names or
          (x.shape - [x.shape[self._axis]]) != (first - [first[self._axis]])):
        raise errors.ShapeError(
            f"concat {self.name!r}: all inputs must have the shape of "
            f"{first} except along {concat_dim_name!r}; got {x.shape}.")
      if x.dtype != xs[0].dtype:
        raise TypeError(f"concat {self.name!r}: inputs must share a dtype.")
    total = sum(x.shape[self._axis].size for x in xs)
    out_shape = first.resize_dimension(concat_dim_name, total)
    self._outputs = [graph_lib.Tensor(self, out_shape, xs[0].dtype)]
    self._initialize_splittable_and_unsplittable_dims(
        "splittable", [concat_dim_name])

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    grads = []
    begin = 0
    for x in self._inputs:
      size = x.shape[self._axis].size
      grads.append(mtf_slice(dy, begin, size, self._dim_name))
      begin += size
    return grads

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis = self._axis
    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.slicewise(lambda *xs: tf.concat(xs, axis=axis),
                       *[lowering.tensors[x] for x in self._inputs]))


cost_rules.register(ConcatOperation, cost_rules.SLICEWISE)


def concat(xs, concat_dim_name, name=None):
  """Concatenates `xs` along the dimension named `concat_dim_name`.

  The inputs may have different sizes of that dimension; the output has
  their sum. The dimension must not be split across the mesh.
  """
  xs = list(xs)
  if len(xs) == 1:
    return xs[0]
  return ConcatOperation(xs, concat_dim_name, name=name).outputs[0]


class SliceOperation(graph_lib.Operation):
  """Takes `size` entries from `begin` along one dimension."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, begin, size, slice_dim_name, name=None):
    super().__init__([x], name=name or "slice")
    self._axis = x.shape.index(
        shape_lib.dimension_of(x.shape, slice_dim_name, self.name))
    dim = x.shape[self._axis]
    if not (0 <= begin and size >= 0 and begin + size <= dim.size):
      raise errors.ShapeError(
          f"slice {self.name!r}: [{begin}, {begin + size}) is outside "
          f"dimension {dim.name!r} of size {dim.size}.")
    self._begin = begin
    self._dim_name = slice_dim_name
    self._outputs = [graph_lib.Tensor(
        self, x.shape.resize_dimension(slice_dim_name, size), x.dtype)]
    self._initialize_splittable_and_unsplittable_dims(
        "splittable", [slice_dim_name])

  def gradient(self, grad_ys):
    dim_size = self._inputs[0].shape[self._axis].size
    size = self._outputs[0].shape[self._axis].size
    return [pad(grad_ys[0], [self._begin, dim_size - self._begin - size],
                self._dim_name)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis, begin = self._axis, self._begin
    size = self._outputs[0].shape[axis].size

    def fn(x):
      starts = [0] * x.shape.rank
      sizes = [-1] * x.shape.rank
      starts[axis] = begin
      sizes[axis] = size
      return slice_utils.tf_slice(x, starts, sizes)

    lowering.set_tensor_lowering(
        self._outputs[0], impl.slicewise(fn, lowering.tensors[self._inputs[0]]))


cost_rules.register(SliceOperation, cost_rules.SLICEWISE)


def mtf_slice(x, begin, size, slice_dim_name, name=None):
  """Entries [begin, begin + size) of `x` along dimension `slice_dim_name`."""
  if begin == 0 and size == x.shape.get_dim_by_name(slice_dim_name).size:
    return x
  return SliceOperation(x, begin, size, slice_dim_name, name=name).outputs[0]


class PadOperation(graph_lib.Operation):
  """Pads with zeros before and after along one dimension."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, paddings, pad_dim_name, name=None):
    super().__init__([x], name=name or "pad")
    dim_name = pad_dim_name
    self._axis = x.shape.index(
        shape_lib.dimension_of(x.shape, dim_name, self.name))
    before, after = paddings
    if before < 0 or after < 0:
      raise errors.ShapeError(
          f"pad {self.name!r}: paddings must be non-negative, got {paddings}.")
    self._paddings = (before, after)
    self._dim_name = dim_name
    size = x.shape[self._axis].size + before + after
    self._outputs = [graph_lib.Tensor(
        self, x.shape.resize_dimension(dim_name, size), x.dtype)]
    self._initialize_splittable_and_unsplittable_dims("splittable", [dim_name])

  def gradient(self, grad_ys):
    return [mtf_slice(grad_ys[0], self._paddings[0],
                      self._inputs[0].shape[self._axis].size, self._dim_name)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis, paddings = self._axis, self._paddings

    def fn(x):
      pads = [[0, 0]] * x.shape.rank
      pads[axis] = list(paddings)
      return slice_utils.tf_pad(x, pads)

    lowering.set_tensor_lowering(
        self._outputs[0], impl.slicewise(fn, lowering.tensors[self._inputs[0]]))


cost_rules.register(PadOperation, cost_rules.SLICEWISE)


def pad(x, paddings, dim_name, name=None):
  """Zero-pads `x` by paddings=[before, after] along `dim_name`."""
  if isinstance(dim_name, shape_lib.Dimension):
    dim_name = dim_name.name
  if tuple(paddings) == (0, 0):
    return x
  return PadOperation(x, paddings, dim_name, name=name).outputs[0]
