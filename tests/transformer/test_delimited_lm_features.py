"""utils._dynamic_text2self: text2text features as one "delimited_lm" row.

Packed features carry their own segment ids and positions; unpacked ones
(one example per row) get them derived, as in the original.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import utils
from tests.transformer import layer_testing

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 5)


def _text2self(features):
  def build(mesh):
    mtf_features = {
        k: mtf.import_tf_tensor(mesh, tf.constant(v, tf.int32),
                                [BATCH, LENGTH])
        for k, v in features.items()}
    text2self = utils._dynamic_text2self  # pylint: disable=protected-access
    return text2self(mtf_features), None, {}
  return layer_testing.run_under("all:1", "", "function", build)


def test_packed_examples_are_concatenated_segment_by_segment():
  got = _text2self({
      "inputs": [[3, 1, 4, 1, 0], [1, 4, 3, 2, 1]],
      "inputs_segmentation": [[1, 1, 2, 2, 0], [1, 2, 2, 2, 2]],
      "inputs_position": [[0, 1, 0, 1, 0], [0, 0, 1, 2, 3]],
      "targets": [[1, 1, 0, 0, 0], [9, 8, 1, 2, 1]],
      "targets_segmentation": [[1, 2, 0, 0, 0], [1, 1, 1, 2, 2]],
      "targets_position": [[0, 0, 0, 0, 0], [0, 1, 2, 0, 1]],
  })
  np.testing.assert_array_equal(got["targets"], [
      [3, 1, 1, 4, 1, 1, 0, 0, 0, 0], [1, 9, 8, 1, 4, 3, 2, 1, 2, 1]])
  np.testing.assert_array_equal(got["targets_segmentation"], [
      [1, 1, 1, 2, 2, 2, 0, 0, 0, 0], [1, 1, 1, 1, 2, 2, 2, 2, 2, 2]])
  np.testing.assert_array_equal(got["targets_position"], [
      [0, 1, 2, 0, 1, 2, 0, 0, 0, 0], [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])


def test_unpacked_rows_are_one_example_each():
  """Inputs' non-padding ids, then the targets', in one segment."""
  got = _text2self({
      "inputs": [[3, 1, 4, 1, 0], [5, 1, 0, 0, 0]],
      "targets": [[1, 1, 0, 0, 0], [9, 8, 7, 2, 1]],
  })
  np.testing.assert_array_equal(got["targets"], [
      [3, 1, 4, 1, 1, 1, 0, 0, 0, 0], [5, 1, 9, 8, 7, 2, 1, 0, 0, 0]])
  np.testing.assert_array_equal(got["targets_segmentation"], [
      [1, 1, 1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(got["targets_position"], [
      [0, 1, 2, 3, 4, 5, 0, 0, 0, 0], [0, 1, 2, 3, 4, 5, 6, 0, 0, 0]])


def test_packed_features_missing_a_position_name_it():
  with pytest.raises(ValueError, match="targets_position"):
    _text2self({
        "inputs": [[3, 1, 0, 0, 0]] * 2,
        "inputs_segmentation": [[1, 1, 0, 0, 0]] * 2,
        "inputs_position": [[0, 1, 0, 0, 0]] * 2,
        "targets": [[4, 1, 0, 0, 0]] * 2,
        "targets_segmentation": [[1, 1, 0, 0, 0]] * 2,
    })
