"""Training: `train_model` (utils.train_model, the original's name) and the
operative gin config it writes into the model directory."""

import os

from absl import logging
import gin
import tensorflow as tf

from mesh_tensorflow.transformer.binary import run_checkpoints
from mesh_tensorflow.transformer.binary import run_inference


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
      step = run_checkpoints.get_step_from_checkpoint_path(latest)
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


def _write_operative_config(model_dir):
  """Writes operative_config.gin into model_dir (atomically)."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, "operative_config.gin")
  # Line by line: write_lines_to_file writes an item's newlines as spaces.
  run_inference.write_lines_to_file(
      gin.operative_config_str().splitlines(), path)
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
