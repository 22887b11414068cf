"""Convolutions (NHWC/NDHWC) and their spatially partitioned forms.

Inputs are [batch..., spatial..., in_channels] with any number of leading
batch dimensions; filters are [filter_spatial..., in_channels,
out_channels] (for the transposed convolutions [filter_spatial...,
out_channels, in_channels], as in `tf.nn.conv2d_transpose`). Spatial and
batch, channel and spatial dimensions may be split across the mesh (evenly
or not); filter-spatial dimensions may not (a LayoutError says so: each
processor would hold some taps of every window, and the forward
convolution would leave a sum over them pending in every output row).

Communication: each processor convolves its slices. When the input-channel
dimension is split, every processor holds a partial sum over its channel
block, and the blocks are added with an allreduce over that mesh dimension
(lazily, see `LazyAllreduceSum`). The filter gradient sums over the batch,
so it is allreduced over the mesh dimensions the batch is split over; the
input gradient sums over output channels, allreduced likewise.

Example on mesh "rows:2;cols:2" with rules "batch:rows;cin:cols":
x[batch, h, w, cin] * filter[fh, fw, cin, cout] -> y[batch, h, w, cout].
Processor (r, c) convolves batch block r, channel block c of x with channel
block c of the filter; an allreduce over "cols" adds the two channel blocks.

Along a split spatial dimension (any strides, SAME or VALID) each
processor convolves the window of input rows its output block reads: its
own rows plus the halo its neighbours hold, received from them alone (see
`spatial_windows`), with VALID padding (zeros past the ends stand for
SAME's). The input gradient (and the transposed convolution, which is
one) sends each window's rows back to their blocks, where overlapping
halos add; the filter gradient sums over the split spatial dimension too
(an allreduce over its mesh dimension, lazily). Example: conv2d SAME with a
3x3 filter of x[batch, h=12, w, cin] on mesh "rows:4" with rule "h:rows":
processor p receives row 3p - 1 from p - 1 and row 3p + 3 from p + 1 (two
receives) and convolves its 5 rows into its 3 output rows.

`conv2d_with_blocks` / `conv3d_with_blocks` convolve an image cut into
spatial blocks ([batch, h_blocks, w_blocks, h, w, c]) whose block dimensions
may be split: neighbouring blocks exchange halos (see `halo_exchange`), then
each block is convolved with VALID padding.
`conv2d_transpose_with_blocks` / `conv3d_transpose_with_blocks` do the same
for SAME transposed convolutions (any strides): halo exchange of the input
rows that reach a block, a VALID transposed convolution, then each block's
output is cropped to its block_size * stride rows.
"""

import inspect
import math

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import shifts
from mesh_tensorflow.ops import slicing
from mesh_tensorflow.ops import spatial_windows

__all__ = [
    "Conv2dOperation",
    "Conv2dTransposeOperation",
    "Conv2or3dBackpropFilterOperation",
    "Conv2or3dBackpropInputOperation",
    "Conv3dOperation",
    "Conv3dTransposeOperation",
    "conv2d",
    "conv2d_backprop_filter",
    "conv2d_backprop_input",
    "conv2d_transpose",
    "conv2d_transpose_backprop_filter",
    "conv2d_transpose_backprop_input",
    "conv2d_transpose_with_blocks",
    "conv2d_with_blocks",
    "conv3d",
    "conv3d_backprop_filter",
    "conv3d_backprop_input",
    "conv3d_transpose",
    "conv3d_transpose_backprop_filter",
    "conv3d_transpose_backprop_input",
    "conv3d_transpose_with_blocks",
    "conv3d_with_blocks",
]

_PADDINGS = ("SAME", "VALID")


def _full_strides(strides, rank, context):
  """Strides as TF wants them: [1, spatial strides..., 1]."""
  if strides is None:
    return [1] * (rank + 2)
  strides = [int(s) for s in strides]
  if len(strides) == rank:
    strides = [1] + strides + [1]
  if (len(strides) != rank + 2 or strides[0] != 1 or strides[-1] != 1 or
      min(strides) < 1):
    raise ValueError(
        f"{context}: strides must be {rank} positive spatial strides or "
        f"[1, ..., 1] of length {rank + 2}, got {strides}.")
  return strides


def _check_padding(padding, context):
  if padding not in _PADDINGS:
    raise ValueError(f"{context}: padding must be 'SAME' or 'VALID', got "
                     f"{padding!r}.")


def _conv_output_size(size, filter_size, stride, padding, context, dim):
  if padding == "SAME":
    return math.ceil(size / stride)
  if size < filter_size:
    raise errors.ShapeError(
        f"{context}: VALID convolution of dimension {dim} with a filter of "
        f"size {filter_size} leaves nothing.")
  return math.ceil((size - filter_size + 1) / stride)


def _transpose_output_size(size, filter_size, stride, padding):
  if padding == "SAME":
    return size * stride
  return size * stride + max(filter_size - stride, 0)


def _flatten_batch_dims(x, num_kept):
  """Reshapes slice `x` to [batch, last `num_kept` axes]; returns the
  reshaped slice and a function restoring the batch axes of a result."""
  shape = slice_utils.static_shape(x)
  batch = shape[:len(shape) - num_kept]
  flat = tf.reshape(x, [shape_lib.list_product(batch)] + shape[len(batch):])
  return flat, lambda y: tf.reshape(
      y, batch + slice_utils.static_shape(y)[1:])


def _tf_conv(rank):
  return tf.nn.conv2d if rank == 2 else tf.nn.conv3d


