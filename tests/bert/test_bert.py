"""Tests of mesh_tensorflow.bert.bert: configs, variable names, layouts, and
the forward pass against a float64 NumPy BERT (tests/bert/numpy_bert.py).

The layout tests run the pretraining losses (masked LM + next sentence, +
the MoE balance loss) and their gradients with respect to every variable
under one processor, `batch:8`, `model:8` and `batch:2;model:4` with the
binaries' default layout rules, for the tiny config, an MoE config and a
relative-attention config. Dropout probabilities are 0 in these configs.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.storage import checkpointing
from mesh_tensorflow.bert import bert
from tests import mtf_testing
from tests.bert import generated_data
from tests.bert import numpy_bert

BATCH, SEQ, PREDICTIONS = 8, 16, 4
LAYOUT = ("batch:batch,vocab:model,intermediate:model,num_heads:model,"
          "experts:batch")
CONFIG_DIR = os.path.join(os.path.dirname(bert.__file__), "config")

CONFIGS = {
    "tiny": generated_data.tiny_config(),
    # Gating groups of 16 tokens: 8 groups under every layout, so the
    # routing is the same everywhere.
    "moe": generated_data.tiny_config(
        block_layers="attention,moe", moe_num_experts=8,
        moe_intermediate_size=16, moe_group_size=16,
        residual_structure="direct", use_bias=False),
    "relative": generated_data.tiny_config(
        position_signal="relative_attention_bias"),
}


def _inputs():
  rng = np.random.RandomState(0)
  vocab = generated_data.tiny_config()["vocab_size"]
  input_ids = rng.randint(5, vocab, (BATCH, SEQ)).astype(np.int32)
  input_mask = np.ones((BATCH, SEQ), np.int32)
  lengths = rng.randint(SEQ // 2, SEQ + 1, BATCH)
  for i, n in enumerate(lengths):
    input_mask[i, n:] = 0
    input_ids[i, n:] = 0
  token_type_ids = (np.arange(SEQ)[None] >= lengths[:, None] // 2).astype(
      np.int32) * input_mask
  positions = np.stack([rng.choice(n, PREDICTIONS, replace=False)
                        for n in lengths]).astype(np.int32)
  label_ids = rng.randint(5, vocab, (BATCH, PREDICTIONS)).astype(np.int32)
  label_weights = np.ones((BATCH, PREDICTIONS), np.float32)
  label_weights[::3, -1] = 0.0
  next_sentence_labels = rng.randint(0, 2, BATCH).astype(np.int32)
  return dict(input_ids=input_ids, input_mask=input_mask,
              token_type_ids=token_type_ids, positions=positions,
              label_ids=label_ids, label_weights=label_weights,
              next_sentence_labels=next_sentence_labels)


INPUTS = _inputs()


def build_pretraining(mesh, config, mesh_shape, layout, is_training=True,
                      inputs=None):
  """BertModel and both pretraining heads on INPUTS: (model, outputs,
  total loss)."""
  inputs = INPUTS if inputs is None else inputs
  batch = mtf.Dimension("batch", BATCH)
  seq = mtf.Dimension("seq", SEQ)
  predictions = mtf.Dimension("masked_lm_positions", PREDICTIONS)

  def imp(name, dims):
    return mtf_testing.import_array(mesh, inputs[name], dims)

  model = bert.BertModel(
      config, is_training, imp("input_ids", [batch, seq]),
      input_mask=imp("input_mask", [batch, seq]),
      token_type_ids=imp("token_type_ids", [batch, seq]),
      mesh_shape=mesh_shape, layout=layout)
  mlm_loss, _, mlm_logits = model.get_masked_lm_output(
      imp("positions", [batch, predictions]),
      imp("label_ids", [batch, predictions]),
      imp("label_weights", [batch, predictions]))
  nsp_loss, _, nsp_logits = model.get_next_sentence_output(
      imp("next_sentence_labels", [batch]))
  total = mlm_loss + nsp_loss + model.get_extra_loss()
  outputs = {"loss": total, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
             "mlm_logits": mlm_logits, "nsp_logits": nsp_logits,
             "sequence_output": model.get_sequence_output(),
             "pooled_output": model.get_pooled_output()}
  return model, outputs, total


def run_pretraining(config_name, mesh_shape, layout, mode):
  """Outputs, variables and gradients ("d_<variable name>") as NumPy."""
  config = bert.BertConfig.from_dict(CONFIGS[config_name])

  def build(mesh):
    _, outputs, loss = build_pretraining(mesh, config, mesh_shape, layout)
    wrt = {v.name: v.outputs[0] for v in mesh.graph.trainable_variables}
    return outputs, loss, wrt

  results, _ = mtf_testing.run_program(mesh_shape, layout, mode, build)
  return results


def reference(shared_result, config_name):
  return shared_result(
      f"bert_reference_{config_name}",
      lambda: run_pretraining(config_name, "all:1", "", "eager"))


def run_restored(config, checkpoint, mesh_shape, layout):
  """BertModel and both heads with their variables filled from
  `checkpoint` by the checkpointing module (as the estimator's warm start
  does), run eagerly: (outputs as NumPy, variables not restored)."""
  impl = mtf_testing.make_impl("eager", mesh_shape, layout)
  reader = tf.train.load_checkpoint(checkpoint)
  restore = checkpointing.ValueRestore(
      checkpoint, reader, checkpointing.variable_keys(reader))
  restore.attach(impl)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _, outputs, _ = build_pretraining(
      mesh, bert.BertConfig.from_dict(config), mesh_shape, layout,
      is_training=False)
  lowering = mtf.Lowering(graph, {mesh: impl})
  values = {k: np.asarray(lowering.export_to_tf_tensor(v))
            for k, v in outputs.items()}
  return values, restore.missing


def save_with_tf1_saver(weights, prefix):
  """A name-based checkpoint of {name: array} written by a TF1 Saver."""
  with tf.Graph().as_default():
    for name, value in weights.items():
      tf.compat.v1.get_variable(name, initializer=tf.constant(value))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(sess, prefix, write_meta_graph=False)
  return prefix


def numpy_pretraining(weights, config, epsilon):
  """numpy_bert's outputs of the pretraining model on INPUTS."""
  want = numpy_bert.forward(weights, config, INPUTS["input_ids"],
                            INPUTS["input_mask"], INPUTS["token_type_ids"],
                            epsilon=epsilon)
  mlm_loss, _, mlm_logits = numpy_bert.masked_lm(
      weights, config, want["sequence_output"], INPUTS["positions"],
      INPUTS["label_ids"], INPUTS["label_weights"], epsilon=epsilon)
  nsp_loss, _, nsp_logits = numpy_bert.next_sentence(
      weights, want["pooled_output"], INPUTS["next_sentence_labels"])
  return {"sequence_output": want["sequence_output"],
          "pooled_output": want["pooled_output"], "mlm_logits": mlm_logits,
          "nsp_logits": nsp_logits, "mlm_loss": mlm_loss,
          "nsp_loss": nsp_loss}


