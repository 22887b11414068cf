"""The binary with `utils.run.layout_rules = "auto"` (and mesh_shape "auto").

The tiny LM trains with mesh shape and rules searched for the 8 logical
CPUs, then again from its own operative config alone (the chosen strings
given explicitly): same choice, same losses, no search. The tiny
Bitransformer searches the rules of b:2;m:4, in training and in inference
(the same choice: both search the training graph), stopped before the
estimator is built. The search runs with the memory objective (the time
objective's cost model is tested in tests/auto_mtf); the time path through
the binary is checked with a fake search, and once for real on a machine
whose calibration cache is empty (a quick calibration, in seconds), and
with a calibration that fails.
"""

import contextlib
import io
import json
import re

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import api as auto_mtf_api
from mesh_tensorflow.auto_mtf import calibration_subprocess
from mesh_tensorflow.auto_mtf import machine
from mesh_tensorflow.transformer.data import embedded_task
from mesh_tensorflow.transformer import main as main_lib
from mesh_tensorflow.transformer.binary import run_auto_layout
from mesh_tensorflow.transformer.binary import run_devices
from tests.transformer import test_main

LM_FILES = ["models/lm_base.gin", "problems/addition.gin"]
SHORT = ["utils.run.train_steps = 2", "utils.run.iterations_per_loop = 1",
         "utils.run.save_checkpoints_steps = 2",
         "utils.get_variable_dtype.master_dtype = 'float32'",
         "utils.get_variable_dtype.slice_dtype = 'float32'",
         "auto_layout.objective = 'memory'"]
LM = ["run.model_type = 'lm'",
      "utils.run.train_dataset_fn = @lm_targets_dataset_fn"] + SHORT
AUTO_RULES = ["utils.run.layout_rules = 'auto'"]
AUTO_BOTH = ["utils.run.mesh_shape = 'auto'"] + AUTO_RULES


@gin.configurable(module="tests.transformer.test_auto_layout_run")
def lm_targets_dataset_fn(sequence_length, vocabulary, dataset_split="train"):
  """The addition sums' targets alone: text2self examples for an "lm"."""
  dataset = embedded_task.addition_train_dataset_fn(
      sequence_length, vocabulary, dataset_split, pack=False)
  return dataset.map(lambda example: {"targets": example["targets"]})


class _LossRecorder:
  """A stand-in for the progress display: keeps each loop's loss."""
  losses = []

  def after_loop(self, step, loss):
    del step
    _LossRecorder.losses.append(float(loss))


def _train(model_dir, *params, files=test_main.GIN_FILES):
  """(printed text, losses per step) of a training run through main."""
  _LossRecorder.losses = []
  out = io.StringIO()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(main_lib.progress, "ProgressDisplay", _LossRecorder)
    with contextlib.redirect_stdout(out):
      test_main.run_main(model_dir, *params, files=files,
                         extra_flags=["--progress"])
  return out.getvalue(), list(_LossRecorder.losses)


def _choice_line(printed):
  lines = [l for l in printed.splitlines() if l.startswith("auto layout")]
  assert len(lines) == 1, printed
  return lines[0]


def _chosen(line):
  """(mesh_shape, layout_rules) strings of the printed line."""
  mesh = re.search(r"utils.run.mesh_shape = '([^']*)'", line).group(1)
  rules = re.search(r"utils.run.layout_rules = '([^']*)'", line).group(1)
  return mesh, rules


