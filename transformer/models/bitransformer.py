"""Encoder-decoder models, distillation, and their gin constructors.

The original's `Bitransformer`, `StudentTeacher`, `make_bitransformer` and
`make_bi_student_teacher` of `mesh_tensorflow.transformer.transformer`
(re-exported from that module; gin registers them under it).
"""

import gin
import mesh_tensorflow as mtf
import tensorflow as tf

from mesh_tensorflow.estimator import mode_keys
from mesh_tensorflow.transformer.models import layer_stack
from mesh_tensorflow.transformer.models import model_helpers
from mesh_tensorflow.transformer.models import unitransformer

_MODULE = "mesh_tensorflow.transformer.transformer"


@gin.configurable(module=_MODULE)
class Bitransformer:
  """A sequence-to-sequence model: an encoder and a decoder Unitransformer.

  The encoder's output, with its "length" dimension renamed
  "memory_length", is what the decoder's EncDecAttention layers attend to.
  With `shared_embedding` the token (and learned position) embeddings are
  one set of variables under the scope "shared".
  """

  def __init__(self, encoder, decoder, shared_embedding=True):
    """Creates a Bitransformer.

    Args:
      encoder: a Unitransformer (not autoregressive, no output vocabulary).
      decoder: an autoregressive Unitransformer.
      shared_embedding: a boolean.
    """
    self.encoder = encoder
    self.decoder = decoder
    self.shared_embedding = shared_embedding

  @property
  def output_vocab_dim(self):
    return self.decoder.output_vocab_dim

  def loss_denominator(self, targets, num_microbatches):
    return self.decoder.loss_denominator(targets, num_microbatches)

  @property
  def z_loss(self):
    return self.decoder.z_loss

  def _shared_params(self, mesh, variable_dtype):
    """The variables encoder and decoder share, as a dict for Context."""
    shared_params = {}
    if not self.shared_embedding:
      return shared_params
    encoder, decoder = self.encoder, self.decoder
    with tf.compat.v1.variable_scope("shared"):
      if not (encoder.model_dim == decoder.model_dim and
              encoder.input_vocab_dim == decoder.input_vocab_dim):
        raise ValueError(
            "Bitransformer: shared_embedding needs the same d_model and "
            f"vocabulary in encoder ({encoder.model_dim}, "
            f"{encoder.input_vocab_dim}) and decoder ({decoder.model_dim}, "
            f"{decoder.input_vocab_dim}).")
      shared_params["embedding"] = model_helpers.get_vocab_embedding_cls()(
          mesh, encoder.input_vocab_dim, encoder.model_dim, variable_dtype,
          name="embedding", ensemble_dim=encoder.ensemble_dim)
      if (encoder.positional_embedding and decoder.positional_embedding and
          encoder.max_length_dim == decoder.max_length_dim):
        if (encoder.sinusoid_positional_embedding and
            decoder.sinusoid_positional_embedding):
          table = model_helpers.sinusoid_positional_embedding_weights(
              mesh, encoder.max_length_dim, encoder.model_dim,
              variable_dtype.activation_dtype)
        else:
          table = mtf.layers.embedding_weights(
              mesh, encoder.max_length_dim, encoder.model_dim,
              variable_dtype, "positional_embedding",
              ensemble_dim=encoder.ensemble_dim)
        shared_params["positional_embedding"] = table
    return shared_params

  def call_simple(self,
                  inputs,
                  targets,
                  compute_loss,
                  mode=mode_keys.ModeKeys.TRAIN,
                  variable_dtype=mtf.VariableDType(tf.float32),
                  encoder_sequence_id=None,
                  decoder_sequence_id=None,
                  decoder_subsequence_id=None,
                  encoder_position=None,
                  decoder_position=None,
                  num_microbatches=1):
    """Logits (and loss) of the decoder given the encoded inputs.

    Args:
      inputs: an int32 Tensor [<batch_dims>, length_dim] (encoder input).
      targets: an int32 Tensor [<batch_dims>, length_dim]; the decoder
        reads `autoregressive_inputs(targets, decoder_sequence_id)`.
      compute_loss: a boolean.
      mode: "train", "eval" or "infer".
      variable_dtype: a mtf.VariableDType.
      encoder_sequence_id: an optional Tensor (packed examples); default
        1 on tokens and 0 on padding (id 0) of inputs.
      decoder_sequence_id: an optional Tensor; default likewise from
        targets.
      decoder_subsequence_id: an optional Tensor.
      encoder_position: an optional Tensor.
      decoder_position: an optional Tensor.
      num_microbatches: an integer.

    Returns:
      (logits, loss or None); the loss adds the encoder's auxiliary losses.
    """
    # Without sequence ids, padding is where the ids are 0.
    if encoder_sequence_id is None:
      encoder_sequence_id = mtf.minimum(inputs, 1)
    if decoder_sequence_id is None:
      decoder_sequence_id = mtf.minimum(targets, 1)
    encoder_layer_outputs = []
    shared_params = self._shared_params(inputs.mesh, variable_dtype)
    encoder_output, encoder_sequence_id, encoder_loss = self._encode(
        inputs, compute_loss, mode, variable_dtype, encoder_sequence_id,
        encoder_position, shared_params, encoder_layer_outputs,
        num_microbatches)
    logits, loss = self.decoder.call_simple(
        model_helpers.autoregressive_inputs(
            targets, sequence_id=decoder_sequence_id),
        targets, compute_loss, mode=mode, variable_dtype=variable_dtype,
        sequence_id=decoder_sequence_id,
        subsequence_id=decoder_subsequence_id,
        encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id,
        encoder_inputs=mtf.layers.rename_length_to_memory_length(inputs),
        position=decoder_position, shared_params=shared_params,
        encoder_layer_outputs=encoder_layer_outputs,
        num_microbatches=num_microbatches)
    if loss is not None and encoder_loss is not None:
      loss += encoder_loss
    return logits, loss

  def _encode(self, inputs, compute_loss, mode, variable_dtype, sequence_id,
              position, shared_params, layer_outputs, num_microbatches=1):
    """Runs the encoder: (its output, its sequence ids, its loss or None),
    the first two with "memory_length" for the decoder to attend to."""
    encoder_output, encoder_loss = self.encoder.call_simple(
        inputs, None, compute_loss, mode=mode, variable_dtype=variable_dtype,
        sequence_id=sequence_id, position=position,
        shared_params=shared_params, layer_outputs=layer_outputs,
        num_microbatches=num_microbatches)
    sequence_id = self._encoder_output_sequence_id(sequence_id)
    return (mtf.layers.rename_length_to_memory_length(encoder_output),
            mtf.layers.rename_length_to_memory_length(sequence_id),
            encoder_loss)

  def _encoder_output_sequence_id(self, sequence_id):
    """The sequence ids of the encoder's output, given its input's.

    The same here; subclasses whose encoder changes the length (a funnel)
    override this.
    """
    return sequence_id

  @gin.configurable(module="Bitransformer")
  def decode(self,
             inputs,
             variable_dtype=mtf.VariableDType(tf.float32),
             beam_size=1,
             alpha=0.6,
             temperature=0.0,
             sampling_keep_top_k=-1,
             decode_length_multiplier=1.5,
             decode_length_constant=10,
             max_decode_length=None):
    """Decodes the targets of `inputs`: sampling, or beam search.

    Args:
      inputs: an int32 Tensor [<batch_dims>, length_dim].
      variable_dtype: a mtf.VariableDType.
      beam_size: 1 samples (`Unitransformer.sample_autoregressive`); more
        runs beam search.
      alpha: the beam search length penalty.
      temperature: the sampling temperature (0.0 is greedy); must be 0 with
        beam search.
      sampling_keep_top_k: -1, or sample among the k largest logits only.
      decode_length_multiplier: beam search decodes at most
        max input length * multiplier + constant tokens.
      decode_length_constant: see decode_length_multiplier.
      max_decode_length: an optional integer: the output's length (a new
        "length" dimension) and the most tokens beam search decodes;
        default the input's length.

    Returns:
      an int32 Tensor [<batch_dims>, length].

    Raises:
      ValueError: beam search with a nonzero temperature or with
        sampling_keep_top_k.
    """
    encoder_layer_outputs = []
    shared_params = self._shared_params(inputs.mesh, variable_dtype)
    encoder_output, encoder_sequence_id, _ = self._encode(
        inputs, False, mode_keys.ModeKeys.PREDICT, variable_dtype,
        mtf.minimum(inputs, 1), None, shared_params, encoder_layer_outputs)
    encoder_inputs = mtf.layers.rename_length_to_memory_length(inputs)
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    if max_decode_length is None:
      decode_length_dim = length_dim
    else:
      decode_length_dim = mtf.Dimension("length", max_decode_length)
    if beam_size == 1:
      partial_sequences = mtf.zeros(
          inputs.mesh, mtf.Shape(batch_dims + [decode_length_dim]),
          dtype=tf.int32)
      return self.decoder.sample_autoregressive(
          partial_sequences, temperature=temperature,
          variable_dtype=variable_dtype, encoder_output=encoder_output,
          encoder_sequence_id=encoder_sequence_id,
          encoder_inputs=encoder_inputs, shared_params=shared_params,
          has_partial_sequences=False,
          encoder_layer_outputs=encoder_layer_outputs,
          sampling_keep_top_k=sampling_keep_top_k)
    name = type(self).__name__
    if temperature != 0:
      raise ValueError(f"{name}.decode: beam search needs temperature 0, "
                       f"got {temperature}.")
    if sampling_keep_top_k != -1:
      raise ValueError(f"{name}.decode: beam search needs "
                       f"sampling_keep_top_k -1, got {sampling_keep_top_k}.")
    beam_dim = mtf.Dimension("beam", beam_size)
    partial_sequences = mtf.zeros(
        inputs.mesh, mtf.Shape(batch_dims + [beam_dim, decode_length_dim]),
        dtype=tf.int32)
    input_length = mtf.reduce_sum(
        mtf.to_float(mtf.not_equal(inputs, 0)), reduced_dim=length_dim)
    max_input_length = mtf.reduce_max(input_length)
    decode_length = mtf.cast(
        max_input_length * decode_length_multiplier + decode_length_constant,
        tf.int32)
    if max_decode_length is not None:
      decode_length = mtf.minimum(decode_length, max_decode_length)
    return self.decoder.beam_search(
        partial_sequences, decode_length, variable_dtype=variable_dtype,
        encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id,
        encoder_inputs=encoder_inputs, alpha=alpha,
        shared_params=shared_params,
        encoder_layer_outputs=encoder_layer_outputs)


