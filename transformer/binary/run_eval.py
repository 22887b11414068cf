"""Evaluation of a Transformer run: decoded metrics and perplexity.

`eval_model` decodes (or scores) every EvalDataset with each checkpoint,
postprocesses the decodes, computes the datasets' metric functions against
the targets' text, and writes the predictions and the metrics to
`eval_summary_dir` (default "<model_dir>/<split>_eval", created here) and
to TensorBoard. `perplexity_eval` runs the teacher-forced evaluation of the
model function (weighted running means over the whole set; the padding
examples that complete the last batch weigh nothing).
"""

import functools
import os
import random

from absl import logging
import tensorflow as tf

from mesh_tensorflow.estimator import host_values
from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer.binary import run_checkpoints
from mesh_tensorflow.transformer.binary import run_features
from mesh_tensorflow.transformer.binary import run_inference


_text = run_inference.as_text
_postprocess = run_inference.postprocess_text


def _batched_input_fn(eval_datasets, batch_size):
  """input_fn of all the datasets' examples in one stream, the last batch
  padded with all-zero examples."""

  def input_fn(params):
    del params
    combined = None
    for eval_dataset in eval_datasets:
      ds = eval_dataset.dataset_fn().map(run_features.filter_features)
      combined = ds if combined is None else combined.concatenate(ds)
    combined = combined.batch(batch_size, drop_remainder=False)
    combined = transformer_dataset.trim_and_pad_dataset(combined,
                                                        length=batch_size)
    return combined.prefetch(tf.data.AUTOTUNE)

  return input_fn


def eval_model(estimator, vocabulary, sequence_length, batch_size,
               dataset_split, model_dir, eval_dataset_fn, eval_summary_dir,
               eval_checkpoint_step, eval_with_score=False,
               output_eval_examples=True):
  """Decodes (or scores) the eval datasets with each checkpoint and writes
  their metrics.

  Args:
    estimator: an Estimator of utils.get_estimator (scoring in predict
      mode when eval_with_score).
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    sequence_length: a dict feature -> length.
    batch_size: sequences per batch.
    dataset_split: the split eval_dataset_fn reads.
    model_dir: the run's directory.
    eval_dataset_fn: (sequence_length, vocabulary, dataset_split) -> a list
      of dataset.EvalDataset. As in the original, the targets' (and
      inputs') text is the examples' "targets_pretokenized" (and
      "inputs_pretokenized"); an example without it gets its ids decoded
      by the vocabulary instead.
    eval_summary_dir: where predictions, targets and TensorBoard events go
      (default "<model_dir>/<dataset_split>_eval").
    eval_checkpoint_step: which checkpoints (see get_checkpoint_iterator).
    eval_with_score: compare the targets with log-likelihood scores
      instead of decodes.
    output_eval_examples: also write each dataset's inputs and targets.

  Returns:
    {checkpoint step: {"<dataset>/<metric>": value}}.
  """
  if eval_dataset_fn is None:
    raise ValueError("mode 'eval' needs utils.run.eval_dataset_fn in gin.")
  eval_datasets = []
  for eval_dataset in eval_dataset_fn(sequence_length=sequence_length,
                                      vocabulary=vocabulary,
                                      dataset_split=dataset_split):
    eval_dataset = transformer_dataset.EvalDataset(*eval_dataset)
    if not eval_dataset.metric_fns:
      logging.info("Skipping %s because metric_fns is empty",
                   eval_dataset.name)
      continue
    eval_datasets.append(eval_dataset)
  if not eval_datasets:
    logging.info("No EvalDataset has metric_fns: nothing to evaluate.")
    return {}
  eval_summary_dir = eval_summary_dir or os.path.join(
      model_dir, f"{dataset_split}_eval")
  tf.io.gfile.makedirs(eval_summary_dir)

  examples, targets = {}, {}
  for eval_dataset in eval_datasets:
    cached = list(host_values.numpy_iterator(eval_dataset.dataset_fn()))
    examples[eval_dataset.name] = cached
    run_inference.maybe_add_pretokenized_features(cached, vocabulary)
    targets[eval_dataset.name] = [
        _postprocess(eval_dataset, _text(ex["targets_pretokenized"]), ex,
                     is_target=True) for ex in cached]
    if output_eval_examples:
      run_inference.write_lines_to_file(
          targets[eval_dataset.name],
          os.path.join(eval_summary_dir, f"{eval_dataset.name}_targets"))
      if cached and "inputs_pretokenized" in cached[0]:
        run_inference.write_lines_to_file(
            [_text(ex["inputs_pretokenized"]) for ex in cached],
            os.path.join(eval_summary_dir, f"{eval_dataset.name}_inputs"))

  input_fn = _batched_input_fn(eval_datasets, batch_size)
  results = {}
  for checkpoint_path in run_checkpoints.get_checkpoint_iterator(
      eval_checkpoint_step, model_dir):
    step = run_checkpoints.get_step_from_checkpoint_path(checkpoint_path)
    logging.info("Evaluating checkpoint %s", checkpoint_path)
    if eval_with_score:
      outputs = [float(r["scores"]) for r in estimator.predict(
          input_fn, checkpoint_path=checkpoint_path)]
    else:
      outputs = run_inference.decode(estimator, input_fn, vocabulary,
                                     checkpoint_path)
    results[step] = {}
    scalars = {}
    for eval_dataset in eval_datasets:
      cached = examples[eval_dataset.name]
      mine, outputs = outputs[:len(cached)], outputs[len(cached):]
      if eval_with_score:
        predictions = mine
      else:
        predictions = [_postprocess(eval_dataset, _text(d), ex)
                       for d, ex in zip(mine, cached)]
        run_inference.write_lines_to_file(predictions, os.path.join(
            eval_summary_dir, f"{eval_dataset.name}_{step}_predictions"))
      for metric_fn in eval_dataset.metric_fns:
        for name, value in metric_fn(targets[eval_dataset.name],
                                     predictions).items():
          tag = f"eval/{eval_dataset.name}/{name}"
          logging.info("%s at step %d: %.3f", tag, step, value)
          scalars[tag] = float(value)
          results[step][f"{eval_dataset.name}/{name}"] = float(value)
    host_values.write_scalars(eval_summary_dir, step, scalars)
    expected_padding = -sum(len(c) for c in examples.values()) % batch_size
    if len(outputs) != expected_padding:
      raise ValueError(f"{len(outputs)} padded decodes, {expected_padding} "
                       "expected.")
  return results


