"""Convolutional Transformer layers over the sequence, with decoding state.

`Conv1D` holds what every convolution needs to decode one position at a
time: in "first_part" mode it records the last `filter_size` inputs before
the first decoded position, and in "incremental" mode it slides that window
by one position and returns it, so the layer convolves over exactly the
inputs a full pass would have seen. The layers convolve over the length
dimension with the model dimension as channels: a plain convolution
(`Conv1DLayer`), a depthwise-separable one (`SeparableConv1DLayer`), and
the lightweight and dynamic convolutions of Wu et al. 2019
(https://arxiv.org/abs/1901.10430), whose depthwise weights are softmaxed
over the filter width (`Conv1DLocalAttn` and its subclasses,
`LocalConvAttnBlock`).

These layers are re-exported by `transformer_layers` and registered with gin
under that module's name, as in the original. Like the original, they zero
the input where `context.inputs` is 0 (padding) outside incremental mode,
and do nothing to stop information crossing between packed examples.
"""

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"
# TF's own Glorot initializer, to tell whether a program replaced the name.
_TF_GLOROT_UNIFORM = tf.compat.v1.glorot_uniform_initializer


def _mask_padding(context, x):
  """x with positions where `context.inputs` is 0 zeroed (if inputs given)."""
  if context.inputs is None:
    return x
  return x * mtf.cast(mtf.not_equal(context.inputs, 0),
                      context.activation_dtype)


def _activate(activation, x):
  """Applies the mtf function named `activation` ("linear": none)."""
  if activation == "linear" or activation is None:
    return x
  fn = activation if callable(activation) else getattr(mtf, activation, None)
  if fn is None:
    raise ValueError(f"unknown activation {activation!r}: expected 'linear' "
                     "or the name of an mtf function such as 'relu'.")
  return fn(x)


class Conv1D(transformer.TransformerLayer):
  """Decoding-state helpers shared by the convolutional layers.

  A convolution with a fixed receptive field of `filter_size` positions
  ending at the current one needs, at each decoding step, the layer's
  inputs at the last `filter_size` positions. That window is the layer's
  decoding state: a tensor [<batch dims>, length:filter_size, d_model]
  whose last entry is the newest input.
  """

  def record_states_first_part_mode(self, context, x, filter_size,
                                    length_dim_name="length"):
    """Records the window of inputs just before `context.initial_position`.

    With i = context.initial_position (a Python int or an int32 Tensor of
    the batch dimensions) the state is x at positions i - filter_size ..
    i - 1, zero where that is before the start: e.g. with filter_size 3 and
    i = 2 it is [0, x0, x1]; with i = 0 it is all zeros.

    Args:
      context: a transformer.Context in "first_part" mode.
      x: the layer's input [<batch dims>, length, d_model].
      filter_size: an integer, the window size.
      length_dim_name: the name of the state's window dimension.
    """
    length_dim = x.shape.dims[-2]
    scratch_dim = mtf.Dimension("_conv_window", filter_size)
    wanted = (context.initial_position - filter_size +
              mtf.range(x.mesh, scratch_dim, dtype=tf.int32))
    select = mtf.cast(
        mtf.equal(mtf.range(x.mesh, length_dim, dtype=tf.int32), wanted),
        x.dtype)
    output_shape = mtf.Shape(x.shape.dims[:-2] + [scratch_dim] +
                             x.shape.dims[-1:])
    state = mtf.einsum([x, select], output_shape=output_shape,
                       reduced_dims=[length_dim])
    state = mtf.rename_dimension(state, scratch_dim.name, length_dim_name)
    context.record_new_states([state])

  def record_states_incremental_mode(self, context, x, filter_size,
                                     length_dim_name="length"):
    """Slides the recorded window by one position to end with x.

    Reads this layer's state (the inputs at the previous `filter_size`
    positions), drops the oldest, appends `x` and records the result as the
    new state for the next step.

    Args:
      context: a transformer.Context in "incremental" mode.
      x: the layer's input at the current position [<batch dims>, d_model].
      filter_size: an integer, the window size.
      length_dim_name: the name of the state's window dimension.

    Returns:
      the window [<batch dims>, length:filter_size, d_model], the layer's
      input over the receptive field of the current position.
    """
    filter_dim = mtf.Dimension(length_dim_name, filter_size)
    old_state = context.get_states(1)[0]
    last = mtf.constant(x.mesh, filter_size - 1,
                        shape=mtf.Shape(x.shape.dims[:-1]), dtype=tf.int32)
    window = self.update_state(old_state, x, last, filter_dim,
                               dtype=context.activation_dtype)
    context.record_new_states([window])
    return window

  def update_state(self, old_state, x, position, filter_dim, dtype):
    """The window shifted one position towards the start, x at `position`.

    [x(t-k), ..., x(t-1)] and x(t) -> [x(t-k+1), ..., x(t-1), x(t)] when
    `position` is the last index.

    Args:
      old_state: [<batch dims>, filter_dim, d_model].
      x: [<batch dims>, d_model].
      position: an int32 Tensor [<batch dims>], where x goes.
      filter_dim: the window's Dimension.
      dtype: the activation dtype.

    Returns:
      the new state, shaped like `old_state`.
    """
    shifted = mtf.shift(old_state, -1, filter_dim, wrap=False)
    return shifted + mtf.one_hot(position, filter_dim, dtype=dtype) * x


