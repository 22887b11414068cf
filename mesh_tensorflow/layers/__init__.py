"""Layers built from mtf operations: dense, layer norm, embeddings, losses.

Also the layers of its modules attention_layers, local_attention_layers,
conv_layers, conv_transpose_layers and residual_layers, re-exported here as
in the original, where all were in this one module.

Everything here is pure mtf code: it takes and returns mtf Tensors, creates
its variables with `mtf.get_variable` inside `tf.compat.v1.variable_scope`,
and so names them as the original Mesh TensorFlow did (e.g. "dense/kernel",
"layer_prepostprocess/layer_norm/layer_norm_scale").
"""

import functools
import random

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import configurable as configurable_lib
from mesh_tensorflow.layers import layer_helpers
from mesh_tensorflow.randomness import tf_initializers

# Attention and convolution/normalisation layers live in their own modules;
# they are part of `mtf.layers` as in the original.
# pylint: disable=wildcard-import
from mesh_tensorflow.layers.attention_layers import *
from mesh_tensorflow.layers.conv_layers import *
from mesh_tensorflow.layers.conv_transpose_layers import *
from mesh_tensorflow.layers.local_attention_layers import *
from mesh_tensorflow.layers.residual_layers import *
# pylint: enable=wildcard-import

# The helpers every layer module shares (layer_helpers.py), under the names
# they had here.
_variable_scope = layer_helpers.variable_scope
_name_seed = layer_helpers.name_seed
_as_list = layer_helpers.as_list


@configurable_lib.configurable
def unit_scaling_convention(value=False):
  """Whether layers follow the unit-scaling convention (default: no).

  Under the convention, weights start with unit variance and the outputs of
  contractions (`us_einsum`, hence `dense`) are divided by the square root of
  the product of the contracted dimensions' sizes: the scaling that keeps
  activations at RMS ~1 moves from the parameters to the activations, so
  optimizers see parameters of one scale.

  The original makes this function gin-configurable. Gin belongs to the
  Transformer package here: the function is marked
  `configurable_lib.configurable`, and the Transformer's gin bindings
  (`unit_scaling_convention.value = True`) reach every call, the core's
  included, without replacing it.

  Args:
    value: a boolean.

  Returns:
    value.
  """
  return value


def us_einsum(xs, *args, **kwargs):
  """`mtf.einsum(xs, *args, **kwargs)`, divided by the square root of the
  contracted size when `unit_scaling_convention()` is on.

  The contracted dimensions are those of the inputs that the output lacks.
  """
  y = mtf.einsum(xs, *args, **kwargs)
  if unit_scaling_convention():
    output_dims = set(y.shape.dims)
    reduced = {d for x in xs for d in x.shape.dims if d not in output_dims}
    y *= float(mtf.list_product(d.size for d in reduced)) ** -0.5
  return y


