"""The settings of a Transformer run: dtypes, mesh, batch, steps, model.

The parts of the original's `transformer/utils.py` that size and build a
run: the variable dtypes (`get_variable_dtype`), the default TPU mesh shape
(`tpu_mesh_shape`), the batch size in sequences (`compute_batch_size`),
microbatching (`serialize_num_microbatches`), the default number of steps
(`auto_train_steps`), the vocabulary pair helpers and `build_model`. Every
gin name is the original's (`utils.<name>`); `utils` re-exports them.

defaults.gin asks for bfloat16 activations
(`utils.get_variable_dtype.activation_dtype = "bfloat16"`). They run on CPU
too: TF 2.21 has bfloat16 CPU kernels for the ops the Transformer lowers to,
and SPMD programs gather bfloat16 as float32 (`simd_collectives`: TF's
all-gather lacks bfloat16).
"""

import functools

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

# The model types `build_model` knows, as in the original.
MODEL_TYPES = ("bitransformer", "bi_student_teacher", "lm", "delimited_lm",
               "aligned")


@gin.configurable(module=_GIN_MODULE)
def get_variable_dtype(master_dtype=tf.bfloat16,
                       slice_dtype=tf.float32,
                       activation_dtype=tf.float32):
  """The dtypes of the run's variables and activations.

  Args:
    master_dtype: a dtype or its name: what checkpoints hold; keep it the
      same between training and evaluation or inference.
    slice_dtype: a dtype or its name: the variables in memory (float32 for
      training).
    activation_dtype: a dtype or its name: the activations; bfloat16 halves
      their memory at some cost in precision.

  Returns:
    a mtf.VariableDType.
  """
  return mtf.VariableDType(master_dtype=tf.as_dtype(master_dtype),
                           slice_dtype=tf.as_dtype(slice_dtype),
                           activation_dtype=tf.as_dtype(activation_dtype))


@gin.configurable(module=_GIN_MODULE)
def tpu_mesh_shape(tpu_topology=gin.REQUIRED,
                   model_parallelism=gin.REQUIRED,
                   ensemble_parallelism=None):
  """A mesh shape for data and model parallelism over a TPU's cores.

  "AxB" topologies have 2 cores per chip (A * B * 2 cores); "vN-M" names
  have M cores. The cores split into "ensemble" (when
  ensemble_parallelism > 1), "batch" and "model" mesh dimensions; a
  dimension of size 1 is left out. E.g. ("4x4", 8) -> batch:4, model:8.

  Args:
    tpu_topology: a string, e.g. "2x2" or "v3-8".
    model_parallelism: an integer, the cores per model replica.
    ensemble_parallelism: an optional integer, the number of models of an
      ensemble trained side by side.

  Returns:
    a mtf.Shape.

  Raises:
    ValueError: if the topology is not of those forms or the parallelisms
      do not divide the number of cores.
  """
  num_cores = _num_tpu_cores(tpu_topology)
  replicas = model_parallelism * (ensemble_parallelism or 1)
  if model_parallelism < 1 or num_cores % replicas:
    raise ValueError(
        f"tpu_mesh_shape: model_parallelism={model_parallelism} and "
        f"ensemble_parallelism={ensemble_parallelism} must divide the "
        f"{num_cores} cores of tpu_topology {tpu_topology!r}")
  data_parallelism = num_cores // replicas
  dims = []
  if ensemble_parallelism and ensemble_parallelism > 1:
    dims.append(mtf.Dimension("ensemble", ensemble_parallelism))
  if data_parallelism > 1:
    dims.append(mtf.Dimension("batch", data_parallelism))
  if model_parallelism > 1:
    dims.append(mtf.Dimension("model", model_parallelism))
  return mtf.Shape(dims)


def _num_tpu_cores(tpu_topology):
  """The number of cores of "AxB" (2 per chip) or "vN-M" (M)."""
  try:
    if tpu_topology.startswith("v"):
      return int(tpu_topology.split("-")[-1])
    x, y = tpu_topology.split("x")
    return int(x) * int(y) * 2
  except (AttributeError, ValueError):
    raise ValueError(
        f"tpu_mesh_shape: tpu_topology {tpu_topology!r} is neither 'AxB' "
        "(e.g. '4x4') nor 'vN-M' (e.g. 'v3-8')") from None


