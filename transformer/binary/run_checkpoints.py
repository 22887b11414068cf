"""Which checkpoints a run reads, and how their variables map to the model's.

Checkpoints are named "model.ckpt-<step>" (as tf.estimator named them), so
the step of a checkpoint is in its path. `get_checkpoint_iterator` turns the
`eval_checkpoint_step` setting of a run into checkpoint paths; the mapping
helpers let a model start from a checkpoint whose variable names differ
(e.g. after inserting layers). Gin names are the original's (`utils.*`).
"""

import os
import re
import time

from absl import logging
import gin
import numpy as np
import tensorflow as tf

_GIN_MODULE = "mesh_tensorflow.transformer.utils"
_STEP = re.compile(r".*model\.ckpt-(\d+)")
_LAYER = re.compile(r"(.*/layer_)(\d+)(/.*)")


def get_step_from_checkpoint_path(checkpoint_path):
  """The global step in a "model.ckpt-<step>" path.

  Raises:
    ValueError: if the path does not name a checkpoint that way.
  """
  match = _STEP.match(str(checkpoint_path))
  if match is None:
    raise ValueError(f"Invalid checkpoint path {checkpoint_path!r}: expected "
                     "a path containing 'model.ckpt-<step>'.")
  return int(match.group(1))


def _checkpoint_steps(model_dir):
  """The steps of the complete checkpoints in model_dir, sorted."""
  steps = set()
  for path in tf.io.gfile.glob(os.path.join(model_dir, "model.ckpt-*.index")):
    steps.add(get_step_from_checkpoint_path(path))
  return sorted(steps)


def _path(model_dir, step):
  return os.path.join(model_dir, f"model.ckpt-{step}")


def _closest(model_dir, step, find_closest):
  steps = _checkpoint_steps(model_dir)
  if not steps:
    raise ValueError(f"No checkpoint files found in {model_dir!r}.")
  if not find_closest:
    if step not in steps:
      raise ValueError(f"No checkpoint of step {step} in {model_dir!r}; it "
                       f"has steps {steps}.")
    return step
  closest = min(steps, key=lambda s: (abs(s - step), s))
  if closest != step:
    logging.info("Using checkpoint at step %d which is closest to requested "
                 "step %d", closest, step)
  return closest


# How often the waiting line repeats, and how often model_dir is listed.
_REPORT_EVERY_SECONDS = 600.0
_POLL_SECONDS = 1.0


def _waiting_line(model_dir, last_path, waited, timeout):
  """One line: what was done, what the wait is for, and how to stop it."""
  done = (f"Done with checkpoint {last_path}" if last_path else
          f"No new checkpoint in {model_dir} yet")
  limit = ("no time limit" if timeout is None else
           f"stopping after {timeout:g} s")
  return (f"{done}. Waiting for new checkpoints in {model_dir} "
          f"(eval_checkpoint_step = None), {waited:.0f} s so far, {limit}. "
          "To process existing checkpoints and exit, set "
          "utils.run.eval_checkpoint_step = \"latest\" (or a step); "
          "utils.get_checkpoint_iterator.timeout = <seconds> bounds the wait.")


def _wait_for_new_checkpoints(model_dir, skip_until, stop_after, timeout):
  """Yields each new checkpoint of model_dir as it appears: forever, until
  one of step >= stop_after, or until `timeout` seconds pass without one.

  While it waits it says so (absl INFO), at once and then every
  _REPORT_EVERY_SECONDS.
  """
  last, last_path = skip_until, None
  while True:
    new = [s for s in _checkpoint_steps(model_dir) if s > last]
    if new:
      last = new[-1]
      last_path = _path(model_dir, last)
      yield last_path
      if stop_after is not None and last >= stop_after:
        return
      continue
    started = time.monotonic()
    next_report = started
    while not new:
      waited = time.monotonic() - started
      if timeout is not None and waited >= timeout:
        logging.info(
            "No new checkpoint in %s for %.0f s "
            "(utils.get_checkpoint_iterator.timeout = %g): done.",
            model_dir, waited, timeout)
        return
      if time.monotonic() >= next_report:
        logging.info(_waiting_line(model_dir, last_path, waited, timeout))
        next_report += _REPORT_EVERY_SECONDS
      pause = _POLL_SECONDS
      if timeout is not None:
        pause = min(pause, max(timeout - waited, 0.0))
      time.sleep(pause)
      new = [s for s in _checkpoint_steps(model_dir) if s > last]


