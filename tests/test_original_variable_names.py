"""Variables are named as the original named them, default scopes included.

tests/data/original_default_scopes/ holds a checkpoint that the original
Mesh TensorFlow (0.1.21 on TF 2.15) wrote of a tiny BERT with biases and a
stack of unnamed dense layers, with the outputs it computed
(tools/make_original_default_scopes_fixture.py regenerates it). The
original's
`dense` without a name opens two default scopes: its kernel goes in
"dense/", its bias in "dense_1/", so the BERT pooler's bias is
"bert/pooler/dense_1/bias". The same program built here must restore
every variable of that checkpoint by name and compute the same outputs;
and a checkpoint with the names earlier versions of this project gave
(kernel and bias of one dense in one scope) must restore too.
"""

import os

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert import bert
from mesh_tensorflow.storage import checkpointing
from tests import mtf_testing

FIXTURE = os.path.join(os.path.dirname(__file__), "data",
                       "original_default_scopes")
CHECKPOINT = os.path.join(FIXTURE, "model.ckpt")
BATCH, SEQ, PREDICTIONS, D_STACK, HIDDEN = 2, 4, 2, 6, 5
CONFIG = dict(vocab_size=20, d_model=8, max_position_embeddings=8,
              num_blocks=1, attention_num_heads=2,
              feedforward_intermediate_size=16, type_vocab_size=2,
              layer_output_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, use_bias=True)
# Names this project gave before it followed the original's default
# scopes, for the variables whose names changed.
EARLIER_NAMES = {
    "bert/pooler/dense_1/bias": "bert/pooler/dense/bias",
    "cls/predictions/transform/dense_1/bias":
        "cls/predictions/transform/dense/bias",
    "dense_1/bias": "dense/bias",
    "dense_2/kernel": "dense_1/kernel",
    "dense_4/kernel": "dense_2/kernel",
    "dense_5/bias": "dense_2/bias",
}


def _expected():
  with np.load(os.path.join(FIXTURE, "expected.npz")) as data:
    return {k: data[k] for k in data.files}


EXPECTED = _expected()


def _build(mesh):
  """The fixture's program (see the tool): {name: mtf Tensor}."""
  batch = mtf.Dimension("batch", BATCH)
  seq = mtf.Dimension("seq", SEQ)
  predictions = mtf.Dimension("masked_lm_positions", PREDICTIONS)

  def imp(name, dims):
    return mtf_testing.import_array(mesh, EXPECTED["input/" + name], dims)

  model = bert.BertModel(
      bert.BertConfig(**CONFIG), False, imp("input_ids", [batch, seq]),
      input_mask=imp("input_mask", [batch, seq]),
      token_type_ids=imp("token_type_ids", [batch, seq]))
  mlm_loss, _, mlm_logits = model.get_masked_lm_output(
      imp("positions", [batch, predictions]),
      imp("label_ids", [batch, predictions]),
      imp("label_weights", [batch, predictions]))
  nsp_loss, _, nsp_logits = model.get_next_sentence_output(
      imp("next_sentence_labels", [batch]))
  x = imp("stack_input", [batch, mtf.Dimension("d", D_STACK)])
  hidden = mtf.Dimension("hidden", HIDDEN)
  y = mtf.layers.dense(x, hidden, reduced_dims=x.shape.dims[-1:],
                       activation=mtf.tanh)
  y = mtf.layers.dense(y, x.shape.dims[-1], reduced_dims=[hidden],
                       use_bias=False)
  y = mtf.layers.dense(y, hidden, reduced_dims=x.shape.dims[-1:])
  return {"sequence_output": model.get_sequence_output(),
          "pooled_output": model.get_pooled_output(),
          "mlm_loss": mlm_loss, "mlm_logits": mlm_logits,
          "nsp_loss": nsp_loss, "nsp_logits": nsp_logits,
          "stack_output": y}


