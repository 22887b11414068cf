"""Fixtures shared by the Transformer tests' modules."""

import fcntl
import json
import os

import pytest


def _shared_directory(tmp_path_factory, name):
  """A directory that every test process of this pytest run shares.

  Under pytest-xdist the workers' temporary directories have one parent
  and the run one id (PYTEST_XDIST_TESTRUNUID); without xdist a fresh
  directory of this process.
  """
  run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
  if run_id is None:
    return tmp_path_factory.mktemp(name)
  directory = tmp_path_factory.getbasetemp().parent / f"shared-{run_id}" / name
  directory.mkdir(parents=True, exist_ok=True)
  return directory


@pytest.fixture(scope="session")
def pipelined_lm_run(tmp_path_factory):
  """fn(name) -> dict(dir=model_dir, losses=per-step losses) of the binary's
  training run `name` of tests/transformer/test_pipelined_run.py.

  Each run trains once per pytest run, whichever worker asks first (the
  others wait on a file lock and read its results): the run's own tests and
  the modes that restore its checkpoint (test_pipelined_run_modes.py)
  share it, in whatever worker they land.
  """
  # Late import: the runs' gin lives in that test module.
  from tests.transformer import test_pipelined_run  # pylint: disable=g-import-not-at-top

  def run(name):
    directory = _shared_directory(tmp_path_factory, f"pipelined_lm_{name}")
    model_dir = directory / "model"
    losses_file = directory / "losses.json"
    with open(directory / "lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not losses_file.exists():
        losses = test_pipelined_run.train(model_dir, name)
        # Written last: a run that failed half-way leaves no results.
        losses_file.write_text(json.dumps(losses))
    return dict(dir=model_dir, losses=json.loads(losses_file.read_text()))

  return run
