"""The cluster watchdog against fake servers on loopback: one that answers
like a gRPC server, and one whose kernel accepts connections but whose
process never answers (as a frozen task's)."""

import socket
import threading

import pytest

from mesh_tensorflow import cluster


class _FakeServer:
  """A listening loopback socket; with `answer`, a thread accepts each
  connection and sends 9 bytes back (as a gRPC server's SETTINGS frame)."""

  def __init__(self, answer):
    self._socket = socket.socket()
    self._socket.bind(("localhost", 0))
    self._socket.listen(16)
    self.address = f"localhost:{self._socket.getsockname()[1]}"
    self._connections = []
    if answer:
      threading.Thread(target=self._serve, daemon=True).start()

  def _serve(self):
    while True:
      try:
        connection, _ = self._socket.accept()
      except OSError:
        return
      self._connections.append(connection)
      connection.sendall(b"\x00" * 9)

  def close(self):
    self._socket.close()
    for connection in self._connections:
      connection.close()


@pytest.fixture
def servers():
  made = []
  yield lambda answer: made.append(_FakeServer(answer)) or made[-1]
  for server in made:
    server.close()


def test_answers_tells_a_live_server_from_a_frozen_one(servers):
  assert cluster.watchdog.answers(servers(True).address, timeout=5.0)
  assert not cluster.watchdog.answers(servers(False).address, timeout=0.2)


def test_watchdog_reports_the_task_that_stops_answering(servers):
  live, frozen = servers(True), servers(False)
  tasks = [cluster.Task("worker", 1, live.address),
           cluster.Task("worker", 2, frozen.address)]
  reported = []
  done = threading.Event()

  def on_failure(error):
    reported.append(error)
    done.set()

  with cluster.Watchdog(tasks, interval=0.05, timeout=0.2, misses=2,
                        on_failure=on_failure):
    assert done.wait(30), "the frozen task was never reported"
  assert len(reported) == 1
  error = reported[0]
  assert isinstance(error, cluster.ClusterError)
  assert error.task == tasks[1]
  assert (f"Task /job:worker/task:2 at {frozen.address} stopped answering"
          in str(error))


def test_watchdog_stays_quiet_while_tasks_answer(servers):
  tasks = [cluster.Task("worker", 1, servers(True).address)]
  reported = []
  watchdog = cluster.Watchdog(tasks, interval=0.01, timeout=5.0, misses=1,
                              on_failure=reported.append).start()
  # Enough checks to have noticed a failure (each answers at once).
  threading.Event().wait(0.5)
  watchdog.stop()
  assert not reported


def test_watchdog_settings_are_checked():
  with pytest.raises(ValueError, match="misses"):
    cluster.Watchdog([], misses=0)
