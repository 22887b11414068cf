"""The chief's wait for the other tasks says what it waits for, and until
when (as the estimator's wait for checkpoints does)."""

import logging
import socket

from absl import logging as absl_logging
import pytest

from mesh_tensorflow import cluster
from mesh_tensorflow.cluster import runtime


def test_waiting_for_a_task_is_announced_with_its_limit(caplog):
  with socket.socket() as s:  # a port nobody listens on
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  task = cluster.Task("worker", 1, f"localhost:{port}")
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  try:
    with caplog.at_level(logging.INFO), pytest.raises(cluster.ClusterError):
      runtime.wait_for_tasks([task], timeout=0.3)
  finally:
    absl_logging.set_verbosity(verbosity)
  waits = [r.getMessage() for r in caplog.records
           if "does not answer yet" in r.getMessage()]
  assert len(waits) == 1, caplog.text
  assert (f"Task /job:worker/task:1 at localhost:{port} does not answer "
          "yet") in waits[0]
  assert "stopping after 0.3 s (startup_timeout)" in waits[0]
  assert "--task_index=1" in waits[0]
