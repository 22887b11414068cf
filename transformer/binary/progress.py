"""A one-line progress display of training: step, loss, tokens/s, time left.

An estimator training hook (`after_loop(step, loss)`). On a terminal it
rewrites one line in place; otherwise (a log file, CI) it prints a line
at most every `min_interval` seconds and at the end.
"""

import sys
import time


def _clock(seconds):
  seconds = int(max(0, seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f"{hours}:{minutes:02d}:{seconds:02d}"
  return f"{minutes}:{seconds:02d}"


class ProgressDisplay:
  """Prints training progress to `stream` (default stderr).

  `set_run(train_steps, tokens_per_step)` must be called before training
  (utils.run does it) so that the display knows the goal and the step's
  size; steps before the first loop (a resumed run) do not count towards
  the rate.
  """

  def __init__(self, stream=None, min_interval=10.0):
    self._stream = stream or sys.stderr
    self._min_interval = min_interval
    self._train_steps = None
    self._tokens_per_step = 0
    self._start = None
    self._last_print = 0.0
    self.last = None  # (step, loss, tokens/s) of the latest loop.

  def set_run(self, train_steps, tokens_per_step):
    self._train_steps = train_steps
    self._tokens_per_step = tokens_per_step

  def after_loop(self, step, loss):
    """Called by the estimator after each training loop."""
    now = time.time()
    if self._start is None:
      # The first loop includes tracing and lowering; rates start after it.
      self._start = (step, now)
      self.last = (step, loss, None)
      self._print(f"step {step}: loss {loss:.4f} (first loop done; "
                  "compiling is over)", now, force=True)
      return
    first_step, first_time = self._start
    elapsed = max(now - first_time, 1e-9)
    steps_per_second = (step - first_step) / elapsed
    tokens_per_second = steps_per_second * self._tokens_per_step
    self.last = (step, loss, tokens_per_second)
    parts = [f"step {step}"
             + (f"/{self._train_steps}" if self._train_steps else ""),
             f"loss {loss:.4f}", f"{tokens_per_second:,.0f} tokens/s"]
    if self._train_steps and steps_per_second > 0:
      parts.append(
          f"{_clock((self._train_steps - step) / steps_per_second)} left")
    done = self._train_steps is not None and step >= self._train_steps
    self._print("  ".join(parts), now, force=done)
    if done and self._stream.isatty():
      self._stream.write("\n")
      self._stream.flush()

  def _print(self, text, now, force=False):
    if self._stream.isatty():
      self._stream.write("\r" + text.ljust(78))
      self._stream.flush()
      return
    if force or now - self._last_print >= self._min_interval:
      self._stream.write(text + "\n")
      self._stream.flush()
      self._last_print = now
