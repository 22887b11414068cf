"""utils.run's arguments, resolved once into a ResolvedRun.

`utils.run` takes its 46 arguments from gin (the original's API and
extensions); `resolve` turns them into what the run uses: the mesh shape
and layout rules (with layout_rules "auto" the layout search's choice, see
run_auto_layout; with plan "auto" the run planner's, which also sets the
sharding and the layer stacks' structure, see run_plan), the devices,
the batch size in sequences, the steps and the learning-rate schedule
with its total steps bound. The estimator is built from the
ResolvedRun (`estimator_arguments`) and the mode drivers (run_modes) take
it: nothing reads utils.run's gin values again, and run is called once.
"""

import dataclasses
from typing import Any, Callable, Optional, Tuple

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.binary import run_auto_layout
from mesh_tensorflow.transformer.binary import run_devices
from mesh_tensorflow.transformer.binary import run_model_fn
from mesh_tensorflow.transformer.binary import run_plan
from mesh_tensorflow.transformer.binary import run_settings

MODES = ("train", "eval", "score_eval", "perplexity_eval", "infer",
         "score_from_strings", "score_from_dataset", "export_infer",
         "export_score", "export")
# The modes whose predictions are log-likelihood scores.
SCORING_MODES = ("score_eval", "score_from_strings", "score_from_dataset",
                 "export_score")


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
  """One run of utils.run, its settings resolved (see utils.run's Args).

  The fields carry utils.run's argument names; these hold resolved values:
  mesh_shape (an mtf.Shape) and layout_rules (mtf.LayoutRules, uneven with
  allow_uneven_splits), chosen by the layout search when layout_choice (its
  mtf.auto_mtf.api.LayoutChoice) is set; cluster (the TPUClusterResolver of
  utils.run's tpu, gcp_project and tpu_zone, else None); sequence_length (a
  dict feature -> length); batch_size and train_steps (integers);
  learning_rate_schedule (a float, or a function of the step with the
  total steps bound); ensemble_inputs (None outside training); train_hooks
  (a tuple).
  """
  mode: str
  model_type: str
  model_dir: str
  vocabulary: Any
  # Where it runs.
  mesh_shape: mtf.Shape
  layout_rules: mtf.LayoutRules
  layout_choice: Any
  mesh_devices: Any
  cluster: Any
  tpu_job_name: Optional[str]
  # Its sizes.
  sequence_length: dict
  batch_size: int
  train_steps: int
  total_run_steps: Optional[int]
  learning_rate_schedule: Any
  ensemble_inputs: Optional[int]
  # The model and its training step.
  autostack: bool
  optimizer: Any
  predict_fn: Optional[Callable]
  variable_filter: Any
  shard_weight_update: bool
  shard_parameters: bool
  allow_uneven_splits: bool
  seed: Optional[int]
  # Checkpoints and logs.
  iterations_per_loop: int
  save_checkpoints_steps: int
  keep_checkpoint_max: Optional[int]
  init_checkpoint: Optional[str]
  checkpoint_input_pipeline: bool
  log_step_count_steps: int
  save_summary_steps: int
  # Data.
  train_dataset_fn: Optional[Callable]
  eval_dataset_fn: Optional[Callable]
  dataset_split: str
  # The modes'.
  train_model_fn: Callable
  train_hooks: Tuple[Any, ...]
  skip_seen_data: bool
  seen_data_init_step: int
  eval_checkpoint_step: Any
  eval_summary_dir: Optional[str]
  perplexity_eval_steps: int
  output_eval_examples: bool
  export_checkpoint_step: Any
  export_path: str
  # utils.run.plan "auto": the mtf.auto_mtf.planner.Plan it runs.
  plan: Any = None

  @property
  def use_tpu(self):
    return self.cluster is not None

  @property
  def score_in_predict_mode(self):
    """Whether the mode's predictions are scores, not decodes."""
    return self.mode in SCORING_MODES

  def estimator_arguments(self):
    """utils.get_estimator's keyword arguments."""
    return dict(
        model_type=self.model_type, vocabulary=self.vocabulary,
        mesh_shape=self.mesh_shape, layout_rules=self.layout_rules,
        model_dir=self.model_dir, batch_size=self.batch_size,
        sequence_length=self.sequence_length, autostack=self.autostack,
        learning_rate_schedule=self.learning_rate_schedule,
        keep_checkpoint_max=self.keep_checkpoint_max,
        save_checkpoints_steps=self.save_checkpoints_steps,
        optimizer=self.optimizer, predict_fn=self.predict_fn,
        variable_filter=self.variable_filter,
        ensemble_inputs=self.ensemble_inputs, use_tpu=self.use_tpu,
        tpu_job_name=self.tpu_job_name,
        iterations_per_loop=self.iterations_per_loop, cluster=self.cluster,
        init_checkpoint=self.init_checkpoint,
        mesh_devices=self.mesh_devices,
        score_in_predict_mode=self.score_in_predict_mode,
        log_step_count_steps=self.log_step_count_steps,
        save_summary_steps=self.save_summary_steps,
        checkpoint_input_pipeline=self.checkpoint_input_pipeline,
        shard_weight_update=self.shard_weight_update,
        shard_parameters=self.shard_parameters, seed=self.seed)


