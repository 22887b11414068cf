"""Finds import cycles among mesh_tensorflow's own modules.

Reads every module's source (nothing is imported), collects each import
statement, at module level or inside a function, and resolves it to a module
of the package. The repository's top-level `transformer/` folder is the
`mesh_tensorflow.transformer` package, as setup.py installs it.

Imports of a package's `__init__` (`import mesh_tensorflow as mtf`) and the
imports an `__init__` makes to re-export its submodules are not edges: a
package re-exporting its parts is not a cycle.

Usage: python tools/find_import_cycles.py [--imports]
Prints each cycle (strongly connected component) and exits 1 if any exists;
--imports also lists the function-level imports left.
"""

import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_ROOTS = (
    ("mesh_tensorflow", os.path.join(REPO, "mesh_tensorflow")),
    ("mesh_tensorflow.transformer", os.path.join(REPO, "transformer")),
)


def package_modules():
  """Returns {module name: (path, is_package_init)} for the package."""
  modules = {}
  for prefix, root in PACKAGE_ROOTS:
    for dirpath, dirnames, filenames in os.walk(root):
      dirnames[:] = [d for d in dirnames if d != "__pycache__"]
      rel = os.path.relpath(dirpath, root)
      parts = [] if rel == "." else rel.split(os.sep)
      for filename in filenames:
        if not filename.endswith(".py"):
          continue
        stem = filename[:-3]
        is_init = stem == "__init__"
        name = ".".join([prefix] + parts + ([] if is_init else [stem]))
        modules[name] = (os.path.join(dirpath, filename), is_init)
  return modules


class _ImportCollector(ast.NodeVisitor):
  """Collects (imported name candidates, line, inside_function)."""

  def __init__(self, module_name, is_init):
    self.module_name = module_name
    self.is_init = is_init
    self.depth = 0
    self.imports = []

  def _visit_scope(self, node):
    self.depth += 1
    self.generic_visit(node)
    self.depth -= 1

  visit_FunctionDef = _visit_scope
  visit_AsyncFunctionDef = _visit_scope
  visit_Lambda = _visit_scope

  def visit_Import(self, node):
    for alias in node.names:
      self.imports.append(([alias.name], node.lineno, self.depth > 0))

  def visit_ImportFrom(self, node):
    base = node.module or ""
    if node.level:
      package = self.module_name.split(".")
      if not self.is_init:
        package = package[:-1]
      package = package[:len(package) - (node.level - 1)]
      base = ".".join(package + ([base] if base else []))
    for alias in node.names:
      # `from a import b` names module a.b if it exists, else module a.
      self.imports.append(
          (["%s.%s" % (base, alias.name), base], node.lineno, self.depth > 0))


def import_graph():
  """Returns (edges {module: set(module)}, function-level imports list)."""
  modules = package_modules()
  edges = {name: set() for name in modules}
  late_imports = []
  for name, (path, is_init) in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    collector = _ImportCollector(name, is_init)
    collector.visit(tree)
    for candidates, line, inside_function in collector.imports:
      target = next((c for c in candidates if c in modules), None)
      if target is None:
        continue
      if inside_function:
        late_imports.append((os.path.relpath(path, REPO), line, target))
      if is_init or modules[target][1] or target == name:
        continue
      edges[name].add(target)
  return edges, late_imports


def strongly_connected_components(edges):
  """Tarjan's algorithm, iterative; returns the components of size > 1."""
  index = {}
  low = {}
  on_stack = set()
  stack = []
  components = []
  counter = [0]
  for root in sorted(edges):
    if root in index:
      continue
    work = [(root, iter(sorted(edges[root])))]
    index[root] = low[root] = counter[0]
    counter[0] += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      advanced = False
      for child in children:
        if child not in index:
          index[child] = low[child] = counter[0]
          counter[0] += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(edges[child]))))
          advanced = True
          break
        if child in on_stack:
          low[node] = min(low[node], index[child])
      if advanced:
        continue
      work.pop()
      if work:
        parent = work[-1][0]
        low[parent] = min(low[parent], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          components.append(sorted(component))
  return components


def main(argv):
  edges, late_imports = import_graph()
  cycles = strongly_connected_components(edges)
  for component in cycles:
    print("cycle (%d modules):" % len(component))
    members = set(component)
    for name in component:
      inside = sorted(edges[name] & members)
      print("  %s -> %s" % (name, ", ".join(inside)))
  print("%d cycles holding %d of %d modules; %d function-level imports" % (
      len(cycles), sum(len(c) for c in cycles), len(edges), len(late_imports)))
  if "--imports" in argv:
    for path, line, target in sorted(late_imports):
      print("  %s:%d imports %s" % (path, line, target))
  return 1 if cycles else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
