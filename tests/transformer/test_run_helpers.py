"""The helpers of utils.run: batch sizes, steps, checkpoints, encoding."""

import logging
import os
import re
import threading

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.binary import run_checkpoints
from mesh_tensorflow.transformer.binary import run_model_fn
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary

LENGTHS = {"inputs": 16, "targets": 32}


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.parametrize("method_and_value, want", [
    (("sequences_per_batch", 24), 24),
    (("tokens_per_batch", 256), 8),
    (("sequences_per_replica", 3), 3 * 4 * 2),
    (("tokens_per_replica", 64), 2 * 4 * 2),
])
def test_compute_batch_size(method_and_value, want):
  # batch splits 4 ways, outer_batch 2 ways; the longest feature counts.
  got = utils.compute_batch_size(LENGTHS, "b:4;m:2;o:2",
                                 "batch:b;outer_batch:o", method_and_value)
  assert got == want


def test_compute_batch_size_errors_name_the_problem():
  with pytest.raises(ValueError, match="do not divide into sequences"):
    utils.compute_batch_size(LENGTHS, "b:2", "batch:b",
                             ("tokens_per_batch", 100))
  with pytest.raises(ValueError, match="unknown"):
    utils.compute_batch_size(LENGTHS, "b:2", "batch:b", ("tokens", 64))


def test_serialize_num_microbatches():
  batch = mtf.Dimension("batch", 48)
  assert utils.serialize_num_microbatches(batch, LENGTHS, "b:4", "batch:b",
                                          None) == 1
  # 12 sequences per replica; 64 tokens hold 2 sequences of 32 -> 6.
  assert utils.serialize_num_microbatches(batch, LENGTHS, "b:4", "batch:b",
                                          64) == 6
  # 5 sequences do not divide 12: the microbatch shrinks to 4 -> 3.
  assert utils.serialize_num_microbatches(batch, LENGTHS, "b:4", "batch:b",
                                          160) == 3


def test_auto_train_steps():
  assert utils.auto_train_steps(8, LENGTHS, train_tokens=2**20) == 2**20 // 256
  assert utils.auto_train_steps(8, 16, train_tokens=1024) == 8


def _touch_checkpoints(model_dir, steps):
  for step in steps:
    for suffix in (".index", ".data-00000-of-00001"):
      open(os.path.join(model_dir, f"model.ckpt-{step}{suffix}"), "w").close()


def test_get_checkpoint_iterator(tmp_path):
  model_dir = str(tmp_path)
  _touch_checkpoints(model_dir, [100, 200, 300])
  path = lambda s: os.path.join(model_dir, f"model.ckpt-{s}")
  it = utils.get_checkpoint_iterator
  assert list(it(190, model_dir)) == [path(200)]
  assert list(it([90, 110, 290], model_dir)) == [path(100), path(300)]
  assert list(it("all", model_dir)) == [path(s) for s in (100, 200, 300)]
  assert list(it("all", model_dir, skip_until=100)) == [path(200), path(300)]
  assert list(it("latest", model_dir)) == [path(300)]
  waiting = it(None, model_dir, skip_until=150, stop_after=300)
  assert list(waiting) == [path(300)]
  with pytest.raises(ValueError, match="No checkpoint of step 150"):
    it(150, model_dir, find_closest=False)
  with pytest.raises(ValueError, match="No checkpoint files"):
    it(5, str(tmp_path / "empty"))


def _waiting_lines(caplog):
  return [r.getMessage() for r in caplog.records
          if "Waiting for new checkpoints" in r.getMessage()]


