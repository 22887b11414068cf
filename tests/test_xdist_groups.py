"""Under `--dist loadgroup` a module's tests that share a module-scoped
fixture run on one xdist worker, so the fixture is computed once.

A small test file in tmp_path runs under `pytest -n 2 --dist loadgroup`
with tests/xdist_groups.py as its only plugin (no TensorFlow): six tests
share a module fixture that records the process it runs in.
"""

import os
import subprocess
import sys

from tests import readme_testing

_PROBE = """
import os
import pytest


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  with open(os.environ["SETUPS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
  return os.getpid()


@pytest.mark.parametrize("i", range(6))
def test_uses_the_module_fixture(shared, i):
  assert shared == os.getpid()
"""


def test_module_fixture_is_computed_once_under_loadgroup(tmp_path):
  (tmp_path / "test_probe.py").write_text(_PROBE)
  setups = tmp_path / "setups.txt"
  env = dict(os.environ, SETUPS=str(setups),
             PYTHONPATH=str(readme_testing.ROOT))
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist",
       "loadgroup", "--noconftest", "-p", "tests.xdist_groups", "-p",
       "no:cacheprovider", "test_probe.py"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert "6 passed" in result.stdout, result.stdout
  assert len(setups.read_text().split()) == 1, setups.read_text()
