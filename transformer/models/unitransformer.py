"""Unitransformer: a model with one layer stack (a language model, an
encoder, or the decoder of a Bitransformer).

The original's `mesh_tensorflow.transformer.transformer.Unitransformer`,
re-exported from that module (gin registers it under it). Its decoding
methods are in `decoding.py`.
"""

import gin
import mesh_tensorflow as mtf
import tensorflow as tf

from mesh_tensorflow.estimator import mode_keys
from mesh_tensorflow.transformer.models import decoding
from mesh_tensorflow.transformer.models import layer_stack
from mesh_tensorflow.transformer.models import model_helpers

_MODULE = "mesh_tensorflow.transformer.transformer"


@gin.configurable(module=_MODULE)
class Unitransformer:
  """A Transformer with one layer stack.

  Token ids are embedded (`get_vocab_embedding_cls()`, variable
  `<name>/embedding`, or the Bitransformer's shared one), learned or
  sinusoid position embeddings are added, the LayerStack runs, and a
  `<name>/logits` dense layer (or the transposed embedding, with
  `shared_embedding_and_softmax_weights`) gives logits over the vocabulary.
  Vocabulary sizes are padded up to a multiple of `vocab_divisor` in the
  dimension named "vocab", so that it splits evenly over a mesh.
  """

  def __init__(self,
               layer_stack,
               d_model=1024,
               input_vocab_size=gin.REQUIRED,
               output_vocab_size=gin.REQUIRED,
               autoregressive=gin.REQUIRED,
               max_length=gin.REQUIRED,
               shared_embedding_and_softmax_weights=False,
               label_smoothing=0.0,
               z_loss=1e-4,
               name="transformer",
               layout=None,
               mesh_shape=None,
               vocab_divisor=128,
               ensemble=None,
               loss_fn=None,
               positional_embedding=True,
               sinusoid_positional_embedding=False,
               input_full_attention=False,
               loss_on_targets_only=False,
               loss_denominator=None,
               token_dropout_rate=0.0):
    """Creates a Unitransformer.

    Args:
      layer_stack: a LayerStack.
      d_model: an integer, the size of dimension "d_model".
      input_vocab_size: an integer.
      output_vocab_size: an integer, or None for an encoder (no logits).
      autoregressive: a boolean: each position sees only earlier ones.
      max_length: an integer, the size of the position embedding table.
      shared_embedding_and_softmax_weights: a boolean: logits through the
        transposed input embedding.
      label_smoothing: a float: the targets put this much probability
        uniformly over the vocabulary.
      z_loss: a float: adds z_loss * log(sum(exp(logits)))^2 in training,
        which keeps the softmax normalizer near 1.
      name: a string, the model's variable scope.
      layout: optional layout rules (some layers, e.g. MoE, read them).
      mesh_shape: optional mesh shape (some layers, e.g. MoE, read it).
      vocab_divisor: an integer: vocabulary sizes are padded to a multiple.
      ensemble: an optional integer: train this many models at once, along
        a dimension "ensemble" of every variable.
      loss_fn: optional fn(model, context, logits, targets,
        output_vocab_dim) -> scalar loss, replacing `_compute_loss`.
      positional_embedding: a boolean: add learned position embeddings.
      sinusoid_positional_embedding: a boolean: add the fixed sinusoid
        signal instead (overrides positional_embedding).
      input_full_attention: a boolean: in [<inputs>, EOS, <targets>, EOS]
        examples the inputs part attends to all of itself (the targets part
        stays autoregressive).
      loss_on_targets_only: a boolean: in such examples only the targets
        part is scored.
      loss_denominator: an optional float dividing the summed loss instead
        of the number of target tokens.
      token_dropout_rate: a float: in training, input ids are replaced by 0
        with this probability.

    Raises:
      ValueError: an autoregressive model without an output vocabulary, or
        input_full_attention without autoregressive.
    """
    self.layer_stack = layer_stack
    self.model_dim = mtf.Dimension("d_model", d_model)
    self.input_vocab_size_unpadded = input_vocab_size
    self.input_vocab_dim = mtf.Dimension(
        "vocab", model_helpers.round_up_to_multiple(input_vocab_size,
                                                    vocab_divisor))
    self.output_vocab_size_unpadded = output_vocab_size
    if output_vocab_size:
      self.output_vocab_dim = mtf.Dimension(
          "vocab", model_helpers.round_up_to_multiple(output_vocab_size,
                                                      vocab_divisor))
    else:
      self.output_vocab_dim = None
      if autoregressive:
        raise ValueError(f"Unitransformer {name!r}: an autoregressive model "
                         "needs an output_vocab_size.")
    self.autoregressive = autoregressive
    if sinusoid_positional_embedding:
      positional_embedding = True
    self.max_length_dim = (mtf.Dimension("max_length", max_length)
                           if positional_embedding else None)
    self.shared_embedding_and_softmax_weights = (
        shared_embedding_and_softmax_weights)
    self.label_smoothing = label_smoothing
    self.z_loss = z_loss
    self.name = name
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.ensemble_dim = (
        mtf.Dimension("ensemble", ensemble) if ensemble else None)
    self._loss_fn = loss_fn
    self.positional_embedding = positional_embedding
    self.sinusoid_positional_embedding = sinusoid_positional_embedding
    self.input_full_attention = input_full_attention
    self.loss_on_targets_only = loss_on_targets_only
    self._loss_denominator = loss_denominator
    if input_full_attention and not autoregressive:
      raise ValueError(f"Unitransformer {name!r}: input_full_attention "
                       "needs autoregressive=True.")
    self.token_dropout_rate = token_dropout_rate

  @property
  def fully_autoregressive(self):
    """Autoregressive everywhere (no full-attention inputs part)."""
    return self.autoregressive and not self.input_full_attention

  @property
  def ensemble_dims(self):
    return [self.ensemble_dim] if self.ensemble_dim else []

  def _compute_loss(self, context, logits, targets, output_vocab_dim):
    """Mean cross entropy of the logits against the targets.

    With label smoothing, z-loss (training only), and padding (id 0) left
    out; with `loss_on_targets_only` the inputs part of delimited examples
    is left out too. The sum is divided by `loss_denominator`.
    """
    if self._loss_fn:
      return self._loss_fn(self, context, logits, targets, output_vocab_dim)
    off_value = self.label_smoothing / output_vocab_dim.size
    on_value = 1.0 - self.label_smoothing + off_value
    soft_targets = mtf.one_hot(
        targets, output_vocab_dim, dtype=context.activation_dtype,
        on_value=on_value, off_value=off_value)
    loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, soft_targets, output_vocab_dim,
        z_loss=self.z_loss if context.train else 0.0)
    weights = mtf.layers.weights_nonzero(
        targets, dtype=context.activation_dtype)
    if self.loss_on_targets_only:
      weights *= mtf.cast(
          mtf.logical_not(model_helpers.delimited_lm_inputs_mask(targets)),
          dtype=context.activation_dtype)
    return (mtf.reduce_sum(loss * weights) /
            self.loss_denominator(targets, context.num_microbatches))

  def _call_internal(self, context, inputs, targets=None):
    """Logits for `inputs` (all positions at once); updates `context`.

    Args:
      context: a Context.
      inputs: an int32 Tensor [<batch_dims>, length_dim] (no length_dim in
        "incremental" mode).
      targets: an optional int32 Tensor; with `context.losses` the loss is
        appended there.

    Returns:
      logits [<batch_dims>, length_dim, vocab], or the last layer's output
      [..., d_model] when there is no output vocabulary (an encoder).
    """
    mesh = inputs.mesh
    if self.ensemble_dim and self.ensemble_dim not in inputs.shape.dims:
      # Every member of the ensemble trains on the same examples.
      inputs = mtf.broadcast(inputs, [self.ensemble_dim] + inputs.shape.dims)
      if targets is not None:
        targets = mtf.broadcast(
            targets, [self.ensemble_dim] + targets.shape.dims)
    if "embedding" in context.shared_params:
      vocab_embedding = context.shared_params["embedding"]
    else:
      vocab_embedding = model_helpers.get_vocab_embedding_cls()(
          mesh, self.input_vocab_dim, self.model_dim, context.variable_dtype,
          name="embedding", ensemble_dim=self.ensemble_dim)
    if context.train and self.token_dropout_rate > 0:
      inputs = mtf.dropout(inputs, rate=self.token_dropout_rate)
    x = vocab_embedding.ids_to_embedding(inputs, context)
    if self.positional_embedding:
      x += self._position_embedding(context, mesh, x)
    x = self.layer_stack.call(context, x)
    if self.output_vocab_dim is None:
      return x
    if self.shared_embedding_and_softmax_weights:
      logits = vocab_embedding.hidden_to_logits(x, context)
    else:
      logits = mtf.layers.dense(
          x, self.output_vocab_dim, use_bias=False,
          variable_dtype=context.variable_dtype,
          reduced_dims=x.shape.dims[-1:], name="logits")
    if targets is not None and context.losses is not None:
      context.losses.append(
          self._compute_loss(context, logits, targets, self.output_vocab_dim))
    if self.ensemble_dim:
      logits = model_helpers.reduce_ensemble_logits(
          logits, self.ensemble_dim, self.output_vocab_dim)
    return logits

  def _position_embedding(self, context, mesh, x):
    """The position embeddings to add to x (slice or gather)."""
    if self.sinusoid_positional_embedding:
      table = model_helpers.sinusoid_positional_embedding_weights(
          mesh, self.max_length_dim, self.model_dim,
          context.variable_dtype.activation_dtype)
    elif "positional_embedding" in context.shared_params:
      table = context.shared_params["positional_embedding"]
    else:
      table = mtf.layers.embedding_weights(
          mesh, self.max_length_dim, self.model_dim, context.variable_dtype,
          "positional_embedding", ensemble_dim=self.ensemble_dim)
    length_dim = context.length_dim
    past_the_table = (length_dim is not None and
                      length_dim.size > self.max_length_dim.size)
    if past_the_table:
      message = (f"Unitransformer {self.name!r}: length {length_dim} exceeds "
                 f"the position embedding table {self.max_length_dim}.")
      if context.position_is_default:
        raise ValueError(message + " Raise max_length.")
      tf.compat.v1.logging.warning(
          message + " This may be fine for several short sequences packed "
          "together; positions past the table get zeros.")
    if context.position_is_default:
      return mtf.rename_dimension(
          mtf.slice(table, 0, length_dim.size, self.max_length_dim.name),
          self.max_length_dim.name, length_dim.name)
    # Added to x, the gathered rows broadcast over what position lacks
    # (e.g. the batch, for one decoding step's scalar position).
    del x
    if not past_the_table:
      return mtf.gather(table, context.position, self.max_length_dim)
    # A position past the table gets a zero row on every device (a plain
    # gather fails there on CPU/GPU and gives zeros on TPU).
    last = self.max_length_dim.size - 1
    rows = mtf.gather(table, mtf.minimum(context.position, last),
                      self.max_length_dim)
    inside = mtf.cast(mtf.less_equal(context.position, last), rows.dtype)
    return rows * inside

  def loss_denominator(self, targets, num_microbatches):
    """What the summed loss is divided by: `loss_denominator` if given,
    else the number of target positions (times the microbatches), not
    counting the ensemble dimension (ensembling does not shrink each
    member's gradient)."""
    if self._loss_denominator is not None:
      return float(self._loss_denominator)
    ret = float(targets.shape.size) * num_microbatches
    if self.ensemble_dim:
      ret /= self.ensemble_dim.size
    return float(ret)

  def call_simple(self,
                  inputs,
                  targets,
                  compute_loss,
                  mode=mode_keys.ModeKeys.TRAIN,
                  variable_dtype=mtf.VariableDType(tf.float32),
                  sequence_id=None,
                  subsequence_id=None,
                  position=None,
                  encoder_output=None,
                  encoder_sequence_id=None,
                  encoder_inputs=None,
                  shared_params=None,
                  layer_outputs=None,
                  encoder_layer_outputs=None,
                  num_microbatches=1):
    """Logits (and loss) for all positions at once: training, evaluation.

    Args:
      inputs: an int32 Tensor [<batch_dims>, length_dim]; for an
        autoregressive model, `autoregressive_inputs(targets)`.
      targets: an optional int32 Tensor [<batch_dims>, length_dim].
      compute_loss: a boolean.
      mode: "train", "eval" or "infer" (mode_keys.ModeKeys).
      variable_dtype: a mtf.VariableDType.
      sequence_id: an optional int32 Tensor (packed examples; 0 = padding).
      subsequence_id: an optional int32 Tensor.
      position: an optional int32 Tensor of positions.
      encoder_output: an optional Tensor (for EncDecAttention).
      encoder_sequence_id: an optional Tensor.
      encoder_inputs: an optional Tensor.
      shared_params: an optional dict (a Bitransformer's shared variables).
      layer_outputs: an optional list onto which layer outputs are appended.
      encoder_layer_outputs: optional, the encoder's layer outputs.
      num_microbatches: an integer (the loss is divided accordingly).

    Returns:
      (logits [<batch_dims>, length_dim, vocab], loss scalar or None).
    """
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    length_range = mtf.range(inputs.mesh, length_dim, dtype=tf.int32)
    if not self.positional_embedding:
      # Relative attention then takes positions as indices in the tensor,
      # which gives the same relative positions and is faster.
      position = None
    position_is_default = position is None
    if position is None:
      position = length_range
    if self.input_full_attention:
      # The inputs part, plus the position right after it (where the
      # inputs' EOS is read and the first target predicted), sees itself
      # fully: priority 0 there, the position elsewhere.
      full = model_helpers.delimited_lm_inputs_mask(targets)
      full = mtf.logical_or(
          full, mtf.shift(full, offset=1, dim=length_dim, wrap=False))
      read_priority = write_priority = length_range * mtf.cast(
          mtf.logical_not(full), tf.int32)
    elif self.autoregressive:
      read_priority = write_priority = length_range
    else:
      read_priority = write_priority = None
    context = layer_stack.Context(
        model=self,
        mesh=inputs.mesh,
        batch_dims=batch_dims,
        length_dim=length_dim,
        variable_dtype=variable_dtype,
        mode=mode,
        losses=[] if compute_loss else None,
        sequence_id=sequence_id,
        subsequence_id=subsequence_id,
        position=position,
        position_is_default=position_is_default,
        encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id,
        shared_params=shared_params,
        layer_outputs=layer_outputs,
        encoder_layer_outputs=encoder_layer_outputs,
        write_priority=write_priority,
        read_priority=read_priority,
        inputs=inputs,
        encoder_inputs=encoder_inputs,
        num_microbatches=num_microbatches)
    with tf.compat.v1.variable_scope(self.name):
      logits = self._call_internal(context, inputs, targets)
    loss = mtf.add_n(context.losses) if compute_loss else None
    return logits, loss

  # Incremental decoding (decoding.py), whose functions are these methods:
  # sample_autoregressive continues `partial_sequences` one sampled token at
  # a time; beam_search returns the best beam of
  # `mtf.beam_search.beam_search`.
  sample_autoregressive = gin.configurable(module="Unitransformer")(
      decoding.sample_autoregressive)
  beam_search = decoding.beam_search
