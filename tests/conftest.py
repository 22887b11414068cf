"""Test set-up: 8 logical CPU devices, configured once per process.

It also makes `mesh_tensorflow.transformer` the `transformer/` folder of this
checkout. An editable install maps that package to the folder it was
installed from, so tests run from another checkout of the repository (a git
worktree sharing one virtual environment) would otherwise test the wrong
code. setup.py's package mapping cannot help there: it is what the editable
install recorded. (tests/test_wheel.py checks the mapping of an ordinary
install.)
"""

import importlib.util
import pathlib
import sys

from tests import mtf_testing


def _import_transformer_from_this_checkout():
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


mtf_testing.configure_logical_devices()
_import_transformer_from_this_checkout()
