"""Estimator: train, evaluate, predict and export an mtf model function.

The model function `model_fn(features, labels, mode, params)` builds an mtf
graph, lowers it onto `params["mesh_impl"]` (the mesh implementation the
estimator made from its RunConfig) and returns an EstimatorSpec of the
lowered TF tensors. Every call of train, evaluate or predict makes a fresh
mesh implementation and restores the latest checkpoint into it, as
tf.estimator rebuilt its graph, so each call sees what the checkpoints hold.
Checkpoints of the original library (TF1 name-based, e.g. T5's) restore too
(see checkpoints.py). While model_dir has no checkpoint, `train` starts from
RunConfig's `init_checkpoint` (variables and global step, optionally only
those `init_variable_filter` matches); evaluate, predict and export need a
checkpoint in model_dir or `checkpoint_path`.

`evaluate` accumulates `metrics.mean` / `sum` / `max` over the whole
evaluation set and averages the loss and plain-tensor metrics over the
batches.

Training runs `iterations_per_loop` steps per call of one compiled
tf.function. The estimator owns the one training step, an int64 variable
checkpointed once, under "global_step", and increments it after each step.
model_fn sees it as `params["global_step"]` and, while the estimator calls
it, as TF's global step (`tf.compat.v1.train.get_or_create_global_step()`),
which is also what the optimizers' learning-rate schedules read.

The mesh implementation is a PlacementMeshImpl, a SimdMeshImpl with host
collectives, or (mesh_impl "tpu") a SimdMeshImpl with TPU collectives
whose steps run through a TPUStrategy, made once per estimator; the loop is
the same for all three (see mesh_impls.mesh_runner).

In a TF1-style program (eager execution disabled) each call builds a
tf.Graph and runs it in a Session instead (graph_mode.py; placement meshes
only). Each public method decides the mode once, with
`tf.executing_eagerly()`; the model_fn calls, the training step, the loop
driver, metrics and checkpoints are shared, so both modes write the same
checkpoints and summaries and resume each other's runs.
"""

import inspect
import tempfile

from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow.storage import checkpointing
from mesh_tensorflow import global_step as global_step_lib
from mesh_tensorflow.estimator import checkpoints
from mesh_tensorflow.estimator import estimator_spec
from mesh_tensorflow.estimator import export
from mesh_tensorflow.estimator import graph_mode
from mesh_tensorflow.estimator import host_values
from mesh_tensorflow.estimator import inputs
from mesh_tensorflow.estimator import mesh_impls
from mesh_tensorflow.estimator import metrics as metrics_lib
from mesh_tensorflow.estimator import run_config as run_config_lib
from mesh_tensorflow.estimator import step_logger
from mesh_tensorflow.estimator.mode_keys import ModeKeys
from mesh_tensorflow.ops import debug