def test_waiting_for_checkpoints_says_so_and_times_out(tmp_path, caplog,
                                                       monkeypatch):
  """eval_checkpoint_step None: each new checkpoint, a line while waiting
  (repeated), and the end after `timeout` seconds without one."""
  monkeypatch.setattr(run_checkpoints, "_REPORT_EVERY_SECONDS", 0.2)
  monkeypatch.setattr(run_checkpoints, "_POLL_SECONDS", 0.05)
  model_dir = str(tmp_path)
  _touch_checkpoints(model_dir, [100])
  later = threading.Timer(0.3, _touch_checkpoints, (model_dir, [200]))
  caplog.set_level(logging.INFO, logger="absl")
  later.start()
  try:
    paths = list(utils.get_checkpoint_iterator(None, model_dir, timeout=0.7))
  finally:
    later.cancel()
  assert paths == [os.path.join(model_dir, f"model.ckpt-{s}")
                   for s in (100, 200)]
  lines = _waiting_lines(caplog)
  # Once after step 100, then at least twice (0 s, 0.2 s, ...) after 200.
  assert len(lines) >= 3, lines
  assert "Done with checkpoint " + paths[0] in lines[0]
  last = lines[-1]
  assert "Done with checkpoint " + paths[1] in last
  assert f"in {model_dir} " in last
  assert 'utils.run.eval_checkpoint_step = "latest"' in last
  assert "stopping after 0.7 s" in last
  waited = [int(re.search(r"(\d+) s so far", l)[1]) for l in lines]
  assert waited == sorted(waited)
  assert any("No new checkpoint in " + model_dir in r.getMessage() and
             "timeout = 0.7" in r.getMessage() for r in caplog.records)


def test_waiting_with_no_checkpoint_yet_says_so(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  assert not list(utils.get_checkpoint_iterator(None, str(tmp_path),
                                                timeout=0.1))
  (line,) = _waiting_lines(caplog)
  assert line.startswith(f"No new checkpoint in {tmp_path} yet"), line


def test_waiting_timeout_is_a_gin_parameter(tmp_path, caplog):
  gin.parse_config("utils.get_checkpoint_iterator.timeout = 0.1")
  caplog.set_level(logging.INFO, logger="absl")
  assert not list(utils.get_checkpoint_iterator(None, str(tmp_path)))
  assert _waiting_lines(caplog)


def test_get_step_from_checkpoint_path():
  assert utils.get_step_from_checkpoint_path("/a/model.ckpt-1234") == 1234
  assert utils.get_step_from_checkpoint_path(
      "/a/model.ckpt-7.index") == 7
  with pytest.raises(ValueError, match="model.ckpt-<step>"):
    utils.get_step_from_checkpoint_path("/a/ckpt-5")


def test_flexible_ckpt_init_mapping_skips_new_layers():
  mapping = utils.flexible_ckpt_init_mapping(new_layers=[1])
  assert mapping("decoder/block_000/layer_000/SelfAttention/q") == (
      "decoder/block_000/layer_000/SelfAttention/q")
  assert mapping("decoder/block_000/layer_001/EncDecAttention/q") is None
  assert mapping("decoder/block_000/layer_002/DenseReluDense/wi/kernel") == (
      "decoder/block_000/layer_001/DenseReluDense/wi/kernel")
  assert mapping("shared/embedding") == "shared/embedding"


def test_clean_decodes():
  ids = tf.constant([[5, 6, 1, 7, 8], [1, 3, 3, 1, 4], [4, 4, 4, 4, 4]])
  np.testing.assert_array_equal(
      utils.clean_decodes(ids).numpy(),
      [[5, 6, 1, 0, 0], [1, 0, 0, 0, 0], [4, 4, 4, 4, 4]])


def test_clean_decodes_takes_a_python_list():
  """As the original: any value tf.convert_to_tensor accepts."""
  cleaned = utils.clean_decodes([[2, 1, 3], [1, 2, 2]], pad_id=7)
  np.testing.assert_array_equal(cleaned.numpy(), [[2, 1, 7], [1, 7, 7]])


def _metric_value(metric):
  if metric.reduction == "mean":
    return float(metric.parts["total"] / metric.parts["count"])
  return float(next(iter(metric.parts.values())))


def test_eval_metrics_weigh_every_mean_like_the_original():
  """mean_label, the original's checksum of the evaluation data, is the
  mean of the weighted labels (padding and negative ids left out)."""
  labels = tf.constant([[5, 3, 0, 0], [2, -4, 7, 0]])
  predictions = tf.constant([[5, 1, 0, 0], [2, 4, 7, 1]])
  weights = tf.constant([[1., 1., 0., 0.], [1., 0., 1., 0.]])
  xent = tf.constant([[1., 2., 9., 9.], [3., 9., 4., 9.]])
  got = {k: _metric_value(m) for k, m in run_model_fn.teacher_forced_metrics(
      xent, predictions, labels, weights).items()}
  assert got == pytest.approx({
      "mean_label": (5 + 3 + 2 + 7) / 4,
      "neg_log_perplexity": -(1 + 2 + 3 + 4) / 4,
      "token_accuracy": 3 / 4,
      "sequence_accuracy": 1 / 2,
      "num_eval_tokens": 4,
      "max_targets_length": 2})


@pytest.mark.parametrize("model_type, want", [
    ("lm", [[1, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]]),
    ("delimited_lm", [[0, 0, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0]])])
def test_eval_weights_leave_out_padding_and_negative_ids(model_type, want):
  """As the original: only positive targets count (negative ids mark an
  unscored prefix), and a delimited_lm's inputs part does not."""
  targets = np.array([[4, 1, 5, 1, 0, 0], [-3, 1, 6, 0, 0, 0]], np.int32)
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 6)
  weights = run_model_fn.eval_weights(
      mtf.import_tf_tensor(mesh, tf.constant(targets), [batch, length]),
      model_type)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl([], {}, [""])
  lowering = mtf.Lowering(mesh.graph, {mesh: impl})
  np.testing.assert_array_equal(
      lowering.export_to_tf_tensor(weights).numpy(), want)


