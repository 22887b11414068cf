"""Log lines, steps/sec and loss summaries at the end of each training loop."""

import time

from absl import logging


def _crossed(previous, current, every):
  """Whether a multiple of `every` lies in (previous, current]."""
  return bool(every) and current // every > previous // every


class StepLogger:
  """Logs "loss = ..., step = ... (... sec)" and "global_step/sec: ..."
  every `log_every` steps, and writes steps/sec to TensorBoard every
  `summary_every` steps, with `write_scalar(name, value, step)` (None: no
  summaries; each estimator mode writes its own way).

  The training step writes the loss every `summary_every` steps. A loop
  holding no such step writes its last loss here if it is the first or the
  last loop of the run, so that TensorBoard shows a run shorter than
  `summary_every` (a short fine-tuning) and the last, partial loop of a run,
  as the original did.
  """

  def __init__(self, write_scalar, start_step, log_every, summary_every):
    self._write_scalar = write_scalar
    self._log_every = log_every
    self._summary_every = summary_every
    self._last_step = start_step
    self._last_log = (start_step, time.time())
    self._last_summary = (start_step, time.time())
    self._first_loop = True

  def after_loop(self, step, loss, last_loop=False):
    """Called after the loop that brought the global step to `step`, whose
    last loss is `loss`; `last_loop`: no loop follows in this run."""
    now = time.time()
    summarized = _crossed(self._last_step, step, self._summary_every)
    if (self._write_scalar is not None and self._summary_every and
        not summarized and (self._first_loop or last_loop)):
      self._write_scalar("loss", loss, step)
    self._first_loop = False
    if _crossed(self._last_step, step, self._log_every):
      logged_step, logged_time = self._last_log
      elapsed = max(now - logged_time, 1e-9)
      logging.info("loss = %g, step = %d (%.3f sec)", loss, step, elapsed)
      logging.info("global_step/sec: %g", (step - logged_step) / elapsed)
      self._last_log = (step, now)
    if self._write_scalar is not None and _crossed(
        self._last_step, step, self._summary_every):
      summary_step, summary_time = self._last_summary
      rate = (step - summary_step) / max(now - summary_time, 1e-9)
      self._write_scalar("global_step/sec", rate, step)
      self._last_summary = (step, now)
    self._last_step = step
