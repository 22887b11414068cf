"""Max and average pooling (NHWC/NDHWC), non-overlapping windows.

Inputs are [batch..., spatial..., channels] with any number of leading
batch dimensions. Windows do not overlap (strides == ksize) and use VALID
padding: a spatial dimension of size n becomes n // k, and trailing entries
that do not fill a window are dropped (their gradient is zero).

Batch and channel dimensions may be split freely, with no communication.
A spatial dimension may be split too, evenly or not: output block p (the
layout rules' blocks of the output, maybe padded) pools the input rows
[p * OB * k, (p + 1) * OB * k); when those are not the processor's own
block they move by receives of only the rows that change processor
(`spatial_windows.gather_windows`, or a gather when its plan finds that
cheaper), and the gradient sends them back. On mesh "rows:2" with rule
"h:rows", max_pool2d of x[batch, h=8, w, c] with 2x2 windows: processor 0
pools rows 0-3 into output rows 0-1, processor 1 rows 4-7 into 2-3, no
communication. With h=6 (blocks of 3; output blocks of 2, the last one
padded) processor 0 receives row 3 from processor 1 and pools rows 0-3
into output rows 0-1, and processor 1 pools rows 4-5 into output row 2.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import spatial_windows

__all__ = [
    "PoolBackPropOperation",
    "PoolOperation",
    "avg_pool2d",
    "avg_pool3d",
    "max_pool2d",
    "max_pool3d",
    "pool_backprop",
]

# pool_fn_string -> (rank, forward, backward). MAX backward kernels take
# (input, output, dy); AVG ones take (input shape, dy).
_POOLS = {
    "MAX_2D": (2, tf.nn.max_pool2d, tf.raw_ops.MaxPoolGrad),
    "AVG_2D": (2, tf.nn.avg_pool2d, tf.raw_ops.AvgPoolGrad),
    "MAX_3D": (3, tf.nn.max_pool3d, tf.raw_ops.MaxPool3DGrad),
    "AVG_3D": (3, tf.nn.avg_pool3d, tf.raw_ops.AvgPool3DGrad),
}


def _flatten_batch_dims(x, num_kept):
  shape = slice_utils.static_shape(x)
  batch = shape[:len(shape) - num_kept]
  flat = tf.reshape(x, [shape_lib.list_product(batch)] + shape[len(batch):])
  return flat, lambda y: tf.reshape(
      y, batch + slice_utils.static_shape(y)[1:])


def _validate(x, ksize, strides, pool_fn_string, context):
  """Checks the arguments; returns (rank, ksize, spatial dims)."""
  if pool_fn_string not in _POOLS:
    raise ValueError(f"{context}: unknown pool {pool_fn_string!r}; use one "
                     f"of {sorted(_POOLS)}.")
  rank = _POOLS[pool_fn_string][0]
  ksize = tuple(int(k) for k in ksize)
  strides = tuple(int(s) for s in strides)
  if len(ksize) != rank or min(ksize) < 1:
    raise ValueError(f"{context}: ksize must be {rank} positive ints, got "
                     f"{ksize}.")
  if strides != ksize:
    raise ValueError(
        f"{context}: only non-overlapping pooling is supported: strides "
        f"{strides} must equal ksize {ksize}.")
  if x.shape.ndims < rank + 1:
    raise errors.ShapeError(
        f"{context}: input {x.shape} needs at least {rank + 1} dimensions "
        f"([batch..., {rank} spatial, channels]).")
  spatial = x.shape.dims[-(rank + 1):-1]
  for d, k in zip(spatial, ksize):
    if d.size < k:
      raise errors.ShapeError(
          f"{context}: spatial dimension {d} is smaller than the window "
          f"size {k}.")
  return rank, ksize, spatial


def _windows(op, impl):
  """The SplitWindow of each split spatial dimension of pool `op`."""
  out_sizes = [d.size // k for d, k in zip(op.spatial_dims, op.ksize)]
  return spatial_windows.split_windows_of(
      impl, op.spatial_dims, out_sizes, op.ksize, op.ksize, "VALID")


class _PoolCost(cost_rules.CostRule):
  """Slicewise work, and along split spatial dimensions the collectives of
  gathering each output block's windows (and, for the gradient, of
  sending their rows back), as the lowerings do."""

  def attributes(self, info):
    return (info.op.ksize,)

  def run(self, info, ctx):
    layout = ctx.layout
    op = info.op
    x_dims = info.in_dims[0]
    first = len(x_dims) - op.rank - 1
    out_dims = [(n, s // k) for (n, s), k in zip(
        x_dims[first:first + op.rank], op.ksize)]
    out_dims = list(x_dims[:first]) + out_dims + list(x_dims[first + op.rank:])
    windows = spatial_windows.cost_windows(layout, x_dims, out_dims,
                                           op.ksize, op.ksize, "VALID",
                                           first)
    collectives = spatial_windows.window_collectives(
        layout, x_dims, info.in_itemsize[0], first, windows)
    if isinstance(op, PoolBackPropOperation):
      collectives += spatial_windows.window_collectives(
          layout, x_dims, info.out_itemsize[0], first, windows,
          transpose=True)
    return cost_rules.RuleResult(
        cost_rules.no_pending(info), collectives,
        elementwise_bytes=cost_rules.io_bytes(info, layout))


class _PoolBase(graph_lib.Operation):
  """Shared by pooling and its gradient: along split spatial dimensions
  each processor works on the windows of its output block."""

  handles_padding = True
  padding_stays_zero = True

  @property
  def rank(self):
    """The number of spatial dimensions (2 or 3)."""
    return self._rank

  @property
  def ksize(self):
    """The window sizes (= strides)."""
    return self._ksize

  @property
  def spatial_dims(self):
    """The input's spatial Dimensions."""
    return self._spatial

  def _first_spatial_axis(self):
    return self._inputs[0].shape.ndims - self._rank - 1


