"""The binary with `utils.run.plan = "auto"`: it plans at start-up.

The tiny Bitransformer (one block per stack) plans itself for 2 mesh
devices with given machine constants (nothing is measured) within a
memory budget, prints the plan's table, trains two steps with the plan's
settings and records them in operative_config.gin; rerun from that config
alone it repeats the plan without planning, with the same losses. With an
explicit mesh shape the plan is for its processor count; a pipelined plan
(two blocks per stack, the structure forced) trains and reruns likewise. A
budget nothing fits, a plan with explicit layout rules, and a mesh shape
and mesh devices of different counts end the binary with one paragraph.
"""

import gin
import numpy as np
import pytest

from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import planner
from mesh_tensorflow.transformer import main as main_lib
from mesh_tensorflow.transformer import plan_model
from mesh_tensorflow.transformer.binary import run_auto_layout
from mesh_tensorflow.transformer.binary import run_plan
from tests.transformer import test_auto_layout_run
from tests.transformer import test_main

pytest.importorskip("ortools")

MACHINE = ("{'flops_per_second': 1e10, 'elementwise_bytes_per_second': 1e10, "
           "'op_overhead_seconds': 1e-5, 'concurrency': 2, "
           "'default_collective': {'latency_seconds': 1e-4, "
           "'seconds_per_wire_byte': 1e-9}}")
PLAN = ["utils.run.plan = 'auto'", "utils.run.mesh_shape = 'auto'",
        "utils.run.layout_rules = 'auto'",
        "utils.run.mesh_devices = ['cpu:0', 'cpu:1']",
        # Fewer operations per variable than Adafactor: quicker builds.
        "utils.run.optimizer = @optimize.SgdOptimizer",
        "utils.run.train_steps = 2", "utils.run.iterations_per_loop = 1",
        "utils.run.save_checkpoints_steps = 2",
        f"auto_layout.machine = {MACHINE}"]
# Below the peak of the replicated plan: the plan lays the model out.
BUDGET = 800000
_RUN = "utils.run"


class _Calls:
  """Counts planner.plan's calls and keeps their plans; keeps
  get_estimator's keyword arguments."""

  def __init__(self, patch):
    self.plans, self.estimators = [], []
    real_plan = planner.plan
    real_estimator = test_main.utils.get_estimator

    def plan(*args, **kwargs):
      self.plans.append(real_plan(*args, **kwargs))
      return self.plans[-1]

    def get_estimator(**kwargs):
      self.estimators.append(kwargs)
      return real_estimator(**kwargs)
    patch.setattr(planner, "plan", plan)
    patch.setattr(test_main.utils, "get_estimator", get_estimator)


# The tiny LM (one stack: cheaper than two) with two blocks (2 stages of
# whole blocks), on an explicit mesh shape of 2 processors (the plan picks
# their shape).
PIPELINED = [p for p in PLAN if "mesh_" not in p] + [
    "utils.run.mesh_shape = 'all:2'", "num_layers = 2",
    "run.model_type = 'lm'",
    "utils.run.train_dataset_fn = "
    "@tests.transformer.test_auto_layout_run.lm_targets_dataset_fn"]
STAGES = plan_space.Structure(stages=2, micro_batches=2)


