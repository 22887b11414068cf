"""The README's MLP as an estimator model, for the cluster tests.

Same dimensions, data and SGD step as the README's example; the same batch
every step, so a resumed run sees the data an uninterrupted one does.
"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator

BATCH, IO, HIDDEN = 64, 32, 128
MESH_SHAPE = "b:2;m:4"
LAYOUT = "batch:b;hidden:m"
LEARNING_RATE = 0.05

_RNG = np.random.RandomState(0)
INPUTS = _RNG.randn(BATCH, IO).astype(np.float32)
TARGETS = np.tanh(INPUTS @ _RNG.randn(IO, IO).astype(np.float32))


def model_fn(features, labels, mode, params):
  """relu(x w1) w2, mean squared error, plain SGD (data-parallel sharding
  as params["sharding"] says)."""
  del mode
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  sharding = params.get("sharding", "none")
  if sharding != "none":
    mtf.shard_data_parallel(mesh, MESH_SHAPE, LAYOUT,
                            shard_parameters=(sharding == "parameters"))
  batch = mtf.Dimension("batch", BATCH)
  io = mtf.Dimension("io", IO)
  hidden = mtf.Dimension("hidden", HIDDEN)
  x = mtf.import_tf_tensor(mesh, features, [batch, io])
  y = mtf.import_tf_tensor(mesh, labels, [batch, io])
  w1 = mtf.get_variable(mesh, "w1", [io, hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, io])
  h = mtf.relu(mtf.einsum([x, w1], [batch, hidden]))
  out = mtf.einsum([h, w2], [batch, io])
  loss = mtf.reduce_mean(mtf.square(out - y))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = mtf.optimize.SgdOptimizer(LEARNING_RATE).apply_grads(
      grads, variables)
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  return estimator.EstimatorSpec(
      estimator.ModeKeys.TRAIN, loss=lowering.export_to_tf_tensor(loss),
      train_op=tf.group([lowering.lowered_operation(u) for u in updates]))


def input_fn():
  return tf.data.Dataset.from_tensors((INPUTS, TARGETS)).repeat()


class LossRecorder:
  """An estimator loop hook keeping {step: loss}; with `echo`, prints
  "step N loss L" as each loop ends (so a parent process can follow)."""

  def __init__(self, echo=False):
    self.losses = {}
    self._echo = echo

  def after_loop(self, step, loss):
    self.losses[int(step)] = float(loss)
    if self._echo:
      print(f"step {step} loss {loss!r}", flush=True)


def make_estimator(model_dir, devices=None, save_checkpoints_steps=5,
                   mesh_impl="placement", sharding="none"):
  """The estimator; `sharding` is "none", "update" or "parameters"."""
  config = estimator.RunConfig(
      model_dir=str(model_dir), mesh_shape=MESH_SHAPE, layout=LAYOUT,
      mesh_impl=mesh_impl, devices=devices, tf_random_seed=1,
      save_checkpoints_steps=save_checkpoints_steps, keep_checkpoint_max=100,
      log_step_count_steps=1000, save_summary_steps=1000)
  return estimator.Estimator(model_fn, config=config,
                             params={"sharding": sharding})


def train(est, max_steps, echo=False):
  """Trains `est` to `max_steps`; returns {step: loss} of the steps run."""
  recorder = LossRecorder(echo)
  est.train(input_fn, hooks=[recorder], max_steps=max_steps)
  return recorder.losses


def variables(model_dir, step=None):
  """{mtf name: value} of a checkpoint of model_dir (default: latest)."""
  path = tf.train.latest_checkpoint(str(model_dir))
  if step is not None:
    path = f"{str(model_dir)}/model.ckpt-{step}"
  return mtf.storage.checkpointing.load_variables(path, prefix="model")
