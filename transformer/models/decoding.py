"""Incremental decoding of a Unitransformer: sampling and beam search.

Both run the model once in "first_part" mode over the known prefix, so
that layers record their decoding states (e.g. the keys and values of self
attention) and constant states, then decode one position per step in
"incremental" mode inside an `mtf.while_loop` (sampling) or
`mtf.beam_search.beam_search`, each step reading and writing the states.
`sample_autoregressive` and `beam_search` here are the methods
`Unitransformer.sample_autoregressive` and `Unitransformer.beam_search`
(the class takes them as they are; `self` is the Unitransformer).
"""

import mesh_tensorflow as mtf
import tensorflow as tf

from mesh_tensorflow.transformer.models import layer_stack

# These functions are the Unitransformer's methods and its helpers: they
# call its _call_internal.
# pylint: disable=protected-access


def _priorities(model, length_range, initial_position):
  """Read/write priorities of the first-part pass (see Context)."""
  if model.input_full_attention:
    # The given prefix (the inputs) sees itself fully.
    return length_range * mtf.to_int32(
        mtf.greater(length_range, initial_position))
  return length_range


def _context_args(model, inputs, variable_dtype, encoder_output,
                  encoder_sequence_id, encoder_inputs, shared_params,
                  encoder_layer_outputs):
  """The Context arguments shared by every pass of one decoding (a dict).

  The batch dimensions are all of `inputs`' but the last, "length" (with
  beam search, the beam is one of them).
  """
  return dict(
      model=model,
      mesh=inputs.mesh,
      batch_dims=inputs.shape.dims[:-1],
      length_dim=inputs.shape.dims[-1],
      variable_dtype=variable_dtype,
      sequence_id=1 if encoder_sequence_id is not None else None,
      encoder_output=encoder_output,
      encoder_sequence_id=encoder_sequence_id,
      shared_params=shared_params,
      encoder_layer_outputs=encoder_layer_outputs,
      encoder_inputs=encoder_inputs)


def _first_part(context_args, inputs, initial_position, priority):
  """Runs the prefix through the model; returns the first-part Context."""
  model = context_args["model"]
  length_dim = context_args["length_dim"]
  context = layer_stack.Context(
      mode=layer_stack.FIRST_PART,
      position=mtf.range(inputs.mesh, length_dim, tf.int32),
      position_is_default=True,
      new_states=[],
      initial_position=initial_position,
      constant_states=[],
      write_priority=priority,
      read_priority=priority,
      inputs=inputs,
      **context_args)
  shifted_inputs = mtf.shift(inputs, offset=1, dim=length_dim, wrap=False)
  with tf.compat.v1.variable_scope(model.name):
    model._call_internal(context, shifted_inputs)
  return context


def _incremental_logits(context_args, ids, position, states, write_priority,
                        constant_states, bos_id):
  """Logits of one decoding step at `position`; (logits, new states)."""
  model = context_args["model"]
  length_dim = context_args["length_dim"]
  # The id before `position`; 0 at position 0 (there is no index -1).
  inputs_this_step = mtf.gather(ids, mtf.maximum(position - 1, 0),
                                length_dim) * mtf.to_int32(
                                    mtf.greater(position, 0))
  if bos_id:
    # Position 0 reads bos_id.
    inputs_this_step += bos_id * mtf.ones_like(inputs_this_step) * mtf.cast(
        mtf.equal(position, 0), tf.int32)
  context = layer_stack.Context(
      mode=layer_stack.INCREMENTAL,
      position=position,
      states=states,
      new_states=[],
      constant_states=constant_states,
      write_priority=write_priority,
      read_priority=position,
      inputs=inputs_this_step,
      **context_args)
  with tf.compat.v1.variable_scope(model.name, reuse=True):
    logits = model._call_internal(context, inputs_this_step)
  return logits, context.new_states


