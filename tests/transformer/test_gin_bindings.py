"""Gin registration of the core's configurables changes no core object.

Importing `mesh_tensorflow.transformer` registers the original's gin names
for core functions and classes (gin_bindings). Every attribute of every core
module, and every attribute of every core class, is the same object before
and after that import (checked in a fresh interpreter, so that the import
order is known); and the bindings still reach the calls the core makes.
"""

import json
import os
import pathlib
import subprocess
import sys

import gin
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow import configurable
from mesh_tensorflow.transformer.binary import gin_bindings

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SNAPSHOT = r"""
import importlib.util, json, pathlib, sys, types
sys.path.insert(0, sys.argv[1])
import mesh_tensorflow

def import_transformer():
  # This checkout's transformer/, as tests/conftest.py maps it.
  package = pathlib.Path(sys.argv[1]) / "transformer"
  spec = importlib.util.spec_from_file_location(
      "mesh_tensorflow.transformer", package / "__init__.py",
      submodule_search_locations=[str(package)])
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  mesh_tensorflow.transformer = module
  spec.loader.exec_module(module)

def core_modules():
  return {name: m for name, m in sorted(sys.modules.items())
          if isinstance(m, types.ModuleType) and
          (name == "mesh_tensorflow" or name.startswith("mesh_tensorflow."))
          and not name.startswith("mesh_tensorflow.transformer")}

def snapshot():
  ids = {}
  for name, module in core_modules().items():
    for attr, value in list(vars(module).items()):
      ids[f"{name}:{attr}"] = id(value)
      if isinstance(value, type) and value.__module__ == name:
        for cattr, cvalue in list(vars(value).items()):
          ids[f"{name}:{attr}.{cattr}"] = id(cvalue)
  return ids

keep = []  # Holds every snapshotted object, so that no id is reused.
for module in core_modules().values():
  keep.append(dict(vars(module)))
before = snapshot()
assert "mesh_tensorflow.transformer" not in sys.modules
import_transformer()
after = snapshot()
changed = sorted(k for k in before if k in after and before[k] != after[k])
removed = sorted(k for k in before if k not in after)
# New attributes of core modules that are not submodules being imported.
added = sorted(
    k for k in after if k not in before and
    not isinstance(getattr(sys.modules[k.split(":")[0]],
                           k.split(":")[1].split(".")[0], None),
                   types.ModuleType))
print(json.dumps({"count": len(before), "changed": changed,
                  "removed": removed, "added": added}))
"""


def test_importing_the_transformer_changes_no_core_attribute():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, "-c", _SNAPSHOT, str(ROOT)],
                          capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["count"] > 1000, report["count"]  # The snapshot saw the core.
  assert not report["changed"], report["changed"]
  assert not report["removed"], report["removed"]
  assert not report["added"], report["added"]


def test_every_marked_core_callable_gets_its_gin_name():
  registered = [getattr(module, name)
                for module, _, names in gin_bindings.CORE_CONFIGURABLES
                for name in names]
  assert sorted(map(id, registered)) == sorted(
      map(id, configurable.marked()))


@pytest.fixture
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_bindings_reach_the_cores_own_calls(_clear_gin):
  gin.parse_config("""
      import mesh_tensorflow.optimize
      layers.unit_scaling_convention.value = True
      VarianceScalingInitializer.scale = 3.0
      AdafactorOptimizer.beta1 = 0.5
      """)
  assert mtf.layers.unit_scaling_convention() is True
  assert mtf.layers.VarianceScalingInitializer().scale == 3.0
  optimizer = mtf.optimize.AdafactorOptimizer()
  assert type(optimizer) is mtf.optimize.AdafactorOptimizer
  assert optimizer._beta1 == 0.5  # pylint: disable=protected-access
  # An explicit argument wins over the binding, as with gin.
  assert mtf.layers.unit_scaling_convention(False) is False
  # A gin reference builds the core class itself, with the bindings.
  gin.parse_config("""
      import mesh_tensorflow.transformer.utils
      utils.run.optimizer = @optimize.AdafactorOptimizer
      """)
  reference = gin.query_parameter("utils.run.optimizer").scoped_configurable_fn
  built = reference()
  assert type(built) is mtf.optimize.AdafactorOptimizer
  assert built._beta1 == 0.5  # pylint: disable=protected-access
  assert "AdafactorOptimizer.beta1 = 0.5" in gin.operative_config_str()


def test_without_bindings_the_core_runs_as_written(_clear_gin):
  assert mtf.layers.unit_scaling_convention() is False
  optimizer = mtf.optimize.AdafactorOptimizer()
  assert optimizer._beta1 == 0.0  # pylint: disable=protected-access


def test_only_marked_callables_can_be_configured():
  with pytest.raises(ValueError, match="not marked"):
    configurable.set_configured(mtf.layers.dense, print)
