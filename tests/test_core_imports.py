"""The core names no strategy: it imports nothing from mesh_tensorflow.strategies.

Strategies plug into the core through mesh_tensorflow.extensions. This
follows every import of the core's modules, transitively, through the
package's own modules (read from source, so nothing is imported), and
fails if one reaches mesh_tensorflow.strategies.
"""

import ast
import os

import pytest

_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                            "mesh_tensorflow")

# The language and its lowering.
CORE = ["lowering", "gradients", "graph", "optimize", "extensions", "shape",
        "mesh_impl", "placement_mesh_impl", "simd_mesh_impl", "tpu_variables",
        "backend"]


def _module_file(module):
  """The source file of `module` (dotted, under mesh_tensorflow) or None."""
  parts = module.split(".")[1:]
  path = os.path.join(_PACKAGE_DIR, *parts)
  if os.path.isdir(path):
    return os.path.join(path, "__init__.py")
  return path + ".py" if os.path.exists(path + ".py") else None


def _imports(module):
  """The mesh_tensorflow modules `module`'s source imports (not the
  package's own __init__, which imports everything)."""
  with open(_module_file(module)) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names = [f"{node.module}.{a.name}" for a in node.names]
      names = [n if _module_file(n) else node.module for n in names]
    else:
      continue
    found.update(n for n in names if n.startswith("mesh_tensorflow.") and
                 _module_file(n))
  return found


def _ops_modules():
  return sorted("mesh_tensorflow.ops." + f[:-3]
                for f in os.listdir(os.path.join(_PACKAGE_DIR, "ops"))
                if f.endswith(".py"))


def _package_modules(package):
  return sorted(f"mesh_tensorflow.{package}." + f[:-3]
                for f in os.listdir(os.path.join(_PACKAGE_DIR, package))
                if f.endswith(".py") and f != "__init__.py")


def _core_modules():
  return (["mesh_tensorflow." + m for m in CORE] + _ops_modules() +
          _package_modules("backend") + _package_modules("storage") +
          _package_modules("randomness"))


def _path_to_strategy(start):
  """An import chain from `start` to a strategy module, or None."""
  parent = {start: None}
  todo = [start]
  while todo:
    module = todo.pop()
    if module.startswith("mesh_tensorflow.strategies"):
      chain = []
      while module is not None:
        chain.append(module)
        module = parent[module]
      return list(reversed(chain))
    for imported in sorted(_imports(module)):
      if imported not in parent:
        parent[imported] = module
        todo.append(imported)
  return None


@pytest.mark.parametrize("module", _core_modules())
def test_core_module_imports_no_strategy(module):
  assert _module_file(module), f"{module} does not exist"
  chain = _path_to_strategy(module)
  assert chain is None, " imports ".join(chain)


def test_the_check_sees_an_import_of_a_strategy():
  # The strategies do import the core; the walk must find such chains.
  assert _path_to_strategy("mesh_tensorflow.strategies.pipelining")
  assert "mesh_tensorflow.extensions" in _imports(
      "mesh_tensorflow.strategies.idle_slots")
  assert "mesh_tensorflow.strategies.gradient_batching" in _imports(
      "mesh_tensorflow.strategies.pipelining")
