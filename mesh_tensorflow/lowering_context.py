"""What one operation's lowering sees of a mesh implementation.

A Lowering lowers each operation in a context: the layout rules as that
operation sees them (some dimensions replicated, when its lowering does not
handle their padding), the processors that may skip its computations (idle
pipeline slots) and the function its collectives report their traffic to
(the Lowering's counters). The mesh implementation holds none of this:
`mesh_impl.bound(context)` is a view of it in one context, sharing its
devices, variables and caches, and never changed. So one implementation
serves any number of lowerings at once (two threads, a planner comparing
candidates), and a lowering's dependencies are in one visible value.
"""

import dataclasses
from typing import Any, Callable, Optional

from mesh_tensorflow import shape as shape_lib


@dataclasses.dataclass(frozen=True)
class LoweringContext:
  """The layout view, idle processors and counters of one lowering step.

  Attributes:
    layout_rules: the LayoutRules the operation is laid out by.
    idle: processor numbers whose slicewise work may give zeros (only
      implementations whose processors run their own ops honour it).
    counter_fn: fn(key, value) that collectives report their traffic to,
      or None.
  """
  layout_rules: shape_lib.LayoutRules
  idle: frozenset = frozenset()
  counter_fn: Optional[Callable[[str, Any], None]] = None

  def replicating(self, names):
    """This context with the tensor dimensions named in `names` laid out
    replicated."""
    return dataclasses.replace(
        self, layout_rules=self.layout_rules.without(names))

  def idle_processors(self, pnums):
    """This context with processors `pnums` idle."""
    return dataclasses.replace(self, idle=frozenset(pnums))

  def counting(self, counter_fn):
    """This context with collectives reported to `counter_fn`."""
    return dataclasses.replace(self, counter_fn=counter_fn)
