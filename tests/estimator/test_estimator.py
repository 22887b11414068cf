"""Estimator: train/evaluate/predict/export round trips, resume, summaries,
and SIMD against placement, on a tiny mtf model."""

import glob
import logging
import os

from absl import logging as absl_logging
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow import estimator
from tests.estimator import toy_model


_variables = toy_model.variables
_assert_same_variables = toy_model.assert_same_variables


def test_train_evaluate_predict_and_resume(tmp_path):
  est = toy_model.make_estimator(tmp_path / "a", save_checkpoints_steps=2)
  assert est.latest_checkpoint() is None
  with pytest.raises(ValueError, match="train first"):
    est.evaluate(toy_model.eval_input_fn)
  est.train(toy_model.input_fn, steps=3)
  est.train(toy_model.input_fn, steps=3)  # Resumes from step 3.
  assert int(est.get_variable_value("global_step")) == 6
  assert est.latest_checkpoint().endswith("model.ckpt-6")
  est.train(toy_model.input_fn, max_steps=6)  # Already there: no step.
  assert int(est.get_variable_value("global_step")) == 6

  in_one_go = toy_model.make_estimator(tmp_path / "b")
  in_one_go.train(toy_model.input_fn, steps=6)
  _assert_same_variables(_variables(est), _variables(in_one_go))
  assert {"hidden/kernel", "out/bias", "mtf_random_step"} <= set(
      est.get_variable_names())

  results = est.evaluate(toy_model.eval_input_fn)
  assert results["global_step"] == 6
  assert set(results) == {"loss", "mae", "global_step"}
  assert results["loss"] == pytest.approx(
      in_one_go.evaluate(toy_model.eval_input_fn)["loss"], rel=1e-5)
  first = toy_model.make_estimator(tmp_path / "c")
  first.train(toy_model.input_fn, steps=1)
  assert results["loss"] < first.evaluate(toy_model.eval_input_fn)["loss"]

  predictions = list(est.predict(toy_model.predict_input_fn))
  assert len(predictions) == 2 * toy_model.BATCH
  outputs = np.stack([p["out"] for p in predictions[:toy_model.BATCH]])
  mse = np.mean(np.square(outputs - toy_model.TARGETS))
  assert mse == pytest.approx(results["loss"], rel=1e-5)


def test_iterations_per_loop_gives_the_same_run(tmp_path):
  one = toy_model.make_estimator(tmp_path / "one", iterations_per_loop=1)
  one.train(toy_model.input_fn, steps=7)
  loop = toy_model.make_estimator(tmp_path / "loop", iterations_per_loop=3)
  loop.train(toy_model.input_fn, steps=7)  # Loops of 3, 3 and 1 steps.
  assert int(loop.get_variable_value("global_step")) == 7
  _assert_same_variables(_variables(one), _variables(loop))


def test_summaries_log_lines_and_checkpoint_pruning(tmp_path, caplog):
  est = toy_model.make_estimator(
      tmp_path, save_summary_steps=2, log_step_count_steps=2,
      save_checkpoints_steps=1, keep_checkpoint_max=2, iterations_per_loop=2)
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  try:
    with caplog.at_level(logging.INFO):
      est.train(toy_model.input_fn, steps=6)
  finally:
    absl_logging.set_verbosity(verbosity)
  messages = [r.getMessage() for r in caplog.records]
  assert any(m.startswith("loss = ") and ", step = 6 (" in m
             for m in messages), messages
  assert any(m.startswith("global_step/sec: ") for m in messages)

  scalars = toy_model.event_scalars(str(tmp_path))
  assert sorted(scalars["loss"]) == [2, 4, 6]
  assert sorted(scalars["learning_rate"]) == [2, 4, 6]  # By the optimizer.
  assert scalars["learning_rate"][4] == pytest.approx(0.1)
  assert sorted(scalars["mean_abs_error"]) == [2, 4, 6]  # mtf.scalar_summary
  assert sorted(scalars["global_step/sec"]) == [2, 4, 6]
  assert scalars["loss"][6] < scalars["loss"][2]

  est.evaluate(toy_model.eval_input_fn)
  assert "mae" in toy_model.event_scalars(str(tmp_path / "eval"))
  # Old checkpoints are pruned.
  assert [os.path.basename(p) for p in tf.train.get_checkpoint_state(
      str(tmp_path)).all_model_checkpoint_paths] == [
          "model.ckpt-4", "model.ckpt-6"]
  assert not glob.glob(str(tmp_path / "model.ckpt-2*"))


def test_simd_trains_like_placement(tmp_path):
  placement = toy_model.make_estimator(tmp_path / "p", iterations_per_loop=2,
                                       save_summary_steps=2)
  placement.train(toy_model.input_fn, steps=4)
  simd = toy_model.make_estimator(tmp_path / "s", iterations_per_loop=2,
                                  save_summary_steps=2, mesh_impl="simd")
  simd.train(toy_model.input_fn, steps=4)
  _assert_same_variables(_variables(placement), _variables(simd))
  # mtf.scalar_summary values come out of the SIMD program too.
  for name in ("loss", "learning_rate", "mean_abs_error"):
    np.testing.assert_allclose(
        sorted(toy_model.event_scalars(str(tmp_path / "s"))[name].items()),
        sorted(toy_model.event_scalars(str(tmp_path / "p"))[name].items()),
        rtol=1e-5)
  assert simd.evaluate(toy_model.eval_input_fn)["loss"] == pytest.approx(
      placement.evaluate(toy_model.eval_input_fn)["loss"], rel=1e-5)


def _labels_in_features(fn):
  """fn's batches as features only: the targets under features["y"]."""
  return lambda: fn().map(lambda features, labels: dict(features, y=labels))


