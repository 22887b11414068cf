"""mtf.auto_mtf.plan under a budget that rules out the plain plans.

A dense stack (Adam's slots make plain data parallelism's peak big, its
batch plain model parallelism's) on 8 processors, planned within 0.8 of
the smaller of their predicted peaks (benchmarks/plan_feasibility.py): the
pick is neither plain plan, fits the budget as predicted and as counted in
its lowered step (the bytes alive at each processor's peak, the method of
benchmarks/recompute_memory.py), and trains to the one-processor losses.
"""

import pathlib
import sys
from types import SimpleNamespace

import pytest

from mesh_tensorflow.auto_mtf import machine as machine_lib
from mesh_tensorflow.auto_mtf import plan_space

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] /
                       "benchmarks"))
import plan_feasibility  # pylint: disable=g-import-not-at-top,wrong-import-position

pytest.importorskip("ortools")

MACHINE = machine_lib.machine_constants({
    "flops_per_second": 1e10, "elementwise_bytes_per_second": 1e10,
    "op_overhead_seconds": 1e-5, "concurrency": 2,
    "default_collective": {"latency_seconds": 1e-4,
                           "seconds_per_wire_byte": 1e-9}})


@pytest.fixture(scope="module")
def record():
  model = plan_feasibility.make_model("dense", layers=2, batch=128, io=32,
                                      hidden=64)
  return plan_feasibility.feasibility("dense", model, 8, MACHINE,
                                      fraction=0.8, steps=2)


def test_the_budget_rules_out_plain_data_and_model_parallelism(record):
  assert "error" not in record, record.get("error")
  assert record["budget"] < record["data_parallel"]["peak_bytes"]
  assert record["budget"] < record["model_parallel"]["peak_bytes"]


def test_the_pick_is_neither_plain_plan(record):
  assert record["pick"]["kind"] == "other", record["pick"]


def test_the_pick_fits_as_predicted_and_as_counted(record):
  budget = record["budget"]
  assert record["pick"]["predicted_peak_bytes"] <= budget
  for schedule, peak in record["counted_peak_bytes"].items():
    assert 0 < peak <= budget, (schedule, record["counted_bytes"])


def test_the_pick_trains_to_the_one_processor_losses(record):
  assert len(record["losses"]) == 2
  assert record["losses"][1] < record["losses"][0]
  assert record["loss_rel_diff"] < 1e-5, (record["losses"],
                                          record["one_processor_losses"])


@pytest.mark.parametrize("structure,zero,mesh,rules,expected", [
    ((), "none", "mesh_0:8", "batch:mesh_0", "data_parallel"),
    ((), "none", "mesh_0:2;mesh_1:4", "io:mesh_0;hidden:mesh_1",
     "model_parallel"),
    ((), "none", "mesh_0:8", "hidden:mesh_0", "model_parallel"),
    ((), "none", "mesh_0:8", "", "replicated"),
    ((), "none", "mesh_0:4;mesh_1:2", "batch:mesh_0;hidden:mesh_1", "other"),
    # The batch over one of two mesh dimensions, the other idle: not plain
    # data parallelism (half its processors compute copies).
    ((), "none", "mesh_0:4;mesh_1:2", "batch:mesh_0", "other"),
    ((), "weight_update", "mesh_0:8", "batch:mesh_0", "other"),
    ((1, 1, 1), "none", "mesh_0:8", "hidden:mesh_0", "other"),
    ((2, 2, 0), "none", "stage:2;mesh_0:4", "stage:stage;batch:mesh_0",
     "other")])
def test_kind(structure, zero, mesh, rules, expected):
  plan = SimpleNamespace(structure=plan_space.Structure(*structure),
                         zero=zero, mesh_shape=mesh, layout_rules=rules)
  assert plan_feasibility.kind(plan) == expected


def test_alternatives_over_the_budget_say_so(record):
  """An alternative the search thought fits, over the budget once priced
  on the graph it runs, is listed as not fitting, after those that fit."""
  budget = record["budget"]
  fitting = True
  for a in record["alternatives"]:
    if a["peak_bytes"] > budget:
      assert a["reason"].startswith("does not fit"), a
      fitting = False
    else:
      assert fitting, ("a fitting alternative after one that does not",
                       record["alternatives"])
      assert not a["reason"].startswith("does not fit"), a
