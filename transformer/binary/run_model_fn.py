"""The estimator model function of a Transformer run.

`tpu_estimator_model_fn(...)` returns `model_fn(features, labels, mode,
params, config)` for `mesh_tensorflow.estimator`: it builds an mtf graph of
the model on the mesh implementation the estimator made
(`params["mesh_impl"]`), lowers it and returns the EstimatorSpec of the
mode:

- "train": the loss (microbatched when `serialize_num_microbatches` says
  so), its gradients and the optimizer's updates of the variables that
  `variable_filter` selects;
- "eval": the loss and teacher-forced metrics over the whole evaluation set
  (`neg_log_perplexity`, `token_accuracy`, `sequence_accuracy`,
  `mean_label`, `num_eval_tokens`, `max_targets_length`), weighted by
  the positive target ids (`eval_weights`), so padded examples weigh
  nothing;
- "infer": decoded ids, turned into strings in the graph when the
  vocabulary can (`decode_tf`) and the run is not on TPU;
- "score" (infer with `score_in_predict_mode`): the log-likelihood of each
  example's targets, and the targets' ids.

The estimator owns the global step, the checkpoints (with the original's
variable names) and warm starts, which the original's model function did
with session hooks.
"""

import re

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.estimator import estimator_spec
from mesh_tensorflow.estimator import metrics
from mesh_tensorflow.estimator.mode_keys import ModeKeys
from mesh_tensorflow.transformer.binary import run_features
from mesh_tensorflow.transformer.binary import run_inference
from mesh_tensorflow.transformer.binary import run_settings
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.utils"
SCORE = "score"

def metric_sum(values, name=None, **kwargs):
  """An eval metric: the sum of `values` over the whole eval set."""
  del name, kwargs
  return metrics.sum(values)


def metric_max(values, name=None, **kwargs):
  """An eval metric: the maximum of `values` over the whole eval set."""
  del name, kwargs
  return metrics.max(values)


def _variable_filter_fn(variable_filter):
  """mtf.Variable -> bool from None, a regex string or a callable."""
  if variable_filter is None:
    return lambda v: True
  if isinstance(variable_filter, str):
    pattern = re.compile(variable_filter)
    return lambda v: pattern.search(v.name) is not None
  if callable(variable_filter):
    return variable_filter
  raise ValueError("variable_filter must be None, a regex string or a "
                   f"function of an mtf.Variable, got {variable_filter!r}")


def _import_features(mesh, features, sequence_length, batch_dims,
                     ensemble_dims, model_type, mode):
  """The TF features as int32 mtf tensors [ensemble?, batch dims, length]."""
  mtf_features = {}
  for key, x in features.items():
    if key not in run_features.MODEL_FEATURES:
      continue
    base = key.split("_")[0]
    if base not in sequence_length:
      raise ValueError(f"Feature {key!r} has no length in sequence_length "
                       f"{sequence_length}.")
    length_dim = mtf.Dimension("length", sequence_length[base])
    shape = mtf.Shape(ensemble_dims + batch_dims + [length_dim])
    x = tf.cast(x, tf.int32)
    if x.shape.num_elements() is not None and (
        x.shape.num_elements() != shape.size):
      raise ValueError(
          f"Feature {key!r} of shape {x.shape.as_list()} does not fit the "
          f"model's {shape.to_string} (batch_size and sequence_length of "
          f"the run); mode {mode}, model_type {model_type}.")
    x = tf.reshape(x, shape.to_integer_list)
    mtf_features[key] = mtf.import_fully_replicated(mesh, x, shape, name=key)
  return mtf_features