def sample_autoregressive(self,
                          partial_sequences,
                          stop_at_token=1,
                          max_steps=None,
                          temperature=0.0,
                          variable_dtype=mtf.VariableDType(tf.float32),
                          encoder_output=None,
                          encoder_sequence_id=None,
                          encoder_inputs=None,
                          shared_params=None,
                          has_partial_sequences=True,
                          encoder_layer_outputs=None,
                          never_end=False,
                          remove_partial_sequences=False,
                          sampling_keep_top_k=-1,
                          bos_id=0):
  """Samples a continuation of each sequence, one token per loop step.

  Each row of `partial_sequences` holds a given prefix (nonzero ids) and
  then zeros, which are filled in. To sample from scratch pass zeros and
  has_partial_sequences=False (the first-part states are then zeros).

  Args:
    self: an autoregressive Unitransformer.
    partial_sequences: an int32 Tensor [<batch_dims>, length_dim].
    stop_at_token: an optional integer: a row is done once it produced this
      id (beyond those in its prefix); None runs to the end.
    max_steps: an optional integer: the most tokens to produce.
    temperature: 0.0 (argmax) to 1.0 (sample from the model's
      distribution); a float or a scalar Tensor.
    variable_dtype: a mtf.VariableDType.
    encoder_output: an optional Tensor (encoder-decoder models).
    encoder_sequence_id: an optional Tensor.
    encoder_inputs: an optional Tensor.
    shared_params: an optional dict.
    has_partial_sequences: a boolean (see above).
    encoder_layer_outputs: optional, the encoder's layer outputs.
    never_end: a boolean: never produce stop_at_token.
    remove_partial_sequences: a boolean: shift each row left by its prefix
      length, so that only the produced tokens remain.
    sampling_keep_top_k: -1, or sample only among the k largest logits.
    bos_id: the id read at position 0.

  Returns:
    an int32 Tensor [<batch_dims>, length_dim].

  Raises:
    ValueError: the model is not autoregressive, or sampling_keep_top_k is
      neither -1 nor positive.
  """
  if not self.autoregressive:
    raise ValueError(f"sample_autoregressive: model {self.name!r} is not "
                     "autoregressive.")
  if sampling_keep_top_k != -1 and sampling_keep_top_k <= 0:
    raise ValueError("sample_autoregressive: sampling_keep_top_k must be -1 "
                     f"or positive, got {sampling_keep_top_k}.")
  inputs = partial_sequences
  length_dim = inputs.shape.dims[-1]
  initial_position = mtf.reduce_sum(
      mtf.to_int32(mtf.not_equal(inputs, 0)), reduced_dim=length_dim)
  length_range = mtf.range(inputs.mesh, length_dim, tf.int32)
  write_priority = _priorities(self, length_range, initial_position)
  context_args = _context_args(
      self, inputs, variable_dtype, encoder_output, encoder_sequence_id,
      encoder_inputs, shared_params, encoder_layer_outputs)
  first = _first_part(context_args, inputs, initial_position, write_priority)
  constant_states = first.constant_states
  prefix_eos_count = 0
  if has_partial_sequences:
    initial_states = first.new_states
    if stop_at_token is not None:
      prefix_eos_count = mtf.reduce_sum(
          mtf.to_int32(mtf.equal(partial_sequences, stop_at_token)),
          reduced_dim=length_dim)
  else:
    initial_states = [mtf.zeros_like(t) for t in first.new_states]

  def cond_fn(position, ids, *unused_states):
    """Whether some row still has positions to decode."""
    is_done = mtf.greater_equal(position, length_dim.size)
    if max_steps:
      is_done = mtf.logical_or(
          is_done, mtf.greater_equal(position - initial_position, max_steps))
    if stop_at_token is not None:
      eos_count = mtf.reduce_sum(
          mtf.to_int32(mtf.equal(ids, stop_at_token)), reduced_dim=length_dim)
      is_done = mtf.logical_or(
          is_done, mtf.greater(eos_count, prefix_eos_count))
    return mtf.logical_not(mtf.reduce_all(is_done))

  def body_fn(position, ids, *states):
    """Decodes position `position` of every row."""
    # A row that reached the end waits there while others decode (rows
    # start at their own prefix lengths): it steps at the last position,
    # inside the position table and the states, and writes no id, since
    # the one-hot of its `position` below is all zeros. (The original's
    # gathers were one-hot einsums, which return zeros past the end; a
    # TF gather fails there.)
    step_position = mtf.minimum(position, length_dim.size - 1)
    logits, new_states = _incremental_logits(
        context_args, ids, step_position, list(states), write_priority,
        constant_states, bos_id)
    if never_end:
      logits += mtf.one_hot(
          mtf.constant(logits.mesh, stop_at_token, dtype=tf.int32),
          self.output_vocab_dim, on_value=-1e9, off_value=0.0,
          dtype=logits.dtype)
    # Top-k truncation comes before the temperature (for top-k the order
    # does not matter).
    if sampling_keep_top_k != -1:
      k_largest = mtf.nth_largest_element(
          logits, n=sampling_keep_top_k, reduced_dim=self.output_vocab_dim)
      logits = mtf.where(mtf.less_equal(logits, k_largest),
                         mtf.ones_like(logits) * -1e6, logits)
    ids_this_step = mtf.sample_with_temperature(
        logits, self.output_vocab_dim, temperature)
    new_ids = ids + ids_this_step * mtf.one_hot(
        position, length_dim, dtype=tf.int32)
    return [position + 1, new_ids] + list(new_states)

  outputs = mtf.while_loop(
      cond_fn, body_fn, [initial_position, inputs] + list(initial_states))[1]
  if has_partial_sequences and remove_partial_sequences:
    partial_length = mtf.reduce_sum(
        mtf.to_int32(mtf.not_equal(partial_sequences, 0)),
        reduced_dim=length_dim)
    outputs = mtf.dynamic_shift(outputs, -partial_length, length_dim,
                                wrap=False)
  return outputs


