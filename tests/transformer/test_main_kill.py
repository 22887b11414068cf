"""The binary killed with SIGKILL mid-training, then run again with the same
command, loses nothing beyond its last checkpoint and ends where an
uninterrupted run ends."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from tests.transformer import test_main

TRAIN_STEPS = 40
# float32 masters: with bfloat16 ones (the default), a resumed run restarts
# from values rounded to bfloat16 and so drifts from an uninterrupted run.
SETTINGS = ("utils.get_variable_dtype.master_dtype = 'float32'",
            f"utils.run.train_steps = {TRAIN_STEPS}",
            "utils.run.save_checkpoints_steps = 10",
            "utils.run.iterations_per_loop = 5",
            "utils.run.checkpoint_input_pipeline = True")


def _latest_step(model_dir):
  path = tf.train.latest_checkpoint(str(model_dir))
  return -1 if path is None else int(path.rsplit("-", 1)[1])


def _start(model_dir):
  argv = test_main._argv(model_dir, SETTINGS)  # pylint: disable=protected-access
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=str(test_main.ROOT) + os.pathsep +
             os.environ.get("PYTHONPATH", ""))
  return subprocess.Popen(
      [sys.executable, "-m", "mesh_tensorflow.transformer.main"] + argv[1:],
      cwd=test_main.ROOT, env=env, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE)


def _values(model_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
  dtypes = reader.get_variable_to_dtype_map()
  # Every variable, slot and step; not the input iterator's state (variant).
  return {k: reader.get_tensor(k) for k, dtype in dtypes.items()
          if dtype != tf.variant}


def test_sigkill_then_same_command_ends_like_an_uninterrupted_run(tmp_path):
  killed = tmp_path / "killed"
  worker = _start(killed)
  deadline = time.time() + 240
  while _latest_step(killed) < 10:
    assert worker.poll() is None, worker.stderr.read().decode()[-3000:]
    assert time.time() < deadline, "no checkpoint written in time"
    time.sleep(0.05)
  worker.send_signal(signal.SIGKILL)
  worker.wait()
  worker.stderr.close()
  assert 10 <= _latest_step(killed) < TRAIN_STEPS

  again = _start(killed)
  _, stderr = again.communicate(timeout=300)
  assert again.returncode == 0, stderr.decode()[-3000:]
  assert _latest_step(killed) == TRAIN_STEPS

  whole = tmp_path / "whole"
  test_main.run_main(whole, *SETTINGS)
  resumed, expected = _values(killed), _values(whole)
  assert set(resumed) == set(expected)
  assert "decoder/block_000/layer_000/SelfAttention/k" in expected
  assert "global_step" in expected
  for key, value in expected.items():
    np.testing.assert_allclose(resumed[key], value, rtol=1e-5, atol=1e-6,
                               err_msg=key)