def graph_of(config, is_training=False, mesh_shape="all:1", layout=""):
  """An mtf Graph of BertModel and both heads (not lowered): (graph,
  model)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  model, _, _ = build_pretraining(mesh, config, mesh_shape, layout,
                                  is_training=is_training)
  return graph, model


def _variable_names(config):
  graph, _ = graph_of(config)
  return [v.name for v in graph.trainable_variables]


def test_variable_names_of_a_tiny_model():
  names = _variable_names(bert.BertConfig.from_dict(CONFIGS["tiny"]))
  block = ["attention/query/kernel", "attention/query/bias",
           "attention/key/kernel", "attention/key/bias",
           "attention/value/kernel", "attention/value/bias",
           "attention/output/kernel", "attention/output/bias",
           "attention/layer_norm/scale", "attention/layer_norm/bias",
           "feedforward/dense_1/kernel", "feedforward/dense_1/bias",
           "feedforward/dense_2/kernel", "feedforward/dense_2/bias",
           "feedforward/layer_norm/scale", "feedforward/layer_norm/bias"]
  assert names == (
      ["bert/embeddings/word_embeddings",
       "bert/embeddings/token_type_embeddings",
       "bert/embeddings/position_embeddings",
       "bert/embeddings/layer_norm/scale",
       "bert/embeddings/layer_norm/bias"]
      + [f"bert/encoder/block_{i}/{n}" for i in range(2) for n in block]
      + ["bert/pooler/dense/kernel", "bert/pooler/dense_1/bias",
         "cls/predictions/transform/dense/kernel",
         "cls/predictions/transform/dense_1/bias",
         "cls/predictions/transform/layer_norm/scale",
         "cls/predictions/transform/layer_norm/bias",
         "cls/predictions/output_bias",
         "cls/seq_relationship/kernel", "cls/seq_relationship/bias"])


def test_variable_shapes_pad_the_vocabulary_to_128():
  graph, model = graph_of(bert.BertConfig.from_dict(
      generated_data.tiny_config(vocab_size=130)))
  shapes = {v.name: v.shape for v in graph.trainable_variables}
  assert model.vocab_dim.size == 256
  assert shapes["bert/embeddings/word_embeddings"].to_integer_list == [
      256, 32]
  assert shapes["bert/encoder/block_0/attention/query/kernel"] == mtf.Shape(
      [model.model_dim, model.num_heads_dim, model.size_per_head_dim])
  assert shapes["cls/seq_relationship/kernel"].to_integer_list == [32, 2]


def test_variable_names_of_moe_relative_direct_and_no_bias():
  moe_names = _variable_names(bert.BertConfig.from_dict(CONFIGS["moe"]))
  assert "bert/encoder/relative_attention_bias" not in moe_names
  assert not [n for n in moe_names if n.endswith("/bias")]
  assert [n for n in moe_names if n.startswith("bert/encoder/block_0/moe/")]
  # "direct": layer norms on layer inputs, one more after the last block.
  assert "bert/layer_norm/scale" in moe_names
  assert "bert/encoder/block_1/moe/layer_norm/scale" in moe_names
  relative = _variable_names(bert.BertConfig.from_dict(CONFIGS["relative"]))
  assert "bert/encoder/relative_attention_bias" in relative
  assert "bert/embeddings/position_embeddings" not in relative
  twice = _variable_names(bert.BertConfig.from_dict(
      generated_data.tiny_config(
          block_layers="attention,feedforward,attention",
          num_hidden_layers=1)))
  assert "bert/encoder/block_0/attention_1/query/kernel" in twice


def test_config_from_dict_maps_googles_keys():
  config = bert.BertConfig.from_dict(generated_data.tiny_config(
      hidden_dropout_prob=0.25, hidden_act="relu"))
  assert (config.d_model, config.num_blocks, config.attention_num_heads,
          config.feedforward_intermediate_size,
          config.feedforward_intermediate_act,
          config.layer_output_dropout_prob) == (32, 2, 8, 64, "relu", 0.25)
  assert config.block_layers == ["attention", "feedforward"]
  again = bert.BertConfig.from_dict(
      {k: v for k, v in config.to_dict().items()})
  assert again.to_json_string() == config.to_json_string()
  with pytest.raises(ValueError, match="position_signal"):
    bert.BertConfig.from_dict({"vocab_size": 5, "position_signal": "sine"})
  with pytest.raises(ValueError, match="block_layers"):
    bert.BertConfig(5, block_layers="attention,conv")


def _small_structure(config):
  """`config`'s structure at a test size."""
  config.vocab_size = generated_data.tiny_config()["vocab_size"]
  config.d_model, config.num_blocks = 32, 1
  config.attention_num_heads = 8
  if config.attention_head_size:
    config.attention_head_size = 4
  config.feedforward_intermediate_size = 64
  config.moe_num_experts, config.moe_intermediate_size = 8, 16
  config.moe_group_size = 16
  config.max_position_embeddings = 64
  return config


