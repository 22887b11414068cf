"""The Transformer binary reads a checkpoint of the original library.

The test writes, with plain `tf.compat.v1.train.Saver`, the name-based
checkpoint the original's binary would have written for a tiny
encoder-decoder (models/bi_base.gin + problems/addition.gin, 1 layer,
d_model 12, 2 heads of 4, d_ff 16, byte vocabulary padded to 384): every
variable under its original name, bfloat16 masters, Adafactor's factored
slots (`_slot_vr`/`_slot_vc`, `_slot_v` for the scales) and an int64
global_step of 1000. Then, through `transformer.main`:
- scoring (utils.run mode "score_from_strings") gives the log-likelihoods
  an independent NumPy forward pass computes from the same values, on one
  processor and on a 2-D mesh that splits heads, d_ff and vocab;
- greedy decoding (mode "infer") gives NumPy's argmax continuations;
- training warm-started from it (utils.run.init_checkpoint) resumes at step
  1000, and so does training in a model_dir holding it.
"""

import logging
import os
import shutil

from absl import flags
import gin
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.transformer import main as main_lib

FLAGS = flags.FLAGS
STEP = 1000
D_MODEL, D_FF, HEADS, D_KV, LENGTH = 12, 16, 2, 4, 8
VOCAB = 384  # 259 byte ids, padded to a multiple of 128.
GIN_FILES = ["models/bi_base.gin", "problems/addition.gin"]
TINY = [
    f"d_model = {D_MODEL}", f"d_ff = {D_FF}", f"num_heads = {HEADS}",
    f"d_kv = {D_KV}", "num_layers = 1", "dropout_rate = 0.0",
    f"Unitransformer.max_length = {LENGTH}",
    "max_digits = 2",
    "utils.get_variable_dtype.activation_dtype = 'float32'",
    "utils.serialize_num_microbatches.tokens_per_microbatch_per_replica = "
    "None",
    # Factored second moments for every matrix (the default factors only
    # dimensions of 128 and more).
    "AdafactorOptimizer.min_dim_size_to_factor = 8",
    "utils.run.batch_size = ('sequences_per_batch', 8)",
    "utils.run.iterations_per_loop = 3",
    "utils.run.save_checkpoints_steps = 3",
    "utils.run.learning_rate_schedule = 0.01",
]
MESHES = {
    "1proc": ["utils.run.mesh_shape = ''", "utils.run.layout_rules = ''"],
    "2d": ["utils.run.mesh_shape = 'batch:2;model:2'",
           "utils.run.layout_rules = 'batch:batch,d_ff:model,heads:model,"
           "vocab:model'"],
}
PRINTABLE = slice(ord("!") + 3, ord("~") + 4)
INPUTS = ["1+2", "30+4", "5+67"]
TARGETS = ["3", "34", "72"]


def _variable_shapes():
  """{original name: shape} of every variable the tiny model has."""
  shapes = {"shared/embedding": (VOCAB, D_MODEL),
            "shared/positional_embedding": (LENGTH, D_MODEL)}
  stacks = {"encoder": ["SelfAttention", "DenseReluDense"],
            "decoder": ["SelfAttention", "EncDecAttention", "DenseReluDense"]}
  for stack, layers in stacks.items():
    for i, layer in enumerate(layers):
      prefix = f"{stack}/block_000/layer_{i:03d}/"
      shapes[prefix + "rms_norm/scale"] = (D_MODEL,)
      if layer == "DenseReluDense":
        shapes[prefix + "DenseReluDense/wi/kernel"] = (D_MODEL, D_FF)
        shapes[prefix + "DenseReluDense/wo/kernel"] = (D_FF, D_MODEL)
      else:
        for w in "qkv":  # heads and d_kv combined into one dimension
          shapes[f"{prefix}{layer}/{w}"] = (D_MODEL, HEADS * D_KV)
        shapes[f"{prefix}{layer}/o"] = (HEADS * D_KV, D_MODEL)
    shapes[f"{stack}/rms_norm/scale"] = (D_MODEL,)
  return shapes


SHAPES = _variable_shapes()


def _values():
  """Known values: weights in multiples of 1/8 (exact in bfloat16); and
  Adafactor's slots: a matrix's row and column second moments (over its
  smaller and larger dimension), a vector's full one."""
  rng = np.random.RandomState(15)
  values = {}
  for name, shape in SHAPES.items():
    if name.endswith("scale"):
      values[name] = rng.randint(6, 11, shape) / 8.0
      values[name + "_slot_v"] = rng.uniform(0.5, 1.5, shape)
    else:
      bound = 12 if "embedding" in name else 8
      values[name] = rng.randint(-bound, bound + 1, shape) / 8.0
      values[name + "_slot_vr"] = rng.uniform(0.5, 1.5, (min(shape),))
      values[name + "_slot_vc"] = rng.uniform(0.5, 1.5, (max(shape),))
  # Only the printable ASCII bytes but space (ids 36 to 129) have nonzero
  # token embeddings, hence logits: greedy decoding yields them (the
  # largest of 94 random logits beats 0), one character per id.
  printable = np.zeros((VOCAB, 1))
  printable[PRINTABLE] = 1.0
  values["shared/embedding"] *= printable
  return values


