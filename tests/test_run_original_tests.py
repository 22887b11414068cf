"""tools/run_original_tests.sh on a small stand-in for the original's tree."""

import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent

_MIXED = """
import unittest
import mesh_tensorflow as mtf


class MixedTest(unittest.TestCase):

  def test_pass(self):
    self.assertEqual(mtf.Dimension("a", 2).size, 2)

  def test_fail(self):
    self.assertEqual(1, 2)

  def test_error(self):
    raise KeyError("boom")

  @unittest.skip("not here")
  def test_skip(self):
    pass


if __name__ == "__main__":
  unittest.main()
"""

# Passes only if this checkout's transformer/ is mesh_tensorflow.transformer
# and the file runs from a scratch folder outside the repository.
_TRANSFORMER = """
import os
import unittest
import mesh_tensorflow.transformer


class TransformerTest(unittest.TestCase):

  def test_this_checkout(self):
    self.assertEqual(
        os.path.realpath(mesh_tensorflow.transformer.__path__[0]),
        os.path.realpath(os.path.join({root!r}, "transformer")))
    self.assertFalse(os.path.realpath(__file__).startswith({root!r}))


if __name__ == "__main__":
  unittest.main()
"""


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(textwrap.dedent(text))


def test_counts_per_file_and_in_total(tmp_path):
  source = tmp_path / "mesh"
  _write(source / "mesh_tensorflow" / "mixed_test.py", _MIXED)
  _write(source / "mesh_tensorflow" / "broken_test.py",
         "import module_that_does_not_exist\n")
  _write(source / "mesh_tensorflow" / "transformer" / "model_test.py",
         _TRANSFORMER.format(root=str(ROOT)))
  _write(source / "mesh_tensorflow" / "experimental" / "skipped_test.py",
         "raise SystemExit('experimental tests must not run')\n")
  scratch_parent = tmp_path / "tmp"
  scratch_parent.mkdir()
  env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(scratch_parent))
  result = subprocess.run(
      ["bash", str(ROOT / "tools" / "run_original_tests.sh"),
       "--list-failures", str(source)],
      capture_output=True, text=True, env=env, timeout=600, check=False)
  out = result.stdout
  assert result.returncode == 0, out + result.stderr
  lines = out.splitlines()
  assert any(line.startswith("mesh_tensorflow/mixed_test.py") and
             "1 passed,   1 failed,   1 errors,   1 skipped" in line
             for line in lines), out
  assert any(line.startswith("mesh_tensorflow/broken_test.py") and
             "0 passed,   0 failed,   1 errors" in line for line in lines), out
  assert any(line.startswith("mesh_tensorflow/transformer/model_test.py") and
             "1 passed,   0 failed,   0 errors" in line
             for line in lines), out
  assert "experimental" not in out
  assert "FAILED __main__.MixedTest.test_fail: AssertionError: 1 != 2" in out
  assert "ModuleNotFoundError" in out
  assert lines[-1] == "2 passed, 3 failed", out
  assert not list(scratch_parent.iterdir())  # The scratch folder is gone.