def dense(x, new_dims, reduced_dims=None, expert_dims=None, use_bias=True,
          activation=None, master_dtype=tf.float32, slice_dtype=tf.float32,
          variable_dtype=None, kernel_initializer=None, kernel_weights=None,
          name=None):
  """A dense layer: activation(einsum(x, kernel) + bias).

  Args:
    x: an mtf Tensor of shape [..., reduced_dims].
    new_dims: a Dimension or list of Dimensions of the output.
    reduced_dims: the Dimensions of `x` to contract. If omitted (deprecated),
      the last dimension of `x`, with a warning.
    expert_dims: optional Dimensions that index separate weights (experts);
      they must be dimensions of `x`.
    use_bias: whether to add a bias of shape expert_dims + new_dims
      (initialised to zeros).
    activation: optional fn(mtf Tensor) -> mtf Tensor.
    master_dtype: the variables' master dtype (deprecated: variable_dtype).
    slice_dtype: the variables' slice dtype (deprecated: variable_dtype).
    variable_dtype: an mtf.VariableDType; default (master_dtype,
      slice_dtype, x.dtype).
    kernel_initializer: a `DenseInitializer`, any initializer get_variable
      accepts (fn(shape, dtype) or a value), or None for
      `VarianceScalingInitializer()`.
    kernel_weights: optional mtf Tensor used as the kernel instead of a
      variable, of shape expert_dims + reduced_dims + new_dims.
    name: the variable scope. Without one, as in the original, the kernel
      and the bias each get a default scope: "dense/kernel" and
      "dense_1/bias" (then "dense_2/kernel", "dense_3/bias", ...).

  Returns:
    an mtf Tensor of shape [x dims other than reduced_dims] + new_dims.
  """
  new_dims = _as_list(new_dims)
  expert_dims = _as_list(expert_dims)
  if variable_dtype is None:
    variable_dtype = mtf.VariableDType(master_dtype, slice_dtype, x.dtype)
  if reduced_dims is None:
    logging.warning(
        "Deprecation warning - it is recommended to pass reduced_dims "
        "explicitly to mtf.layers.dense() so as not to depend on dimension "
        "order. To silence this warning, explicitly pass "
        "reduced_dims=x.shape.dims[-1:] (in scope %s)",
        tf.compat.v1.get_variable_scope().name)
    reduced_dims = x.shape.dims[-1:]
  reduced_dims = _as_list(reduced_dims)
  for d in reduced_dims:
    if d not in x.shape.dims:
      raise mtf.ShapeError(
          f"dense of {x.name} {x.shape}: reduced dimension {d} is not a "
          "dimension of the input.")
  # A reduced dimension named like a new one (of any size: e.g. a channels
  # dimension widened under its own name) would collide in the kernel:
  # rename it in the input first.
  new_names = {d.name for d in new_dims}
  renamed = {}
  for i, d in enumerate(reduced_dims):
    if d.name in new_names:
      tmp = mtf.Dimension("_" + d.name, d.size)
      x = mtf.rename_dimension(x, d.name, tmp.name)
      renamed[d] = reduced_dims[i] = tmp
  output_shape = mtf.Shape(
      [d for d in x.shape.dims if d not in reduced_dims] + new_dims)
  # As the original: the kernel and the bias each open a scope `name`, so
  # that without a name the kernel goes in "dense/" and the bias in
  # "dense_1/" (the next unnamed dense uses "dense_2/" and "dense_3/").
  with layer_helpers.one_earlier_scope(x.mesh, name, "dense"):
    if kernel_weights is None:
      # Looked up in this module at call time, as the original: tests and
      # layers may substitute the kernel by patching
      # get_dense_kernel_weights.
      kernel_weights = get_dense_kernel_weights(
          x, new_dims, reduced_dims, expert_dims, kernel_initializer,
          name=name, variable_dtype=variable_dtype)
    for d, tmp in renamed.items():
      # A kernel given, or substituted, with the reduced dimension's own
      # name (the original's mocked tests build [d_model:6, d_model:2]).
      if (d in kernel_weights.shape.dims and
          tmp not in kernel_weights.shape.dims):
        kernel_weights = mtf.replace_dimensions(kernel_weights, d, tmp)
    with _variable_scope(x.mesh, name, "dense"):
      kernel_weights = mtf.cast(kernel_weights, x.dtype)
      y = us_einsum([x, kernel_weights], output_shape)
      if use_bias:
        b = mtf.get_variable(x.mesh, "bias",
                             mtf.Shape(expert_dims + new_dims),
                             initializer=tf.zeros_initializer(),
                             dtype=variable_dtype)
        y += b
      if activation is not None:
        y = activation(y)
      return y


def _kernel_variable(x, new_dims, reduced_dims, expert_dims,
                     kernel_initializer, variable_dtype):
  """The variable "kernel" of shape expert_dims + reduced_dims + new_dims."""
  if kernel_initializer is None:
    kernel_initializer = VarianceScalingInitializer()
  if isinstance(kernel_initializer, VarianceScalingInitializer):
    kernel_initializer = kernel_initializer(
        reduced_dims, new_dims, default_seed=_name_seed("kernel"))
  elif isinstance(kernel_initializer, DenseInitializer):
    kernel_initializer = kernel_initializer(reduced_dims, new_dims)
  return mtf.get_variable(
      x.mesh, "kernel", mtf.Shape(expert_dims + reduced_dims + new_dims),
      initializer=kernel_initializer, dtype=variable_dtype)


