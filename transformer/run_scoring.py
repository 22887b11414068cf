"""Scoring with a trained Transformer: the log-likelihood of given targets.

The estimator must score in predict mode (`utils.get_estimator(...,
score_in_predict_mode=True)`, which `utils.run` does for the score modes);
each prediction then holds "scores" and the example's "targets" (and
"inputs") ids. `score_from_strings` scores text pairs (lists or files),
`score_from_dataset` an EvalDataset; both hand the predictions to
`score_postprocess_fn` (default `save_scores`, which writes
"<scores_filename>.scores" and, with save_example_text, the examples' text).
Gin names are the original's (`utils.*`).
"""

import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow.estimator import host_values
from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer import run_checkpoints
from mesh_tensorflow.transformer import run_inference
from mesh_tensorflow.transformer import run_model_fn
from mesh_tensorflow.transformer import run_settings

_GIN_MODULE = "mesh_tensorflow.transformer.utils"


def _decode_ids(ids, vocab):
  """Text of ids up to the first EOS/padding, unscored-prefix ids
  (negative) included as their absolute values."""
  ids = [abs(int(i)) for i in np.asarray(ids).reshape(-1)]
  if 1 in ids:
    ids = ids[:ids.index(1)]
  return vocab.decode([i for i in ids if i != 0])


@gin.configurable(module=_GIN_MODULE)
def save_scores(results, vocabulary, scores_filename=None,
                save_example_text=True):
  """Writes the scores (and the examples' text) and returns the scores.

  Args:
    results: the scoring predictions, dicts with "scores", "targets" and
      maybe "inputs".
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    scores_filename: the prefix of the files "<prefix>.scores" (one float
      per line), "<prefix>.targets" and "<prefix>.inputs"; None writes
      nothing.
    save_example_text: also write the targets' and inputs' text.

  Returns:
    (scores, targets): a list of floats and the scored target strings (as
    T5's MtfModel.score returns them).
  """
  scores = [float(r["scores"]) for r in results]
  texts = {}
  for key, vocab in (
      ("targets", run_settings.targets_vocabulary(vocabulary)),
      ("inputs", run_settings.inputs_vocabulary(vocabulary))):
    if results and key in results[0]:
      texts[key] = [_decode_ids(r[key], vocab) for r in results]
  if scores_filename is not None:
    run_inference.write_lines_to_file([f"{s:f}" for s in scores],
                                      f"{scores_filename}.scores")
    if save_example_text:
      for key, lines in texts.items():
        # One example per line: newlines inside a text would break that.
        lines = [line.replace("\n", "\\n") for line in lines]
        run_inference.write_lines_to_file(lines, f"{scores_filename}.{key}")
  return scores, texts.get("targets", [])


def score_with_estimator(estimator, input_fn, eval_checkpoint_step,
                         model_dir, vocabulary, score_postprocess_fn=save_scores,
                         num_examples=None):
  """Scores input_fn's examples with the checkpoint eval_checkpoint_step
  names (None: the latest); returns score_postprocess_fn(results,
  vocabulary), the padding examples beyond num_examples dropped."""
  if eval_checkpoint_step is None:
    checkpoint_path = estimator.latest_checkpoint()
    if checkpoint_path is None:
      raise ValueError(f"No checkpoint in {model_dir!r} to score with: "
                       "train first.")
  else:
    checkpoint_path, = run_checkpoints.get_checkpoint_iterator(
        eval_checkpoint_step, model_dir)
  results = list(estimator.predict(input_fn, checkpoint_path=checkpoint_path))
  if num_examples is not None:
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
  if model_type == "delimited_lm":
    features = {"targets": run_inference.encode_delimited_lm(
        inputs, targets, vocabulary, batch_size, sequence_length["targets"],
        eos_id=eos_id, include_final_eos=score_eos)}
  else:
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


@gin.configurable(module=_GIN_MODULE)
def score_from_dataset(estimator, vocabulary, batch_size, sequence_length,
                       model_dir, eval_checkpoint_step, dataset_split,
                       score_dataset_fn=None,
                       score_postprocess_fn=save_scores):
  """The log-likelihood of each example of score_dataset_fn's one
  EvalDataset (see score_from_strings)."""
  if score_dataset_fn is None:
    raise ValueError("score_from_dataset needs score_dataset_fn (gin: "
                     "utils.score_from_dataset.score_dataset_fn).")
  datasets = score_dataset_fn(sequence_length=sequence_length,
                              vocabulary=vocabulary,
                              dataset_split=dataset_split)
  if len(datasets) != 1:
    raise ValueError(f"Only scoring from a single dataset is supported, got "
                     f"{len(datasets)}.")
  scoring = transformer_dataset.EvalDataset(*datasets[0])
  num_examples = sum(
      1 for _ in host_values.numpy_iterator(scoring.dataset_fn()))

  def input_fn(params):
    del params
    ds = scoring.dataset_fn().map(run_model_fn.filter_features)
    ds = ds.batch(batch_size, drop_remainder=False)
    ds = transformer_dataset.trim_and_pad_dataset(ds, length=batch_size)
    return ds.prefetch(tf.data.AUTOTUNE)

  return score_with_estimator(estimator, input_fn, eval_checkpoint_step,
                              model_dir, vocabulary, score_postprocess_fn,
                              num_examples)
