"""TF's global step: the one training-step counter of an mtf program.

As in the original, there is one step, TensorFlow's int64 global step
(`tf.compat.v1.train.get_or_create_global_step()`). Optimizers and
learning-rate schedules read it; whoever runs the training loop increments
it (the estimator, or the user's model function with
`tf.compat.v1.assign_add(global_step, 1)`). Nothing in mtf creates a step
of its own, so a checkpoint holds it once, under "global_step".

Where the step lives, by mode:

- `tf.compat.v1` graph mode: in the graph, as in TF1.
- eager: TF keeps one step per process (in the global graph's GLOBAL_STEP
  collection); a `tf.function` traced from eager code sees it too.
- a training loop with a step of its own (the estimator, or a test) makes
  its variable TF's global step while it traces or builds the model with
  `global_step_scope(step)`, so `tf.compat.v1.train.get_or_create_global_step()`
  returns that variable there rather than creating one.

`mtf_global_step(mesh)` imports the step into an mtf graph as a fully
replicated int64 scalar, read once per mesh.
"""

import contextlib
import weakref

import tensorflow as tf

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import constants

GLOBAL_STEP = tf.compat.v1.GraphKeys.GLOBAL_STEP

# mtf Mesh -> its import of the step (one read per mesh of a graph).
_IMPORTED = weakref.WeakKeyDictionary()


def _check_step(step):
  if not isinstance(step, tf.Variable) or not step.dtype.is_integer or (
      step.shape.rank != 0):
    raise ValueError(
        "The global step must be an integer scalar tf.Variable (e.g. "
        "tf.Variable(0, dtype=tf.int64, trainable=False)), got "
        f"{step!r}.")


@contextlib.contextmanager
def global_step_scope(step):
  """Makes `step` TF's global step of the current graph while inside.

  In a function being traced (or a `tf.compat.v1` graph), within the scope
  `tf.compat.v1.train.get_global_step()` and
  `tf.compat.v1.train.get_or_create_global_step()` return `step`, and so
  do the optimizers' and schedules' reads of the step; functions traced
  inside the scope see it too. The graph's previous global step is back
  after the scope.

  Args:
    step: an integer scalar tf.Variable (the training loop's step).

  Yields:
    step.
  """
  _check_step(step)
  collection = tf.compat.v1.get_default_graph().get_collection_ref(
      GLOBAL_STEP)
  previous = list(collection)
  collection[:] = [step]
  try:
    yield step
  finally:
    collection[:] = previous


def get_or_create_tf_global_step():
  """TF's global step of the current context, created if there is none.

  `tf.compat.v1.train.get_or_create_global_step()`, except that inside a
  function being traced a missing step is created outside the function (in
  eager code, once per process) rather than once per trace.
  """
  step = tf.compat.v1.train.get_global_step()
  if step is not None:
    return step
  with tf.init_scope():
    return tf.compat.v1.train.get_or_create_global_step()


def mtf_global_step(mesh):
  """TF's global step as an mtf int64 scalar on `mesh` (fully replicated).

  The step is read once per mesh: every rate of one training step sees the
  same value.
  """
  imported = _IMPORTED.get(mesh)
  if imported is None:
    step = get_or_create_tf_global_step()
    value = tf.cast(step.read_value() if isinstance(step, tf.Variable)
                    else step, tf.int64)
    imported = constants.import_fully_replicated(
        mesh, value, shape_lib.Shape([]), name="global_step")
    _IMPORTED[mesh] = imported
  return imported