def get_dense_kernel_weights(x, new_dims, reduced_dims, expert_dims,
                             kernel_initializer, name=None,
                             variable_dtype=None, master_dtype=tf.float32,
                             slice_dtype=tf.float32):
  """The kernel `dense` would create, f"{name}/kernel", cast to x.dtype.

  Useful to share one kernel between layers (pass it as `kernel_weights`).
  Arguments are as for `dense`.
  """
  new_dims = _as_list(new_dims)
  if variable_dtype is None:
    variable_dtype = mtf.VariableDType(master_dtype, slice_dtype, x.dtype)
  with _variable_scope(x.mesh, name, "dense"):
    w = _kernel_variable(x, new_dims, _as_list(reduced_dims),
                         _as_list(expert_dims), kernel_initializer,
                         variable_dtype)
  return mtf.cast(w, x.dtype)


def dense_product(x, reduced_dims, new_dims, activation_functions="relu",
                  name="dense_product", **kwargs):
  """Element-wise product of several dense layers (GLU-style).

  E.g. activation_functions=["linear", "sigmoid"] is a gated linear unit
  and ["gelu", "linear"] a GEGLU.

  Args:
    x: an mtf Tensor.
    reduced_dims: Dimensions of `x` to contract.
    new_dims: the output Dimensions.
    activation_functions: one or a list of: a callable, the name of an mtf
      function (e.g. "relu"), or None / "linear" for no activation.
    name: the variable scope; with several factors, factor i uses
      f"{name}_{i}".
    **kwargs: more arguments for `dense`.

  Returns:
    an mtf Tensor.
  """
  if not isinstance(activation_functions, (list, tuple)):
    activation_functions = [activation_functions]
  factors = []
  for i, activation in enumerate(activation_functions):
    if activation == "linear":
      activation = None
    elif isinstance(activation, str):
      activation = getattr(mtf, activation)
    factors.append(dense(
        x, new_dims, reduced_dims=reduced_dims, activation=activation,
        name=f"{name}_{i}" if len(activation_functions) > 1 else name,
        **kwargs))
  return functools.reduce(mtf.multiply, factors)


class DenseInitializer:
  """An initializer for `dense`: called with (reduced_dims, new_dims), it
  returns an initializer fn(shape, dtype) for `mtf.get_variable`."""

  def __call__(self, reduced_dims, new_dims):
    raise NotImplementedError("DenseInitializer subclasses define __call__.")


@configurable_lib.configurable
class VarianceScalingInitializer(DenseInitializer):
  """Variance-scaling initialisation with fans taken from the dimensions.

  stddev = sqrt(scale / n), n = the product of the reduced dimensions'
  sizes ("fan_in"), of the new dimensions' sizes ("fan_out") or their
  average ("fan_avg"); the dimension order of the kernel does not matter.
  "normal" draws from a normal truncated at two standard deviations (as
  tf.compat.v1.truncated_normal_initializer(stddev)), "uniform" from
  [-sqrt(3) stddev, sqrt(3) stddev].
  """

  def __init__(self, scale=1.0, mode="fan_in", distribution="normal",
               seed=None):
    self.scale = scale
    self.mode = mode.lower()
    self.distribution = distribution.lower()
    self.seed = seed
    if self.mode not in ("fan_in", "fan_out", "fan_avg"):
      raise ValueError(f"VarianceScalingInitializer: invalid mode {mode!r}; "
                       "expected 'fan_in', 'fan_out' or 'fan_avg'.")
    if self.distribution not in ("normal", "uniform"):
      raise ValueError(
          f"VarianceScalingInitializer: invalid distribution "
          f"{distribution!r}; expected 'normal' or 'uniform'.")

  def stddev(self, reduced_dims, new_dims):
    """sqrt(scale / fan); under `unit_scaling_convention()`, sqrt(scale).

    Raises:
      ValueError: unit scaling is on and the mode is not "fan_in" (the
        convention divides activations by the contracted, i.e. fan-in,
        size).
    """
    if unit_scaling_convention():
      if self.mode != "fan_in":
        raise ValueError(
            f"VarianceScalingInitializer(mode={self.mode!r}): the "
            "unit-scaling convention only works with mode 'fan_in'.")
      return self.scale ** 0.5
    fan_in = mtf.list_product(d.size for d in reduced_dims)
    fan_out = mtf.list_product(d.size for d in new_dims)
    fan = {"fan_in": fan_in, "fan_out": fan_out,
           "fan_avg": (fan_in + fan_out) / 2.0}[self.mode]
    return (self.scale / max(1.0, fan)) ** 0.5

  def __call__(self, reduced_dims, new_dims, default_seed=None):
    """The initializer fn(shape, dtype) for a kernel with these dims.

    Its seed is `seed`, else `default_seed` (`dense` passes one derived from
    the variable's name, so every layout and trace starts from the same
    kernel), else a random one fixed now: the value is the same however
    often it is evaluated.
    """
    stddev = self.stddev(reduced_dims, new_dims)
    seed = self.seed
    if seed is None:
      seed = default_seed if default_seed is not None else random.randrange(
          2**31)
    # TF's initializers, as the original's; see tf_initializers.
    if self.distribution == "normal":
      return tf_initializers.seeded("truncated_normal_initializer", seed,
                                    stddev=stddev)
    limit = stddev * 3.0 ** 0.5
    return tf_initializers.seeded("random_uniform_initializer", seed,
                                  minval=-limit, maxval=limit)


