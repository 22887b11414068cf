"""The Universal Transformer (https://arxiv.org/abs/1807.03819) as a stack.

`UTLayerStack` applies one block of layers again and again, its weights
shared across steps: a fixed number of times ("basic"), with a highway gate
between steps ("highway"), or with Adaptive Computation Time ("act": each
position halts when its accumulated halting probability passes
1 - act_epsilon, and the output is the halting-weighted mix of its states).
Timing signals tell the steps apart. It follows the Universal Transformer
of tensor2tensor, as the original did, and is registered with gin under
the original's module, `mesh_tensorflow.transformer.universal_transformer`.

Where this differs from the original, whose code had these bugs:
`add_position_timing_signal` adds the position timing signal (the original
never called `add_position_timing_signal_func`); `get_timing_signal_1d`
returns [length, channels] (the original could not run); the "sinusoid"
step timing signal exists; the concat projection back to d_model contracts
only the channels; "dense_relu_dense" gate layers apply the activation;
ACT keeps one halting probability per position ([batch, length]) where the
original kept equal copies along d_model, and the learned step embedding
of ACT's last step (act_max_steps + 1 steps are run) is that of step
act_max_steps - 1 (the original indexed past the table's end).
"""

import contextlib
import math

import gin
import mesh_tensorflow as mtf
import numpy as np
import tensorflow as tf

from mesh_tensorflow.transformer.layers import seeded_initializers
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.universal_transformer"
_RECURRENCE_TYPES = ("act", "basic", "highway")