def _glorot_uniform_initializer():
  """The kernel initializer of Conv1DLayer, chosen when the layer is called.

  The original called tf.compat.v1.glorot_uniform_initializer() there, so a
  program (or test) that replaced that name got its own initializer: call
  a replacement the same way. TF's own gives None, the default of
  `mtf.get_variable`: Glorot uniform seeded by the variable name, so that
  every layout starts from the same kernel.
  """
  factory = tf.compat.v1.glorot_uniform_initializer
  return None if factory is _TF_GLOROT_UNIFORM else factory()


@gin.configurable(module=_GIN_MODULE)
class Conv1DLayer(Conv1D):
  """A 1-D convolution over the length, the model dimension as channels.

  Outside incremental mode this is a "SAME" convolution: the output at
  position t reads x[t - (k-1)//2 .. t + k//2]. In incremental mode, as in
  the original, it is a "VALID" convolution over the last k inputs
  x[t-k+1 .. t], so decoding matches a full pass only for filter_size 1;
  use `SeparableConv1DLayer` with max_relative_pos=0 for a causal
  convolution that decodes exactly.
  """

  def __init__(self, filter_size, output_size, activation="linear"):
    """Records the layer's hyperparameters.

    Args:
      filter_size: the kernel width, a positive integer.
      output_size: the number of output channels (the output's model
        dimension keeps its name).
      activation: "linear" (none) or the name of an mtf function applied
        to the output.
    """
    self._filter_size = filter_size
    self._output_size = output_size
    self._activation = activation

  def call(self, context, x, losses=None):
    """Applies the layer; kernel "conv2d/kernel" [fh:1, fw, input_dim,
    d_model]."""
    del losses
    if context.mode == transformer.FIRST_PART:
      self.record_states_first_part_mode(context, x, self.filter_size)
    if context.mode == transformer.INCREMENTAL:
      x = self.record_states_incremental_mode(context, x, self.filter_size)
      padding = "VALID"
    else:
      # The first part may hold partial sequences padded with zeros.
      x = _mask_padding(context, x)
      padding = "SAME"
    model_dim = x.shape.dims[-1]
    x = mtf.replace_dimensions(
        x, model_dim, mtf.Dimension("input_dim", model_dim.size))
    # An explicit name, so that the first-part and incremental calls of one
    # model share the kernel. A context without a variable_dtype (the
    # original never read it here) gets float32.
    output = mtf.layers.conv1d(
        x, output_dim=mtf.Dimension(model_dim.name, self._output_size),
        filter_size=self._filter_size, padding=padding,
        filter_initializer=_glorot_uniform_initializer(),
        variable_dtype=getattr(context, "variable_dtype", None),
        name="conv2d")
    if context.mode == transformer.INCREMENTAL:
      # The VALID convolution leaves one position: drop it.
      (one,) = [d for d in output.shape.dims if d.name == "length"]
      output = mtf.reduce_sum(output, reduced_dim=one)
    return _activate(self._activation, output)

  @property
  def filter_size(self):
    return self._filter_size


