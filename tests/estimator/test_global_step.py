"""The estimator's one training step: seen by model_fn both ways, read by
the optimizers' schedules, checkpointed once under "global_step"."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator
from tests.estimator import toy_model


@pytest.mark.parametrize("mesh_impl", ["placement", "simd"])
def test_model_fn_and_schedules_see_the_estimators_step(tmp_path, mesh_impl):
  """Step n (counted from 1, as TensorBoard shows it) runs with n - 1 steps
  done: the step model_fn reads, both ways, is 0, 1, 2, ... and the
  schedule's rate 0.01 * (step + 1) is 0.01, 0.02, 0.03, ..."""
  config = estimator.RunConfig(
      model_dir=str(tmp_path), mesh_shape="b:2;m:4",
      layout="batch:b;hidden:m", mesh_impl=mesh_impl, save_summary_steps=1,
      iterations_per_loop=2)
  est = estimator.Estimator(toy_model.step_reading_model_fn, config=config)
  est.train(toy_model.input_fn, steps=3)
  est.train(toy_model.input_fn, steps=2)  # Resumes at step 3.
  assert int(est.get_variable_value("global_step")) == 5
  scalars = toy_model.event_scalars(str(tmp_path))
  want = {n: n - 1.0 for n in range(1, 6)}
  assert scalars["seen/tf_global_step"] == want
  assert scalars["seen/params_global_step"] == want
  np.testing.assert_allclose(
      [scalars["learning_rate"][n] for n in range(1, 6)],
      [0.01, 0.02, 0.03, 0.04, 0.05], rtol=1e-6)
  assert est.evaluate(toy_model.eval_input_fn)["global_step"] == 5


def _step_keys(path):
  return sorted(k for k in tf.train.load_checkpoint(path)
                .get_variable_to_shape_map() if "global_step" in k)


def test_checkpoint_holds_one_step(tmp_path):
  """Adafactor's default schedules read the step; only the estimator's
  step is saved."""

  def model_fn(features, labels, mode, params):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch = mtf.Dimension("batch", toy_model.BATCH)
    io = mtf.Dimension("io", toy_model.IO)
    x = mtf.import_tf_tensor(mesh, features["x"], [batch, io])
    y = mtf.import_tf_tensor(mesh, labels, [batch, io])
    w = mtf.get_variable(mesh, "w", [io])
    loss = mtf.reduce_mean(mtf.square(x * w - y))
    (grad,) = mtf.gradients([loss], [w])
    updates = mtf.optimize.AdafactorOptimizer().apply_grads(
        [grad], [w.operation])
    lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
    return estimator.EstimatorSpec(
        mode, loss=lowering.export_to_tf_tensor(loss),
        train_op=tf.group([lowering.lowered_operation(u) for u in updates]))

  est = estimator.Estimator(model_fn, config=estimator.RunConfig(
      model_dir=str(tmp_path), mesh_shape="all:2", layout="io:all"))
  est.train(toy_model.input_fn, steps=2)
  assert _step_keys(est.latest_checkpoint()) == ["global_step"]
  assert est.get_variable_names() == ["global_step", "w", "w_slot_v"]


def test_checkpoint_with_an_old_mtf_step_restores(tmp_path):
  """A checkpoint of an earlier version holding the step as the mtf
  variable "global_step" only: training resumes at its step."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "hidden:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.get_variable(mesh, "w", "io:4,hidden:4",
                   initializer=tf.zeros_initializer())
  mtf.get_variable(mesh, "global_step", [], dtype=tf.int64,
                   initializer=tf.constant_initializer(4), trainable=False)
  mtf.Lowering(graph, {mesh: impl})
  tf.train.Checkpoint(model=impl).save(str(tmp_path / "old"))
  assert _step_keys(tf.train.latest_checkpoint(str(tmp_path))) == [
      "model/global_step/.ATTRIBUTES/VARIABLE_VALUE"]

  config = estimator.RunConfig(
      model_dir=str(tmp_path), mesh_shape="all:2", layout="hidden:all",
      save_summary_steps=1)
  est = estimator.Estimator(toy_model.step_reading_model_fn, config=config)
  est.train(toy_model.input_fn, steps=2)
  assert int(est.get_variable_value("global_step")) == 6
  assert toy_model.event_scalars(str(tmp_path))["seen/tf_global_step"] == {
      5: 4.0, 6: 5.0}


def test_tf_global_step_outside_the_estimator_is_left_alone(tmp_path):
  """The estimator's step is TF's global step only while it calls
  model_fn."""
  outside = tf.compat.v1.train.get_global_step()
  config = estimator.RunConfig(model_dir=str(tmp_path), mesh_shape="all:1",
                               layout="")
  est = estimator.Estimator(toy_model.step_reading_model_fn, config=config)
  est.train(toy_model.input_fn, steps=1)
  assert tf.compat.v1.train.get_global_step() is outside