def _operative(model_dir):
  """utils.run's (mesh_shape, layout_rules) in model_dir's operative
  config, as gin reads them."""
  gin.clear_config()
  try:
    gin.parse_config_file(str(model_dir / "operative_config.gin"))
    return (gin.query_parameter("utils.run.mesh_shape"),
            gin.query_parameter("utils.run.layout_rules"))
  finally:
    gin.clear_config()


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
  """The LM trained with mesh shape and rules searched for the 8 devices,
  then from its operative config alone."""
  auto_dir = tmp_path_factory.mktemp("lm_auto")
  printed, auto_losses = _train(auto_dir, *LM, *AUTO_BOTH, files=LM_FILES)
  rerun_dir = tmp_path_factory.mktemp("lm_rerun")
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(test_main, "TINY", [])
    rerun_printed, rerun_losses = _train(
        rerun_dir, files=[str(auto_dir / "operative_config.gin")])
  return dict(printed=printed, auto_dir=auto_dir, auto_losses=auto_losses,
              rerun_printed=rerun_printed, rerun_losses=rerun_losses,
              rerun_dir=rerun_dir)


def test_lm_prints_a_choice_for_the_eight_devices(lm_runs):
  line = _choice_line(lm_runs["printed"])
  assert line.startswith("auto layout (memory): ")
  assert re.search(r"peak_memory=\d+ bytes/processor", line)
  mesh, rules = _chosen(line)
  shape = mtf.convert_to_shape(mesh)
  assert shape.size == run_devices.processor_count() == 8
  assert all(d.name.startswith("mesh_") for d in shape.dims)
  rules = mtf.convert_to_layout_rules(rules)
  assert rules.pairs
  assert {m for _, m in rules.pairs} <= set(shape.dimension_names)


def test_lm_operative_config_holds_the_chosen_strings(lm_runs):
  assert _operative(lm_runs["auto_dir"]) == _chosen(
      _choice_line(lm_runs["printed"]))
  config = (lm_runs["auto_dir"] / "operative_config.gin").read_text()
  assert "'auto'" not in config


def test_rerun_from_the_operative_config_repeats_the_run(lm_runs):
  assert "auto layout" not in lm_runs["rerun_printed"]
  assert _operative(lm_runs["rerun_dir"]) == _operative(lm_runs["auto_dir"])
  assert len(lm_runs["auto_losses"]) == 2
  np.testing.assert_allclose(lm_runs["auto_losses"], lm_runs["rerun_losses"],
                             rtol=1e-5, atol=1e-5)


class _Stop(Exception):
  pass


def _search_only(model_dir, *params, files=test_main.GIN_FILES):
  """(printed text, get_estimator's keyword arguments) of a run through
  main stopped where the estimator would be built."""
  calls = []

  def stop(**kwargs):
    calls.append(kwargs)
    raise _Stop()

  out = io.StringIO()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(test_main.utils, "get_estimator", stop)
    with contextlib.redirect_stdout(out), pytest.raises(_Stop):
      test_main.run_main(model_dir, *params, files=files)
  call, = calls
  return out.getvalue(), call


def test_bitransformer_searches_the_rules_of_the_given_mesh(tmp_path):
  chosen = {}
  for mode in ("train", "infer"):
    printed, call = _search_only(
        tmp_path, *SHORT, *AUTO_RULES, f"utils.run.mode = '{mode}'",
        "utils.run.mesh_shape = 'b:2;m:4'")
    mesh, rules = _chosen(_choice_line(printed))
    assert mesh == "b:2;m:4"
    assert call["mesh_shape"] == mtf.convert_to_shape(mesh)
    assert call["layout_rules"] == mtf.convert_to_layout_rules(rules)
    assert {m for _, m in call["layout_rules"].pairs} <= {"b", "m"}
    chosen[mode] = rules
  # Inference searches the training graph too: the same choice.
  assert chosen["infer"] == chosen["train"]


def test_auto_mesh_with_explicit_rules_is_an_error(tmp_path):
  with pytest.raises(ValueError, match=r'mesh_shape = "auto" needs '
                     r'utils.run.layout_rules = "auto"'):
    test_main.run_main(tmp_path, *SHORT, "utils.run.mesh_shape = 'auto'")