def layer_norm(x, dim, epsilon=1e-6, name="layer_prepostprocess"):
  """Layer normalisation over `dim`, with a scale (ones) and bias (zeros).

  Variables: f"{name}/layer_norm/layer_norm_scale" and ".../layer_norm_bias",
  of shape [dim].
  """
  with tf.compat.v1.variable_scope(name + "/layer_norm"):
    scale = mtf.get_variable(x.mesh, "layer_norm_scale", mtf.Shape([dim]),
                             initializer=tf.ones_initializer(),
                             activation_dtype=x.dtype)
    bias = mtf.get_variable(x.mesh, "layer_norm_bias", mtf.Shape([dim]),
                            initializer=tf.zeros_initializer(),
                            activation_dtype=x.dtype)
    reduced_shape = x.shape - dim
    mean = mtf.reduce_mean(x, output_shape=reduced_shape)
    variance = mtf.reduce_mean(mtf.square(x - mean),
                               output_shape=reduced_shape)
    norm_x = (x - mean) * mtf.rsqrt(variance + epsilon)
    return norm_x * scale + bias


def embedding_weights(mesh, vocab_dim, output_dim, variable_dtype,
                      name="embedding", ensemble_dim=None, initializer=None):
  """The embedding variable `name`: [ensemble_dim,] vocab_dim, output_dim.

  The default initializer is N(0, 1), seeded by the variable's scoped name
  so that every layout and every trace starts from the same table.
  """
  shape = mtf.Shape([vocab_dim, output_dim])
  if ensemble_dim is not None:
    shape = mtf.Shape([ensemble_dim]) + shape
  if initializer is None:
    initializer = tf_initializers.seeded("random_normal_initializer",
                                         _name_seed(name), stream=1)
  return mtf.get_variable(mesh, name, shape, dtype=variable_dtype,
                          initializer=initializer)


def embedding(indices, vocab_dim, output_dim, variable_dtype,
              name="embedding"):
  """Looks up integer `indices` in a new embedding variable `name`."""
  weights = embedding_weights(indices.mesh, vocab_dim, output_dim,
                              variable_dtype, name)
  return mtf.gather(weights, indices, vocab_dim)