def _run_restored(checkpoint):
  """The program with its variables filled from `checkpoint` by name, on a
  2-D mesh: (outputs, variable names, the ValueRestore)."""
  mesh_shape, layout = "a:2;b:2", "batch:a,vocab:b,intermediate:b"
  impl = mtf_testing.make_impl("eager", mesh_shape, layout)
  reader = tf.train.load_checkpoint(checkpoint)
  restore = checkpointing.ValueRestore(checkpoint, reader,
                                       checkpointing.variable_keys(reader))
  restore.attach(impl)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = _build(mesh)
  lowering = mtf.Lowering(graph, {mesh: impl})
  got = {k: np.asarray(lowering.export_to_tf_tensor(v))
         for k, v in outputs.items()}
  return got, [v.name for v in graph.all_variables], restore


def _assert_outputs_match(got):
  for name, value in got.items():
    np.testing.assert_allclose(value, EXPECTED["output/" + name],
                               rtol=1e-5, atol=1e-5, err_msg=name)


def _names_of(build):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [mtf.Dimension("batch", 2), mtf.Dimension("d", 4)])
  build(mesh, x)
  return [v.name for v in graph.all_variables]


def _dense_calls(mesh, x):
  """Unnamed dense layers beside other scopes (the original's names are
  in DEFAULT_NAMES)."""
  f = mtf.Dimension("f", 3)
  dense = mtf.layers.dense
  d = x.shape.dims[-1:]
  dense(x, f, reduced_dims=d, use_bias=False)
  dense(x, f, reduced_dims=d)
  mtf.layers.get_dense_kernel_weights(x, [f], d, [], None)
  dense(x, f, reduced_dims=d, kernel_weights=mtf.zeros(mesh, d + [f]))
  for _ in range(2):  # Re-entered: TF1 forgot the default names inside.
    with tf.compat.v1.variable_scope("a"):
      dense(x, f, reduced_dims=d)
  with tf.compat.v1.variable_scope("dense_7"):
    pass
  dense(x, f, reduced_dims=d)


# What the original (0.1.21, TF 2.15 graph mode) named _dense_calls'.
DEFAULT_NAMES = [
    "dense/kernel", "dense_2/kernel", "dense_3/bias", "dense_4/kernel",
    "dense_5/bias", "a/dense/kernel", "a/dense_1/bias", "dense_6/kernel",
    "dense_8/bias"]


def test_default_scope_names_are_the_originals():
  assert _names_of(_dense_calls) == DEFAULT_NAMES


def test_a_retraced_function_names_variables_alike():
  names = []

  @tf.function
  def trace(x):
    names.append(_names_of(_dense_calls))
    return x

  trace(tf.constant(1))
  trace(tf.constant(1.0))  # A second trace.
  assert names == [DEFAULT_NAMES, DEFAULT_NAMES]
  assert _names_of(_dense_calls) == DEFAULT_NAMES  # and eagerly


def test_the_originals_checkpoint_restores_by_name():
  keys = tf.train.load_checkpoint(CHECKPOINT).get_variable_to_shape_map()
  got, names, restore = _run_restored(CHECKPOINT)
  assert sorted(names) == sorted(keys)
  assert restore.missing == []
  assert sorted(restore.restored) == sorted(keys)
  _assert_outputs_match(got)


def test_a_checkpoint_with_earlier_names_restores(tmp_path):
  reader = tf.train.load_checkpoint(CHECKPOINT)
  prefix = str(tmp_path / "earlier.ckpt")
  with tf.Graph().as_default():
    for key in reader.get_variable_to_shape_map():
      tf.compat.v1.get_variable(EARLIER_NAMES.get(key, key),
                                initializer=tf.constant(reader.get_tensor(key)))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(session, prefix,
                                      write_meta_graph=False)
  got, _, restore = _run_restored(prefix)
  assert restore.missing == []
  _assert_outputs_match(got)
