"""Keeps each module with a module- or class-scoped fixture on one worker.

Such fixtures (a training run, a decode, a built wheel) are computed once
per pytest-xdist worker that runs any of the module's tests, and xdist's
default scheduling deals tests out one by one: a module split over both
workers computes them twice. With `--dist loadgroup` (the Makefile's) each
of these modules is one unit; other tests are still dealt out one by one.

xdist's loadgroup reads a group as the suffix "@<group>" of a test's node
id, which its own hook writes into `item._nodeid` for tests marked
`xdist_group`. pytest 9 keeps the node id elsewhere (`item._id`), so that
write changes nothing there and every module was split again (its
fixtures computed twice); this plugin writes the suffix itself then.
tests/conftest.py imports its hook; tests/test_xdist_groups.py checks it.
"""

import pytest


def _group_name(item):
  """The module's name if the test uses a module- or class-scoped
  fixture, else None."""
  info = getattr(item, "_fixtureinfo", None)
  if info is None:
    return None
  scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs}
  return item.module.__name__ if scopes & {"module", "class"} else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Marks (and under loadgroup, names) the tests of such modules.

  Runs first, so that xdist's own hook sees the marks.
  """
  loadgroup = getattr(config.option, "loadgroup", False)
  for item in items:
    name = _group_name(item)
    if name is None:
      continue
    item.add_marker(pytest.mark.xdist_group(name))
    # pytest < 9 has `_nodeid`, where xdist's hook adds the suffix.
    if loadgroup and not hasattr(item, "_nodeid"):
      node_id = f"{item.nodeid}@{name}"
      item._id = type(item._id).parse(node_id)  # pylint: disable=protected-access