def softmax_cross_entropy_with_logits(logits, targets, vocab_dim,
                                      z_loss=0.0):
  """Per-example softmax cross-entropy, plus z_loss * log(Z)^2.

  Args:
    logits: a float mtf Tensor with `vocab_dim`.
    targets: hard targets (an integer Tensor with the dimensions of `logits`
      other than `vocab_dim`, values in [0, vocab_dim.size)) or soft targets
      (a float Tensor with the dimensions of `logits`, summing to one over
      `vocab_dim`).
    vocab_dim: the class Dimension.
    z_loss: coefficient of log(Z)^2, Z the partition function (e.g. 1e-4):
      keeps logits near normalised log-probabilities.

  Returns:
    an mtf Tensor of shape logits.shape - vocab_dim.

  Raises:
    ShapeError: the dimensions do not match.
  """
  if vocab_dim not in logits.shape.dims:
    raise mtf.ShapeError(
        f"softmax_cross_entropy_with_logits: vocab_dim {vocab_dim} is not a "
        f"dimension of logits {logits.name} {logits.shape}.")
  if targets.dtype.is_integer:
    if set(targets.shape.dims) != set(logits.shape.dims) - {vocab_dim}:
      raise mtf.ShapeError(
          f"softmax_cross_entropy_with_logits with hard targets: targets "
          f"{targets.shape} must have the dimensions of logits "
          f"{logits.shape} other than vocab_dim {vocab_dim}.")
    targets = mtf.one_hot(targets, vocab_dim, dtype=logits.dtype)
  elif set(targets.shape.dims) != set(logits.shape.dims):
    raise mtf.ShapeError(
        f"softmax_cross_entropy_with_logits with soft targets: targets "
        f"{targets.shape} must have the dimensions of logits "
        f"{logits.shape}.")
  log_z = mtf.reduce_logsumexp(logits, vocab_dim)
  log_softmax = logits - log_z
  loss = mtf.negative(
      mtf.reduce_sum(log_softmax * targets, reduced_dim=vocab_dim))
  if z_loss != 0:
    loss += z_loss * mtf.square(log_z)
  return loss


def sigmoid_cross_entropy_with_logits(logits, targets):
  """Element-wise sigmoid cross-entropy, computed stably.

  Raises:
    ShapeError: logits and targets differ in shape.
  """
  if logits.shape != targets.shape:
    raise mtf.ShapeError(
        f"sigmoid_cross_entropy_with_logits: logits {logits.shape} and "
        f"targets {targets.shape} must have the same shape.")
  x, z = logits, targets
  return mtf.relu(x) - x * z + mtf.log(1.0 + mtf.exp(-mtf.abs(x)))


def weights_nonzero(targets, dtype=tf.float32):
  """1 where `targets` is nonzero, else 0, in `dtype`."""
  def fn(x):
    return tf.cast(tf.not_equal(x, 0), dtype)
  return mtf.cwise(fn, [targets], output_dtype=dtype, name="weights_nonzero")


def dense_relu_dense(x, hidden_channels, is_training=False, dropout=0.0,
                     dropout_broadcast_dims=None, master_dtype=tf.float32,
                     slice_dtype=tf.float32, name=None):
  """relu(x wi) wo, without biases; the output has x's shape.

  Variables: f"{name}/wi/kernel" [io, hidden] and f"{name}/wo/kernel"
  [hidden, io], where io is the last dimension of `x`.

  Args:
    x: an mtf Tensor whose last dimension is the channels.
    hidden_channels: the hidden Dimension.
    is_training: dropout is applied only when training.
    dropout: the rate of dropout on the hidden layer.
    dropout_broadcast_dims: Dimensions over which the dropout mask is shared.
    master_dtype, slice_dtype: the variables' dtypes.
    name: the variable scope; default "dense_relu_dense" (made unique).

  Returns:
    an mtf Tensor of x's shape.
  """
  with _variable_scope(x.mesh, name, "dense_relu_dense"):
    io_channels = x.shape.dims[-1]
    h = dense(x, hidden_channels, reduced_dims=[io_channels], use_bias=False,
              activation=mtf.relu, master_dtype=master_dtype,
              slice_dtype=slice_dtype, name="wi")
    if is_training and dropout != 0.0:
      h = mtf.dropout(h, rate=dropout,
                      noise_shape=h.shape - _as_list(dropout_broadcast_dims))
    return dense(h, io_channels, reduced_dims=[hidden_channels],
                 use_bias=False, master_dtype=master_dtype,
                 slice_dtype=slice_dtype, name="wo")


