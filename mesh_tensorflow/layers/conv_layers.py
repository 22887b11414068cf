"""Convolution, pooling, batch-norm and activation-noise layers.

Like `mesh_tensorflow.layers` (which re-exports everything here), each layer
takes and returns mtf Tensors and creates its variables with
`mtf.get_variable` inside a variable scope, so the variables are named as in
the original Mesh TensorFlow (e.g. "conv2d/kernel").

Filters are [fh, fw, in_channels, out_channels] with filter-spatial
dimensions named "fh" and "fw"; convolutions have no bias, as in the
original.
"""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import configurable as configurable_lib
from mesh_tensorflow.layers import layer_helpers

__all__ = [
    "avg_pool2d",
    "avg_pool3d",
    "batch_norm",
    "clip_activation_gradient",
    "conv1d",
    "conv2d",
    "conv2d_with_blocks",
    "max_pool2d",
    "max_pool3d",
    "multiplicative_jitter",
]


_FILTER_DIM_NAMES = {2: ("fh", "fw"), 3: ("fd", "fh", "fw")}


def conv_filter(x, output_dim, filter_size, transpose, filter_initializer,
                variable_dtype, context):
  """The variable "kernel" of a 2-D or 3-D convolution layer, cast to x.dtype.

  Shared with `conv_transpose_layers`. Its shape is [f..., x.shape[-1],
  output_dim], or [f..., output_dim, x.shape[-1]] for a transposed
  convolution; `context` (the layer's name, "conv3d..." for 3-D) names the
  layer in errors.
  """
  rank = 3 if context.startswith("conv3d") else 2
  if len(filter_size) != rank:
    raise mtf.ShapeError(
        f"{context} of {x.name} {x.shape}: filter_size {filter_size} must "
        f"have {rank} entries.")
  if x.shape.ndims < rank + 1:
    # Batch dimensions are optional (the original's conv1d test has none).
    raise mtf.ShapeError(
        f"{context} of {x.name} {x.shape}: the input needs {rank} spatial "
        "and a channels dimension.")
  if variable_dtype is None:
    variable_dtype = mtf.VariableDType(activation_dtype=x.dtype)
  spatial = [mtf.Dimension(n, s)
             for n, s in zip(_FILTER_DIM_NAMES[rank], filter_size)]
  channels = [output_dim, x.shape[-1]] if transpose else [x.shape[-1],
                                                          output_dim]
  kernel = mtf.get_variable(
      x.mesh, "kernel", mtf.Shape(spatial + channels),
      initializer=filter_initializer, dtype=variable_dtype)
  return mtf.cast(kernel, x.dtype)


def conv_layer(op_fn, context, default_name, x, output_dim, filter_size,
               strides, padding, filter_initializer, variable_dtype, name,
               **blocks_dims):
  """Creates the filter in a variable scope and applies the op `op_fn`.

  Every convolution layer here and in `conv_transpose_layers` is this call.
  """
  with layer_helpers.variable_scope(x.mesh, name, default_name):
    kernel = conv_filter(x, output_dim, filter_size, "transpose" in context,
                         filter_initializer, variable_dtype, context)
    return op_fn(x, kernel, [1] + list(strides) + [1], padding,
                 **blocks_dims)


def conv2d(x, output_dim, filter_size=(3, 3), strides=(1, 1), padding="SAME",
           filter_initializer=None, variable_dtype=None, name=None):
  """A 2-D convolution layer (NHWC) with a learned filter and no bias.

  Args:
    x: an mtf Tensor [batch..., height, width, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: (filter_height, filter_width).
    strides: (stride_h, stride_w).
    padding: "SAME" or "VALID".
    filter_initializer: any initializer `mtf.get_variable` accepts; default
      Glorot uniform.
    variable_dtype: an mtf.VariableDType; default float32 variables
      activated in x.dtype.
    name: the variable scope; default "conv2d" (made unique).

  Returns:
    an mtf Tensor [batch..., out_height, out_width, output_dim].
  """
  return conv_layer(mtf.conv2d, "conv2d", "conv2d", x, output_dim,
                    filter_size, strides, padding, filter_initializer,
                    variable_dtype, name)


