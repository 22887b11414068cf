"""The planner prices a proxy of a few layers per stack, scaled.

A run of L > 5 like layers is built with 5 (proxy_layers.EDGE at each
end and one between); the middle layer's operations count L - 4 times in
the step time, and its tensors L - 4 times in memory where they are
stored across layers. The step time so scaled equals the full graph's (to
round-off), the peak is within 2% (Adam and SGD here; see the report for
Adafactor), and the plan is the same with and without the proxy.
"""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.auto_mtf  # pylint: disable=unused-import
from mesh_tensorflow.auto_mtf import dense_stack_model
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import machine as machine_lib
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import plan_pricing
from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import planner
from mesh_tensorflow.auto_mtf import proxy_layers

pytest.importorskip("ortools")

Structure = plan_space.Structure
MACHINE = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 2,
    "default_collective": {"latency_seconds": 1e-4,
                           "seconds_per_wire_byte": 1e-9}})
DENSE = dense_stack_model.DenseStackModel(num_layers=12, batch=16, io=8,
                                          hidden=64, optimizer="adam")
MESH = mtf.convert_to_shape("mesh_0:2;mesh_1:2")
LAYOUTS = ("", "batch:mesh_0", "batch:mesh_0;hidden:mesh_1",
           "hidden:mesh_0;io:mesh_1")


def _full_and_proxy(model, structure):
  full = planner._build(model, structure)  # pylint: disable=protected-access
  proxy = proxy_layers.build(model, structure)
  assert proxy is not None, structure
  assert len(proxy.graph.operations) < len(full[0].operations)
  return full, proxy


def _assert_priced_alike(full, proxy, layouts, mesh=MESH, memory_rel=0.02):
  graph, outputs = full
  for layout in layouts:
    t_full, m_full = plan_pricing.price(graph, outputs, mesh, layout,
                                        MACHINE)
    t_proxy, m_proxy = proxy.price(mesh, layout, MACHINE)
    assert t_proxy.total == pytest.approx(t_full.total, rel=1e-6), layout
    for part in ("compute", "collectives", "bubble"):
      assert getattr(t_proxy, part) == pytest.approx(
          getattr(t_full, part), rel=1e-6, abs=1e-12), (layout, part)
    assert m_proxy.total == pytest.approx(m_full.total,
                                          rel=memory_rel), layout


def _assert_searched_alike(full, proxy, layouts, mesh=MESH):
  """The layout search's own figures: step seconds equal, peaks close."""
  graph, outputs = full
  optimizers = []
  for g, o, scale in ((graph, outputs, None),
                      (proxy.graph, proxy.outputs, proxy.scale)):
    estimator = memory_estimator.MemoryEstimator(g, mesh, o)
    optimizers.append(layout_optimizer.LayoutOptimizer(
        estimator, objective="time", machine=MACHINE, proxy_scale=scale))
  for layout in layouts:
    seconds = [o.evaluate_step_seconds(layout) for o in optimizers]
    peaks = [o.evaluate_peak_memory(layout) for o in optimizers]
    assert seconds[1] == pytest.approx(seconds[0], rel=1e-6), layout
    assert peaks[1] == pytest.approx(peaks[0], rel=0.02), layout


@pytest.mark.parametrize("structure", [
    Structure(), Structure(recompute_layers=12),
    Structure(recompute_layers=6)
], ids=lambda s: s.describe())
def test_dense_stack_proxy_prices_like_the_full_graph(structure):
  full, proxy = _full_and_proxy(DENSE, structure)
  _assert_priced_alike(full, proxy, LAYOUTS)
  _assert_searched_alike(full, proxy, LAYOUTS[:2])


def test_pipelined_dense_stack_proxy_prices_like_the_full_graph():
  model = dense_stack_model.DenseStackModel(num_layers=12, batch=16, io=8,
                                            hidden=64, optimizer="adam")
  full, proxy = _full_and_proxy(model, Structure(2, 4, 0))
  mesh = mtf.convert_to_shape("stage:2;mesh_0:2")
  # A pipeline's peak: within 3% (2.2% short here).
  _assert_priced_alike(full, proxy, ("stage:stage",
                                     "stage:stage;batch:mesh_0"), mesh,
                       memory_rel=0.03)


def test_plan_is_the_same_with_and_without_the_proxy():
  model = dense_stack_model.DenseStackModel(num_layers=6, batch=16, io=8,
                                            hidden=64, optimizer="adam")
  with_proxy = mtf.auto_mtf.plan(model, 2, machine=MACHINE)
  without = mtf.auto_mtf.plan(model, 2, machine=MACHINE, proxy=False)
  assert with_proxy.describe() == without.describe() or (
      with_proxy.structure == without.structure and
      with_proxy.layout_rules.to_string == without.layout_rules.to_string
      and with_proxy.zero == without.zero and
      with_proxy.mesh_shape == without.mesh_shape)
  assert with_proxy.predicted_step_seconds == pytest.approx(
      without.predicted_step_seconds, rel=1e-6)
  assert with_proxy.peak_memory_bytes == pytest.approx(
      without.peak_memory_bytes, rel=0.02)


def test_a_graph_model_has_no_proxy():
  graph, outputs = planner._build(DENSE, Structure())  # pylint: disable=protected-access
  assert proxy_layers.build(plan_space.GraphModel(graph, outputs),
                            Structure()) is None


TINY = ["d_model = 8", "d_ff = 8", "num_heads = 2", "d_kv = 4",
        "num_layers = 6", "dropout_rate = 0.0",
        "utils.run.optimizer = @optimize.SgdOptimizer",
        "utils.run.learning_rate_schedule = 0.1"]


def test_transformer_proxy_prices_like_the_full_graph():
  from mesh_tensorflow.transformer import plan_gin  # pylint: disable=g-import-not-at-top
  model = plan_gin.from_gin(["models/lm_base.gin"], TINY, batch_size=4,
                            sequence_length=4, vocab_size=16)
  full, proxy = _full_and_proxy(model, Structure())
  _assert_priced_alike(full, proxy, ("", "batch:mesh_0;heads:mesh_1",
                                     "d_ff:mesh_0;vocab:mesh_1"))