# utils.run's arguments that the ResolvedRun holds as given.
_AS_GIVEN = ("mode", "model_type", "model_dir", "vocabulary", "mesh_devices",
             "tpu_job_name", "total_run_steps", "autostack", "optimizer",
             "predict_fn", "variable_filter", "shard_weight_update",
             "shard_parameters", "allow_uneven_splits", "seed",
             "iterations_per_loop", "save_checkpoints_steps",
             "keep_checkpoint_max", "init_checkpoint",
             "checkpoint_input_pipeline", "log_step_count_steps",
             "save_summary_steps", "train_dataset_fn", "eval_dataset_fn",
             "dataset_split", "train_model_fn", "skip_seen_data",
             "seen_data_init_step", "eval_checkpoint_step",
             "eval_summary_dir", "perplexity_eval_steps",
             "output_eval_examples", "export_checkpoint_step", "export_path")


def resolve(arguments):
  """The ResolvedRun of utils.run's arguments (a dict name -> value).

  With layout_rules "auto" this searches the layout, prints the choice and
  records it in gin (run_auto_layout.bind_choice); with plan "auto" it
  plans the run likewise (run_plan.plan_run). On a machine without
  accelerators it splits the CPU into the mesh's processors.

  Raises:
    ValueError: an argument utils.run cannot run with, named.
  """
  a = arguments
  if a["mode"] not in MODES:
    raise ValueError(f"utils.run: unknown mode {a['mode']!r}; expected one "
                     f"of {', '.join(MODES)}")
  if a["model_dir"] is None:
    raise ValueError("utils.run needs a model_dir (--model_dir).")
  if a["vocabulary"] is None:
    raise ValueError("utils.run needs a vocabulary: add `utils.run."
                     "vocabulary = @vocabulary.ByteVocabulary()` (or another "
                     "vocabulary) to a gin file or a --gin_param.")
  sequence_length = a["sequence_length"]
  if isinstance(sequence_length, int):
    sequence_length = {"inputs": sequence_length, "targets": sequence_length}
  cluster = None
  if a["tpu"]:
    cluster = tf.distribute.cluster_resolver.TPUClusterResolver(
        a["tpu"], zone=a["tpu_zone"], project=a["gcp_project"])
  mesh_shape, layout_rules = a["mesh_shape"], a["layout_rules"]
  choice = plan = None
  if run_plan.wants_plan(a["plan"], mesh_shape, layout_rules):
    plan = run_plan.plan_run(a, cluster)
    # As gin gives them, the chosen values (see run_plan.bind_plan).
    a = dict(a, **run_plan.run_values(plan))
    mesh_shape, layout_rules = a["mesh_shape"], a["layout_rules"]
  elif run_auto_layout.wants_search(mesh_shape, layout_rules):
    choice = _search_layout(a, sequence_length, cluster)
    run_auto_layout.report(choice)
    run_auto_layout.bind_choice(choice)
    # As gin gives them, the chosen strings (see bind_choice).
    mesh_shape = run_auto_layout.mesh_shape_string(choice.mesh_shape)
    layout_rules = choice.layout_rules.to_string
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)
  if a["allow_uneven_splits"]:
    layout_rules = layout_rules.with_uneven()
  batch_size = a["batch_size"]
  if not isinstance(batch_size, int):
    batch_size = run_settings.compute_batch_size(
        sequence_length, mesh_shape, layout_rules, batch_size)
  train_steps = a["train_steps"]
  if not isinstance(train_steps, int):
    train_steps = train_steps(batch_size, sequence_length)
  learning_rate_schedule = run_settings.bind_learning_rate_schedule(
      a["learning_rate_schedule"], a["total_run_steps"] or train_steps)
  for name, value in (("model_type", a["model_type"]), ("mode", a["mode"]),
                      ("sequence_length", sequence_length),
                      ("batch_size", batch_size),
                      ("train_steps", train_steps),
                      ("mesh_shape", mesh_shape.to_string),
                      ("layout_rules", layout_rules),
                      ("shard_weight_update", a["shard_weight_update"]),
                      ("shard_parameters", a["shard_parameters"]),
                      ("seed", a["seed"])):
    logging.info("%s=%s", name, value)
  if a["mode"] == "train" and a["dataset_split"] != "train":
    raise ValueError('mode "train" requires dataset_split "train", got '
                     f"{a['dataset_split']!r}")
  if cluster is None:
    run_devices.ensure_local_devices(mesh_shape.size, a["mesh_devices"])
  return ResolvedRun(
      mesh_shape=mesh_shape, layout_rules=layout_rules,
      layout_choice=choice, plan=plan, cluster=cluster,
      sequence_length=sequence_length, batch_size=batch_size,
      train_steps=train_steps,
      learning_rate_schedule=learning_rate_schedule,
      ensemble_inputs=a["ensemble_inputs"] if a["mode"] == "train" else None,
      train_hooks=tuple(a["train_hooks"] or ()),
      **{name: a[name] for name in _AS_GIVEN})