VALUES = _values()


def write_original_checkpoint(directory):
  """Writes VALUES and global_step as the original's binary did (a
  name-based, sharded Saver with relative paths); returns the path."""
  with tf.Graph().as_default():
    for name, value in VALUES.items():
      dtype = tf.float32 if "_slot_" in name else tf.bfloat16
      tf.compat.v1.get_variable(name, initializer=tf.constant(value, dtype))
    tf.compat.v1.get_variable(
        "global_step", initializer=tf.constant(STEP, tf.int64),
        trainable=False)
    saver = tf.compat.v1.train.Saver(sharded=True, save_relative_paths=True)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return saver.save(session, os.path.join(str(directory), "model.ckpt"),
                        global_step=STEP)


def run_main(model_dir, *params):
  """Runs the binary's main in this process; returns what utils.run did."""
  argv = ["main", f"--model_dir={model_dir}", "--noprogress"]
  argv += [f"--gin_file={f}" for f in GIN_FILES]
  argv += [f"--gin_param={p}" for p in TINY + list(params)]
  FLAGS.unparse_flags()
  argv = FLAGS(argv)
  gin.clear_config()
  try:
    return main_lib.main(argv)
  finally:
    gin.clear_config()
    FLAGS.unparse_flags()


def read_checkpoint(model_dir):
  """{key: value} of the latest checkpoint (the original's names)."""
  reader = tf.train.load_checkpoint(str(model_dir))
  return {key: reader.get_tensor(key)
          for key in reader.get_variable_to_shape_map()}


# An independent forward pass of the model in NumPy (float64).


def _rms_norm(w, x, name):
  return x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + 1e-6) * w[name]


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _attention(w, prefix, x, memory, causal):
  """Multi-head attention; no 1/sqrt(d_kv) (the original folds it into q's
  initializer)."""
  def heads(y, name):
    return (y @ w[prefix + name]).reshape(len(y), HEADS, D_KV)
  q, k, v = heads(x, "q"), heads(memory, "k"), heads(memory, "v")
  logits = np.einsum("ihd,jhd->hij", q, k)
  if causal:
    logits = np.where(np.tril(np.ones((len(x), len(memory)), bool)), logits,
                      -np.inf)
  o = np.einsum("hij,jhd->ihd", _softmax(logits), v)
  return o.reshape(len(x), HEADS * D_KV) @ w[prefix + "o"]


def _stack(w, stack, x, layers):
  """Pre-norm residual layers, then the final RMS norm."""
  for i, layer in enumerate(layers):
    prefix = f"{stack}/block_000/layer_{i:03d}/"
    x = x + layer(prefix, _rms_norm(w, x, prefix + "rms_norm/scale"))
  return _rms_norm(w, x, f"{stack}/rms_norm/scale")


def numpy_log_probs(w, input_ids, decoder_ids):
  """log p(next id) at each position of decoder_ids (no padding)."""
  embedding, positions = w["shared/embedding"], w["shared/positional_embedding"]

  def ffn(prefix, x):
    hidden = np.maximum(x @ w[prefix + "DenseReluDense/wi/kernel"], 0)
    return hidden @ w[prefix + "DenseReluDense/wo/kernel"]

  def self_attention(causal):
    return lambda p, x: _attention(w, p + "SelfAttention/", x, x, causal)

  x = embedding[input_ids] + positions[:len(input_ids)]
  encoded = _stack(w, "encoder", x, [self_attention(False), ffn])
  y = embedding[decoder_ids] + positions[:len(decoder_ids)]
  y = _stack(w, "decoder", y, [
      self_attention(True),
      lambda p, y: _attention(w, p + "EncDecAttention/", y, encoded, False),
      ffn])
  logits = (y * D_MODEL ** -0.5) @ embedding.T  # tied softmax weights
  return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def numpy_score(w, input_ids, target_ids):
  """log p(targets | inputs) by teacher forcing: the decoder reads the
  targets shifted right."""
  log_probs = numpy_log_probs(w, input_ids, [0] + list(target_ids[:-1]))
  return log_probs[np.arange(len(target_ids)), target_ids].sum()