def _depthwise_conv1d_hack(x, depth_dim, length_dim, min_relative_pos=-1,
                           max_relative_pos=1, name=None, use_bias=True,
                           initializer_scale=1.0, kernel_depth_weights=None):
  """A depthwise 1-D convolution as a sum of shifted, scaled copies of x.

  y[i, c] = sum_r w_r[c] * x[i + r, c] (+ bias[c]) for r in
  [min_relative_pos, max_relative_pos], zero outside the sequence. Each w_r
  is the kernel of a `dense` layer "depthwise_dense_{k}" with expert
  dimension `depth_dim` (only the first has a bias), or
  `kernel_depth_weights[k]`.
  """
  kernel_size = max_relative_pos - min_relative_pos + 1
  if kernel_size < 1:
    raise ValueError(
        f"separable_conv1d: max_relative_pos {max_relative_pos} is below "
        f"min_relative_pos {min_relative_pos}.")
  if kernel_depth_weights is not None and len(
      kernel_depth_weights) != kernel_size:
    raise ValueError(
        f"separable_conv1d: {len(kernel_depth_weights)} kernel_depth_weights "
        f"for a kernel of size {kernel_size}.")
  ret = None
  with _variable_scope(x.mesh, name, "depthwise_conv_hack"):
    for i in range(kernel_size):
      relative_pos = min_relative_pos + i
      shifted = mtf.shift(x, -relative_pos, length_dim, wrap=False)
      term = dense(
          shifted, new_dims=[], reduced_dims=[], expert_dims=[depth_dim],
          kernel_weights=(kernel_depth_weights[i]
                          if kernel_depth_weights is not None else None),
          name=f"depthwise_dense_{i}", use_bias=use_bias and i == 0,
          kernel_initializer=VarianceScalingInitializer(
              scale=initializer_scale / kernel_size))
      ret = term if ret is None else ret + term
  return ret


def separable_conv1d(x, output_dim, min_relative_pos=-1, max_relative_pos=1,
                     depthwise_filter_initializer_scale=1.0,
                     pointwise_filter_initializer_scale=1.0, name=None,
                     use_bias=True, kernel_depth_weights=None):
  """A 1-D convolution with a separable filter (depthwise, then pointwise).

  The depthwise part is y[i, c] = sum_r w_r[c] * x[i + r, c] + b[c] for r
  in [min_relative_pos, max_relative_pos] (zero past the ends of the
  sequence, which may be split across the mesh); the pointwise part is a
  `dense` layer from the channels to `output_dim`. Variables (default scope
  "separable_conv1d"): "depthwise_conv_hack/depthwise_dense_{k}/kernel"
  [channels], "depthwise_conv_hack/depthwise_dense_0/bias",
  "pointwise_dense/kernel" [channels, output_dim] and "pointwise_dense/bias".

  Args:
    x: an mtf Tensor [batch..., length, channels].
    output_dim: the Dimension of the output channels.
    min_relative_pos: the smallest offset r the filter reads (inclusive).
    max_relative_pos: the largest offset r (inclusive); the filter size is
      max_relative_pos - min_relative_pos + 1.
    depthwise_filter_initializer_scale: variance scale of the depthwise
      weights (divided by the filter size); None means 1.0.
    pointwise_filter_initializer_scale: variance scale of the pointwise
      kernel; None means 1.0.
    name: the variable scope.
    use_bias: whether both parts have a bias.
    kernel_depth_weights: optional list of one mtf Tensor [channels] per
      offset, used instead of the depthwise variables.

  Returns:
    an mtf Tensor [batch..., length, output_dim].
  """
  if x.shape.ndims < 2:
    raise mtf.ShapeError(
        f"separable_conv1d of {x.name} {x.shape}: the input needs a length "
        "and a channels dimension.")
  if depthwise_filter_initializer_scale is None:
    depthwise_filter_initializer_scale = 1.0
  if pointwise_filter_initializer_scale is None:
    pointwise_filter_initializer_scale = 1.0
  length_dim, depth_dim = x.shape.dims[-2:]
  with _variable_scope(x.mesh, name, "separable_conv1d"):
    depthwise = _depthwise_conv1d_hack(
        x, depth_dim=depth_dim, length_dim=length_dim,
        min_relative_pos=min_relative_pos, max_relative_pos=max_relative_pos,
        use_bias=use_bias,
        initializer_scale=depthwise_filter_initializer_scale,
        kernel_depth_weights=kernel_depth_weights,
        # Named, not a default made unique: a second call under the same
        # name (e.g. a decoding step) reuses the depthwise weights, as
        # TF1's re-entered variable scopes did in the original.
        name="depthwise_conv_hack")
    return dense(
        depthwise, new_dims=[output_dim], reduced_dims=[depth_dim],
        name="pointwise_dense", use_bias=use_bias,
        kernel_initializer=VarianceScalingInitializer(
            scale=pointwise_filter_initializer_scale))
