"""Evaluation metrics accumulated over the whole evaluation set.

A model function's `eval_metric_ops` (or the dict a TPUEstimatorSpec
`eval_metrics` function returns) maps names to one of:

- `mean(values, weights=None)`: the weighted running mean
  sum(values * weights) / sum(weights) over every batch, as
  `tf.compat.v1.metrics.mean` with weights (weights broadcast to values;
  without weights every element weighs 1). A batch whose weights are all
  zero (a padded last batch) changes nothing; a zero weight hides even a
  non-finite value. With no weight at all the result is 0, as TF's.
- `sum(values)`: the running total of all elements.
- `max(values)`: the running maximum of all elements (-inf if none).
- a plain scalar tf.Tensor (or a (value, update_op) pair: its value): the
  per-batch values are averaged, every batch counting the same, as
  `Estimator.evaluate` always did; use `mean` when batches differ in size.

`mean`, `sum` and `max` return a `Metric`: the scalar partial results of one
batch and how to combine them; `Estimator.evaluate` adds them up on the host
(in float64) after every batch with an `Accumulator`.
"""

import builtins
import math

import tensorflow as tf

MEAN = "mean"
SUM = "sum"
MAX = "max"


class Metric:
  """One batch's partial results of a metric.

  Args:
    reduction: MEAN (parts "total" and "count"), SUM ("total") or MAX
      ("max").
    parts: dict part name -> float32 scalar tf.Tensor of one batch.
  """

  def __init__(self, reduction, parts):
    if reduction not in (MEAN, SUM, MAX):
      raise ValueError(f"Metric reduction {reduction!r}: expected one of "
                       f"{(MEAN, SUM, MAX)}.")
    self.reduction = reduction
    self.parts = dict(parts)

  def __repr__(self):
    return f"Metric({self.reduction!r}, {sorted(self.parts)})"


def _float(values, what):
  values = tf.convert_to_tensor(values)
  if not (values.dtype.is_floating or values.dtype.is_integer or
          values.dtype.is_bool):
    raise TypeError(f"metrics.{what}: values must be numbers, got "
                    f"{values.dtype.name}.")
  return tf.cast(values, tf.float32)


def mean(values, weights=None, metrics_collections=None,
         updates_collections=None, name=None):
  """Weighted running mean over the evaluation set (see module docstring).

  The arguments are `tf.compat.v1.metrics.mean`'s; the collections have no
  meaning without sessions and are ignored; `name` scopes the ops.

  Raises:
    ValueError: weights do not broadcast to the values' shape.
  """
  del metrics_collections, updates_collections
  with tf.name_scope(name or "mean"):
    values = _float(values, "mean")
    if weights is None:
      return Metric(MEAN, {
          "total": tf.reduce_sum(values),
          "count": tf.cast(tf.size(values), tf.float32)})
    weights = _float(weights, "mean")
    try:
      weights = tf.broadcast_to(weights, tf.shape(values))
    except (ValueError, tf.errors.InvalidArgumentError) as e:
      raise ValueError(f"metrics.mean: weights of shape {weights.shape} do "
                       f"not broadcast to values of shape "
                       f"{values.shape}.") from e
    weighted = tf.where(tf.equal(weights, 0.0), tf.zeros_like(values),
                        values * weights)
    return Metric(MEAN, {"total": tf.reduce_sum(weighted),
                         "count": tf.reduce_sum(weights)})


def sum(values, name=None):  # pylint: disable=redefined-builtin
  """Running total of every element over the evaluation set (the
  original's `utils.metric_sum`)."""
  with tf.name_scope(name or "sum"):
    return Metric(SUM, {"total": tf.reduce_sum(_float(values, "sum"))})


def max(values, name=None):  # pylint: disable=redefined-builtin
  """Running maximum of every element over the evaluation set (the
  original's `utils.metric_max`, which started from 0 instead of -inf)."""
  with tf.name_scope(name or "max"):
    values = _float(values, "max")
    return Metric(MAX, {"max": tf.reduce_max(
        tf.concat([tf.reshape(values, [-1]), [-math.inf]], 0))})


def batch_outputs(metric_ops):
  """The tensors a program returns for `metric_ops` (name -> tensor, or
  name -> dict of parts for a Metric), and {name: reduction}."""
  outputs, reductions = {}, {}
  for name, op in metric_ops.items():
    if isinstance(op, Metric):
      outputs[name] = dict(op.parts)
      reductions[name] = op.reduction
    else:
      outputs[name] = tf.cast(op, tf.float32)
      reductions[name] = None
  return outputs, reductions


class Accumulator:
  """Combines the per-batch outputs of metrics into whole-set results.

  Args:
    reductions: {name: MEAN, SUM, MAX or None (plain tensor: the mean of
      the per-batch values)}.
  """

  def __init__(self, reductions):
    self._reductions = dict(reductions)
    self._state = {}
    self._batches = 0

  def add(self, outputs):
    """Adds one batch: outputs as `batch_outputs` made them (NumPy-able)."""
    self._batches += 1
    for name, reduction in self._reductions.items():
      value = outputs[name]
      if reduction is None:
        self._state[name] = self._state.get(name, 0.0) + float(value)
      elif reduction == MAX:
        self._state[name] = builtins.max(self._state.get(name, -math.inf),
                                         float(value["max"]))
      else:
        total, count = self._state.get(name, (0.0, 0.0))
        total += float(value["total"])
        if reduction == MEAN:
          count += float(value["count"])
        self._state[name] = (total, count)

  def results(self):
    """{name: float} over the batches added so far."""
    results = {}
    for name, reduction in self._reductions.items():
      state = self._state.get(name)
      if reduction is None:
        results[name] = state / self._batches if self._batches else 0.0
      elif reduction == MAX:
        results[name] = -math.inf if state is None else state
      elif reduction == SUM:
        results[name] = 0.0 if state is None else state[0]
      else:
        total, count = state or (0.0, 0.0)
        results[name] = total / count if count else 0.0
    return results
