"""Feed-forward Transformer layers: `DenseReluDense` and `ParallelLayer`.

Both are re-exported by `transformer_layers` and registered with gin under
that module's name, as in the original.
"""

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layers import self_attention_layers
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"


def length_shared_dropout(x, context, dropout_rate):
  """Dropout of x in training, its mask shared along the length dimension.

  One mask per example and unit, as the original's feed-forward and
  mixture-of-softmaxes layers drop; x itself outside training or at rate 0.
  """
  if not context.train or dropout_rate == 0.0:
    return x
  noise_shape = x.shape
  if context.length_dim in noise_shape.dims:
    noise_shape -= context.length_dim
  return mtf.dropout(x, context.train, keep_prob=1.0 - dropout_rate,
                     noise_shape=noise_shape)


@gin.configurable(module=_GIN_MODULE)
class DenseReluDense(transformer.TransformerLayer):
  """Two dense layers with an activation between them (the Transformer FFN).

  x [..., d_model] -> h = act(x wi) [..., d_ff] -> h wo [..., d_model]. The
  activation may be a list: the hidden layer is then the element-wise
  product of one dense layer per entry (`mtf.layers.dense_product`), e.g.
  ["gelu", "linear"] is GEGLU, with kernels "wi_0" and "wi_1".
  """

  def __init__(self, hidden_size=4096, dropout_rate=0.0, activation="relu",
               use_bias=False):
    """Records the layer's hyperparameters.

    Args:
      hidden_size: the size of the hidden dimension "d_ff".
      dropout_rate: dropout on the hidden layer in training; one mask per
        example and hidden unit, shared along the length dimension.
      activation: an activation (a callable or the name of an mtf function,
        "linear" for none) or a list of them (GLU variants).
      use_bias: whether both dense layers have a bias.
    """
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = activation
    self.use_bias = use_bias

  def call(self, context, x, losses=None):
    """Applies the layer to x [..., d_model]; variables "wi*" and "wo"."""
    del losses
    io_dim = x.shape.dims[-1]
    hidden_dim = mtf.Dimension("d_ff", self.hidden_size)
    h = mtf.layers.dense_product(
        x, reduced_dims=x.shape.dims[-1:], new_dims=hidden_dim,
        activation_functions=self.activation, use_bias=self.use_bias,
        variable_dtype=context.variable_dtype, name="wi",
        expert_dims=context.model.ensemble_dims)
    h = length_shared_dropout(h, context, self.dropout_rate)
    return mtf.layers.dense(
        h, io_dim, use_bias=self.use_bias, activation=None,
        variable_dtype=context.variable_dtype,
        reduced_dims=h.shape.dims[-1:], name="wo",
        expert_dims=context.model.ensemble_dims)


@gin.configurable(module=_GIN_MODULE)
class ParallelLayer(transformer.TransformerLayer):
  """Several layers applied to the same input; their sum divided by sqrt(n).

  The original's default is (DenseReluDense, SelfAttention). Each layer
  creates its variables in the current variable scope, as in the original,
  so two layers of one class would share them unless `use_scope` is set
  (an addition of ours: layer i then uses the scope "parallel_layer_{i}").
  """

  def __init__(self, layer_classes=None, use_scope=False):
    """Instantiates the layers.

    Args:
      layer_classes: a sequence of TransformerLayer classes, each built with
        no arguments (gin configures them); None means
        (DenseReluDense, SelfAttention), the original's default.
      use_scope: give layer i its own variable scope "parallel_layer_{i}".
    """
    if layer_classes is None:
      layer_classes = (DenseReluDense, self_attention_layers.SelfAttention)
    if not layer_classes:
      raise ValueError("ParallelLayer needs at least one layer class.")
    self.layer_classes = [cls() for cls in layer_classes]
    self.use_scope = use_scope

  def call(self, context, x, losses=None):
    """The layers' outputs on x, summed and scaled by n ** -0.5."""
    outputs = []
    for i, layer in enumerate(self.layer_classes):
      if self.use_scope:
        with tf.compat.v1.variable_scope(f"parallel_layer_{i}"):
          outputs.append(layer.call(context, x, losses=losses))
      else:
        outputs.append(layer.call(context, x, losses=losses))
    return mtf.add_n(outputs) * (len(self.layer_classes) ** -0.5)
