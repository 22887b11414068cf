"""Picks layout rules, and a mesh shape, for an mtf graph.

Example:
  import mesh_tensorflow as mtf
  import mesh_tensorflow.auto_mtf

  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = mtf.zeros(mesh, "a:10,b:5")
  y = mtf.zeros(mesh, "b:5,c:20")
  z = mtf.einsum([x, y], "a:10,c:20")
  rules = mtf.auto_mtf.layout(graph, "m1:4;m2:2", [z])
  rules, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [z])

Outputs matter: they stay in memory to the end of the step. The default
objective, "memory", is the original's (least peak memory per processor);
objective="time" picks the least predicted step time whose peak fits
memory_budget (bytes per processor), with the machine's constants measured
once and cached (machine.load_or_calibrate; a program in tf.compat.v1
graph mode measures in a fresh Python process) unless `machine` gives them.
`choose_layout` returns the same choice with its predictions and the search
time, for reports (the Transformer binary prints it).

Uneven splits: by default a tensor dimension is only split over a mesh
dimension that divides every size it has. With allow_uneven=True any
mesh dimension no larger than its sizes may split it, the lowering padding
it to the next multiple (mtf.LayoutRules(..., allow_uneven=True), which
the returned rules then are); the search prices the padding: padded slices
in memory and compute, and the allconcats of operations whose lowering
does not handle padding and gathers the padded dimensions around them.
E.g. an MLP with a hidden size of 100 on 8 processors:

  rules = mtf.auto_mtf.layout(graph, "m:8", [loss], allow_uneven=True)
  # LayoutRules('hidden:m', allow_uneven=True): every processor holds 13
  # of hidden, the last 9 and 4 of padding (without allow_uneven, hidden
  # stays whole).
"""

import dataclasses
import logging
import time

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator


@dataclasses.dataclass(frozen=True)
class LayoutChoice:
  """A chosen layout and what the search predicts for it.

  Attributes:
    layout_rules: the mtf.LayoutRules.
    mesh_shape: the mtf.Shape of the mesh.
    objective: "memory" or "time".
    peak_memory_bytes: predicted peak bytes per processor.
    predicted_step_seconds: predicted seconds per step (objective "time"),
      else None.
    search_seconds: wall time of the search (building and solving the
      programs of every mesh shape tried), calibration excluded.
  """
  layout_rules: shape_lib.LayoutRules
  mesh_shape: shape_lib.Shape
  objective: str
  peak_memory_bytes: int
  predicted_step_seconds: float = None
  search_seconds: float = 0.0

  def describe(self):
    """One line: mesh shape, layout rules and the predictions."""
    mesh = ";".join(f"{d.name}:{d.size}" for d in self.mesh_shape.dims)
    text = (f"mesh_shape={mesh!r} "
            f"layout_rules={self.layout_rules.to_string!r} ")
    if self.layout_rules.allow_uneven:
      text += "allow_uneven=True "
    text += f"peak_memory={self.peak_memory_bytes} bytes/processor"
    if self.predicted_step_seconds is not None:
      text += f" predicted_step={self.predicted_step_seconds * 1e3:.3f} ms"
    return text + f" (searched in {self.search_seconds:.2f} s)"


def layout(mtf_graph, mesh_shape, mtf_outputs=(), objective="memory",
           memory_budget=None, machine=None, shard_weight_update=False,
           shard_parameters=False, allow_uneven=False):
  """The layout rules of `mtf_graph` on a mesh of `mesh_shape`.

  Args:
    mtf_graph: an mtf.Graph.
    mesh_shape: an mtf.Shape, a string like "m1:4;m2:2", or dimensions.
    mtf_outputs: optional iterable of the computation's output mtf Tensors.
    objective: "memory" (least peak memory, the original's) or "time"
      (least predicted step time within memory_budget).
    memory_budget: optional bytes per processor the peak must not exceed.
    machine: objective "time": a machine.MachineConstants (or a dict, JSON
      string or JSON path of one); None measures this machine (cached).
    shard_weight_update: count the optimizer's slots as
      mtf.shard_data_parallel stores them, sharded over the mesh dimensions
      the batch is split over (ZeRO-1/2).
    shard_parameters: the variables too (ZeRO-3).
    allow_uneven: also consider splitting a dimension over a mesh dimension
      that does not divide it (padded, priced; see the module doc). The
      rules returned then have allow_uneven=True.

  Returns:
    an mtf.LayoutRules.

  Raises:
    layout_optimizer.SolverError: no layout fits the budget (the message
      names the smallest peak there is).
  """
  return choose_layout(mtf_graph, mesh_shape, mtf_outputs, objective,
                       memory_budget, machine,
                       shard_weight_update=shard_weight_update,
                       shard_parameters=shard_parameters,
                       allow_uneven=allow_uneven).layout_rules