def test_encode_inputs_pads_rows_and_batches():
  vocab = vocabulary.ByteVocabulary()
  ids = utils.encode_inputs(["ab", "abcdef"], vocab, "bitransformer",
                            batch_size=4, sequence_length=5)
  a, b = 97 + 3, 98 + 3
  np.testing.assert_array_equal(ids, [
      [a, b, 1, 0, 0],
      [a, b, 99 + 3, 100 + 3, 101 + 3],  # Truncated: no room for EOS.
      [a, b, 1, 0, 0],  # Padding rows repeat the first.
      [a, b, 1, 0, 0]])
  lm = utils.encode_inputs(["ab"], vocab, "lm", batch_size=1,
                           sequence_length=4)
  np.testing.assert_array_equal(lm, [[a, b, 0, 0]])  # A prefix: no EOS.
  prefixed = utils.encode_inputs(["b"], vocab, "bitransformer", 1, 4,
                                 unscored_prefix=["a"])
  np.testing.assert_array_equal(prefixed, [[-a, b, 1, 0]])


def test_encode_delimited_lm():
  vocab = vocabulary.ByteVocabulary()
  ids = utils.encode_delimited_lm(["a"], ["bc"], vocab, batch_size=2,
                                  sequence_length=6)
  np.testing.assert_array_equal(ids, [[100, 1, 101, 102, 1, 0]] * 2)


def test_get_inputs_from_file(tmp_path):
  path = tmp_path / "in.txt"
  path.write_text("# comment\n1+2\n\n3+4\n")
  assert utils.get_inputs_from_file(str(path)) == ["# comment", "1+2", "",
                                                   "3+4"]
  assert utils.get_inputs_from_file(str(path), ignore_comments=True) == [
      "1+2", "", "3+4"]
  with pytest.raises(ValueError, match="does not exist"):
    utils.get_inputs_from_file(str(tmp_path / "missing.txt"))


def test_vocabulary_pairs():
  inputs, targets = vocabulary.ByteVocabulary(), vocabulary.ByteVocabulary(2)
  assert utils.inputs_vocabulary((inputs, targets)) is inputs
  assert utils.targets_vocabulary((inputs, targets)) is targets
  assert utils.targets_vocabulary(inputs) is inputs


