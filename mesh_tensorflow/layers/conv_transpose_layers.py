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

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import conv_layers

__all__ = [
    "conv2d_transpose",
    "conv2d_transpose_with_blocks",
    "conv3d",
    "conv3d_transpose",
    "conv3d_transpose_with_blocks",
    "conv3d_with_blocks",
]


def conv2d_transpose(x, output_dim, filter_size=(2, 2), strides=(2, 2),
                     padding="SAME", filter_initializer=None,
                     variable_dtype=None, name=None):
  """A 2-D transposed convolution layer (NHWC) with no bias.

  The arguments are `conv_layers.conv2d`'s; the variable scope defaults to
  "conv2d_transpose" and the kernel is [fh, fw, output_dim, in_channels].
  Returns [batch..., out_height, out_width, output_dim].
  """
  return conv_layers.conv_layer(
      mtf.conv2d_transpose, "conv2d_transpose", "conv2d_transpose", x,
      output_dim, filter_size, strides, padding, filter_initializer,
      variable_dtype, name)


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
  return conv_layers.conv_layer(
      mtf.conv2d_transpose_with_blocks, "conv2d_transpose_with_blocks",
      "conv2d_transpose", x, output_dim, filter_size, strides, padding,
      filter_initializer, variable_dtype, name, h_blocks_dim=h_blocks_dim,
      w_blocks_dim=w_blocks_dim)


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
  return conv_layers.conv_layer(
      mtf.conv3d, "conv3d", "conv3d", x, output_dim, filter_size, strides,
      padding, filter_initializer, variable_dtype, name)


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
  return conv_layers.conv_layer(
      mtf.conv3d_with_blocks, "conv3d_with_blocks", "conv3d", x, output_dim,
      filter_size, strides, padding, filter_initializer, variable_dtype, name,
      d_blocks_dim=d_blocks_dim, h_blocks_dim=h_blocks_dim)


def conv3d_transpose(x, output_dim, filter_size=(2, 2, 2), strides=(2, 2, 2),
                     padding="SAME", filter_initializer=None,
                     variable_dtype=None, name=None):
  """A 3-D transposed convolution layer (NDHWC) with no bias.

  Like `conv2d_transpose` with a depth dimension: the kernel is
  [fd, fh, fw, output_dim, in_channels]; the variable scope defaults to
  "conv3d_transpose".
  """
  return conv_layers.conv_layer(
      mtf.conv3d_transpose, "conv3d_transpose", "conv3d_transpose", x,
      output_dim, filter_size, strides, padding, filter_initializer,
      variable_dtype, name)


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
  return conv_layers.conv_layer(
      mtf.conv3d_transpose_with_blocks, "conv3d_transpose_with_blocks",
      "conv3d_transpose", x, output_dim, filter_size, strides, padding,
      filter_initializer, variable_dtype, name, d_blocks_dim=d_blocks_dim,
      h_blocks_dim=h_blocks_dim)