@gin.configurable(module=_GIN_MODULE)
class SeparableConv1DLayer(Conv1D):
  """A depthwise-separable 1-D convolution over the length.

  y[t] = pointwise(sum_r w_r * x[t + r] + b) for r in [min_relative_pos,
  max_relative_pos] (`mtf.layers.separable_conv1d`, both parts with a
  bias). With max_relative_pos <= 0 it is causal and incremental decoding
  gives the full pass's outputs.
  """

  def __init__(self,
               min_relative_pos,
               max_relative_pos,
               output_size,
               depthwise_filter_initializer_scale=1.0,
               pointwise_filter_initializer_scale=1.0,
               activation="linear"):
    """Records the layer's hyperparameters.

    Args:
      min_relative_pos: the smallest offset r the filter reads (inclusive).
      max_relative_pos: the largest offset r (inclusive); the filter size
        is max_relative_pos - min_relative_pos + 1.
      output_size: the number of output channels.
      depthwise_filter_initializer_scale: variance scale of the depthwise
        weights.
      pointwise_filter_initializer_scale: variance scale of the pointwise
        kernel.
      activation: "linear" (none) or the name of an mtf function applied
        to the output.
    """
    self._min_relative_pos = min_relative_pos
    self._max_relative_pos = max_relative_pos
    self._output_size = output_size
    self._depthwise_filter_initializer_scale = (
        depthwise_filter_initializer_scale)
    self._pointwise_filter_initializer_scale = (
        pointwise_filter_initializer_scale)
    self._activation = activation

  def call(self, context, x, losses=None, all_kernel_wts=None):
    """Applies the layer.

    Args:
      context: a transformer.Context.
      x: [<batch dims>, length, d_model], or [<batch dims>, d_model] in
        incremental mode.
      losses: unused.
      all_kernel_wts: optional list of filter_size Tensors used as the
        depthwise weights instead of variables (see Conv1DLocalAttn).

    Returns:
      a Tensor shaped like x with output_size channels.
    """
    del losses
    if context.mode == transformer.FIRST_PART:
      self.record_states_first_part_mode(context, x, self.filter_size)
    if context.mode == transformer.INCREMENTAL:
      x = self.record_states_incremental_mode(context, x, self.filter_size)
    else:
      x = _mask_padding(context, x)
    model_dim = x.shape.dims[-1]
    output = mtf.layers.separable_conv1d(
        x, output_dim=mtf.Dimension(model_dim.name, self._output_size),
        min_relative_pos=self._min_relative_pos,
        max_relative_pos=self._max_relative_pos,
        depthwise_filter_initializer_scale=(
            self._depthwise_filter_initializer_scale),
        pointwise_filter_initializer_scale=(
            self._pointwise_filter_initializer_scale),
        use_bias=True, kernel_depth_weights=all_kernel_wts,
        name="separable_conv1d")
    if context.mode == transformer.INCREMENTAL:
      # Only the window's last position is the current one.
      output = mtf.gather(output, self.filter_size - 1,
                          mtf.Dimension("length", self.filter_size))
    return _activate(self._activation, output)

  @property
  def filter_size(self):
    return self._max_relative_pos - self._min_relative_pos + 1


@gin.configurable(module=_GIN_MODULE)
class Conv1DLocalAttn(SeparableConv1DLayer):
  """A separable convolution whose depthwise weights are softmaxed over the
  filter width, like attention weights over a local window.

  For each filter position i, `get_kernel_wt` gives d_model /
  num_unique_depth_filters weights, repeated num_unique_depth_filters times
  along the channels; the weights of each channel are then normalised with
  a softmax over the filter positions. Subclasses say where the weights
  come from (variables or the input).
  """

  def __init__(self,
               min_relative_pos,
               max_relative_pos,
               output_size,
               depthwise_filter_initializer_scale=1.0,
               pointwise_filter_initializer_scale=1.0,
               activation="linear",
               num_unique_depth_filters=1):
    """Records the layer's hyperparameters (see SeparableConv1DLayer).

    Args:
      min_relative_pos, max_relative_pos, output_size,
      depthwise_filter_initializer_scale, pointwise_filter_initializer_scale,
      activation: as for SeparableConv1DLayer.
      num_unique_depth_filters: how many times the weights repeat along the
        channels; must divide output_size.

    Raises:
      ValueError: num_unique_depth_filters does not divide output_size.
    """
    super().__init__(min_relative_pos, max_relative_pos, output_size,
                     depthwise_filter_initializer_scale,
                     pointwise_filter_initializer_scale, activation)
    if output_size % num_unique_depth_filters:
      raise ValueError(
          f"{type(self).__name__}: num_unique_depth_filters="
          f"{num_unique_depth_filters} must divide output_size="
          f"{output_size}.")
    self._num_unique_depth_filters = num_unique_depth_filters

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i,
                    context, variable_dtype, master_dtype=tf.float32,
                    slice_dtype=tf.float32):
    """The depthwise weights of filter position i, with dims
    `repeated_kernel_dim` (and possibly those of x)."""
    raise NotImplementedError(
        f"{type(self).__name__} does not implement get_kernel_wt; use "
        "LightweightConv1DLocalAttn or DynamicConv1DLocalAttn.")

  def call(self, context, x, losses=None):
    """Applies the layer with softmax-normalised depthwise weights."""
    depth_dim = x.shape.dims[-1]
    if depth_dim.size % self._num_unique_depth_filters:
      raise mtf.ShapeError(
          f"{type(self).__name__}: num_unique_depth_filters="
          f"{self._num_unique_depth_filters} must divide the input's "
          f"{depth_dim}.")
    scale = self._depthwise_filter_initializer_scale or 1.0
    kernel_size = self.filter_size
    kernel_initializer = mtf.layers.VarianceScalingInitializer(
        scale=scale / kernel_size)
    repeated_kernel_dim = [mtf.Dimension(
        "repeated_kernel_dim",
        depth_dim.size // self._num_unique_depth_filters)]
    weights = []
    for i in range(kernel_size):
      w = self.get_kernel_wt(
          x, repeated_kernel_dim=repeated_kernel_dim,
          kernel_initializer=kernel_initializer, i=i, context=context,
          variable_dtype=context.variable_dtype, master_dtype=tf.float32,
          slice_dtype=tf.float32)
      w = mtf.concat([w] * self._num_unique_depth_filters,
                     "repeated_kernel_dim")
      weights.append(
          mtf.rename_dimension(w, "repeated_kernel_dim", depth_dim.name))
    stacked = mtf.stack(weights, "new_stack_dim")
    stack_dim = stacked.shape.get_dim_by_name("new_stack_dim")
    normalised = mtf.softmax(stacked, reduced_dim=stack_dim)
    return super().call(context, x, losses,
                        mtf.unstack(normalised, stack_dim))


@gin.configurable(module=_GIN_MODULE)
class LightweightConv1DLocalAttn(Conv1DLocalAttn):
  """Lightweight convolution: the depthwise weights are variables
  "lightwt_depthwise_dense_{i}/kernel", shared by all positions."""

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i,
                    context, variable_dtype, master_dtype=tf.float32,
                    slice_dtype=tf.float32):
    return mtf.layers.get_dense_kernel_weights(
        x, new_dims=[], reduced_dims=[], expert_dims=repeated_kernel_dim,
        kernel_initializer=kernel_initializer,
        name=f"lightwt_depthwise_dense_{i}", variable_dtype=variable_dtype,
        master_dtype=master_dtype, slice_dtype=slice_dtype)


@gin.configurable(module=_GIN_MODULE)
class DynamicConv1DLocalAttn(Conv1DLocalAttn):
  """Dynamic convolution: the depthwise weights at each position are a
  dense layer "dyn_conv_depthwise_dense_{i}" of the input there."""

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i,
                    context, variable_dtype, master_dtype=tf.float32,
                    slice_dtype=tf.float32):
    return mtf.layers.dense(
        x, new_dims=repeated_kernel_dim,
        reduced_dims=[context.model.model_dim], expert_dims=[],
        kernel_initializer=kernel_initializer,
        name=f"dyn_conv_depthwise_dense_{i}", variable_dtype=variable_dtype,
        master_dtype=master_dtype, slice_dtype=slice_dtype)


