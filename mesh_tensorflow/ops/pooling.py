"""Max and average pooling (NHWC/NDHWC), non-overlapping windows.

Inputs are [batch..., spatial..., channels] with any number of leading
batch dimensions. Windows do not overlap (strides == ksize) and use VALID
padding: a spatial dimension of size n becomes n // k, and trailing entries
that do not fill a window are dropped (their gradient is zero).

Each processor pools its own slices with no communication. Batch and
channel dimensions may be split freely; a spatial dimension may be split too
when every slice holds whole windows (its size divides by mesh dimension size
times window size), else lowering raises a LayoutError. On mesh "rows:2" with
rule "h:rows", max_pool2d of x[batch, h=8, w, c] with 2x2 windows: processor
0 pools rows 0-3 into output rows 0-1, processor 1 rows 4-7 into 2-3.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules

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


def _check_window_splits(op, lowering, spatial, ksize):
  """Raises unless each split spatial dimension's slices are whole windows."""
  impl = lowering.mesh_impl(op)
  for d, k in zip(spatial, ksize):
    mesh_axis = impl.tensor_dimension_to_mesh_axis(d)
    if mesh_axis is None:
      continue
    mesh_dim = impl.shape[mesh_axis]
    if d.size % (mesh_dim.size * k):
      raise errors.LayoutError(
          f"{type(op).__name__} {op.name!r} cannot lower with spatial "
          f"dimension {d.name!r} (size {d.size}) split over mesh dimension "
          f"{mesh_dim.name!r} (size {mesh_dim.size}): its slices of "
          f"{-(-d.size // mesh_dim.size)} entries are not whole windows of "
          f"{k}. Leave {d.name!r} unsplit, or make its size a multiple of "
          f"{mesh_dim.size * k}.")


class PoolOperation(graph_lib.Operation):
  """Pools the spatial dimensions of x with non-overlapping windows.

  Uneven splits: a padded spatial dimension never holds whole windows (it is
  refused), so only batch and channel dimensions are padded; their padding
  pools to zero.
  """

  handles_padding = True
  padding_stays_zero = True

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

  def check_splits(self, lowering):
    super().check_splits(lowering)
    _check_window_splits(self, lowering, self._spatial, self._ksize)

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

    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.slicewise(fn, lowering.laid_out_tensor(self._inputs[0])))


cost_rules.register(PoolOperation, cost_rules.SLICEWISE)


class PoolBackPropOperation(graph_lib.Operation):
  """The gradient of a PoolOperation with respect to its input (zero in the
  padding of batch and channel dimensions, as dy is)."""

  handles_padding = True
  padding_stays_zero = True

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

  def check_splits(self, lowering):
    super().check_splits(lowering)
    _check_window_splits(self, lowering, self._spatial, self._ksize)

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
    lowering.set_tensor_lowering(self._outputs[0],
                                 impl.slicewise(fn, x, y, dy))


cost_rules.register(PoolBackPropOperation, cost_rules.SLICEWISE)


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
