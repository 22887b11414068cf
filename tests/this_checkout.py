"""Makes `mesh_tensorflow.transformer` the `transformer/` folder of this
checkout.

An editable install maps that package to the folder it was installed from,
so tests run from another checkout of the repository (a git worktree sharing
one virtual environment) would otherwise test the wrong code. setup.py's
package mapping cannot help there: it is what the editable install recorded.
(tests/test_wheel.py checks the mapping of an ordinary install.) conftest.py
calls it, and so do test scripts run as subprocesses.
"""

import importlib.util
import pathlib
import sys


def import_transformer():
  """Imports this checkout's transformer/ as mesh_tensorflow.transformer
  (unless that package is already imported)."""
  root = pathlib.Path(__file__).resolve().parent.parent
  package = root / "transformer"
  name = "mesh_tensorflow.transformer"
  loaded = sys.modules.get(name)
  if loaded is not None or not (package / "__init__.py").exists():
    return
  import mesh_tensorflow  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      name, package / "__init__.py",
      submodule_search_locations=[str(package)])
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  mesh_tensorflow.transformer = module
  spec.loader.exec_module(module)
