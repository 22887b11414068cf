"""One training-step counter: TF's global step, read by the optimizers.

Optimizers and learning-rate schedules read TF's global step and never
create a step of their own; the training loop increments it. Checked with
the original's compat program (TF's step, `tf.compat.v1.assign_add` grouped
with the mtf train op, Adafactor) and with a schedule whose rate is the step
plus one, in every mode and on both mesh implementations.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import global_step
from mesh_tensorflow.ops import debug

STEPS = 3


def _new_step():
  return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")


def test_original_compat_program_trains_and_counts_steps():
  """A model_fn of the original, run in a tf.compat.v1 Session."""
  rng = np.random.RandomState(0)
  x_np = rng.randn(8, 16).astype(np.float32)
  y_np = np.tanh(x_np @ rng.randn(16, 4).astype(np.float32))
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    batch = mtf.Dimension("batch", 8)
    io, out = mtf.Dimension("io", 16), mtf.Dimension("out", 4)
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, io])
    y = mtf.import_tf_tensor(mesh, tf.constant(y_np), [batch, out])
    w = mtf.get_variable(mesh, "w", [io, out])
    loss = mtf.reduce_mean(mtf.square(mtf.einsum([x, w], [batch, out]) - y))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    update_ops = mtf.optimize.AdafactorOptimizer().apply_grads(
        grads, variables)
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "io:all")
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_update_ops = [lowering.lowered_operation(op) for op in update_ops]
    tf_update_ops.append(tf.compat.v1.assign_add(step, 1))
    train_op = tf.group(tf_update_ops)
    tf_loss = lowering.export_to_tf_tensor(loss)
    assert sorted(graph.name_to_variable) == ["w", "w_slot_v"]
    step_variables = [v for v in tf.compat.v1.global_variables()
                      if "global_step" in v.name]
    assert step_variables == [step]
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      losses = []
      for i in range(5):
        _, value = sess.run([train_op, tf_loss])
        losses.append(value)
        assert sess.run(step) == i + 1
  assert losses[-1] < losses[0]


def _sgd_program(mesh_impl):
  """One step of SGD with the rate `step + 1` on sum(w); returns
  (lowering, update ops, w after the update, the recorded learning
  rate)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", "a:4", initializer=tf.zeros_initializer())
  loss = mtf.reduce_sum(w)
  (grad,) = mtf.gradients([loss], [w])
  optimizer = mtf.optimize.SgdOptimizer(lambda step: step + 1.0)
  updates = optimizer.apply_grads([grad], [w.operation])
  read = mtf.read_variable(w.operation, dependencies=updates)
  with debug.collect_scalar_summaries() as summaries:
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    ops = [lowering.lowered_operation(u) for u in updates]
    value = lowering.export_to_tf_tensor(read)
  return lowering, ops, value, summaries["learning_rate"]


def _run_tf2(mode):
  if mode == "simd":
    impl = mtf.simd_mesh_impl.make_simd_mesh_impl("all:2", "a:all")
  else:
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "a:all")
  step = _new_step()

  def train():
    if mode == "simd":
      value, lr = impl.run(lambda: _sgd_program(impl)[2:])
    else:
      _, _, value, lr = _sgd_program(impl)
    step.assign_add(1)
    return value, lr

  if mode != "eager":
    train = tf.function(train, autograph=False)
  with global_step.global_step_scope(step):
    results = [train() for _ in range(STEPS)]
  return [(np.asarray(v), float(lr)) for v, lr in results], int(step.numpy())


def _run_graph():
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "a:all")
    lowering, ops, value, lr = _sgd_program(impl)
    with tf.control_dependencies(ops + [value, lr]):
      increment = tf.compat.v1.assign_add(step, 1)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      results = [sess.run([value, lr, increment])[:2]
                 for _ in range(STEPS)]
      return results, sess.run(step)


@pytest.mark.parametrize("mode", ["eager", "function", "graph", "simd"])
def test_schedules_see_the_training_loops_step(mode):
  if mode == "graph":
    results, final_step = _run_graph()
  else:
    results, final_step = _run_tf2(mode)
  assert final_step == STEPS
  rates = [lr for _, lr in results]
  assert rates == [1.0, 2.0, 3.0]
  w = [value for value, _ in results]
  np.testing.assert_allclose(w, [[-1.0] * 4, [-3.0] * 4, [-6.0] * 4])


def test_optimizers_create_no_step_variable():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", "a:4")
  mtf.optimize.AdafactorOptimizer().apply_grads([mtf.ones(mesh, "a:4")], [w])
  assert sorted(graph.name_to_variable) == ["w", "w_slot_v"]


def test_scope_makes_a_variable_tfs_global_step():
  step = _new_step()
  outer = tf.compat.v1.train.get_global_step()
  with global_step.global_step_scope(step):
    assert tf.compat.v1.train.get_or_create_global_step() is step

    @tf.function(autograph=False)
    def read():
      return tf.compat.v1.train.get_or_create_global_step().read_value()

    step.assign(7)
    assert int(read()) == 7
  assert tf.compat.v1.train.get_global_step() is outer
  with pytest.raises(ValueError, match="integer scalar tf.Variable"):
    with global_step.global_step_scope(tf.Variable(0.0)):
      pass


def test_step_is_read_once_per_mesh():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  step = _new_step()
  with global_step.global_step_scope(step):
    first = mtf.optimize.get_or_create_global_step(mesh)
    assert mtf.optimize.get_or_create_global_step(mesh) is first
    assert first.dtype == tf.int64 and first.shape.ndims == 0