def numpy_greedy_decode(w, input_ids):
  """The argmax id at each step, up to EOS or LENGTH ids."""
  ids = []
  while len(ids) < LENGTH and (not ids or ids[-1] != 1):
    ids.append(int(np.argmax(numpy_log_probs(w, input_ids, [0] + ids)[-1])))
  return ids


def _ids(text):
  """Byte ids (byte + 3) and EOS (1), as ByteVocabulary encodes them."""
  return [b + 3 for b in text.encode("utf-8")] + [1]


def expected_scores():
  w = {k: v for k, v in VALUES.items() if "_slot_" not in k}
  return [numpy_score(w, _ids(i), _ids(t)) for i, t in zip(INPUTS, TARGETS)]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
  """The directory holding the original's checkpoint model.ckpt-1000."""
  directory = tmp_path_factory.mktemp("original")
  write_original_checkpoint(directory)
  return directory


def _copy(original_dir, tmp_path):
  model_dir = tmp_path / "model"
  shutil.copytree(original_dir, model_dir)
  return model_dir


@pytest.mark.parametrize("mesh", list(MESHES))
def test_scores_equal_numpy_forward_pass(original, tmp_path, mesh, caplog):
  model_dir = _copy(original, tmp_path)
  with caplog.at_level(logging.WARNING):
    scores, targets = run_main(
        model_dir, *MESHES[mesh], "utils.run.mode = 'score_from_strings'",
        f"score_from_strings.inputs = {INPUTS!r}",
        f"score_from_strings.targets = {TARGETS!r}")
  assert targets == TARGETS
  # Every variable of the model was in the checkpoint.
  assert not [r for r in caplog.records
              if "keep their initial values" in r.getMessage()]
  np.testing.assert_allclose(scores, expected_scores(), rtol=1e-5)


def test_greedy_decodes_equal_numpy(original, tmp_path):
  model_dir = _copy(original, tmp_path)
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("\n".join(INPUTS) + "\n")
  run_main(model_dir, *MESHES["2d"], "utils.run.mode = 'infer'",
           f"utils.run.eval_checkpoint_step = {STEP}",
           f"decode_from_file.input_filename = '{inputs}'",
           f"decode_from_file.output_filename = '{tmp_path / 'decodes'}'")
  decodes = (tmp_path / f"decodes-{STEP}").read_text().split("\n")[:-1]
  w = {k: v for k, v in VALUES.items() if "_slot_" not in k}
  expected = ["".join(chr(i - 3) for i in numpy_greedy_decode(w, _ids(text)))
              for text in INPUTS]
  assert all(len(e) == LENGTH for e in expected), expected
  assert decodes == expected


def test_warm_start_resumes_at_the_original_step(original, tmp_path):
  """init_checkpoint: step 1000 to 1003, with the decoder trained only;
  the rest keeps the written values exactly, the decoder moves a little
  from them with the written slots."""
  model_dir = tmp_path / "warm"
  run_main(model_dir, *MESHES["2d"], "utils.run.train_steps = 1003",
           f"utils.run.init_checkpoint = '{original / 'model.ckpt-1000'}'",
           "utils.run.variable_filter = '^decoder/'")
  assert tf.train.latest_checkpoint(str(model_dir)).endswith(
      "model.ckpt-1003")
  values = read_checkpoint(model_dir)
  for name in SHAPES:
    value = values[name].astype(np.float64)
    if name.startswith("decoder/"):
      np.testing.assert_allclose(value, VALUES[name], rtol=0.1, atol=0.05,
                                 err_msg=name)
    else:
      np.testing.assert_array_equal(value, VALUES[name], err_msg=name)
  q = "decoder/block_000/layer_000/SelfAttention/q"
  assert not np.array_equal(values[q], VALUES[q])
  # Loaded, not rebuilt: at step 1000 Adafactor keeps ~99.6% of the old
  # second moment per step (from 0 it would hold the squared gradients).
  np.testing.assert_allclose(values[q + "_slot_vr"], VALUES[q + "_slot_vr"],
                             rtol=0.02)


def test_training_in_a_model_dir_holding_it_resumes(original, tmp_path):
  model_dir = _copy(original, tmp_path)
  run_main(model_dir, *MESHES["1proc"], "utils.run.train_steps = 1002")
  assert tf.train.latest_checkpoint(str(model_dir)).endswith(
      "model.ckpt-1002")
  values = read_checkpoint(model_dir)
  # The binary's model has exactly the original's variables and slots.
  assert set(values) - {"global_step"} == set(VALUES)
  assert values["global_step"] == 1002
  for name, value in VALUES.items():
    np.testing.assert_allclose(values[name], value, rtol=0.1, atol=0.05,
                               err_msg=name)
