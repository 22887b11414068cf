"""Bounds the wait of host collectives with one watchdog thread.

TensorFlow's own collective timeout (the `timeout` argument of the V2
collective ops) costs a thread per collective call, sleeping for the whole
timeout (its POSIX `Env::SchedClosureAfter` starts one): a step of a few
dozen collectives under a ten-minute timeout keeps thousands of threads
alive. So the SPMD mesh implementation does not use it by default. Instead
each call that runs collectives (one `SimdMeshImpl.run`, one training loop
of the estimator) holds a deadline here, and one daemon thread per process
aborts the collectives of TensorFlow's eager context when a deadline
passes: the waiting ops then fail with `message`, and later collectives of
the process fail at once (TensorFlow's collectives cannot be resumed after
an abort).
"""

import contextlib
import itertools
import threading
import time

import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import


class _Watchdog:
  """One daemon thread that aborts collectives at the earliest deadline."""

  def __init__(self, abort):
    self._abort = abort
    self._condition = threading.Condition()
    self._deadlines = {}  # token -> (monotonic time, message)
    self._tokens = itertools.count()
    self._thread = None

  def hold(self, seconds, message):
    """Registers a deadline `seconds` from now; returns its token."""
    with self._condition:
      token = next(self._tokens)
      self._deadlines[token] = (time.monotonic() + seconds, message)
      if self._thread is None:
        self._thread = threading.Thread(
            target=self._run, name="mtf-collective-deadline", daemon=True)
        self._thread.start()
      self._condition.notify()
      return token

  def release(self, token):
    with self._condition:
      self._deadlines.pop(token, None)
      self._condition.notify()

  def _run(self):
    while True:
      with self._condition:
        if not self._deadlines:
          self._condition.wait()
          continue
        token, (when, message) = min(self._deadlines.items(),
                                     key=lambda item: item[1][0])
        wait = when - time.monotonic()
        if wait > 0:
          self._condition.wait(wait)
          continue
        del self._deadlines[token]
      self._abort(message)


def _abort_collectives(message):
  context.context().abort_collective_ops(
      tf.errors.DEADLINE_EXCEEDED, message)


_WATCHDOG = _Watchdog(_abort_collectives)


@contextlib.contextmanager
def deadline(seconds, message):
  """Inside, collectives of this process wait at most `seconds` (counted
  from entering): then they are aborted with `message`."""
  token = _WATCHDOG.hold(seconds, message)
  try:
    yield
  finally:
    _WATCHDOG.release(token)