@gin.configurable(module=_GIN_MODULE)
class UTLayerStack(transformer.TransformerLayer):
  """A stack of layers for the Universal Transformer (see the module).

  Each step runs `num_inrecurrence_layers` times through `layers` (pre-norm
  residual blocks, like a legacy LayerStack: layer norm, layer, dropout,
  residual), after adding the timing signals. Variables are created once
  and reused at every step, except the gate and pondering dense layers,
  which (as in the original) get new variables at each step ("dense",
  "dense_1", ...).
  """

  def __init__(
      self,
      layers,
      dropout_rate=0.0,
      norm_epsilon=1e-6,
      num_vanilla_transformer_layers=2,
      couple_carry_transform_gates=True,
      act_type=gin.REQUIRED,
      recurrence_type=gin.REQUIRED,
      act_max_steps=gin.REQUIRED,
      act_epsilon=gin.REQUIRED,
      num_rec_steps=gin.REQUIRED,
      num_inrecurrence_layers=gin.REQUIRED,
      position_start_index=gin.REQUIRED,
      add_or_concat_timing_signal=gin.REQUIRED,
      step_timing_signal_type=gin.REQUIRED,
      add_position_timing_signal=gin.REQUIRED,
      add_step_timing_signal=gin.REQUIRED,
      mix_with_transformer_before_ut=gin.REQUIRED,
      mix_with_transformer_after_ut=gin.REQUIRED,
      gates_inputs=gin.REQUIRED,
      gate_ffn_layer=gin.REQUIRED,
      use_gated_transformer=gin.REQUIRED,
      gating_type=gin.REQUIRED,
  ):
    """Creates a UTLayerStack.

    Args:
      layers: a list of TransformerLayer (one step's block).
      dropout_rate: a float: dropout on the stack's input, each layer's
        output and the final output, in training.
      norm_epsilon: a float, the layer norms' epsilon.
      num_vanilla_transformer_layers: how many times the block runs as a
        plain Transformer before and/or after the recurrence.
      couple_carry_transform_gates: "highway": the carry gate is one minus
        the transform gate (else its own dense layer).
      act_type: "act": "basic", "accumulated" (states are summed, weighted,
        instead of mixed), "global" (one halting probability per example)
        or "random" (random halting probabilities).
      recurrence_type: "act", "basic" or "highway".
      act_max_steps: "act": the steps after the first (act_max_steps + 1
        are run).
      act_epsilon: "act": a position halts above 1 - act_epsilon.
      num_rec_steps: "basic" and "highway": the number of steps.
      num_inrecurrence_layers: how many times each step runs the block.
      position_start_index: the position signal's first position: None or
        0, "random" or "step" (moved along with the step).
      add_or_concat_timing_signal: "add" the timing signals to the state,
        or "concat" them and project back to d_model.
      step_timing_signal_type: "learned" or "sinusoid".
      add_position_timing_signal: a boolean.
      add_step_timing_signal: a boolean.
      mix_with_transformer_before_ut: a boolean (see
        num_vanilla_transformer_layers).
      mix_with_transformer_after_ut: a boolean.
      gates_inputs: "highway": what the gates see, any of "s" (the state),
        "t" (the transformed state) and "i" (the stack's input), e.g. "st".
      gate_ffn_layer: "dense" or "dense_relu_dense".
      use_gated_transformer: a boolean: each layer's output goes through
        `gating` before the residual.
      gating_type: "highway" or "gru" (with use_gated_transformer).

    Raises:
      ValueError: recurrence_type, act_type, gating_type,
        add_or_concat_timing_signal or step_timing_signal_type is unknown.
    """
    _check_choice("recurrence_type", recurrence_type, _RECURRENCE_TYPES)
    if recurrence_type == "act":
      _check_choice("act_type", act_type,
                    ("basic", "accumulated", "global", "random"))
    if use_gated_transformer:
      _check_choice("gating_type", gating_type, ("highway", "gru"))
    if add_position_timing_signal or add_step_timing_signal:
      _check_choice("add_or_concat_timing_signal",
                    add_or_concat_timing_signal, ("add", "concat"))
    if add_step_timing_signal:
      _check_choice("step_timing_signal_type", step_timing_signal_type,
                    ("learned", "sinusoid"))
    self._layers = layers
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self.num_vanilla_transformer_layers = num_vanilla_transformer_layers
    self.act_type = act_type
    self.recurrence_type = recurrence_type
    self.act_max_steps = act_max_steps
    self.act_epsilon = act_epsilon
    self.num_rec_steps = num_rec_steps
    self.num_inrecurrence_layers = num_inrecurrence_layers
    self.position_start_index = position_start_index
    self.add_or_concat_timing_signal = add_or_concat_timing_signal
    self.step_timing_signal_type = step_timing_signal_type
    self.add_position_timing_signal = add_position_timing_signal
    self.add_step_timing_signal = add_step_timing_signal
    self.mix_with_transformer_before_ut = mix_with_transformer_before_ut
    self.mix_with_transformer_after_ut = mix_with_transformer_after_ut
    self.gates_inputs = gates_inputs
    self.gate_ffn_layer = gate_ffn_layer
    self.couple_carry_transform_gates = couple_carry_transform_gates
    self.use_gated_transformer = use_gated_transformer
    self.gating_type = gating_type

  # Timing signals.

  def get_timing_signal_1d(self,
                           context,
                           length,
                           channels,
                           min_timescale=1.0,
                           max_timescale=1.0e4,
                           start_index=0):
    """Sinusoids of geometrically spaced frequencies, one per position.

    Channel i < channels/2 is sin(position / timescale_i), channel
    channels/2 + i cos(position / timescale_i), with timescales from
    min_timescale to max_timescale; sin and cos of a sum being linear in
    those of its terms, attention can learn relative positions from it.

    Args:
      context: a transformer.Context (its positions along `length`).
      length: the Dimension of positions.
      channels: the channels Dimension (even size).
      min_timescale: a float.
      max_timescale: a float.
      start_index: an int or int32 scalar Tensor added to the positions.

    Returns:
      a Tensor [length, channels] (with batch dimensions if the context's
      positions have them).

    Raises:
      NotImplementedError: channels has an odd size.
    """
    if channels.size % 2 != 0:
      raise NotImplementedError(
          f"UTLayerStack.get_timing_signal_1d: odd channels {channels} are "
          "not implemented.")
    dtype = context.activation_dtype
    if length == context.length_dim:
      position = context.get_position()
    else:
      position = mtf.range(context.mesh, length, tf.int32)
    position = mtf.cast(position, dtype)
    if isinstance(start_index, mtf.Tensor):
      position += mtf.cast(start_index, dtype)
    elif start_index:
      position += float(start_index)
    half = mtf.Dimension(channels.name, channels.size // 2)
    log_increment = (math.log(float(max_timescale) / float(min_timescale)) /
                     max(half.size - 1, 1))
    inv_timescales = min_timescale * mtf.exp(
        mtf.range(context.mesh, half, dtype) * -log_increment)
    scaled_time = position * inv_timescales
    return mtf.concat([mtf.sin(scaled_time), mtf.cos(scaled_time)],
                      concat_dim_name=channels.name)

  def add_position_timing_signal_func(self, context, x, step):
    """x with the position (horizontal) timing signal added or concatenated.

    Args:
      context: a transformer.Context.
      x: a Tensor [batch, length, d_model].
      step: an int, the recurrence step.

    Returns:
      a Tensor (x's shape, or twice its channels with "concat").
    """
    length = context.length_dim
    if not self.position_start_index:
      index = 0
    elif self.position_start_index == "random":
      # Shifts all positions by one random amount.
      index = mtf.random_uniform(context.mesh, [], maxval=length.size,
                                 dtype=tf.int32)
    elif self.position_start_index == "step":
      index = int(length.size * step / self._num_steps)
    else:
      raise ValueError(
          "UTLayerStack: unknown position_start_index "
          f"{self.position_start_index!r}; expected None, 0, 'random' or "
          "'step'.")
    signal = self.get_timing_signal_1d(
        context, length, context.model.model_dim, start_index=index)
    return self._add_or_concat(x, signal)

  def get_layer_timing_signal_learned_1d(self, context, channels, layer,
                                         num_layers):
    """A learned embedding of the step (vertical timing signal).

    The variable "layer_embedding" [layer: num_layers, channels] starts
    from N(0, 1/channels) and is scaled by sqrt(channels).

    Args:
      context: a transformer.Context.
      channels: the channels Dimension.
      layer: an int, the step (clamped to num_layers - 1).
      num_layers: an int, the number of steps.

    Returns:
      a Tensor [channels].
    """
    layer_dim = mtf.Dimension("layer", num_layers)
    layer_embedding = mtf.get_variable(
        context.mesh, "layer_embedding", mtf.Shape([layer_dim, channels]),
        dtype=context.variable_dtype,
        initializer=seeded_initializers.normal(
            "layer_embedding", stddev=channels.size ** -0.5))
    layer_embedding *= channels.size ** 0.5
    index = mtf.constant(context.mesh, min(layer, num_layers - 1),
                         dtype=tf.int32)
    return mtf.gather(layer_embedding, index, layer_dim)

  def add_step_timing_signal_func(self, context, x, step):
    """x with the step (vertical) timing signal added or concatenated.

    Args:
      context: a transformer.Context.
      x: a Tensor [batch, length, d_model].
      step: an int, the recurrence step.

    Returns:
      a Tensor (x's shape, or twice its channels with "concat").
    """
    channels = x.shape.dims[-1]
    if self.step_timing_signal_type == "learned":
      signal = self.get_layer_timing_signal_learned_1d(
          context, channels, step, self._num_steps)
    else:
      signal = _sinusoid_of(context, step, channels)
    return self._add_or_concat(x, signal)

  def _add_or_concat(self, x, signal):
    """x + signal, or x and signal (broadcast) concatenated on channels."""
    signal = mtf.cast(signal, x.dtype)
    if self.add_or_concat_timing_signal == "add":
      return x + signal
    channels_name = x.shape.dims[-1].name
    return mtf.concat([x, mtf.broadcast(signal, x.shape)], channels_name)

  @property
  def _num_steps(self):
    if self.recurrence_type == "act":
      return self.act_max_steps
    return self.num_rec_steps

  def step_preprocess(self, context, x, step):
    """Adds the timing signals at the start of a step.

    With "concat" the widened state is projected back to its channels by
    a dense layer (no bias).

    Args:
      context: a transformer.Context.
      x: the state, a Tensor [batch, length, d_model].
      step: an int.

    Returns:
      a Tensor shaped like x.
    """
    original_channels = x.shape.dims[-1]
    if self.add_position_timing_signal:
      x = self.add_position_timing_signal_func(context, x, step)
    if self.add_step_timing_signal:
      x = self.add_step_timing_signal_func(context, x, step)
    if ((self.add_position_timing_signal or self.add_step_timing_signal) and
        self.add_or_concat_timing_signal == "concat"):
      x = _rename_wide_channels(x)
      x = mtf.layers.dense(
          x, new_dims=[original_channels], reduced_dims=x.shape.dims[-1:],
          variable_dtype=context.variable_dtype, activation=None,
          use_bias=False)
    return x

  # One pass through the block.

  def vanilla_transformer_layer(self, context, x, mask):
    """Runs x once through the layers as pre-norm residual blocks."""
    for lnum, layer in enumerate(self._layers):
      scope = (tf.compat.v1.variable_scope(layer.name) if layer.name
               else contextlib.nullcontext())
      with scope:
        norm_x = self._layer_norm(context, _masked(x, mask))
        with tf.compat.v1.variable_scope(type(layer).__name__):
          y = layer.call(context, norm_x)
          if y.shape != x.shape:
            raise ValueError(
                f"UTLayerStack: layer {type(layer).__name__} "
                f"({layer.name}) returned a misshaped output: its input is "
                f"{x.shape}, its output {y.shape}.")
          if self.use_gated_transformer:
            y = self.gating(context, x, y, mask)
        x += self._dropout(context, y)
      if lnum != len(self._layers) - 1:
        _append_layer_output(context, x)
      context.layer_index += 1
    return x

  def gating(self, context, x, transformed_x, mask):
    """A layer's output gated against its input ("highway" or "gru")."""
    def gate(inputs):
      return self.ffn_layer_multi_inputs(
          context, mask, inputs, ffn_layer_type=self.gate_ffn_layer,
          activation=mtf.sigmoid, preprocess=True)
    if self.gating_type == "highway":
      transform_gate = gate([x])
      carry_gate = gate([x])
      return x * carry_gate + transformed_x * transform_gate
    update_gate = gate([x, transformed_x])
    reset_gate = gate([x, transformed_x])
    candidate = gate([reset_gate * x, transformed_x])
    return (1 - update_gate) * transformed_x + update_gate * candidate

  def ffn_layer_multi_inputs(self,
                             context,
                             mask,
                             inputs_list,
                             ffn_layer_type="dense",
                             kernel_initializer=None,
                             activation=None,
                             preprocess=False,
                             postprocess=False):
    """A feed-forward layer of several inputs, to d_model.

    Args:
      context: a transformer.Context.
      mask: None or a Tensor, 0.0 in padding.
      inputs_list: a non-empty list of Tensors [..., d_model],
        concatenated on d_model.
      ffn_layer_type: "dense" (one dense layer with a bias) or
        "dense_relu_dense" (a ReLU hidden layer "d_ff" of d_model units,
        then a dense layer).
      kernel_initializer: the kernels' initializer (None: the default).
      activation: an optional activation of the output.
      preprocess: whether each input is layer-normalized first.
      postprocess: whether the output is layer-normalized.

    Returns:
      a Tensor [..., d_model].

    Raises:
      ValueError: no inputs, or an unknown ffn_layer_type.
    """
    if not inputs_list:
      raise ValueError("UTLayerStack.ffn_layer_multi_inputs: no inputs.")
    inputs_list = list(inputs_list)
    if preprocess:
      # Several inputs are normalized independently.
      inputs_list = [self._layer_norm(context, _masked(t, mask))
                     for t in inputs_list]
    model_dim = context.model.model_dim
    ffn_inputs = inputs_list[0]
    if len(inputs_list) != 1:
      ffn_inputs = _rename_wide_channels(
          mtf.concat(inputs_list, model_dim.name))
    dense_kwargs = dict(variable_dtype=context.variable_dtype,
                        expert_dims=context.model.ensemble_dims,
                        kernel_initializer=kernel_initializer)
    if ffn_layer_type == "dense":
      output = mtf.layers.dense(
          ffn_inputs, reduced_dims=ffn_inputs.shape.dims[-1:],
          new_dims=[model_dim], activation=activation, use_bias=True,
          **dense_kwargs)
    elif ffn_layer_type == "dense_relu_dense":
      hidden = mtf.layers.dense(
          ffn_inputs, reduced_dims=ffn_inputs.shape.dims[-1:],
          new_dims=[mtf.Dimension("d_ff", model_dim.size)],
          activation=mtf.relu, use_bias=True, **dense_kwargs)
      hidden = self._dropout(context, hidden, noise_shape=hidden.shape)
      output = mtf.layers.dense(
          hidden, reduced_dims=hidden.shape.dims[-1:], new_dims=[model_dim],
          activation=activation, use_bias=True, **dense_kwargs)
    else:
      raise ValueError(
          f"UTLayerStack: unknown ffn_layer_type {ffn_layer_type!r}; "
          "expected 'dense' or 'dense_relu_dense'.")
    if postprocess:
      output = self._layer_norm(context, _masked(output, mask))
    return output

  # The recurrences.

  def ut_basic(self, context, x, mask):
    """num_rec_steps steps, each the block num_inrecurrence_layers times."""
    for step in range(self.num_rec_steps):
      x = self.step_preprocess(context, x, step)
      for _ in range(self.num_inrecurrence_layers):
        x = self.vanilla_transformer_layer(context, x, mask)
    return x

  def ut_highway(self, context, layer_inputs, mask):
    """Steps whose output is carry * state + transform * transformed.

    Args:
      context: a transformer.Context.
      layer_inputs: (state, inputs, memory), the first two what the gates
        may see ("s", "i"); memory is passed along unused.
      mask: None or a Tensor, 0.0 in padding.

    Returns:
      the last state.
    """
    state, inputs, _ = layer_inputs
    for step in range(self.num_rec_steps):
      transformed = self.step_preprocess(context, state, step)
      for _ in range(self.num_inrecurrence_layers):
        transformed = self.vanilla_transformer_layer(context, transformed,
                                                     mask)
      gate_inputs = []
      if "s" in self.gates_inputs:
        gate_inputs.append(state)
      if "t" in self.gates_inputs:
        gate_inputs.append(transformed)
      if "i" in self.gates_inputs:
        gate_inputs.append(inputs)
      transform_gate = self.ffn_layer_multi_inputs(
          context, mask, gate_inputs, ffn_layer_type=self.gate_ffn_layer,
          activation=mtf.sigmoid, preprocess=True)
      if self.couple_carry_transform_gates:
        carry_gate = mtf.sub(1.0, transform_gate, name="carry")
      else:
        carry_gate = self.ffn_layer_multi_inputs(
            context, mask, gate_inputs, ffn_layer_type=self.gate_ffn_layer,
            activation=mtf.sigmoid, preprocess=True)
      state = state * carry_gate + transformed * transform_gate
      mtf.scalar_summary("highway_transform_gate_layer",
                         mtf.reduce_mean(transform_gate))
      mtf.scalar_summary("highway_carry_gate_layer",
                         mtf.reduce_mean(carry_gate))
    return state

  def act_layer(self, context, x, mask):
    """Adaptive Computation Time over act_max_steps + 1 steps.

    At each step a position's halting probability p (a sigmoid dense layer
    of the state, under "sigmoid_activation_for_pondering") is added to
    its running sum while that stays at most 1 - act_epsilon; the step
    that would pass it halts the position and gets the remainder
    1 - sum. The output mixes each step's transformed state into the
    previous output with those weights (p, the remainder, then 0).

    Args:
      context: a transformer.Context.
      x: the state, a Tensor [batch, length, d_model].
      mask: None or a Tensor, 0.0 in padding.

    Returns:
      a Tensor shaped like x.
    """
    dtype = context.activation_dtype
    threshold = 1.0 - self.act_epsilon
    update_dims = x.shape.dims[:-1]
    if self.act_type == "global":
      update_dims = [d for d in update_dims if d != context.length_dim]
    update_shape = mtf.Shape(update_dims)
    halting_probability = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    remainders = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    n_updates = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    previous_state = mtf.zeros_like(x)
    state = x
    for step in range(self.act_max_steps + 1):
      state = self.step_preprocess(context, state, step)
      p = self._halting_probability(context, state, update_shape)
      # Positions that had not halted before this step.
      running = mtf.cast(mtf.less(halting_probability, 1.0), dtype)
      proposed = halting_probability + p * running
      new_halted = mtf.cast(mtf.greater(proposed, threshold), dtype) * running
      still_running = (
          mtf.cast(mtf.less_equal(proposed, threshold), dtype) * running)
      halting_probability += p * still_running
      remainders += new_halted * (1 - halting_probability)
      halting_probability += new_halted * remainders
      n_updates += still_running + new_halted
      update_weights = p * still_running + new_halted * remainders
      for _ in range(self.num_inrecurrence_layers):
        state = self.vanilla_transformer_layer(context, state, mask)
      if self.act_type == "accumulated":
        previous_state = state * update_weights + previous_state
      else:
        previous_state = (state * update_weights +
                          previous_state * (1 - update_weights))
    mtf.scalar_summary("ponder_times", mtf.reduce_mean(n_updates))
    return previous_state

  def _halting_probability(self, context, state, update_shape):
    """p of one ACT step, of `update_shape`."""
    if self.act_type == "random":
      return mtf.random_uniform(context.mesh, update_shape,
                                dtype=context.activation_dtype)
    ponder_dim = mtf.Dimension("ponder", 1)
    with tf.compat.v1.variable_scope("sigmoid_activation_for_pondering"):
      p = mtf.layers.dense(
          state, variable_dtype=context.variable_dtype,
          reduced_dims=state.shape.dims[-1:], new_dims=[ponder_dim],
          activation=mtf.sigmoid, use_bias=True)
    if self.act_type == "global":
      # One probability per example: the mean over positions.
      return mtf.reduce_mean(p, output_shape=update_shape)
    return mtf.reduce_sum(p, output_shape=update_shape)

  def call(self, context, x):
    """Runs the stack on x [batch, length, d_model]."""
    if isinstance(context.sequence_id, mtf.Tensor):
      # Zeroes padding at each layer, so that large values in padding do
      # not leak into real positions.
      mask = mtf.cast(mtf.not_equal(context.sequence_id, 0),
                      context.activation_dtype)
    else:
      mask = None
    x = self._dropout(context, x)
    _append_layer_output(context, x)
    if self.mix_with_transformer_before_ut:
      for _ in range(self.num_vanilla_transformer_layers):
        x = self.vanilla_transformer_layer(context, x, mask)
    if self.recurrence_type == "act":
      x = self.act_layer(context, x, mask)
    elif self.recurrence_type == "basic":
      x = self.ut_basic(context, x, mask)
    else:
      x = self.ut_highway(context, (x, x, x), mask)
    if self.mix_with_transformer_after_ut:
      for _ in range(self.num_vanilla_transformer_layers):
        x = self.vanilla_transformer_layer(context, x, mask)
    x = self._layer_norm(context, x, name="final_layer_norm")
    x = self._dropout(context, x)
    x = _masked(x, mask)
    _append_layer_output(context, x)
    return x

  def _dropout(self, context, x, noise_shape=None):
    """Dropout in training, its mask shared along the length."""
    if not (context.train and self._dropout_rate > 0):
      return x
    if noise_shape is None:
      noise_shape = mtf.Shape(context.batch_dims + [context.model.model_dim])
    return mtf.dropout(x, context.train, keep_prob=1.0 - self._dropout_rate,
                       noise_shape=noise_shape)

  def _layer_norm(self, context, x, name=None):
    """Layer norm over d_model.

    `name` is ignored, as in the original, so that the variables keep the
    original's names ("layer_prepostprocess/layer_norm/...").
    """
    del name
    return mtf.layers.layer_norm(x, context.model.model_dim,
                                 self._norm_epsilon)

  @property
  def num_layers(self):
    return len(self.layers)

  @property
  def layers(self):
    return self._layers


def _check_choice(name, value, choices):
  if value not in choices:
    raise ValueError(
        f"UTLayerStack: unknown {name} {value!r}; expected one of {choices}.")


def _masked(x, mask):
  return x if mask is None else x * mask


def _rename_wide_channels(x):
  """x with its last dimension, channels concatenated along d_model, named
  "wide_<name>", so that a dense layer back to d_model does not see two
  dimensions of one name."""
  wide = x.shape.dims[-1]
  return mtf.rename_dimension(x, wide.name, "wide_" + wide.name)


def _append_layer_output(context, x):
  if context.layer_outputs is not None:
    context.layer_outputs.append(x)


def _sinusoid_of(context, step, channels, min_timescale=1.0,
                 max_timescale=1.0e4):
  """The sinusoid timing signal [channels] of position `step`."""
  half = channels.size // 2
  log_increment = (math.log(max_timescale / min_timescale) /
                   max(half - 1, 1))
  scaled = step * min_timescale * np.exp(np.arange(half) * -log_increment)
  signal = np.concatenate([np.sin(scaled), np.cos(scaled)])
  return mtf.import_tf_tensor(
      context.mesh, tf.constant(signal, dtype=context.activation_dtype),
      mtf.Shape([channels]))