def test_the_original_config_files_parse_and_build():
  files = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.json")))
  assert [os.path.basename(f)[:-5] for f in files] == [
      "base", "base_renamed", "base_v2", "base_v2_relu", "default_init",
      "direct", "intermediate_dropout", "large", "large_v2", "moe",
      "no_bias", "relative", "xl_v2", "xxl_v2"]
  configs = {os.path.basename(f)[:-5]: bert.BertConfig.from_json_file(f)
             for f in files}
  base = configs["base"]
  assert (base.vocab_size, base.d_model, base.num_blocks,
          base.attention_num_heads, base.feedforward_intermediate_size,
          base.type_vocab_size) == (30522, 768, 12, 12, 3072, 2)
  assert configs["large"].d_model == 1024
  assert configs["xxl_v2"].d_model == 4096
  assert configs["moe"].block_layers == [
      "attention", "feedforward", "attention", "moe", "attention",
      "feedforward"]
  assert configs["relative"].position_signal == "relative_attention_bias"
  assert configs["base_v2"].residual_structure == "direct"
  assert configs["no_bias"].use_bias is False
  assert configs["default_init"].initializer_range is None
  for name, config in configs.items():
    graph, _ = graph_of(_small_structure(config), is_training=True)
    names = [v.name for v in graph.trainable_variables]
    assert ("bert/encoder/block_0/moe/wi/kernel" in names) == (
        name == "moe"), name


