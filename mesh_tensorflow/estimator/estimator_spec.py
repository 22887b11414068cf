"""EstimatorSpec: what a model function returns for one mode."""

import collections

from mesh_tensorflow.estimator import mode_keys

_FIELDS = ("mode", "loss", "train_op", "predictions", "eval_metric_ops",
           "export_outputs", "scaffold", "training_hooks", "evaluation_hooks",
           "prediction_hooks")


class EstimatorSpec(collections.namedtuple("EstimatorSpec", _FIELDS)):
  """The TF tensors of a lowered mtf graph for one mode.

  Args:
    mode: a ModeKeys value.
    loss: float scalar tf.Tensor (e.g. `lowering.export_to_tf_tensor(loss)`);
      required in TRAIN and EVAL.
    train_op: the lowered update ops (a tf.Operation, list or None). Inside a
      tf.function every stateful op runs anyway, so it may be omitted.
    predictions: dict of tf.Tensors with a leading batch dimension (a
      single tensor becomes {"output": tensor}); required in PREDICT.
    eval_metric_ops: dict name -> a `metrics.mean` / `metrics.sum` /
      `metrics.max` of the batch (accumulated over the whole evaluation
      set, e.g. a weighted mean over every token), or a float scalar
      tf.Tensor of the batch (averaged over the batches, each counting
      the same). A (value, update_op) pair counts as its value.
    export_outputs: accepted for compatibility; exports serve `predictions`.
    scaffold, *_hooks: accepted for compatibility and ignored (TF2 has no
      sessions to hook into).
  """

  # (fn, tensors) called on the host after each training step; see
  # TPUEstimatorSpec.
  host_call = None

  def __new__(cls, mode, loss=None, train_op=None, predictions=None,
              eval_metric_ops=None, export_outputs=None, scaffold=None,
              training_hooks=None, evaluation_hooks=None,
              prediction_hooks=None):
    mode_keys.check_mode(mode)
    if mode in (mode_keys.ModeKeys.TRAIN, mode_keys.ModeKeys.EVAL) and (
        loss is None):
      raise ValueError(f"EstimatorSpec in mode {mode!r} needs a loss.")
    if mode == mode_keys.ModeKeys.PREDICT and predictions is None:
      raise ValueError("EstimatorSpec in mode 'infer' needs predictions.")
    if predictions is not None and not isinstance(predictions, dict):
      predictions = {"output": predictions}
    metrics = {}
    for name, value in (eval_metric_ops or {}).items():
      if isinstance(value, (tuple, list)):
        value = value[0]
      metrics[name] = value
    return super().__new__(cls, mode, loss, train_op, predictions, metrics,
                           export_outputs, scaffold, training_hooks,
                           evaluation_hooks, prediction_hooks)


class TPUEstimatorSpec(EstimatorSpec):
  """EstimatorSpec with TPUEstimatorSpec's extra arguments.

  `host_call` is (fn, tensors), tensors a list or dict of tf.Tensors of
  the training program (e.g. `mtf.utils.create_host_call(model_dir)`): in
  training, the estimator calls fn(*tensors) (or fn(**tensors)) after each
  step, under its summary writer and summary schedule, and leaves writing
  the mtf.scalar_summary values to it; without one, the estimator writes
  them itself. `eval_metrics` is (metric_fn, tensors): metric_fn(*tensors)
  (or metric_fn(**tensors)) must return a dict name -> `metrics.mean` /
  `metrics.sum` / `metrics.max` or scalar tensor, as eval_metric_ops.
  """

  def __new__(cls, mode, loss=None, train_op=None, predictions=None,
              eval_metrics=None, export_outputs=None, scaffold_fn=None,
              host_call=None, training_hooks=None, evaluation_hooks=None,
              prediction_hooks=None):
    del scaffold_fn  # No sessions in TF2.
    if host_call is not None and (
        not isinstance(host_call, (tuple, list)) or len(host_call) != 2 or
        not callable(host_call[0])):
      raise ValueError("TPUEstimatorSpec host_call must be (fn, tensors), "
                       f"got {host_call!r}.")
    metric_ops = None
    if eval_metrics is not None:
      metric_fn, tensors = eval_metrics
      if isinstance(tensors, dict):
        metric_ops = metric_fn(**tensors)
      else:
        metric_ops = metric_fn(*tensors)
    spec = super().__new__(cls, mode, loss=loss, train_op=train_op,
                           predictions=predictions,
                           eval_metric_ops=metric_ops,
                           export_outputs=export_outputs,
                           training_hooks=training_hooks,
                           evaluation_hooks=evaluation_hooks,
                           prediction_hooks=prediction_hooks)
    spec.host_call = None if host_call is None else tuple(host_call)
    return spec
