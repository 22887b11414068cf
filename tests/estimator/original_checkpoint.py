"""A checkpoint in the original library's format, and a model that reads it.

The original saved TF1 name-based checkpoints (`tf.compat.v1.train.Saver`):
one key per mtf variable, its mtf name, holding the whole value in its
master dtype, plus an int64 "global_step". `write` makes one from known
values; `model_fn` builds an mtf model with variables of those names
(through `tf.compat.v1.variable_scope` + `mtf.get_variable`, Adafactor
slots included) whose predictions NumPy computes from the same values.
"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator

BATCH, LENGTH, VOCAB, D_MODEL, D_KV = 8, 4, 16, 8, 4
STEP = 1234
EMBEDDING = "shared/embedding"
Q = "encoder/block_000/layer_000/SelfAttention/q"
SCALE = "encoder/final_layer_norm/scale"
LAYOUT_2D = "batch:b;vocab:m;d_kv:m"

_RNG = np.random.RandomState(7)
# Multiples of 1/8 below 2: exact in bfloat16.
VALUES = {
    EMBEDDING: (_RNG.randint(-12, 13, (VOCAB, D_MODEL)) / 8.0),
    Q: (_RNG.randint(-12, 13, (D_MODEL, D_KV)) / 8.0),
    # Adafactor's factored second moments of both, kept in float32.
    EMBEDDING + "_slot_vr": _RNG.uniform(0.5, 1.5, (D_MODEL,)),
    EMBEDDING + "_slot_vc": _RNG.uniform(0.5, 1.5, (VOCAB,)),
    Q + "_slot_vr": _RNG.uniform(0.5, 1.5, (D_KV,)),
    Q + "_slot_vc": _RNG.uniform(0.5, 1.5, (D_MODEL,)),
    # Only in the checkpoint: ignored.
    "decoder/logits/kernel": _RNG.randn(D_MODEL, VOCAB),
}
# Stored dtypes: the embedding and q as the original's bfloat16 masters.
DTYPES = {EMBEDDING: tf.bfloat16, Q: tf.bfloat16}
IDS = _RNG.randint(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
LABELS = _RNG.randn(BATCH, LENGTH, D_KV).astype(np.float32)
# Not in the checkpoint, so they keep their initial values (scale: ones).
MISSING = [SCALE, SCALE + "_slot_v"]


def stored(name):
  """VALUES[name] as the checkpoint holds it (NumPy)."""
  if DTYPES.get(name) == tf.bfloat16:
    return VALUES[name].astype(tf.bfloat16.as_numpy_dtype)
  return VALUES[name].astype(np.float32)


def write(prefix, values=None, step=STEP):
  """Writes a name-based checkpoint `prefix`-`step` as the original did."""
  values = VALUES if values is None else values
  with tf.Graph().as_default():
    for name, value in values.items():
      tf.compat.v1.get_variable(
          name, initializer=tf.constant(value, DTYPES.get(name, tf.float32)))
    tf.compat.v1.get_variable(
        "global_step", initializer=tf.constant(step, tf.int64),
        trainable=False)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return saver.save(session, prefix, global_step=step)


def numpy_predictions():
  """The model's output for IDS computed with the checkpoint's values."""
  embedding = VALUES[EMBEDDING].astype(np.float32)
  return embedding[IDS] @ VALUES[Q].astype(np.float32)  # scale is 1


def model_fn(features, labels, mode, params):
  """Embedding lookup, times a scale, times q; Adafactor on squared error.

  The embedding's master is bfloat16 (as the original's), q's float32 (so
  the stored bfloat16 is cast). params["impls"], if given, collects the
  mesh implementations the estimator made; params["sharding"] ("none",
  "update" or "parameters") asks for data-parallel sharding.
  """
  params.get("impls", []).append(params["mesh_impl"])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  if params.get("sharding", "none") != "none":
    impl = params["mesh_impl"]
    mtf.shard_data_parallel(
        mesh, impl.shape, impl.layout_rules,
        shard_parameters=(params["sharding"] == "parameters"))
  batch = mtf.Dimension("batch", BATCH)
  length = mtf.Dimension("length", LENGTH)
  vocab = mtf.Dimension("vocab", VOCAB)
  d_model = mtf.Dimension("d_model", D_MODEL)
  d_kv = mtf.Dimension("d_kv", D_KV)
  bfloat16 = mtf.VariableDType(master_dtype=tf.bfloat16,
                               slice_dtype=tf.float32,
                               activation_dtype=tf.float32)
  with tf.compat.v1.variable_scope("shared"):
    embedding = mtf.get_variable(mesh, "embedding", [vocab, d_model],
                                 dtype=bfloat16)
  with tf.compat.v1.variable_scope("encoder"):
    with tf.compat.v1.variable_scope("block_000"):
      with tf.compat.v1.variable_scope("layer_000"):
        with tf.compat.v1.variable_scope("SelfAttention"):
          q = mtf.get_variable(mesh, "q", [d_model, d_kv])
    with tf.compat.v1.variable_scope("final_layer_norm"):
      scale = mtf.get_variable(mesh, "scale", [d_model],
                               initializer=tf.compat.v1.ones_initializer())
  ids = mtf.import_tf_tensor(mesh, features["ids"], [batch, length])
  x = mtf.gather(embedding, ids, vocab) * scale
  y = mtf.einsum([x, q], output_shape=[batch, length, d_kv])
  if mode == estimator.ModeKeys.PREDICT:
    lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
    return estimator.EstimatorSpec(
        mode, predictions={"y": lowering.export_to_tf_tensor(y)})
  target = mtf.import_tf_tensor(mesh, labels, [batch, length, d_kv])
  loss = mtf.reduce_mean(mtf.square(y - target))
  updates = []
  if mode == estimator.ModeKeys.TRAIN:
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    optimizer = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=2)
    updates = optimizer.apply_grads(grads, variables)
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  return estimator.EstimatorSpec(
      mode, loss=lowering.export_to_tf_tensor(loss),
      train_op=tf.group([lowering.lowered_operation(u) for u in updates]))


def input_fn():
  return tf.data.Dataset.from_tensors(({"ids": IDS}, LABELS)).repeat()


def predict_input_fn():
  return tf.data.Dataset.from_tensors({"ids": IDS})