def test_get_activation():
  assert bert.get_activation("gelu") is mtf.gelu
  assert bert.get_activation("ReLU") is mtf.relu
  assert bert.get_activation("linear") is None
  assert bert.get_activation("") is None
  assert bert.get_activation(mtf.tanh) is mtf.tanh
  with pytest.raises(ValueError, match="swish"):
    bert.get_activation("swish")


def test_get_assignment_map_from_checkpoint(tmp_path):
  prefix = str(tmp_path / "model.ckpt")
  with tf.Graph().as_default():
    tf.compat.v1.get_variable("bert/pooler/dense/kernel", [2, 2])
    tf.compat.v1.get_variable("bert/pooler/dense/kernel/adam_m", [2, 2])
    tf.compat.v1.get_variable("only_in_checkpoint", [1])
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(sess, prefix)

  class Var:

    def __init__(self, name):
      self.name = name

  tvars = [Var("bert/pooler/dense/kernel:0"),
           Var("bert/pooler/dense/kernel/adam_m:0"), Var("new:0")]
  assignment_map, initialized = bert.get_assignment_map_from_checkpoint(
      tvars, prefix)
  assert dict(assignment_map) == {
      "bert/pooler/dense/kernel": "bert/pooler/dense/kernel"}
  assert initialized == {"bert/pooler/dense/kernel": 1,
                         "bert/pooler/dense/kernel:0": 1}


def test_relative_position_buckets():
  positions = np.arange(-200, 201, dtype=np.int32)

  def build(mesh):
    rel = mtf_testing.import_array(mesh, positions,
                                   [mtf.Dimension("pos", positions.size)])
    # pylint: disable=protected-access
    return {"bucket": bert.relative_position_bucket(rel)}, None, {}

  results, _ = mtf_testing.run_program("all:1", "", "eager", build,
                                       fetch_variables=False)
  want = numpy_bert.relative_position_bucket(positions)
  np.testing.assert_array_equal(results["bucket"], want)
  assert want.min() == 0 and want.max() == 31


