"""Tests of the embedded addition task and its gin problem file."""

import itertools
import pathlib

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow.transformer
from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer.data import embedded_task
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary

GIN_FILE = (pathlib.Path(mesh_tensorflow.transformer.__file__).parent /
            "gin" / "problems" / "addition.gin")
LENGTHS = {"inputs": 8, "targets": 8}
BYTES = vocabulary.ByteVocabulary()


def _take(split, n, **kwargs):
  return list(itertools.islice(
      embedded_task.addition_examples(split, **kwargs), n))


def _text(ids):
  """Byte ids (up to EOS) as text."""
  return BYTES.decode([int(i) for i in ids])


def test_examples_are_correct_sums_of_short_operands():
  examples = _take("train", 500, max_digits=3)
  for inputs, targets in examples:
    a, b = inputs.split("+")
    assert len(a) <= 3 and len(b) <= 3
    assert str(int(a)) == a and str(int(b)) == b  # No leading zeros.
    assert int(a) + int(b) == int(targets)
  # The digit count is drawn first: each length is about as common.
  lengths = [len(x.split("+")[0]) for x, _ in examples]
  assert min(lengths.count(d) for d in (1, 2, 3)) > 120


def test_validation_sums_are_never_trained_on():
  train = {x for x, _ in _take("train", 3000, max_digits=2)}
  validation = {x for x, _ in _take("validation", 300, max_digits=2)}
  assert not train & validation
  assert len(validation) > 20  # Two-digit sums: enough distinct ones.
  held = embedded_task.is_held_out(tf.constant(sorted(train | validation)))
  assert held.numpy().sum() == len(validation)


def test_splits_are_reproducible_from_their_seed():
  # The first sums of seed 0, fixed: the same data on every machine.
  assert _take("train", 3) == [("94+44", "138"), ("997+2", "999"),
                               ("57+70", "127")]
  assert _take("validation", 50, seed=3) == _take("validation", 50, seed=3)
  assert _take("train", 50, seed=3) != _take("train", 50, seed=4)


def test_dataset_yields_string_features_and_stops():
  ds = embedded_task.addition_dataset("validation", max_digits=4,
                                      num_examples=7)
  rows = list(ds.as_numpy_iterator())
  assert len(rows) == 7
  expected = _take("validation", 7, max_digits=4)
  assert [(r["inputs"].decode(), r["targets"].decode()) for r in rows] == (
      expected)


def test_train_dataset_fn_packs_encoded_sums():
  # Rows of 16 tokens hold two sums or more.
  lengths = {"inputs": 16, "targets": 8}
  ds = embedded_task.addition_train_dataset_fn(lengths, BYTES)
  keys = ["inputs", "inputs_position", "inputs_segmentation", "targets",
          "targets_position", "targets_segmentation"]
  assert sorted(ds.element_spec) == keys
  for k, spec in ds.element_spec.items():
    assert spec.shape == tf.TensorShape([lengths[k.split("_")[0]]])
    assert spec.dtype == tf.int32
  sums = []
  for row in ds.take(10).as_numpy_iterator():
    for segment in range(1, row["inputs_segmentation"].max() + 1):
      ids = {k: row[k][row[k + "_segmentation"] == segment]
             for k in ("inputs", "targets")}
      for k, v in ids.items():
        assert v[-1] == vocabulary.EOS_ID, (k, v)  # Every sum ends in EOS.
        np.testing.assert_array_equal(
            row[k + "_position"][row[k + "_segmentation"] == segment],
            np.arange(len(v)))
      sums.append((_text(ids["inputs"]), _text(ids["targets"])))
  assert len(sums) > 15
  assert sums == _take("train", len(sums))  # In order, none dropped.