def _tf_backprop_input(rank):
  return (tf.raw_ops.Conv2DBackpropInput if rank == 2 else
          tf.raw_ops.Conv3DBackpropInputV2)


def _tf_backprop_filter(rank):
  return (tf.raw_ops.Conv2DBackpropFilter if rank == 2 else
          tf.raw_ops.Conv3DBackpropFilterV2)


def _conv_kernel(rank, strides):
  """kernel(image window, filter) -> VALID convolution."""
  def kernel(x, f):
    flat, restore = _flatten_batch_dims(x, rank + 1)
    return restore(_tf_conv(rank)(flat, f, strides, "VALID"))
  return kernel


def _backprop_input_kernel(rank, strides):
  """kernel(filter, grad, window sizes) -> VALID input gradient."""
  def kernel(f, g, sizes):
    flat, restore = _flatten_batch_dims(g, rank + 1)
    shape = slice_utils.static_shape(flat)[:1] + list(sizes) + [
        slice_utils.static_shape(f)[-2]]
    return restore(_tf_backprop_input(rank)(
        input_sizes=shape, filter=f, out_backprop=flat, strides=strides,
        padding="VALID"))
  return kernel


def _backprop_filter_kernel(rank, strides, filter_slice_shape):
  """kernel(image window, grad) -> VALID filter gradient."""
  def kernel(x, g):
    x_flat, _ = _flatten_batch_dims(x, rank + 1)
    g_flat, _ = _flatten_batch_dims(g, rank + 1)
    return _tf_backprop_filter(rank)(
        input=x_flat, filter_sizes=filter_slice_shape, out_backprop=g_flat,
        strides=strides, padding="VALID")
  return kernel


def _split_axes(impl, dims):
  return sorted({impl.tensor_dimension_to_mesh_axis(d) for d in dims} -
                {None})


def _lazy_sum(impl, y, mesh_axes):
  if mesh_axes:
    return mesh_impl_lib.LazyAllreduceSum(impl, y, mesh_axes)
  return y


