"""The estimator in a TF1-style program (eager execution disabled first):
the same tiny model trains to the same loss as in the default (eager) mode,
with the same checkpoints, summaries and log lines, each mode resumes the
other's checkpoints, and evaluate, predict, export and TPUEstimator work.

The TF1-style program runs in one subprocess (tf1_worker); this process is
the eager side.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow import estimator
from tests.estimator import toy_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _train_eagerly(model_dir, steps):
  recorder = toy_model.LossRecorder()
  toy_model.make_estimator(model_dir, **toy_model.MODE_SETTINGS).train(
      toy_model.input_fn, steps=steps, hooks=[recorder])
  return recorder.losses


def _checkpoint_keys(model_dir):
  reader = tf.train.load_checkpoint(str(model_dir))
  return sorted(reader.get_variable_to_shape_map())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(work dir, eager losses, eager variables at STEPS, results of the
  TF1-style program, its stderr)."""
  work = tmp_path_factory.mktemp("tf1")
  eager_losses = _train_eagerly(work / "eager", toy_model.MODE_STEPS)
  eager_variables = toy_model.variables(toy_model.make_estimator(
      work / "eager", **toy_model.MODE_SETTINGS))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run(
      [sys.executable, "-m", "tests.estimator.tf1_worker", str(work)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-5000:]
  with open(work / "results.json") as f:
    results = json.load(f)
  return work, eager_losses, eager_variables, results, result.stderr


def test_same_losses_summaries_and_checkpoint_keys(run):
  work, eager_losses, _, results, stderr = run
  graph_losses = {int(k): v for k, v in results["graph_losses"].items()}
  assert sorted(graph_losses) == sorted(eager_losses) == [
      3, 6, 9, 12, 15, 18, 20]
  for step, loss in eager_losses.items():
    assert graph_losses[step] == pytest.approx(loss, rel=1e-5), step
  assert graph_losses[20] < graph_losses[3]

  graph_scalars = toy_model.event_scalars(str(work / "graph"))
  eager_scalars = toy_model.event_scalars(str(work / "eager"))
  assert set(graph_scalars) == {"loss", "learning_rate", "mean_abs_error",
                                "global_step/sec"}
  for tag in ("loss", "learning_rate", "mean_abs_error"):
    # Every 5 steps; the loss also after the first loop, which holds no
    # such step. (The eager directory also holds the TF1 program's resumed
    # steps.)
    expected = [3, 5, 10, 15, 20] if tag == "loss" else [5, 10, 15, 20]
    assert sorted(graph_scalars[tag]) == expected, tag
    for step, value in graph_scalars[tag].items():
      assert value == pytest.approx(eager_scalars[tag][step], rel=1e-5)
  assert graph_scalars["loss"][20] == pytest.approx(graph_losses[20])
  assert sorted(graph_scalars["global_step/sec"]) == [6, 12, 15, 20]

  assert _checkpoint_keys(work / "graph") == _checkpoint_keys(work / "eager")
  assert sorted(os.path.basename(p) for p in tf.train.get_checkpoint_state(
      str(work / "graph")).all_model_checkpoint_paths) == [
          "model.ckpt-12", "model.ckpt-20"]  # At the end of a loop.
  assert not [n for n in os.listdir(work / "graph") if "_temp" in n]
  assert "loss = " in stderr and ", step = 20 (" in stderr
  assert "global_step/sec: " in stderr


def test_each_mode_resumes_the_others_checkpoint(run):
  work, _, eager_variables, results, _ = run
  # The TF1 program resumed the eager run: its first loop starts at 20.
  resumed = {int(k): v for k, v in results["resumed_losses"].items()}
  assert sorted(resumed) == [23, 26, 29, 30]
  # The eager side resumes the TF1 program's run from the same step.
  graph = toy_model.make_estimator(work / "graph", **toy_model.MODE_SETTINGS)
  toy_model.assert_same_variables(toy_model.variables(graph),
                                  eager_variables)
  eager_resumed = _train_eagerly(work / "graph", toy_model.MODE_RESUME_STEPS)
  for step, loss in resumed.items():
    assert eager_resumed[step] == pytest.approx(loss, rel=1e-5), step
  toy_model.assert_same_variables(
      toy_model.variables(graph),
      toy_model.variables(toy_model.make_estimator(work / "eager")))
  assert int(graph.get_variable_value("global_step")) == 30


def test_warm_start_in_a_tf1_program(run, tmp_path):
  work = run[0]
  # The TF1 program warm-started "warm" from "graph" at step 20 and trained
  # one step; "eager" at step 20 holds the same values.
  eager = toy_model.make_estimator(
      tmp_path, init_checkpoint=str(work / "eager" / "model.ckpt-20"),
      **toy_model.MODE_SETTINGS)
  eager.train(toy_model.input_fn, steps=1)
  warm = toy_model.make_estimator(work / "warm")
  assert int(warm.get_variable_value("global_step")) == 21
  toy_model.assert_same_variables(toy_model.variables(warm),
                                  toy_model.variables(eager))


def test_evaluate_predict_and_export(run):
  work, _, eager_variables, results, _ = run
  del eager_variables
  # The TF1 program evaluated "graph" at step 20; so does "eager" here
  # (the same variables; "graph" itself has moved on to step 30).
  eager = toy_model.make_estimator(work / "eager", **toy_model.MODE_SETTINGS)
  at_20 = os.path.join(str(work / "eager"), "model.ckpt-20")
  expected = eager.evaluate(toy_model.eval_input_fn, checkpoint_path=at_20)
  assert results["evaluate"]["global_step"] == 20
  for key in ("loss", "mae"):
    assert results["evaluate"][key] == pytest.approx(expected[key], rel=1e-5)
  predictions = np.stack([p["out"] for p in eager.predict(
      toy_model.predict_input_fn, checkpoint_path=at_20)])
  np.testing.assert_allclose(results["predict"], predictions, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(results["predict_other_layout"], predictions,
                             rtol=1e-5, atol=1e-6)
  eval_scalars = toy_model.event_scalars(str(work / "graph" / "eval"))
  assert eval_scalars["loss"] == {20: pytest.approx(expected["loss"])}

  np.testing.assert_allclose(results["served"],
                             predictions[:toy_model.BATCH], rtol=1e-5,
                             atol=1e-6)
  # The TF1 export serves in TF2 too.
  serve = tf.saved_model.load(results["export_dir"]).signatures[
      "serving_default"]
  np.testing.assert_allclose(
      serve(x=tf.constant(toy_model.INPUTS))["out"].numpy(),
      predictions[:toy_model.BATCH], rtol=1e-5, atol=1e-6)


def test_tpu_estimator_and_mesh_implementations(run):
  work, _, _, results, _ = run
  assert results["tpu_evaluate"]["global_step"] == 4
  tpu = estimator.TPUEstimator(
      toy_model.model_fn, use_tpu=False,
      config=estimator.RunConfig(model_dir=str(work / "tpu"),
                                 mesh_shape="all:2", layout="batch:all"),
      params={"learning_rate": 0.1})
  assert results["tpu_evaluate"]["loss"] == pytest.approx(
      tpu.evaluate(toy_model.eval_input_fn)["loss"], rel=1e-5)
  assert "mesh_impl='simd' needs eager execution" in results["simd_error"]
