"""The Transformer's run loop: `run(mode=...)` and the pieces it is made of.

The original's `transformer/utils.py`, on `mesh_tensorflow.estimator`:

- `run(...)` (gin-configured) sizes the run (batch, steps, learning-rate
  schedule), builds the estimator (`get_estimator`) and runs one mode:
  "train", "eval" (decode and score the eval datasets), "perplexity_eval",
  "infer" (decode a file), "score_from_strings", "score_from_dataset",
  "export_infer" / "export_score" (SavedModels; "export" is the old name of
  "export_infer").
- `get_estimator` builds the model (`build_model`), its model function
  (`tpu_estimator_model_fn`) and an Estimator (TPUEstimator on TPU).
- The mode drivers live in smaller modules and are re-exported here under
  the original's names: run_settings (dtypes, batch size, steps),
  run_model_fn, run_checkpoints, run_inference, run_scoring, run_eval.

Every gin name is the original's (`utils.run.mesh_shape`,
`utils.get_variable_dtype.activation_dtype`, ...), so the original's gin
files and operative configs parse unchanged.
"""

import functools
import importlib.resources
import os

from absl import flags
from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator as estimator_lib
from mesh_tensorflow.randomness import run_seed
from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer.binary import run_auto_layout
from mesh_tensorflow.transformer.binary import run_devices
# The original's names, from the modules that now hold them.
# pylint: disable=unused-import
from mesh_tensorflow.transformer.binary.run_checkpoints import flexible_ckpt_init_mapping
from mesh_tensorflow.transformer.binary.run_checkpoints import get_checkpoint_iterator
from mesh_tensorflow.transformer.binary.run_checkpoints import get_step_from_checkpoint_path
from mesh_tensorflow.transformer.binary.run_checkpoints import init_checkpoint_variable_mapping
from mesh_tensorflow.transformer.binary.run_checkpoints import should_load_variable
from mesh_tensorflow.transformer.binary.run_eval import eval_model
from mesh_tensorflow.transformer.binary.run_eval import perplexity_eval
from mesh_tensorflow.transformer.binary.run_inference import clean_decodes
from mesh_tensorflow.transformer.binary.run_inference import compute_log_likelihoods
from mesh_tensorflow.transformer.binary.run_inference import decode
from mesh_tensorflow.transformer.binary.run_inference import decode_from_dataset
from mesh_tensorflow.transformer.binary.run_inference import decode_from_file
from mesh_tensorflow.transformer.binary.run_inference import encode_delimited_lm
from mesh_tensorflow.transformer.binary.run_inference import encode_inputs
from mesh_tensorflow.transformer.binary.run_inference import export_model
from mesh_tensorflow.transformer.binary.run_inference import get_inputs_from_file
from mesh_tensorflow.transformer.binary.run_inference import infer_model
from mesh_tensorflow.transformer.binary.run_inference import maybe_add_pretokenized_features as _maybe_add_pretokenized_features
from mesh_tensorflow.transformer.binary.run_inference import write_lines_to_file
from mesh_tensorflow.transformer.binary.run_model_fn import _dynamic_text2self
from mesh_tensorflow.transformer.binary.run_model_fn import metric_max
from mesh_tensorflow.transformer.binary.run_model_fn import metric_sum
from mesh_tensorflow.transformer.binary.run_model_fn import tpu_estimator_model_fn
from mesh_tensorflow.transformer.binary.run_scoring import save_scores
from mesh_tensorflow.transformer.binary.run_scoring import score_from_dataset
from mesh_tensorflow.transformer.binary.run_scoring import score_from_strings
from mesh_tensorflow.transformer.binary.run_scoring import score_with_estimator
from mesh_tensorflow.transformer.binary.run_settings import auto_train_steps
from mesh_tensorflow.transformer.binary.run_settings import build_model
from mesh_tensorflow.transformer.binary.run_settings import compute_batch_size
from mesh_tensorflow.transformer.binary.run_settings import get_variable_dtype
from mesh_tensorflow.transformer.binary.run_settings import inputs_vocabulary
from mesh_tensorflow.transformer.binary.run_settings import MODEL_TYPES
from mesh_tensorflow.transformer.binary.run_settings import separate_vocabularies
from mesh_tensorflow.transformer.binary.run_settings import serialize_num_microbatches
from mesh_tensorflow.transformer.binary.run_settings import targets_vocabulary
from mesh_tensorflow.transformer.binary.run_settings import tpu_mesh_shape
from mesh_tensorflow.transformer.binary.run_settings import variable_filter_max_size
# pylint: enable=unused-import

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