class _ConvBase(graph_lib.Operation):
  """Shared set-up of the convolution operations.

  Subclasses set `_rank` (2 or 3). `image_shape` is the [batch...,
  spatial..., channels] side that the filter slides over; `dy` is the
  [batch..., spatial..., channels] side that the filter maps it to.
  """

  _rank = None
  _kind = "conv"
  # Dimensions refused by check_splits beyond the unsplittable marks.
  _refused_splits = frozenset()
  # Uneven splits: every lowering is linear in each operand and works on
  # slices (or windows): padded batch entries, channels and spatial rows
  # are zero in one operand (the filter's channels are padded as the
  # image's are), so they add nothing to sums and come out zero; output
  # rows past the real ones of a padded spatial dimension are zeroed.
  handles_padding = True
  padding_stays_zero = True

  @property
  def rank(self):
    """The number of spatial dimensions (2 or 3)."""
    return self._rank

  def _validate(self, image_shape, filter_shape, strides, padding,
                filter_image_channel_axis):
    rank = self._rank
    context = f"{self._kind} {self.name!r}"
    _check_padding(padding, context)
    self._padding = padding
    self._strides = _full_strides(strides, rank, context)
    if image_shape.ndims < rank + 1:
      raise errors.ShapeError(
          f"{context}: input {image_shape} needs at least {rank + 1} "
          f"dimensions ([batch..., {rank} spatial, channels]).")
    if filter_shape.ndims != rank + 2:
      raise errors.ShapeError(
          f"{context}: filter {filter_shape} must have {rank + 2} dimensions "
          f"([{rank} filter spatial, two channel dimensions]).")
    self._batch_dims = image_shape.dims[:-(rank + 1)]
    self._spatial_dims = image_shape.dims[-(rank + 1):-1]
    self._image_channels = image_shape.dims[-1]
    self._filter_spatial_dims = filter_shape.dims[:rank]
    if filter_shape.dims[filter_image_channel_axis] != self._image_channels:
      raise errors.ShapeError(
          f"{context}: the channel dimension {self._image_channels} of input "
          f"{image_shape} must be dimension "
          f"{filter_image_channel_axis % (rank + 2)} of filter "
          f"{filter_shape}.")
    self._unsplittable = [d.name for d in self._filter_spatial_dims]

  def _mark_all_splittable_as_the_original(self):
    """The original marked every dimension of its backprop operations
    splittable (automatic layout reads the forward convolution's marks);
    check_splits still refuses filter-spatial splits."""
    self._initialize_all_dimensions_as_splittable()
    self._refused_splits = frozenset(self._unsplittable)

  def check_splits(self, lowering):
    for t in self._inputs + self._outputs:
      impl = lowering.mesh_impl(t)
      for d in t.shape:
        axis = impl.tensor_dimension_to_mesh_axis(d)
        if d.name in self._unsplittable and axis is not None:
          raise errors.LayoutError(
              f"{type(self).__name__} {self.name!r} cannot lower with "
              f"filter-spatial dimension {d.name!r} (size {d.size}) split "
              f"over mesh dimension {impl.shape[axis].name!r}: each "
              "processor would hold some taps of every window (split the "
              "image's spatial dimensions instead); change the layout "
              f"rules so that {d.name!r} is not split.")
    super().check_splits(lowering)

  @property
  def window_strides(self):
    """The spatial strides."""
    return self._strides[1:-1]

  @property
  def window_padding(self):
    """"SAME" or "VALID"."""
    return self._padding

  def moved_tensor(self):
    """Along split spatial dimensions: (the input whose windows move, False)
    or (None, True) when the output's rows go back to their blocks."""
    return 0, False

  def window_sizes(self):
    """(image-side spatial sizes, output-side spatial sizes): the
    convolution's input rows and the rows it maps them to."""
    image = [d.size for d in self._spatial_dims]
    return image, [_conv_output_size(n, f.size, s, self._padding, "", None)
                   for n, f, s in zip(image, self._filter_spatial_dims,
                                      self._strides[1:-1])]

  def _window_args(self):
    return ([f.size for f in self._filter_spatial_dims],
            self._strides[1:-1], self._padding)

  def split_windows(self, impl):
    """The SplitWindow of each split spatial dimension under `impl`."""
    image, out = self.window_sizes()
    dims = [shape_lib.Dimension(d.name, n)
            for d, n in zip(self._spatial_dims, image)]
    return spatial_windows.split_windows_of(impl, dims, out,
                                            *self._window_args())

  def cost_windows(self, layout):
    """split_windows under a cost_rules.CostLayout."""
    image, out = self.window_sizes()
    return spatial_windows.split_windows(
        image, out, *self._window_args(),
        [layout.mesh_dim(d.name) for d in self._spatial_dims], layout.sizes)

  def _whole_pads(self, windows):
    """[before, after] zero rows per spatial dimension: SAME's for the
    whole ones, none for the split ones (their windows hold them)."""
    image, out = self.window_sizes()
    split = {w.index for w in windows}
    pads = []
    for i, (n, o, f, s) in enumerate(zip(image, out, *self._window_args()[:2])):
      total = 0
      if self._padding == "SAME" and i not in split:
        total = max((o - 1) * s + f - n, 0)
      pads.append([total // 2, total - total // 2])
    return pads

  def _lower_gathering_windows(self, lowering, image, other, kernel):
    """Windows of laid-out `image` (its whole spatial dimensions padded as
    SAME pads them), then kernel(image window, other slice) with VALID
    padding."""
    impl = lowering.mesh_impl(self)
    windows = self.split_windows(impl)
    first = len(self._batch_dims)
    image = spatial_windows.gather_windows(impl, image, first, windows)
    pads = self._whole_pads(windows)

    def fn(x_slice, o_slice):
      paddings = [[0, 0]] * first + pads + [[0, 0]]
      return kernel(slice_utils.tf_pad(x_slice, paddings), o_slice)

    return impl.slicewise(fn, image, other)

  def _lower_scattering_windows(self, lowering, grad, conv_filter, kernel):
    """kernel(filter slice, grad slice, window sizes) with VALID padding
    gives the image-side windows (whole spatial dimensions padded as SAME
    pads them, then cut), whose rows go back to their blocks."""
    impl = lowering.mesh_impl(self)
    windows = self.split_windows(impl)
    first = len(self._batch_dims)
    pads = self._whole_pads(windows)
    image, _ = self.window_sizes()
    sizes = [n + a + b for n, (a, b) in zip(image, pads)]
    for w in windows:
      sizes[w.index] = w.plan.out_block

    def fn(f_slice, g_slice):
      x = kernel(f_slice, g_slice, sizes)
      shape = slice_utils.static_shape(x)
      begin = [0] * first + [a for a, _ in pads] + [0]
      size = shape[:first] + [n - a - b for n, (a, b) in zip(
          shape[first:-1], pads)] + shape[-1:]
      return slice_utils.tf_slice(x, begin, size)

    x = impl.slicewise(fn, conv_filter, grad)
    return spatial_windows.scatter_add_windows(impl, x, first, windows)

  def _conv_shape(self, out_channels):
    """The output shape of the convolution of the validated input."""
    dims = []
    for d, f, s in zip(self._spatial_dims, self._filter_spatial_dims,
                       self._strides[1:-1]):
      dims.append(shape_lib.Dimension(d.name, _conv_output_size(
          d.size, f.size, s, self._padding, f"{self._kind} {self.name!r}",
          d)))
    return shape_lib.Shape(self._batch_dims + dims + [out_channels])

  def _check_dy_shape(self, dy_shape, expected):
    if dy_shape != expected:
      raise errors.ShapeError(
          f"{self._kind} {self.name!r}: the output-side tensor has shape "
          f"{dy_shape}, but the convolution of the input produces "
          f"{expected}.")


@cost_rules.rule_for(_ConvBase)
class _ConvCost(cost_rules.CostRule):
  """Convolutions and their gradients: FLOPs of the direct algorithm (2 x
  the larger of image and output slice elements x filter elements per
  output channel); a split dimension summed over (a channel, or the batch
  for the filter gradient) leaves a pending sum."""

  may_pend = True

  def attributes(self, info):
    op = info.op
    return (op.rank, tuple(op.window_strides), op.window_padding,
            op.moved_tensor())

  def run(self, info, ctx):
    layout = ctx.layout
    rank = info.op.rank
    filt = [d for d in info.in_dims if len(d) == rank + 2]
    sides = [d for d in info.in_dims + info.out_dims if len(d) != rank + 2]
    flops = 0
    if filt and sides:
      per_out = math.prod(s for _, s in filt[0][:-1])
      flops = 2 * per_out * max(layout.slice_elements(d) for d in sides)
    pending = layout.summed_mesh_dims(info.in_dims, info.out_dims[0])
    collectives = []
    windows = info.op.cost_windows(layout)
    if windows:
      index, transpose = info.op.moved_tensor()
      dims, itemsize = ((info.out_dims[0], info.out_itemsize[0]) if transpose
                        else (info.in_dims[index], info.in_itemsize[index]))
      collectives = spatial_windows.window_collectives(
          layout, dims, itemsize, len(dims) - rank - 1, windows, transpose)
    # Like an einsum's, its operands and result are priced at the matmul
    # byte rate.
    return cost_rules.RuleResult([pending], collectives, flops=flops,
                                 matmul_bytes=cost_rules.io_bytes(info,
                                                                  layout))


class _ForwardConvOperation(_ConvBase):
  """Shared set-up of conv(x, filter) and conv_transpose(x, filter)."""

  # The axis of the filter's input-image channels; the default name.
  _filter_image_channel_axis = None
  _name_format = None

  def __init__(self, conv_input, conv_filter, strides, padding, name=None):
    x = conv_input
    super().__init__([x, conv_filter],
                     name=name or self._name_format.format(self._rank))
    self._validate(x.shape, conv_filter.shape, strides, padding,
                   self._filter_image_channel_axis)
    if x.dtype != conv_filter.dtype:
      raise errors.DTypeError(
          f"{self._kind} {self.name!r}: input and filter must share a dtype, "
          f"got {x.dtype.name} and {conv_filter.dtype.name}.")
    self._outputs = [graph_lib.Tensor(
        self, self._output_shape(conv_filter.shape), x.dtype)]
    self._initialize_splittable_and_unsplittable_dims(
        "splittable", self._unsplittable)

  def lower(self, lowering):
    """Each processor convolves its slices (`_slice_fn`); split input
    channels leave a pending sum."""
    impl = lowering.mesh_impl(self)
    x, conv_filter = self._inputs
    x, conv_filter = (lowering.laid_out_tensor(x),
                      lowering.laid_out_tensor(conv_filter))
    if self.split_windows(impl):
      y = self._lower_split(lowering, x, conv_filter)
    else:
      fn = self._slice_fn(impl.slice_shape(self._outputs[0].shape))
      y = impl.slicewise(fn, x, conv_filter)
    y = _lazy_sum(impl, y, _split_axes(impl, [self._image_channels]))
    lowering.set_tensor_lowering(self._outputs[0], y)


class _ConvOperation(_ForwardConvOperation):
  """conv(x, filter) -> y; filter [fspatial..., in, out]."""

  _kind = "conv"
  _filter_image_channel_axis = -2
  _name_format = "conv{}d"

  def _output_shape(self, filter_shape):
    return self._conv_shape(filter_shape.dims[-1])

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    x, conv_filter = self._inputs
    return [
        _backprop_input(x.shape, conv_filter, dy, self._strides,
                        self._padding, self._rank),
        _backprop_filter(x, conv_filter.shape, dy, self._strides,
                         self._padding, self._rank),
    ]

  def _lower_split(self, lowering, x, conv_filter):
    y = self._lower_gathering_windows(
        lowering, x, conv_filter, _conv_kernel(self._rank, self._strides))
    return spatial_windows.fill_output_padding(
        lowering.mesh_impl(self), y, self._outputs[0].shape)

  def _slice_fn(self, output_slice_shape):
    del output_slice_shape
    rank, strides, padding = self._rank, self._strides, self._padding

    def fn(x_slice, f_slice):
      flat, restore = _flatten_batch_dims(x_slice, rank + 1)
      return restore(_tf_conv(rank)(flat, f_slice, strides, padding))

    return fn


class Conv2dOperation(_ConvOperation):
  """2-D convolution of [batch..., h, w, in] with [fh, fw, in, out]."""
  _rank = 2


class Conv3dOperation(_ConvOperation):
  """3-D convolution of [batch..., d, h, w, in] with [fd, fh, fw, in, out]."""
  _rank = 3


def _check_conv_dimension(conv_dimension):
  if conv_dimension not in (2, 3):
    raise ValueError(f"conv_dimension must be 2 or 3, got {conv_dimension!r}.")
  return conv_dimension


class _ConvBackpropOperation(_ConvBase):
  """Shared set-up of the two gradients of a (transposed) convolution."""

  _wrt = None  # "input" or "filter".

  def __init__(self, conv_dimension, is_transpose, inputs, name):
    self._rank = _check_conv_dimension(conv_dimension)
    self._is_transpose = bool(is_transpose)
    trans = "_trans" if is_transpose else ""
    super().__init__(
        inputs, name=name or f"conv{self._rank}d{trans}_backprop_{self._wrt}")

  def _finish(self, output_shape, dtype):
    self._outputs = [graph_lib.Tensor(self, output_shape, dtype)]
    self._mark_all_splittable_as_the_original()


class Conv2or3dBackpropInputOperation(_ConvBackpropOperation):
  """The gradient of a (transposed) convolution with respect to its input.

  Not transposed: given the input shape [batch..., spatial..., cin], a
  filter [fspatial..., cin, cout] and dy [batch..., out spatial..., cout],
  computes the input gradient of the convolution (= the transposed
  convolution of dy). Transposed (`is_transpose`): the input gradient of a
  transposed convolution with filter [fspatial..., cout, cin], which is the
  convolution of dy with the same filter. Sums over dy's channels, so when
  they are split the result is a partial sum (lazily allreduced).

  Args:
    conv_dimension: 2 or 3.
    is_transpose: whether the forward operation was a transposed
      convolution.
    input_shape: the Shape of the forward operation's input.
    conv_filter: the filter Tensor.
    dy: the gradient of the forward operation's output.
    strides, padding: those of the forward operation.
    name: an optional name.
  """

  _kind = "conv_backprop_input"
  _wrt = "input"

  def __init__(self, conv_dimension, is_transpose, input_shape, conv_filter,
               dy, strides, padding, name=None):
    super().__init__(conv_dimension, is_transpose, [conv_filter, dy], name)
    input_shape = shape_lib.convert_to_shape(input_shape)
    if self._is_transpose:
      # The input gradient is conv(dy, filter): validate it as that.
      self._validate(dy.shape, conv_filter.shape, strides, padding, -2)
      produced = self._conv_shape(conv_filter.shape.dims[-1])
      if produced != input_shape:
        raise errors.ShapeError(
            f"{self._kind} {self.name!r}: the convolution of dy {dy.shape} "
            f"with filter {conv_filter.shape} gives {produced}, not the "
            f"input shape {input_shape}.")
    else:
      self._validate(input_shape, conv_filter.shape, strides, padding, -2)
      self._check_dy_shape(dy.shape,
                           self._conv_shape(conv_filter.shape.dims[-1]))
    self._finish(input_shape, dy.dtype)

  def moved_tensor(self):
    return (1, False) if self._is_transpose else (None, True)

  def gradient(self, grad_ys):
    g = grad_ys[0]
    conv_filter, dy = self._inputs
    rank, strides, padding = self._rank, self._strides, self._padding
    if self._is_transpose:
      # y = conv(dy, filter).
      return [_backprop_filter(dy, conv_filter.shape, g, strides, padding,
                               rank),
              _backprop_input(dy.shape, conv_filter, g, strides, padding,
                              rank)]
    conv = conv2d if rank == 2 else conv3d
    return [
        _backprop_filter(g, conv_filter.shape, dy, strides, padding, rank),
        conv(g, conv_filter, strides, padding),
    ]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    conv_filter, dy = self._inputs
    rank, strides, padding = self._rank, self._strides, self._padding
    if self.split_windows(impl):
      f, g = (lowering.laid_out_tensor(t) for t in self._inputs)
      if self._is_transpose:  # conv(dy, filter)
        y = spatial_windows.fill_output_padding(
            impl, self._lower_gathering_windows(
                lowering, g, f, _conv_kernel(rank, strides)),
            self._outputs[0].shape)
      else:
        y = self._lower_scattering_windows(
            lowering, g, f, _backprop_input_kernel(rank, strides))
      lowering.set_tensor_lowering(self._outputs[0], _lazy_sum(
          impl, y, _split_axes(impl, [dy.shape.dims[-1]])))
      return
    input_slice_shape = impl.slice_shape(self._outputs[0].shape)
    kept = input_slice_shape[-(rank + 1):]

    def fn(f_slice, dy_slice):
      flat, restore = _flatten_batch_dims(dy_slice, rank + 1)
      if self._is_transpose:
        return restore(_tf_conv(rank)(flat, f_slice, strides, padding))
      sizes = slice_utils.static_shape(flat)[:1] + kept
      return restore(_tf_backprop_input(rank)(
          input_sizes=sizes, filter=f_slice, out_backprop=flat,
          strides=strides, padding=padding))

    y = impl.slicewise(fn, lowering.laid_out_tensor(conv_filter),
                       lowering.laid_out_tensor(dy))
    y = _lazy_sum(impl, y, _split_axes(impl, [dy.shape.dims[-1]]))
    lowering.set_tensor_lowering(self._outputs[0], y)


class Conv2or3dBackpropFilterOperation(_ConvBackpropOperation):
  """The gradient of a (transposed) convolution with respect to its filter.

  Not transposed: given the input [batch..., spatial..., cin], the filter
  shape [fspatial..., cin, cout] and dy [batch..., out spatial..., cout].
  Transposed (`is_transpose`): the filter [fspatial..., cout, cin] of a
  transposed convolution of the input [batch..., spatial..., cin] whose
  output gradient is dy [batch..., out spatial..., cout]; the roles of the
  input and dy swap. Sums over the batch, so split batch dimensions leave
  partial sums (lazily allreduced over their mesh dimensions).

  Takes the arguments of Conv2or3dBackpropInputOperation, with the forward
  operation's input Tensor `conv_input` and the filter's Shape
  `filter_shape` in place of `input_shape` and `conv_filter`.
  """

  _kind = "conv_backprop_filter"
  _wrt = "filter"

  def __init__(self, conv_dimension, is_transpose, conv_input, filter_shape,
               dy, strides, padding, name=None):
    super().__init__(conv_dimension, is_transpose, [conv_input, dy], name)
    filter_shape = shape_lib.convert_to_shape(filter_shape)
    # The convolution whose filter gradient this is maps `image` to `grad`.
    image, grad = (dy, conv_input) if self._is_transpose else (conv_input, dy)
    self._validate(image.shape, filter_shape, strides, padding, -2)
    self._check_dy_shape(grad.shape, self._conv_shape(filter_shape.dims[-1]))
    self._finish(filter_shape, dy.dtype)

  def moved_tensor(self):
    return (1 if self._is_transpose else 0), False

  def gradient(self, grad_ys):
    g = grad_ys[0]
    conv_input, dy = self._inputs
    image, grad = (dy, conv_input) if self._is_transpose else (conv_input, dy)
    conv = conv2d if self._rank == 2 else conv3d
    d_image = _backprop_input(image.shape, g, grad, self._strides,
                              self._padding, self._rank)
    d_grad = conv(image, g, self._strides, self._padding)
    if self._is_transpose:
      return [d_grad, d_image]
    return [d_image, d_grad]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    conv_input, dy = self._inputs
    rank, strides, padding = self._rank, self._strides, self._padding
    filter_slice_shape = impl.slice_shape(self._outputs[0].shape)
    swap = self._is_transpose
    windows = self.split_windows(impl)
    if windows:
      image, grad = (lowering.laid_out_tensor(t) for t in self._inputs)
      if swap:
        image, grad = grad, image
      y = self._lower_gathering_windows(
          lowering, image, grad,
          _backprop_filter_kernel(rank, strides, filter_slice_shape))
      spatial = (dy if swap else conv_input).shape.dims[
          len(self._batch_dims):-1]
      lowering.set_tensor_lowering(self._outputs[0], _lazy_sum(
          impl, y, _split_axes(impl, self._batch_dims + spatial)))
      return

    def fn(input_slice, dy_slice):
      x_slice, g_slice = (dy_slice, input_slice) if swap else (input_slice,
                                                               dy_slice)
      x_flat, _ = _flatten_batch_dims(x_slice, rank + 1)
      g_flat, _ = _flatten_batch_dims(g_slice, rank + 1)
      return _tf_backprop_filter(rank)(
          input=x_flat, filter_sizes=filter_slice_shape,
          out_backprop=g_flat, strides=strides, padding=padding)

    y = impl.slicewise(fn, lowering.laid_out_tensor(conv_input),
                       lowering.laid_out_tensor(dy))
    y = _lazy_sum(impl, y, _split_axes(impl, self._batch_dims))
    lowering.set_tensor_lowering(self._outputs[0], y)


def _backprop_input(input_shape, conv_filter, dy, strides, padding, rank):
  return Conv2or3dBackpropInputOperation(
      rank, False, input_shape, conv_filter, dy, strides, padding).outputs[0]


def _backprop_filter(x, filter_shape, dy, strides, padding, rank):
  return Conv2or3dBackpropFilterOperation(
      rank, False, x, filter_shape, dy, strides, padding).outputs[0]


def _swap_channels(filter_shape):
  dims = filter_shape.dims
  return shape_lib.Shape(dims[:-2] + [dims[-1], dims[-2]])


class _ConvTransposeOperation(_ForwardConvOperation):
  """conv_transpose(x, filter) -> y; filter [fspatial..., out, in].

  The transposed convolution is the input gradient of the convolution of y
  with the same filter, so it lowers and differentiates through the same TF
  kernels.
  """

  _kind = "conv_transpose"
  _filter_image_channel_axis = -1
  _name_format = "conv{}d_transpose"

  def _output_shape(self, filter_shape):
    dims = []
    for d, f, s in zip(self._spatial_dims, self._filter_spatial_dims,
                       self._strides[1:-1]):
      dims.append(shape_lib.Dimension(d.name, _transpose_output_size(
          d.size, f.size, s, self._padding)))
    return shape_lib.Shape(self._batch_dims + dims + [filter_shape.dims[-2]])

  def gradient(self, grad_ys):
    g = grad_ys[0]
    x, conv_filter = self._inputs
    conv = conv2d if self._rank == 2 else conv3d
    return [
        conv(g, conv_filter, self._strides, self._padding),
        _backprop_filter(g, conv_filter.shape, x, self._strides,
                         self._padding, self._rank),
    ]

  def moved_tensor(self):
    return None, True

  def window_sizes(self):
    """The image side is the output; x is the convolution's output side."""
    return ([d.size for d in self._outputs[0].shape.dims[
        -(self._rank + 1):-1]], [d.size for d in self._spatial_dims])

  def _lower_split(self, lowering, x, conv_filter):
    return self._lower_scattering_windows(
        lowering, x, conv_filter,
        _backprop_input_kernel(self._rank, self._strides))

  def _slice_fn(self, output_slice_shape):
    rank, strides, padding = self._rank, self._strides, self._padding
    kept = output_slice_shape[-(rank + 1):]

    def fn(x_slice, f_slice):
      flat, restore = _flatten_batch_dims(x_slice, rank + 1)
      return restore(_tf_backprop_input(rank)(
          input_sizes=slice_utils.static_shape(flat)[:1] + kept,
          filter=f_slice, out_backprop=flat, strides=strides,
          padding=padding))

    return fn


class Conv2dTransposeOperation(_ConvTransposeOperation):
  """2-D transposed convolution of [batch..., h, w, in] with
  [fh, fw, out, in]."""
  _rank = 2


class Conv3dTransposeOperation(_ConvTransposeOperation):
  """3-D transposed convolution of [batch..., d, h, w, in] with
  [fd, fh, fw, out, in]."""
  _rank = 3


def conv2d(x, conv_filter, strides, padding, name=None):
  """2-D convolution (NHWC).

  Args:
    x: a Tensor [batch..., in_height, in_width, in_channels]; any number of
      leading batch dimensions.
    conv_filter: a Tensor [filter_height, filter_width, in_channels,
      out_channels].
    strides: [1, stride_h, stride_w, 1] (or [stride_h, stride_w]).
    padding: "SAME" or "VALID".
    name: an optional name.

  Returns:
    a Tensor [batch..., out_height, out_width, out_channels]; the spatial
    dimensions keep their names (with sizes ceil(in / stride) for SAME,
    ceil((in - filter + 1) / stride) for VALID).
  """
  return Conv2dOperation(x, conv_filter, strides, padding,
                         name=name).outputs[0]


def conv3d(x, conv_filter, strides, padding, name=None):
  """3-D convolution (NDHWC); like `conv2d` with a depth dimension.

  x is [batch..., depth, height, width, in_channels], conv_filter
  [fd, fh, fw, in_channels, out_channels], strides [1, sd, sh, sw, 1].
  """
  return Conv3dOperation(x, conv_filter, strides, padding,
                         name=name).outputs[0]


def conv2d_transpose(x, conv_filter, strides, padding, name=None):
  """2-D transposed convolution (NHWC), as `tf.nn.conv2d_transpose`.

  Args:
    x: a Tensor [batch..., in_height, in_width, in_channels].
    conv_filter: a Tensor [filter_height, filter_width, out_channels,
      in_channels].
    strides: [1, stride_h, stride_w, 1] (or [stride_h, stride_w]).
    padding: "SAME" or "VALID".
    name: an optional name.

  Returns:
    a Tensor [batch..., out_height, out_width, out_channels] with
    out = in * stride (SAME) or in * stride + max(filter - stride, 0)
    (VALID).
  """
  return Conv2dTransposeOperation(x, conv_filter, strides, padding,
                                  name=name).outputs[0]


def conv3d_transpose(x, conv_filter, strides, padding, name=None):
  """3-D transposed convolution (NDHWC); like `conv2d_transpose`."""
  return Conv3dTransposeOperation(x, conv_filter, strides, padding,
                                  name=name).outputs[0]


def _backprop_function(operation_class, rank, is_transpose, wrt):
  """The original's conv{rank}d[_transpose]_backprop_{wrt}: builds an
  `operation_class` with `rank` and `is_transpose` and the caller's other
  arguments, whose names and order it takes from the class."""
  forward = f"conv{rank}d" + ("_transpose" if is_transpose else "")

  def backprop(*args, **kwargs):
    return operation_class(rank, is_transpose, *args, **kwargs).outputs[0]

  signature = inspect.signature(operation_class)
  backprop.__signature__ = signature.replace(
      parameters=list(signature.parameters.values())[2:])
  backprop.__name__ = backprop.__qualname__ = f"{forward}_backprop_{wrt}"
  backprop.__doc__ = (f"The gradient of `{forward}` with respect to its "
                      f"{wrt} (see {operation_class.__name__}).")
  return backprop


_INPUT = Conv2or3dBackpropInputOperation
_FILTER = Conv2or3dBackpropFilterOperation
conv2d_backprop_input = _backprop_function(_INPUT, 2, False, "input")
conv2d_backprop_filter = _backprop_function(_FILTER, 2, False, "filter")
conv3d_backprop_input = _backprop_function(_INPUT, 3, False, "input")
conv3d_backprop_filter = _backprop_function(_FILTER, 3, False, "filter")
conv2d_transpose_backprop_input = _backprop_function(_INPUT, 2, True, "input")
conv2d_transpose_backprop_filter = _backprop_function(_FILTER, 2, True,
                                                      "filter")
conv3d_transpose_backprop_input = _backprop_function(_INPUT, 3, True, "input")
conv3d_transpose_backprop_filter = _backprop_function(_FILTER, 3, True,
                                                      "filter")


def _with_blocks(conv_fn, x, conv_filter, strides, padding, blocks_dims,
                 context, name):
  """Halo exchange (or zero padding) per spatial dimension, then VALID."""
  rank = len(blocks_dims)
  if all(b is None for b in blocks_dims):
    return conv_fn(x, conv_filter, strides, padding, name=name)
  if padding != "SAME":
    raise NotImplementedError(
        f"{context} supports padding='SAME' only, got {padding!r}.")
  if _full_strides(strides, rank, context) != [1] * (rank + 2):
    raise ValueError(
        f"{context}: strides must be 1 (blocks are convolved separately), "
        f"got {strides}.")
  spatial_dims = x.shape.dims[-(rank + 1):-1]
  filter_dims = conv_filter.shape.dims[:rank]
  for blocks_dim, size_dim, filter_dim in zip(blocks_dims, spatial_dims,
                                              filter_dims):
    if filter_dim.size % 2 != 1:
      raise ValueError(
          f"{context}: filter dimension {filter_dim} must have an odd size, "
          "so that the halo is the same on both sides.")
    halo = filter_dim.size // 2
    if halo == 0:
      continue
    if blocks_dim is None:
      x = slicing.pad(x, [halo, halo], size_dim.name)
    else:
      x = shifts.halo_exchange(x, blocks_dim, size_dim, halo)
  return conv_fn(x, conv_filter, strides, "VALID", name=name)


def conv2d_with_blocks(x, conv_filter, strides, padding, h_blocks_dim=None,
                       w_blocks_dim=None, name=None):
  """2-D SAME convolution of an image cut into spatial blocks.

  The image is [batch..., h_blocks, w_blocks, h, w, in_channels]: pixel row
  b * h + i is row i of block row b. The blocks dimensions may be split
  across the mesh (spatial partitioning); h and w must not be. Each block
  gets filter_size // 2 rows/columns of its neighbours by `halo_exchange`
  (or zeros when the matching blocks dimension is None), and is then
  convolved with VALID padding. The result is the SAME convolution of the
  whole image, cut into the same blocks.

  Args:
    x: a Tensor [batch..., h_blocks, w_blocks, h, w, in_channels].
    conv_filter: a Tensor [fh, fw, in_channels, out_channels] with odd fh
      and fw.
    strides: must be all 1 when a blocks dimension is given.
    padding: must be "SAME" when a blocks dimension is given.
    h_blocks_dim: the Dimension (or name) of x numbering blocks along h, or
      None: then each block is zero-padded along h instead, i.e. blocks are
      convolved independently along h (as in the original; right when
      h_blocks has size 1).
    w_blocks_dim: likewise along w.
    name: an optional name for the convolution.

  Returns:
    a Tensor [batch..., h_blocks, w_blocks, h, w, out_channels].
  """
  return _with_blocks(conv2d, x, conv_filter, strides, padding,
                      [h_blocks_dim, w_blocks_dim], "conv2d_with_blocks",
                      name)


def conv3d_with_blocks(x, conv_filter, strides, padding, d_blocks_dim=None,
                       h_blocks_dim=None, name=None):
  """3-D SAME convolution of a volume cut into blocks along depth and height.

  x is [batch..., d_blocks, h_blocks, d, h, w, in_channels]; like
  `conv2d_with_blocks`, width is not blocked (it is zero-padded per block).
  """
  return _with_blocks(conv3d, x, conv_filter, strides, padding,
                      [d_blocks_dim, h_blocks_dim, None],
                      "conv3d_with_blocks", name)


def _transpose_halos(filter_size, stride):
  """(left, right, offset) for a blocked SAME transposed convolution.

  TF's SAME transposed convolution of n rows with stride s gives n * s rows
  y[j] = sum_{i, t: i * s + t = j + pad} x[i] f[t], where pad =
  max(k - s, 0) // 2 is the padding before of the matching convolution.
  Output row j of a block of h input rows (j in [0, h * s)) needs input
  rows -left .. h - 1 + right of that block. After `left` rows are
  prepended, the block's rows start at row pad + left * s of the VALID
  transposed convolution.
  """
  pad = max(filter_size - stride, 0) // 2
  left = (filter_size - 1 - pad) // stride
  right = -(-pad // stride)
  return left, right, pad


def _transpose_with_blocks(conv_transpose_fn, x, conv_filter, strides,
                           padding, blocks_dims, context, name):
  """Halo exchange per blocked spatial dimension, VALID transposed
  convolution, then a crop to each block's stride * size rows."""
  rank = len(blocks_dims)
  if all(b is None for b in blocks_dims):
    return conv_transpose_fn(x, conv_filter, strides, padding, name=name)
  if padding != "SAME":
    raise NotImplementedError(
        f"{context} supports padding='SAME' only, got {padding!r}.")
  full_strides = _full_strides(strides, rank, context)
  if x.shape.ndims < 2 * rank + 1:
    raise errors.ShapeError(
        f"{context}: input {x.shape} needs at least {2 * rank + 1} "
        "dimensions ([batch..., blocks..., spatial..., channels]).")
  if conv_filter.shape.ndims != rank + 2:
    raise errors.ShapeError(
        f"{context}: filter {conv_filter.shape} must have {rank + 2} "
        "dimensions.")
  spatial_dims = x.shape.dims[-(rank + 1):-1]
  filter_dims = conv_filter.shape.dims[:rank]
  crops = []
  for blocks_dim, size_dim, filter_dim, stride in zip(
      blocks_dims, spatial_dims, filter_dims, full_strides[1:-1]):
    left, right, pad = _transpose_halos(filter_dim.size, stride)
    if blocks_dim is None:
      # Independent blocks: nothing comes from outside the block.
      halo = 0
    else:
      halo = max(left, right)
      x = shifts.halo_exchange(x, blocks_dim, size_dim, halo)
    crops.append((size_dim.name, pad + halo * stride,
                  size_dim.size * stride))
  y = conv_transpose_fn(x, conv_filter, strides, "VALID", name=name)
  for dim_name, begin, size in crops:
    y = slicing.mtf_slice(y, begin, size, dim_name)
  return y


def conv2d_transpose_with_blocks(x, conv_filter, strides, padding,
                                 h_blocks_dim=None, w_blocks_dim=None,
                                 name=None):
  """2-D SAME transposed convolution of an image cut into spatial blocks.

  The image is [batch..., h_blocks, w_blocks, h, w, in_channels]: pixel row
  b * h + i is row i of block row b. The blocks dimensions may be split
  across the mesh; h and w must not be. Each block gets the input rows of
  its neighbours that reach its output by `halo_exchange` (zeros past the
  ends of the image), is transposed-convolved with VALID padding, and the
  result is cropped to the block's h * stride_h rows (w * stride_w
  columns). The result is `conv2d_transpose(whole image, SAME)` cut into
  the same blocks, for any strides and filter sizes.

  Args:
    x: a Tensor [batch..., h_blocks, w_blocks, h, w, in_channels].
    conv_filter: a Tensor [fh, fw, out_channels, in_channels].
    strides: [1, stride_h, stride_w, 1] (or [stride_h, stride_w]).
    padding: must be "SAME" when a blocks dimension is given.
    h_blocks_dim: the Dimension (or name) of x numbering blocks along h, or
      None: then the blocks are transposed-convolved independently along h
      (as if each were a whole image).
    w_blocks_dim: likewise along w.
    name: an optional name for the transposed convolution.

  Returns:
    a Tensor [batch..., h_blocks, w_blocks, h * stride_h, w * stride_w,
    out_channels].
  """
  return _transpose_with_blocks(
      conv2d_transpose, x, conv_filter, strides, padding,
      [h_blocks_dim, w_blocks_dim], "conv2d_transpose_with_blocks", name)


def conv3d_transpose_with_blocks(x, conv_filter, strides, padding,
                                 d_blocks_dim=None, h_blocks_dim=None,
                                 name=None):
  """3-D SAME transposed convolution of a volume cut into blocks along depth
  and height.

  x is [batch..., d_blocks, h_blocks, d, h, w, in_channels], conv_filter
  [fd, fh, fw, out_channels, in_channels]; like
  `conv2d_transpose_with_blocks`, and width is not blocked (each block is
  transposed-convolved independently along w). Returns [batch...,
  d_blocks, h_blocks, d * stride_d, h * stride_h, w * stride_w,
  out_channels].
  """
  return _transpose_with_blocks(
      conv3d_transpose, x, conv_filter, strides, padding,
      [d_blocks_dim, h_blocks_dim, None], "conv3d_transpose_with_blocks",
      name)
