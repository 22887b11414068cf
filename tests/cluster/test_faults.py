"""Faults of a 2-task cluster: a task killed mid-training (the chief fails with an error naming it, not a hang), a
restart that resumes from the last checkpoint with nothing lost, and a task frozen mid-training (the watchdog ends
the chief with an error naming it)."""

import signal
import time

import numpy as np
import tensorflow as tf

from tests.cluster import cluster_testing
from tests.cluster import mlp

KILL_AFTER_STEP = 10  # the latest checkpoint's step (one every 5 steps)
MAX_STEPS = 100000  # never reached: the run is killed first
MORE_STEPS = 10  # after the restart
CHIEF = "tests.cluster.mlp_chief"


def _latest_step(model_dir):
  path = tf.train.latest_checkpoint(str(model_dir))
  return 0 if path is None else int(path.rsplit("-", 1)[1])


def _wait_for_checkpoint(cluster, chief, model_dir, step):
  """Waits until the running chief has written checkpoint `step`."""
  deadline = time.monotonic() + cluster_testing.CHIEF_TIMEOUT
  while _latest_step(model_dir) < step:
    assert chief.poll() is None, cluster.output(chief)[1][-3000:]
    assert time.monotonic() < deadline, "no checkpoint in time"
    time.sleep(0.05)


def test_killed_task_fails_the_chief_then_restart_resumes(tmp_path):
  model_dir = tmp_path / "model"
  with cluster_testing.LocalCluster(2) as cluster:
    server = cluster.start_server(1)
    chief = cluster.start_chief(CHIEF, model_dir, MAX_STEPS)
    _wait_for_checkpoint(cluster, chief, model_dir, KILL_AFTER_STEP)
    server.send_signal(signal.SIGKILL)
    rc, out, err = cluster.wait(chief)
    assert rc == 3, err[-3000:]
    assert (f"Task /job:worker/task:1 at {cluster.hosts[1]} failed or is "
            f"unreachable" in err), err[-3000:]
    ran = max(cluster_testing.losses(out))
    resumed_from = _latest_step(model_dir)
    assert KILL_AFTER_STEP <= resumed_from <= ran < MAX_STEPS

    # Restart the whole cluster on the same addresses.
    cluster.start_server(1)
    rc, out, err = cluster.run_chief(CHIEF, model_dir,
                                     resumed_from + MORE_STEPS)
    assert rc == 0, err[-3000:]
    assert min(cluster_testing.losses(out)) == resumed_from + 1

  # The same end as an uninterrupted run (on one process).
  reference_dir = tmp_path / "reference"
  mlp.train(mlp.make_estimator(reference_dir), resumed_from + MORE_STEPS)
  final, reference = mlp.variables(model_dir), mlp.variables(reference_dir)
  assert sorted(final) == sorted(reference)
  for name in final:
    np.testing.assert_allclose(final[name], reference[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_frozen_task_ends_the_chief_with_an_error_naming_it(tmp_path):
  model_dir = tmp_path / "model"
  with cluster_testing.LocalCluster(2) as cluster:
    server = cluster.start_server(1)
    chief = cluster.start_chief(CHIEF, model_dir, MAX_STEPS)
    _wait_for_checkpoint(cluster, chief, model_dir, KILL_AFTER_STEP)
    # The process stops; its kernel keeps its connections open.
    server.send_signal(signal.SIGSTOP)
    try:
      rc, _, err = cluster.wait(chief)
    finally:
      server.send_signal(signal.SIGCONT)
    assert rc == 1, err[-3000:]
    assert (f"error: Task /job:worker/task:1 at {cluster.hosts[1]} stopped "
            f"answering" in err), err[-3000:]
  assert _latest_step(model_dir) >= KILL_AFTER_STEP