MODES = ("train", "eval", "score_eval", "perplexity_eval", "infer",
         "score_from_strings", "score_from_dataset", "export_infer",
         "export_score", "export")

# The gin flags, as the original defined them here.
if "gin_file" not in flags.FLAGS:
  flags.DEFINE_multi_string(
      "gin_file", None, "A gin file (repeatable): a path, or a path relative "
      "to --gin_location_prefix or to the shipped gin folder, e.g. "
      "models/bi_base.gin.")
  flags.DEFINE_multi_string("gin_param", None,
                            "A gin binding (repeatable), e.g. "
                            "'utils.run.train_steps = 1000'.")
  flags.DEFINE_list("gin_location_prefix", [],
                    "Folders to look for gin files in.")
FLAGS = flags.FLAGS


def gin_dir():
  """The folder of the shipped gin files (models/, layouts/, problems/)."""
  return str(importlib.resources.files("mesh_tensorflow.transformer") / "gin")


def parse_gin_defaults_and_flags(skip_unknown=False, finalize_config=True):
  """Parses gin/defaults.gin, then --gin_file files and --gin_param bindings.

  Gin files are looked up as given, then in each --gin_location_prefix
  folder, then in the shipped gin folder.

  Args:
    skip_unknown: ignore bindings of unknown configurables (True, or a list
      of names to ignore).
    finalize_config: lock the configuration afterwards.
  """
  folders = list(FLAGS.gin_location_prefix) + [gin_dir()]
  for folder in folders:
    # For `include` lines inside gin files.
    gin.add_config_file_search_path(folder)
  gin.parse_config_file(os.path.join(gin_dir(), "defaults.gin"))
  files = [find_gin_file(name, folders) for name in FLAGS.gin_file or ()]
  gin.parse_config_files_and_bindings(files, FLAGS.gin_param,
                                      skip_unknown=skip_unknown,
                                      finalize_config=finalize_config)


def find_gin_file(name, folders):
  """The path of gin file `name`: as given, else in the first of `folders`
  that has it ("<name>.gin" also tried).

  Raises:
    ValueError: naming the file and every place looked in.
  """
  candidates = [name] + [os.path.join(f, name) for f in folders]
  if not name.endswith(".gin"):
    candidates += [c + ".gin" for c in candidates]
  for candidate in candidates:
    if tf.io.gfile.exists(candidate) and not tf.io.gfile.isdir(candidate):
      return candidate
  raise ValueError(f"Gin file {name!r} not found; looked for "
                   f"{', '.join(repr(c) for c in candidates)}.")


