"""Transposed and 3-D convolution layers.

Part of `mesh_tensorflow.layers` (re-exported there), like `conv_layers`:
each layer creates its filter variable "kernel" with `mtf.get_variable`
inside a variable scope named as in the original Mesh TensorFlow
("conv3d/kernel", "conv2d_transpose/kernel", ...) and calls the matching
operation of `mesh_tensorflow.ops.convolution`. Filter-spatial dimensions
are named "fd", "fh" and "fw". Convolution filters are [spatial...,
in_channels, out_channels]; transposed-convolution filters are
[spatial..., out_channels, in_channels], as in `tf.nn.conv2d_transpose`.
"""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import layer_helpers

__all__ = [
    "conv2d_transpose",
    "conv2d_transpose_with_blocks",
    "conv3d",
    "conv3d_transpose",
    "conv3d_transpose_with_blocks",
    "conv3d_with_blocks",
]

_FILTER_DIM_NAMES = {2: ("fh", "fw"), 3: ("fd", "fh", "fw")}


def _conv_filter(x, output_dim, filter_size, transpose, filter_initializer,
                 variable_dtype, context):
  """The variable "kernel", cast to x.dtype.

  Its shape is [f..., x.shape[-1], output_dim], or [f..., output_dim,
  x.shape[-1]] for a transposed convolution.
  """
  rank = 3 if context.startswith("conv3d") else 2
  if len(filter_size) != rank:
    raise mtf.ShapeError(
        f"{context} of {x.name} {x.shape}: filter_size {filter_size} must "
        f"have {rank} entries.")
  if x.shape.ndims < rank + 2:
    raise mtf.ShapeError(
        f"{context} of {x.name} {x.shape}: the input needs batch, {rank} "
        "spatial and a channels dimension.")
  if variable_dtype is None:
    variable_dtype = mtf.VariableDType(activation_dtype=x.dtype)
  spatial = [mtf.Dimension(n, s)
             for n, s in zip(_FILTER_DIM_NAMES[rank], filter_size)]
  channels = [output_dim, x.shape[-1]] if transpose else [x.shape[-1],
                                                          output_dim]
  conv_filter = mtf.get_variable(
      x.mesh, "kernel", mtf.Shape(spatial + channels),
      initializer=filter_initializer, dtype=variable_dtype)
  return mtf.cast(conv_filter, x.dtype)


def _conv_layer(op_fn, context, default_name, x, output_dim, filter_size,
                strides, padding, filter_initializer, variable_dtype, name,
                **blocks_dims):
  """Creates the filter in a variable scope and applies `op_fn`."""
  with layer_helpers.variable_scope(x.mesh, name, default_name):
    conv_filter = _conv_filter(x, output_dim, filter_size,
                               "transpose" in context, filter_initializer,
                               variable_dtype, context)
    return op_fn(x, conv_filter, [1] + list(strides) + [1], padding,
                 **blocks_dims)


def conv2d_transpose(x, output_dim, filter_size=(2, 2), strides=(2, 2),
                     padding="SAME", filter_initializer=None,
                     variable_dtype=None, name=None):
  """A 2-D transposed convolution layer (NHWC) with no bias.

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
    name: the variable scope; default "conv2d_transpose" (made unique).

  Returns:
    an mtf Tensor [batch..., out_height, out_width, output_dim]; the kernel
    is [fh, fw, output_dim, in_channels].
  """
  return _conv_layer(mtf.conv2d_transpose, "conv2d_transpose",
                     "conv2d_transpose", x, output_dim, filter_size, strides,
                     padding, filter_initializer, variable_dtype, name)