def test_tiny_model_matches_numpy_bert(shared_result):
  """The one-processor run against Google's BERT in float64 NumPy (with
  mtf's layer-norm epsilon)."""
  results = reference(shared_result, "tiny")
  config = CONFIGS["tiny"]
  want = numpy_pretraining(numpy_bert.from_mtf(results, config), config,
                           epsilon=1e-6)
  for key, value in want.items():
    np.testing.assert_allclose(results[key], value, rtol=1e-4, atol=1e-5,
                               err_msg=key)


def test_relative_attention_matches_numpy_bert(shared_result, tmp_path):
  """The relative-attention model, its (zero-initialized) bias made random
  and restored from a checkpoint, against NumPy."""
  results = reference(shared_result, "relative")
  config = CONFIGS["relative"]
  weights = {k: v for k, v in results.items()
             if "/" in k and not k.startswith("d_")}
  weights["bert/encoder/relative_attention_bias"] = np.random.RandomState(
      0).normal(0.0, 2.0, [8, 32]).astype(np.float32)
  prefix = save_with_tf1_saver(weights, str(tmp_path / "model.ckpt"))
  got, missing = run_restored(config, prefix, "all:1", "")
  assert not missing
  want = numpy_pretraining(numpy_bert.from_mtf(weights, config), config,
                           epsilon=1e-6)
  # The bias matters: it moves the outputs ~100 times the tolerance.
  assert np.abs(got["sequence_output"]
                - results["sequence_output"]).max() > 0.01
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5,
                               err_msg=key)


_LAYOUT_CASES = [("batch8", "batch:8", "eager"),
                 ("model8", "model:8", "eager"),
                 ("2d", "batch:2;model:4", "eager")]


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("mesh_shape,mode", [
    pytest.param(m, mode, id=f"{case}-{mode}")
    for case, m, mode in _LAYOUT_CASES])
def test_losses_and_gradients_are_the_same_under_every_layout(
    shared_result, config_name, mesh_shape, mode):
  _check_against_reference(shared_result, config_name, mesh_shape, mode)


@pytest.mark.parametrize("config_name,mode", [
    ("tiny", mtf_testing.V1_SHAPES_MODE), ("tiny", "simd")])
def test_losses_and_gradients_in_graph_v1_and_simd(shared_result,
                                                   config_name, mode):
  _check_against_reference(shared_result, config_name, "batch:2;model:4",
                           mode)


def _check_against_reference(shared_result, config_name, mesh_shape, mode):
  want = reference(shared_result, config_name)
  got = run_pretraining(config_name, mesh_shape, LAYOUT, mode)
  where = f"[{config_name}, {mesh_shape}, {mode}]"
  assert sorted(got) == sorted(want)
  assert np.isfinite(want["loss"])
  if config_name == "moe":
    assert want["loss"] > want["mlm_loss"] + want["nsp_loss"]  # + balance.
  for key in sorted(want):
    np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=2e-6,
                               err_msg=f"{where} {key}")


def test_dropout_is_applied_and_layout_invariant():
  """Training with dropout (attention dropout included, which the original
  never applied) changes the outputs, identically under every layout."""
  config = bert.BertConfig.from_dict(generated_data.tiny_config(
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5,
      initializer_range=0.2))
  runs = {}
  for mesh_shape, is_training in (("all:1", False), ("all:1", True),
                                  ("batch:2;model:4", True)):
    def build(mesh, mesh_shape=mesh_shape, is_training=is_training):
      _, outputs, _ = build_pretraining(
          mesh, config, mesh_shape, LAYOUT, is_training=is_training)
      return {k: outputs[k] for k in ("loss", "sequence_output")}, None, {}

    runs[(mesh_shape, is_training)], _ = mtf_testing.run_program(
        mesh_shape, LAYOUT, "eager", build, fetch_variables=False)
  dropped = runs[("all:1", True)]
  assert np.abs(dropped["sequence_output"] - runs[("all:1", False)][
      "sequence_output"]).max() > 0.1
  for key in ("loss", "sequence_output"):
    np.testing.assert_allclose(runs[("batch:2;model:4", True)][key],
                               dropped[key], rtol=1e-4, atol=1e-5)