def get_estimator(model_type, vocabulary, mesh_shape,
                  layout_rules, model_dir, batch_size, sequence_length,
                  autostack, learning_rate_schedule, keep_checkpoint_max,
                  save_checkpoints_steps, optimizer, predict_fn,
                  variable_filter, ensemble_inputs, use_tpu, tpu_job_name,
                  iterations_per_loop, cluster, init_checkpoint=None,
                  mesh_devices=None, score_in_predict_mode=False,
                  log_step_count_steps=100, save_summary_steps=100,
                  init_variable_filter="", checkpoint_input_pipeline=False,
                  shard_weight_update=False, shard_parameters=False,
                  seed=None):
  """An Estimator (a TPUEstimator when use_tpu) of the Transformer model.

  Args:
    model_type: see build_model.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    mesh_shape: the mtf.Shape (or its string) of the mesh.
    layout_rules: the mtf.LayoutRules (or their string).
    model_dir: checkpoints, summaries, operative config.
    batch_size: sequences per batch.
    sequence_length: a dict feature -> length.
    autostack: whether the lowering stacks variables.
    learning_rate_schedule: a float or a function of `step`.
    keep_checkpoint_max: the newest checkpoints kept (None: 5).
    save_checkpoints_steps: steps between checkpoints.
    optimizer: an optimize.Optimizer class.
    predict_fn: see tpu_estimator_model_fn.
    variable_filter: the variables trained (None, regex or function).
    ensemble_inputs: the number of ensemble members with their own inputs.
    use_tpu: run on the TPU of `cluster`.
    tpu_job_name: kept for the original's signature (the cluster resolver
      names the job).
    iterations_per_loop: training steps per compiled loop.
    cluster: a TPUClusterResolver (with use_tpu).
    init_checkpoint: a checkpoint to start training from when model_dir has
      none (this project's or the original's TF1 format); its global step
      comes along.
    mesh_devices: one device per processor (default: local devices; an
      empty string means a default one too).
    score_in_predict_mode: predictions are log-likelihood scores.
    log_step_count_steps: steps between loss log lines.
    save_summary_steps: steps between TensorBoard scalars.
    init_variable_filter: a regex: init_checkpoint loads only the variables
      whose names match (default all).
    checkpoint_input_pipeline: also checkpoint the training data's position.
    shard_weight_update, shard_parameters: see `run`.
    seed: TensorFlow's global seed in every program the estimator builds
      (RunConfig's tf_random_seed); None leaves it unset.

  Returns:
    a mesh_tensorflow.estimator.Estimator.
  """
  del tpu_job_name
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)
  model_fn = _make_model_fn(
      model_type=model_type,
      vocabulary=vocabulary,
      model_dir=model_dir,
      use_tpu=use_tpu,
      mesh_shape=mesh_shape,
      layout_rules=layout_rules,
      batch_size=batch_size,
      sequence_length=sequence_length,
      autostack=autostack,
      learning_rate_schedule=learning_rate_schedule,
      keep_checkpoint_max=keep_checkpoint_max,
      save_checkpoints_steps=save_checkpoints_steps,
      optimizer=optimizer,
      predict_fn=predict_fn,
      score_in_predict_mode=score_in_predict_mode,
      variable_filter=variable_filter,
      ensemble_inputs=ensemble_inputs,
      shard_weight_update=shard_weight_update,
      shard_parameters=shard_parameters)
  devices = None
  if mesh_devices and any(mesh_devices):
    devices = list(mesh_devices)
  warm_start = {}
  if init_checkpoint:
    warm_start = dict(init_checkpoint=init_checkpoint,
                      init_variable_filter=init_variable_filter or None)
  config = estimator_lib.RunConfig(
      model_dir=model_dir,
      save_checkpoints_steps=save_checkpoints_steps,
      keep_checkpoint_max=keep_checkpoint_max or 5,
      log_step_count_steps=log_step_count_steps,
      iterations_per_loop=iterations_per_loop,
      save_summary_steps=save_summary_steps,
      mesh_shape=mesh_shape,
      layout=layout_rules,
      devices=devices,
      cluster=cluster,
      checkpoint_input_pipeline=checkpoint_input_pipeline,
      tf_random_seed=seed,
      **warm_start)
  if use_tpu:
    return estimator_lib.TPUEstimator(
        model_fn=model_fn, config=config, use_tpu=True,
        train_batch_size=batch_size, eval_batch_size=batch_size,
        predict_batch_size=batch_size)
  return estimator_lib.Estimator(model_fn=model_fn, config=config)


