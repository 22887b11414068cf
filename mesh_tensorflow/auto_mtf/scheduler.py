"""Orders a graph's operations so that peak memory stays low.

The layout optimizer bounds peak memory at every step of one schedule; this
module picks the schedule. "NAIVE" keeps graph order. "LIST" is a greedy
topological sort: among the operations whose inputs are ready it runs the
one that frees the most bytes now (bytes of inputs it is the last reader of,
minus bytes of outputs somebody will read or that are final), ties going to
the smaller operation name.

Changed from the original: when an operation stops reading a tensor, the
check whether that tensor is final now looks at that tensor (the original
looked at the operation's last output), so a final tensor's one remaining
reader is no longer credited with freeing it.
"""

import collections
import heapq

SCHEDULER_ALGORITHMS = ("NAIVE", "LIST", "ASAP", "ALAP")


def minimize_peak_memory(graph, scheduler_alg):
  """A schedule of `graph`'s operations.

  Args:
    graph: a graph_interface.GraphInterface.
    scheduler_alg: "NAIVE" or "LIST".

  Returns:
    a list of operation ids (positions in graph.get_all_operation_names()).

  Raises:
    NotImplementedError: an unknown scheduler_alg.
  """
  if scheduler_alg == "NAIVE":
    return list(range(graph.get_num_operations()))
  if scheduler_alg == "LIST":
    return _list_schedule(graph)
  if scheduler_alg in ("ASAP", "ALAP"):
    return _level_schedule(graph, scheduler_alg == "ASAP")
  raise NotImplementedError(
      f"{scheduler_alg!r} is not a scheduler algorithm; use one of "
      f"{', '.join(SCHEDULER_ALGORITHMS)}.")


def _list_schedule(graph):
  """The greedy list schedule (see the module docstring)."""
  names = list(graph.get_all_operation_names())
  op_id = {name: i for i, name in enumerate(names)}
  inputs = {name: list(dict.fromkeys(graph.get_operation_input_names(name)))
            for name in names}
  outputs = {name: list(graph.get_operation_output_names(name))
             for name in names}
  readers = collections.defaultdict(set)
  for name in names:
    for tensor in inputs[name]:
      readers[tensor].add(name)
  waiting_on = {name: len(inputs[name]) for name in names}

  def frees(name):
    freed = sum(graph.get_tensor_size(t) for t in inputs[name]
                if len(readers[t]) == 1 and not graph.is_tensor_final(t))
    allocated = sum(graph.get_tensor_size(t) for t in outputs[name]
                    if readers[t] or graph.is_tensor_final(t))
    return freed - allocated

  bytes_freed = {name: frees(name) for name in names}
  ready = [(-bytes_freed[name], name) for name in names
           if waiting_on[name] == 0]
  heapq.heapify(ready)
  schedule = []
  done = set()
  while ready:
    negative_freed, name = heapq.heappop(ready)
    if name in done or -negative_freed != bytes_freed[name]:
      continue  # a stale entry: the operation was re-queued with a new value
    done.add(name)
    schedule.append(op_id[name])
    for tensor in outputs[name]:
      for reader in readers[tensor]:
        waiting_on[reader] -= 1
        if waiting_on[reader] == 0:
          heapq.heappush(ready, (-bytes_freed[reader], reader))
    for tensor in inputs[name]:
      readers[tensor].discard(name)
      if len(readers[tensor]) != 1 or graph.is_tensor_final(tensor):
        continue
      (last_reader,) = readers[tensor]
      bytes_freed[last_reader] += graph.get_tensor_size(tensor)
      if waiting_on[last_reader] == 0:
        heapq.heappush(ready, (-bytes_freed[last_reader], last_reader))
  return schedule


def _level_schedule(graph, asap):
  """The operations by level, ties in graph order: with `asap` each runs as
  soon as its inputs exist (its level is the longest path from a source),
  else as late as its readers allow (the longest path to a sink, counted
  back from the end)."""
  names = list(graph.get_all_operation_names())
  producer = {}
  for i, name in enumerate(names):
    for tensor in graph.get_operation_output_names(name):
      producer[tensor] = i
  preds = [sorted({producer[t] for t in graph.get_operation_input_names(name)
                   if t in producer}) for name in names]
  order = _topological(preds)
  if asap:
    depth = [0] * len(names)
    for i in order:
      depth[i] = 1 + max((depth[p] for p in preds[i]), default=-1)
    return sorted(range(len(names)), key=lambda i: (depth[i], i))
  succs = [[] for _ in names]
  for i, ps in enumerate(preds):
    for p in ps:
      succs[p].append(i)
  height = [0] * len(names)
  for i in reversed(order):
    height[i] = 1 + max((height[s] for s in succs[i]), default=-1)
  top = max(height, default=0)
  return sorted(range(len(names)), key=lambda i: (top - height[i], i))


def _topological(preds):
  """Operation ids in a topological order of `preds` ({id: [ids it
  reads]})."""
  waiting = [len(p) for p in preds]
  succs = [[] for _ in preds]
  for i, ps in enumerate(preds):
    for p in ps:
      succs[p].append(i)
  order = [i for i, w in enumerate(waiting) if not w]
  for i in order:  # Grows while iterating.
    for s in succs[i]:
      waiting[s] -= 1
      if not waiting[s]:
        order.append(s)
  return order
