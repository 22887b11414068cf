"""mtf.auto_mtf.plan on a layer-stacked model: stages, micro-batches,
recompute and sharding levels searched together (the dense stack)."""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.auto_mtf  # pylint: disable=unused-import
from mesh_tensorflow.auto_mtf import dense_stack_model
from mesh_tensorflow.auto_mtf import machine as machine_lib
from mesh_tensorflow.auto_mtf import plan_pricing
from mesh_tensorflow.auto_mtf import planner

pytest.importorskip("ortools")

MACHINE = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 2,
    "default_collective": {"latency_seconds": 1e-4,
                           "seconds_per_wire_byte": 1e-9}})
MODEL = dense_stack_model.DenseStackModel(num_layers=2, batch=16, io=8,
                                          hidden=64)


@pytest.fixture(scope="module")
def unbounded():
  return mtf.auto_mtf.plan(MODEL, 4, machine=MACHINE, max_alternatives=50)


def _rebuilt_price(plan):
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    graph, outputs = MODEL.build(plan.structure, plan.zero,
                                 planner._mesh_string(plan.mesh_shape),  # pylint: disable=protected-access
                                 plan.layout_rules)
  return plan_pricing.price(graph, outputs, plan.mesh_shape,
                            plan.layout_rules, MACHINE)


def test_every_structure_is_searched(unbounded):
  assert unbounded.search.structures == len(MODEL.structures(4))
  assert unbounded.search.exact
  seen = {a.structure for a in unbounded.alternatives} | {
      unbounded.structure}
  assert any(s.pipelined for s in seen) and any(
      s.recompute_layers for s in seen)
  for a in unbounded.alternatives:
    if a.structure.pipelined and a.layout_rules:
      assert "stage:stage" in a.layout_rules.split(";")
      assert a.mesh_shape.startswith(f"stage:{a.structure.stages}")
  assert unbounded.settings["stages"] == unbounded.structure.stages


def test_plan_figures_are_its_graph_priced(unbounded):
  step_time, memory = _rebuilt_price(unbounded)
  assert step_time == unbounded.step_time
  assert memory == unbounded.memory


def test_budget_below_every_plain_plan_picks_a_smaller_structure(unbounded):
  plain = [a.peak_bytes for a in unbounded.alternatives
           if a.structure == mtf.auto_mtf.Structure() and a.step_seconds]
  if unbounded.structure == mtf.auto_mtf.Structure():
    plain.append(unbounded.peak_memory_bytes)
  budget = min(plain) - 1
  result = mtf.auto_mtf.plan(MODEL, 4, memory_budget=budget, machine=MACHINE)
  assert result.peak_memory_bytes <= budget
  assert (result.structure != mtf.auto_mtf.Structure() or
          result.zero != "none")
  step_time, memory = _rebuilt_price(result)
  assert memory.total == result.peak_memory_bytes <= budget
  assert step_time.total == result.predicted_step_seconds


def test_pipelined_time_has_its_bubble():
  structure = mtf.auto_mtf.Structure(stages=2, micro_batches=2)
  model = dense_stack_model.DenseStackModel(num_layers=2, batch=16, io=8,
                                            hidden=64)
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    graph, outputs = model.build(structure)
  step_time, memory = plan_pricing.price(graph, outputs, "stage:2;b:2",
                                         "stage:stage;batch:b", MACHINE)
  # Of M + S - 1 = 3 iterations, each stage idles in S - 1 = 1.
  assert step_time.bubble > 0
  assert step_time.bubble < step_time.compute
  assert memory.parameters > 0


class _NoPipelines(dense_stack_model.DenseStackModel):
  """A model whose pipelined structures cannot be built (as a stack whose
  layers add auxiliary losses)."""

  def build(self, structure, zero="none", mesh_shape=None,
            layout_rules=None):
    if structure.pipelined:
      raise ValueError("auxiliary losses are not pipelined")
    return super().build(structure, zero, mesh_shape, layout_rules)


def test_structures_a_model_cannot_build_are_skipped():
  model = _NoPipelines(num_layers=2, batch=16, io=8, hidden=64)
  result = mtf.auto_mtf.plan(model, 2, machine=MACHINE, max_alternatives=50)
  assert not result.structure.pipelined
  assert not any(a.structure.pipelined for a in result.alternatives)
  plain = [s for s in model.structures(2) if not s.pipelined]
  assert result.search.structures == len(plain)
