"""The examples' text in eval_model and decode_from_dataset, as the original.

An EvalDataset's examples carry their text as "inputs_pretokenized" and
"targets_pretokenized" (T5's names); where it is missing, the text is the
ids decoded by the vocabulary (`utils._maybe_add_pretokenized_features`).
"""

import os

import numpy as np
import tensorflow as tf

from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary

VOCAB = vocabulary.ByteVocabulary()
LENGTH = 6
STEP = 100


def _ids(text):
  ids = list(VOCAB.encode(text)) + [1]
  return np.array(ids + [0] * (LENGTH - len(ids)), np.int32)


class _CopyEstimator:
  """Decodes every example to its own targets ids (a perfect model)."""

  def predict(self, input_fn, checkpoint_path=None):
    del checkpoint_path
    for batch in input_fn({}):
      for inputs, targets in zip(batch["inputs"].numpy(),
                                 batch["targets"].numpy()):
        yield {"inputs": inputs, "outputs": targets}


def _eval_dataset(pairs, with_text, metric_calls):
  """An EvalDataset of (input, target) strings; text features optional."""

  def dataset_fn(**unused_kwargs):
    features = {"inputs": np.stack([_ids(x) for x, _ in pairs]),
                "targets": np.stack([_ids(y) for _, y in pairs])}
    if with_text:
      # Upper case: the text differs from what the ids decode to.
      features["inputs_pretokenized"] = [x.upper() for x, _ in pairs]
      features["targets_pretokenized"] = [y.upper() for _, y in pairs]
    return tf.data.Dataset.from_tensor_slices(features)

  def postprocess_fn(text, example=None, is_target=False):
    del example
    return f"{text}!" if is_target else text

  def metric_fn(targets, predictions):
    metric_calls.append((list(targets), list(predictions)))
    return {"matches": float(np.mean(
        [t == p + "!" for t, p in zip(targets, predictions)]))}

  return dataset.EvalDataset("task", dataset_fn, postprocess_fn, [metric_fn])


def _checkpoint(model_dir):
  for suffix in (".index", ".data-00000-of-00001"):
    open(os.path.join(model_dir, f"model.ckpt-{STEP}{suffix}"), "w").close()


def _lines(path):
  with open(path) as f:
    return f.read().splitlines()


PAIRS = [("ab", "cd"), ("e", "fgh"), ("ij", "k")]


def _eval(tmp_path, with_text):
  _checkpoint(str(tmp_path))
  calls = []
  summary_dir = str(tmp_path / "eval")
  results = utils.eval_model(
      _CopyEstimator(), VOCAB, {"inputs": LENGTH, "targets": LENGTH},
      batch_size=2, dataset_split="validation", model_dir=str(tmp_path),
      eval_dataset_fn=lambda **kw: [_eval_dataset(PAIRS, with_text, calls)],
      eval_summary_dir=summary_dir, eval_checkpoint_step=STEP)
  return results, calls, summary_dir


def test_eval_model_reads_the_pretokenized_text(tmp_path):
  results, calls, summary_dir = _eval(tmp_path, with_text=True)
  ((targets, predictions),) = calls
  assert targets == ["CD!", "FGH!", "K!"]
  assert predictions == ["cd", "fgh", "k"]
  assert results == {STEP: {"task/matches": 0.0}}
  assert _lines(os.path.join(summary_dir, "task_targets")) == targets
  assert _lines(os.path.join(summary_dir, "task_inputs")) == [
      "AB", "E", "IJ"]


def test_eval_model_decodes_the_text_an_example_lacks(tmp_path):
  results, calls, summary_dir = _eval(tmp_path, with_text=False)
  ((targets, _),) = calls
  assert targets == ["cd!", "fgh!", "k!"]
  assert results == {STEP: {"task/matches": 1.0}}
  assert _lines(os.path.join(summary_dir, "task_inputs")) == ["ab", "e", "ij"]


def test_decode_from_dataset_writes_decodes_targets_and_inputs(tmp_path):
  _checkpoint(str(tmp_path))
  out = tmp_path / "decodes"
  out.mkdir()
  utils.decode_from_dataset(
      _CopyEstimator(), VOCAB, "lm", batch_size=2,
      sequence_length={"inputs": LENGTH, "targets": LENGTH},
      checkpoint_path=str(tmp_path / f"model.ckpt-{STEP}"),
      infer_dataset_fn=lambda **kw: [_eval_dataset(PAIRS, True, [])],
      decode_output_dir=str(out))
  # The decodes as they come; the targets postprocessed as targets.
  assert _lines(out / f"task_{STEP}_predictions") == ["cd", "fgh", "k"]
  assert _lines(out / "task_targets") == ["CD!", "FGH!", "K!"]
  assert _lines(out / "task_inputs") == ["AB", "E", "IJ"]


def test_maybe_add_pretokenized_features():
  add_text = utils._maybe_add_pretokenized_features  # pylint: disable=protected-access
  examples = [
      {"inputs": np.array([100, 101, 1, 0], np.int16),
       "targets": np.array([102, 1, 0, 0], np.int64), "other": 7},
      {"inputs": np.array([100, 1, 0, 0], np.int32),
       "inputs_pretokenized": b"kept"},
  ]
  got = add_text(examples, VOCAB)
  assert got is examples
  assert set(got[0]) == {"inputs", "targets", "other", "inputs_pretokenized",
                         "targets_pretokenized"}
  assert (got[0]["inputs_pretokenized"], got[0]["targets_pretokenized"]) == (
      "ab", "c")
  assert set(got[1]) == {"inputs", "inputs_pretokenized"}
  assert got[1]["inputs_pretokenized"] == b"kept"
  # An (inputs, targets) pair of vocabularies: each feature its own.
  upper = _UpperVocabulary()
  (pair,) = add_text(
      [{"inputs": np.array([100, 1]), "targets": np.array([100, 1])}],
      (VOCAB, upper))
  assert (pair["inputs_pretokenized"], pair["targets_pretokenized"]) == (
      "a", "A")


class _UpperVocabulary(vocabulary.ByteVocabulary):

  def decode(self, ids):
    return super().decode(ids).upper()
