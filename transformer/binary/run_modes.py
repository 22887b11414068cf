"""utils.run's modes: each a driver of a ResolvedRun and its estimator.

`run_mode` runs the ResolvedRun's mode (DRIVERS[mode]) within its seed: the
datasets the mode makes shuffle with it, and its models' name-keyed seeds
mix it in. Each driver calls the original's function of its mode
(train_model, eval_model, infer_model, ...) with the run's values.
"""

from absl import logging

from mesh_tensorflow.randomness import run_seed
from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer.binary import run_checkpoints
from mesh_tensorflow.transformer.binary import run_eval
from mesh_tensorflow.transformer.binary import run_inference
from mesh_tensorflow.transformer.binary import run_scoring
from mesh_tensorflow.transformer.binary import run_training


def run_mode(run, estimator):
  """What the mode of `run` (a ResolvedRun) returns, run on `estimator`."""
  with (transformer_dataset.shuffle_seed(run.seed),
        run_seed.seed_scope(run.seed)):
    return DRIVERS[run.mode](run, estimator)


def train(run, estimator):
  """Mode "train": run.train_model_fn (train_model, with its options)."""
  for hook in run.train_hooks:
    if hasattr(hook, "set_run"):
      hook.set_run(run.train_steps,
                   run.batch_size * (run.ensemble_inputs or 1) *
                   max(run.sequence_length.values()))
  if run.train_dataset_fn is None:
    raise ValueError("mode 'train' needs utils.run.train_dataset_fn in gin.")
  kwargs = {}
  if run.train_model_fn is run_training.train_model:
    kwargs = dict(skip_seen_data=run.skip_seen_data,
                  seen_data_init_step=run.seen_data_init_step,
                  checkpoint_input_pipeline=run.checkpoint_input_pipeline,
                  hooks=run.train_hooks)
  return run.train_model_fn(estimator, run.vocabulary, run.sequence_length,
                            run.batch_size, run.train_dataset_fn,
                            run.train_steps, run.ensemble_inputs, **kwargs)


def perplexity_eval(run, estimator):
  """Mode "perplexity_eval"."""
  return run_eval.perplexity_eval(
      estimator, run.vocabulary, run.sequence_length, run.batch_size,
      run.dataset_split, run.model_dir, run.eval_dataset_fn,
      run.train_dataset_fn, run.eval_checkpoint_step,
      run.perplexity_eval_steps)


def evaluate(run, estimator):
  """Modes "eval" and "score_eval" (scores instead of decodes)."""
  return run_eval.eval_model(
      estimator, run.vocabulary, run.sequence_length, run.batch_size,
      run.dataset_split, run.model_dir, run.eval_dataset_fn,
      run.eval_summary_dir, run.eval_checkpoint_step,
      eval_with_score=run.mode == "score_eval",
      output_eval_examples=run.output_eval_examples)


def infer(run, estimator):
  """Mode "infer": decodes utils.decode_from_file's input file."""
  return run_inference.infer_model(
      estimator, run.vocabulary, run.sequence_length, run.batch_size,
      run.model_type, run.model_dir, run.eval_checkpoint_step)


def score_strings(run, estimator):
  """Mode "score_from_strings"."""
  return run_scoring.score_from_strings(
      estimator, run.vocabulary, run.model_type, run.batch_size,
      run.sequence_length, run.model_dir, run.eval_checkpoint_step)


def score_dataset(run, estimator):
  """Mode "score_from_dataset"."""
  return run_scoring.score_from_dataset(
      estimator, run.vocabulary, run.batch_size, run.sequence_length,
      run.model_dir, run.eval_checkpoint_step, run.dataset_split)


def export(run, estimator):
  """Modes "export_infer", "export_score" and "export" (the old name of
  "export_infer"): a SavedModel at run.export_path."""
  if run.mode == "export":
    logging.warning('mode "export" is deprecated; use "export_infer".')
  if not run.export_path:
    raise ValueError(f"mode {run.mode!r} needs utils.run.export_path in "
                     "gin.")
  checkpoint_path = None
  if run.export_checkpoint_step:
    checkpoint_path = next(iter(run_checkpoints.get_checkpoint_iterator(
        run.export_checkpoint_step, run.model_dir)))
  return run_inference.export_model(
      estimator, run.export_path, run.vocabulary, run.sequence_length,
      model_type=run.model_type, eval_with_score=run.mode == "export_score",
      batch_size=run.batch_size, checkpoint_path=checkpoint_path)


# The driver of each of utils.run's modes.
DRIVERS = {
    "train": train,
    "eval": evaluate,
    "score_eval": evaluate,
    "perplexity_eval": perplexity_eval,
    "infer": infer,
    "score_from_strings": score_strings,
    "score_from_dataset": score_dataset,
    "export_infer": export,
    "export_score": export,
    "export": export,
}