@gin.configurable(module=_MODULE)
class StudentTeacher:
  """A student model taught by a fixed teacher (knowledge distillation).

  The loss is (1 - fraction_soft) * the student's usual loss +
  temperature^2 * fraction_soft * the cross entropy of the student's
  softmax(logits / T) against the teacher's. Variables live under
  "student/" and "teacher/"; the teacher's are not trained and come from
  `teacher_checkpoint` (see `initialize`).
  """

  def __init__(self,
               student,
               teacher,
               temperature=None,
               fraction_soft=None,
               distill_start_step=0,
               teacher_checkpoint=None,
               initialize_student_weights=False):
    """Creates a StudentTeacher.

    Args:
      student: a Unitransformer or Bitransformer.
      teacher: a Unitransformer or Bitransformer.
      temperature: the softmax temperature of distillation (training only).
      fraction_soft: in [0, 1], the weight of the distillation loss
        (training only).
      distill_start_step: before this global step the loss is the
        student's own loss only.
      teacher_checkpoint: the path of the teacher's checkpoint.
      initialize_student_weights: whether `initialize` also starts the
        student from the teacher's checkpoint (same architecture).
    """
    self.student = student
    self.teacher = teacher
    self.temperature = temperature
    self.fraction_soft = fraction_soft
    self.distill_start_step = distill_start_step
    self.teacher_checkpoint = teacher_checkpoint
    self.initialize_student_weights = initialize_student_weights

  def call_simple(self,
                  inputs,
                  targets,
                  compute_loss,
                  variable_dtype=mtf.VariableDType(tf.float32),
                  num_microbatches=1,
                  **kargs):
    """The student's logits and (with compute_loss) the distillation loss.

    Args:
      inputs: an int32 Tensor [<batch_dims>, length_dim].
      targets: an int32 Tensor [<batch_dims>, length_dim].
      compute_loss: a boolean.
      variable_dtype: a mtf.VariableDType.
      num_microbatches: an integer.
      **kargs: more arguments of the models' call_simple.

    Returns:
      (logits, loss) with compute_loss, else the logits alone (as the
      original).
    """
    with tf.compat.v1.variable_scope("student"):
      student_logits, hard_loss = self.student.call_simple(
          inputs, targets, compute_loss=True, variable_dtype=variable_dtype,
          num_microbatches=num_microbatches, **kargs)
      if not compute_loss:
        return student_logits
      if self.fraction_soft == 0.0:
        return student_logits, hard_loss
    if self.student.output_vocab_dim != self.teacher.output_vocab_dim:
      raise ValueError(
          "StudentTeacher: student and teacher vocabularies differ: "
          f"{self.student.output_vocab_dim} vs "
          f"{self.teacher.output_vocab_dim}.")
    if self.student.z_loss != self.teacher.z_loss:
      raise ValueError(
          f"StudentTeacher: student z_loss {self.student.z_loss} differs "
          f"from the teacher's {self.teacher.z_loss}.")
    output_vocab_dim = self.student.output_vocab_dim
    graph = inputs.mesh.graph
    with tf.compat.v1.variable_scope("teacher"):
      teacher_logits, _ = self.teacher.call_simple(
          inputs, targets, compute_loss=True, variable_dtype=variable_dtype,
          num_microbatches=num_microbatches, **kargs)
    graph.make_variables_untrainable(
        [v for v in graph.trainable_variables
         if v.name.startswith("teacher/")])
    soft_targets = mtf.softmax(teacher_logits / self.temperature,
                               output_vocab_dim)
    soft_loss = mtf.layers.softmax_cross_entropy_with_logits(
        student_logits / self.temperature, mtf.stop_gradient(soft_targets),
        output_vocab_dim, z_loss=self.student.z_loss)
    weights = mtf.layers.weights_nonzero(
        targets, dtype=variable_dtype.activation_dtype)
    soft_loss = (mtf.reduce_sum(soft_loss * weights) /
                 self.student.loss_denominator(targets, num_microbatches))
    loss = ((1.0 - self.fraction_soft) * hard_loss +
            self.temperature ** 2 * self.fraction_soft * soft_loss)
    if self.distill_start_step > 0:
      step = mtf.optimize.get_or_create_global_step(inputs.mesh)
      loss = mtf.where(
          mtf.less(mtf.cast(step, tf.int32), self.distill_start_step),
          hard_loss, loss)
    return student_logits, loss

  def decode(self, *args, **kargs):
    """Decodes with the student (`sample_autoregressive` of a
    Unitransformer, `decode` of a Bitransformer)."""
    with tf.compat.v1.variable_scope("student"):
      if isinstance(self.student, unitransformer.Unitransformer):
        return self.student.sample_autoregressive(*args, **kargs)
      if isinstance(self.student, Bitransformer):
        return self.student.decode(*args, **kargs)
      raise ValueError(
          f"StudentTeacher.decode: unrecognized student {self.student!r}.")

  def initialize(self, mesh_impl=None):
    """Starts the teacher (and with initialize_student_weights the student)
    from `teacher_checkpoint`, once the model's variables exist.

    In `tf.compat.v1` graph mode (mesh_impl None) through
    `tf.compat.v1.train.init_from_checkpoint` on the master variables (call
    it before the variables are initialized). In eager or tf.function mode
    pass the mesh implementation holding the variables: the checkpoint (the
    teacher's, name-based or a `tf.train.Checkpoint(model=mesh_impl)`) is
    read into the variables under "teacher/" (and "student/").

    Args:
      mesh_impl: None in graph mode, else the mesh implementation.
    """
    if self.fraction_soft == 0.0:
      return
    scopes = ["teacher"] + (["student"] if self.initialize_student_weights
                            else [])
    for scope in scopes:
      if mesh_impl is None:
        variables = tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, scope=scope + "/")
        tf.compat.v1.train.init_from_checkpoint(
            self.teacher_checkpoint,
            {v.name[len(scope) + 1:].split(":")[0]: v for v in variables})
      else:
        # The mesh implementation's checkpoint node of the scope.
        node = mesh_impl._lookup_dependency(scope)  # pylint: disable=W0212
        if node is None:
          raise ValueError(
              f"StudentTeacher.initialize: no variables under {scope!r} in "
              "the mesh implementation yet; build the model first.")
        mtf.storage.checkpointing.restore_into(node, self.teacher_checkpoint)


