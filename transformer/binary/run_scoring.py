"""Scoring with a trained Transformer: the log-likelihood of given targets.

The estimator must score in predict mode (`utils.get_estimator(...,
score_in_predict_mode=True)`, which `utils.run` does for the score modes);
each prediction then holds "scores" and the example's "targets" ids (as
the original's, no "inputs"). `score_from_strings` scores text pairs (lists
or files), `score_from_dataset` EvalDatasets; both hand the predictions to
`score_postprocess_fn` (default `save_scores`, which returns the scores, or
`(scores, targets)` / `(scores, inputs, targets)` with the examples' text, and
writes "<scores_filename>.scores", ".targets", ".lengths" and ".inputs").
Return values, files and gin names (`utils.*`) are the original's.
"""

import inspect

import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer.binary import run_checkpoints
from mesh_tensorflow.transformer.binary import run_features
from mesh_tensorflow.transformer.binary import run_inference
from mesh_tensorflow.transformer.binary import run_settings

_GIN_MODULE = "mesh_tensorflow.transformer.utils"


def _decode_ids(ids, vocab):
  """Text of ids up to the first EOS/padding, unscored-prefix ids
  (negative) included as their absolute values."""
  ids = [abs(int(i)) for i in np.asarray(ids).reshape(-1)]
  if 1 in ids:
    ids = ids[:ids.index(1)]
  return vocab.decode([i for i in ids if i != 0])


def _example_texts(results, key, vocab):
  """Each result's "<key>_pretokenized" text, else its decoded ids."""
  texts = []
  for r in results:
    text = r.get(f"{key}_pretokenized")
    if text is None:
      text = _decode_ids(r[key], vocab)
    texts.append(tf.compat.as_text(text) if isinstance(text, bytes)
                 else text)
  return texts


def _sequence_length(ids, pad_id=0):
  """The number of ids before the first padding id (all, without one)."""
  ids = np.asarray(ids).reshape(-1)
  pads = np.flatnonzero(ids == pad_id)
  return int(pads[0]) if pads.size else len(ids)


@gin.configurable(module=_GIN_MODULE)
def save_scores(results, vocabulary, scores_filename=None,
                save_example_text=True):
  """Returns the scores (and the examples' text), maybe writing them.

  As the original: the files are "<scores_filename>.scores" (one "%g" float
  per line) and, with save_example_text, ".targets", ".lengths" (the
  targets' token counts before padding, EOS included) and, when the
  examples have inputs, ".inputs".

  Args:
    results: the scoring predictions, dicts with "scores", "targets" and
      maybe "inputs" (and their "*_pretokenized" texts).
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    scores_filename: the files' prefix; None writes nothing.
    save_example_text: also return (and write) the examples' text.

  Returns:
    scores, a list of floats, one per example; with save_example_text
    `(scores, targets)`, or `(scores, inputs, targets)` when the examples
    have inputs (lists of strings).

  Raises:
    ValueError: if there are no results.
  """
  if not results:
    raise ValueError("No examples were scored.")
  scores = [float(r["scores"]) for r in results]
  if scores_filename is not None:
    run_inference.write_lines_to_file([f"{s:g}" for s in scores],
                                      f"{scores_filename}.scores")
  if not save_example_text:
    return scores
  targets = _example_texts(results, "targets",
                           run_settings.targets_vocabulary(vocabulary))
  if scores_filename is not None:
    run_inference.write_lines_to_file(targets, f"{scores_filename}.targets")
    run_inference.write_lines_to_file(
        [_sequence_length(r["targets"]) for r in results],
        f"{scores_filename}.lengths")
  if "inputs" not in results[0]:
    return scores, targets
  inputs = _example_texts(results, "inputs",
                          run_settings.inputs_vocabulary(vocabulary))
  if scores_filename is not None:
    run_inference.write_lines_to_file(inputs, f"{scores_filename}.inputs")
  return scores, inputs, targets


def _num_unpadded(results):
  """The number of results before the trailing all-padding examples."""
  n = len(results)
  while n and not np.any(np.asarray(results[n - 1]["targets"])):
    n -= 1
  return n


@gin.configurable(module=_GIN_MODULE)
def score_with_estimator(estimator, input_fn, eval_checkpoint_step,
                         model_dir, vocabulary,
                         score_postprocess_fn=save_scores,
                         num_examples=None):
  """Scores input_fn's examples with the checkpoint eval_checkpoint_step
  names (None: the latest); returns score_postprocess_fn(results,
  vocabulary).

  The examples beyond num_examples are padding and dropped; when
  num_examples is None, the trailing examples whose targets are all
  padding are (as in the original).
  """
  if eval_checkpoint_step is None:
    checkpoint_path = estimator.latest_checkpoint()
    if checkpoint_path is None:
      raise ValueError(f"No checkpoint in {model_dir!r} to score with: "
                       "train first.")
  else:
    checkpoint_path, = run_checkpoints.get_checkpoint_iterator(
        eval_checkpoint_step, model_dir)
  results = list(estimator.predict(input_fn, checkpoint_path=checkpoint_path))
  if num_examples is None:
    num_examples = _num_unpadded(results)
  results = results[:num_examples]
  return score_postprocess_fn(results, vocabulary)