def _check_features(mtf_features, mode, model_type):
  """Raises if a feature the mode and model type need is missing."""

  def require(name, should_exist):
    if should_exist == (name in mtf_features):
      return
    message = (f"mode={mode} model_type={model_type} should"
               f"{'' if should_exist else ' not'} have feature {name!r}")
    if "lm" in model_type:
      message += (". model_type 'lm' takes examples of targets only; "
                  "'delimited_lm' takes inputs and targets")
    raise ValueError(message)

  if mode == ModeKeys.PREDICT:
    require("inputs", True)
  elif mode == SCORE:
    # The targets are scored; a language model's hold the whole sequence
    # or follow their inputs in it (see _score_spec), an encoder-decoder's
    # are scored given the inputs.
    require("targets", True)
    if model_type not in ("lm", "delimited_lm"):
      require("inputs", True)
  else:
    require("targets", True)
    require("inputs", model_type != "lm")


@gin.configurable(module=_GIN_MODULE)
def tpu_estimator_model_fn(model_type,
                           transformer_model,
                           vocabulary,
                           model_dir,
                           use_tpu,
                           mesh_shape,
                           layout_rules,
                           batch_size,
                           sequence_length,
                           autostack,
                           keep_checkpoint_max,
                           save_checkpoints_steps,
                           learning_rate_schedule=None,
                           optimizer=None,
                           outer_batch_size=1,
                           tpu_summaries=False,
                           predict_fn=None,
                           score_in_predict_mode=False,
                           variable_filter=None,
                           init_checkpoint=None,
                           init_variable_filter="",
                           ensemble_inputs=None,
                           mesh_devices=None,
                           model_info_file=None,
                           hierarchical_tiling_spec=None,
                           shard_weight_update=False,
                           shard_parameters=False):
  """The estimator model function of a Transformer model.

  Args:
    model_type: "bitransformer", "bi_student_teacher", "lm", "delimited_lm"
      or "aligned".
    transformer_model: a Unitransformer, Bitransformer or StudentTeacher.
    vocabulary: a Vocabulary or an (inputs, targets) pair, for turning
      predictions into text.
    model_dir: the run's directory.
    use_tpu: whether the run is on TPU (predictions then stay ids).
    mesh_shape: the mtf.Shape of the mesh (the estimator's mesh
      implementation must have it).
    layout_rules: the mtf.LayoutRules.
    batch_size: sequences per batch.
    sequence_length: a dict feature -> (packed) length.
    autostack: whether the lowering stacks variables.
    keep_checkpoint_max, save_checkpoints_steps: kept for the original's
      signature; the estimator's RunConfig holds them.
    learning_rate_schedule: a float or a function of `step`.
    optimizer: an optimize.Optimizer class (training).
    outer_batch_size: the batch splits into [outer_batch, batch] in training
      and evaluation (for mixture-of-experts layouts).
    tpu_summaries: kept for the signature; the estimator writes summaries.
    predict_fn: optional (model, features, variable_dtype) -> ids of shape
      [batch, length], replacing the default decoding (or scoring).
    score_in_predict_mode: predict the log-likelihood of the targets.
    variable_filter: None, a regex or a function of an mtf.Variable: the
      variables trained.
    init_checkpoint, init_variable_filter: kept for the signature; warm
      starts are the estimator's (see utils.get_estimator).
    ensemble_inputs: the number of ensemble members with their own inputs.
    mesh_devices: kept for the signature; the estimator places the mesh.
    model_info_file: optional path; the lowering writes the variables and
      operations of the training graph to it.
    hierarchical_tiling_spec: not supported (a TPU placement of the
      original); must be None.
    shard_weight_update, shard_parameters: data-parallel sharding of the
      weight updates and of the weights (see utils.run); applied in
      training and evaluation on the run's mesh.

  Returns:
    model_fn(features, labels, mode, params, config) -> EstimatorSpec.
  """
  del keep_checkpoint_max, save_checkpoints_steps, tpu_summaries, model_dir
  del mesh_devices, init_checkpoint, init_variable_filter
  if hierarchical_tiling_spec is not None:
    raise ValueError("hierarchical_tiling_spec is not supported: the "
                     "estimator places TPU meshes with "
                     "mtf.backend.tpu_topology.auto_logical_to_physical_tpu.")
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)
  filter_fn = _variable_filter_fn(variable_filter)

  def model_features(mesh, features, mode):
    """(mtf features, batch dimension) of `features` in `mode`."""
    if outer_batch_size and mode not in (ModeKeys.PREDICT, SCORE):
      if batch_size % outer_batch_size:
        raise ValueError(f"outer_batch_size {outer_batch_size} does not "
                         f"divide batch_size {batch_size}.")
      batch_dim = mtf.Dimension("batch", batch_size // outer_batch_size)
      batch_dims = [mtf.Dimension("outer_batch", outer_batch_size), batch_dim]
    else:
      batch_dim = mtf.Dimension("batch", batch_size)
      batch_dims = [batch_dim]
    ensemble_dims = ([mtf.Dimension("ensemble", ensemble_inputs)]
                     if ensemble_inputs else [])
    mtf_features = _import_features(mesh, features, sequence_length,
                                    batch_dims, ensemble_dims, model_type,
                                    mode)
    _check_features(mtf_features, mode, model_type)
    if model_type == "delimited_lm" and mode not in (ModeKeys.PREDICT, SCORE):
      mtf_features = _dynamic_text2self(mtf_features)
    return mtf_features, batch_dim

  def logits_and_loss_fn(mode):
    variable_dtype = run_settings.get_variable_dtype()

    def logits_and_loss(features, num_microbatches=1):
      return _logits_and_loss(transformer_model, model_type, features, mode,
                              variable_dtype, num_microbatches)
    return logits_and_loss

  def train_step(graph, mtf_features, batch_dim, num_microbatches):
    return _build_train_step(graph, mtf_features,
                             logits_and_loss_fn(ModeKeys.TRAIN), batch_dim,
                             num_microbatches, learning_rate_schedule,
                             optimizer, filter_fn)

  def training_graph(features, mesh_shape=None, layout_rules=None,
                     shard_weight_update=False, shard_parameters=False):
    """(mtf.Graph, loss) of one training step on TF `features`, not lowered:
    the graph training builds (model, loss, gradients, optimizer updates),
    in one microbatch, for the layout search (run_auto_layout) and the run
    planner (transformer.plan_model). Call inside a tf.Graph that has a
    global step. Without sharding (the default) the graph does not depend
    on the layout; with shard_weight_update or shard_parameters the mesh is
    sharded for data parallelism first (mtf.shard_data_parallel with
    mesh_shape and layout_rules), as model_fn shards it."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    if shard_weight_update or shard_parameters:
      mtf.shard_data_parallel(
          mesh, mtf.convert_to_shape(mesh_shape),
          mtf.convert_to_layout_rules(layout_rules),
          shard_weight_update=shard_weight_update,
          shard_parameters=shard_parameters)
    mtf_features, batch_dim = model_features(mesh, features, ModeKeys.TRAIN)
    return graph, train_step(graph, mtf_features, batch_dim, 1)

  def model_fn(features, labels, mode, params, config=None):
    """Builds, lowers and returns the EstimatorSpec of `mode`."""
    del labels, config
    if mode == ModeKeys.PREDICT and score_in_predict_mode:
      mode = SCORE
    # The estimator's mesh: the run's, or one CPU for an export.
    mesh_impl = params["mesh_impl"]
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    if (mode in (ModeKeys.TRAIN, ModeKeys.EVAL) and
        mesh_impl.shape == mesh_shape):
      mtf.shard_data_parallel(mesh, mesh_shape, layout_rules,
                              shard_weight_update=shard_weight_update,
                              shard_parameters=shard_parameters)
    mtf_features, batch_dim = model_features(mesh, features, mode)
    variable_dtype = run_settings.get_variable_dtype()

    def lower(log_file=None):
      # What uneven splits (utils.run.allow_uneven_splits) pad, if any.
      mtf.padding_report(graph, {mesh: mesh_impl})
      return mtf.Lowering(graph, {mesh: mesh_impl}, autostack=autostack,
                          log_file=log_file)

    if mode == SCORE:
      return _score_spec(transformer_model, model_type, mtf_features,
                         predict_fn, variable_dtype, lower)
    if mode == ModeKeys.PREDICT:
      return _predict_spec(transformer_model, mtf_features, predict_fn,
                           variable_dtype, sequence_length, vocabulary,
                           use_tpu, lower)
    if mode == ModeKeys.TRAIN:
      num_microbatches = run_settings.serialize_num_microbatches(
          batch_dim, sequence_length, mesh_shape, layout_rules)
      loss = train_step(graph, mtf_features, batch_dim, num_microbatches)
      return _train_spec(loss, transformer_model, mesh_impl, lower,
                         model_info_file)
    return _eval_spec(mtf_features, logits_and_loss_fn(mode), model_type,
                      lower)

  # For the layout search: the training graph without lowering.
  model_fn.training_graph = training_graph
  return model_fn


def _logits_and_loss(model, model_type, features, mode, variable_dtype,
                     num_microbatches):
  """(logits, loss) of the model on `features`, teacher-forced."""
  targets = features["targets"]
  if model_type in ("lm", "delimited_lm"):
    inputs = mtf.shift(targets, offset=1, dim=targets.shape.dims[-1],
                       wrap=False)
  else:
    inputs = features["inputs"]
  if isinstance(model, transformer.Unitransformer):
    position_kwargs = dict(sequence_id=features.get("targets_segmentation"),
                           position=features.get("targets_position"))
  else:
    position_kwargs = dict(
        encoder_sequence_id=features.get("inputs_segmentation"),
        decoder_sequence_id=features.get("targets_segmentation"),
        decoder_subsequence_id=features.get("targets_subsegmentation"),
        encoder_position=features.get("inputs_position"),
        decoder_position=features.get("targets_position"))
  return model.call_simple(inputs=inputs, targets=targets, compute_loss=True,
                           mode=mode, variable_dtype=variable_dtype,
                           num_microbatches=num_microbatches,
                           **position_kwargs)


def _build_train_step(graph, mtf_features, logits_and_loss, batch_dim,
                      num_microbatches, learning_rate_schedule, optimizer,
                      filter_fn):
  """Builds the training step's loss, gradients and optimizer updates (of
  the variables filter_fn selects); returns the loss."""
  if optimizer is None:
    raise ValueError("Training needs an optimizer (utils.run.optimizer).")
  if num_microbatches > 1:
    def serialized_fn(features):
      return {"loss": logits_and_loss(features, num_microbatches)[1]}
    var_grads, loss_dict = mtf.serialize_training_step(
        mtf_features, serialized_fn, batch_dim, num_microbatches)
    loss = loss_dict["loss"]
  else:
    loss = logits_and_loss(mtf_features)[1]
    var_grads = mtf.gradients(
        [loss], [v.outputs[0] for v in graph.trainable_variables])
  if callable(learning_rate_schedule):
    learning_rate = learning_rate_schedule(
        step=tf.compat.v1.train.get_global_step())
  else:
    learning_rate = learning_rate_schedule
  variables = graph.trainable_variables
  trained = [filter_fn(v) for v in variables]
  if not all(trained):
    logging.info("Variables being trained: %s",
                 [v.name for v, t in zip(variables, trained) if t])
    logging.info("Variables not being trained: %s",
                 [v.name for v, t in zip(variables, trained) if not t])
  optimizer(learning_rate=learning_rate).apply_grads(
      [g for g, t in zip(var_grads, trained) if t],
      [v for v, t in zip(variables, trained) if t])
  return loss


def _train_spec(loss, model, mesh_impl, lower, model_info_file):
  """The training step's EstimatorSpec: lowers the graph, exports the
  loss."""
  lowering = lower(model_info_file)
  tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
  if hasattr(model, "initialize"):
    model.initialize(mesh_impl)
  return estimator_spec.EstimatorSpec(ModeKeys.TRAIN, loss=tf_loss)


def _eval_spec(mtf_features, logits_and_loss, model_type, lower):
  """Teacher-forced evaluation: loss and weighted running-mean metrics."""
  logits, loss = logits_and_loss(mtf_features)
  logits = mtf.cast(logits, tf.float32)
  vocab_dim = logits.shape.dims[-1]
  targets = mtf_features["targets"]
  cross_entropy = mtf.layers.softmax_cross_entropy_with_logits(
      logits, targets, vocab_dim)
  predictions = mtf.cast(mtf.argmax(logits, vocab_dim), targets.dtype)
  weights = eval_weights(targets, model_type)
  anonymous = [mtf.anonymize(t)
               for t in (cross_entropy, predictions, targets, weights)]
  lowering = lower()
  tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
  xent, predictions, labels, weights = (
      lowering.export_to_tf_tensor(t) for t in anonymous)
  return estimator_spec.EstimatorSpec(
      ModeKeys.EVAL, loss=tf_loss,
      eval_metric_ops=teacher_forced_metrics(xent, predictions, labels,
                                             weights))


def eval_weights(targets, model_type):
  """Which target tokens the evaluation metrics count, as float32 0 / 1.

  As in the original: positive ids only (0 is padding; negative ids mark
  an unscored prefix), and for a "delimited_lm" not the inputs part.

  Args:
    targets: an int Tensor [..., length].
    model_type: the run's model type.
  """
  weights = mtf.cast(mtf.greater(targets, 0), tf.float32)
  if model_type == "delimited_lm":
    weights *= mtf.cast(mtf.logical_not(
        transformer.delimited_lm_inputs_mask(targets)), tf.float32)
  return weights


def teacher_forced_metrics(xent, predictions, labels, weights):
  """The original's eval metrics, as running means over the eval set.

  Args:
    xent: float [..., length] cross entropy of each target token.
    predictions: int [..., length] argmax ids.
    labels: int [..., length] targets.
    weights: float [..., length], 0 for padding.
  """
  token_correct = tf.cast(tf.equal(predictions, labels), tf.float32) * weights
  sequence_tokens = tf.reduce_sum(weights, -1)
  sequence_correct = tf.cast(
      tf.equal(tf.reduce_sum(token_correct, -1), sequence_tokens), tf.float32)
  sequence_weights = tf.cast(tf.not_equal(sequence_tokens, 0), tf.float32)
  return {
      "neg_log_perplexity": metrics.mean(-xent, weights),
      "token_accuracy": metrics.mean(token_correct, weights),
      "sequence_accuracy": metrics.mean(sequence_correct, sequence_weights),
      # A checksum: equal when two runs evaluated the same data. Weighted,
      # as in the original, so that it agrees with the original's number.
      "mean_label": metrics.mean(tf.cast(labels, tf.float32), weights),
      "num_eval_tokens": metric_sum(weights, name="num_eval_tokens"),
      "max_targets_length": metric_max(sequence_tokens,
                                        name="max_targets_length"),
  }


def _predict_spec(model, mtf_features, predict_fn, variable_dtype,
                  sequence_length, vocabulary, use_tpu, lower):
  """Decoding: {"inputs", "outputs"} ids, or strings where possible."""
  inputs = mtf_features["inputs"]
  if predict_fn:
    samples = predict_fn(model=model, features=mtf_features,
                         variable_dtype=variable_dtype)
  elif isinstance(model, transformer.Unitransformer):
    # Room after the prompt for the targets.
    length_dim = inputs.shape.dims[-1]
    padded = mtf.pad(inputs, [0, sequence_length["targets"]], length_dim.name)
    samples = model.sample_autoregressive(
        padded, variable_dtype=variable_dtype, remove_partial_sequences=True)
  else:
    samples = model.decode(inputs, variable_dtype=variable_dtype)
  inputs, samples = mtf.anonymize(inputs), mtf.anonymize(samples)
  lowering = lower()
  tf_inputs = run_inference.clean_decodes(
      lowering.export_to_tf_tensor(inputs))
  tf_outputs = run_inference.clean_decodes(
      lowering.export_to_tf_tensor(samples))

  def maybe_detokenize(ids, vocab):
    if not use_tpu and hasattr(vocab, "decode_tf"):
      return vocab.decode_tf(ids)
    return ids

  predictions = {
      "inputs": maybe_detokenize(
          tf_inputs, run_settings.inputs_vocabulary(vocabulary)),
      "outputs": maybe_detokenize(
          tf_outputs, run_settings.targets_vocabulary(vocabulary)),
  }
  return estimator_spec.EstimatorSpec(ModeKeys.PREDICT,
                                      predictions=predictions)


def _score_spec(model, model_type, mtf_features, predict_fn, variable_dtype,
                lower):
  """Scoring: the log-likelihood of each example's targets, plus the ids.

  As the original: a language model given inputs scores them joined in
  front of their targets (_dynamic_text2self); a "delimited_lm" scores
  only the targets' part, an "lm" the whole sequence (inputs included).
  """
  given_targets = mtf_features["targets"]
  if model_type in ("lm", "delimited_lm") and "inputs" in mtf_features:
    if model_type == "lm":
      logging.warning("Scoring of lm models will include loss from the "
                      "'inputs'.")
    mtf_features = _dynamic_text2self(mtf_features)
  # Negative ids mark an unscored prefix (encode_inputs' unscored_prefix).
  scored = mtf.cast(mtf.greater(mtf_features["targets"], 0), tf.float32)
  targets = mtf.abs(mtf_features["targets"])
  if predict_fn:
    scores = predict_fn(model=model, features=mtf_features,
                        variable_dtype=variable_dtype)
  else:
    length_dim = targets.shape.dims[-1]
    if isinstance(model, transformer.Unitransformer):
      inputs = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
    else:
      inputs = mtf_features["inputs"]
    logits, _ = model.call_simple(inputs=inputs, targets=targets,
                                  compute_loss=False, mode=SCORE,
                                  variable_dtype=variable_dtype)
    logits = mtf.cast(logits, tf.float32)
    vocab_dim = logits.shape.dims[-1]
    cross_entropy = mtf.layers.softmax_cross_entropy_with_logits(
        logits, targets, vocab_dim)
    cross_entropy *= scored
    if model_type == "delimited_lm":
      cross_entropy *= mtf.cast(mtf.logical_not(
          transformer.delimited_lm_inputs_mask(targets)), tf.float32)
    scores = -mtf.reduce_sum(cross_entropy, reduced_dim=length_dim)
  # The scores and the example's targets ids (everything after their
  # first EOS padding), not the inputs, so save_scores returns (scores,
  # targets) as the original's. (The original gave a joined example's
  # ids, whose text ends at the inputs' EOS.)
  exported = {"scores": scores, "targets": mtf.abs(given_targets)}
  exported = {k: mtf.anonymize(v) for k, v in exported.items()}
  lowering = lower()
  predictions = {k: lowering.export_to_tf_tensor(v)
                 for k, v in exported.items()}
  predictions["targets"] = run_inference.clean_decodes(predictions["targets"])
  return estimator_spec.EstimatorSpec(ModeKeys.PREDICT,
                                      predictions=predictions)


def _dynamic_text2self(mtf_features):
  """Text2text features as text2self ones, for "delimited_lm".

  Each example's inputs and targets are concatenated (inputs first) into
  new targets of twice the length; segment ids and positions follow.
  Unpacked features (no "inputs_segmentation") hold one example per row:
  as in the original, every non-zero id belongs to segment 1 and its
  position is its index in the row.

  Args:
    mtf_features: "inputs" and "targets", and when packed their
      "_segmentation" and "_position" features.

  Returns:
    {"targets", "targets_segmentation", "targets_position"}.

  Raises:
    ValueError: packed features lack one of the four.
  """
  inputs = mtf_features["inputs"]
  targets = mtf_features["targets"]
  if "inputs_segmentation" in mtf_features:
    for key in ("targets_segmentation", "inputs_position",
                "targets_position"):
      if key not in mtf_features:
        raise ValueError(f"model_type 'delimited_lm': packed features (with "
                         f"'inputs_segmentation') lack {key!r}.")
    inputs_segmentation = mtf_features["inputs_segmentation"]
    targets_segmentation = mtf_features["targets_segmentation"]
    inputs_position = mtf_features["inputs_position"]
    targets_position = mtf_features["targets_position"]
  else:
    inputs_segmentation, inputs_position = _one_segment_per_row(inputs)
    targets_segmentation, targets_position = _one_segment_per_row(targets)
  inputs_length_dim = inputs.shape.dims[-1]
  targets_length_dim = targets.shape.dims[-1]
  mesh = targets.mesh
  # More segments than any row can hold; segment 0 is padding.
  segments_dim = mtf.Dimension("segments", targets_length_dim.size)

  def segment_lengths(segmentation, length_dim):
    return mtf.reduce_sum(
        mtf.one_hot(segmentation, segments_dim, dtype=tf.int32),
        reduced_dim=length_dim)

  segments = mtf.range(mesh, segments_dim, dtype=tf.int32)
  real_segment = mtf.to_int32(mtf.not_equal(segments, 0))
  inputs_lengths = segment_lengths(inputs_segmentation,
                                   inputs_length_dim) * real_segment
  targets_lengths = segment_lengths(targets_segmentation,
                                    targets_length_dim) * real_segment
  # Targets come after their inputs in the combined example.
  targets_position += mtf.gather(inputs_lengths, targets_segmentation,
                                 segments_dim)
  new_length_dim = mtf.Dimension(
      "new_length", inputs_length_dim.size + targets_length_dim.size)
  new_positions = mtf.range(mesh, new_length_dim, dtype=tf.int32)
  starts = mtf.cumsum(inputs_lengths + targets_lengths, segments_dim,
                      exclusive=True)
  # Padding (segment 0) goes past the end, so it lands nowhere.
  starts += new_length_dim.size * mtf.to_int32(mtf.equal(segments, 0))

  def permutation(position, segmentation):
    destination = position + mtf.gather(starts, segmentation, segments_dim)
    return mtf.to_int32(mtf.equal(new_positions, destination))

  inputs_permutation = permutation(inputs_position, inputs_segmentation)
  targets_permutation = permutation(targets_position, targets_segmentation)

  def combine(from_inputs, from_targets):
    shape = inputs.shape.dims[:-1] + [new_length_dim]
    combined = (
        mtf.einsum([from_inputs, inputs_permutation], output_shape=shape) +
        mtf.einsum([from_targets, targets_permutation], output_shape=shape))
    return mtf.rename_dimension(combined, "new_length", "length")

  return {
      "targets": combine(inputs, targets),
      "targets_segmentation": combine(inputs_segmentation,
                                      targets_segmentation),
      "targets_position": combine(inputs_position, targets_position),
  }


def _one_segment_per_row(ids):
  """(segmentation, position) of unpacked ids [..., length]: segment 1 and
  the index in the row for every non-zero id, 0 and 0 for padding."""
  length_dim = ids.shape.dims[-1]
  segmentation = mtf.to_int32(mtf.not_equal(ids, 0))
  position = mtf.range(ids.mesh, length_dim, dtype=tf.int32) * segmentation
  return segmentation, position