def layout_and_mesh_shape(mtf_graph, num_machines, mtf_outputs=(),
                          max_mesh_shape_dimensions=2, objective="memory",
                          memory_budget=None, machine=None,
                          shard_weight_update=False, shard_parameters=False,
                          allow_uneven=False):
  """Layout rules and a mesh shape for `num_machines` processors.

  Tries every mesh shape of num_machines processors with at most
  max_mesh_shape_dimensions dimensions (None: no limit), named mesh_0,
  mesh_1, ..., and keeps the one whose best layout has the lowest
  objective (fewer dimensions make the search faster). Other arguments as
  in `layout`.

  Returns:
    (mtf.LayoutRules, mtf.Shape).
  """
  choice = choose_layout(mtf_graph, num_machines, mtf_outputs, objective,
                         memory_budget, machine, max_mesh_shape_dimensions,
                         shard_weight_update, shard_parameters,
                         allow_uneven=allow_uneven)
  return choice.layout_rules, choice.mesh_shape


def choose_layout(mtf_graph, mesh_shape, mtf_outputs=(), objective="memory",
                  memory_budget=None, machine=None,
                  max_mesh_shape_dimensions=2, shard_weight_update=False,
                  shard_parameters=False, quick_calibration=False,
                  allow_uneven=False):
  """The LayoutChoice for a mesh shape, or for a processor count (an int:
  every mesh shape of it is tried, as in layout_and_mesh_shape). Other
  arguments as in `layout_and_mesh_shape`, and:

  Args:
    quick_calibration: objective "time" without `machine`: where nothing
      is cached, measure this machine quickly (seconds, rougher figures)
      instead of fully (about a minute).

  Raises:
    layout_optimizer.SolverError: no layout fits the budget.
    machine.CalibrationError: objective "time" without `machine`, and
      measuring this machine failed.
  """
  if isinstance(mesh_shape, int):
    candidates = [_mesh_shape_of(sizes) for sizes in _mesh_shape_iterator(
        mesh_shape, max_mesh_shape_dimensions)]
  else:
    candidates = [shape_lib.convert_to_shape(mesh_shape)]
  best = None
  best_value = None
  searched = 0.0
  errors = []
  for candidate in candidates:
    logging.info("auto_mtf: searching layouts for mesh shape %s", candidate)
    constants = _machine_for(machine, candidate, objective,
                             quick_calibration)
    start = time.perf_counter()
    estimator = memory_estimator.MemoryEstimator(mtf_graph, candidate,
                                                 mtf_outputs, allow_uneven)
    try:
      optimizer = layout_optimizer.LayoutOptimizer(
          estimator, objective=objective, memory_budget=memory_budget,
          machine=constants, shard_weight_update=shard_weight_update,
          shard_parameters=shard_parameters)
      layout_string = optimizer.solve()
    except layout_optimizer.SolverError as e:
      searched += time.perf_counter() - start
      errors.append(e)
      continue
    value = optimizer.evaluate_layout(layout_string)
    peak = optimizer.evaluate_peak_memory(layout_string)
    searched += time.perf_counter() - start
    if best_value is None or value < best_value:
      best_value = value
      best = (layout_string, candidate, peak, value)
  if best is None:
    if len(errors) == 1:
      raise errors[0]
    raise layout_optimizer.SolverError(
        "no mesh shape has a layout that fits: " +
        "; ".join(str(e) for e in errors))
  layout_string, candidate, peak, value = best
  rules = shape_lib.convert_to_layout_rules(layout_string)
  return LayoutChoice(
      layout_rules=rules.with_uneven() if allow_uneven else rules,
      mesh_shape=candidate, objective=objective, peak_memory_bytes=int(peak),
      predicted_step_seconds=value if objective == "time" else None,
      search_seconds=searched)


def _machine_for(machine, mesh_shape, objective, quick_calibration=False):
  """The machine constants the time objective prices with (None for the
  memory objective): measured (cached) unless `machine` gives them."""
  if objective != "time":
    return None
  # Imported here: calibration needs TF devices, the memory search does not.
  from mesh_tensorflow.auto_mtf import machine as machine_lib  # pylint: disable=g-import-not-at-top
  if machine is None:
    return machine_lib.load_or_calibrate(mesh_shape, quick=quick_calibration)
  # Per-wire-byte costs hold for the processors the figures were made
  # for (MachineConstants.wire_processors): scaled to this mesh's.
  return machine_lib.machine_constants(machine).for_processors(
      shape_lib.convert_to_shape(mesh_shape).size)


def _mesh_shape_of(sizes):
  return shape_lib.Shape([shape_lib.Dimension(f"mesh_{i}", size)
                          for i, size in enumerate(sizes)])


def _mesh_shape_iterator(num_machines, max_mesh_shape_dimensions=None):
  """Yields every list of mesh dimension sizes (each at least 2, largest
  first) whose product is num_machines, with at most
  max_mesh_shape_dimensions entries (None: any number); [1] for one
  machine.

  Raises:
    ValueError: num_machines is not a positive integer.
  """
  if not isinstance(num_machines, int) or num_machines < 1:
    raise ValueError(
        f"num_machines must be a positive integer, got {num_machines!r}.")
  if num_machines == 1:
    yield [1]
    return
  limit = max_mesh_shape_dimensions

  def factorizations(remaining, largest, prefix):
    if remaining == 1:
      yield list(prefix)
      return
    if limit is not None and len(prefix) >= limit:
      return
    for factor in range(min(largest, remaining), 1, -1):
      if remaining % factor == 0:
        yield from factorizations(remaining // factor, factor,
                                  prefix + [factor])

  yield from factorizations(num_machines, num_machines, [])
