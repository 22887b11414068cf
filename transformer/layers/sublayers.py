"""The sublayer functions a `LayerStack` runs around and between its layers.

A sublayer is a function `(x, layer_stack, context) -> y`. A LayerStack runs
its `sublayers_initial` once on the embeddings, its `sublayers_per_layer`
for every layer (one of them, `sublayer_call_layer`, calls the layer), and
its `sublayers_final` on the last output. The usual pipeline (defaults.gin)
is dropout; then per layer rms_norm, call_layer, dropout, residual; then
rms_norm, dropout.

While a layer's sublayers run, `context.current_layer` is the layer and
`context.current_layer_input` its input (what `sublayer_residual` adds).
These functions are registered with gin under the original's module,
`mesh_tensorflow.transformer.transformer`, and re-exported from it.
"""

import math

import gin
import mesh_tensorflow as mtf
import tensorflow as tf

_MODULE = "mesh_tensorflow.transformer.transformer"


@gin.configurable(module=_MODULE)
def sublayer_call_layer(x, layer_stack, context):
  """Calls `context.current_layer` on `x` (padding zeroed first).

  Its variables live under the layer's class name, e.g.
  `layer_000/SelfAttention/q`.
  """
  x = sublayer_mask_padding(x, layer_stack, context)
  layer = context.current_layer
  with tf.compat.v1.variable_scope(type(layer).__name__):
    return layer.call(context, x)


@gin.configurable(module=_MODULE)
def sublayer_mask_padding(x, layer_stack, context):
  """Zeroes `x` where `context.sequence_id` is 0 (padding).

  Without this, large values computed in padding positions can leak into
  real positions through later layers. A `sequence_id` that is not a
  Tensor (None, or the int 1 meaning "no padding") leaves `x` as is.
  """
  del layer_stack
  if isinstance(context.sequence_id, mtf.Tensor):
    return x * mtf.cast(mtf.not_equal(context.sequence_id, 0),
                        context.activation_dtype)
  return x


def _model_dim_scale(context, shape_prefix=None):
  """A ones-initialized scale over ensemble dims + `shape_prefix`."""
  dims = list(context.model.ensemble_dims) + list(shape_prefix or [])
  return mtf.get_variable(
      context.mesh, "scale", mtf.Shape(dims),
      initializer=tf.ones_initializer(), dtype=context.variable_dtype)


@gin.configurable(module=_MODULE)
def sublayer_rms_norm(x, layer_stack, context, epsilon=1e-6, name="rms_norm"):
  """RMS normalization over d_model with a learned scale (no bias, no mean).

  y = x / sqrt(mean(x^2 over d_model) + epsilon) * scale; the variable is
  `<name>/scale`, shaped [<ensemble>, d_model].
  """
  del layer_stack
  model_dim = context.model.model_dim
  with tf.compat.v1.variable_scope(name):
    scale = _model_dim_scale(context, [model_dim])
    variance = mtf.reduce_mean(mtf.square(x), reduced_dim=model_dim)
  return x * mtf.rsqrt(variance + epsilon) * scale


@gin.configurable(module=_MODULE)
def sublayer_legacy_rms_norm(x, layer_stack, context):
  """`sublayer_rms_norm` named "layer_norm", as old checkpoints have it."""
  return sublayer_rms_norm(x, layer_stack, context, name="layer_norm")


@gin.configurable(module=_MODULE)
def sublayer_legacy_final_rms_norm(x, layer_stack, context):
  """`sublayer_rms_norm` named "final_layer_norm", as old checkpoints
  have it."""
  return sublayer_rms_norm(x, layer_stack, context, name="final_layer_norm")


@gin.configurable(module=_MODULE)
def sublayer_rms_norm_subsampled(x, layer_stack, context, percentage=100.,
                                 epsilon=1e-6):
  """RMS normalization whose mean square is taken over the first
  `percentage` percent of d_model only (cheaper when d_model is large).

  The variable is `layer_norm_subsampled/scale` [<ensemble>, d_model].
  """
  del layer_stack
  model_dim = context.model.model_dim
  with tf.compat.v1.variable_scope("layer_norm_subsampled"):
    scale = _model_dim_scale(context, [model_dim])
    size = int(math.ceil(model_dim.size * percentage / 100))
    if not 0 < size <= model_dim.size:
      raise ValueError(
          f"sublayer_rms_norm_subsampled: percentage {percentage} of "
          f"{model_dim} leaves {size} elements; give a value in (0, 100].")
    sub = mtf.slice(x, 0, size, model_dim.name)
    sub_dim = mtf.Dimension(model_dim.name, size)
    variance = mtf.reduce_mean(mtf.square(sub), reduced_dim=sub_dim)
  return x * mtf.rsqrt(variance + epsilon) * scale