def beam_search(self,
                inputs,
                decode_length,
                variable_dtype=mtf.VariableDType(tf.float32),
                encoder_output=None,
                encoder_sequence_id=None,
                encoder_inputs=None,
                alpha=0.6,
                shared_params=None,
                encoder_layer_outputs=None,
                bos_id=0):
  """Beam search from scratch; returns the best beam of each example.

  Args:
    self: an autoregressive Unitransformer.
    inputs: an int32 Tensor of zeros [batch_dim, beam_dim, length_dim].
    decode_length: an int32 scalar Tensor, the most tokens to decode.
    variable_dtype: a mtf.VariableDType.
    encoder_output: an optional Tensor.
    encoder_sequence_id: an optional Tensor.
    encoder_inputs: an optional Tensor.
    alpha: the length penalty exponent.
    shared_params: an optional dict.
    encoder_layer_outputs: optional, the encoder's layer outputs.
    bos_id: the id read at position 0.

  Returns:
    an int32 Tensor [batch_dim, length_dim].

  Raises:
    ValueError: the model is not autoregressive.
    NotImplementedError: several batch dimensions, or input_full_attention.
  """
  if not self.autoregressive:
    raise ValueError(f"beam_search: model {self.name!r} is not "
                     "autoregressive.")
  batch_dims = inputs.shape.dims[:-2]
  if len(batch_dims) != 1:
    raise NotImplementedError(
        "beam_search supports exactly one batch dimension, inputs are "
        f"{inputs.shape}.")
  if self.input_full_attention:
    raise NotImplementedError(
        "beam_search of a model with input_full_attention (it needs given "
        "partial sequences).")
  beam_dim = inputs.shape.dims[-2]
  length_dim = inputs.shape.dims[-1]
  initial_position = mtf.reduce_sum(
      mtf.to_int32(mtf.not_equal(inputs, 0)), reduced_dim=length_dim)
  write_priority = mtf.range(inputs.mesh, length_dim, tf.int32)
  # Each step's batch is [batch_dim, beam_dim].
  context_args = _context_args(
      self, inputs, variable_dtype, encoder_output, encoder_sequence_id,
      encoder_inputs, shared_params, encoder_layer_outputs)
  first = _first_part(context_args, inputs, initial_position, write_priority)
  # There is no given prefix: the states start at zero.
  initial_states = [mtf.zeros_like(t) for t in first.new_states]
  constant_states = first.constant_states

  def logits_fn(step_num, ids, states):
    logits, new_states = _incremental_logits(
        context_args, ids, step_num, states, write_priority,
        constant_states, bos_id)
    return mtf.to_float(logits), new_states

  beams, _ = mtf.beam_search.beam_search(
      logits_fn, inputs, alpha, states=initial_states,
      decode_length=decode_length, use_tpu=True, dtype=tf.float32,
      mesh_shape=self.mesh_shape, layout=self.layout)
  return mtf.gather(beams, mtf.constant(inputs.mesh, 0, dtype=tf.int32),
                    beam_dim)
