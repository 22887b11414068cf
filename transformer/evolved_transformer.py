"""The layers peculiar to the Evolved Transformer (So et al. 2019).

https://arxiv.org/abs/1901.11117 found, by architecture search, encoder and
decoder blocks that mix gated linear units, wide and separable convolutions
and branched attention with the usual attention and feed-forward layers.
This module has the four layers those blocks need beyond
`transformer_layers`; a model puts them in its layer stacks, e.g. (as in
the paper) an encoder block

  GatedLinearUnitLayer, EncoderConvolutionalLayer, SelfAttention,
  DenseReluDense

and a decoder block

  DecoderAttentionLayer, DecoderConvolutionalLayer, SelfAttention,
  EncDecAttention, DenseReluDense.

Each layer is gin-configurable under this module's name in the original,
`mesh_tensorflow.transformer.evolved_transformer`, and names its variables
as the original did (e.g. `.../EncoderConvolutionalLayer/conv1x1/dense/
kernel`). Branches narrower than the layer's output are zero-padded along
the channels before they are summed. The branches keep the model
dimension's name at every width, so a layout must not split it.
"""

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers

_GIN_MODULE = "mesh_tensorflow.transformer.evolved_transformer"


@gin.configurable(module=_GIN_MODULE)
class GatedLinearUnitLayer(transformer.TransformerLayer):
  """A gated linear unit over the model dimension (Dauphin et al. 2016).

  y = (x W0 + b0) * sigmoid(x W1 + b1), both kernels [d_model, d_model],
  variables "glu_0/kernel", "glu_0/bias", "glu_1/kernel", "glu_1/bias".
  See https://arxiv.org/abs/1612.08083.
  """

  def call(self, context, x, losses=None):
    """Applies the unit to x [..., d_model]."""
    del losses
    channels = x.shape.dims[-1:]
    return mtf.layers.dense_product(
        x, reduced_dims=channels, new_dims=channels,
        activation_functions=["linear", "sigmoid"],
        variable_dtype=context.variable_dtype, name="glu",
        expert_dims=context.model.ensemble_dims)


