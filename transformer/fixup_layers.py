"""Layers for Fixup initialization (https://arxiv.org/abs/1901.09321).

Fixup trains a deep residual network without normalization layers by
scaling the initial weights of each residual branch down with the number of
branches and starting its last projection at zero, so that every branch
begins as the identity. Scalar biases ("shift") before projections and a
scalar multiplier per branch (`sublayer_fixup_scale`) make up for the
missing normalization.

For a branch of m matrix products among L branches ("num_blocks": each
SelfAttention, EncDecAttention or feed-forward layer is one), the factor on
the usual He or Glorot standard deviation is L ** (-1 / (2m - 2)): the
feed-forward layer (m = 2) scales by L ** -0.5, self-attention (m = 4,
counting the product of queries and keys) by L ** (-1/6). The variance
scale is the square of that factor.

Registered with gin under the original's module,
`mesh_tensorflow.transformer.fixup_layers`.

Where this differs from the original: the initial values are drawn from
TensorFlow's stateless random ops seeded by the variable's name (as every
initializer of this project), so all layouts start alike; attention
kernels stored apart (combine_dims=False) take their fan-in from the input
channels and their fan-out from the heads and key/value channels, where
TensorFlow's variance scaling would read a 3-D kernel as a convolution.
"""

import math

import gin
import mesh_tensorflow as mtf
import tensorflow as tf

from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer.layers import dense_layers
from mesh_tensorflow.transformer.layers import multihead_attention
from mesh_tensorflow.transformer.layers import seeded_initializers
from mesh_tensorflow.transformer.layers import self_attention_layers
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers

_GIN_MODULE = "mesh_tensorflow.transformer.fixup_layers"
_INITS = ("glorot", "he")


def get_single_scalar_bias(x, name: str):
  """A trainable scalar bias (Fixup's "shift"), zero at first.

  Fixup puts one before every projection or convolution of a branch.

  Args:
    x: an mtf Tensor, whose mesh and dtype the variable takes.
    name: the variable's name in the current scope.

  Returns:
    the variable's value, of shape [single_bias:1].
  """
  single_dimension = mtf.Dimension("single_bias", 1)
  return mtf.get_variable(
      x.mesh, name, mtf.Shape([single_dimension]),
      initializer=tf.zeros_initializer(), dtype=x.dtype)


def dense_product_fixup(x,
                        reduced_dims,
                        new_dims,
                        kernel_initializer,
                        activation_functions=None,
                        name="dense_product",
                        **kwargs):
  """`mtf.layers.dense_product` with an explicit kernel initializer.

  Args:
    x: an mtf Tensor.
    reduced_dims: a list of Dimensions of x to contract.
    new_dims: a list of Dimensions of the output.
    kernel_initializer: the kernels' initializer (for Fixup, a variance
      scaling scaled down with the number of blocks).
    activation_functions: one or a list of: a callable, the name of an mtf
      function, None or "linear" (see `mtf.layers.dense_product`).
    name: the variable scope.
    **kwargs: more arguments for `mtf.layers.dense`.

  Returns:
    the element-wise product of the dense layers.
  """
  return mtf.layers.dense_product(
      x, reduced_dims, new_dims, activation_functions, name,
      kernel_initializer=kernel_initializer, **kwargs)


def _fixup_variance_scaling(default_init, init_distribution, he_scale,
                            glorot_scale, caller):
  """The DenseInitializer for "he" (fan_in) or "glorot" (fan_avg)."""
  if default_init == "glorot":
    return mtf.layers.VarianceScalingInitializer(
        scale=glorot_scale, mode="fan_avg", distribution=init_distribution)
  if default_init == "he":
    return mtf.layers.VarianceScalingInitializer(
        scale=he_scale, mode="fan_in", distribution=init_distribution)
  raise ValueError(
      f"{caller}: unsupported default_init {default_init!r}; only "
      f"{_INITS} are supported.")


