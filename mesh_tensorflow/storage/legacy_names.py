"""The variable names earlier versions of this project gave, for restores.

Layers called without a name open default-named variable scopes as the
original did (TF1's `variable_scope(None, default_name=...)`): an unnamed
`dense` puts its kernel in "dense/" and its bias in "dense_1/". Earlier
versions put both in one scope ("dense/kernel", "dense/bias"), and
counted default names per mtf graph without TF1's rule that leaving a
named scope forgets the default names used inside it. Their checkpoints
still restore: while a graph is built, `LegacyScopes` records, for each
scope a layer opens, the path those versions would have given it, and a
restore that finds the checkpoint written with those paths reads each
variable under its earlier name (`ValueRestore` in checkpointing.py).
"""

import weakref

# mtf.Graph -> its LegacyScopes.
_TABLES = weakref.WeakKeyDictionary()


def for_graph(graph):
  """The LegacyScopes of an mtf graph (made on first use)."""
  table = _TABLES.get(graph)
  if table is None:
    table = _TABLES[graph] = LegacyScopes(graph)
  return table


def _join(outer, name):
  return f"{outer}/{name}" if outer else name


class LegacyScopes:
  """Scope paths of one mtf graph as earlier versions named them."""

  def __init__(self, graph):
    self._graph = weakref.ref(graph)
    self._renamed = {}  # path now -> earlier path (only where they differ)
    self._used = set()  # earlier paths taken by layer scopes
    self._pinned = {}  # (earlier outer path, default name) -> earlier leaf
    self._opened = set()  # paths (now) layers opened

  def earlier_path(self, path):
    """`path` with its longest renamed scope prefix replaced."""
    parts = path.split("/") if path else []
    for i in range(len(parts), 0, -1):
      earlier = self._renamed.get("/".join(parts[:i]))
      if earlier is not None:
        return "/".join([earlier] + parts[i:])
    return path

  def earlier_name(self, name):
    """The name variable `name` had earlier, or None if the same."""
    earlier = self.earlier_path(name)
    return None if earlier == name else earlier

  def _allocate(self, outer, name, default_name):
    """The leaf the earlier versions chose for a layer scope (they made
    default names unique among layer scopes of the same outer path)."""
    pinned = self._pinned.get((outer, default_name))
    if name is None and pinned is not None:
      return pinned
    if name is None:
      name, count = default_name, 0
      while _join(outer, name) in self._used:
        count += 1
        name = f"{default_name}_{count}"
    self._used.add(_join(outer, name))
    return name

  def opened(self, outer, path, name, default_name):
    """Records that a layer opened scope `path` (now) inside `outer`."""
    earlier_outer = self.earlier_path(outer)
    earlier = _join(earlier_outer,
                    self._allocate(earlier_outer, name, default_name))
    if path in self._opened:
      # Re-entered (TF1 forgets default names when their named outer
      # scope closes): the variables are the first opening's.
      return
    self._opened.add(path)
    if earlier != self.earlier_path(path):
      self._renamed[path] = earlier

  def pin(self, outer, name, default_name):
    """Makes the layer scopes `default_name` opened without a name directly
    in `outer` share one earlier path until `unpin` (an earlier `dense`
    kept its kernel and bias in one scope); returns the pin."""
    earlier_outer = self.earlier_path(outer)
    key = (earlier_outer, default_name)
    previous = self._pinned.get(key)
    self._pinned[key] = self._allocate(earlier_outer, name, default_name)
    return key, previous

  def unpin(self, pin):
    key, previous = pin
    if previous is None:
      self._pinned.pop(key, None)
    else:
      self._pinned[key] = previous

  def renamed_variables(self):
    """{name now: earlier name} of the graph's variables that differ
    (layer-stacked members by member name)."""
    graph = self._graph()
    if graph is None or not self._renamed:
      return {}
    out = {}
    for variable in graph.all_variables:
      for name in variable.member_names or [variable.name]:
        earlier = self.earlier_name(name)
        if earlier is not None:
          out[name] = earlier
    return out
