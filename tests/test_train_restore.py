"""Train, checkpoint, restore under another mesh and layout, continue: the
losses are those of an uninterrupted run (to float round-off).

Each trainer owns its training step (TF's global step while it traces, read
by Adafactor's schedules) and increments it after each step; the checkpoint
holds it next to the model."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import global_step

TOTAL_STEPS = 300
SAVE_AT = 150
BATCH, IO, HIDDEN = 16, 8, 32
DATA = np.random.RandomState(0).randn(TOTAL_STEPS, BATCH, IO).astype(
    np.float32)


def _make_trainer(mesh_shape, layout):
  """(mesh impl, step variable, a function running one step of a dropout
  MLP learning identity)."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  step = tf.Variable(0, dtype=tf.int64, trainable=False)

  @tf.function
  def traced_step(x):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch = mtf.Dimension("batch", BATCH)
    io = mtf.Dimension("io", IO)
    hidden = mtf.Dimension("hidden", HIDDEN)
    inputs = mtf.import_tf_tensor(mesh, x, [batch, io])
    h = mtf.layers.dense(inputs, hidden, reduced_dims=[io],
                         activation=mtf.relu, name="hidden")
    h = mtf.dropout(h, rate=0.1)
    out = mtf.layers.dense(h, io, reduced_dims=[hidden], name="out")
    loss = mtf.reduce_mean(mtf.square(out - inputs))
    graph_vars = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in graph_vars])
    optimizer = mtf.optimize.AdafactorOptimizer(learning_rate=0.01)
    updates = optimizer.apply_grads(grads, graph_vars)
    lowering = mtf.Lowering(graph, {mesh: impl})
    del updates  # run in program order by tf.function
    loss = lowering.export_to_tf_tensor(loss)
    step.assign_add(1)
    return loss

  def train_step(x):
    with global_step.global_step_scope(step):
      return traced_step(x)

  return impl, step, train_step


def _run(train_step, first, last):
  return [float(train_step(tf.constant(DATA[i]))) for i in range(first, last)]


@pytest.mark.parametrize("source,target", [
    (("b:2;m:4", "batch:b;hidden:m"), ("all:8", "hidden:all")),
    (("all:8", "batch:all"), ("all:1", "")),
], ids=["2d_to_model_parallel", "data_parallel_to_one"])
def test_resume_under_another_layout_continues_the_same_run(
    tmp_path, source, target):
  _, _, uninterrupted_step = _make_trainer(*source)
  uninterrupted = _run(uninterrupted_step, 0, TOTAL_STEPS)

  impl, step, first_step = _make_trainer(*source)
  first_half = _run(first_step, 0, SAVE_AT)
  path = tf.train.Checkpoint(model=impl, global_step=step).save(
      os.path.join(tmp_path, "ckpt"))
  saved = mtf.storage.checkpointing.load_variables(path, prefix="model")
  assert "global_step" not in saved  # The step is saved once, outside.
  assert int(tf.train.load_checkpoint(path).get_tensor(
      "global_step/.ATTRIBUTES/VARIABLE_VALUE")) == SAVE_AT
  assert int(saved["mtf_random_step"]) == SAVE_AT

  restored_impl, restored_step, second_step = _make_trainer(*target)
  # Restored into the variables as the first trace creates them.
  status = tf.train.Checkpoint(model=restored_impl,
                               global_step=restored_step).restore(path)
  assert int(restored_step.numpy()) == SAVE_AT
  second_half = _run(second_step, SAVE_AT, TOTAL_STEPS)
  status.assert_consumed()

  np.testing.assert_array_equal(first_half, uninterrupted[:SAVE_AT])
  np.testing.assert_allclose(second_half, uninterrupted[SAVE_AT:],
                             rtol=1e-4, atol=1e-6)
  # It learned something, so the comparison is not between constants.
  assert uninterrupted[-1] < 0.5 * uninterrupted[0]
