"""The Transformer's run loop: `run(mode=...)` and the pieces it is made of.

The original's `transformer/utils.py`, on `mesh_tensorflow.estimator`:

- `run(...)` (gin-configured) resolves its arguments once into a
  ResolvedRun (binary/run_resolution: devices, mesh shape and layout rules,
  searched with layout_rules "auto", batch size, steps, learning-rate
  schedule), builds the estimator from it (`get_estimator`) and runs one
  mode's driver on it (binary/run_modes): "train", "eval" (decode and score
  the eval datasets), "perplexity_eval", "infer" (decode a file),
  "score_from_strings", "score_from_dataset", "export_infer" /
  "export_score" (SavedModels; "export" is the old name of "export_infer").
- `get_estimator` builds the model (`build_model`), its model function
  (`tpu_estimator_model_fn`) and an Estimator (TPUEstimator on TPU).
- The mode functions live in smaller modules of binary/ and are re-exported
  here under the original's names: run_settings (dtypes, batch size,
  steps), run_model_fn, run_training, run_checkpoints, run_inference,
  run_scoring, run_eval.

Every gin name is the original's (`utils.run.mesh_shape`,
`utils.get_variable_dtype.activation_dtype`, ...), so the original's gin
files and operative configs parse unchanged.
"""

import importlib.resources
import os

from absl import flags
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator as estimator_lib
from mesh_tensorflow.transformer.binary import run_modes
from mesh_tensorflow.transformer.binary import run_resolution
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
from mesh_tensorflow.transformer.binary.run_training import train_model
# pylint: enable=unused-import

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

MODES = run_resolution.MODES

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
  model_fn = run_resolution.make_model_fn(
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
        seed=None,
        plan=None):
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
    plan: None, or "auto" (with mesh_shape and layout_rules "auto"): the
      run planner (mtf.auto_mtf.plan; see binary/run_plan) picks the mesh
      shape, layout rules, weight-update sharding and the layer stacks'
      pipeline stages, micro-batches and recompute for the devices'
      processors within gin `auto_layout.memory_budget` (`machine`,
      `quick_calibration`), prints its table and binds its choices in gin,
      so the operative config repeats them without planning.

  Returns:
    what the mode returns (e.g. eval metrics, scores, the export path).
  """
  resolved = run_resolution.resolve(dict(locals()))
  estimator = get_estimator(**resolved.estimator_arguments())
  return run_modes.run_mode(resolved, estimator)