@gin.configurable(module=_GIN_MODULE)
class LocalConvAttnBlock(transformer.TransformerLayer):
  """A gated input projection, a lightweight or dynamic convolution and an
  output projection (the convolution block of arXiv 1901.10430).

  x -> (x W1) * sigmoid(x W2) ("local_conv_inp_0/1") -> convolution ->
  dense "local_conv_attn_op_projection".
  """

  def __init__(self,
               min_relative_pos,
               max_relative_pos,
               output_size,
               depthwise_filter_initializer_scale=1.0,
               pointwise_filter_initializer_scale=1.0,
               activation="linear",
               num_unique_depth_filters=1,
               attention_type="lightweight_conv"):
    """Builds the convolution layer.

    Args:
      min_relative_pos, max_relative_pos, output_size,
      depthwise_filter_initializer_scale, pointwise_filter_initializer_scale,
      activation, num_unique_depth_filters: as for Conv1DLocalAttn (the
        original drops num_unique_depth_filters here; it is passed on).
      attention_type: "lightweight_conv" or "dynamic_conv".

    Raises:
      NotImplementedError: another attention_type.
    """
    classes = {"lightweight_conv": LightweightConv1DLocalAttn,
               "dynamic_conv": DynamicConv1DLocalAttn}
    if attention_type not in classes:
      raise NotImplementedError(
          f"LocalConvAttnBlock: attention_type {attention_type!r} is not "
          f"implemented; expected one of {sorted(classes)}.")
    self.conv_local_attn_layer = classes[attention_type](
        min_relative_pos, max_relative_pos, output_size,
        depthwise_filter_initializer_scale,
        pointwise_filter_initializer_scale, activation,
        num_unique_depth_filters)

  def call(self, context, x, losses=None):
    """Applies the block."""
    model_dim = context.model.model_dim
    gated = mtf.layers.dense_product(
        x, reduced_dims=[model_dim], new_dims=[model_dim],
        activation_functions=["linear", "sigmoid"],
        variable_dtype=context.variable_dtype, name="local_conv_inp")
    y = self.conv_local_attn_layer.call(context, gated, losses)
    return mtf.layers.dense(
        y, reduced_dims=[model_dim], new_dims=[model_dim], activation=None,
        variable_dtype=context.variable_dtype,
        name="local_conv_attn_op_projection")