def test_train_dataset_fn_unpacked_and_with_two_vocabularies():
  ds = embedded_task.addition_train_dataset_fn(
      {"inputs": 8, "targets": 5}, (BYTES, BYTES), pack=False)
  assert sorted(ds.element_spec) == ["inputs", "targets"]
  row = next(ds.as_numpy_iterator())
  (inputs, targets), = _take("train", 1)
  assert row["targets"].shape == (5,)
  np.testing.assert_array_equal(
      row["inputs"], (BYTES.encode(inputs) + [1] + [0] * 8)[:8])
  assert _text(row["targets"]) == targets


class _LengthVocabulary(vocabulary.Vocabulary):
  """A stub whose encode_tf takes one string only: its length + 2."""

  def encode_tf(self, s):
    return tf.reshape(tf.strings.length(s) + 2, [-1])


def test_vocabulary_encoding_one_string_at_a_time():
  ds = embedded_task.addition_train_dataset_fn(
      LENGTHS, (BYTES, _LengthVocabulary()), pack=False)
  rows = list(ds.take(3).as_numpy_iterator())
  for row, (inputs, targets) in zip(rows, _take("train", 3)):
    assert _text(row["inputs"]) == inputs
    np.testing.assert_array_equal(row["targets"],
                                  [len(targets) + 2, 1, 0, 0, 0, 0, 0, 0])


def test_train_dataset_fn_resumes_from_a_checkpoint(tmp_path):
  # The input pipeline's position is saved with tf.train.Checkpoint, as
  # utils.run's checkpoint_input_pipeline does.
  def pipeline():
    return iter(embedded_task.addition_train_dataset_fn(LENGTHS, BYTES))
  first = pipeline()
  for _ in range(5):
    next(first)
  path = tf.train.Checkpoint(iterator=first).save(str(tmp_path / "ckpt"))
  expected = [next(first)["inputs"].numpy() for _ in range(3)]
  resumed = pipeline()
  tf.train.Checkpoint(iterator=resumed).restore(path).assert_consumed()
  got = [next(resumed)["inputs"].numpy() for _ in range(3)]
  np.testing.assert_array_equal(got, expected)


def _carries(inputs):
  a, b = inputs.split("+")
  return embedded_task.count_carries(int(a), int(b))


def test_count_carries():
  assert embedded_task.count_carries(12, 30) == 0
  assert embedded_task.count_carries(250, 250) == 1  # Into the hundreds.
  assert embedded_task.count_carries(57, 68) == 2
  assert embedded_task.count_carries(999, 1) == 3
  assert embedded_task.count_carries(0, 0) == 0
  assert embedded_task.count_carries(5, 5) == 1
  with pytest.raises(ValueError, match="non-negative"):
    embedded_task.count_carries(-1, 3)


def test_carry_classes_end_in_an_open_class():
  assert embedded_task.carry_classes(3) == [
      ("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3", 3, 3)]
  assert embedded_task.carry_classes(1) == [("0", 0, 0), ("1", 1, 1)]
  assert embedded_task.carry_classes(9)[-1] == ("4+", 4, 9)


def test_dataset_of_one_carry_count():
  sums = _take("validation", 40, carries=2)
  assert all(_carries(x) == 2 for x, _ in sums)
  assert all(int(a) + int(b) == int(y)
             for (a, b), y in ((x.split("+"), y) for x, y in sums))
  # A subsequence of the split: the held-out sums that carry twice.
  natural = [p for p in _take("validation", 2000) if _carries(p[0]) == 2]
  assert sums == natural[:40]


