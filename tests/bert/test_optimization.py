"""Tests of mesh_tensorflow.bert.optimization: the learning-rate schedule,
clipping, weight-decay exclusions and max_optimized_variable_size, in
tf.function mode under the estimator's global step and in tf.compat.v1
graph mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import global_step as global_step_lib
from mesh_tensorflow.bert import optimization
from tests import mtf_testing

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 8)
C = mtf.Dimension("c", 64)
RNG = np.random.RandomState(0)
# name -> (dims, initial value, constant gradient).
VARIABLES = {
    "dense/kernel": ([A, B], RNG.randn(4, 8), RNG.randn(4, 8)),
    "dense/bias": ([B], RNG.randn(8), RNG.randn(8)),
    "layer_norm/scale": ([B], 1.0 + RNG.randn(8), RNG.randn(8)),
    "big/kernel": ([A, C], RNG.randn(4, 64), RNG.randn(4, 64)),
}
INIT_LR, TRAIN_STEPS, WARMUP_STEPS = 0.1, 100, 10


def test_schedule_warms_up_then_decays_linearly_to_zero():
  steps = [0, 5, 9, 10, 50, 99, 100, 150]
  got = [float(optimization.learning_rate_schedule(
      tf.constant(s, tf.int64), 1.0, 100, 10)) for s in steps]
  np.testing.assert_allclose(
      got, [0.0, 0.5, 0.9, 0.9, 0.5, 0.01, 0.0, 0.0], atol=1e-6)
  no_warmup = [float(optimization.learning_rate_schedule(
      tf.constant(s, tf.int64), 2.0, 100, 0)) for s in (0, 25)]
  np.testing.assert_allclose(no_warmup, [2.0, 1.5], atol=1e-6)


def _build(mesh, optimizer="adam", clip_gradients=True,
           max_optimized_variable_size=100):
  """Variables, a loss whose gradients are VARIABLES' constants, and one
  optimizer step: (learning rate, update ops)."""
  loss = 0.0
  for name, (dims, init, grad) in VARIABLES.items():
    var = mtf.get_variable(
        mesh, name, mtf.Shape(dims),
        initializer=lambda shape, dtype, init=init: tf.constant(
            init, dtype))
    loss += mtf.reduce_sum(
        var * mtf_testing.import_array(mesh, grad.astype(np.float32), dims))
  return optimization.create_optimizer(
      loss, INIT_LR, TRAIN_STEPS, WARMUP_STEPS,
      max_optimized_variable_size=max_optimized_variable_size,
      optimizer=optimizer, clip_gradients=clip_gradients)


def _expected_adam(step, clip_gradients):
  """NumPy: the variables after one AdamWeightDecay step at `step`."""
  lr = INIT_LR * min(step / WARMUP_STEPS, 1.0) if step < WARMUP_STEPS else (
      INIT_LR * (1.0 - step / TRAIN_STEPS))
  trained = [n for n in VARIABLES if n != "big/kernel"]
  norm = np.sqrt(sum((VARIABLES[n][2] ** 2).sum() for n in trained))
  scale = 1.0 / max(norm, 1.0) if clip_gradients else 1.0
  want = {}
  for name, (_, init, grad) in VARIABLES.items():
    if name not in trained:
      want[name] = init
      continue
    g = grad * scale
    m, v = 0.1 * g, 0.001 * g * g
    update = m / (np.sqrt(v) + 1e-6)
    if name == "dense/kernel":  # "bias" and "layer_norm" are excluded.
      update += 0.01 * init
    want[name] = init - lr * update
  return lr, norm, want


def _run_function_mode(step_value, **kwargs):
  """One step in a tf.function under the loop's step (as the estimator
  runs it); returns (learning rate, {name: value after the step}, names
  of the slots created)."""
  impl = mtf_testing.make_impl("function", "all:1", "")
  step = tf.Variable(step_value, dtype=tf.int64, trainable=False)
  graphs = []

  def lowered(train):
    graph = mtf.Graph()
    graphs.append(graph)
    mesh = mtf.Mesh(graph, "mesh")
    with global_step_lib.global_step_scope(step):
      lr, updates = _build(mesh, **kwargs)
    lowering = mtf.Lowering(graph, {mesh: impl})
    if train:
      with tf.control_dependencies(
          [lowering.lowered_operation(u) for u in updates]):
        return tf.identity(lr)
    return {v.name: lowering.export_to_tf_tensor(v.outputs[0])
            for v in graph.trainable_variables}

  lr = tf.function(lambda: lowered(True))()
  values = tf.function(lambda: lowered(False))()
  slots = [v.name for v in graphs[0].all_variables
           if v.name not in VARIABLES]
  return float(lr), {k: np.asarray(v) for k, v in values.items()}, slots


@pytest.mark.parametrize("clip_gradients", [True, False])
def test_adam_step_in_a_tf_function(clip_gradients):
  lr, values, slots = _run_function_mode(3, clip_gradients=clip_gradients)
  want_lr, norm, want = _expected_adam(3, clip_gradients)
  assert norm > 2.0  # Clipping changes the gradients.
  np.testing.assert_allclose(lr, want_lr, rtol=1e-6)
  for name in VARIABLES:
    np.testing.assert_allclose(values[name], want[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)
  # max_optimized_variable_size: "big/kernel" (256 elements) has no slots.
  assert sorted(slots) == sorted(
      f"{n}/{s}" for n in VARIABLES if n != "big/kernel"
      for s in ("adam_m", "adam_v"))


def test_adam_step_in_compat_graph_mode():
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    step = tf.compat.v1.train.get_or_create_global_step()
    lr, updates = _build(mesh)
    lowering = mtf.Lowering(
        graph, {mesh: mtf_testing.make_impl("graph", "all:1", "")})
    train_op = tf.group([lowering.lowered_operation(u) for u in updates])
    read = {v.name: lowering.export_to_tf_tensor(v.outputs[0])
            for v in graph.trainable_variables}
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      sess.run(step.assign(50))
      got_lr, _ = sess.run([lr, train_op])
      values = sess.run(read)
  want_lr, _, want = _expected_adam(50, clip_gradients=True)
  np.testing.assert_allclose(got_lr, want_lr, rtol=1e-6)
  for name in VARIABLES:
    np.testing.assert_allclose(values[name], want[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_adafactor_trains_and_adam_needs_a_learning_rate():
  _, values, slots = _run_function_mode(20, optimizer="adafactor",
                                        max_optimized_variable_size=None)
  for name, (_, init, _) in VARIABLES.items():
    assert np.abs(values[name] - init).max() > 1e-4, name
  assert all("slot" in s for s in slots)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = mtf.reduce_sum(mtf.get_variable(mesh, "w", mtf.Shape([B])))
  with pytest.raises(ValueError, match="init_lr"):
    optimization.create_optimizer(loss, None, 10, 1)
  with pytest.raises(ValueError, match="sgd"):
    optimization.create_optimizer(loss, 0.1, 10, 1, optimizer="sgd")


def test_clip_by_global_norm():
  grads = [np.full([8], 3.0), np.full([4, 8], -1.0)]
  norm = np.sqrt(8 * 9.0 + 32 * 1.0)

  def build(mesh):
    tensors = [mtf_testing.import_array(mesh, g.astype(np.float32), dims)
               for g, dims in zip(grads, ([B], [A, B]))]
    clipped, global_norm = optimization.clip_by_global_norm(
        tensors + [None], 2.0)
    assert clipped[2] is None
    small, _ = optimization.clip_by_global_norm(tensors, 100.0)
    return {"c0": clipped[0], "c1": clipped[1], "norm": global_norm,
            "small": small[0]}, None, {}

  results, _ = mtf_testing.run_program("all:2", "b:all", "eager", build,
                                       fetch_variables=False)
  np.testing.assert_allclose(results["norm"], norm, rtol=1e-6)
  np.testing.assert_allclose(results["c0"], grads[0] * 2.0 / norm, rtol=1e-6)
  np.testing.assert_allclose(results["c1"], grads[1] * 2.0 / norm, rtol=1e-6)
  np.testing.assert_allclose(results["small"], grads[0], rtol=1e-6)
