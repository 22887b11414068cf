"""Tests of mesh_tensorflow.bert.google_checkpoint: a checkpoint in
google-research/bert's names (written here with tf.compat.v1.train.Saver
from random weights) converts, restores into BertModel under several
layouts, and gives the outputs of Google's BERT in float64 NumPy."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import checkpointing
from mesh_tensorflow.bert import bert
from mesh_tensorflow.bert import google_checkpoint
from tests import mtf_testing
from tests.bert import generated_data
from tests.bert import numpy_bert
from tests.bert import test_bert

CONFIG = generated_data.tiny_config()
LAYOUT = test_bert.LAYOUT
INPUTS = test_bert.INPUTS


def _write_google_checkpoint(directory, weights):
  """A TF1 Saver checkpoint of `weights` (plus a step and Adam slots, as
  Google's pretraining checkpoints have); returns its prefix."""
  prefix = os.path.join(str(directory), "bert_model.ckpt")
  with tf.Graph().as_default():
    for name, value in weights.items():
      tf.compat.v1.get_variable(name, initializer=tf.constant(value))
    tf.compat.v1.get_variable(
        "bert/pooler/dense/kernel/adam_m",
        initializer=tf.zeros_like(weights["bert/pooler/dense/kernel"]))
    tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(sess, prefix, write_meta_graph=False)
  return prefix


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


def _run_restored(checkpoint, mesh_shape, layout):
  """Builds BertModel with the pretraining heads, its variables filled from
  `checkpoint` by the checkpointing module (as the estimator's warm start
  does), runs it eagerly; returns (outputs, variables not restored)."""
  impl = mtf_testing.make_impl("eager", mesh_shape, layout)
  reader = tf.train.load_checkpoint(checkpoint)
  restore = checkpointing.ValueRestore(
      checkpoint, reader, checkpointing.variable_keys(reader))
  restore.attach(impl)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _, outputs, _ = test_bert.build_pretraining(
      mesh, bert.BertConfig.from_dict(CONFIG), mesh_shape, layout,
      is_training=False)
  lowering = mtf.Lowering(graph, {mesh: impl})
  values = {k: np.asarray(lowering.export_to_tf_tensor(v))
            for k, v in outputs.items()}
  return values, restore.missing


def _numpy_outputs(weights, epsilon):
  want = numpy_bert.forward(weights, CONFIG, INPUTS["input_ids"],
                            INPUTS["input_mask"], INPUTS["token_type_ids"],
                            epsilon=epsilon)
  mlm_loss, _, mlm_logits = numpy_bert.masked_lm(
      weights, CONFIG, want["sequence_output"], INPUTS["positions"],
      INPUTS["label_ids"], INPUTS["label_weights"], epsilon=epsilon)
  nsp_loss, _, nsp_logits = numpy_bert.next_sentence(
      weights, want["pooled_output"], INPUTS["next_sentence_labels"])
  return {"sequence_output": want["sequence_output"],
          "pooled_output": want["pooled_output"], "mlm_logits": mlm_logits,
          "nsp_logits": nsp_logits, "mlm_loss": mlm_loss,
          "nsp_loss": nsp_loss}


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("batch:2;model:4", LAYOUT)])
def test_converted_checkpoint_gives_googles_outputs(google, mesh_shape,
                                                   layout):
  weights, _, converted = google
  got, missing = _run_restored(converted, mesh_shape, layout)
  assert not missing  # Every variable of the model came from Google's.
  vocab = CONFIG["vocab_size"]
  got["mlm_logits"] = got["mlm_logits"][..., :vocab]
  # With mtf's layer-norm epsilon the conversion is exact up to float32
  # round-off; with Google's (1e-12) it differs by ~1e-6 / (2 variance).
  for epsilon, tol in ((1e-6, 2e-5), (1e-12, 1e-4)):
    want = _numpy_outputs(weights, epsilon)
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
