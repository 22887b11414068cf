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
from tests import xdist_groups

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


# Keeps each module with a module- or class-scoped fixture on one xdist
# worker (pytest finds the hook here by its name).
pytest_collection_modifyitems = xdist_groups.pytest_collection_modifyitems


def pytest_configure(config):
  # pytest-xdist's mark; declared here too for runs with -p no:xdist.
  config.addinivalue_line(
      "markers", "xdist_group(name): run these tests on one xdist worker")