def test_eval_set_is_drawn_in_equal_shares_per_carry_count():
  evals = embedded_task.addition_eval_dataset_fn(
      LENGTHS, BYTES, dataset_split="validation", num_eval_examples=42)
  task, = evals
  rows = list(task.dataset_fn().as_numpy_iterator())
  sums = [(r["inputs_pretokenized"].decode(),
           r["targets_pretokenized"].decode()) for r in rows]
  # 42 sums: 11, 11, 10, 10 for 0, 1, 2, 3 carries, in that order.
  assert [_carries(x) for x, _ in sums] == (
      [0] * 11 + [1] * 11 + [2] * 10 + [3] * 10)
  for x, y in sums:
    a, b = x.split("+")
    assert int(a) + int(b) == int(y)
  for r, (x, y) in zip(rows, sums):
    assert _text(r["inputs"]) == x and _text(r["targets"]) == y
  # Held out, distinct, and the same on every call.
  inputs = [x for x, _ in sums]
  assert embedded_task.is_held_out(tf.constant(inputs)).numpy().all()
  assert len(set(inputs)) == len(inputs)
  assert [r["inputs_pretokenized"] for r in task.dataset_fn()
          .as_numpy_iterator()] == [r["inputs_pretokenized"] for r in rows]
  # Three times as many sums that carry three times as among random sums.
  natural = [_carries(x) for x, _ in _take("validation", 42)]
  assert natural.count(3) < 10 / 3
  # The metrics: overall, and per carry count.
  assert task.metric_fns[:2] == [embedded_task.exact_match,
                                 embedded_task.digit_accuracy]
  targets = [y for _, y in sums]
  predictions = targets[:30] + ["0"] * 12  # Wrong from the 31st on.
  assert task.metric_fns[2](targets, predictions) == {
      "exact_match_carries_0": 1.0, "exact_match_carries_1": 1.0,
      "exact_match_carries_2": pytest.approx(8 / 10),
      "exact_match_carries_3": 0.0}


def test_exact_match_by_carries_checks_the_class_sizes():
  got = embedded_task.exact_match_by_carries(
      ["1", "2", "3"], ["1", "0", "3"], class_sizes=[("0", 1), ("1", 0),
                                                     ("2+", 2)])
  assert got == {"exact_match_carries_0": 1.0,
                 "exact_match_carries_2+": 0.5}
  with pytest.raises(ValueError, match="classes hold 2 examples, but there "
                     "are 3 targets"):
    embedded_task.exact_match_by_carries(["1", "2", "3"], ["1", "2", "3"],
                                         class_sizes=[("0", 2)])


def test_eval_dataset_fn_gives_fixed_held_out_examples_with_text():
  evals = embedded_task.addition_eval_dataset_fn(
      LENGTHS, BYTES, dataset_split="validation", num_eval_examples=30,
      by_carries=False)
  assert len(evals) == 1
  task = evals[0]
  assert isinstance(task, dataset.EvalDataset)
  assert task.name == "addition"
  assert task.metric_fns == [embedded_task.exact_match,
                             embedded_task.digit_accuracy]
  ds = task.dataset_fn()
  assert sorted(ds.element_spec) == [
      "inputs", "inputs_pretokenized", "targets", "targets_pretokenized"]
  assert ds.element_spec["inputs"].shape == tf.TensorShape([8])
  assert ds.element_spec["inputs"].dtype == tf.int32
  rows = list(ds.as_numpy_iterator())
  assert len(rows) == 30
  assert [(r["inputs_pretokenized"].decode(),
           r["targets_pretokenized"].decode())
          for r in rows] == _take("validation", 30)
  for r in rows:
    assert _text(r["inputs"]) == r["inputs_pretokenized"].decode()
    assert _text(r["targets"]) == r["targets_pretokenized"].decode()
  again = list(task.dataset_fn().as_numpy_iterator())
  assert [r["inputs_pretokenized"] for r in again] == [
      r["inputs_pretokenized"] for r in rows]
  # As utils.eval_model calls it.
  assert task.postprocess_fn(" 503\n", example=rows[0], is_target=True) == (
      "503")
  assert task.postprocess_fn("503", example=rows[0]) == "503"


def test_eval_split_overrides_the_run_split():
  evals = embedded_task.addition_eval_dataset_fn(
      LENGTHS, BYTES, dataset_split="train", num_eval_examples=5,
      split="validation", by_carries=False)
  rows = list(evals[0].dataset_fn().as_numpy_iterator())
  assert [r["inputs_pretokenized"].decode() for r in rows] == [
      x for x, _ in _take("validation", 5)]