@gin.configurable(module=_GIN_MODULE)
def build_model(model_type="bitransformer",
                input_vocab_size=gin.REQUIRED,
                output_vocab_size=gin.REQUIRED,
                layout_rules=None,
                mesh_shape=None):
  """Builds the Transformer model of `model_type` from the gin configuration.

  "bitransformer": an encoder-decoder (`transformer.make_bitransformer`),
    for datasets whose targets differ from their inputs.
  "bi_student_teacher": a student and a teacher Bitransformer
    (`transformer.make_bi_student_teacher`).
  "lm": an autoregressive language model (one layer stack: a decoder
    without encoder attention), for text2self datasets.
  "delimited_lm": an "lm" trained on [inputs, EOS, targets, EOS] examples;
    its checkpoints are compatible with "lm" models.
  "aligned": a non-autoregressive single stack (like BERT) whose inputs and
    targets are aligned position by position.

  Args:
    model_type: one of MODEL_TYPES.
    input_vocab_size: an integer.
    output_vocab_size: an integer.
    layout_rules: optional, anything mtf.convert_to_layout_rules takes.
    mesh_shape: optional, anything mtf.convert_to_shape takes.

  Returns:
    a transformer.Unitransformer, Bitransformer or StudentTeacher.

  Raises:
    ValueError: for an unknown model_type.
  """
  make_encoder_decoder = {
      "bitransformer": transformer.make_bitransformer,
      "bi_student_teacher": transformer.make_bi_student_teacher,
  }.get(model_type)
  if make_encoder_decoder is not None:
    return make_encoder_decoder(
        input_vocab_size=input_vocab_size,
        output_vocab_size=output_vocab_size,
        mesh_shape=mesh_shape,
        layout=layout_rules)
  if model_type in ("lm", "delimited_lm", "aligned"):
    return transformer.Unitransformer(
        autoregressive=model_type in ("lm", "delimited_lm"),
        layer_stack=transformer.make_layer_stack(),
        input_vocab_size=input_vocab_size,
        output_vocab_size=output_vocab_size,
        mesh_shape=mesh_shape,
        layout=layout_rules)
  raise ValueError(
      f"build_model: unknown model_type {model_type!r}; expected one of "
      f"{', '.join(MODEL_TYPES)}")


def inputs_vocabulary(vocabulary):
  """The inputs' Vocabulary of a Vocabulary or an (inputs, targets) pair."""
  if isinstance(vocabulary, tuple):
    return vocabulary[0]
  return vocabulary


def targets_vocabulary(vocabulary):
  """The targets' Vocabulary of a Vocabulary or an (inputs, targets) pair."""
  if isinstance(vocabulary, tuple):
    return vocabulary[1]
  return vocabulary


@gin.configurable(module=_GIN_MODULE)
def separate_vocabularies(inputs=gin.REQUIRED, targets=gin.REQUIRED):
  """An (inputs, targets) vocabulary pair, for gin files."""
  return (inputs, targets)


# How `compute_batch_size` reads its (method, value) pair.
BATCH_SIZE_METHODS = ("sequences_per_batch", "tokens_per_batch",
                      "sequences_per_replica", "tokens_per_replica")


def _num_replicas(mesh_shape, layout_rules):
  """How many ways the batch splits: the mesh dimensions of the "batch" and
  "outer_batch" tensor dimensions."""
  return (mtf.tensor_dim_to_mesh_dim_size(
      layout_rules, mesh_shape, mtf.Dimension("batch", 0)) *
          mtf.tensor_dim_to_mesh_dim_size(
              layout_rules, mesh_shape, mtf.Dimension("outer_batch", 0)))


