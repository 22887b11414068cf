"""The time objective picks the analytically cheaper layout.

Hand-built training steps (forward, gradients, SGD update) on a 1-D mesh of
8, priced on a machine given by hand (every processor computes at once, no
shared replicas, collectives of 10 us plus 0.1 ns per wire byte), so the
answers follow from counting alone.
"""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import api
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import machine
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import valid_layouts

POD = machine.machine_constants({
    "flops_per_second": 1e12, "elementwise_bytes_per_second": 1e11,
    "op_overhead_seconds": 1e-6, "concurrency": 8,
    "default_collective": {"latency_seconds": 1e-5,
                           "seconds_per_wire_byte": 1e-10}})
# Collectives so slow that splitting never pays for itself.
SLOW_LINKS = machine.machine_constants(dict(
    POD.to_dict(), default_collective={"latency_seconds": 1.0,
                                       "seconds_per_wire_byte": 1e-3},
    collectives={}))


def _two_layer_step(batch, d_in, hidden, d_out):
  """y = relu(x @ w1) @ w2; loss = mean(y^2); SGD on w1 and w2.

  Returns (graph, loss).
  """
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    b, i, h, o = (mtf.Dimension("batch", batch), mtf.Dimension("d_in", d_in),
                  mtf.Dimension("hidden", hidden),
                  mtf.Dimension("d_out", d_out))
    x = mtf.import_tf_tensor(mesh, tf.zeros([batch, d_in]), [b, i])
    w1 = mtf.get_variable(mesh, "w1", [i, h])
    w2 = mtf.get_variable(mesh, "w2", [h, o])
    y = mtf.einsum([mtf.relu(mtf.einsum([x, w1], [b, h])), w2], [b, o])
    loss = mtf.reduce_mean(mtf.square(y))
    grads = mtf.gradients([loss], [w1, w2])
    mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, [w1, w2])
  return graph, loss


def _optimizer(graph, loss, mesh="x:8", **kwargs):
  estimator = memory_estimator.MemoryEstimator(graph, mesh, [loss])
  return layout_optimizer.LayoutOptimizer(estimator, objective="time",
                                          **kwargs)


def test_big_weights_are_split_model_parallel():
  # Two 16 MiB weights, 8 rows: data parallelism all-reduces both weight
  # gradients; splitting hidden all-reduces only y (8 x 1024).
  graph, loss = _two_layer_step(batch=8, d_in=1024, hidden=4096, d_out=1024)
  optimizer = _optimizer(graph, loss, machine=POD)
  layout = optimizer.solve()
  assert layout == "hidden:x"
  assert optimizer.evaluate_step_seconds(layout) < (
      optimizer.evaluate_step_seconds("batch:x"))


def test_a_big_batch_is_split_data_parallel():
  # 8192 rows through 64 x 64 weights: splitting the batch all-reduces two
  # 16 KiB weight gradients; splitting hidden all-reduces y (2 MiB), and
  # splitting d_out all-reduces the gradient of the hidden layer.
  graph, loss = _two_layer_step(batch=8192, d_in=64, hidden=64, d_out=64)
  optimizer = _optimizer(graph, loss, machine=POD)
  layout = optimizer.solve()
  assert layout == "batch:x"
  for other in ("hidden:x", "d_out:x", "d_in:x", ""):
    assert optimizer.evaluate_step_seconds(layout) < (
        optimizer.evaluate_step_seconds(other)), other


def test_the_prediction_is_the_sum_of_counted_costs():
  graph, loss = _two_layer_step(batch=8192, d_in=64, hidden=64, d_out=64)
  optimizer = _optimizer(graph, loss, machine=POD)
  for layout in ("", "batch:x", "hidden:x", "d_out:x"):
    want, _ = cost_model.predict_step_seconds(graph, "x:8", layout, POD)
    assert optimizer.evaluate_step_seconds(layout) == pytest.approx(
        want, rel=1e-9), layout


def _deep_step(num_layers):
  """`num_layers` alike residual blocks h += relu(h @ w1) @ w2, loss =
  mean(h^2), SGD: operations that share cost signatures, pending sums kept
  through adds. Returns (graph, loss)."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    b, d, f = (mtf.Dimension("batch", 16), mtf.Dimension("d_model", 8),
               mtf.Dimension("d_ff", 32))
    h = mtf.import_tf_tensor(mesh, tf.zeros([16, 8]), [b, d])
    weights = []
    for i in range(num_layers):
      w1 = mtf.get_variable(mesh, f"w1_{i}", [d, f])
      w2 = mtf.get_variable(mesh, f"w2_{i}", [f, d])
      h += mtf.einsum([mtf.relu(mtf.einsum([h, w1], [b, f])), w2], [b, d])
      weights += [w1, w2]
    loss = mtf.reduce_mean(mtf.square(h))
    grads = mtf.gradients([loss], weights)
    mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, weights)
  return graph, loss


def test_repeated_layers_are_priced_as_the_whole_graph():
  # The search prices operations of one cost signature once; its step time
  # must still be the whole graph's, under every valid layout.
  graph, loss = _deep_step(num_layers=3)
  mesh = "a:2;b:2;c:2"
  estimator = memory_estimator.MemoryEstimator(graph, mesh, [loss])
  optimizer = layout_optimizer.LayoutOptimizer(estimator, objective="time",
                                               machine=POD)
  layouts = list(valid_layouts.enumerate_layouts(
      estimator.get_layout_validator(), optimizer.constraint_sets))
  assert len(layouts) > 20
  for layout in layouts:
    want, _ = cost_model.predict_step_seconds(graph, mesh, layout, POD)
    assert optimizer.evaluate_step_seconds(layout) == pytest.approx(
        want, rel=1e-9), layout
  best = min(layouts, key=optimizer.evaluate_step_seconds)
  assert optimizer.evaluate_step_seconds(optimizer.solve()) == (
      optimizer.evaluate_step_seconds(best))


def test_a_memory_budget_overrides_the_fastest_layout():
  graph, loss = _two_layer_step(batch=8, d_in=1024, hidden=4096, d_out=1024)
  fastest = _optimizer(graph, loss, machine=SLOW_LINKS)
  assert fastest.solve() == ""  # no collective at all
  whole = fastest.evaluate_peak_memory("")
  budget = whole // 2
  optimizer = _optimizer(graph, loss, machine=SLOW_LINKS,
                         memory_budget=budget)
  layout = optimizer.solve()
  assert layout
  assert optimizer.evaluate_peak_memory(layout) <= budget


def test_an_impossible_budget_with_the_time_objective():
  graph, loss = _two_layer_step(batch=8, d_in=1024, hidden=4096, d_out=1024)
  with pytest.raises(layout_optimizer.SolverError,
                     match=r"memory_budget=4096 bytes.*smallest peak is \d+"):
    api.choose_layout(graph, "x:8", [loss], objective="time",
                      memory_budget=4096, machine=POD)


def test_choose_layout_reports_the_predicted_step_time():
  graph, loss = _two_layer_step(batch=8192, d_in=64, hidden=64, d_out=64)
  choice = api.choose_layout(graph, 8, [loss], objective="time",
                             machine=POD, max_mesh_shape_dimensions=1)
  assert choice.layout_rules.to_string == "batch:mesh_0"
  assert choice.predicted_step_seconds > 0
  assert "predicted_step=" in choice.describe()
