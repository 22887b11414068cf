"""T5's `MtfModel`, a client of the original's Transformer package, runs here.

T5 (PyPI `t5` 0.9.4 with `seqio`) drives `mesh_tensorflow.transformer.utils`
directly: `get_estimator`, `train_model`, `decode`, `infer_model`,
`score_with_estimator`, `score_from_strings`, `save_scores`, `export_model`,
the estimator's `train`/`predict`/`export_saved_model`, and the
`operative_config.gin` that training writes into the model directory. The
test trains a tiny Bitransformer (d_model 16, one layer, seqio's
ByteVocabulary) on a seqio task made here from a Python function, then
evaluates, predicts from a file, scores strings and the task's validation
split, exports a SavedModel and serves it, and fine-tunes into a new
directory, all through MtfModel's own methods, unchanged. It keeps T5's
default sampling decode (temperature 1.0) and trains without dropout, so
the exported program has random state that the checkpoint lacks, and it
serves inputs of different lengths in one request.

`make test` installs t5, seqio and their import-time dependencies with
`--no-deps` (tools/t5_client_requirements.txt); the test skips, saying why,
where they are missing.
"""

import importlib
import importlib.util
import os
import sys
import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator as estimator_lib
from mesh_tensorflow.transformer import utils as mtf_utils
from tests.estimator import toy_model

TASK = "mesh_tensorflow_test_reverse_letters"
SEQUENCE_LENGTH = {"inputs": 8, "targets": 8}
TRAIN_STEPS = 4

# The original T5 configuration style: T5's model gin file on top of the
# package defaults, shrunk to a tiny model.
TINY_BINDINGS = """
d_model = 16
d_ff = 32
num_heads = 2
d_kv = 8
num_layers = 1
dropout_rate = 0.0
"""


def _missing_client():
  """Why the client cannot run here, or None."""
  for module in ("seqio", "t5"):
    if importlib.util.find_spec(module) is None:
      return (f"{module} is not installed (make test installs it: "
              "tools/t5_client_requirements.txt)")
  if not hasattr(mtf_utils, "get_estimator"):
    return ("mesh_tensorflow.transformer.utils has no get_estimator yet: "
            "T5's MtfModel builds its estimator with it")
  return None


pytestmark = pytest.mark.skipif(_missing_client() is not None,
                                reason=str(_missing_client()))


def _import_mtf_model():
  """Returns t5.models.mtf_model, as `from t5.models import MtfModel` would.

  `t5/models/__init__.py` also imports T5's Hugging Face model, which imports
  PyTorch at module level. Where torch is installed that import is used
  as is; otherwise `t5.models` is made a plain package so that its
  `mtf_model` module (which does not use torch) imports on its own.
  """
  import t5  # pylint: disable=g-import-not-at-top,unused-import
  if importlib.util.find_spec("torch") is None and (
      "t5.models" not in sys.modules):
    spec = importlib.util.find_spec("t5.models")
    package = types.ModuleType("t5.models")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    sys.modules["t5.models"] = package
    t5.models = package
  return importlib.import_module("t5.models.mtf_model")


def _reverse_examples(split, shuffle_files=False, seed=None):
  """Inputs are short lowercase words, targets the same words reversed."""
  del shuffle_files, seed
  words = ["abc", "cab", "bad", "dab", "ace", "bee", "cede", "face",
           "fade", "bead", "deaf", "dead"]
  if split == "validation":
    words = words[:6]
  return tf.data.Dataset.from_tensor_slices({
      "inputs": words,
      "targets": [w[::-1] for w in words],
  })


def _exact_match(targets, predictions):
  hits = sum(t == p for t, p in zip(targets, predictions))
  return {"exact_match": 100.0 * hits / max(len(targets), 1)}


