"""The search counts memory as data-parallel sharding stores it."""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator
from tests import sharding_training

MESH = "b:4;m:2"
LAYOUT = "batch:b;d_ff:m"


def _optimizer(sharding):
  """A memory-objective optimizer of the MLP stack's training step (every
  optimizer kind), counting `sharding` ("none", "update", "parameters")."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = sharding_training.mlp_loss(mesh)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    optimizers = sharding_training.make_optimizers()
    for var, grad in zip(variables, grads):
      optimizer = sharding_training._optimizer_for(var.name, optimizers)  # pylint: disable=protected-access
      optimizer.apply_grads([grad], [var])
  estimator = memory_estimator.MemoryEstimator(graph, MESH, [loss])
  optimizer = layout_optimizer.LayoutOptimizer(
      estimator, shard_weight_update=sharding != "none",
      shard_parameters=sharding == "parameters")
  return optimizer, graph


@pytest.mark.parametrize("sharding", ["none", "update", "parameters"])
def test_variable_bytes_are_those_the_lowering_stores(sharding):
  optimizer, graph = _optimizer(sharding)
  _, stored, _ = sharding_training.lower_only(
      sharding_training.mlp_loss, sharding_training.make_optimizers, MESH,
      LAYOUT, sharding)
  layout = dict(pair.split(":") for pair in LAYOUT.split(";"))
  counted = {}
  for variable in graph.all_variables:
    name = variable.outputs[0].name
    assignment = {d: m for d, m in layout.items()
                  if d in optimizer._tensor_dimension_set[name]}  # pylint: disable=protected-access
    counted[variable.name] = optimizer._tensor_bytes(name, assignment)  # pylint: disable=protected-access
  assert counted == stored


def test_sharding_lowers_the_peak():
  peaks = [_optimizer(s)[0].evaluate_peak_memory(LAYOUT)
           for s in ("none", "update", "parameters")]
  assert peaks[0] > peaks[1] > peaks[2]