@gin.configurable(module=_GIN_MODULE)
def get_checkpoint_iterator(checkpoint_step, model_dir, skip_until=0,
                            stop_after=None, find_closest=True, timeout=None):
  """The checkpoint paths a run's `eval_checkpoint_step` asks for.

  Args:
    checkpoint_step: an integer (the checkpoint of the closest step), a list
      of integers (each one's closest, once each, in step order), "all"
      (every checkpoint in model_dir from the oldest), "latest" (the newest
      one) or None (wait for each new checkpoint, as continuous evaluation
      does).
    model_dir: the directory of the checkpoints.
    skip_until: for "all" and None, skip checkpoints of steps <= this.
    stop_after: for None, stop after the first checkpoint of a step >= this
      (default: never stop).
    find_closest: if False, a requested step must exist exactly.
    timeout: for None, stop once this many seconds pass without a new
      checkpoint (default: wait for ever, as the original). While waiting,
      a line at INFO says so, how long it has waited and how to stop.

  Returns:
    an iterable of checkpoint paths.

  Raises:
    ValueError: if model_dir has no checkpoint for an integer request.
  """
  if checkpoint_step == "all":
    return [_path(model_dir, s) for s in _checkpoint_steps(model_dir)
            if s > skip_until]
  if checkpoint_step == "latest":
    steps = _checkpoint_steps(model_dir)
    if not steps:
      raise ValueError(f"No checkpoint files found in {model_dir!r}.")
    return [_path(model_dir, steps[-1])]
  if checkpoint_step is None:
    return _wait_for_new_checkpoints(model_dir, skip_until, stop_after,
                                     timeout)
  if isinstance(checkpoint_step, (int, np.integer)):
    return [_path(model_dir, _closest(model_dir, int(checkpoint_step),
                                      find_closest))]
  steps = sorted({_closest(model_dir, int(s), find_closest)
                  for s in checkpoint_step})
  return [_path(model_dir, s) for s in steps]


@gin.configurable(module=_GIN_MODULE)
def init_checkpoint_variable_mapping(name, mapping_fn=None):
  """The checkpoint name of the model's variable `name` (for
  init_checkpoint): mapping_fn(name), or the name itself."""
  if mapping_fn:
    return mapping_fn(name)
  return name


@gin.configurable(module=_GIN_MODULE)
def should_load_variable(name, filter_fn=None):
  """Whether init_checkpoint loads variable `name`: filter_fn(name), or
  True."""
  if filter_fn:
    return filter_fn(name)
  return True


@gin.configurable(module=_GIN_MODULE)
def flexible_ckpt_init_mapping(ckpt_path="", new_layers=None,
                               return_mapping_fn=True):
  """Maps variables to a checkpoint trained before layers were inserted.

  `new_layers` are the indices (within each block) of layers added to the
  model; a variable of layer k then comes from layer k - (number of new
  layers before k) of the checkpoint, and variables of the new layers are
  not loaded. With return_mapping_fn a function name -> checkpoint name (or
  None for a new layer's variable), else the dict of the checkpoint's
  (`ckpt_path`) names that map.
  """
  new_layers = sorted(set(new_layers or ()))

  def mapping(name):
    match = _LAYER.match(name)
    if match is None or not new_layers:
      return name
    index = int(match.group(2))
    if index in new_layers:
      return None
    old = index - sum(1 for n in new_layers if n < index)
    width = len(match.group(2))
    return f"{match.group(1)}{old:0{width}d}{match.group(3)}"

  if return_mapping_fn:
    return mapping
  if not ckpt_path:
    raise ValueError("flexible_ckpt_init_mapping: return_mapping_fn=False "
                     "needs ckpt_path.")
  names = [n for n, _ in tf.train.list_variables(ckpt_path)]
  inverse = {}
  for name in names:
    match = _LAYER.match(name)
    if match is None:
      inverse[name] = name
      continue
    old = int(match.group(2))
    new = old
    for n in new_layers:
      if n <= new:
        new += 1
    width = len(match.group(2))
    inverse[f"{match.group(1)}{new:0{width}d}{match.group(3)}"] = name
  return inverse
