"""No import cycles among the package's own modules, so none comes back.

tools/find_import_cycles.py reads the source (module-level imports and those
inside functions) of mesh_tensorflow and of transformer/ as
mesh_tensorflow.transformer. A package's `__init__` re-exporting its
submodules, and `import mesh_tensorflow as mtf` in a submodule, are not
cycles.
"""

import importlib.util
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
  path = os.path.join(REPO, "tools", "find_import_cycles.py")
  spec = importlib.util.spec_from_file_location("find_import_cycles", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_no_import_cycles():
  tool = _tool()
  edges, _ = tool.import_graph()
  cycles = tool.strongly_connected_components(edges)
  assert not cycles, "import cycles: " + "; ".join(
      " <-> ".join(c) for c in cycles)


def test_finds_a_cycle_through_a_function_level_import(tmp_path):
  """The checker itself: a cycle closed inside a function is found."""
  tool = _tool()
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "__init__.py").write_text("from pkg import a\n")
  (package / "a.py").write_text("from pkg import b\n")
  (package / "b.py").write_text(
      "def f():\n  from pkg import a\n  return a\n")
  (package / "c.py").write_text("import pkg\n")
  original = tool.PACKAGE_ROOTS
  tool.PACKAGE_ROOTS = (("pkg", str(package)),)
  try:
    edges, late = tool.import_graph()
  finally:
    tool.PACKAGE_ROOTS = original
  assert tool.strongly_connected_components(edges) == [["pkg.a", "pkg.b"]]
  assert [target for _, _, target in late] == ["pkg.a"]


def test_function_level_imports_say_why():
  """A package module imported inside a function needs a comment (on its
  line or the line above) saying what late loading avoids."""
  _, late = _tool().import_graph()
  unexplained = []
  for path, line, target in late:
    with open(os.path.join(REPO, path)) as f:
      lines = f.read().splitlines()
    context = " ".join(lines[max(0, line - 3):line])
    context = re.sub(r"#\s*pylint:[^#]*", "", context)
    if "#" not in context:
      unexplained.append(f"{path}:{line} imports {target}")
  assert not unexplained, unexplained