class Estimator:
  """tf.estimator.Estimator for mtf model functions, on TF2.

  Args:
    model_fn: (features, labels, mode, params[, config]) -> EstimatorSpec.
    model_dir: checkpoints and summaries (default: config.model_dir, else
      a new temp directory).
    config: a RunConfig (mesh shape, layout, mesh implementation,
      intervals).
    params: dict passed to model_fn and input_fn, with "mesh_impl",
      "mesh_shape", "layout" and "global_step" (the training step, an int64
      tf.Variable; also TF's global step while model_fn runs) added for
      model_fn.
  """

  def __init__(self, model_fn, model_dir=None, config=None, params=None):
    config = config or run_config_lib.RunConfig()
    if model_dir and config.model_dir and model_dir != config.model_dir:
      raise ValueError(f"model_dir {model_dir!r} differs from "
                       f"config.model_dir {config.model_dir!r}.")
    model_dir = model_dir or config.model_dir or tempfile.mkdtemp()
    self._config = config.replace(model_dir=model_dir)
    self._model_fn = model_fn
    self._params = dict(params or {})
    self._tpu = None  # (strategy, logical_to_physical), made on first use.

  @property
  def model_dir(self):
    return self._config.model_dir

  @property
  def config(self):
    return self._config

  @property
  def params(self):
    return dict(self._params)

  # ------------------------------------------------------------ checkpoints

  def latest_checkpoint(self):
    """Path of the newest complete checkpoint, or None."""
    return checkpoints.latest_checkpoint(self.model_dir)

  def get_variable_names(self):
    """Names of the checkpoint's mtf variables, plus "global_step"."""
    return sorted(self._checkpoint_values())

  def get_variable_value(self, name):
    """A variable's value in the latest checkpoint, as a NumPy array.

    "global_step" is the estimator's step; other names are mtf names.
    """
    values = self._checkpoint_values()
    if name not in values:
      raise ValueError(f"Variable {name!r} is not in checkpoint "
                       f"{self.latest_checkpoint()}; it has {sorted(values)}.")
    return values[name]

  def _checkpoint_values(self):
    """{mtf name: value} of the latest checkpoint (either format), plus
    "global_step"."""
    reader = checkpoints.open_checkpoint(self._require_checkpoint())
    values = {name: reader.get_tensor(key) for name, key in
              checkpointing.variable_keys(reader).items()
              if name not in checkpoints.NON_VARIABLE_KEYS}
    key = checkpoints.step_key(reader)
    if key is not None:
      values["global_step"] = reader.get_tensor(key)
    return values

  def _require_checkpoint(self, path=None):
    path = path or self.latest_checkpoint()
    if path is None:
      raise ValueError(f"Could not find a trained model in model_dir "
                       f"{self.model_dir!r}: train first.")
    return path

  # ---------------------------------------------------------- model_fn calls

  def _input_params(self, mode):
    del mode
    return dict(self._params)

  def _model_params(self, mesh_impl, mode, layout, global_step):
    params = self._input_params(mode)
    params.update(mesh_impl=mesh_impl, mesh_shape=mesh_impl.shape.to_string,
                  layout=layout, global_step=global_step)
    return params

  def _call_model_fn(self, features, labels, mode, mesh_impl, global_step,
                     layout=None):
    """model_fn's EstimatorSpec; `global_step` is TF's global step while
    model_fn runs (in the graph being traced)."""
    kwargs = {}
    parameters = inspect.signature(self._model_fn).parameters
    if "labels" in parameters:
      kwargs["labels"] = labels
    if "mode" in parameters:
      kwargs["mode"] = mode
    if "params" in parameters:
      kwargs["params"] = self._model_params(
          mesh_impl, mode, self._config.layout if layout is None else layout,
          global_step)
    if "config" in parameters:
      kwargs["config"] = self._config
    with global_step_lib.global_step_scope(global_step):
      spec = self._model_fn(features=features, **kwargs)
    if not isinstance(spec, estimator_spec.EstimatorSpec):
      raise TypeError(f"model_fn must return an EstimatorSpec, got {spec!r}.")
    if spec.mode != mode:
      raise ValueError(f"model_fn returned an EstimatorSpec for mode "
                       f"{spec.mode!r} when called with mode {mode!r}.")
    return spec

  def _mesh_config(self, mode):
    """The RunConfig whose mesh implementation runs `mode`."""
    del mode
    return self._config

  def _make_mesh_impl(self, mode):
    """The mesh implementation of a call in `mode` (after seeding TF)."""
    if self._config.tf_random_seed is not None:
      tf.random.set_seed(self._config.tf_random_seed)
    config = self._mesh_config(mode)
    if not tf.executing_eagerly():
      graph_mode.check_mesh_impl(config)
    if config.mesh_impl == "tpu" and self._tpu is None:
      self._tpu = mesh_impls.tpu_strategy(config)
    return mesh_impls.make_mesh_impl(config, self._tpu)

  def _restore(self, mode, checkpointer, checkpoint_path):
    """Restores `checkpoint_path` (default: the latest checkpoint), else
    warm-starts training from init_checkpoint; returns the path restored
    or None."""
    restored = checkpointer.restore(checkpoint_path)
    if (restored is None and mode == ModeKeys.TRAIN and
        self._config.init_checkpoint):
      checkpointer.warm_start(self._config.init_checkpoint,
                              self._config.init_variable_filter)
    return restored

  def _log_start(self, mode, mesh_impl, step):
    logging.info("Estimator %s: mesh %s, layout %r, %s, global step %d",
                 mode, mesh_impl.shape.to_string, self._config.layout,
                 type(mesh_impl).__name__, step)

  def _start(self, mode, checkpoint_path=None, require_checkpoint=False):
    """(mesh_impl, global_step, checkpointer, restored path) of an eager
    call."""
    if require_checkpoint:
      checkpoint_path = self._require_checkpoint(checkpoint_path)
    mesh_impl = self._make_mesh_impl(mode)
    global_step = mesh_impls.new_global_step(mesh_impl)
    checkpointer = checkpoints.Checkpointer(
        self.model_dir, mesh_impl, global_step,
        max_to_keep=self._config.keep_checkpoint_max)
    restored = self._restore(mode, checkpointer, checkpoint_path)
    self._log_start(mode, mesh_impl, int(global_step.numpy()))
    return mesh_impl, global_step, checkpointer, restored

  # ------------------------------------------------------------------ train

  def train(self, input_fn, hooks=None, steps=None, max_steps=None,
            saving_listeners=None):
    """Trains for `steps` more steps, or up to global step `max_steps`, or
    until input_fn's data ends; resumes from the latest checkpoint (either
    format), else warm-starts from RunConfig's init_checkpoint, if any.

    Runs eagerly (a tf.function per loop), or, with eager execution
    disabled (a TF1-style program), in a tf.Graph and a Session (see
    graph_mode); either resumes the other's checkpoints.

    saving_listeners get tf.estimator's CheckpointSaverListener calls
    (begin, before_save, after_save, end; the session argument is the
    graph mode's Session, None when eager); an
    after_save returning True stops training. Of `hooks`, those with an
    `after_loop(step, loss)` method are called after each training loop
    (e.g. a progress display); SessionRunHooks are ignored, with a warning.
    """
    loop_hooks = [h for h in hooks or () if hasattr(h, "after_loop")]
    ignored = [h for h in hooks or () if not hasattr(h, "after_loop")]
    if ignored:
      logging.warning("Estimator.train ignores hooks without after_loop "
                      "(SessionRunHooks): %s", ignored)
    if steps is not None and max_steps is not None:
      raise ValueError("Give steps or max_steps, not both.")
    for name, value in (("steps", steps), ("max_steps", max_steps)):
      if value is not None and value <= 0:
        raise ValueError(f"{name} must be positive, got {value}.")
    if tf.executing_eagerly():
      run = _EagerTraining(self, input_fn)
    else:
      run = graph_mode.Training(self, input_fn)
    with run:
      self._train_loops(run, loop_hooks, steps, max_steps,
                        list(saving_listeners or []))
    return self

  def _train_loops(self, run, loop_hooks, steps, max_steps, listeners):
    """Runs loops of iterations_per_loop steps, logging, summarizing and
    saving after each, as either mode's `run` does them."""
    start = run.start_step
    last = start + steps if steps is not None else max_steps
    if last is not None and start >= last:
      logging.info("Skipping training: global step %d >= max_steps %d.",
                   start, last)
      return
    run.begin()
    for listener in listeners:
      listener.begin()

    def save(step):
      """Saves; True if a listener asks to stop."""
      for listener in listeners:
        listener.before_save(run.session, step)
      run.checkpointer.save(step)
      return any([bool(listener.after_save(run.session, step))
                  for listener in listeners])

    logger = step_logger.StepLogger(run.write_scalar, start,
                                    self._config.log_step_count_steps,
                                    self._config.save_summary_steps)
    every = self._config.save_checkpoints_steps
    step = saved = start
    loss = None
    while last is None or step < last:
      n = self._config.iterations_per_loop
      if last is not None:
        n = min(n, last - step)
      try:
        loss = run.loop(n)
      except tf.errors.OutOfRangeError:
        run.checkpointer.after_first_trace()
        step = run.step()
        break
      run.checkpointer.after_first_trace()
      step = run.step()
      if not np.isfinite(loss):
        raise FloatingPointError(f"Loss is {loss} at step {step}.")
      logger.after_loop(step, loss,
                        last_loop=last is not None and step >= last)
      for hook in loop_hooks:
        hook.after_loop(step, loss)
      if every and step // every > saved // every:
        saved = step
        if save(step):
          logging.info("A saving listener stopped training at step %d.",
                       step)
          break
    if step != saved or self.latest_checkpoint() is None:
      save(step)
    for listener in listeners:
      listener.end(run.session, step)
    logging.info("Loss for final step: %s.", loss)

  def _train_step(self, mesh_impl, global_step, writer):
    """step(features, labels) -> (loss, increment): one training step.

    model_fn's program runs; its mtf scalar summaries (or its host call)
    and the loss are written under `writer` every save_summary_steps
    steps; `increment` adds 1 to the global step after all that. In a
    tf.function every stateful op runs anyway; in graph mode `increment`
    depends on model_fn's train_op and the summary ops, so running it runs
    the whole step.
    """
    host_call_fns = []
    train_ops = []
    # Made eagerly for a tf.function (which runs every stateful op), or in
    # graph mode, where `increment` must depend on them.
    graph = not tf.executing_eagerly()

    def model_program(features, labels):
      # Summaries come out of the program and are written by the step: a
      # SimdMeshImpl program runs once per device and cannot share a writer.
      # So do a host call's tensors.
      with debug.collect_scalar_summaries() as summaries:
        spec = self._call_model_fn(features, labels, ModeKeys.TRAIN,
                                   mesh_impl, global_step)
      host_args = []
      if spec.host_call is not None:
        host_call_fns[:] = [spec.host_call[0]]
        host_args = spec.host_call[1]
        summaries = {}  # The host call writes them.
      if graph and spec.train_op is not None:
        train_ops[:] = [spec.train_op]
      return tf.cast(spec.loss, tf.float32), summaries, host_args

    run = mesh_impls.mesh_runner(mesh_impl, model_program)
    every = self._config.save_summary_steps

    def train_step(features, labels):
      step = global_step.read_value() + 1
      record = tf.equal(step % every, 0) if every else tf.constant(False)
      loss, summaries, host_args = run(features, labels)
      with writer.as_default(step=step), tf.summary.record_if(record):
        debug.write_scalar("loss", loss)
        for name, value in summaries.items():
          debug.write_scalar(name, value)
        if host_call_fns:
          if isinstance(host_args, dict):
            host_call_fns[0](**host_args)
          else:
            host_call_fns[0](*host_args)
      done = [loss]
      if graph:
        done += train_ops + tf.compat.v1.summary.all_v2_summary_ops()
      with tf.control_dependencies(done):
        increment = global_step.assign_add(1, read_value=False)
      return loss, increment

    return train_step

  # --------------------------------------------------------------- evaluate

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None,
               name=None):
    """Loss and metrics over `steps` batches (or all of input_fn's);
    returns them with "global_step".

    The loss and plain-tensor metrics are the mean of their per-batch
    values; `metrics.mean`, `metrics.sum` and `metrics.max` are accumulated
    over every example (see mesh_tensorflow.estimator.metrics). Eager, or
    in a graph and Session with eager execution disabled.
    """
    del hooks
    if not tf.executing_eagerly():
      return graph_mode.evaluate(self, input_fn, steps, checkpoint_path,
                                 name)
    mesh_impl, global_step, checkpointer, _ = self._start(
        ModeKeys.EVAL, checkpoint_path, require_checkpoint=True)
    reductions = {}
    run = mesh_impls.mesh_runner(
        mesh_impl, self._eval_program(mesh_impl, global_step, reductions))
    eval_step = tf.function(run, autograph=False)
    dataset = self._eval_dataset(input_fn, steps)
    accumulator = None
    for element in dataset:
      with mesh_impls.collective_errors(mesh_impl):
        outputs = eval_step(*inputs.split_element(element))
      checkpointer.after_first_trace()
      if accumulator is None:
        accumulator = metrics_lib.Accumulator(reductions)
      accumulator.add(tf.nest.map_structure(lambda t: t.numpy(), outputs))
    results = self._eval_results(accumulator, int(global_step.numpy()))
    host_values.write_scalars(
        self._eval_dir(name), results["global_step"],
        {k: v for k, v in results.items() if k != "global_step"})
    return results

  def _eval_program(self, mesh_impl, global_step, reductions):
    """model_program(features, labels) -> the batch's loss and metric
    outputs; fills `reductions` (see metrics.batch_outputs)."""

    def model_program(features, labels):
      spec = self._call_model_fn(features, labels, ModeKeys.EVAL, mesh_impl,
                                 global_step)
      ops = {"loss": spec.loss}
      ops.update(spec.eval_metric_ops)
      outputs, kinds = metrics_lib.batch_outputs(ops)
      reductions.update(kinds)
      return outputs

    return model_program

  def _eval_dataset(self, input_fn, steps):
    dataset = inputs.call_input_fn(
        input_fn, self._input_params(ModeKeys.EVAL))
    if steps is not None:
      dataset = dataset.take(steps)
    return dataset

  def _eval_dir(self, name):
    return f"{self.model_dir}/eval" + (f"_{name}" if name else "")

  def _eval_results(self, accumulator, global_step):
    """The results dict of an evaluation (raises if there was no batch)."""
    if accumulator is None:
      raise ValueError("evaluate: input_fn gave no batches.")
    results = accumulator.results()
    results["global_step"] = global_step
    logging.info("Saving dict for global step %d: %s", global_step, results)
    return results

  # ---------------------------------------------------------------- predict

  def predict(self, input_fn, predict_keys=None, hooks=None,
              checkpoint_path=None, yield_single_examples=True):
    """Yields the predictions of each example (or batch) as NumPy (eager,
    or in a graph and Session with eager execution disabled)."""
    del hooks
    if not tf.executing_eagerly():
      batches = graph_mode.predict(self, input_fn, predict_keys,
                                   checkpoint_path)
    else:
      batches = self._eager_predict(input_fn, predict_keys, checkpoint_path)
    for batch in batches:
      if not yield_single_examples:
        yield batch
        continue
      sizes = {v.shape[0] for v in batch.values()}
      if len(sizes) != 1:
        raise ValueError("predict: predictions have different batch sizes "
                         f"{sizes}; use yield_single_examples=False.")
      for i in range(sizes.pop()):
        yield {k: v[i] for k, v in batch.items()}

  def _eager_predict(self, input_fn, predict_keys, checkpoint_path):
    """Yields the predictions of each batch as NumPy."""
    mesh_impl, global_step, checkpointer, _ = self._start(
        ModeKeys.PREDICT, checkpoint_path, require_checkpoint=True)
    predict_step = tf.function(
        mesh_impls.mesh_runner(mesh_impl, self._predict_program(
            mesh_impl, global_step, predict_keys)), autograph=False)
    dataset = inputs.call_input_fn(
        input_fn, self._input_params(ModeKeys.PREDICT))
    for element in dataset:
      features, _ = inputs.split_element(element)
      with mesh_impls.collective_errors(mesh_impl):
        batch = {k: v.numpy() for k, v in predict_step(features).items()}
      checkpointer.after_first_trace()
      yield batch

  def _predict_program(self, mesh_impl, global_step, predict_keys,
                       layout=None):
    """model_program(features) -> the dict of predictions."""

    def model_program(features):
      spec = self._call_model_fn(features, None, ModeKeys.PREDICT, mesh_impl,
                                 global_step, layout=layout)
      predictions = spec.predictions
      if predict_keys is not None:
        predictions = {k: predictions[k] for k in predict_keys}
      return predictions

    return model_program

  # ----------------------------------------------------------------- export

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                         assets_extra=None, as_text=False,
                         checkpoint_path=None):
    """Exports the model in PREDICT mode on one processor (/CPU:0).

    Checkpoints hold variables whole, so whatever mesh trained the model
    the export serves on a single device. Returns the export directory.
    With eager execution disabled the SavedModel is built from a graph and
    Session (a TF1 SavedModel with the same "serving_default" signature).
    """
    del assets_extra, as_text
    path = self._require_checkpoint(checkpoint_path)
    if not tf.executing_eagerly():
      result = graph_mode.export_saved_model(
          self, export_dir_base, serving_input_receiver_fn, path)
      logging.info("Exported SavedModel from %s to %s", path, result)
      return result
    receiver = serving_input_receiver_fn()
    mesh_impl = mesh_impls.make_serving_mesh_impl()
    global_step = mesh_impls.new_global_step(mesh_impl)
    checkpointer = checkpoints.Checkpointer(self.model_dir, mesh_impl,
                                            global_step)
    checkpointer.restore(path)
    predict_fn = self._predict_program(mesh_impl, global_step, None,
                                       layout="")
    with tf.device("/device:CPU:0"):
      result = export.save_serving_model(
          export_dir_base, predict_fn, receiver,
          after_trace=lambda: checkpointer.after_first_trace(strict=True))
    logging.info("Exported SavedModel from %s to %s", path, result)
    return result

  export_savedmodel = export_saved_model


