"""utils.run resolves its settings once, into one ResolvedRun.

The binary's main calls utils.run once, also when the layout search picks
the mesh shape and rules: run does not call itself again through gin. The
mode drivers receive that ResolvedRun (and the estimator built from it),
and the operative config holds the chosen layout. The search and the
estimator are stand-ins here: the real ones are tested in
test_auto_layout_run.py and test_main.py.
"""

import dataclasses

import gin
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import api as auto_mtf_api
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer.binary import run_modes
from mesh_tensorflow.transformer.binary import run_resolution
from tests.transformer import test_main

CHOICE = auto_mtf_api.LayoutChoice(
    layout_rules=mtf.convert_to_layout_rules("batch:mesh_0"),
    mesh_shape=mtf.convert_to_shape("mesh_0:8"), objective="memory",
    peak_memory_bytes=1000)
AUTO = ["utils.run.mesh_shape = 'auto'", "utils.run.layout_rules = 'auto'",
        "auto_layout.objective = 'memory'"]
REAL_RUN = utils.run


def _run_main(model_dir, monkeypatch, *params):
  """What one run of main did: utils.run's calls, get_estimator's keyword
  arguments, and each mode driver's (run, estimator, operative config)."""
  calls = dict(run=[], estimator=[], driver=[])

  def counting_run(**kwargs):
    calls["run"].append(kwargs)
    return REAL_RUN(**kwargs)

  def fake_estimator(**kwargs):
    calls["estimator"].append(kwargs)
    return "the estimator"

  def driver(run, estimator):
    calls["driver"].append((run, estimator, gin.operative_config_str()))

  monkeypatch.setattr(utils, "run", counting_run)
  monkeypatch.setattr(utils, "get_estimator", fake_estimator)
  monkeypatch.setattr(auto_mtf_api, "choose_layout",
                      lambda *args, **kwargs: CHOICE)
  for mode in run_modes.DRIVERS:
    monkeypatch.setitem(run_modes.DRIVERS, mode, driver)
  test_main.run_main(model_dir, *params)
  return calls


def test_layout_search_resolves_once(tmp_path, monkeypatch):
  calls = _run_main(tmp_path, monkeypatch, *AUTO)
  assert len(calls["run"]) == 1
  (run, estimator, operative), = calls["driver"]
  assert isinstance(run, run_resolution.ResolvedRun)
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.batch_size = 1
  assert estimator == "the estimator"
  assert run.layout_choice is CHOICE
  assert run.mesh_shape == CHOICE.mesh_shape
  assert run.layout_rules == CHOICE.layout_rules
  assert (run.batch_size, run.train_steps) == (8, test_main.TRAIN_STEPS)
  assert run.sequence_length == {"inputs": 8, "targets": 8}
  (kwargs,) = calls["estimator"]
  assert kwargs["mesh_shape"] == CHOICE.mesh_shape
  assert kwargs["layout_rules"] == CHOICE.layout_rules
  # Recorded as if gin had given them: a rerun repeats them.
  assert "mesh_shape = 'mesh_0:8'" in operative
  assert "layout_rules = 'batch:mesh_0'" in operative
  assert "'auto'" not in operative


def test_every_mode_gets_the_resolved_run(tmp_path, monkeypatch):
  assert set(run_modes.DRIVERS) == set(utils.MODES)
  for mode in utils.MODES:
    calls = _run_main(tmp_path / mode, monkeypatch,
                      f"utils.run.mode = '{mode}'",
                      "utils.run.dataset_split = 'validation'"
                      if mode != "train" else "utils.run.ensemble_inputs = 2")
    (run, estimator, _), = calls["driver"]
    assert run.mode == mode and estimator == "the estimator"
    assert run.layout_choice is None
    assert run.mesh_shape == mtf.convert_to_shape("batch:2;model:2")
    assert run.ensemble_inputs == (2 if mode == "train" else None)
    (kwargs,) = calls["estimator"]
    assert kwargs["score_in_predict_mode"] == (mode in (
        "score_eval", "score_from_strings", "score_from_dataset",
        "export_score"))
