"""The binary scores language models' examples as the original did.

A tiny LM trains one step; its checkpoint then scores as a "delimited_lm"
(inputs and targets joined into one sequence, the targets part scored) and
as an "lm" (an example's inputs joined in front of its targets, all
scored, as the exported score signature scores its "targets" text).
Decode files keep one line per input when a decode holds a newline.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary
from tests.transformer import test_auto_layout_run
from tests.transformer import test_main

FILES = test_auto_layout_run.LM_FILES
LENGTH = 8
TRAIN = [p for p in test_auto_layout_run.LM
         if not p.startswith(("utils.run.train_steps",
                              "utils.run.save_checkpoints_steps"))] + [
                                  "utils.run.train_steps = 1",
                                  "utils.run.save_checkpoints_steps = 1",
                                  "utils.run.mesh_shape = 'batch:1'",
                                  "utils.run.layout_rules = 'batch:batch'",
                                  # Joined examples are 2 * LENGTH long.
                                  f"Unitransformer.max_length = {2 * LENGTH}"]
VOCAB = vocabulary.ByteVocabulary()
EOS = 1
PAIRS = [("1+2", "3"), ("30+4", "34"), ("5+67", "72")]


@gin.configurable(module="tests.transformer.test_lm_scoring_run")
def ids_dataset_fn(sequence_length, vocabulary, dataset_split="validation",
                   features=gin.REQUIRED):
  """One EvalDataset of the given examples' ids (feature -> list of id
  lists), each padded to its feature's length."""
  del vocabulary, dataset_split

  def dataset_fn():
    padded = {
        k: np.array([row + [0] * (sequence_length[k] - len(row))
                     for row in rows], np.int32)
        for k, rows in features.items()}
    return tf.data.Dataset.from_tensor_slices(padded)

  return [dataset.EvalDataset("ids", dataset_fn, None, [])]


def _ids(text, eos=True):
  return list(VOCAB.encode(text)) + ([EOS] if eos else [])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("lm")
  test_main.run_main(model_dir, *TRAIN, files=FILES)
  return model_dir


def _score(model_dir, model_type, features, *params):
  """score_from_dataset of the examples `features`: (scores, targets)."""
  return test_main.run_main(
      model_dir, *TRAIN, f"run.model_type = '{model_type}'",
      "utils.run.mode = 'score_from_dataset'",
      "score_from_dataset.score_dataset_fn = "
      "@tests.transformer.test_lm_scoring_run.ids_dataset_fn",
      f"tests.transformer.test_lm_scoring_run.ids_dataset_fn.features = "
      f"{features!r}", *params, files=FILES)


def test_delimited_lm_scores_the_targets_after_their_inputs(trained):
  """As the original: inputs and targets are joined into one sequence
  (inputs, EOS, targets, EOS) and only the targets part is scored, from
  examples or from strings."""
  joined, _ = _score(
      trained, "delimited_lm",
      {"targets": [_ids(i) + _ids(t) for i, t in PAIRS]},
      f"utils.run.sequence_length = {{'inputs': {LENGTH}, "
      f"'targets': {2 * LENGTH}}}")
  assert all(s < 0 for s in joined)
  scores, targets = _score(
      trained, "delimited_lm",
      {"inputs": [_ids(i) for i, _ in PAIRS],
       "targets": [_ids(t) for _, t in PAIRS]})
  np.testing.assert_allclose(scores, joined, rtol=1e-5)
  assert targets == [t for _, t in PAIRS]
  scores, targets = test_main.run_main(
      trained, *TRAIN, "run.model_type = 'delimited_lm'",
      "utils.run.mode = 'score_from_strings'",
      f"score_from_strings.inputs = {[i for i, _ in PAIRS]}",
      f"score_from_strings.targets = {[t for _, t in PAIRS]}", files=FILES)
  np.testing.assert_allclose(scores, joined, rtol=1e-5)
  assert targets == [t for _, t in PAIRS]


def test_lm_export_scores_its_targets_text_as_the_lm_scores_examples(
    trained, tmp_path):
  """The exported score signature of an "lm" takes "targets" text alone (as
  the original's); an "lm" example's inputs are scored as the front of its
  sequence (as the original's), so a prompt changes the score."""
  texts = [i + "=" + t for i, t in PAIRS]
  export_dir = test_main.run_main(
      trained, *TRAIN, "utils.run.mode = 'export_score'",
      f"utils.run.export_path = '{tmp_path / 'export'}'", files=FILES)
  served = tf.saved_model.load(export_dir).signatures["serving_default"]
  assert set(served.structured_input_signature[1]) == {"targets"}
  exported = served(targets=tf.constant(texts))["scores"].numpy()
  assert all(s < 0 for s in exported)
  scores, _ = _score(
      trained, "lm",
      {"inputs": [_ids(i + "=", eos=False) for i, _ in PAIRS],
       "targets": [_ids(t) for _, t in PAIRS]})
  np.testing.assert_allclose(scores, exported, rtol=1e-4)


class _DecodingEstimator:
  """Stands in for an estimator decoding: each output is the input's text
  with a newline in the middle."""

  def latest_checkpoint(self):
    return "model.ckpt-7"

  def predict(self, input_fn, checkpoint_path=None):
    del checkpoint_path
    for batch in input_fn({}):
      for ids in batch["inputs"].numpy():
        text = VOCAB.decode([int(i) for i in ids if i > 1])
        yield {"inputs": text.encode(),
               "outputs": f"{text[:1]}\n{text[1:]}".encode()}


def test_decode_from_file_writes_one_line_per_input(tmp_path):
  """As the original's write_lines_to_file: a newline inside a decode is
  written as a space."""
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("ab\ncd\nef\n")
  output = tmp_path / "decodes"
  decodes = utils.decode_from_file(
      _DecodingEstimator(), VOCAB, "bitransformer", batch_size=2,
      sequence_length={"inputs": LENGTH, "targets": LENGTH},
      input_filename=str(inputs), output_filename=str(output))
  assert decodes == ["a\nb", "c\nd", "e\nf"]
  assert (tmp_path / "decodes-7").read_text() == "a b\nc d\ne f\n"