def _match_lengths(inputs, targets):
  """inputs repeated (or one target repeated) so that both lists pair up."""
  if len(inputs) < len(targets):
    if len(targets) % len(inputs):
      raise ValueError(f"len(inputs) must divide len(targets), got "
                       f"{len(inputs)} and {len(targets)}")
    repeats = len(targets) // len(inputs)
    inputs = [inputs[i // repeats] for i in range(len(targets))]
  elif len(targets) < len(inputs):
    if len(targets) != 1:
      raise ValueError(f"{len(inputs)} inputs need 1 or {len(inputs)} "
                       f"targets, got {len(targets)}")
    targets = targets * len(inputs)
  return inputs, targets


@gin.configurable(module=_GIN_MODULE)
def score_from_strings(estimator, vocabulary, model_type, batch_size,
                       sequence_length, model_dir, eval_checkpoint_step,
                       inputs=gin.REQUIRED, targets=gin.REQUIRED,
                       score_postprocess_fn=save_scores, eos_id=1,
                       score_eos=True):
  """The log-likelihood of each target given its input.

  Args:
    estimator: an Estimator scoring in predict mode.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    model_type: the run's model type.
    batch_size: sequences per batch.
    sequence_length: a dict feature -> length.
    model_dir: the run's directory.
    eval_checkpoint_step: the checkpoint (see get_checkpoint_iterator);
      None for the latest.
    inputs: a list of strings or a file of them (one per line); None for a
      language model without inputs. Each input may have several targets in
      a row (len(targets) a multiple of len(inputs)).
    targets: a list of strings or a file of them.
    score_postprocess_fn: (results, vocabulary) -> scores, e.g. save_scores.
    eos_id: the EOS id.
    score_eos: whether the final EOS counts (False: prefix likelihoods).

  Returns:
    what score_postprocess_fn returns.
  """
  if isinstance(inputs, str):
    inputs = run_inference.get_inputs_from_file(inputs)
  if isinstance(targets, str):
    targets = run_inference.get_inputs_from_file(targets)
  if not targets:
    raise ValueError("score_from_strings: no targets to score.")
  has_inputs = inputs is not None
  if has_inputs:
    inputs, targets = _match_lengths(inputs, targets)
  if model_type == "lm":
    # As the original: a language model scores each target after its input,
    # which is an unscored prefix of the same sequence.
    features = {"targets": run_inference.encode_inputs(
        targets, run_settings.targets_vocabulary(vocabulary), model_type,
        batch_size, sequence_length["targets"],
        eos_id=eos_id if score_eos else 0,
        unscored_prefix=inputs if has_inputs else None)}
  else:
    # A "delimited_lm" too, as the original: the model joins each input
    # and its target into one sequence and scores the target's part.
    features = {"targets": run_inference.encode_inputs(
        targets, run_settings.targets_vocabulary(vocabulary), model_type,
        batch_size, sequence_length["targets"],
        eos_id=eos_id if score_eos else 0)}
    if has_inputs:
      features["inputs"] = run_inference.encode_inputs(
          inputs, vocabulary, model_type, batch_size,
          sequence_length["inputs"], eos_id=eos_id)
  input_fn = run_inference.ids_input_fn(features, batch_size)
  return score_with_estimator(estimator, input_fn, eval_checkpoint_step,
                              model_dir, vocabulary, score_postprocess_fn,
                              len(targets))


def _call_dataset_fn(dataset_fn, sequence_length):
  """dataset_fn(sequence_length=...) as the original calls it, or
  dataset_fn() for one that takes no arguments (this package's tasks)."""
  try:
    parameters = inspect.signature(dataset_fn).parameters
  except (TypeError, ValueError):
    parameters = {"sequence_length": None}
  if "sequence_length" in parameters or any(
      p.kind == p.VAR_KEYWORD for p in parameters.values()):
    return dataset_fn(sequence_length=sequence_length)
  return dataset_fn()


@gin.configurable(module=_GIN_MODULE)
def score_from_dataset(estimator, vocabulary, batch_size, sequence_length,
                       model_dir, eval_checkpoint_step, dataset_split,
                       score_dataset_fn=None,
                       score_postprocess_fn=save_scores):
  """The log-likelihood of each example of score_dataset_fn's EvalDatasets,
  in order (several are scored one after the other, as in the original);
  returns what score_postprocess_fn returns (see save_scores)."""
  if score_dataset_fn is None:
    raise ValueError("score_from_dataset needs score_dataset_fn (gin: "
                     "utils.score_from_dataset.score_dataset_fn).")
  datasets = [transformer_dataset.EvalDataset(*d) for d in score_dataset_fn(
      sequence_length=sequence_length, vocabulary=vocabulary,
      dataset_split=dataset_split)]
  if not datasets:
    raise ValueError(f"score_dataset_fn gave no dataset to score for split "
                     f"{dataset_split!r}.")

  def input_fn(params):
    del params
    combined = None
    for scoring in datasets:
      ds = _call_dataset_fn(scoring.dataset_fn, sequence_length)
      ds = ds.map(run_features.filter_features)
      combined = ds if combined is None else combined.concatenate(ds)
    combined = combined.batch(batch_size, drop_remainder=False)
    combined = transformer_dataset.trim_and_pad_dataset(combined,
                                                        length=batch_size)
    return combined.prefetch(tf.data.AUTOTUNE)

  # As the original: the padding examples are found by their all-zero
  # targets.
  return score_with_estimator(estimator, input_fn, eval_checkpoint_step,
                              model_dir, vocabulary, score_postprocess_fn,
                              None)