def test_impossible_memory_budget_is_an_error_naming_it(tmp_path):
  with pytest.raises(ValueError, match=r'layout_rules = "auto": the layout '
                     r"search \(objective 'memory'\) failed: no layout fits "
                     r"memory_budget=1000 bytes"):
    test_main.run_main(tmp_path, *SHORT, *AUTO_RULES,
                       "utils.run.mesh_shape = 'b:2;m:4'",
                       "auto_layout.memory_budget = 1000")


def test_search_without_an_optimizer_is_an_error(tmp_path):
  with pytest.raises(ValueError, match="training graph, in every mode: it "
                     "needs utils.run.optimizer"):
    test_main.run_main(tmp_path, *SHORT, *AUTO_RULES,
                       "utils.run.mesh_shape = 'b:2;m:4'",
                       "utils.run.mode = 'infer'",
                       "utils.run.optimizer = None")


def test_per_replica_batch_size_is_an_error(tmp_path):
  with pytest.raises(ValueError, match="does not depend on the layout"):
    test_main.run_main(
        tmp_path, *SHORT, *AUTO_RULES,
        "utils.run.batch_size = ('sequences_per_replica', 2)")


@pytest.mark.parametrize("uneven", [False, True])
def test_time_objective_settings_reach_the_search(tmp_path, uneven):
  """The default objective is "time"; gin's budget and machine (and
  utils.run.allow_uneven_splits) reach choose_layout, and the predicted
  step time is printed."""
  calls = []
  chosen = auto_mtf_api.LayoutChoice(
      layout_rules=mtf.convert_to_layout_rules("batch:mesh_0"),
      mesh_shape=mtf.convert_to_shape("mesh_0:8"), objective="time",
      peak_memory_bytes=1000, predicted_step_seconds=0.00125,
      search_seconds=0.5)

  def fake_choose_layout(graph, mesh_shape, outputs, **kwargs):
    calls.append((graph, mesh_shape, outputs, kwargs))
    return chosen

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(auto_mtf_api, "choose_layout", fake_choose_layout)
    params = [p for p in SHORT if not p.startswith("auto_layout")]
    printed, _ = _search_only(tmp_path, *params, *AUTO_BOTH,
                              "auto_layout.memory_budget = 123456",
                              "auto_layout.machine = '/nowhere/machine.json'",
                              *(["utils.run.allow_uneven_splits = True"]
                                if uneven else []))
  (graph, mesh_shape, outputs, kwargs), = calls
  assert mesh_shape == 8
  assert kwargs == dict(objective="time", memory_budget=123456,
                        machine="/nowhere/machine.json",
                        max_mesh_shape_dimensions=2,
                        shard_weight_update=False, shard_parameters=False,
                        quick_calibration=False, allow_uneven=uneven)
  assert isinstance(graph, mtf.Graph) and graph.trainable_variables
  # The graph is the training step's: the loss, and optimizer updates.
  assert [t.shape.dims for t in outputs] == [[]]
  assert any(type(op).__name__ == "Assign" for op in graph.operations)
  line = _choice_line(printed)
  assert "auto layout (time): mesh_shape=" in line
  assert "utils.run.mesh_shape = 'mesh_0:8'" in line
  assert "predicted_step=1.250 ms" in line


TIME_OBJECTIVE = [p for p in SHORT if not p.startswith("auto_layout")]


def _cache_files(cache_dir):
  """{file name: cache key} of the machine constants cached there."""
  return {path.name: json.loads(path.read_text())["key"]
          for path in cache_dir.glob("machine_*.json")}


