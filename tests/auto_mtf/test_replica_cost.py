"""Shared replicas still write every processor's variables.

PlacementMeshImpl on one task's CPUs computes a replicated slice once
(share_replicas), but each processor keeps its own variables, so an
Assign writes all of them: on 8 processors a replicated plan costs the one
processor plan plus 7 more copies of every variable update, in the plan's
price and in the layout search's table alike.
"""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.auto_mtf import dense_stack_model
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import machine as machine_lib
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import plan_pricing
from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import step_cost

pytest.importorskip("ortools")

MODEL = dense_stack_model.DenseStackModel(num_layers=2, batch=8, io=4,
                                          hidden=8, optimizer="sgd")
MACHINE = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 1, "share_replicas": True,
    "default_collective": {"latency_seconds": 1e-4,
                           "seconds_per_wire_byte": 1e-9}})


@pytest.fixture(scope="module")
def step():
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    return MODEL.build(plan_space.Structure())


def test_replicated_assigns_run_on_every_processor(step):
  graph, outputs = step
  one, _ = plan_pricing.price(graph, outputs, "all:1", "", MACHINE)
  eight, _ = plan_pricing.price(graph, outputs, "all:8", "", MACHINE)
  pricer = cost_model.Pricer(graph, {}, {"all": 8})
  assigns = [op for op in cost_model.all_operations(graph)
             if isinstance(op, mtf.Assign)]
  assert assigns
  update = sum(step_cost.operation_seconds(pricer.cost(op), MACHINE, 1)
               for op in assigns)
  assert eight.compute == pytest.approx(one.compute + 7 * update)
  estimator = memory_estimator.MemoryEstimator(graph, "all:8", outputs)
  search = layout_optimizer.LayoutOptimizer(estimator, objective="time",
                                            machine=MACHINE)
  assert search.evaluate_step_seconds("") == pytest.approx(eight.total)


def test_pipeline_stages_compute_on_every_replica():
  # A pipeline's stage operations are not shared by replicas: the idle
  # stages' zeros and the stage shift give each processor its own copies
  # (a lowered S=2 step on stage:2;b:4 has every einsum on all 8 CPUs).
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    graph, _ = MODEL.build(plan_space.Structure(2, 2, 0))
  sizes = {"stage": 2, "b": 4}
  assignment = {"stage": "stage"}
  stage_ops = [op for op in cost_model.all_operations(graph)
               if isinstance(op, mtf.EinsumOperation)
               and "stage" in op.outputs[0].shape.dimension_names]
  variables = [op for op in cost_model.all_operations(graph)
               if isinstance(op, mtf.Variable)
               and "stage" in op.outputs[0].shape.dimension_names]
  assert stage_ops and variables
  for op in stage_ops:
    assert step_cost.computing_processors(op, assignment, sizes,
                                          MACHINE) == 8, op.name
  for op in variables:  # Each replica reads the first one's copy.
    assert step_cost.computing_processors(op, assignment, sizes,
                                          MACHINE) == 2, op.name
  # Unsplit, the stages run one after another on shared replicas.
  for op in stage_ops:
    assert step_cost.computing_processors(op, {}, sizes, MACHINE) == 1


def test_assign_prices_each_variable_update(step):
  # Each variable's update is its own TF op per processor, reading the new
  # value and the variable's slice and writing it back: 3x the bytes.
  graph, _ = step
  pricer = cost_model.Pricer(graph, {}, {"all": 8})
  assigns = [op for op in cost_model.all_operations(graph)
             if isinstance(op, mtf.Assign)]
  for op in assigns:
    cost = pricer.cost(op)
    value_bytes = sum(t.shape.size * t.dtype.size for t in op.inputs)
    assert cost.num_ops == len(op.variables)
    assert cost.elementwise_bytes == 3 * value_bytes
