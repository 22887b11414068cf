"""Tests of the embedded addition task."""

import itertools

import pytest

from mesh_tensorflow.transformer import embedded_task


def _take(split, n, **kwargs):
  return list(itertools.islice(
      embedded_task.addition_examples(split, **kwargs), n))


def test_examples_are_correct_sums_of_short_operands():
  for inputs, targets in _take("train", 500, max_digits=3):
    a, b = inputs.split("+")
    assert len(a) <= 3 and len(b) <= 3
    assert str(int(a)) == a and str(int(b)) == b  # No leading zeros.
    assert int(a) + int(b) == int(targets)


def test_validation_pairs_are_never_trained_on():
  train = {x for x, _ in _take("train", 3000, max_digits=2)}
  validation = {x for x, _ in _take("validation", 300, max_digits=2)}
  assert not train & validation
  assert len(validation) > 20  # Two-digit sums: enough distinct ones.


def test_splits_are_reproducible_from_their_seed():
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


def test_exact_match():
  assert embedded_task.exact_match(["1", "22", "3"], ["1", "2", "3"]) == {
      "exact_match": pytest.approx(2 / 3)}
  assert embedded_task.exact_match([], []) == {"exact_match": 0.0}
  with pytest.raises(ValueError, match="2 targets but 1 predictions"):
    embedded_task.exact_match(["1", "2"], ["1"])


def test_bad_arguments_name_the_problem():
  with pytest.raises(ValueError, match="Unknown split 'test'"):
    _take("test", 1)
  with pytest.raises(ValueError, match="max_digits"):
    _take("train", 1, max_digits=0)