class _EagerTraining:
  """The eager side of Estimator.train: restores on creation; `begin`
  makes the summary writer, the input iterator and the tf.function running
  `n` steps per `loop(n)` call."""

  def __init__(self, est, input_fn):
    self._est = est
    self._input_fn = input_fn
    (self._mesh_impl, self._global_step, self.checkpointer,
     self._restored) = est._start(ModeKeys.TRAIN)  # pylint: disable=protected-access
    self.start_step = self.step()
    self.session = None  # (saving listeners' argument)
    self._writer = None

  def step(self):
    return int(self._global_step.numpy())

  def begin(self):
    est = self._est
    self._writer = tf.summary.create_file_writer(est.model_dir)
    train_step = est._train_step(self._mesh_impl, self._global_step,  # pylint: disable=protected-access
                                 self._writer)

    @tf.function(autograph=False)
    def loop(iterator, n):
      # A while loop, not n copies of the step: the program is compiled
      # once, whatever iterations_per_loop is.
      def body(i, unused_loss):
        features, labels = inputs.split_element(next(iterator))
        loss, _ = train_step(features, labels)
        return i + 1, loss

      # One step after the other: a step reads the variables the step
      # before it updated.
      _, loss = tf.while_loop(lambda i, unused_loss: i < n, body,
                              (tf.constant(0), tf.constant(0.0)),
                              parallel_iterations=1)
      return loss

    self._loop = loop
    self._iterator = iter(inputs.call_input_fn(
        self._input_fn, est._input_params(ModeKeys.TRAIN)))  # pylint: disable=protected-access
    if est.config.checkpoint_input_pipeline:
      self.checkpointer.track_input_pipeline(self._iterator, self._restored)

  def loop(self, n):
    """Runs n steps; returns the last loss."""
    with mesh_impls.collective_errors(self._mesh_impl, steps=n):
      return float(self._loop(self._iterator, tf.constant(n, tf.int32)))

  def write_scalar(self, name, value, step):
    with self._writer.as_default(step=step):
      debug.write_scalar(name, value)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    if self._writer is not None:
      self._writer.flush()