def compute_batch_size(sequence_length, mesh_shape, layout_rules,
                       method_and_value):
  """The batch size in sequences, from a (method, value) pair.

  "sequences_per_batch" and "tokens_per_batch" give the whole batch (the
  same on every mesh); "sequences_per_replica" and "tokens_per_replica" the
  share of one data-parallel replica (the batch grows with the mesh). Tokens
  count the longest feature of `sequence_length`. E.g.
  ("tokens_per_replica", 2048) with length 1024 and 16 replicas -> 32.

  Args:
    sequence_length: an integer or a dict feature -> length.
    mesh_shape: anything mtf.convert_to_shape takes.
    layout_rules: anything mtf.convert_to_layout_rules takes.
    method_and_value: (one of BATCH_SIZE_METHODS, an integer).

  Returns:
    an integer.

  Raises:
    ValueError: for an unknown method or tokens that do not divide by the
      sequence length.
  """
  if isinstance(sequence_length, dict):
    length = max(sequence_length.values())
  else:
    length = int(sequence_length)
  try:
    method, value = method_and_value
  except (TypeError, ValueError):
    raise ValueError(
        f"batch_size must be an integer or a (method, value) pair, got "
        f"{method_and_value!r}") from None
  if method not in BATCH_SIZE_METHODS:
    raise ValueError(f"batch_size method {method!r} is unknown; expected "
                     f"one of {', '.join(BATCH_SIZE_METHODS)}")
  if method.startswith("tokens"):
    if value % length:
      raise ValueError(
          f"batch_size ({method!r}, {value}): {value} tokens do not divide "
          f"into sequences of length {length}")
    value //= length
  if method.endswith("per_replica"):
    value *= _num_replicas(mtf.convert_to_shape(mesh_shape),
                           mtf.convert_to_layout_rules(layout_rules))
  return value


@gin.configurable(module=_GIN_MODULE)
def serialize_num_microbatches(batch_dim,
                               sequence_length,
                               mesh_shape,
                               layout_rules,
                               tokens_per_microbatch_per_replica=None):
  """How many sequential microbatches a training step is split into.

  Each replica's share of the batch is cut into microbatches of about
  `tokens_per_microbatch_per_replica` tokens whose gradients are summed
  before one update, to bound activation memory. The microbatch size in
  sequences is the largest divisor of the replica's share not above that.

  Args:
    batch_dim: the mtf.Dimension of the batch.
    sequence_length: an integer or a dict feature -> length.
    mesh_shape: anything mtf.convert_to_shape takes.
    layout_rules: anything mtf.convert_to_layout_rules takes.
    tokens_per_microbatch_per_replica: an integer, or None for no split.

  Returns:
    an integer, the number of microbatches (1: no split).
  """
  if not tokens_per_microbatch_per_replica:
    return 1
  if isinstance(sequence_length, dict):
    length = max(sequence_length.values())
  else:
    length = int(sequence_length)
  batch_per_replica = mtf.tensor_dim_to_size_per_split(
      mtf.convert_to_layout_rules(layout_rules),
      mtf.convert_to_shape(mesh_shape), batch_dim)
  microbatch_size = max(1, tokens_per_microbatch_per_replica // length)
  while batch_per_replica % microbatch_size:
    microbatch_size -= 1
  num_microbatches = batch_per_replica // microbatch_size
  logging.info(
      "serialize_num_microbatches: tokens_per_microbatch_per_replica=%d "
      "batch_dim=%s sequence_length=%s batch_per_replica=%d "
      "num_microbatches=%d", tokens_per_microbatch_per_replica, batch_dim,
      sequence_length, batch_per_replica, num_microbatches)
  return num_microbatches


@gin.configurable(module=_GIN_MODULE)
def auto_train_steps(batch_size, sequence_length, train_tokens=2 ** 36):
  """Training steps that process `train_tokens` tokens in all.

  Args:
    batch_size: sequences per batch.
    sequence_length: an integer or a dict feature -> length (the longest
      counts).
    train_tokens: the tokens of the whole training.

  Returns:
    train_tokens // (batch_size * sequence length).
  """
  if isinstance(sequence_length, dict):
    sequence_length = max(sequence_length.values())
  return train_tokens // (batch_size * sequence_length)


@gin.configurable(module=_GIN_MODULE)
def variable_filter_max_size(v, max_size=1e7):
  """A `variable_filter`: train only variables of at most max_size values."""
  return v.size <= max_size


def bind_learning_rate_schedule(learning_rate_schedule, train_steps):
  """A float, or a function of `step` with total_train_steps bound (a list
  of factors: their product)."""
  if isinstance(learning_rate_schedule, (list, tuple)):
    learning_rate_schedule = functools.partial(
        learning_rate_schedules.product_learning_rate,
        factors=list(learning_rate_schedule))
  if callable(learning_rate_schedule):
    return functools.partial(learning_rate_schedule,
                             total_train_steps=train_steps)
  return learning_rate_schedule