def test_time_objective_calibrates_a_new_machine_once(tmp_path, monkeypatch):
  """The default objective on a machine with nothing cached: the binary
  measures it (quickly here), caches it, and the next run reads it."""
  cache_dir = tmp_path / "cache"
  monkeypatch.setenv(machine.CACHE_DIR_ENV, str(cache_dir))
  params = [*TIME_OBJECTIVE, *AUTO_RULES, "utils.run.mesh_shape = 'b:2;m:4'",
            "auto_layout.quick_calibration = True"]
  printed, call = _search_only(tmp_path / "first", *params)
  line = _choice_line(printed)
  assert line.startswith("auto layout (time): ")
  assert re.search(r"predicted_step=\d+\.\d+ ms", line)
  mesh, rules = _chosen(line)
  assert mesh == "b:2;m:4"
  assert call["layout_rules"] == mtf.convert_to_layout_rules(rules)
  (key,) = _cache_files(cache_dir).values()
  assert "mesh_shape" not in key and key["quick"]
  assert key["devices"] == "8 CPU" and key["num_processors"] == 8

  def measure_again(*args, **kwargs):
    raise AssertionError("calibrated although the cache holds the machine")
  monkeypatch.setattr(machine, "calibrate_devices", measure_again)
  printed, _ = _search_only(tmp_path / "second", *params)
  assert _chosen(_choice_line(printed)) == (mesh, rules)


@pytest.mark.parametrize("where", ["in_process", "subprocess"])
def test_failed_calibration_is_one_paragraph_with_the_fix(
    tmp_path, monkeypatch, capsys, where):
  """A measurement that fails (in this process, or in the fresh process a
  graph-mode program measures in) ends the binary with one paragraph:
  what failed, and how to measure or do without; exit status 1."""
  monkeypatch.setenv(machine.CACHE_DIR_ENV, str(tmp_path / "cache"))
  if where == "in_process":
    def out_of_memory(*args, **kwargs):
      raise tf.errors.ResourceExhaustedError(
          None, None, "OOM when allocating tensor with shape[1024,1024]")
    monkeypatch.setattr(machine, "calibrate_devices", out_of_memory)
    reason = r"ResourceExhaustedError: OOM when allocating tensor"
  else:
    # As in a tf.compat.v1 graph-mode program; the child never finishes.
    monkeypatch.setattr(machine, "_runs_eagerly", lambda: False)
    monkeypatch.setattr(calibration_subprocess, "TIMEOUT_SECONDS", 0.01)
    reason = r"the calibration process did not finish within 0\.01 s"
  with pytest.raises(SystemExit) as exit_info:
    test_main.run_main(tmp_path / "run", *TIME_OBJECTIVE, *AUTO_RULES,
                       "utils.run.mesh_shape = 'b:2;m:4'", with_errors=True)
  assert exit_info.value.code == 1
  err = capsys.readouterr().err
  assert "Traceback" not in err
  error = err.strip().splitlines()[-1]
  assert error.startswith('error: ValueError: utils.run.layout_rules = '
                          '"auto": the layout search (objective \'time\') '
                          "needs this machine's constants, and measuring "
                          "them failed: "), error
  assert re.search(reason, error), error
  assert ("run `python -m mesh_tensorflow.auto_mtf.calibration --mesh_shape "
          "'b:2;m:4' --mesh_impl placement --logical_cpus 8") in error
  assert "auto_layout.objective = 'memory'" in error
  assert "auto_layout.machine" in error
  assert not (tmp_path / "cache").exists() or not list(
      (tmp_path / "cache").glob("machine_*.json"))


def test_processor_count_follows_the_devices(monkeypatch):
  assert run_devices.processor_count() == len(
      tf.config.list_logical_devices("CPU"))
  assert run_devices.processor_count(["/cpu:0", "/cpu:1", "/cpu:2"]) == 3

  class Topology:
    mesh_shape = [2, 2, 1, 2]
  monkeypatch.setattr(run_devices.tpu_cluster, "initialize",
                      lambda cluster: Topology())
  assert run_devices.processor_count(None, object()) == 8


def test_wants_search():
  assert run_auto_layout.wants_search("b:2;m:4", "auto")
  assert run_auto_layout.wants_search("auto", " Auto ")
  assert not run_auto_layout.wants_search("b:2", "batch:b")