class _ScoringEstimator:
  """Stands in for an estimator scoring in predict mode: an example's score
  is minus the sum of its target ids over 10; it keeps the features."""

  def __init__(self):
    self.features = []

  def latest_checkpoint(self):
    return "model.ckpt-1"

  def predict(self, input_fn, checkpoint_path=None):
    del checkpoint_path
    for batch in input_fn({}):
      batch = {k: v.numpy() for k, v in batch.items()}
      for i in range(len(batch["targets"])):
        example = {k: v[i] for k, v in batch.items()}
        self.features.append(example)
        yield {"scores": np.float32(-np.abs(example["targets"]).sum() / 10),
               "targets": np.abs(example["targets"])}


def test_save_scores_returns_and_writes_as_the_original(tmp_path):
  vocab = vocabulary.ByteVocabulary()
  a, b, c = 97 + 3, 98 + 3, 99 + 3
  results = [{"scores": np.float32(-1.25), "targets": np.array([a, b, 1, 0])},
             {"scores": np.float32(-0.123456789),
              "targets": np.array([c, 1, 0, 0])}]
  assert utils.save_scores(results, vocab, save_example_text=False) == [
      -1.25, pytest.approx(-0.123456789)]
  prefix = str(tmp_path / "s")
  scores, targets = utils.save_scores(results, vocab, scores_filename=prefix)
  assert targets == ["ab", "c"]
  assert scores == [-1.25, pytest.approx(-0.123456789)]
  assert sorted(os.listdir(tmp_path)) == ["s.lengths", "s.scores",
                                          "s.targets"]
  assert (tmp_path / "s.scores").read_text() == "-1.25\n-0.123457\n"  # %g
  assert (tmp_path / "s.lengths").read_text() == "3\n2\n"  # EOS included.
  assert (tmp_path / "s.targets").read_text() == "ab\nc\n"

  # With inputs (and pretokenized text, used as is): (scores, inputs,
  # targets), and an ".inputs" file.
  results[0].update(inputs=np.array([c, 1]), targets_pretokenized=b"AB")
  results[1].update(inputs=np.array([a, 1]))
  scores, inputs, targets = utils.save_scores(results, vocab,
                                              scores_filename=prefix)
  assert (inputs, targets) == (["c", "a"], ["AB", "c"])
  assert (tmp_path / "s.inputs").read_text() == "c\na\n"
  with pytest.raises(ValueError, match="No examples were scored"):
    utils.save_scores([], vocab)


def test_score_with_estimator_drops_padding_and_is_gin_configurable(
    tmp_path):
  vocab = vocabulary.ByteVocabulary()
  targets = np.array([[100, 1, 0], [101, 101, 1], [0, 0, 0], [0, 0, 0]],
                     np.int32)
  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensor_slices({"targets": targets}).batch(2)

  # num_examples None: the trailing all-padding examples are dropped.
  scores, texts = utils.score_with_estimator(
      _ScoringEstimator(), input_fn, None, str(tmp_path), vocab)
  assert texts == ["a", "bb"]
  assert scores == [pytest.approx(-10.1), pytest.approx(-20.3)]
  # T5 binds utils.score_with_estimator.num_examples.
  gin.parse_config("utils.score_with_estimator.num_examples = 1")
  scores, texts = utils.score_with_estimator(
      _ScoringEstimator(), input_fn, None, str(tmp_path), vocab)
  assert texts == ["a"]


def test_score_from_strings_scores_an_lm_target_after_its_input(tmp_path):
  # As the original: the input is an unscored (negated) prefix of the
  # target, not a separate feature, and no EOS ends an lm target.
  vocab = vocabulary.ByteVocabulary()
  estimator = _ScoringEstimator()
  scores, targets = utils.score_from_strings(
      estimator, vocab, "lm", batch_size=2, sequence_length={"targets": 5},
      model_dir=str(tmp_path), eval_checkpoint_step=None, inputs=["a"],
      targets=["bc", "d"], score_postprocess_fn=utils.save_scores)
  a, b, c, d = 100, 101, 102, 103
  assert [sorted(f) for f in estimator.features] == [["targets"]] * 2
  np.testing.assert_array_equal(
      [f["targets"] for f in estimator.features],
      [[-a, b, c, 0, 0], [-a, d, 0, 0, 0]])
  assert len(scores) == 2 and targets == ["abc", "ad"]
