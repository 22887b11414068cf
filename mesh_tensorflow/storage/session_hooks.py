"""Session hooks that keep master variables and slices in step (compat mode).

In `tf.compat.v1` graph mode each mtf variable has a master variable on the
host, which `tf.compat.v1.train.Saver` checkpoints, and one slice variable
per processor, which training updates. As in the original, a
`MonitoredSession` keeps them consistent with two hooks: `MtfRestoreHook`
copies the masters into the slices once the session exists (after the
initializers or a restore), and `MtfCheckpointSaverListener`, given to a
`CheckpointSaverHook`, copies the slices back into the masters before each
save.

In eager and `tf.function` mode the slices are the only variables and
`tf.train.Checkpoint` saves them directly, so these have nothing to do
there.
"""

from absl import logging
import tensorflow as tf


class MtfCheckpointSaverListener(tf.compat.v1.train.CheckpointSaverListener):
  """Copies the slices to the masters before a checkpoint is saved.

  Args:
    lowering: the mtf.Lowering of the training program.
  """

  def __init__(self, lowering):
    self._op = lowering.copy_slices_to_masters()

  def begin(self):
    logging.info("MtfCheckpointSaverListener: starting.")

  def before_save(self, session, global_step_value):
    del global_step_value
    if self._op is not None:
      session.run(self._op)

  def after_save(self, session, global_step_value):
    del session
    logging.info("MtfCheckpointSaverListener: saved step %s.",
                 global_step_value)

  def end(self, session, global_step_value):
    del session, global_step_value


class MtfRestoreHook(tf.compat.v1.train.SessionRunHook):
  """Copies the masters to the slices when the session is created.

  The copy op is built in `begin` (under the name scope "mtf_restore_hook")
  and run in `after_create_session`, after variables are initialized or
  restored from a checkpoint.

  Args:
    lowering: the mtf.Lowering of the program.
  """

  def __init__(self, lowering):
    self._lowering = lowering
    self._op = None

  def begin(self):
    with tf.name_scope("mtf_restore_hook"):
      self._op = self._lowering.copy_masters_to_slices()

  def after_create_session(self, session, coord):
    del coord
    if self._op is not None:
      session.run(self._op)
