"""A TPUEstimatorSpec host call made by mtf.utils.create_host_call writes
the model's mtf scalar summaries, in place of the estimator."""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator
from tests.estimator import toy_model


def host_call_model_fn(features, labels, mode, params, config):
  """Regression whose training spec writes its summaries by host call."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", toy_model.BATCH)
  io = mtf.Dimension("io", toy_model.IO)
  x = mtf.import_tf_tensor(mesh, features["x"], [batch, io])
  y = mtf.import_tf_tensor(mesh, labels, [batch, io])
  w = mtf.get_variable(mesh, "w", [io])
  loss = mtf.reduce_mean(mtf.square(x * w - y))
  mtf.scalar_summary("mtf_loss", loss)
  (grad,) = mtf.gradients([loss], [w])
  updates = mtf.optimize.SgdOptimizer(0.25).apply_grads(
      [grad], [w.operation])
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  host_call = mtf.utils.create_host_call(config.model_dir)
  mtf.utils.remove_summaries()
  return estimator.TPUEstimatorSpec(
      mode, loss=lowering.export_to_tf_tensor(loss),
      train_op=tf.group([lowering.lowered_operation(u) for u in updates]),
      host_call=host_call)


@pytest.mark.parametrize("mesh_impl", ["placement", "simd"])
def test_host_call_writes_the_summaries(tmp_path, mesh_impl):
  est = estimator.Estimator(host_call_model_fn, config=estimator.RunConfig(
      model_dir=str(tmp_path), mesh_shape="all:2", layout="io:all",
      mesh_impl=mesh_impl, save_summary_steps=2, iterations_per_loop=2))
  est.train(toy_model.input_fn, steps=4)
  scalars = toy_model.event_scalars(str(tmp_path))
  # The host call gets the step model_fn read (before the step's
  # increment), as the original's did; the estimator's loss is at the
  # step's number.
  assert sorted(scalars["loss"]) == [2, 4]
  assert sorted(scalars["mtf_loss"]) == [1, 3]
  assert sorted(scalars["learning_rate"]) == [1, 3]
  assert scalars["mtf_loss"][3] == pytest.approx(scalars["loss"][4])


def test_host_call_must_be_a_function_and_tensors():
  with pytest.raises(ValueError, match="host_call must be"):
    estimator.TPUEstimatorSpec(estimator.ModeKeys.TRAIN,
                               loss=tf.constant(1.0), host_call=[print])