def conv2d_transpose_with_blocks(x, output_dim, filter_size=(2, 2),
                                 strides=(2, 2), padding="SAME",
                                 h_blocks_dim=None, w_blocks_dim=None,
                                 filter_initializer=None, variable_dtype=None,
                                 name=None):
  """`conv2d_transpose` of an image cut into spatial blocks.

  x is [batch..., h_blocks, w_blocks, h, w, in_channels]; the blocks
  dimensions may be split across the mesh (see
  `mtf.conv2d_transpose_with_blocks`). Only "SAME" padding when a blocks
  dimension is given. Returns [batch..., h_blocks, w_blocks, h * stride_h,
  w * stride_w, output_dim]; the variable scope defaults to
  "conv2d_transpose", as in the original.
  """
  return _conv_layer(mtf.conv2d_transpose_with_blocks,
                     "conv2d_transpose_with_blocks", "conv2d_transpose", x,
                     output_dim, filter_size, strides, padding,
                     filter_initializer, variable_dtype, name,
                     h_blocks_dim=h_blocks_dim, w_blocks_dim=w_blocks_dim)


def conv3d(x, output_dim, filter_size=(3, 3, 3), strides=(1, 1, 1),
           padding="SAME", filter_initializer=None, variable_dtype=None,
           name=None):
  """A 3-D convolution layer (NDHWC) with no bias.

  Args:
    x: an mtf Tensor [batch..., depth, height, width, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: (filter_depth, filter_height, filter_width).
    strides: (stride_d, stride_h, stride_w).
    padding: "SAME" or "VALID".
    filter_initializer: any initializer `mtf.get_variable` accepts.
    variable_dtype: an mtf.VariableDType.
    name: the variable scope; default "conv3d" (made unique).

  Returns:
    an mtf Tensor [batch..., out_d, out_h, out_w, output_dim]; the kernel
    is [fd, fh, fw, in_channels, output_dim].
  """
  return _conv_layer(mtf.conv3d, "conv3d", "conv3d", x, output_dim,
                     filter_size, strides, padding, filter_initializer,
                     variable_dtype, name)


def conv3d_with_blocks(x, output_dim, filter_size=(3, 3, 3),
                       strides=(1, 1, 1), padding="SAME", d_blocks_dim=None,
                       h_blocks_dim=None, filter_initializer=None,
                       variable_dtype=None, name=None):
  """A 3-D SAME convolution layer on a volume cut into blocks.

  x is [batch..., d_blocks, h_blocks, d, h, w, in_channels]; the blocks
  dimensions may be split across the mesh (see `mtf.conv3d_with_blocks`);
  filter sizes must be odd and strides 1 when a blocks dimension is given.
  The variable scope defaults to "conv3d", as in the original.
  """
  return _conv_layer(mtf.conv3d_with_blocks, "conv3d_with_blocks", "conv3d",
                     x, output_dim, filter_size, strides, padding,
                     filter_initializer, variable_dtype, name,
                     d_blocks_dim=d_blocks_dim, h_blocks_dim=h_blocks_dim)


def conv3d_transpose(x, output_dim, filter_size=(2, 2, 2), strides=(2, 2, 2),
                     padding="SAME", filter_initializer=None,
                     variable_dtype=None, name=None):
  """A 3-D transposed convolution layer (NDHWC) with no bias.

  Like `conv2d_transpose` with a depth dimension: the kernel is
  [fd, fh, fw, output_dim, in_channels]; the variable scope defaults to
  "conv3d_transpose".
  """
  return _conv_layer(mtf.conv3d_transpose, "conv3d_transpose",
                     "conv3d_transpose", x, output_dim, filter_size, strides,
                     padding, filter_initializer, variable_dtype, name)


def conv3d_transpose_with_blocks(x, output_dim, filter_size=(2, 2, 2),
                                 strides=(2, 2, 2), padding="SAME",
                                 d_blocks_dim=None, h_blocks_dim=None,
                                 filter_initializer=None, variable_dtype=None,
                                 name=None):
  """`conv3d_transpose` of a volume cut into blocks along depth and height.

  x is [batch..., d_blocks, h_blocks, d, h, w, in_channels]; see
  `mtf.conv3d_transpose_with_blocks`. The variable scope defaults to
  "conv3d_transpose", as in the original.
  """
  return _conv_layer(mtf.conv3d_transpose_with_blocks,
                     "conv3d_transpose_with_blocks", "conv3d_transpose", x,
                     output_dim, filter_size, strides, padding,
                     filter_initializer, variable_dtype, name,
                     d_blocks_dim=d_blocks_dim, h_blocks_dim=h_blocks_dim)