@gin.configurable(module=_MODULE)
def sublayer_scale_norm(x, layer_stack, context, epsilon=1e-6,
                        name="scale_norm"):
  """ScaleNorm (Nguyen & Salazar 2019): RMS normalization with one learned
  scalar (per ensemble member) instead of a scale per d_model element.

  The variable is `<name>/scale`, shaped [<ensemble>].
  """
  del layer_stack
  model_dim = context.model.model_dim
  with tf.compat.v1.variable_scope(name):
    scale = _model_dim_scale(context)
    variance = mtf.reduce_mean(mtf.square(x), reduced_dim=model_dim)
  return x * mtf.rsqrt(variance + epsilon) * scale


@gin.configurable(module=_MODULE)
def sublayer_residual(x, layer_stack, context):
  """Adds the current layer's input (the residual connection)."""
  del layer_stack
  return x + context.current_layer_input


def _dropout_noise_shape(context):
  # One mask per example and d_model element, shared by all positions.
  return mtf.Shape(list(context.batch_dims) + [context.model.model_dim])


@gin.configurable(module=_MODULE)
def sublayer_dropout(x, layer_stack, context, dropout_rate=0.0):
  """Dropout in training; the mask is broadcast over the length dimension
  (each example drops the same d_model elements at every position)."""
  del layer_stack
  if context.train and dropout_rate > 0:
    return mtf.dropout(x, rate=dropout_rate,
                       noise_shape=_dropout_noise_shape(context))
  return x


@gin.configurable(module=_MODULE)
def sublayer_annealed_dropout(x, layer_stack, context, init_dropout_rate=0.0,
                              start_step=None, end_step=None):
  """Dropout whose rate falls linearly from `init_dropout_rate` at
  `start_step` to 0 at `end_step` of training (see
  `mtf.layers.annealed_dropout`); the mask is broadcast over length."""
  del layer_stack
  if context.train and init_dropout_rate > 0:
    if start_step is None or end_step is None:
      raise ValueError(
          "sublayer_annealed_dropout: give start_step and end_step with "
          f"init_dropout_rate={init_dropout_rate}.")
    return mtf.layers.annealed_dropout(
        x, context.train, start_step, end_step, init_rate=init_dropout_rate,
        noise_shape=_dropout_noise_shape(context))
  return x


@gin.configurable(module=_MODULE)
def sublayer_clip_activation_gradient(x, layer_stack, context, rms_norm=1.0):
  """Identity whose gradient is clipped to RMS <= `rms_norm`
  (`mtf.layers.clip_activation_gradient`)."""
  del layer_stack, context
  return mtf.layers.clip_activation_gradient(x, rms_norm)


@gin.configurable(module=_MODULE)
def sublayer_legacy_dropout(x, layer_stack, context):
  """`sublayer_dropout` at the LayerStack's legacy `dropout_rate`."""
  return sublayer_dropout(x, layer_stack, context,
                          dropout_rate=layer_stack.dropout_rate)


@gin.configurable(module=_MODULE)
def sublayer_rezero(x, layer_stack, context, initial_value=0.0):
  """ReZero (Bachlechner et al. 2020): multiplies by a learned scalar
  `rezero_weight` that starts at `initial_value` (the residual is a separate
  sublayer)."""
  del layer_stack
  weight = mtf.get_variable(
      x.mesh, "rezero_weight", mtf.Shape(list(context.model.ensemble_dims)),
      dtype=context.variable_dtype,
      initializer=tf.constant_initializer(initial_value))
  return x * weight


@gin.configurable(module=_MODULE)
def sublayer_true_layer_norm(x, layer_stack, context, epsilon=1e-6):
  """Layer normalization with mean, scale and bias (`mtf.layers.layer_norm`)
  over d_model, under the scope `true_layer_norm`."""
  del layer_stack
  with tf.compat.v1.variable_scope("true_layer_norm"):
    return mtf.layers.layer_norm(x, context.model.model_dim, epsilon)