def conv2d_with_blocks(x, output_dim, filter_size=(3, 3), strides=(1, 1),
                       padding="SAME", h_blocks_dim=None, w_blocks_dim=None,
                       filter_initializer=None, variable_dtype=None,
                       name=None):
  """A 2-D SAME convolution layer on an image cut into spatial blocks.

  The input is [batch..., h_blocks, w_blocks, h, w, in_channels]; the blocks
  dimensions may be split across the mesh (neighbours exchange halos, see
  `mtf.conv2d_with_blocks`). The result is the SAME convolution of the whole
  image, cut into the same blocks.

  Args:
    x: an mtf Tensor [batch..., h_blocks, w_blocks, h, w, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: (filter_height, filter_width), both odd.
    strides: must be (1, 1) when a blocks dimension is given.
    padding: must be "SAME" when a blocks dimension is given.
    h_blocks_dim: the Dimension numbering blocks along h, or None to
      zero-pad each block along h.
    w_blocks_dim: likewise along w.
    filter_initializer: any initializer `mtf.get_variable` accepts.
    variable_dtype: an mtf.VariableDType.
    name: the variable scope; default "conv2d" (made unique), as in the
      original.

  Returns:
    an mtf Tensor [batch..., h_blocks, w_blocks, h, w, output_dim].
  """
  return conv_layer(mtf.conv2d_with_blocks, "conv2d_with_blocks", "conv2d",
                    x, output_dim, filter_size, strides, padding,
                    filter_initializer, variable_dtype, name,
                    h_blocks_dim=h_blocks_dim, w_blocks_dim=w_blocks_dim)


def conv1d(x, output_dim, filter_size=3, stride=1, **kwargs):
  """A 1-D convolution layer: `conv2d` over a fake height dimension of 1.

  Args:
    x: an mtf Tensor [batch..., length, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the filter width.
    stride: the stride along length.
    **kwargs: passed to `conv2d` (padding, filter_initializer,
      variable_dtype, name).

  Returns:
    an mtf Tensor [batch..., out_length, output_dim]; the kernel variable is
    [fh:1, fw:filter_size, in_channels, output_dim].
  """
  if x.shape.ndims < 2:
    raise mtf.ShapeError(
        f"conv1d of {x.name} {x.shape}: the input needs a length and a "
        "channels dimension.")
  fake_height_dim = mtf.Dimension("fake_height", 1)
  x = mtf.reshape(x, mtf.Shape(
      x.shape.dims[:-2] + [fake_height_dim] + x.shape.dims[-2:]))
  y = conv2d(x, output_dim, filter_size=(1, filter_size),
             strides=(1, stride), **kwargs)
  return mtf.reshape(y, mtf.Shape(
      [d for d in y.shape.dims if d != fake_height_dim]))


def max_pool2d(x, ksize=(2, 2), name="max_pool2d"):
  """Non-overlapping 2-D max pooling of [batch..., h, w, channels]."""
  return mtf.max_pool2d(x, ksize, name=name)


def avg_pool2d(x, ksize=(2, 2), name="avg_pool2d"):
  """Non-overlapping 2-D average pooling of [batch..., h, w, channels]."""
  return mtf.avg_pool2d(x, ksize, name=name)


def max_pool3d(x, ksize=(2, 2, 2), name="max_pool3d"):
  """Non-overlapping 3-D max pooling of [batch..., d, h, w, channels]."""
  return mtf.max_pool3d(x, ksize, name=name)


def avg_pool3d(x, ksize=(2, 2, 2), name="avg_pool3d"):
  """Non-overlapping 3-D average pooling of [batch..., d, h, w, channels]."""
  return mtf.avg_pool3d(x, ksize, name=name)


