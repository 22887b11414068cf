"""A layout the search picks trains to the same numbers as one processor."""

import pytest

import mesh_tensorflow as mtf
import mesh_tensorflow.auto_mtf
from tests import sharding_training
from mesh_tensorflow.auto_mtf import machine

MESH = "b:2;m:4"
# Compute so slow against communication that the time objective splits.
SLOW_COMPUTE = machine.machine_constants({
    "flops_per_second": 1e6, "elementwise_bytes_per_second": 1e6,
    "op_overhead_seconds": 0.0, "concurrency": 8,
    "default_collective": {"latency_seconds": 1e-9,
                           "seconds_per_wire_byte": 1e-12}})


def _sgd():
  # Plain SGD: a change of summation order stays at round-off (Adam-like
  # updates magnify it on near-zero gradients; test_sharded_training.py
  # covers those against the same layout).
  return [("", mtf.optimize.SgdOptimizer(0.1))]


@pytest.mark.parametrize("objective", ["memory", "time"])
def test_the_chosen_layout_trains_like_one_processor(objective):
  graph, loss = sharding_training.unlowered_training_step(
      sharding_training.mlp_loss, _sgd())
  rules = mtf.auto_mtf.layout(graph, MESH, [loss], objective=objective,
                              machine=SLOW_COMPUTE)
  assert len(rules), "the search split nothing: the test would prove little"
  got, _, _ = sharding_training.train_variables(
      sharding_training.mlp_loss, _sgd, MESH, rules, "function", "none",
      steps=3)
  want, _, _ = sharding_training.train_variables(
      sharding_training.mlp_loss, _sgd, "all:1", "", "function", "none",
      steps=3)
  sharding_training.assert_same_values(got, want, f"layout {rules}")
