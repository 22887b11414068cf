"""Tests of mtf.auto_mtf.plan on fixed graphs: the search, the budget, the
breakdowns and the errors (layer-stacked models: test_plan_structures)."""

import importlib

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.auto_mtf  # pylint: disable=unused-import
from mesh_tensorflow.auto_mtf import api
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import machine as machine_lib
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import planner

pytest.importorskip("ortools")

MACHINE = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 2,
    "default_collective": {"latency_seconds": 1e-4,
                           "seconds_per_wire_byte": 1e-9}})
# Collectives so slow to start that data parallelism, with the fewest,
# is the fastest layout, though not the smallest.
SLOW_START = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 2,
    "default_collective": {"latency_seconds": 1e-3,
                           "seconds_per_wire_byte": 1e-12}})


def _mlp_step(hidden=256):
  """(graph, loss): one Adafactor step of a 2-layer MLP."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    b = mtf.Dimension("batch", 64)
    io = mtf.Dimension("io", 32)
    h = mtf.Dimension("hidden", hidden)
    x = mtf.import_tf_tensor(mesh, tf.zeros([64, 32]), mtf.Shape([b, io]))
    w1 = mtf.get_variable(mesh, "w1", [io, h])
    w2 = mtf.get_variable(mesh, "w2", [h, io])
    y = mtf.einsum([mtf.relu(mtf.einsum([x, w1], [b, h])), w2], [b, io])
    loss = mtf.reduce_mean(mtf.square(y - x))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    mtf.optimize.AdafactorOptimizer().apply_grads(grads, variables)
  return graph, loss


@pytest.fixture(scope="module")
def mlp():
  return _mlp_step()


def test_plan_of_a_graph_is_the_layout_search_pick(mlp):
  graph, loss = mlp
  result = mtf.auto_mtf.plan(graph, 8, machine=MACHINE, mtf_outputs=[loss])
  choice = api.choose_layout(graph, 8, [loss], objective="time",
                             machine=MACHINE)
  assert result.layout_rules.to_string == choice.layout_rules.to_string
  assert result.mesh_shape == choice.mesh_shape
  # The exact pricing is the search's own sum, broken down.
  assert result.predicted_step_seconds == pytest.approx(
      choice.predicted_step_seconds, rel=1e-9)
  # Its peak runs the step as TF's executor does (plan_pricing.SCHEDULE),
  # which the search, in that order, sums alike; the layout search's
  # default order saves memory.
  estimator = memory_estimator.MemoryEstimator(graph, result.mesh_shape,
                                               [loss])
  assert result.peak_memory_bytes == layout_optimizer.LayoutOptimizer(
      estimator, scheduler_alg="ASAP").evaluate_peak_memory(
          result.layout_rules.to_string)
  assert result.peak_memory_bytes >= choice.peak_memory_bytes
  assert result.step_time.bubble == 0
  assert result.zero == "none" and result.structure == mtf.auto_mtf.Structure()
  assert result.settings["layout_rules"] == result.layout_rules.to_string
  assert result.search.exact and result.search.structures == 1
  assert "Plan: " in result.table() and "next best" in result.table()


def test_memory_breakdown_counts_each_variable_slice(mlp):
  graph, loss = mlp
  result = mtf.auto_mtf.plan(graph, 8, machine=MACHINE, mtf_outputs=[loss])
  impl = mtf.MeshImpl(result.mesh_shape, result.layout_rules)
  trainable = {v.name for v in graph.trainable_variables}
  params = sum(impl.slice_size(v.outputs[0].shape) * 4
               for v in graph.all_variables if v.name in trainable)
  slots = sum(impl.slice_size(v.outputs[0].shape) * 4
              for v in graph.all_variables if v.name not in trainable)
  assert result.memory.parameters == params
  assert result.memory.optimizer_slots == slots
  assert result.memory.pipeline_buffers == 0
  assert result.memory.activations > 0


def test_budget_trades_time_for_memory(mlp):
  graph, loss = mlp
  fastest = mtf.auto_mtf.plan(graph, 8, machine=SLOW_START,
                              mtf_outputs=[loss])
  assert fastest.layout_rules.to_string == "batch:mesh_0"
  smallest = api.choose_layout(graph, 8, [loss], objective="memory")
  assert 2 * smallest.peak_memory_bytes < fastest.peak_memory_bytes
  budget = 2 * smallest.peak_memory_bytes
  result = mtf.auto_mtf.plan(graph, 8, memory_budget=budget,
                             machine=SLOW_START, mtf_outputs=[loss])
  assert result.peak_memory_bytes <= budget
  assert result.predicted_step_seconds > fastest.predicted_step_seconds
  assert "batch:mesh_0" != result.layout_rules.to_string
  assert result.memory_budget == budget


def test_nothing_fits_names_the_smallest_peak(mlp):
  graph, loss = mlp
  # The least-memory layout search of each mesh shape, in the order the
  # planner prices (as TF's executor runs the step).
  peaks = []
  for mesh_shape in planner.mesh_shapes(8):
    optimizer = layout_optimizer.LayoutOptimizer(
        memory_estimator.MemoryEstimator(graph, mesh_shape, [loss]),
        scheduler_alg="ASAP", objective="memory")
    peaks.append(int(optimizer.evaluate_peak_memory(optimizer.solve())))
  smallest = min(peaks)
  with pytest.raises(planner.PlanError) as e:
    mtf.auto_mtf.plan(graph, 8, memory_budget=smallest - 1,
                      machine=MACHINE, mtf_outputs=[loss])
  message = str(e.value)
  assert f"{smallest} bytes" in message
  assert "no plan fits memory_budget" in message
  assert "Raise the budget" in message


def test_fixed_rules_hold_and_bad_ones_are_named(mlp):
  graph, loss = mlp
  estimator = memory_estimator.MemoryEstimator(graph, "a:2;b:4", [loss])
  optimizer = layout_optimizer.LayoutOptimizer(
      estimator, objective="time", machine=MACHINE,
      fixed_rules={"hidden": "a"})
  assert "hidden:a" in optimizer.solve().split(";")
  with pytest.raises(ValueError, match="fixed rule nothing:a"):
    layout_optimizer.LayoutOptimizer(estimator, fixed_rules={"nothing": "a"})


def test_mesh_shapes_put_the_stage_first():
  names = [";".join(f"{d.name}:{d.size}" for d in s.dims)
           for s in planner.mesh_shapes(8, 2)]
  assert names == ["stage:2;mesh_0:4", "stage:2;mesh_0:2;mesh_1:2"]
  assert [str(s) for s in planner.mesh_shapes(8, 8)] == [
      str(mtf.Shape([mtf.Dimension("stage", 8)]))]
  assert planner.mesh_shapes(8, 3) == []


def test_plan_module_is_callable_and_parses_sizes(mlp):
  graph, loss = mlp
  # The package binds `plan` to the function; importing the module (the
  # command line's) rebinds it to the module, which is callable alike.
  plan_module = importlib.import_module("mesh_tensorflow.auto_mtf.plan")
  assert mtf.auto_mtf.plan is plan_module
  assert plan_module(graph, 2, machine=MACHINE,
                     mtf_outputs=[loss]).mesh_shape.size == 2
  assert plan_module.parse_bytes("16GiB") == 16 * 2**30
  assert plan_module.parse_bytes("1.5e3") == 1500
  with pytest.raises(ValueError, match="'16 parsecs' is not a size"):
    plan_module.parse_bytes("16 parsecs")
