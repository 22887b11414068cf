"""A tiny mtf regression model and inputs for the estimator tests."""

import glob
import os

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator

BATCH, IO, HIDDEN = 8, 4, 8
RNG = np.random.RandomState(0)
INPUTS = RNG.randn(BATCH, IO).astype(np.float32)
WEIGHTS = RNG.randn(IO, IO).astype(np.float32)
TARGETS = np.tanh(INPUTS @ WEIGHTS)
# 16 different batches, for runs whose data changes every step.
VARIED_INPUTS = RNG.randn(16, BATCH, IO).astype(np.float32)
VARIED_TARGETS = np.tanh(VARIED_INPUTS @ WEIGHTS)


def model_fn(features, labels, mode, params):
  """Two dense layers with dropout in training, SGD on mean squared error."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", BATCH)
  io = mtf.Dimension("io", IO)
  hidden = mtf.Dimension("hidden", HIDDEN)
  x = mtf.import_tf_tensor(mesh, features["x"], [batch, io])
  h = mtf.layers.dense(x, hidden, reduced_dims=[io], activation=mtf.relu,
                       name="hidden")
  if mode == estimator.ModeKeys.TRAIN:
    h = mtf.dropout(h, rate=params.get("dropout", 0.1))
  out = mtf.layers.dense(h, io, reduced_dims=[hidden], name="out")
  if mode == estimator.ModeKeys.PREDICT:
    lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
    return estimator.EstimatorSpec(
        mode, predictions={"out": lowering.export_to_tf_tensor(out)})
  y = mtf.import_tf_tensor(mesh, labels, [batch, io])
  loss = mtf.reduce_mean(mtf.square(out - y))
  mae = mtf.reduce_mean(mtf.abs(out - y))
  updates = []
  if mode == estimator.ModeKeys.TRAIN:
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    optimizer = mtf.optimize.SgdOptimizer(params.get("learning_rate", 0.1))
    updates = optimizer.apply_grads(grads, variables)  # Summarizes the lr.
    mtf.scalar_summary("mean_abs_error", mae)
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  return estimator.EstimatorSpec(
      mode, loss=lowering.export_to_tf_tensor(loss),
      train_op=tf.group([lowering.lowered_operation(u) for u in updates]),
      eval_metric_ops={"mae": lowering.export_to_tf_tensor(mae)})


def input_fn():
  """The same batch every step (so a resumed run sees the same data)."""
  return tf.data.Dataset.from_tensors(
      ({"x": INPUTS}, TARGETS)).repeat()


def varying_input_fn():
  """Different batches, reshuffled (with a fixed seed) every epoch."""
  return tf.data.Dataset.from_tensor_slices(
      ({"x": VARIED_INPUTS}, VARIED_TARGETS)).shuffle(16, seed=3).repeat()


def eval_input_fn():
  return tf.data.Dataset.from_tensors(({"x": INPUTS}, TARGETS)).repeat(3)


def predict_input_fn():
  return tf.data.Dataset.from_tensors({"x": INPUTS}).repeat(2)


# Runs compared across modes (tests/estimator/test_graph_mode.py): loops of
# 3 steps (the last one shorter), summaries every 5 steps (inside loops), a
# checkpoint every 10.
MODE_STEPS = 20
MODE_RESUME_STEPS = 10
MODE_SETTINGS = dict(iterations_per_loop=3, save_summary_steps=5,
                     log_step_count_steps=5, save_checkpoints_steps=10,
                     tf_random_seed=7)


class LossRecorder:
  """A training hook keeping the loss of each loop: {step: loss}."""

  def __init__(self):
    self.losses = {}

  def after_loop(self, step, loss):
    self.losses[step] = loss


def make_estimator(model_dir, mesh_shape="b:2;m:4",
                   layout="batch:b;hidden:m", **config_kwargs):
  config = estimator.RunConfig(model_dir=str(model_dir),
                               mesh_shape=mesh_shape, layout=layout,
                               **config_kwargs)
  return estimator.Estimator(model_fn, config=config,
                             params={"learning_rate": 0.1})


def variables(est):
  """{name: value} of every variable in est's latest checkpoint."""
  return {name: est.get_variable_value(name)
          for name in est.get_variable_names()}


def assert_same_variables(a, b, rtol=1e-5):
  """Two `variables` dicts hold the same names and values (to round-off)."""
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=1e-7,
                               err_msg=name)


def _scalar(mesh, tf_value):
  return mtf.import_fully_replicated(mesh, tf.cast(tf_value, tf.float32), [])


def step_reading_model_fn(features, labels, mode, params):
  """Linear regression with SGD at the rate 0.01 * (step + 1), recording
  the step as model_fn sees it through TF's global step and params."""
  tf_step = tf.compat.v1.train.get_or_create_global_step()
  if tf_step is not params["global_step"]:
    raise AssertionError(f"TF's global step {tf_step!r} is not the "
                         f"estimator's {params['global_step']!r}.")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", BATCH)
  io = mtf.Dimension("io", IO)
  hidden = mtf.Dimension("hidden", IO)
  x = mtf.import_tf_tensor(mesh, features["x"], [batch, io])
  y = mtf.import_tf_tensor(mesh, labels, [batch, hidden])
  w = mtf.get_variable(mesh, "w", [io, hidden])
  loss = mtf.reduce_mean(mtf.square(mtf.einsum([x, w], [batch, hidden]) - y))
  updates = []
  if mode == estimator.ModeKeys.TRAIN:
    mtf.scalar_summary("seen/tf_global_step", _scalar(mesh, tf_step))
    mtf.scalar_summary("seen/params_global_step",
                       _scalar(mesh, params["global_step"]))
    (grad,) = mtf.gradients([loss], [w])
    optimizer = mtf.optimize.SgdOptimizer(
        lambda step: (step + 1.0) * 0.01)
    updates = optimizer.apply_grads([grad], [w.operation])
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  return estimator.EstimatorSpec(
      mode, loss=lowering.export_to_tf_tensor(loss),
      train_op=tf.group([lowering.lowered_operation(u) for u in updates]))


def event_scalars(directory):
  """{tag: {step: value}} of the event files in `directory`."""
  scalars = {}
  for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        scalars.setdefault(value.tag, {})[event.step] = float(
            tf.make_ndarray(value.tensor))
  return scalars
