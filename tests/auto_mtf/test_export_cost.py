"""A step's exported loss: the allreduce its export makes is priced.

A loss averaged over a split batch is a pending sum that nothing in the
training graph reads; Lowering.export_to_tf_tensor allreduces it. The
cost model charges it (cost_model.export_cost) when told the step's
outputs, so the predicted collectives are the lowering's counters with
the loss exported.
"""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.auto_mtf import dense_stack_model
from mesh_tensorflow.auto_mtf import machine as machine_lib
from mesh_tensorflow.auto_mtf import plan_pricing
from mesh_tensorflow.auto_mtf import plan_space

MODEL = dense_stack_model.DenseStackModel(num_layers=2, batch=8, io=4,
                                          hidden=8, optimizer="sgd")
MESH, LAYOUT = "b:2;m:2", "batch:b;hidden:m"
MACHINE = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 2,
    "default_collective": {"latency_seconds": 1e-4,
                           "seconds_per_wire_byte": 1e-9}})


def _lowered_with_export():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(MESH, LAYOUT)
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    graph, outputs = MODEL.build(plan_space.Structure())
    lowering = mtf.Lowering(graph, {outputs[0].mesh: impl})
    lowering.export_to_tf_tensor(outputs[0])
  return graph, outputs, dict(lowering.counters)


def test_the_exported_loss_allreduce_is_counted_and_priced():
  graph, outputs, counters = _lowered_with_export()
  counted = cost_model.counted_collectives(counters)
  in_graph = cost_model.graph_cost(graph, MESH, LAYOUT).collectives
  # The loss's allreduce over "b" is made by its export only.
  assert counted[("allreduce", "b")]["calls"] == (
      in_graph[("allreduce", "b")]["calls"] + 1)
  exported = cost_model.export_cost(
      graph, outputs, {"batch": "b", "hidden": "m"}, {"b": 2, "m": 2})
  assert [(c.kind, c.mesh_dimension_names) for c in exported.collectives
          ] == [("allreduce", ("b",))]
  _, with_export = cost_model.predict_step_seconds(graph, MESH, LAYOUT,
                                                   MACHINE, outputs)
  total = dict(in_graph)
  for c in exported.collectives:
    entry = dict(total[("allreduce", "b")])
    entry["calls"] += c.calls
    entry["wire_bytes"] += c.wire_bytes
    total[("allreduce", "b")] = entry
  assert total == counted
  seconds = with_export["collective_seconds"][("allreduce", "b")]
  _, without = cost_model.predict_step_seconds(graph, MESH, LAYOUT, MACHINE)
  assert seconds > without["collective_seconds"][("allreduce", "b")]


def test_a_plans_step_time_prices_its_exported_loss():
  graph, outputs, _ = _lowered_with_export()
  with_loss, _ = plan_pricing.price(graph, outputs, MESH, LAYOUT, MACHINE)
  without, _ = plan_pricing.price(graph, [], MESH, LAYOUT, MACHINE)
  assert with_loss.collectives > without.collectives