@gin.configurable(module=_GIN_MODULE)
class EncoderConvolutionalLayer(transformer.TransformerLayer):
  """The Evolved Transformer encoder's convolutional cell.

  Two branches read x [..., d_model]:
    left: a 1x1 convolution (a dense layer without bias) to 4 * d_model
      channels and a ReLU (variables under "conv1x1");
    right: a 3x1 convolution to d_model / 2 channels with a ReLU
      (`transformer_layers.Conv1DLayer`, under "conv3x1"), zero-padded to
      4 * d_model channels.
  Their sum is layer-normalized over its channels, then goes through a
  separable convolution reading offsets -4..4 (9x1) to d_model / 2 channels
  (under "sep_conv9x1"), zero-padded back to d_model. Dropout follows each
  branch and the output in training.
  """

  def __init__(self,
               d_model,
               dropout_rate,
               initializer_scale=1.0,
               norm_epsilon=1e-6):
    """Creates the cell's convolutions.

    Args:
      d_model: the size of the model dimension, a positive even integer.
      dropout_rate: the dropout rate in training, in [0, 1).
      initializer_scale: the variance scale of the separable convolution's
        depthwise and pointwise weights.
      norm_epsilon: the epsilon of the layer norm.
    """
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self._conv3x1 = transformer_layers.Conv1DLayer(
        filter_size=3, output_size=d_model // 2, activation="relu")
    self._sep_conv9x1 = transformer_layers.SeparableConv1DLayer(
        min_relative_pos=-4, max_relative_pos=4, output_size=d_model // 2,
        depthwise_filter_initializer_scale=initializer_scale,
        pointwise_filter_initializer_scale=initializer_scale)

  def call(self, context, x, losses=None):
    """Applies the cell to x [<batch dims>, length, d_model]."""
    model_dim = context.model.model_dim
    # The wide branch is the cell's hidden layer; it keeps the model
    # dimension's name, as in the original.
    wide_dim = mtf.Dimension(model_dim.name, 4 * model_dim.size)
    with tf.compat.v1.variable_scope("conv1x1"):
      left = mtf.layers.dense(
          x, new_dims=[wide_dim], reduced_dims=x.shape.dims[-1:],
          activation=mtf.relu, use_bias=False,
          variable_dtype=context.variable_dtype)
      left = _dropout(left, context, self._dropout_rate)
    with tf.compat.v1.variable_scope("conv3x1"):
      right = self._conv3x1.call(context, x, losses)
      right = _dropout(right, context, self._dropout_rate)
      right = _pad_channels_dim(right, wide_dim.size)
    hidden = _layer_norm(left + right, self._norm_epsilon)
    with tf.compat.v1.variable_scope("sep_conv9x1"):
      y = self._sep_conv9x1.call(context, hidden, losses)
      y = _dropout(y, context, self._dropout_rate)
      return _pad_channels_dim(y, model_dim.size)


@gin.configurable(module=_GIN_MODULE)
class DecoderAttentionLayer(transformer.TransformerLayer):
  """Self-attention and encoder-decoder attention side by side, summed.

  The self-attention has 2 * base_num_heads heads (variables under
  "self_attention"), the encoder-decoder attention base_num_heads (under
  "enc_dec_attention"); both read the layer's input. The two are
  `transformer_layers.SelfAttention` and `EncDecAttention`, so gin's
  bindings of those classes (key_value_size, ...) apply to them too.
  """

  def __init__(self, base_num_heads):
    """Creates the two attention layers.

    Args:
      base_num_heads: a positive integer, the encoder-decoder attention's
        number of heads (the self-attention has twice as many).
    """
    self._self_attention = transformer_layers.SelfAttention(
        num_heads=2 * base_num_heads)
    self._enc_dec_attention = transformer_layers.EncDecAttention(
        num_heads=base_num_heads)

  def call(self, context, x, losses=None):
    """Attends from x to itself and to the encoder output; sums the two."""
    with tf.compat.v1.variable_scope("self_attention"):
      left = self._self_attention.call(context, x, losses)
    with tf.compat.v1.variable_scope("enc_dec_attention"):
      right = self._enc_dec_attention.call(context, x, losses)
    return left + right


@gin.configurable(module=_GIN_MODULE)
class DecoderConvolutionalLayer(transformer.TransformerLayer):
  """The Evolved Transformer decoder's convolutional cell (causal).

  Two branches read x [..., d_model]:
    left: a separable convolution over offsets -10..0 (11x1) to
      2 * d_model channels with a ReLU (under "sep_conv11x1");
    right: a separable convolution over offsets -6..0 (7x1) to d_model / 2
      channels (under "sep_conv7x1_1"), zero-padded to 2 * d_model.
  Their sum is layer-normalized over its channels, then a separable
  convolution over offsets -6..0 gives d_model channels (under
  "sep_conv7x1_2"). Every filter reads only the current and earlier
  positions, so incremental decoding gives a full pass's outputs. Dropout
  follows each branch and the output in training.
  """

  def __init__(self,
               d_model,
               dropout_rate,
               initializer_scale=1.0,
               norm_epsilon=1e-6):
    """Creates the cell's convolutions.

    Args:
      d_model: the size of the model dimension, a positive even integer.
      dropout_rate: the dropout rate in training, in [0, 1).
      initializer_scale: the variance scale of the separable convolutions'
        depthwise and pointwise weights.
      norm_epsilon: the epsilon of the layer norm.
    """
    self._d_model = d_model
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon

    def separable(min_relative_pos, output_size, activation="linear"):
      return transformer_layers.SeparableConv1DLayer(
          min_relative_pos=min_relative_pos, max_relative_pos=0,
          output_size=output_size,
          depthwise_filter_initializer_scale=initializer_scale,
          pointwise_filter_initializer_scale=initializer_scale,
          activation=activation)

    self._sep_conv11x1 = separable(-10, 2 * d_model, activation="relu")
    self._sep_conv7x1_1 = separable(-6, d_model // 2)
    self._sep_conv7x1_2 = separable(-6, d_model)

  def call(self, context, x, losses=None):
    """Applies the cell to x [<batch dims>, length, d_model] (or, in
    incremental mode, [<batch dims>, d_model])."""
    with tf.compat.v1.variable_scope("sep_conv11x1"):
      left = self._sep_conv11x1.call(context, x, losses)
      left = _dropout(left, context, self._dropout_rate)
    with tf.compat.v1.variable_scope("sep_conv7x1_1"):
      right = self._sep_conv7x1_1.call(context, x, losses)
      right = _dropout(right, context, self._dropout_rate)
      right = _pad_channels_dim(right, left.shape.dims[-1].size)
    hidden = _layer_norm(left + right, self._norm_epsilon)
    with tf.compat.v1.variable_scope("sep_conv7x1_2"):
      y = self._sep_conv7x1_2.call(context, hidden, losses)
      return _dropout(y, context, self._dropout_rate)


def _layer_norm(x, epsilon):
  """Layer norm over x's channels (the last dimension), with a scale and a
  bias under "layer_prepostprocess/layer_norm"."""
  return mtf.layers.layer_norm(x, dim=x.shape.dims[-1], epsilon=epsilon)


def _pad_channels_dim(tensor, size):
  """`tensor` zero-padded at the end of its last dimension to `size`."""
  channels = tensor.shape.dims[-1]
  if channels.size > size:
    raise ValueError(
        f"evolved_transformer: cannot pad the channels {channels} of "
        f"{tensor.name} to {size}, fewer than it has.")
  return mtf.pad(tensor, [0, size - channels.size], channels.name)


def _dropout(x, context, dropout_rate):
  """Dropout in training, one mask per example and channel (shared along
  the length)."""
  if not context.train or dropout_rate <= 0:
    return x
  noise_shape = mtf.Shape(context.batch_dims + x.shape.dims[-1:])
  return mtf.dropout(x, context.train, rate=dropout_rate,
                     noise_shape=noise_shape)