def _model_fn_reading_labels_from_features(features, labels, mode, params):
  assert labels is None
  features = dict(features)
  targets = features.pop("y")
  return toy_model.model_fn(features, targets, mode, params)


def test_simd_runs_input_fns_without_labels(tmp_path):
  """An input_fn may give features only (BERT's do): labels are None."""
  runs = {}
  for mesh_impl in ("placement", "simd"):
    config = estimator.RunConfig(
        model_dir=str(tmp_path / mesh_impl), mesh_shape="b:2;m:4",
        layout="batch:b;hidden:m", mesh_impl=mesh_impl)
    est = estimator.Estimator(_model_fn_reading_labels_from_features,
                              config=config, params={"learning_rate": 0.1})
    est.train(_labels_in_features(toy_model.input_fn), steps=2)
    runs[mesh_impl] = est.evaluate(
        _labels_in_features(toy_model.eval_input_fn))["loss"]
  assert runs["simd"] == pytest.approx(runs["placement"], rel=1e-5)


def test_export_serves_on_one_device_like_the_8_processor_model(tmp_path):
  est = toy_model.make_estimator(tmp_path, mesh_shape="b:2;m:4",
                                 layout="batch:b;hidden:m")
  est.train(toy_model.input_fn, steps=3)
  expected = np.stack([p["out"] for p in est.predict(
      toy_model.predict_input_fn)][:toy_model.BATCH])
  receiver_fn = estimator.build_raw_serving_input_receiver_fn(
      {"x": tf.TensorSpec([toy_model.BATCH, toy_model.IO], tf.float32)})
  path = est.export_saved_model(str(tmp_path / "export"), receiver_fn)
  assert os.listdir(tmp_path / "export") == [os.path.basename(path.decode())]

  loaded = tf.saved_model.load(path.decode())
  serve = loaded.signatures["serving_default"]
  served = serve(x=tf.constant(toy_model.INPUTS))["out"].numpy()
  np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
  ops = serve.graph.get_operations()
  assert not any(op.type.startswith("Collective") for op in ops)


def test_tpu_estimator_passes_batch_size(tmp_path):
  seen = []

  def input_fn(params):
    seen.append(params["batch_size"])
    return toy_model.input_fn()

  config = estimator.RunConfig(
      model_dir=str(tmp_path), mesh_shape="all:2", layout="batch:all",
      tpu_config=estimator.TPUConfig(iterations_per_loop=2))
  assert config.iterations_per_loop == 2
  est = estimator.TPUEstimator(toy_model.model_fn, config=config,
                               params={}, use_tpu=False,
                               train_batch_size=toy_model.BATCH)
  est.train(input_fn, steps=2)
  assert seen == [toy_model.BATCH]


def test_input_pipeline_position_is_checkpointed(tmp_path):
  whole = toy_model.make_estimator(tmp_path / "whole",
                                   checkpoint_input_pipeline=True)
  whole.train(toy_model.varying_input_fn, steps=20)
  resumed = toy_model.make_estimator(tmp_path / "resumed",
                                     checkpoint_input_pipeline=True)
  for _ in range(2):  # Each call starts a new iterator and restores it.
    resumed.train(toy_model.varying_input_fn, steps=10)
  _assert_same_variables(_variables(whole), _variables(resumed))
  # Without the option input_fn restarts, as tf.estimator's did.
  restarted = toy_model.make_estimator(tmp_path / "restarted")
  for _ in range(2):
    restarted.train(toy_model.varying_input_fn, steps=10)
  assert not np.allclose(_variables(whole)["out/kernel"],
                         _variables(restarted)["out/kernel"])


def test_input_pipeline_errors_name_the_option(tmp_path):
  est = toy_model.make_estimator(tmp_path / "a",
                                 checkpoint_input_pipeline=True)
  est.train(toy_model.varying_input_fn, steps=2)

  def other_dataset():
    return toy_model.varying_input_fn().map(lambda x, y: (x, y * 2.0))

  with pytest.raises(ValueError, match="same dataset"):
    est.train(other_dataset, steps=2)

  def generated():
    def batches():
      while True:
        yield {"x": toy_model.INPUTS}, toy_model.TARGETS
    return tf.data.Dataset.from_generator(batches, output_signature=(
        {"x": tf.TensorSpec([toy_model.BATCH, toy_model.IO], tf.float32)},
        tf.TensorSpec([toy_model.BATCH, toy_model.IO], tf.float32)))

  fresh = toy_model.make_estimator(tmp_path / "b",
                                   checkpoint_input_pipeline=True)
  with pytest.raises(ValueError, match="cannot be checkpointed"):
    fresh.train(generated, steps=2)
  assert fresh.latest_checkpoint() is None
  assert not [p for p in os.listdir(tmp_path / "b") if "ckpt" in p]


class _Listener:
  """A CheckpointSaverListener that asks to stop after step 4's save."""

  def __init__(self):
    self.calls = []

  def begin(self):
    self.calls.append("begin")

  def before_save(self, session, step):
    self.calls.append(("before", session, step))

  def after_save(self, session, step):
    self.calls.append(("after", session, step))
    return step >= 4

  def end(self, session, step):
    self.calls.append(("end", session, step))


def test_saving_listeners_are_called_and_can_stop_training(tmp_path, caplog):
  est = toy_model.make_estimator(tmp_path, save_checkpoints_steps=2)
  listener = _Listener()
  with caplog.at_level(logging.WARNING):
    est.train(toy_model.input_fn, steps=10, saving_listeners=[listener],
              hooks=["a-session-run-hook"])
  assert "ignores hooks" in caplog.text
  assert listener.calls == [
      "begin", ("before", None, 2), ("after", None, 2), ("before", None, 4),
      ("after", None, 4), ("end", None, 4)]
  assert est.get_variable_value("global_step") == 4
