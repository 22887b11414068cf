"""Writes tests/data/original_default_scopes/ with the original library.

The fixture is a checkpoint the original library's own code wrote, to check
that this project names its variables as the original did, default scopes
included (`dense` without a name puts its kernel in "dense/" and its bias
in "dense_1/"): a tiny BERT with biases (the original's
mesh_tensorflow/bert/bert.py, pretraining heads included) and a stack of
unnamed `mtf.layers.dense` layers, built in one mtf graph, lowered on one
processor, run once and saved with `tf.compat.v1.train.Saver` of the
master variables, as the original's binaries saved. Beside it,
expected.npz holds the inputs and the outputs the original computed.
tests/test_original_variable_names.py restores it by name and compares.

Run it with the original, not this project: in a scratch virtual
environment outside this repository, e.g.

  python3.11 -m venv /tmp/orig
  /tmp/orig/bin/pip install tensorflow-cpu==2.15.1 mesh-tensorflow==0.1.21
  /tmp/orig/bin/python tools/make_original_default_scopes_fixture.py \
      tests/data/original_default_scopes

The variables' initial values are random (seeded), so a rerun may write
other numbers; the test reads whatever the fixture holds.
"""

import os
import sys
import types

import numpy as np
import tensorflow.compat.v1 as tf
from tensorflow.python.framework import ops as tf_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import tensor_conversion_registry  # pylint: disable=g-direct-tensorflow-import

# mesh-tensorflow 0.1.21 registers a conversion function through an alias
# that TF 2.15 no longer has.
if not hasattr(tf_ops, "register_tensor_conversion_function"):
  tf_ops.register_tensor_conversion_function = (
      tensor_conversion_registry.register_tensor_conversion_function)

# bert.py imports the Transformer package (for its mixture of experts),
# whose dataset module imports tensorflow_datasets at the top; nothing here
# uses it.
if "tensorflow_datasets" not in sys.modules:
  try:
    import tensorflow_datasets  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    sys.modules["tensorflow_datasets"] = types.ModuleType("tensorflow_datasets")

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow.bert import bert  # pylint: disable=g-import-not-at-top

BATCH, SEQ, PREDICTIONS, D_MODEL, D_STACK = 2, 4, 2, 8, 6
CONFIG = dict(vocab_size=20, d_model=D_MODEL, max_position_embeddings=8,
              num_blocks=1, attention_num_heads=2,
              feedforward_intermediate_size=16, type_vocab_size=2,
              layer_output_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, use_bias=True)


def inputs():
  """The fixed inputs of the BERT and of the dense stack."""
  rng = np.random.RandomState(0)
  return {
      "input_ids": rng.randint(1, CONFIG["vocab_size"],
                               (BATCH, SEQ)).astype(np.int32),
      "input_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.int32),
      "token_type_ids": np.array([[0, 0, 1, 1], [0, 1, 1, 0]], np.int32),
      "positions": np.array([[1, 2], [0, 2]], np.int32),
      "label_ids": np.array([[3, 4], [5, 6]], np.int32),
      "label_weights": np.array([[1, 1], [1, 0]], np.float32),
      "next_sentence_labels": np.array([0, 1], np.int32),
      "stack_input": rng.randn(BATCH, D_STACK).astype(np.float32),
  }


def dense_stack(x, hidden):
  """Three unnamed dense layers: with bias, without, with."""
  y = mtf.layers.dense(x, hidden, reduced_dims=x.shape.dims[-1:],
                       activation=mtf.tanh)
  y = mtf.layers.dense(y, x.shape.dims[-1], reduced_dims=[hidden],
                       use_bias=False)
  return mtf.layers.dense(y, hidden, reduced_dims=x.shape.dims[-1:])


def build(mesh, values):
  """The model's outputs: {name: mtf Tensor}."""
  batch = mtf.Dimension("batch", BATCH)
  seq = mtf.Dimension("seq", SEQ)
  predictions = mtf.Dimension("masked_lm_positions", PREDICTIONS)

  def imp(name, dims):
    return mtf.import_tf_tensor(mesh, tf.constant(values[name]),
                                mtf.Shape(dims))

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
  stack = dense_stack(imp("stack_input", [batch, mtf.Dimension("d", D_STACK)]),
                      mtf.Dimension("hidden", 5))
  return {"sequence_output": model.get_sequence_output(),
          "pooled_output": model.get_pooled_output(),
          "mlm_loss": mlm_loss, "mlm_logits": mlm_logits,
          "nsp_loss": nsp_loss, "nsp_logits": nsp_logits,
          "stack_output": stack}


def main(out_dir):
  os.makedirs(out_dir, exist_ok=True)
  values = inputs()
  with tf.Graph().as_default():
    tf.set_random_seed(1)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs = build(mesh, values)
    # Small nonzero biases and layer-norm offsets, so that a bias restored
    # into the wrong variable changes the outputs.
    rng = np.random.RandomState(2)
    assigns = [
        mtf.assign(v, mtf.import_tf_tensor(mesh, tf.constant(rng.uniform(
            -0.5, 0.5, v.shape.to_integer_list).astype(np.float32)), v.shape))
        for v in graph.trainable_variables if v.name.endswith("bias")]
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mtf.convert_to_shape(""), mtf.convert_to_layout_rules(""), [""])
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_outputs = {k: lowering.export_to_tf_tensor(v)
                  for k, v in outputs.items()}
    assign_ops = [lowering.lowered_operation(a) for a in assigns]
    saver = tf.train.Saver(
        tf.global_variables(), sharded=False, save_relative_paths=True)
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      session.run(lowering.variables_initializer_op() if hasattr(
          lowering, "variables_initializer_op") else tf.no_op())
      session.run(assign_ops)
      got = session.run(tf_outputs)
      session.run(lowering.copy_slices_to_masters())
      saver.save(session, os.path.join(out_dir, "model.ckpt"),
                 write_meta_graph=False, write_state=False)
  np.savez(os.path.join(out_dir, "expected.npz"),
           **{"input/" + k: v for k, v in values.items()},
           **{"output/" + k: v for k, v in got.items()})
  for v in graph.all_variables:
    print(v.name, v.shape.to_integer_list)


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else
       "tests/data/original_default_scopes")
