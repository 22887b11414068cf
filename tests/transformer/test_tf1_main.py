"""The Transformer's binary in a TF1-style program: main with v2 behaviour
disabled first (as the original's main.py did) runs every mode of
utils.run on a tiny model, in a graph and Session, with the same results
as the default (eager) mode on the same checkpoint, which the default mode
also resumes.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import test_main

# What the TF1-style program (tf1_main_worker) scores. (That module is not
# imported here: it disables eager execution on import.)
SCORE_INPUTS = ["1+2", "30+4"]
SCORE_TARGETS = ["3", "34"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(model dir, work dir, what the TF1-style program's modes returned)."""
  model_dir = tmp_path_factory.mktemp("model")
  work = tmp_path_factory.mktemp("work")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run(
      [sys.executable, "-m", "tests.transformer.tf1_main_worker",
       str(model_dir), str(work)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
      check=False)
  assert result.returncode == 0, result.stderr[-5000:]
  with open(work / "results.json") as f:
    return model_dir, work, json.load(f)


def test_modes_run_and_agree_with_the_eager_mode(run):
  model_dir, work, results = run
  steps = test_main.TRAIN_STEPS
  assert tf.train.latest_checkpoint(str(model_dir)).endswith(
      f"model.ckpt-{steps}")
  assert (model_dir / "operative_config.gin").exists()
  assert set(results["eval"]) == {str(steps)}
  assert 0.0 <= results["eval"][str(steps)]["addition/exact_match"] <= 1.0
  assert len((work / f"decodes-{steps}").read_text().splitlines()) == 3
  assert len(results["dataset_scores"][0]) == test_main.NUM_EVAL

  scores, targets = results["scores"]
  assert targets == SCORE_TARGETS
  expected, _ = test_main.run_main(
      model_dir, "utils.run.mode = 'score_from_strings'",
      f"score_from_strings.inputs = {SCORE_INPUTS}",
      f"score_from_strings.targets = {SCORE_TARGETS}")
  np.testing.assert_allclose(scores, expected, rtol=1e-5)
  eager = test_main.run_main(model_dir, "utils.run.mode = 'perplexity_eval'",
                             "utils.run.dataset_split = 'validation'",
                             "utils.run.perplexity_eval_steps = 4")
  graph = results["perplexity_eval"][str(steps)]["addition"]
  for key, value in eager[steps]["addition"].items():
    assert graph[key] == pytest.approx(value, rel=1e-5), key

  # The TF1 exports serve in TF2.
  served = tf.saved_model.load(results["export_score"]).signatures[
      "serving_default"]
  np.testing.assert_allclose(
      served(inputs=tf.constant(SCORE_INPUTS),
             targets=tf.constant(SCORE_TARGETS))[
                 "scores"].numpy(), expected, rtol=1e-4)
  served = tf.saved_model.load(results["export_infer"]).signatures[
      "serving_default"]
  outputs = served(inputs=tf.constant(["1+2", "30+4", "5+67"]))["outputs"]
  decodes = (work / f"decodes-{steps}").read_text().splitlines()
  assert [o.decode(errors="replace") for o in outputs.numpy()] == decodes


def test_the_eager_mode_resumes_the_tf1_checkpoint(run):
  model_dir = run[0]
  steps = test_main.TRAIN_STEPS + 3
  test_main.run_main(model_dir, f"utils.run.train_steps = {steps}")
  assert tf.train.latest_checkpoint(str(model_dir)).endswith(
      f"model.ckpt-{steps}")