class PoolOperation(_PoolBase):
  """Pools the spatial dimensions of x with non-overlapping windows.

  Uneven splits: padding pools to zero (windows of padding rows hold only
  zeros); output rows past the real ones are zeroed.
  """

  def __init__(self, x, ksize, strides, pool_fn_string, name=None):
    super().__init__([x], name=name or pool_fn_string.lower() + "_pool")
    self._rank, self._ksize, spatial = _validate(
        x, ksize, strides, pool_fn_string, f"pool {self.name!r}")
    self._pool_fn_string = pool_fn_string
    out_shape = x.shape
    for d, k in zip(spatial, self._ksize):
      out_shape = out_shape.resize_dimension(d.name, d.size // k)
    self._spatial = spatial
    self._outputs = [graph_lib.Tensor(self, out_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [pool_backprop(self._inputs[0], self._outputs[0], grad_ys[0],
                          self._ksize, self._ksize, self._pool_fn_string)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    rank, ksize = self._rank, list(self._ksize)
    pool_fn = _POOLS[self._pool_fn_string][1]

    def fn(x):
      flat, restore = _flatten_batch_dims(x, rank + 1)
      return restore(pool_fn(flat, ksize, ksize, "VALID"))

    x = spatial_windows.gather_windows(
        impl, lowering.laid_out_tensor(self._inputs[0]),
        self._first_spatial_axis(), _windows(self, impl))
    lowering.set_tensor_lowering(
        self._outputs[0], spatial_windows.fill_output_padding(
            impl, impl.slicewise(fn, x), self._outputs[0].shape))


class PoolBackPropOperation(_PoolBase):
  """The gradient of a PoolOperation with respect to its input (zero in the
  padding, as dy is)."""

  def __init__(self, x, y, dy, ksize, strides, pool_fn_string, name=None):
    super().__init__([x, y, dy],
                     name=name or pool_fn_string.lower() + "_pool_backprop")
    self._rank, self._ksize, spatial = _validate(
        x, ksize, strides, pool_fn_string, f"pool_backprop {self.name!r}")
    if y.shape != dy.shape:
      raise errors.ShapeError(
          f"pool_backprop {self.name!r}: dy {dy.shape} must have the shape "
          f"of the pooled output {y.shape}.")
    self._pool_fn_string = pool_fn_string
    self._spatial = spatial
    self._outputs = [graph_lib.Tensor(self, x.shape, dy.dtype)]

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    rank = self._rank
    window = [1] + list(self._ksize) + [1]
    grad_fn = _POOLS[self._pool_fn_string][2]
    is_max = self._pool_fn_string.startswith("MAX")

    def fn(x, y, dy):
      x_flat, restore = _flatten_batch_dims(x, rank + 1)
      y_flat, _ = _flatten_batch_dims(y, rank + 1)
      dy_flat, _ = _flatten_batch_dims(dy, rank + 1)
      if is_max:
        dx = grad_fn(orig_input=x_flat, orig_output=y_flat, grad=dy_flat,
                     ksize=window, strides=window, padding="VALID")
      else:
        dx = grad_fn(orig_input_shape=slice_utils.static_shape(x_flat),
                     grad=dy_flat, ksize=window, strides=window,
                     padding="VALID")
      return restore(dx)

    x, y, dy = (lowering.laid_out_tensor(t) for t in self._inputs)
    windows = _windows(self, impl)
    first = self._first_spatial_axis()
    x = spatial_windows.gather_windows(impl, x, first, windows)
    dx = spatial_windows.scatter_add_windows(
        impl, impl.slicewise(fn, x, y, dy), first, windows)
    lowering.set_tensor_lowering(self._outputs[0], dx)


cost_rules.register(_PoolBase, _PoolCost())


def pool_backprop(x, y, dy, ksize, strides, pool_fn_string, name=None):
  """The gradient dx of y = pool(x) given dy (MAX goes to the first max)."""
  return PoolBackPropOperation(x, y, dy, ksize, strides, pool_fn_string,
                               name=name).outputs[0]


def _pool(x, ksize, pool_fn_string, name):
  return PoolOperation(x, ksize, ksize, pool_fn_string, name=name).outputs[0]


def max_pool2d(x, ksize=(2, 2), name=None):
  """2-D max pooling of [batch..., h, w, channels] over ksize windows.

  Returns [batch..., h // kh, w // kw, channels]; the spatial dimensions keep
  their names.
  """
  return _pool(x, ksize, "MAX_2D", name)


def avg_pool2d(x, ksize=(2, 2), name=None):
  """2-D average pooling of [batch..., h, w, channels]; see max_pool2d."""
  return _pool(x, ksize, "AVG_2D", name)


def max_pool3d(x, ksize=(2, 2, 2), name=None):
  """3-D max pooling of [batch..., d, h, w, channels] over ksize windows."""
  return _pool(x, ksize, "MAX_3D", name)


def avg_pool3d(x, ksize=(2, 2, 2), name=None):
  """3-D average pooling of [batch..., d, h, w, channels]."""
  return _pool(x, ksize, "AVG_3D", name)
