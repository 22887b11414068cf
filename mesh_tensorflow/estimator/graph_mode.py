"""The estimator in a TF1-style program: a tf.Graph run in a Session.

A program that disables eager execution (`tf.compat.v1.disable_v2_behavior()`
or `disable_eager_execution()`, as the original's binaries and most T5-era
scripts did) cannot run the estimator's eager loop. As the original's
TPUEstimator did, each call of `train`, `evaluate`, `predict` or
`export_saved_model` then builds a tf.Graph (mesh implementation, global
step, input iterator, model_fn's program) and runs it in a
`tf.compat.v1.Session`.

What the two modes share (the Estimator decides the mode once per call,
with `tf.executing_eagerly()`): the model_fn calls and training step
(`Estimator._train_step`), the loop driver (checkpoint intervals, saving
listeners, after_loop hooks, log lines, steps/sec), the metric
accumulation, and the checkpoints: the same `checkpoints.Checkpointer`
writes and restores the same keys and files, here with the Session, so a
run of either mode resumes the other's. Summaries go to the same tags and
steps through tf.summary writers in the graph.

Only PlacementMeshImpl meshes run in graph mode (SimdMeshImpl and TPU meshes
need eager execution). Graph-mode exports are TF1 SavedModels with the same
"serving_default" signature.
"""

import tensorflow as tf
from tensorflow.python.ops import summary_ops_v2  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow.estimator import checkpoints
from mesh_tensorflow.estimator import export
from mesh_tensorflow.estimator import host_values
from mesh_tensorflow.estimator import inputs
from mesh_tensorflow.estimator import mesh_impls
from mesh_tensorflow.estimator import metrics as metrics_lib
from mesh_tensorflow.estimator.mode_keys import ModeKeys
from mesh_tensorflow.ops import debug

# This module is the Estimator's graph-mode half: it calls the Estimator's
# internal methods (model_fn calls, programs, restore).
# pylint: disable=protected-access


def check_mesh_impl(config):
  """Raises unless `config`'s mesh implementation runs in graph mode."""
  if config.mesh_impl != "placement":
    raise ValueError(
        f"RunConfig mesh_impl={config.mesh_impl!r} needs eager execution, "
        "which this program disabled (tf.compat.v1.disable_v2_behavior() or "
        "disable_eager_execution()); use mesh_impl='placement' (the "
        "default), or keep eager execution on.")


class _Call:
  """The graph, mesh implementation, global step and Session of one call.

  Build the model under `graph.as_default()`, then `start` makes the
  Session, initialises every variable and restores the checkpoint.
  """

  def __init__(self, est, mode):
    self._est = est
    self._mode = mode
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.mesh_impl = est._make_mesh_impl(mode)
      self.global_step = mesh_impls.new_global_step(self.mesh_impl)
      self.step_value = self.global_step.read_value()
    self.session = None
    self.checkpointer = None

  def start(self, checkpoint_path=None, max_to_keep=5):
    """Session, initialisation and restore (under graph.as_default());
    returns the path restored or None."""
    est = self._est
    self.session = tf.compat.v1.Session(graph=self.graph)
    self.checkpointer = checkpoints.Checkpointer(
        est.model_dir, self.mesh_impl, self.global_step,
        max_to_keep=max_to_keep, session=self.session)
    self.session.run([
        tf.compat.v1.global_variables_initializer(),
        tf.compat.v1.local_variables_initializer(),
        tf.compat.v1.variables_initializer(
            self.mesh_impl.variable_store.tf_variables()),
        tf.compat.v1.tables_initializer(),
        summary_ops_v2.summary_writer_initializer_op()])
    restored = est._restore(self._mode, self.checkpointer, checkpoint_path)
    est._log_start(self._mode, self.mesh_impl, self.step())
    return restored

  def step(self):
    return int(self.session.run(self.step_value))

  def close(self):
    if self.session is not None:
      self.session.close()
      self.session = None


def _iterator(dataset):
  iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
  return iterator, inputs.split_element(iterator.get_next())


class Training:
  """The graph side of Estimator.train (see Estimator._train_loops).

  Builds one training step (model_fn's program, summaries, the step's
  increment) and restores on creation; `loop(n)` runs the step n times in
  the Session and returns the last loss.
  """

  def __init__(self, est, input_fn):
    self._call = _Call(est, ModeKeys.TRAIN)
    self._scalar_ops = {}
    config = est.config
    if config.checkpoint_input_pipeline:
      raise ValueError(
          "RunConfig checkpoint_input_pipeline=True needs eager execution, "
          "which this program disabled; turn the option off (or keep eager "
          "execution on).")
    with self._call.graph.as_default():
      dataset = inputs.call_input_fn(
          input_fn, est._input_params(ModeKeys.TRAIN))
      self._iterator, (features, labels) = _iterator(dataset)
      self._writer = tf.summary.create_file_writer(est.model_dir)
      self._loss, self._increment = est._train_step(
          self._call.mesh_impl, self._call.global_step, self._writer)(
              features, labels)
      self._call.start(max_to_keep=config.keep_checkpoint_max)
    self.checkpointer = self._call.checkpointer
    self.session = self._call.session
    self.start_step = self.step()

  def step(self):
    return self._call.step()

  def begin(self):
    self._call.session.run(self._iterator.initializer)

  def loop(self, n):
    """Runs n steps; returns the last loss."""
    loss = None
    for _ in range(n):
      loss, _ = self._call.session.run([self._loss, self._increment])
    return float(loss)

  def write_scalar(self, name, value, step):
    """Writes one scalar summary (e.g. steps/sec) at `step`."""
    if name not in self._scalar_ops:
      with self._call.graph.as_default():
        value_in = tf.compat.v1.placeholder(tf.float32, [])
        step_in = tf.compat.v1.placeholder(tf.int64, [])
        with self._writer.as_default(step=step_in):
          summary_ops = set(tf.compat.v1.summary.all_v2_summary_ops())
          debug.write_scalar(name, value_in)
          new = [op for op in tf.compat.v1.summary.all_v2_summary_ops()
                 if op not in summary_ops]
        self._scalar_ops[name] = (value_in, step_in, new)
    value_in, step_in, ops = self._scalar_ops[name]
    self._call.session.run(ops, feed_dict={value_in: value, step_in: step})

  def __enter__(self):
    # The driver's saves build their ops in this graph.
    self._scope = self._call.graph.as_default()
    self._scope.__enter__()
    return self

  def __exit__(self, *exc_info):
    try:
      self._call.session.run(self._writer.flush())
      self._call.close()
    finally:
      self._scope.__exit__(*exc_info)