def test_exact_match():
  assert embedded_task.exact_match(["1", "22", "3"], ["1", "2", "3"]) == {
      "exact_match": pytest.approx(2 / 3)}
  assert embedded_task.exact_match([], []) == {"exact_match": 0.0}
  with pytest.raises(ValueError, match="2 targets but 1 predictions"):
    embedded_task.exact_match(["1", "2"], ["1"])


def test_digit_accuracy():
  # 503 vs 513: 2 of 3 places. 99 vs 1099: 2 of 4 places (by place value).
  # 7 vs "": 0 of 1.
  got = embedded_task.digit_accuracy(["503", "99", "7"],
                                     ["513", "1099", ""])
  assert got == {"digit_accuracy": pytest.approx(4 / 8)}
  assert embedded_task.digit_accuracy([], []) == {"digit_accuracy": 0.0}
  with pytest.raises(ValueError, match="digit_accuracy: 1 targets"):
    embedded_task.digit_accuracy(["1"], [])


def test_bad_arguments_name_the_problem():
  with pytest.raises(ValueError, match="Unknown split 'test'"):
    embedded_task.addition_dataset("test")
  with pytest.raises(ValueError, match="max_digits"):
    embedded_task.addition_dataset("train", max_digits=0)
  with pytest.raises(ValueError, match=(
      r"addition_train_dataset_fn: sequence_length\['inputs'\] = 8 is too "
      r"short for max_digits=4: '9999\+9999' takes 10 tokens")):
    embedded_task.addition_train_dataset_fn(LENGTHS, BYTES, max_digits=4)
  with pytest.raises(ValueError, match=r"sequence_length\['targets'\] = 4"):
    embedded_task.addition_eval_dataset_fn({"inputs": 8, "targets": 4},
                                           BYTES)
  with pytest.raises(ValueError, match=r"no length for \['targets'\]"):
    embedded_task.addition_train_dataset_fn({"inputs": 8}, BYTES)


def test_vocabulary_round_trips_sums():
  vocab = embedded_task.addition_vocabulary()
  assert isinstance(vocab, vocabulary.Vocabulary)
  for text in ("417+86", "503", "0+0"):
    assert vocab.decode(vocab.encode(text)) == text
    ids = vocab.encode_tf(tf.constant(text))
    assert vocab.decode_tf(ids).numpy().decode() == text


def _register_run_stand_in():
  """A stand-in for utils.run until the run loop brings it: takes its
  bindings (another test module may have registered it already)."""
  if hasattr(utils, "run"):
    return
  try:
    gin.configurable("run", module="mesh_tensorflow.transformer.utils")(
        lambda **unused_kwargs: None)
  except ValueError:
    pass


def test_addition_gin_file_gives_run_its_problem():
  _register_run_stand_in()
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings(
        [str(GIN_FILE)], ["embedded_task.addition_eval_dataset_fn."
                          "num_eval_examples = 4"])
    run = gin.get_bindings("mesh_tensorflow.transformer.utils.run")
    assert run["model_type"] == "bitransformer"
    assert run["sequence_length"] == LENGTHS
    vocab = run["vocabulary"]
    assert isinstance(vocab, vocabulary.ByteVocabulary)
    # Called as utils.run calls them.
    train = run["train_dataset_fn"](sequence_length=LENGTHS,
                                    vocabulary=vocab, dataset_split="train")
    assert sorted(train.element_spec) == ["inputs", "targets"]  # Padded.
    row = next(train.as_numpy_iterator())
    assert _text(row["inputs"]) == _take("train", 1)[0][0]
    evals = run["eval_dataset_fn"](sequence_length=LENGTHS,
                                   vocabulary=vocab, dataset_split="train")
    rows = list(evals[0].dataset_fn().as_numpy_iterator())
    inputs = [r["inputs_pretokenized"].decode() for r in rows]
    # Held-out sums, one for each number of carries.
    assert [_carries(x) for x in inputs] == [0, 1, 2, 3]
    assert embedded_task.is_held_out(tf.constant(inputs)).numpy().all()
  finally:
    gin.clear_config()