class AttentionParamsFixup(attention.AttentionParams):
  """Attention parameters with Fixup initialization.

  q, k, v (or kv) start from a variance scaling with scale
  num_blocks ** (-1/3) ("glorot", fan_avg) or 2 * num_blocks ** (-1/3)
  ("he", fan_in): self-attention has four matrix products, so the
  standard deviation is scaled by num_blocks ** (-1/6). o starts at zero.
  The variables are named "q_fixup", "k_fixup", "v_fixup", "kv_fixup" and
  "o_fixup", as in the original.
  """

  # The original's signature: AttentionParams' parameters up to shared_kv,
  # fold_scaling_into_initializer (default False), then Fixup's own; the
  # others of AttentionParams go through **kwargs.
  @multihead_attention.extends_params(
      omit=("no_query", "combine_dims", "ensemble_dim",
            "keep_query_heads_dims", "make_attention_vars"),
      defaults={"fold_scaling_into_initializer": False})
  def __init__(self, base, num_blocks=None, default_init="he",
               init_distribution="uniform", **kwargs):
    """Creates the variables.

    Args:
      base: AttentionParams' arguments mesh, query_input_dim,
        memory_input_dim, output_dim, key_dim, value_dim, query_heads_dims,
        memory_heads_dims, variable_dtype, shared_kv (see
        `attention.AttentionParams`), and fold_scaling_into_initializer,
        which must be False (Fixup's initial scales leave no room for the
        logits' scaling); the signature takes them by position or name.
      num_blocks: an integer, the number of residual branches of the model
        (e.g. 2 per encoder layer and 3 per decoder layer).
      default_init: "he" or "glorot".
      init_distribution: "uniform" or "normal".
      **kwargs: more arguments for `attention.AttentionParams`.

    Raises:
      ValueError: the unit-scaling convention is on,
        fold_scaling_into_initializer is set, num_blocks is missing, or
        default_init is unknown.
    """
    if mtf.layers.unit_scaling_convention():
      raise ValueError("AttentionParamsFixup: Fixup initialization is not "
                       "compatible with the unit scaling convention.")
    if base["fold_scaling_into_initializer"]:
      raise ValueError("AttentionParamsFixup: Fixup initialization is not "
                       "compatible with fold_scaling_into_initializer=True.")
    if not isinstance(num_blocks, int) or num_blocks < 1:
      raise ValueError("AttentionParamsFixup: num_blocks must be a positive "
                       f"integer, got {num_blocks!r}.")
    self.num_blocks = num_blocks
    self.default_init = default_init
    self.init_distribution = init_distribution
    self._ensemble_dim = kwargs.get("ensemble_dim")
    super().__init__(**base, **kwargs)

  def init_weights(self):
    """Creates q_fixup, k_fixup and v_fixup (or kv_fixup), and o_fixup."""
    # The scale is a variance: the square of the num_blocks ** (-1/6)
    # factor on the standard deviation.
    factor = math.pow(self.num_blocks, -1.0 / 3)
    init = _fixup_variance_scaling(
        self.default_init, self.init_distribution, he_scale=2 * factor,
        glorot_scale=factor, caller="AttentionParamsFixup")

    def make(name, shape, input_dim, initializer=None):
      if initializer is None:
        # Fans from the dimensions: the input channels are reduced, the
        # rest (heads and key/value channels) new; an ensemble dimension
        # counts in neither.
        new_dims = [d for d in shape
                    if d not in (input_dim, self._ensemble_dim)]
        initializer = init([input_dim], new_dims,
                           default_seed=seeded_initializers.name_seed(name))
      return mtf.get_variable(self.mesh, name, shape,
                              initializer=initializer,
                              dtype=self.variable_dtype)

    if self.make_attention_vars:
      if not self.no_query:
        self.wq = make("q_fixup", self.q_shape, self.query_input_dim)
      if self.shared_kv:
        self.wkv = make("kv_fixup", self.k_shape, self.memory_input_dim)
      else:
        self.wk = make("k_fixup", self.k_shape, self.memory_input_dim)
        self.wv = make("v_fixup", self.v_shape, self.memory_input_dim)
    self.wo = make("o_fixup", self.o_shape, None,
                   initializer=tf.zeros_initializer())


@gin.configurable(module=_GIN_MODULE)
class DenseReluDenseFixup(transformer.TransformerLayer):
  """DenseReluDense with Fixup initialization and a scalar shift.

  wi starts from a variance scaling with scale 2 / num_blocks ("he",
  fan_in) or 1 / num_blocks ("glorot", fan_avg): two matrix products, so
  the standard deviation is scaled by num_blocks ** -0.5. wo starts at
  zero. A scalar "shift" (zero at first) is added to the hidden layer
  before wo.

  Attributes:
    hidden_size: the size of the hidden dimension "d_ff".
    dropout_rate: dropout on the hidden layer in training.
    activation: an activation or a list of them (see
      `mtf.layers.dense_product`).
    use_bias: whether the dense layers have biases.
    upproject_initializer: the initializer of wi (d_model -> d_ff).
    downproject_initializer: the initializer of wo (zeros).
  """

  def __init__(self,
               hidden_size=4096,
               dropout_rate=0.0,
               activation="relu",
               use_bias=False,
               default_init="he",
               init_distribution="uniform",
               num_blocks=gin.REQUIRED):
    """Records the hyperparameters (see the class docstring).

    Args:
      hidden_size: an integer.
      dropout_rate: a float.
      activation: an activation or a list of them.
      use_bias: a boolean.
      default_init: "he" or "glorot".
      init_distribution: "uniform" or "normal".
      num_blocks: an integer, the number of residual branches of the model.

    Raises:
      ValueError: default_init is unknown or num_blocks is not a positive
        integer.
    """
    if not isinstance(num_blocks, int) or num_blocks < 1:
      raise ValueError("DenseReluDenseFixup: num_blocks must be a positive "
                       f"integer, got {num_blocks!r}.")
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = activation
    self.use_bias = use_bias
    self.downproject_initializer = tf.zeros_initializer()
    self.upproject_initializer = _fixup_variance_scaling(
        default_init, init_distribution, he_scale=2.0 / num_blocks,
        glorot_scale=1.0 / num_blocks, caller="DenseReluDenseFixup")

  def call(self, context, x, losses=None):
    """Applies the layer to x [..., d_model]; variables wi*, shift, wo."""
    del losses
    io_channels = x.shape.dims[-1]
    hidden_channels = mtf.Dimension("d_ff", self.hidden_size)
    h = dense_product_fixup(
        x, reduced_dims=x.shape.dims[-1:], new_dims=hidden_channels,
        activation_functions=self.activation, use_bias=self.use_bias,
        variable_dtype=context.variable_dtype, name="wi",
        kernel_initializer=self.upproject_initializer,
        expert_dims=context.model.ensemble_dims)
    h = dense_layers.length_shared_dropout(h, context, self.dropout_rate)
    h += _as_scalar(get_single_scalar_bias(x, "shift"))
    return mtf.layers.dense(
        h, io_channels, use_bias=self.use_bias, activation=None,
        variable_dtype=context.variable_dtype,
        reduced_dims=h.shape.dims[-1:], name="wo",
        expert_dims=context.model.ensemble_dims,
        kernel_initializer=self.downproject_initializer)


