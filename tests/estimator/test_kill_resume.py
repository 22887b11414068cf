"""A training process killed with SIGKILL resumes from its last complete
checkpoint, data position included, and ends where an uninterrupted run
ends."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from tests.estimator import kill_worker
from tests.estimator import toy_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
MAX_STEPS = 400
KILL_AFTER_STEP = 20


def _start_worker(model_dir):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.Popen(
      [sys.executable, "-m", "tests.estimator.kill_worker", str(model_dir),
       str(MAX_STEPS)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE)


def _latest_step(model_dir):
  path = tf.train.latest_checkpoint(str(model_dir))
  return -1 if path is None else int(path.rsplit("-", 1)[1])


def test_sigkill_mid_training_then_resume_matches_uninterrupted(tmp_path):
  model_dir = tmp_path / "killed"
  worker = _start_worker(model_dir)
  deadline = time.time() + 60
  while _latest_step(model_dir) < KILL_AFTER_STEP:
    assert worker.poll() is None, worker.stderr.read().decode()[-3000:]
    assert time.time() < deadline, "no checkpoint written in time"
    time.sleep(0.01)
  worker.send_signal(signal.SIGKILL)
  worker.wait()
  worker.stderr.close()
  assert worker.returncode == -signal.SIGKILL
  killed_at = _latest_step(model_dir)
  assert KILL_AFTER_STEP <= killed_at < MAX_STEPS

  # Every checkpoint the state file lists is complete.
  state = tf.train.get_checkpoint_state(str(model_dir))
  for path in state.all_model_checkpoint_paths:
    reader = tf.train.load_checkpoint(path)
    step = reader.get_tensor("global_step")
    assert step == int(re.search(r"-(\d+)$", path).group(1))
    assert reader.has_tensor("out/kernel")
    assert reader.has_tensor("input_pipeline")

  restarted = _start_worker(model_dir)
  _, stderr = restarted.communicate(timeout=120)
  assert restarted.returncode == 0, stderr.decode()[-3000:]
  assert _latest_step(model_dir) == MAX_STEPS
  assert not glob.glob(str(model_dir / "*_temp*"))

  uninterrupted = toy_model.make_estimator(tmp_path / "whole",
                                           **kill_worker.SETTINGS)
  uninterrupted.train(toy_model.varying_input_fn, max_steps=MAX_STEPS)
  resumed = toy_model.make_estimator(model_dir, **kill_worker.SETTINGS)
  for name in uninterrupted.get_variable_names():
    np.testing.assert_allclose(resumed.get_variable_value(name),
                               uninterrupted.get_variable_value(name),
                               rtol=1e-5, atol=1e-7, err_msg=name)
  assert resumed.evaluate(toy_model.eval_input_fn)["loss"] == (
      uninterrupted.evaluate(toy_model.eval_input_fn)["loss"])