def _make_model_fn(model_type, vocabulary, mesh_shape, layout_rules,
                   **model_fn_args):
  """The model (build_model) and its model function
  (tpu_estimator_model_fn): what get_estimator trains, and what the layout
  search (layout_rules "auto") builds the training graph of."""
  transformer_model = build_model(
      model_type=model_type,
      input_vocab_size=inputs_vocabulary(vocabulary).vocab_size,
      output_vocab_size=targets_vocabulary(vocabulary).vocab_size,
      layout_rules=layout_rules,
      mesh_shape=mesh_shape)
  return tpu_estimator_model_fn(
      model_type=model_type, transformer_model=transformer_model,
      vocabulary=vocabulary, mesh_shape=mesh_shape,
      layout_rules=layout_rules, **model_fn_args)


def train_model(estimator, vocabulary, sequence_length, batch_size,
                train_dataset_fn, train_steps, ensemble_inputs,
                dataset_split="train", skip_seen_data=False,
                seen_data_init_step=0, checkpoint_input_pipeline=False,
                hooks=None):
  """Trains up to global step `train_steps` on train_dataset_fn's data.

  Args:
    estimator: an Estimator of get_estimator.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    sequence_length: a dict feature -> length.
    batch_size: sequences per batch.
    train_dataset_fn: (sequence_length, vocabulary, dataset_split) -> a
      tf.data.Dataset of examples (repeated and batched here).
    train_steps: the global step to stop at.
    ensemble_inputs: batches hold this many times batch_size examples.
    dataset_split: the split to train on.
    skip_seen_data: on resuming, skip the examples the checkpoint's steps
      (minus seen_data_init_step) have consumed.
    seen_data_init_step: the step at which this data was first used.
    checkpoint_input_pipeline: the data's position is checkpointed instead
      (get_estimator's checkpoint_input_pipeline must be set).
    hooks: objects with after_loop(step, loss) (e.g. a progress display).

  Writes <model_dir>/operative_config.gin once the first loop has built the
  model, and again at the end.
  """
  if checkpoint_input_pipeline and not (
      estimator.config.checkpoint_input_pipeline):
    raise ValueError("train_model(checkpoint_input_pipeline=True) needs an "
                     "estimator built with checkpoint_input_pipeline=True.")
  skip = 0
  if skip_seen_data:
    latest = estimator.latest_checkpoint()
    if latest is not None:
      step = get_step_from_checkpoint_path(latest)
      skip = max(0, step - seen_data_init_step) * batch_size * (
          ensemble_inputs or 1)
      logging.info("Skipping %d examples seen before step %d.", skip, step)

  def input_fn(params):
    del params
    dataset = train_dataset_fn(sequence_length=sequence_length,
                               vocabulary=vocabulary,
                               dataset_split=dataset_split)
    dataset = dataset.repeat()
    if skip:
      dataset = dataset.skip(skip)
    dataset = dataset.batch(batch_size * (ensemble_inputs or 1),
                            drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)

  # operative_config.gin, as the original's GinConfigSaverHook wrote it:
  # clients (T5) re-parse it for evaluation, inference and export.
  hooks = [_OperativeConfigWriter(estimator.model_dir)] + list(hooks or ())
  estimator.train(input_fn=input_fn, max_steps=train_steps, hooks=hooks)
  _write_operative_config(estimator.model_dir)


def _learning_rate_schedule(learning_rate_schedule, train_steps):
  """A float, or a function of `step` with total_train_steps bound."""
  if isinstance(learning_rate_schedule, (list, tuple)):
    learning_rate_schedule = functools.partial(
        learning_rate_schedules.product_learning_rate,
        factors=list(learning_rate_schedule))
  if callable(learning_rate_schedule):
    return functools.partial(learning_rate_schedule,
                             total_train_steps=train_steps)
  return learning_rate_schedule