def make_model_fn(model_type, vocabulary, mesh_shape, layout_rules,
                  **model_fn_args):
  """The model (build_model) and its model function
  (tpu_estimator_model_fn): what utils.get_estimator trains, and what the
  layout search builds the training graph of."""
  transformer_model = run_settings.build_model(
      model_type=model_type,
      input_vocab_size=run_settings.inputs_vocabulary(vocabulary).vocab_size,
      output_vocab_size=run_settings.targets_vocabulary(
          vocabulary).vocab_size,
      layout_rules=layout_rules,
      mesh_shape=mesh_shape)
  return run_model_fn.tpu_estimator_model_fn(
      model_type=model_type, transformer_model=transformer_model,
      vocabulary=vocabulary, mesh_shape=mesh_shape,
      layout_rules=layout_rules, **model_fn_args)


def _search_layout(a, sequence_length, cluster):
  """The LayoutChoice of the run's training graph (layout_rules "auto"), on
  its mesh shape or (mesh_shape "auto") on the devices' processor count;
  `a`: utils.run's arguments."""
  if a["optimizer"] is None:
    raise ValueError('utils.run.layout_rules = "auto" searches the layout of '
                     "the training graph, in every mode: it needs "
                     "utils.run.optimizer.")
  batch_size = run_auto_layout.fixed_batch_size(sequence_length,
                                                a["batch_size"])
  train_steps = a["train_steps"]
  if not isinstance(train_steps, int):
    train_steps = train_steps(batch_size, sequence_length)
  searched = run_auto_layout.mesh_shape_or_processor_count(
      a["mesh_shape"],
      lambda: run_devices.processor_count(a["mesh_devices"], cluster))
  model_fn = make_model_fn(
      model_type=a["model_type"], vocabulary=a["vocabulary"],
      mesh_shape=None if isinstance(searched, int) else searched,
      layout_rules=None, batch_size=batch_size,
      sequence_length=sequence_length,
      learning_rate_schedule=run_settings.bind_learning_rate_schedule(
          a["learning_rate_schedule"], a["total_run_steps"] or train_steps),
      ensemble_inputs=a["ensemble_inputs"], score_in_predict_mode=False,
      autostack=a["autostack"], optimizer=a["optimizer"],
      predict_fn=a["predict_fn"], variable_filter=a["variable_filter"],
      model_dir=a["model_dir"],
      keep_checkpoint_max=a["keep_checkpoint_max"],
      save_checkpoints_steps=a["save_checkpoints_steps"],
      use_tpu=cluster is not None)

  def features_fn():
    return run_auto_layout.training_features(
        a["model_type"], batch_size, sequence_length, a["ensemble_inputs"],
        a["train_dataset_fn"], a["vocabulary"])

  return run_auto_layout.choose(
      model_fn, searched, features_fn,
      shard_weight_update=a["shard_weight_update"],
      shard_parameters=a["shard_parameters"],
      allow_uneven=a["allow_uneven_splits"])