def _register_task():
  import seqio  # pylint: disable=g-import-not-at-top
  if TASK in seqio.TaskRegistry.names():
    return seqio.get_mixture_or_task(TASK)
  vocabulary = seqio.ByteVocabulary()
  features = {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }
  return seqio.TaskRegistry.add(
      TASK,
      source=seqio.FunctionDataSource(
          dataset_fn=_reverse_examples, splits=("train", "validation")),
      preprocessors=[
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      metric_fns=[_exact_match])


def _parse_tiny_config():
  t5_gin = os.path.join(
      os.path.dirname(importlib.import_module("t5.models").__path__[0]),
      "models", "gin")
  gin.clear_config()
  gin.add_config_file_search_path(t5_gin)
  gin.parse_config_file(
      os.path.join(os.path.dirname(mtf_utils.__file__), "gin", "defaults.gin"))
  gin.parse_config_file("models/bi_v1.gin")
  gin.parse_config(TINY_BINDINGS)


@pytest.fixture(name="mtf_model_module", scope="module")
def fixture_mtf_model_module():
  module = _import_mtf_model()
  _register_task()
  yield module
  gin.clear_config()  # Leaves no T5 bindings to the tests that follow.


def test_mtf_model_train_eval_predict_score_on_two_processors(
    mtf_model_module, tmp_path):
  _parse_tiny_config()
  model_dir = str(tmp_path / "model")
  model = mtf_model_module.MtfModel(
      model_dir=model_dir,
      tpu=None,
      mesh_shape="batch:2",
      layout_rules="batch:batch",
      batch_size=("sequences_per_batch", 4),
      sequence_length=SEQUENCE_LENGTH,
      learning_rate_schedule=0.01,
      save_checkpoints_steps=2,
      iterations_per_loop=2)
  assert model.batch_size == 4

  # Train: checkpoints named model.ckpt-N, and the operative config that
  # eval, predict, score and export re-parse.
  model.train(TASK, TRAIN_STEPS)
  latest = tf.train.latest_checkpoint(model_dir)
  assert latest and latest.endswith(f"model.ckpt-{TRAIN_STEPS}"), latest
  assert os.path.exists(os.path.join(model_dir, "operative_config.gin"))

  # Eval: T5 writes targets, predictions and metrics into summary_dir.
  summary_dir = str(tmp_path / "validation_eval")
  os.makedirs(summary_dir)
  model.eval(TASK, checkpoint_steps=-1, summary_dir=summary_dir)
  predictions = os.path.join(
      summary_dir, f"{TASK}_{TRAIN_STEPS}_predictions")
  with open(predictions) as f:
    assert len(f.read().split("\n")) == 6

  # Predict: one output line per input line, in <output_file>-<step>.
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("abc\nbead\nface\n")
  outputs = str(tmp_path / "outputs.txt")
  model.predict(str(inputs), outputs, checkpoint_steps=-1,
                vocabulary=_vocabulary())
  with open(f"{outputs}-{TRAIN_STEPS}") as f:
    assert len(f.read().rstrip("\n").split("\n")) == 3

  # Score strings: one log-likelihood per (input, target) pair, below zero,
  # also written one per line to the scores file.
  scores_file = str(tmp_path / "scores")
  scores, scored_targets = model.score(
      inputs=["abc", "bead", "face"], targets=["cba", "daeb", "ecaf"],
      scores_file=scores_file, vocabulary=_vocabulary())
  assert scored_targets == ["cba", "daeb", "ecaf"]
  assert len(scores) == 3 and all(s < 0 for s in scores), scores
  with open(scores_file + ".scores") as f:  # As the original names it.
    assert [float(l) for l in f.read().split()] == pytest.approx(scores,
                                                                 rel=1e-5)

  # Scoring a task split, export and fine-tuning:
  # test_mtf_model_on_t5_defaults.


def test_mtf_model_on_t5_defaults(mtf_model_module, tmp_path):
  # As T5's README runs it on one device: T5's default layout rules (which
  # name "ensemble", a mesh dimension "model:1,batch:1" lacks), 100 steps a
  # loop, a checkpoint every 5000 steps, the README's constant learning
  # rate (T5's default, noam, needs a total_train_steps binding).
  _parse_tiny_config()
  model_dir = str(tmp_path / "model")
  model = mtf_model_module.MtfModel(
      model_dir=model_dir, tpu=None, mesh_shape="model:1,batch:1",
      mesh_devices=["cpu:0"], batch_size=4, sequence_length=SEQUENCE_LENGTH,
      learning_rate_schedule=0.003)
  assert model._iterations_per_loop == 100  # pylint: disable=protected-access

  # Train: one loop shorter than iterations_per_loop; its loss is in
  # TensorBoard.
  model.train(TASK, TRAIN_STEPS)
  assert tf.train.latest_checkpoint(model_dir).endswith(
      f"model.ckpt-{TRAIN_STEPS}")
  assert TRAIN_STEPS in toy_model.event_scalars(model_dir)["loss"]

  # Eval and predict.
  summary_dir = str(tmp_path / "validation_eval")
  os.makedirs(summary_dir)
  model.eval(TASK, checkpoint_steps=-1, summary_dir=summary_dir)
  with open(os.path.join(summary_dir,
                         f"{TASK}_{TRAIN_STEPS}_predictions")) as f:
    assert len(f.read().split("\n")) == 6
  inputs_file = tmp_path / "inputs.txt"
  inputs_file.write_text("abc\nbead\nface\n")
  outputs = str(tmp_path / "outputs.txt")
  model.predict(str(inputs_file), outputs, checkpoint_steps=-1,
                vocabulary=_vocabulary())
  with open(f"{outputs}-{TRAIN_STEPS}") as f:
    assert len(f.read().rstrip("\n").split("\n")) == 3

  # Score strings, two targets per input (more than a batch of 4): one score
  # per target, equal to the sum of the per-token log-likelihoods of a
  # teacher-forced forward pass. As the original: (scores, targets) returned
  # (T5's MtfModel.score documents that pair), the scores written with "%g",
  # the targets and their lengths (the bytes and EOS) beside them.
  inputs = ["abc", "abc", "bead", "bead", "face", "face"]
  targets = ["cba", "abc", "daeb", "bead", "ecaf", "face"]
  scores_file = str(tmp_path / "scores")
  scores, scored_targets = model.score(
      inputs=inputs[::2], targets=targets, scores_file=scores_file,
      vocabulary=_vocabulary())
  assert scored_targets == targets
  np.testing.assert_allclose(
      scores, _reference_scores(model_dir, inputs, targets), rtol=1e-4)
  assert sorted(p.name for p in tmp_path.glob("scores.*")) == [
      "scores.lengths", "scores.scores", "scores.targets"]
  with open(scores_file + ".scores") as f:
    assert f.read().splitlines() == ["%g" % s for s in scores]
  with open(scores_file + ".lengths") as f:
    assert f.read().splitlines() == [str(len(t) + 1) for t in targets]
  with open(scores_file + ".targets") as f:
    assert f.read().splitlines() == targets

  # Score the task's validation split: its six examples, the padding of the
  # last batch dropped.
  validation = ["abc", "cab", "bad", "dab", "ace", "bee"]
  reversed_words = [w[::-1] for w in validation]
  task_scores, task_targets = model.score(
      mixture_or_task_name=TASK, mixture_or_task_split="validation",
      vocabulary=_vocabulary())
  assert task_targets == reversed_words
  np.testing.assert_allclose(
      task_scores, _reference_scores(model_dir, validation, reversed_words),
      rtol=1e-4)

  # Export: a SavedModel that decodes strings.
  export_path = model.export(str(tmp_path / "export"), checkpoint_step=-1,
                             vocabulary=_vocabulary())
  served = tf.saved_model.load(export_path).signatures["serving_default"](
      inputs=tf.constant(["abc", "bead"]))
  assert served["outputs"].shape[0] == 2

  # Fine-tune fewer steps than a loop into a new directory: the loss
  # summaries of the fine-tuning are there.
  tuned_dir = str(tmp_path / "tuned")
  tuned = mtf_model_module.MtfModel(
      model_dir=tuned_dir, tpu=None, mesh_shape="model:1,batch:1",
      mesh_devices=["cpu:0"], batch_size=4, sequence_length=SEQUENCE_LENGTH,
      learning_rate_schedule=0.003)
  tuned.finetune(TASK, finetune_steps=2, pretrained_model_dir=model_dir)
  assert tf.train.latest_checkpoint(tuned_dir).endswith(
      f"model.ckpt-{TRAIN_STEPS + 2}")
  assert TRAIN_STEPS + 2 in toy_model.event_scalars(tuned_dir)["loss"]


def _reference_scores(model_dir, inputs, targets):
  """Log-likelihoods from a teacher-forced forward pass of the latest
  checkpoint: NumPy log-softmax of the model's logits at each target id,
  summed over the target's tokens (EOS included)."""
  vocab = _vocabulary()
  length = SEQUENCE_LENGTH["targets"]

  def encode(texts):
    ids = np.zeros([len(texts), length], np.int32)
    for i, text in enumerate(texts):
      tokens = list(vocab.encode(text)) + [1]
      ids[i, :len(tokens)] = tokens
    return ids

  features = {"inputs": encode(inputs), "targets": encode(targets)}
  transformer_model = mtf_utils.build_model(
      model_type="bitransformer", input_vocab_size=vocab.vocab_size,
      output_vocab_size=vocab.vocab_size, layout_rules="", mesh_shape="")
  batch = len(targets)

  def model_fn(features, labels, mode, params, config=None):
    del labels, mode, config
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    shape = mtf.Shape([mtf.Dimension("batch", batch),
                       mtf.Dimension("length", length)])
    ids = {k: mtf.import_fully_replicated(mesh, tf.cast(v, tf.int32), shape,
                                          name=k)
           for k, v in features.items()}
    logits, _ = transformer_model.call_simple(
        inputs=ids["inputs"], targets=ids["targets"], compute_loss=False,
        mode=estimator_lib.ModeKeys.EVAL,
        variable_dtype=mtf_utils.get_variable_dtype())
    logits = mtf.anonymize(logits)
    lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]},
                            autostack=True)
    logits = lowering.export_to_tf_tensor(logits)
    return estimator_lib.EstimatorSpec(estimator_lib.ModeKeys.PREDICT,
                                       predictions={"logits": logits})

  reference = estimator_lib.Estimator(
      model_fn=model_fn, config=estimator_lib.RunConfig(
          model_dir=model_dir, mesh_shape="", layout=""))
  logits = np.stack([p["logits"] for p in reference.predict(
      lambda params: tf.data.Dataset.from_tensors(features))])
  log_probs = logits - np.log(np.sum(np.exp(
      logits - logits.max(-1, keepdims=True)), -1, keepdims=True)) - (
          logits.max(-1, keepdims=True))
  token_scores = np.take_along_axis(
      log_probs, features["targets"][..., None], -1)[..., 0]
  return np.sum(np.where(features["targets"] > 0, token_scores, 0.0), -1)


def _vocabulary():
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.get_mixture_or_task(TASK).output_features["targets"].vocabulary