def _write_operative_config(model_dir):
  """Writes operative_config.gin into model_dir (atomically)."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, "operative_config.gin")
  # Line by line: write_lines_to_file writes an item's newlines as spaces.
  write_lines_to_file(gin.operative_config_str().splitlines(), path)
  logging.info("Wrote the operative gin config to %s", path)


class _OperativeConfigWriter:
  """A training hook writing operative_config.gin once the first loop has
  run: by then the model, optimizer and data have read their gin values
  (the original's GinConfigSaverHook wrote it after the session started)."""

  def __init__(self, model_dir):
    self._model_dir = model_dir
    self._written = False

  def after_loop(self, step, loss):
    del step, loss
    if not self._written:
      _write_operative_config(self._model_dir)
      self._written = True


def _export_checkpoint(export_checkpoint_step, model_dir):
  if not export_checkpoint_step:
    return None
  return next(iter(get_checkpoint_iterator(export_checkpoint_step,
                                           model_dir)))


def _search_layout(model_type, vocabulary, mesh_shape, batch_size,
                   sequence_length, train_steps, total_run_steps,
                   learning_rate_schedule, ensemble_inputs, train_dataset_fn,
                   processor_count_fn, shard_weight_update=False,
                   shard_parameters=False, allow_uneven=False,
                   **model_fn_args):
  """The LayoutChoice of the run's training graph (layout_rules "auto"), on
  its mesh shape or (mesh_shape "auto") on processor_count_fn() processors;
  see run_auto_layout."""
  if model_fn_args.get("optimizer") is None:
    raise ValueError('utils.run.layout_rules = "auto" searches the layout of '
                     "the training graph, in every mode: it needs "
                     "utils.run.optimizer.")
  batch_size = run_auto_layout.fixed_batch_size(sequence_length, batch_size)
  if not isinstance(train_steps, int):
    train_steps = train_steps(batch_size, sequence_length)
  searched = run_auto_layout.mesh_shape_or_processor_count(
      mesh_shape, processor_count_fn)
  model_fn = _make_model_fn(
      model_type=model_type, vocabulary=vocabulary,
      mesh_shape=None if isinstance(searched, int) else searched,
      layout_rules=None, batch_size=batch_size,
      sequence_length=sequence_length,
      learning_rate_schedule=_learning_rate_schedule(
          learning_rate_schedule, total_run_steps or train_steps),
      ensemble_inputs=ensemble_inputs, score_in_predict_mode=False,
      **model_fn_args)

  def features_fn():
    return run_auto_layout.training_features(
        model_type, batch_size, sequence_length, ensemble_inputs,
        train_dataset_fn, vocabulary)

  return run_auto_layout.choose(model_fn, searched, features_fn,
                                shard_weight_update=shard_weight_update,
                                shard_parameters=shard_parameters,
                                allow_uneven=allow_uneven)


@gin.configurable(module=_GIN_MODULE)
def run(tpu_job_name,
        tpu,
        gcp_project,
        tpu_zone,
        model_dir,
        model_type="bitransformer",
        vocabulary=None,
        train_dataset_fn=None,
        eval_dataset_fn=None,
        dataset_split="train",
        autostack=True,
        eval_checkpoint_step=None,
        export_checkpoint_step=None,
        export_path="",
        mode="train",
        iterations_per_loop=100,
        save_checkpoints_steps=5000,
        keep_checkpoint_max=None,
        eval_summary_dir=None,
        batch_size=("tokens_per_replica", 2048),
        train_steps=auto_train_steps,
        total_run_steps=None,
        sequence_length=gin.REQUIRED,
        mesh_shape=gin.REQUIRED,
        mesh_devices=None,
        layout_rules=gin.REQUIRED,
        learning_rate_schedule=None,
        optimizer=None,
        predict_fn=None,
        variable_filter=None,
        perplexity_eval_steps=100,
        init_checkpoint=None,
        ensemble_inputs=None,
        train_model_fn=train_model,
        skip_seen_data=False,
        seen_data_init_step=0,
        output_eval_examples=True,
        checkpoint_input_pipeline=False,
        log_step_count_steps=100,
        save_summary_steps=100,
        train_hooks=None,
        shard_weight_update=False,
        shard_parameters=False,
        allow_uneven_splits=False,
        seed=None):
  """Runs training, evaluation, inference, scoring or export (`mode`).

  Args:
    tpu_job_name, tpu, gcp_project, tpu_zone: the Cloud TPU (tpu None: run
      on this machine's CPUs/GPUs).
    model_dir: the run's directory.
    model_type: see build_model.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    train_dataset_fn: see train_model.
    eval_dataset_fn: see eval_model.
    dataset_split: the split of eval/infer/score modes ("train" in train).
    autostack: whether the lowering stacks variables.
    eval_checkpoint_step: checkpoints of eval/infer/score modes (see
      get_checkpoint_iterator).
    export_checkpoint_step: the checkpoint to export (default latest).
    export_path: where export modes write the SavedModel.
    mode: one of MODES.
    iterations_per_loop: training steps per compiled loop.
    save_checkpoints_steps: steps between checkpoints.
    keep_checkpoint_max: newest checkpoints kept.
    eval_summary_dir: see eval_model.
    batch_size: an integer, or a (method, value) pair of
      compute_batch_size.
    train_steps: the global step training stops at, or a function
      (batch_size, sequence_length) -> steps (default auto_train_steps).
    total_run_steps: the steps the learning-rate schedule spans (default
      train_steps), for runs stopped and resumed with more train_steps.
    sequence_length: an integer or a dict feature -> length.
    mesh_shape: anything mtf.convert_to_shape takes, or "auto" (with
      layout_rules "auto"): the search picks a mesh shape of the processors
      the devices give (see run_devices.processor_count).
    mesh_devices: one device per processor (default local devices).
    layout_rules: anything mtf.convert_to_layout_rules takes, or "auto":
      the layout search (gin `auto_layout.objective`, `memory_budget`,
      `machine`; see run_auto_layout) picks them for the training graph at
      start-up, prints its choice and binds it in gin, so the operative
      config repeats it. The batch size must then not be per replica.
    learning_rate_schedule: a float, a function (step, total_train_steps),
      or a list of such factors (multiplied).
    optimizer: an optimize.Optimizer class.
    predict_fn: see tpu_estimator_model_fn.
    variable_filter: the variables trained (None, regex or function).
    perplexity_eval_steps: batches of each perplexity evaluation.
    init_checkpoint: a checkpoint to start training from (see
      get_estimator).
    ensemble_inputs: see train_model.
    train_model_fn: the function training runs (default train_model).
    skip_seen_data, seen_data_init_step: see train_model.
    output_eval_examples: see eval_model.
    checkpoint_input_pipeline: checkpoint the training data's position.
    log_step_count_steps: steps between loss log lines.
    save_summary_steps: steps between TensorBoard scalars.
    train_hooks: objects with after_loop(step, loss), called while
      training (e.g. progress.ProgressDisplay; their set_run(train_steps,
      tokens_per_step) is called first if they have one).
    shard_weight_update: run each optimizer update on a 1/N shard of the
      weight over the mesh dimensions the batch is split over, with the
      optimizer's slots stored as shards (ZeRO-1/2; see
      mtf.shard_data_parallel). Same numbers and checkpoints.
    shard_parameters: also store the weights as shards, gathered where they
      are used (ZeRO-3).
    allow_uneven_splits: let the layout split dimensions its mesh dimensions
      do not divide (padded; mtf.LayoutRules(allow_uneven=True)), e.g. a
      vocabulary of 32,100 over "model:8". The padding each graph pays is
      logged when it is lowered (mtf.padding_report).
    seed: an int makes a run repeatable, and another int gives another
      run: two runs of one command on one mesh give the same losses, step
      for step. It seeds the shuffles of `dataset`'s functions (the data
      order), the initial values and dropout masks (mixed into the seeds
      taken from variable and operation names, so one seed gives the same
      values under every mesh and layout; see mtf.randomness.run_seed) and
      TensorFlow's global seed in the estimator's programs (other random
      ops, e.g. a dataset function's own shuffle). None: unseeded shuffles,
      as in the original, and the names' own seeds.

  Returns:
    what the mode returns (e.g. eval metrics, scores, the export path).
  """
  arguments = dict(locals())
  if mode not in MODES:
    raise ValueError(f"utils.run: unknown mode {mode!r}; expected one of "
                     f"{', '.join(MODES)}")
  if model_dir is None:
    raise ValueError("utils.run needs a model_dir (--model_dir).")
  if vocabulary is None:
    raise ValueError("utils.run needs a vocabulary: add `utils.run."
                     "vocabulary = @vocabulary.ByteVocabulary()` (or another "
                     "vocabulary) to a gin file or a --gin_param.")
  if isinstance(sequence_length, int):
    sequence_length = {"inputs": sequence_length, "targets": sequence_length}
  if tpu:
    cluster = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu, zone=tpu_zone, project=gcp_project)
  else:
    cluster = None
  if run_auto_layout.wants_search(mesh_shape, layout_rules):
    choice = _search_layout(
        model_type=model_type, vocabulary=vocabulary, mesh_shape=mesh_shape,
        batch_size=batch_size, sequence_length=sequence_length,
        train_steps=train_steps, total_run_steps=total_run_steps,
        learning_rate_schedule=learning_rate_schedule, autostack=autostack,
        optimizer=optimizer, predict_fn=predict_fn,
        variable_filter=variable_filter, ensemble_inputs=ensemble_inputs,
        train_dataset_fn=train_dataset_fn, model_dir=model_dir,
        keep_checkpoint_max=keep_checkpoint_max,
        save_checkpoints_steps=save_checkpoints_steps, use_tpu=bool(tpu),
        processor_count_fn=lambda: run_devices.processor_count(
            mesh_devices, cluster),
        shard_weight_update=shard_weight_update,
        shard_parameters=shard_parameters,
        allow_uneven=allow_uneven_splits)
    run_auto_layout.report(choice)
    run_auto_layout.bind_choice(choice)
    # Called again through gin, which now supplies the chosen values and
    # records them in the operative config (as if the user had given them).
    arguments.update(mesh_shape=gin.REQUIRED, layout_rules=gin.REQUIRED)
    return run(**arguments)
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)
  if allow_uneven_splits:
    layout_rules = layout_rules.with_uneven()
  if not isinstance(batch_size, int):
    batch_size = compute_batch_size(sequence_length, mesh_shape,
                                    layout_rules, batch_size)
  if not isinstance(train_steps, int):
    train_steps = train_steps(batch_size, sequence_length)
  learning_rate_schedule = _learning_rate_schedule(
      learning_rate_schedule, total_run_steps or train_steps)
  for name, value in (("model_type", model_type), ("mode", mode),
                      ("sequence_length", sequence_length),
                      ("batch_size", batch_size),
                      ("train_steps", train_steps),
                      ("mesh_shape", mesh_shape.to_string),
                      ("layout_rules", layout_rules),
                      ("shard_weight_update", shard_weight_update),
                      ("shard_parameters", shard_parameters),
                      ("seed", seed)):
    logging.info("%s=%s", name, value)
  if mode == "train" and dataset_split != "train":
    raise ValueError('mode "train" requires dataset_split "train", got '
                     f"{dataset_split!r}")
  if mode != "train":
    ensemble_inputs = None
  if not tpu:
    run_devices.ensure_local_devices(mesh_shape.size, mesh_devices)

  estimator = get_estimator(
      model_type=model_type,
      vocabulary=vocabulary,
      mesh_shape=mesh_shape,
      layout_rules=layout_rules,
      model_dir=model_dir,
      batch_size=batch_size,
      sequence_length=sequence_length,
      autostack=autostack,
      learning_rate_schedule=learning_rate_schedule,
      keep_checkpoint_max=keep_checkpoint_max,
      save_checkpoints_steps=save_checkpoints_steps,
      optimizer=optimizer,
      predict_fn=predict_fn,
      variable_filter=variable_filter,
      ensemble_inputs=ensemble_inputs,
      use_tpu=bool(tpu),
      tpu_job_name=tpu_job_name,
      iterations_per_loop=iterations_per_loop,
      cluster=cluster,
      init_checkpoint=init_checkpoint,
      mesh_devices=mesh_devices,
      score_in_predict_mode=mode in ("score_eval", "score_from_strings",
                                     "score_from_dataset", "export_score"),
      log_step_count_steps=log_step_count_steps,
      save_summary_steps=save_summary_steps,
      checkpoint_input_pipeline=checkpoint_input_pipeline,
      shard_weight_update=shard_weight_update,
      shard_parameters=shard_parameters,
      seed=seed)
  # The mode's datasets are made within: their shuffles take the seed; so
  # are its models: their name-keyed seeds mix it in.
  with transformer_dataset.shuffle_seed(seed), run_seed.seed_scope(seed):
    if mode == "train":
      for hook in train_hooks or ():
        if hasattr(hook, "set_run"):
          hook.set_run(train_steps,
                       batch_size * (ensemble_inputs or 1) *
                       max(sequence_length.values()))
      if train_dataset_fn is None:
        raise ValueError("mode 'train' needs utils.run.train_dataset_fn in "
                         "gin.")
      kwargs = {}
      if train_model_fn is train_model:
        kwargs = dict(skip_seen_data=skip_seen_data,
                      seen_data_init_step=seen_data_init_step,
                      checkpoint_input_pipeline=checkpoint_input_pipeline,
                      hooks=train_hooks)
      return train_model_fn(estimator, vocabulary, sequence_length,
                            batch_size, train_dataset_fn, train_steps,
                            ensemble_inputs, **kwargs)
    if mode == "perplexity_eval":
      return perplexity_eval(estimator, vocabulary, sequence_length,
                             batch_size, dataset_split, model_dir,
                             eval_dataset_fn, train_dataset_fn,
                             eval_checkpoint_step, perplexity_eval_steps)
    if mode in ("eval", "score_eval"):
      return eval_model(estimator, vocabulary, sequence_length, batch_size,
                        dataset_split, model_dir, eval_dataset_fn,
                        eval_summary_dir, eval_checkpoint_step,
                        eval_with_score=mode == "score_eval",
                        output_eval_examples=output_eval_examples)
    if mode == "infer":
      return infer_model(estimator, vocabulary, sequence_length, batch_size,
                         model_type, model_dir, eval_checkpoint_step)
    if mode == "score_from_strings":
      return score_from_strings(estimator, vocabulary, model_type, batch_size,
                                sequence_length, model_dir,
                                eval_checkpoint_step)
    if mode == "score_from_dataset":
      return score_from_dataset(estimator, vocabulary, batch_size,
                                sequence_length, model_dir,
                                eval_checkpoint_step, dataset_split)
    if mode == "export":
      logging.warning('mode "export" is deprecated; use "export_infer".')
    if not export_path:
      raise ValueError(f"mode {mode!r} needs utils.run.export_path in gin.")
    return export_model(
        estimator, export_path, vocabulary, sequence_length,
        model_type=model_type, eval_with_score=mode == "export_score",
        batch_size=batch_size,
        checkpoint_path=_export_checkpoint(export_checkpoint_step, model_dir))
