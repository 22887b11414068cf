"""Tests of mesh_tensorflow.bert.google_checkpoint: a checkpoint in
google-research/bert's names (written here with tf.compat.v1.train.Saver
from random weights) converts, restores into BertModel under several
layouts, and gives the outputs of Google's BERT in float64 NumPy."""

import os

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.bert import bert
from mesh_tensorflow.bert import google_checkpoint
from tests.bert import generated_data
from tests.bert import numpy_bert
from tests.bert import test_bert

CONFIG = generated_data.tiny_config()
LAYOUT = test_bert.LAYOUT


def _write_google_checkpoint(directory, weights):
  """A TF1 Saver checkpoint of `weights` (plus a step and an Adam slot, as
  Google's pretraining checkpoints have); returns its prefix."""
  os.makedirs(directory)
  weights = dict(weights)
  weights["bert/pooler/dense/kernel/adam_m"] = np.zeros_like(
      weights["bert/pooler/dense/kernel"])
  weights["global_step"] = np.int64(1000)
  return test_bert.save_with_tf1_saver(
      weights, os.path.join(str(directory), "bert_model.ckpt"))


@pytest.fixture(scope="module")
def google(tmp_path_factory):
  """(Google weights, their checkpoint, the converted checkpoint)."""
  weights = numpy_bert.random_google_weights(CONFIG, seed=1)
  directory = tmp_path_factory.mktemp("google")
  prefix = _write_google_checkpoint(directory / "release", weights)
  config = bert.BertConfig.from_dict(CONFIG)
  converted = google_checkpoint.prepare_init_checkpoint(
      prefix, config, str(directory / "run"))
  return weights, prefix, converted


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("batch:2;model:4", LAYOUT)])
def test_converted_checkpoint_gives_googles_outputs(google, mesh_shape,
                                                   layout):
  weights, _, converted = google
  got, missing = test_bert.run_restored(CONFIG, converted, mesh_shape,
                                        layout)
  assert not missing  # Every variable of the model came from Google's.
  vocab = CONFIG["vocab_size"]
  got["mlm_logits"] = got["mlm_logits"][..., :vocab]
  # With mtf's layer-norm epsilon the conversion is exact up to float32
  # round-off; with Google's (1e-12) it differs by ~1e-6 / (2 variance).
  for epsilon, tol in ((1e-6, 2e-5), (1e-12, 1e-4)):
    want = test_bert.numpy_pretraining(weights, CONFIG, epsilon)
    for key, value in want.items():
      np.testing.assert_allclose(
          got[key], value, rtol=tol, atol=tol,
          err_msg=f"{key} [{mesh_shape}, Google epsilon {epsilon}]")


def test_converted_checkpoint_names_shapes_and_padding(google):
  weights, _, converted = google
  reader = tf.train.load_checkpoint(converted)
  shapes = reader.get_variable_to_shape_map()
  graph, model = test_bert.graph_of(bert.BertConfig.from_dict(CONFIG))
  assert shapes == {v.name: v.shape.to_integer_list
                    for v in graph.trainable_variables}
  vocab, padded = CONFIG["vocab_size"], model.vocab_dim.size
  embeddings = reader.get_tensor("bert/embeddings/word_embeddings")
  np.testing.assert_array_equal(embeddings[:vocab],
                                weights["bert/embeddings/word_embeddings"])
  assert not embeddings[vocab:].any()
  bias = reader.get_tensor("cls/predictions/output_bias")
  assert (bias[vocab:padded] == -10000.0).all()
  np.testing.assert_array_equal(
      reader.get_tensor("cls/seq_relationship/kernel"),
      weights["cls/seq_relationship/output_weights"].T)
  np.testing.assert_array_equal(
      reader.get_tensor("bert/encoder/block_1/attention/output/kernel"),
      weights["bert/encoder/layer_1/attention/output/dense/kernel"].reshape(
          8, 4, 32))


def test_conversion_happens_once_and_only_for_googles_names(google,
                                                            tmp_path):
  _, prefix, converted = google
  config = bert.BertConfig.from_dict(CONFIG)
  run_dir = os.path.dirname(os.path.dirname(converted))
  index = converted + ".index"
  before = os.stat(index).st_mtime_ns
  assert google_checkpoint.prepare_init_checkpoint(
      prefix, config, run_dir) == converted
  assert os.stat(index).st_mtime_ns == before
  assert not [f for f in os.listdir(os.path.dirname(converted))
              if ".tmp" in f]
  # Ours (and the original's) pass through unchanged, as do unreadable
  # paths (the estimator names them in its error).
  assert google_checkpoint.prepare_init_checkpoint(
      converted, config, str(tmp_path)) == converted
  missing = str(tmp_path / "nothing")
  assert google_checkpoint.prepare_init_checkpoint(
      missing, config, str(tmp_path)) == missing
  # A directory holding one release checkpoint is read too.
  assert google_checkpoint.prepare_init_checkpoint(
      os.path.dirname(prefix), config, run_dir) == converted


@pytest.mark.parametrize("overrides,message", [
    (dict(hidden_size=64, num_attention_heads=8),
     "'bert/embeddings/word_embeddings' has shape"),
    (dict(num_hidden_layers=1), "layer_1.*num_blocks=1"),
    (dict(num_hidden_layers=3), "'bert/encoder/layer_2/.*' is missing"),
    (dict(vocab_size=None), "'vocab_size'"),
    (dict(residual_structure="direct"), "residual_structure"),
])
def test_mismatches_raise_naming_the_variable(google, tmp_path, overrides,
                                              message):
  _, prefix, _ = google
  config = bert.BertConfig.from_dict(generated_data.tiny_config(**overrides))
  with pytest.raises(ValueError, match=message):
    google_checkpoint.prepare_init_checkpoint(prefix, config, str(tmp_path))
