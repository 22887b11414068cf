"""Test set-up: 8 logical CPU devices, configured once per process.

It also makes `mesh_tensorflow.transformer` the `transformer/` folder of this
checkout (see this_checkout), and provides `shared_result`: an expensive
value computed once per pytest run, whichever worker asks first.
"""

import fcntl
import os
import pickle

import pytest

from tests import mtf_testing
from tests import this_checkout

mtf_testing.configure_logical_devices()
this_checkout.import_transformer()


@pytest.fixture(scope="session")
def shared_result(tmp_path_factory):
  """fn(key, compute) -> compute()'s (picklable) result, computed once per
  pytest run.

  Under pytest-xdist the workers' temporary directories have one parent and
  the run one id (PYTEST_XDIST_TESTRUNUID): the first worker to ask for
  `key` computes it while the others wait on a file lock, then all read the
  stored result. Without xdist a directory of this process.
  """
  run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
  if run_id is None:
    directory = tmp_path_factory.mktemp("shared_results")
  else:
    directory = (tmp_path_factory.getbasetemp().parent / f"shared-{run_id}" /
                 "shared_results")
    directory.mkdir(parents=True, exist_ok=True)

  def get(key, compute):
    path = directory / f"{key}.pkl"
    with open(directory / f"{key}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not path.exists():
        partial = directory / f"{key}.partial"
        with open(partial, "wb") as f:
          pickle.dump(compute(), f)
        # Renamed last: a computation that failed half-way leaves nothing.
        os.replace(partial, path)
    with open(path, "rb") as f:
      return pickle.load(f)

  return get


def pytest_configure(config):
  # pytest-xdist's mark; declared here too for runs with -p no:xdist.
  config.addinivalue_line(
      "markers", "xdist_group(name): run these tests on one xdist worker")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
  """Keeps each module with a module- or class-scoped fixture on one worker.

  Such fixtures (a training run, a decode, a built wheel) are computed once
  per worker that runs any of the module's tests, and xdist's default
  scheduling deals tests out one by one: a module split over both workers
  computed them twice. With `--dist loadgroup` (the Makefile's) each of
  these modules is one unit; other tests are still dealt out one by one.
  Runs first, so that xdist's own hook sees the marks.
  """
  for item in items:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
      continue
    scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs}
    if scopes & {"module", "class"}:
      item.add_marker(pytest.mark.xdist_group(item.module.__name__))