@gin.configurable(module=_GIN_MODULE)
class SelfAttentionFixup(transformer_layers.SelfAttention):
  """Multi-head self-attention with Fixup initialization
  (`AttentionParamsFixup`)."""

  def __init__(self,
               num_blocks=gin.REQUIRED,
               default_init="glorot",
               init_distribution="uniform",
               **kwargs):
    """Records the hyperparameters.

    Args:
      num_blocks: an integer, the number of residual branches of the model.
      default_init: "glorot" or "he".
      init_distribution: "uniform" or "normal".
      **kwargs: SelfAttention's arguments. fold_scaling_into_initializer
        defaults to False here (Fixup needs it off).
    """
    kwargs.setdefault("fold_scaling_into_initializer", False)
    super().__init__(**kwargs)
    if default_init not in _INITS:
      raise ValueError(
          f"SelfAttentionFixup: unsupported default_init {default_init!r}; "
          f"only {_INITS} are supported.")
    self.num_blocks = num_blocks
    self.default_init = default_init
    self.init_distribution = init_distribution

  def make_params(self, context):
    """AttentionParamsFixup with this layer's heads (creates variables)."""
    return self_attention_layers._attention_params(  # pylint: disable=W0212
        AttentionParamsFixup, "SelfAttentionFixup", context, self.kv_dim,
        self.num_heads, self.num_memory_heads,
        shared_kv=self.shared_kv,
        combine_dims=self.combine_dims,
        keep_query_heads_dims=self.keep_query_heads_dims,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer,
        num_blocks=self.num_blocks,
        default_init=self.default_init,
        init_distribution=self.init_distribution)


@gin.configurable(module=_GIN_MODULE)
class EncDecAttentionFixup(transformer_layers.EncDecAttention):
  """Attention over the encoder's output, for Fixup models.

  As in the original, its parameters have the standard initialization (the
  class exists so that a Fixup model's gin file names one family).
  """


@gin.configurable(module=_GIN_MODULE)
def sublayer_fixup_scale(x, layer_stack, context):
  """Multiplies x by a trainable scalar "fixup_scale_weight" (one at first).

  A sublayer (see `transformer.LayerStack`), put after a Fixup layer.
  """
  del layer_stack
  return x * _sublayer_scalar(x, context, "fixup_scale_weight",
                              "single_scale", tf.constant_initializer(1.0))


@gin.configurable(module=_GIN_MODULE)
def sublayer_fixup_shift(x, layer_stack, context):
  """Adds a trainable scalar "fixup_bias" (zero at first) to x.

  A sublayer (see `transformer.LayerStack`), put before a Fixup layer.
  """
  del layer_stack
  return x + _sublayer_scalar(x, context, "fixup_bias", "single_bias",
                              tf.zeros_initializer())


def _sublayer_scalar(x, context, name, dim_name, initializer):
  """A sublayer's trainable scalar: the variable `name` [dim_name:1]."""
  variable = mtf.get_variable(
      x.mesh, name, shape=mtf.Shape([mtf.Dimension(dim_name, 1)]),
      dtype=context.variable_dtype, initializer=initializer)
  return _as_scalar(variable)


def _as_scalar(t):
  """A [size-1] variable as a scalar, which broadcasts to any shape."""
  return mtf.reshape(t, mtf.Shape([]))