def batch_norm(x, is_training, momentum, epsilon=1e-9, dims_idx_start=0,
               dims_idx_end=-1, init_zero=False, name=None):
  """Batch normalization over x.shape.dims[dims_idx_start:dims_idx_end].

  Creates "batch_norm_scale" (ones, or zeros with `init_zero`) and
  "batch_norm_bias" (zeros), and the non-trainable "bn_moving_mean" (zeros;
  the original drew it from N(0, 1), which only delays convergence of the
  moving average) and "bn_moving_variance" (ones), all shaped like the
  dimensions not normalized over.

  Args:
    x: an mtf Tensor.
    is_training: whether to normalize with the batch statistics (and return
      ops that update the moving statistics) or with the moving ones.
    momentum: the moving averages' decay: new = momentum * old +
      (1 - momentum) * batch statistic.
    epsilon: added to the variance before the reciprocal square root.
    dims_idx_start, dims_idx_end: the slice of x's dimensions to normalize
      over (by default all but the last).
    init_zero: initialize the scale to zeros (e.g. the last norm of a
      residual block).
    name: the variable scope; default "batch_norm" (made unique).

  Returns:
    (y, update_ops): y like x, and a list of mtf Assign operations that
    update the moving mean and variance (empty when not training); run them
    with the training step.
  """
  norm_dims = x.shape.dims[dims_idx_start:dims_idx_end]
  if not norm_dims:
    raise mtf.ShapeError(
        f"batch_norm of {x.name} {x.shape}: dims_idx_start={dims_idx_start} "
        f"and dims_idx_end={dims_idx_end} select no dimension to normalize "
        "over.")
  reduced_shape = x.shape - norm_dims
  with layer_helpers.variable_scope(x.mesh, name, "batch_norm"):
    gamma_initializer = (tf.zeros_initializer() if init_zero
                         else tf.ones_initializer())
    scale = mtf.get_variable(x.mesh, "batch_norm_scale", reduced_shape,
                             initializer=gamma_initializer,
                             activation_dtype=x.dtype)
    bias = mtf.get_variable(x.mesh, "batch_norm_bias", reduced_shape,
                            initializer=tf.zeros_initializer(),
                            activation_dtype=x.dtype)
    moving_mean = mtf.get_variable(x.mesh, "bn_moving_mean", reduced_shape,
                                   initializer=tf.zeros_initializer(),
                                   activation_dtype=x.dtype, trainable=False)
    moving_variance = mtf.get_variable(
        x.mesh, "bn_moving_variance", reduced_shape,
        initializer=tf.ones_initializer(), activation_dtype=x.dtype,
        trainable=False)
    if is_training:
      mean = mtf.reduce_mean(x, output_shape=reduced_shape)
      variance = mtf.reduce_mean(mtf.square(x - mean),
                                 output_shape=reduced_shape)
      norm_x = (x - mean) * mtf.rsqrt(variance + epsilon)
      update_ops = [
          mtf.assign(moving_mean,
                     momentum * moving_mean + (1 - momentum) * mean,
                     name="bn_mean_update"),
          mtf.assign(moving_variance,
                     momentum * moving_variance + (1 - momentum) * variance,
                     name="bn_var_update")]
    else:
      norm_x = (x - moving_mean) * mtf.rsqrt(moving_variance + epsilon)
      update_ops = []
    return norm_x * scale + bias, update_ops


def multiplicative_jitter(x, epsilon=1e-2):
  """x times uniform noise in [1 - epsilon, 1 + epsilon); x if epsilon == 0."""
  if epsilon == 0:
    return x
  return x * mtf.random_uniform(x.mesh, x.shape, minval=1.0 - epsilon,
                                maxval=1.0 + epsilon, dtype=x.dtype)


@configurable_lib.configurable
def clip_activation_gradient(x, clip_rms_norm=None):
  """Identity forward; the gradient is scaled down to RMS <= clip_rms_norm.

  The gradient dy of the output becomes dy / max(1, rms(dy) / clip_rms_norm),
  where rms is over all of dy, so one exploding activation gradient cannot
  blow up the layers below.

  Args:
    x: an mtf Tensor.
    clip_rms_norm: a positive float, or None / 0 for no clipping (then x is
      returned as is).

  Returns:
    an mtf Tensor equal to x.
  """
  if not clip_rms_norm:
    return x

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
              output_grads):
    del explicit_inputs, all_inputs, forward_operations, outputs
    dy = output_grads[0]
    rms = mtf.sqrt(mtf.reduce_mean(mtf.square(dy)))
    return [dy / mtf.maximum(1.0, rms / clip_rms_norm)]

  return mtf.custom_gradient(mtf.identity, grad_fn, [x])
