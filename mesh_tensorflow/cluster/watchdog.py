"""Noticing a task that stopped answering while the chief waits on it.

A task that dies closes its connections and the chief's next step fails at
once (see runtime.py). A task that freezes (a stopped process, a machine
that hangs, a network that silently drops packets) keeps its connections
open, and TensorFlow 2.21 waits for it forever: `operation_timeout_in_ms`
does not reach remote eager ops, and its coordination-service heartbeats
did not end the waiting step in a probe. The chief's main thread is then
blocked inside TensorFlow and cannot be interrupted.

So a `Watchdog` thread asks every other task's gRPC server, every
`interval` seconds, to answer an HTTP/2 connection preface: a live server's
gRPC threads answer with their SETTINGS frame even while the task computes,
a frozen process never does (its kernel still accepts the TCP connection,
so a plain connect proves nothing). After `misses` unanswered checks in a
row it reports the task (a ClusterError naming it and its address) to
`on_failure`; the default prints it and ends the process with exit status
1, the only way out of the blocked step. Checkpoints are written atomically,
so the last one stays whole and a restart resumes from it.
"""

import os
import socket
import sys
import threading

from absl import logging

from mesh_tensorflow.cluster import errors
from mesh_tensorflow.cluster import spec as spec_lib

# The HTTP/2 client connection preface and an empty SETTINGS frame.
_HTTP2_PREFACE = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                  b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
EXIT_STATUS = 1


def answers(address, timeout):
  """Whether the gRPC server at `address` ("host:port") answers an HTTP/2
  preface within `timeout` seconds."""
  host, port = spec_lib.split_address(address)
  try:
    with socket.create_connection((host, port), timeout=timeout) as s:
      s.settimeout(timeout)
      s.sendall(_HTTP2_PREFACE)
      return bool(s.recv(9))
  except OSError:
    return False


def exit_with(error):
  """The default `on_failure`: print the error and end the process."""
  message = f"error: {error}"
  logging.error(message)
  print(message, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(EXIT_STATUS)  # pylint: disable=protected-access


class Watchdog:
  """Checks in a background thread that every task in `tasks` answers.

  Args:
    tasks: spec.Task objects to watch (the chief's own is not needed).
    interval: seconds between checks of a task.
    timeout: seconds a check waits for an answer.
    misses: unanswered checks in a row that make a task failed.
    on_failure: fn(ClusterError), called once from the watchdog thread;
      default `exit_with`.

  Use as a context manager, or `start()` / `stop()`.
  """

  def __init__(self, tasks, interval=10.0, timeout=10.0, misses=3,
               on_failure=None):
    if interval <= 0 or timeout <= 0 or misses < 1:
      raise ValueError(
          f"Watchdog: interval ({interval}) and timeout ({timeout}) must be "
          f"positive and misses ({misses}) at least 1.")
    self._tasks = list(tasks)
    self._interval = float(interval)
    self._timeout = float(timeout)
    self._misses = int(misses)
    self._on_failure = on_failure or exit_with
    self._stopped = threading.Event()
    self._thread = None

  def start(self):
    if self._tasks and self._thread is None:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name="mtf-cluster-watchdog")
      self._thread.start()
    return self

  def stop(self):
    """Ends the checks (a check under way finishes in the background and
    reports nothing)."""
    self._stopped.set()
    self._thread = None

  def __enter__(self):
    return self.start()

  def __exit__(self, *unused):
    self.stop()

  def _watch(self):
    missed = {task: 0 for task in self._tasks}
    while not self._stopped.wait(self._interval):
      for task in self._tasks:
        if self._stopped.is_set():
          return
        missed[task] = (0 if answers(task.address, self._timeout)
                        else missed[task] + 1)
        if missed[task] >= self._misses and not self._stopped.is_set():
          self._report(task)
          return

  def _report(self, task):
    waited = self._misses * (self._interval + self._timeout)
    self._on_failure(errors.ClusterError(
        f"Task {task.name} at {task.address} stopped answering ({self._misses}"
        f" checks in a row over about {waited:g} s): its process is frozen "
        f"or its machine or network hangs. Restart it and the chief; "
        f"training resumes from the last checkpoint.", task))
