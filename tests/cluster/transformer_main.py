"""Runs the Transformer binary of this checkout: `python -m
tests.cluster.transformer_main FLAGS...`.

`python -m mesh_tensorflow.transformer.main` would run the checkout the
package was installed from (an editable install maps the package to its
folder), which need not be this one (see tests/conftest.py).
"""

import importlib.util
import pathlib
import sys

import mesh_tensorflow

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _import_transformer_from_this_checkout():
  package = ROOT / "transformer"
  name = "mesh_tensorflow.transformer"
  spec = importlib.util.spec_from_file_location(
      name, package / "__init__.py",
      submodule_search_locations=[str(package)])
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  mesh_tensorflow.transformer = module
  spec.loader.exec_module(module)


if __name__ == "__main__":
  _import_transformer_from_this_checkout()
  from mesh_tensorflow.transformer import main  # pylint: disable=g-import-not-at-top
  main.console_entry_point()
