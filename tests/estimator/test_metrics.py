"""Eval metrics accumulated over the whole evaluation set, against NumPy."""

import math

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator
from mesh_tensorflow.estimator import metrics

BATCH, LENGTH = 4, 3
_RNG = np.random.RandomState(11)
VALUES = _RNG.randn(4, BATCH, LENGTH).astype(np.float32)
# Uneven batches: full, ragged, all zero (a padded last batch), ragged.
WEIGHTS = np.ones((4, BATCH, LENGTH), np.float32)
WEIGHTS[1, :, 2] = 0.0
WEIGHTS[1, 3] = 0.0
WEIGHTS[2] = 0.0
WEIGHTS[3, :2] = 0.0
WEIGHTS[3, 2, 1] = 2.5


def numpy_results():
  """What the metrics of metric_fn give over all four batches."""
  sequence_weights = (WEIGHTS.sum(-1, keepdims=True) > 0).astype(np.float32)
  return {
      "weighted": (VALUES * WEIGHTS).sum() / WEIGHTS.sum(),
      "unweighted": VALUES.mean(),
      "per_sequence": ((VALUES.mean(-1, keepdims=True) * sequence_weights)
                       .sum() / sequence_weights.sum()),
      "tokens": WEIGHTS.sum(),
      "longest": WEIGHTS.sum(-1).max(),
      "plain": np.mean([VALUES[i].mean() for i in range(4)]),
  }


def metric_fn(values, weights):
  """The original's kinds of eval metrics: weighted means, a sum, a max."""
  sequence_weights = tf.cast(
      tf.reduce_sum(weights, -1, keepdims=True) > 0, tf.float32)
  return {
      "weighted": metrics.mean(values, weights),
      "unweighted": metrics.mean(values),
      # [BATCH, 1] weights broadcast to [BATCH, 1] values.
      "per_sequence": metrics.mean(
          tf.reduce_mean(values, -1, keepdims=True), sequence_weights),
      "tokens": metrics.sum(weights),
      "longest": metrics.max(tf.reduce_sum(weights, -1)),
      "plain": tf.reduce_mean(values),  # per-batch values, averaged
  }


def model_fn(features, labels, mode, params):
  """values * scale (scale = 1) through mtf; metric_fn on the result."""
  del labels
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", BATCH)
  length = mtf.Dimension("length", LENGTH)
  values = mtf.import_tf_tensor(mesh, features["values"], [batch, length])
  scale = mtf.get_variable(mesh, "scale", [],
                           initializer=tf.compat.v1.ones_initializer())
  out = values * scale
  mean = mtf.reduce_mean(out)
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  loss = lowering.export_to_tf_tensor(mean)
  tensors = [lowering.export_to_tf_tensor(out), features["weights"]]
  if params.get("tpu_spec"):
    return estimator.TPUEstimatorSpec(mode, loss=loss,
                                      eval_metrics=(metric_fn, tensors))
  ops = metric_fn(*tensors) if mode == estimator.ModeKeys.EVAL else None
  return estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=ops)


def input_fn():
  return tf.data.Dataset.from_tensor_slices(
      ({"values": VALUES, "weights": WEIGHTS}, np.zeros(4, np.float32)))


@pytest.mark.parametrize("mesh_impl,tpu_spec", [
    ("placement", False), ("simd", False), ("placement", True)])
def test_evaluate_accumulates_over_the_whole_set(tmp_path, mesh_impl,
                                                 tpu_spec):
  config = estimator.RunConfig(model_dir=str(tmp_path), mesh_shape="b:2",
                               layout="batch:b", mesh_impl=mesh_impl)
  params = {"tpu_spec": tpu_spec}
  if tpu_spec:
    est = estimator.TPUEstimator(model_fn, config=config, params=params,
                                 use_tpu=False)
  else:
    est = estimator.Estimator(model_fn, config=config, params=params)
  est.train(input_fn, steps=1)
  results = est.evaluate(input_fn)
  for name, expected in numpy_results().items():
    np.testing.assert_allclose(results[name], expected, rtol=1e-5,
                               err_msg=name)
  assert results["global_step"] == 1


def run_batches(make_metric, batches):
  """Runs make_metric(*batch) for each batch through an Accumulator."""
  accumulator = None
  for batch in batches:
    metric = make_metric(*batch)
    if accumulator is None:
      accumulator = metrics.Accumulator({"m": metric.reduction})
    accumulator.add({"m": {k: v.numpy() for k, v in metric.parts.items()}})
  return accumulator.results()["m"]


def test_zero_weights_weigh_nothing_even_for_non_finite_values():
  batches = [(np.array([1.0, 3.0]), np.array([1.0, 1.0])),
             (np.array([math.inf, math.nan]), np.array([0.0, 0.0])),
             (np.array([5.0, math.nan]), np.array([2.0, 0.0]))]
  assert run_batches(metrics.mean, batches) == pytest.approx(14.0 / 4.0)
  # Nothing weighed at all: 0, as tf.compat.v1.metrics.mean.
  assert run_batches(metrics.mean, [batches[1]]) == 0.0


def test_sum_max_and_unweighted_mean_of_uneven_batches():
  batches = [np.arange(6.0).reshape(2, 3), np.array([-7.0]),
             np.zeros((0,)), np.array([[2.0, 9.5]])]
  flat = np.concatenate([b.reshape(-1) for b in batches])
  assert run_batches(metrics.sum, [(b,) for b in batches]) == flat.sum()
  assert run_batches(metrics.max, [(b,) for b in batches]) == flat.max()
  assert run_batches(metrics.mean, [(b,) for b in batches]) == (
      pytest.approx(flat.mean()))
  assert run_batches(metrics.max, [(np.zeros((0,)),)]) == -math.inf


def test_bad_weights_and_values_are_named():
  with pytest.raises(ValueError, match="weights of shape.*broadcast"):
    metrics.mean(np.ones((2, 3)), np.ones((2,)))
  with pytest.raises(TypeError, match="metrics.sum"):
    metrics.sum(tf.constant(["a"]))
  assert mtf.estimator.metrics is metrics
  # tf.compat.v1.metrics.mean's and the original's metric_sum's arguments.
  assert metrics.mean([1.0], [1.0], None, None, "xent").reduction == "mean"
  assert metrics.sum([1.0], name="num_eval_tokens").reduction == "sum"
  assert metrics.max([1.0], name="max_targets_length").reduction == "max"