def perplexity_eval(estimator, vocabulary, sequence_length, batch_size,
                    dataset_split, model_dir, eval_dataset_fn,
                    train_dataset_fn, eval_checkpoint_step,
                    perplexity_eval_steps, ensemble_inputs=None):
  """Teacher-forced evaluation (loss, neg_log_perplexity, accuracies) of
  perplexity_eval_steps batches of each eval dataset (or the training
  data's `dataset_split`), for each checkpoint.

  Returns:
    {checkpoint step: {dataset name: the estimator's evaluate results}}.
  """
  if eval_dataset_fn is not None:
    eval_datasets = [transformer_dataset.EvalDataset(*d) for d in
                     eval_dataset_fn(sequence_length=sequence_length,
                                     vocabulary=vocabulary,
                                     dataset_split=dataset_split)]
  elif train_dataset_fn is not None:
    logging.warning("Using train_dataset_fn for perplexity eval")
    eval_datasets = [transformer_dataset.EvalDataset(
        name="eval",
        dataset_fn=functools.partial(train_dataset_fn,
                                     sequence_length=sequence_length,
                                     vocabulary=vocabulary,
                                     dataset_split=dataset_split),
        postprocess_fn=None, metric_fns=None)]
  else:
    raise ValueError("mode 'perplexity_eval' needs utils.run.eval_dataset_fn "
                     "or utils.run.train_dataset_fn in gin.")

  def input_fn(params, eval_dataset):
    del params
    ds = eval_dataset.dataset_fn().map(run_features.filter_features)
    ds = transformer_dataset.pad_dataset_with_zeroed_out_examples(ds)
    return ds.batch(batch_size * (ensemble_inputs or 1),
                    drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  results = {}
  for checkpoint_path in run_checkpoints.get_checkpoint_iterator(
      eval_checkpoint_step, model_dir):
    step = run_checkpoints.get_step_from_checkpoint_path(checkpoint_path)
    results[step] = {}
    scalars = {}
    for eval_dataset in eval_datasets:
      tf.random.set_seed(12345)
      random.seed(12345)
      # The number of examples in the name: runs compare like with like.
      name = f"{eval_dataset.name}_{batch_size * perplexity_eval_steps}"
      results[step][eval_dataset.name] = estimator.evaluate(
          input_fn=functools.partial(input_fn, eval_dataset=eval_dataset),
          steps=perplexity_eval_steps, checkpoint_path=checkpoint_path,
          name=name)
  return results