def _run(model_dir, *params, files=test_main.GIN_FILES):
  with pytest.MonkeyPatch.context() as patch:
    calls = _Calls(patch)
    # pylint: disable=protected-access
    printed, losses = test_auto_layout_run._train(model_dir, *params,
                                                  files=files)
    # pylint: enable=protected-access
  return dict(printed=printed, losses=losses, calls=calls, dir=model_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The planned run, then a rerun from its operative config alone."""
  planned = _run(tmp_path_factory.mktemp("planned"), *PLAN,
                 f"auto_layout.memory_budget = {BUDGET}")
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(test_main, "TINY", [])
    rerun = _run(tmp_path_factory.mktemp("rerun"),
                 files=[str(planned["dir"] / "operative_config.gin")])
  return planned, rerun


def _rerun(model_dir):
  """A run from model_dir's operative config alone."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(test_main, "TINY", [])
    return _run(model_dir.parent / (model_dir.name + "_rerun"),
                files=[str(model_dir / "operative_config.gin")])


@pytest.fixture(scope="module")
def pipelined_runs(tmp_path_factory):
  """A plan for utils.run.mesh_shape's processors whose structure is
  forced to a pipeline, then a rerun from its operative config alone."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(plan_model.TransformerPlanModel, "structures",
                  lambda self, num_processors: [STAGES])
    planned = _run(tmp_path_factory.mktemp("pipelined"), *PIPELINED,
                   files=test_auto_layout_run.LM_FILES)
  return planned, _rerun(planned["dir"])


def _operative(model_dir, names):
  """{name: value} of gin parameters in model_dir's operative config."""
  gin.clear_config()
  try:
    gin.parse_config_file(str(model_dir / "operative_config.gin"))
    return {name: gin.query_parameter(name) for name in names}
  finally:
    gin.clear_config()


def test_planned_run_trains_with_the_plan_and_records_it(runs):
  planned, _ = runs
  plan, = planned["calls"].plans
  assert "Plan: " + plan.describe() in planned["printed"]
  assert "peak memory per processor" in planned["printed"]
  assert plan.mesh_shape.size == 2 and plan.memory_budget == BUDGET
  estimator, = planned["calls"].estimators
  assert estimator["mesh_shape"] == plan.mesh_shape
  assert estimator["layout_rules"] == plan.layout_rules
  assert (estimator["shard_weight_update"], estimator["shard_parameters"]) == (
      plan.zero != "none", plan.zero == "parameters")
  assert len(planned["losses"]) == 2
  assert all(np.isfinite(planned["losses"]))
  values = run_plan.run_values(plan)
  bindings = dict(line.split(" = ", 1) for line in
                  run_plan.stack_bindings(plan))
  assert any(key.startswith("encoder/") for key in bindings)
  operative = _operative(planned["dir"],
                         [f"{_RUN}.{name}" for name in values] +
                         [f"{_RUN}.plan"] + list(bindings))
  assert operative.pop(f"{_RUN}.plan") is None
  for name, value in values.items():
    assert operative.pop(f"{_RUN}.{name}") == value, name
  for key, value in bindings.items():
    assert repr(operative[key]) == value, key
  config = (planned["dir"] / "operative_config.gin").read_text()
  assert "'auto'" not in config


def test_rerun_from_the_operative_config_does_not_plan(runs):
  planned, rerun = runs
  assert not rerun["calls"].plans
  assert "Plan: " not in rerun["printed"]
  estimator, = rerun["calls"].estimators
  first, = planned["calls"].estimators
  for name in ("mesh_shape", "layout_rules", "shard_weight_update",
               "shard_parameters"):
    assert estimator[name] == first[name], name
  np.testing.assert_allclose(planned["losses"], rerun["losses"],
                             rtol=1e-5, atol=1e-5)


def _error(tmp_path, capsys, *params):
  """The one paragraph the binary ends with (exit status 1)."""
  with pytest.raises(SystemExit) as exit_info:
    test_main.run_main(tmp_path, *params, with_errors=True)
  assert exit_info.value.code == 1
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return err.strip().splitlines()[-1]


def test_a_budget_nothing_fits_is_one_paragraph(tmp_path, capsys):
  error = _error(tmp_path, capsys, *PLAN, "auto_layout.memory_budget = 1000")
  assert error.startswith(
      "error: ValueError: utils.run.plan = 'auto' on 2 processors with "
      "auto_layout.memory_budget = 1000: no plan fits memory_budget=1000 B "
      "(1000 bytes) per processor on 2 processors. The smallest peak any "
      "plan reaches is "), error
  assert "with mesh mesh_0:2, layout " in error
  assert "sharding level 'parameters'" in error
  assert "Raise the budget" in error


def test_pipelined_plan_for_the_mesh_shapes_processors_trains(
    pipelined_runs):
  planned, _ = pipelined_runs
  plan, = planned["calls"].plans
  # Planned for utils.run.mesh_shape = 'all:2''s 2 processors.
  assert plan.structure == STAGES and plan.mesh_shape.size == 2
  assert "stage:stage" in plan.layout_rules.to_string.split(",")
  assert "Plan: " + plan.describe() in planned["printed"]
  estimator, = planned["calls"].estimators
  assert estimator["mesh_shape"] == plan.mesh_shape
  assert estimator["layout_rules"] == plan.layout_rules
  assert len(planned["losses"]) == 2
  assert all(np.isfinite(planned["losses"]))
  # Read while the model was built, so recorded: the stack was pipelined.
  operative = _operative(planned["dir"], [
      f"transformer.PipelinedLayerStack.{name}"
      for name in ("num_stages", "num_microbatches")] + [
          f"{_RUN}.mesh_shape", f"{_RUN}.plan"])
  assert operative.pop(f"{_RUN}.plan") is None
  assert operative.pop(f"{_RUN}.mesh_shape") == run_plan.run_values(plan)[
      "mesh_shape"]
  assert set(operative.values()) == {2}, operative


def test_pipelined_rerun_from_the_operative_config_does_not_plan(
    pipelined_runs):
  planned, rerun = pipelined_runs
  assert not rerun["calls"].plans
  estimator, = rerun["calls"].estimators
  first, = planned["calls"].estimators
  for name in ("mesh_shape", "layout_rules", "shard_weight_update",
               "shard_parameters"):
    assert estimator[name] == first[name], name
  np.testing.assert_allclose(planned["losses"], rerun["losses"],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("given", [[], ["utils.run.mesh_shape = 'auto'"]])
def test_plan_with_explicit_layout_rules_is_an_error_naming_them(
    tmp_path, capsys, given):
  error = _error(tmp_path, capsys, "utils.run.plan = 'auto'", *given)
  assert error.startswith(
      "error: ValueError: utils.run.plan = 'auto' picks the layout rules, "
      "but the run gives utils.run.layout_rules = 'batch:batch,d_ff:model,"
      "heads:model,vocab:model' (defaults.gin gives some): set "
      "utils.run.layout_rules = 'auto' with the plan"), error


def test_plan_with_a_mesh_shape_and_other_mesh_devices_is_an_error(
    tmp_path, capsys):
  error = _error(tmp_path, capsys, *PLAN, "utils.run.mesh_shape = 'all:4'")
  assert error.startswith(
      "error: ValueError: utils.run.plan = 'auto' plans for the processors "
      "of utils.run.mesh_shape = 'all:4' (4), but utils.run.mesh_devices "
      "lists 2"), error


def test_planned_processors():
  assert run_plan.planned_processors("batch:2;model:4") == 8
  assert run_plan.planned_processors("all:2", ["cpu:0", "cpu:1"]) == 2
  assert run_plan.planned_processors("auto", ["cpu:0", "cpu:1", "cpu:2"]) == 3


def test_the_binary_splits_the_cpu_for_a_planned_mesh_shapes_processors():
  """main splits the CPU before TensorFlow starts into as many logical
  devices as the plan is for."""
  gin.clear_config()
  try:
    gin.parse_config(["utils.run.plan = 'auto'",
                      "utils.run.mesh_shape = 'batch:2;model:4'",
                      "utils.run.layout_rules = 'auto'"], skip_unknown=True)
    assert main_lib._mesh_size() == 8  # pylint: disable=protected-access
  finally:
    gin.clear_config()


def test_wants_plan():
  assert not run_plan.wants_plan(None, "b:2", "batch:b")
  assert run_plan.wants_plan("auto", "auto", " Auto ")
  assert run_plan.wants_plan("auto", "batch:2;model:4", "auto")
  with pytest.raises(ValueError, match="must be None or 'auto', got 'yes'"):
    run_plan.wants_plan("yes", "auto", "auto")


def test_layout_search_settings_are_gin():
  gin.clear_config()
  try:
    gin.parse_config(["auto_layout.memory_budget = 123",
                      "auto_layout.quick_calibration = True"])
    settings = run_auto_layout.search_settings()
  finally:
    gin.clear_config()
  assert settings == dict(objective="time", memory_budget=123, machine=None,
                          max_mesh_shape_dimensions=2,
                          quick_calibration=True)