@gin.configurable(module=_MODULE)
def make_bitransformer(input_vocab_size=gin.REQUIRED,
                       output_vocab_size=gin.REQUIRED,
                       layout=None,
                       mesh_shape=None,
                       encoder_name="encoder",
                       decoder_name="decoder",
                       bitransformer_cls=Bitransformer):
  """A Bitransformer built from gin: the encoder in gin scope "encoder/",
  the decoder in "decoder/" (e.g. `decoder/make_layer_stack.layers`).

  Args:
    input_vocab_size: an integer.
    output_vocab_size: an integer.
    layout: optional layout rules (read by some layers, e.g. MoE).
    mesh_shape: optional mesh shape (read by some layers, e.g. MoE).
    encoder_name: the encoder's variable scope.
    decoder_name: the decoder's variable scope.
    bitransformer_cls: the class to build, Bitransformer or a subclass.

  Returns:
    a `bitransformer_cls`.
  """

  def unitransformer_in(scope, name, input_size, output_size, autoregressive):
    with gin.config_scope(scope):
      return unitransformer.Unitransformer(
          layer_stack=layer_stack.make_layer_stack(),
          input_vocab_size=input_size,
          output_vocab_size=output_size,
          autoregressive=autoregressive,
          name=name,
          layout=layout,
          mesh_shape=mesh_shape)

  return bitransformer_cls(
      unitransformer_in("encoder", encoder_name, input_vocab_size, None,
                        False),
      unitransformer_in("decoder", decoder_name, output_vocab_size,
                        output_vocab_size, True))


@gin.configurable(module=_MODULE)
def make_bi_student_teacher(input_vocab_size=gin.REQUIRED,
                            output_vocab_size=gin.REQUIRED,
                            layout=None,
                            mesh_shape=None):
  """A StudentTeacher of two Bitransformers, built in gin scopes
  "student/" and "teacher/" (e.g. `teacher/encoder/make_layer_stack.layers`).
  """
  with gin.config_scope("student"):
    student = make_bitransformer(
        input_vocab_size=input_vocab_size,
        output_vocab_size=output_vocab_size, layout=layout,
        mesh_shape=mesh_shape)
  with gin.config_scope("teacher"):
    teacher = make_bitransformer(
        input_vocab_size=input_vocab_size,
        output_vocab_size=output_vocab_size, layout=layout,
        mesh_shape=mesh_shape)
  return StudentTeacher(student=student, teacher=teacher)
