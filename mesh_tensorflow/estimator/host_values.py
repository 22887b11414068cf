"""Host-side values and summaries, with eager execution on or off.

Code around the estimator (the Transformer's evaluation, inference and
vocabularies) reads datasets and small tensors as NumPy and writes
TensorBoard scalars. Eagerly that is `as_numpy_iterator()`, `.numpy()` and a
summary writer; in a TF1-style program (eager execution disabled) each runs
in a tf.compat.v1.Session instead. These helpers do either.
"""

import tensorflow as tf

from mesh_tensorflow.ops import debug


def numpy_iterator(dataset):
  """Yields the elements of `dataset` as NumPy (dataset.as_numpy_iterator()
  when eager; else through an iterator run in a Session of the dataset's
  graph)."""
  if tf.executing_eagerly():
    yield from dataset.as_numpy_iterator()
    return
  graph = dataset._variant_tensor.graph  # pylint: disable=protected-access
  with graph.as_default():
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    element = iterator.get_next()
    init = [iterator.initializer, tf.compat.v1.tables_initializer()]
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(init)
    while True:
      try:
        value = session.run(element)
      except tf.errors.OutOfRangeError:
        return
      yield value


def evaluate(fn, *args):
  """fn(*args)'s tensors (any nest) as NumPy: called eagerly, or in a
  tf.Graph of its own run in a Session."""
  if tf.executing_eagerly():
    return tf.nest.map_structure(
        lambda t: t.numpy() if hasattr(t, "numpy") else t, fn(*args))
  with tf.Graph().as_default() as graph:
    tensors = fn(*args)
    init = tf.compat.v1.tables_initializer()
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(init)
    return session.run(tensors)


def write_scalars(directory, step, scalars):
  """Writes {tag: float} at `step` into `directory`'s event files (eagerly,
  or in a graph and Session of their own)."""
  if tf.executing_eagerly():
    writer = tf.summary.create_file_writer(directory)
    with writer.as_default(step=step):
      for tag, value in scalars.items():
        debug.write_scalar(tag, value)
    writer.flush()
    return
  with tf.Graph().as_default():
    writer = tf.summary.create_file_writer(directory)
    with writer.as_default(step=step):
      for tag, value in scalars.items():
        debug.write_scalar(tag, value)
    with tf.compat.v1.Session() as session:
      session.run(writer.init())
      session.run(tf.compat.v1.summary.all_v2_summary_ops())
      session.run(writer.flush())
