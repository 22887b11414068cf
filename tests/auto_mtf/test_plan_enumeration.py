"""plan_enumeration.enumerate_plans: many priced plans spanning every
choice of the planner (issue 49's check against measurement runs them)."""

import pytest

import mesh_tensorflow as mtf
import mesh_tensorflow.auto_mtf  # pylint: disable=unused-import
from mesh_tensorflow.auto_mtf import dense_stack_model
from mesh_tensorflow.auto_mtf import machine as machine_lib
from mesh_tensorflow.auto_mtf import plan_enumeration
from mesh_tensorflow.auto_mtf import plan_space

pytest.importorskip("ortools")

MACHINE = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 2,
    "default_collective": {"latency_seconds": 1e-4,
                           "seconds_per_wire_byte": 1e-9}})
MODEL = dense_stack_model.DenseStackModel(num_layers=2, batch=16, io=8,
                                          hidden=64)


@pytest.fixture(scope="module")
def plans():
  return plan_enumeration.enumerate_plans(MODEL, 8, machine=MACHINE,
                                          max_plans=24)


def _key(p):
  return plan_enumeration.effective_key(p.structure, p.zero, p.mesh_shape,
                                        p.layout_rules)


def test_at_least_24_distinct_plans_spanning_every_choice(plans):
  assert len(plans) == 24
  assert len({_key(p) for p in plans}) == 24
  assert {p.zero for p in plans} == set(plan_space.ZERO_LEVELS)
  assert {p.structure.stages for p in plans} == {1, 2}
  assert len({p.structure.micro_batches for p in plans}) >= 3
  assert {p.structure.recompute_layers > 0 for p in plans} == {True, False}
  assert len({p.mesh_shape for p in plans}) >= 3
  kinds = {p.kind for p in plans}
  assert {"time search", "data parallel", "model parallel"} <= kinds
  for p in plans:
    if p.structure.pipelined:
      assert "stage:stage" in p.layout_rules.split(";")
      assert p.mesh_shape.startswith(f"stage:{p.structure.stages}")
  seconds = [p.predicted_step_seconds for p in plans]
  assert seconds == sorted(seconds)


def test_the_planners_pick_is_the_fastest_predicted(plans):
  pick = mtf.auto_mtf.plan(MODEL, 8, machine=MACHINE)
  assert plans[0].step_time == pick.step_time
  assert plans[0].memory == pick.memory
  assert _key(plans[0]) == plan_enumeration.effective_key(
      pick.structure, pick.zero, pick.mesh_shape, pick.layout_rules)