def evaluate(est, input_fn, steps, checkpoint_path, name):
  """Estimator.evaluate in a graph and Session."""
  path = est._require_checkpoint(checkpoint_path)
  call = _Call(est, ModeKeys.EVAL)
  try:
    with call.graph.as_default():
      iterator, (features, labels) = _iterator(
          est._eval_dataset(input_fn, steps))
      reductions = {}
      outputs = est._eval_program(
          call.mesh_impl, call.global_step, reductions)(features, labels)
      call.start(path)
    call.session.run(iterator.initializer)
    accumulator = None
    while True:
      try:
        values = call.session.run(outputs)
      except tf.errors.OutOfRangeError:
        break
      call.checkpointer.after_first_trace()
      if accumulator is None:
        accumulator = metrics_lib.Accumulator(reductions)
      accumulator.add(values)
    results = est._eval_results(accumulator, call.step())
  finally:
    call.close()
  host_values.write_scalars(
      est._eval_dir(name), results["global_step"],
      {k: v for k, v in results.items() if k != "global_step"})
  return results


def predict(est, input_fn, predict_keys, checkpoint_path):
  """Yields the predictions of each batch as NumPy (graph and Session)."""
  path = est._require_checkpoint(checkpoint_path)
  call = _Call(est, ModeKeys.PREDICT)
  try:
    # Not a generator inside graph.as_default(): the graph would stay the
    # caller's default between batches.
    with call.graph.as_default():
      dataset = inputs.call_input_fn(
          input_fn, est._input_params(ModeKeys.PREDICT))
      iterator, (features, _) = _iterator(dataset)
      predictions = est._predict_program(
          call.mesh_impl, call.global_step, predict_keys)(features)
      call.start(path)
    call.session.run(iterator.initializer)
    while True:
      try:
        batch = call.session.run(predictions)
      except tf.errors.OutOfRangeError:
        return
      call.checkpointer.after_first_trace()
      yield batch
  finally:
    call.close()


def export_saved_model(est, export_dir_base, serving_input_receiver_fn,
                       path):
  """Estimator.export_saved_model in a graph and Session: a TF1 SavedModel
  serving on one CPU, signature "serving_default" (one input per receiver
  tensor, by name; the predictions as outputs)."""
  graph = tf.Graph()
  with graph.as_default():
    receiver = serving_input_receiver_fn()
    mesh_impl = mesh_impls.make_serving_mesh_impl()
    global_step = mesh_impls.new_global_step(mesh_impl)
    tensors = {spec.name: tf.compat.v1.placeholder(spec.dtype, spec.shape,
                                                   name=spec.name)
               for spec in receiver.signature()}
    with tf.device("/device:CPU:0"):
      predictions = dict(est._predict_program(
          mesh_impl, global_step, None, layout="")(
              receiver.features_from(tensors)))
      if receiver.postprocess is not None:
        predictions = dict(receiver.postprocess(predictions, tensors))
    # The slices are in no collection; the SavedModel's saver and loaders
    # find global variables.
    known = {id(v) for v in tf.compat.v1.global_variables()}
    for variable in mesh_impl.variable_store.tf_variables():
      if id(variable) not in known:
        tf.compat.v1.add_to_collection(
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, variable)
    with tf.compat.v1.Session(graph=graph) as session:
      checkpointer = checkpoints.Checkpointer(est.model_dir, mesh_impl,
                                              global_step, session=session)
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer(),
                   tf.compat.v1.tables_initializer()])
      checkpointer.restore(path)
      checkpointer.after_first_trace(strict=True)
      signature = tf.compat.v1.saved_model.predict_signature_def(
          tensors, predictions)
      final, temp = export.new_export_dirs(export_dir_base)
      builder = tf.compat.v1.saved_model.Builder(temp)
      builder.add_meta_graph_and_variables(
          session, [tf.compat.v1.saved_model.tag_constants.SERVING],
          signature_def_map={"serving_default": signature},
          main_op=tf.group(tf.compat.v1.local_variables_initializer(),
                           tf.compat.v1.tables_initializer()))
      builder.save()
  tf.io.gfile.rename(temp, final)
  return final.encode()
