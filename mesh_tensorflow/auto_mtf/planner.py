"""Plans a training run: mesh shape, layout, ZeRO level, stages, recompute.

`plan(model, num_processors, memory_budget)` answers "what is the fastest
way to run this model on these processors, within this many bytes each?"
It searches, together:

- the structure of the training graph (plan_space.Structure): pipeline
  stages S and micro-batches M of a layer-stacked model, and how many
  layers recompute their activations;
- the mesh shape: "stage:S" (when pipelined) and every factorization of
  the remaining processors into at most `max_mesh_shape_dimensions` named
  dimensions;
- the layout rules of each (uneven splits when allowed), by the layout
  search's integer program (layout_optimizer, objective "time" under the
  budget), with the pipeline's stage dimension fixed on the stage mesh
  dimension;
- the weight-update sharding level (plan_space.ZERO_LEVELS).

How it searches (exact in the search's own model, pruned soundly):
1. Each structure's graph is built once (PlanModel.build) and each mesh
   shape's layout program priced once: the cost rules beside each
   lowering, priced with the machine's constants.
2. Per structure and mesh shape, the fastest layout without a budget is
   solved first. Its time is a lower bound for every sharding level (the
   budget only removes layouts). Where that layout fits a level, it is
   that level's optimum; where not, the budgeted program is solved,
   unless the bound already loses to the best plan found (pruned: it
   cannot win).
3. The fastest candidates (`finalists`) are built again as they would
   run, with their data-parallel sharding, and priced exactly on that
   graph (plan_pricing): step time split into compute, collectives and
   pipeline bubble; peak bytes per processor split into parameters,
   optimizer slots, gradients, activations and pipeline buffers. The
   fastest that fits wins; ties go to less memory.
The search's model prices ZeRO's memory, not its communication; step 3
prices both, which is why several sharding levels reach it.
"""

import dataclasses
import logging
import time

import tensorflow as tf

from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.auto_mtf import api
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import plan_pricing
from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import proxy_layers

STAGE_MESH_DIMENSION = "stage"


class PlanError(ValueError):
  """No plan fits the memory budget, or the model has no plan at all."""


@dataclasses.dataclass(frozen=True)
class Alternative:
  """A plan that lost, with its figures and why it lost.

  Attributes:
    structure, zero, mesh_shape, layout_rules: as in Plan.
    step_seconds: predicted seconds per step (the search's figure, or the
      exact one for a finalist), or None where no layout fits.
    peak_bytes: predicted peak bytes per processor (for a plan that does
      not fit: the smallest peak of any layout).
    reason: what rules it out or makes it slower.
  """
  structure: plan_space.Structure
  zero: str
  mesh_shape: str
  layout_rules: str
  step_seconds: float
  peak_bytes: int
  reason: str


@dataclasses.dataclass(frozen=True)
class SearchReport:
  """How the search went.

  Attributes:
    structures: structures built.
    mesh_shapes: (structure, mesh shape) pairs whose layouts were priced.
    solved: layout programs solved.
    pruned: (structure, mesh shape, level) candidates skipped by the bound.
    infeasible: candidates with no layout within the budget.
    finalists: candidates priced exactly.
    seconds: wall time of the search (calibration excluded).
    exact: whether every candidate was solved or pruned by a sound bound.
  """
  structures: int
  mesh_shapes: int
  solved: int
  pruned: int
  infeasible: int
  finalists: int
  seconds: float
  exact: bool = True


@dataclasses.dataclass(frozen=True)
class Plan:
  """A planned run and what it is predicted to cost.

  Attributes:
    structure: the plan_space.Structure (stages, micro-batches, recompute).
    zero: the weight-update sharding level (plan_space.ZERO_LEVELS).
    mesh_shape: the mtf.Shape of the mesh.
    layout_rules: the mtf.LayoutRules.
    step_time: plan_pricing.StepTime (compute, collectives, bubble).
    memory: plan_pricing.PeakMemory per processor, by part.
    settings: {name: value} that runs it (gin bindings for the Transformer
      binary, keyword arguments elsewhere; PlanModel.plan_settings).
    memory_budget: the budget planned for (bytes per processor) or None.
    alternatives: the next best plans (Alternative), best first.
    search: the SearchReport.
  """
  structure: plan_space.Structure
  zero: str
  mesh_shape: shape_lib.Shape
  layout_rules: shape_lib.LayoutRules
  step_time: plan_pricing.StepTime
  memory: plan_pricing.PeakMemory
  settings: dict
  memory_budget: int = None
  alternatives: tuple = ()
  search: SearchReport = None

  @property
  def predicted_step_seconds(self):
    return self.step_time.total

  @property
  def peak_memory_bytes(self):
    return self.memory.total

  def describe(self):
    """One line: the choices and the predictions."""
    return (f"{_mesh_string(self.mesh_shape)} "
            f"layout={self.layout_rules.to_string!r} zero={self.zero} "
            f"{self.structure.describe()}: "
            f"{self.predicted_step_seconds * 1e3:.3f} ms/step, "
            f"{_bytes_text(self.peak_memory_bytes)}/processor")

  def table(self):
    """The plan as text: choices, time and memory by part, alternatives."""
    t, m = self.step_time, self.memory
    lines = [
        "Plan: " + self.describe(),
        f"  step time {t.total * 1e3:.3f} ms = compute "
        f"{t.compute * 1e3:.3f} + collectives {t.collectives * 1e3:.3f} + "
        f"bubble {t.bubble * 1e3:.3f}",
        "  peak memory per processor " + _bytes_text(m.total) + " = " +
        " + ".join(f"{part.replace('_', ' ')} {_bytes_text(value)}"
                   for part, value in m.as_dict().items()),
    ]
    if self.memory_budget is not None:
      lines.append(f"  budget {_bytes_text(self.memory_budget)}/processor")
    if self.alternatives:
      lines.append("  next best:")
      for a in self.alternatives:
        step = ("-" if a.step_seconds is None
                else f"{a.step_seconds * 1e3:.3f} ms")
        lines.append(
            f"    {a.mesh_shape} layout={a.layout_rules!r} zero={a.zero} "
            f"{a.structure.describe()}: {step}, "
            f"{_bytes_text(a.peak_bytes)}: {a.reason}")
    if self.search is not None:
      s = self.search
      lines.append(
          f"  searched {s.structures} structures, {s.mesh_shapes} mesh "
          f"shapes, {s.solved} layout programs ({s.pruned} pruned, "
          f"{s.infeasible} over budget, {s.finalists} priced exactly) in "
          f"{s.seconds:.2f} s; {'exact' if s.exact else 'not exact'}")
    return "\n".join(lines)


@dataclasses.dataclass
class _Candidate:
  structure: plan_space.Structure
  mesh_shape: shape_lib.Shape
  zero: str
  layout: str = None
  search_seconds: float = None
  peak: int = None
  smallest_peak: int = None
  over_budget: bool = False
  explainer: object = None  # Its LayoutOptimizer, until explained.
  smallest_layout: str = None
  machine: object = None  # The MachineConstants of its mesh shape.
  exact: tuple = None  # (StepTime, PeakMemory) once priced exactly.

  @property
  def fits(self):
    return self.layout is not None


def plan(model, num_processors, memory_budget=None, machine=None,
         mtf_outputs=(), max_mesh_shape_dimensions=2,
         zero_levels=plan_space.ZERO_LEVELS, allow_uneven=False,
         quick_calibration=False, finalists=6, max_alternatives=5,
         proxy=True):
  """The fastest plan of `model` on `num_processors` within the budget.

  Args:
    model: a plan_space.PlanModel, or an mtf.Graph (then only its mesh
      shape, layout and sharding level are planned; give mtf_outputs).
    num_processors: N, a positive int.
    memory_budget: optional bytes per processor the peak must fit in.
    machine: a machine.MachineConstants (or a dict, JSON text or file of
      one); None measures this machine (cached; see
      machine.load_or_calibrate).
    mtf_outputs: the outputs of a graph given as `model`.
    max_mesh_shape_dimensions: the most mesh dimensions besides "stage".
    zero_levels: the sharding levels to consider.
    allow_uneven: also consider splits that need padding.
    quick_calibration: measure this machine in seconds where nothing is
      cached (rougher figures).
    finalists: how many of the fastest candidates are priced exactly.
    max_alternatives: how many alternatives the Plan lists.
    proxy: price a layer-stacked model by a proxy of 3 layers per run of
      like layers, scaled (PlanModel.build_proxy, auto_mtf.proxy_layers:
      the step time as the full graph's, the peak memory approximately);
      False builds and prices every graph whole.

  Returns:
    a Plan.

  Raises:
    PlanError: no plan fits the budget (the message names the smallest
      peak there is and which choices reach it), or the model has no
      structure for N processors.
  """
  if isinstance(model, graph_lib.Graph):
    model = plan_space.GraphModel(model, mtf_outputs)
  if not isinstance(num_processors, int) or num_processors < 1:
    raise ValueError(f"num_processors must be a positive integer, got "
                     f"{num_processors!r}.")
  for zero in zero_levels:
    plan_space.zero_flags(zero)
  zero_levels = [z for z in zero_levels if z in model.zero_levels]
  if not zero_levels:
    raise ValueError(f"{type(model).__name__} builds none of the sharding "
                     f"levels asked for; it builds {model.zero_levels}.")
  start = time.perf_counter()
  structures = list(model.structures(num_processors))
  if not structures:
    raise PlanError(f"{type(model).__name__} has no structure for "
                    f"{num_processors} processors.")
  search = _Search(model, num_processors, memory_budget, machine,
                   max_mesh_shape_dimensions, tuple(zero_levels),
                   allow_uneven, quick_calibration, proxy)
  for structure in structures:
    search.add_structure(structure)
  fitting = sorted((c for c in search.candidates if c.fits),
                   key=lambda c: (c.search_seconds, c.peak))
  if not fitting:
    for c in search.candidates:
      _explain(c)
    if not search.candidates and search.unbuildable:
      raise PlanError(
          f"no structure of {type(model).__name__} can be built: " +
          "; ".join(f"{s.describe()}: {why}"
                    for s, why in search.unbuildable))
    raise PlanError(_no_fit_message(search.candidates, memory_budget,
                                    num_processors))
  chosen = None
  for candidate in fitting[:finalists]:
    _price_exactly(model, candidate, search.built, proxy)
    _, memory = candidate.exact
    if memory_budget is not None and memory.total > memory_budget:
      continue
    if chosen is None or _exact_key(candidate) < _exact_key(chosen):
      chosen = candidate
  if chosen is None:
    raise PlanError(
        f"no plan fits memory_budget={_bytes_text(memory_budget)} per "
        f"processor once priced on the graph it runs: the search's "
        f"{len(fitting[:finalists])} fastest candidates fit by its "
        "estimate but not as built with their sharding. Raise the budget.")
  report = SearchReport(
      structures=len(structures) - len(search.unbuildable),
      mesh_shapes=search.mesh_shapes,
      solved=search.solved, pruned=search.pruned,
      infeasible=sum(1 for c in search.candidates if c.over_budget),
      finalists=min(finalists, len(fitting)),
      seconds=time.perf_counter() - start)
  step_time, memory = chosen.exact
  return Plan(
      structure=chosen.structure, zero=chosen.zero,
      mesh_shape=chosen.mesh_shape,
      layout_rules=_rules(chosen.layout, allow_uneven),
      step_time=step_time, memory=memory,
      settings=model.plan_settings(chosen.structure, chosen.zero,
                                   _mesh_string(chosen.mesh_shape),
                                   chosen.layout),
      memory_budget=memory_budget,
      alternatives=tuple(_alternatives(chosen, search.candidates,
                                       memory_budget, max_alternatives)),
      search=report)


class _Search:
  """Solves the layout programs of every structure and mesh shape."""

  def __init__(self, model, num_processors, memory_budget, machine,
               max_mesh_shape_dimensions, zero_levels, allow_uneven,
               quick_calibration, proxy=True):
    self._model = model
    self._n = num_processors
    self._budget = memory_budget
    self._machine = machine
    self._max_dims = max_mesh_shape_dimensions
    self._zero_levels = zero_levels
    self._uneven = allow_uneven
    self._quick = quick_calibration
    self._proxy = proxy
    # {Structure: (graph, outputs, proxy_layers.Scale or None)} as searched.
    self.built = {}
    self.candidates = []
    self.unbuildable = []  # (Structure, why) of structures build() refused.
    self.mesh_shapes = 0
    self.solved = 0
    self.pruned = 0
    self._best = None  # The least search time of a fitting candidate.

  def add_structure(self, structure):
    try:
      built = (proxy_layers.build(self._model, structure) if self._proxy
               else None)
      if built is None:
        graph, outputs = _build(self._model, structure)
        scale = None
      else:
        graph, outputs, scale = built.graph, built.outputs, built.scale
    except ValueError as e:
      # E.g. a pipelined stack whose layers add auxiliary losses: this
      # structure does not exist for the model; the others may.
      logging.warning("plan: %s cannot be built: %s", structure.describe(), e)
      self.unbuildable.append((structure, str(e)))
      return
    self.built[structure] = (graph, outputs, scale)
    for mesh_shape in mesh_shapes(self._n, structure.stages, self._max_dims):
      self.mesh_shapes += 1
      self._add_mesh_shape(structure, graph, outputs, mesh_shape, scale)

  def _add_mesh_shape(self, structure, graph, outputs, mesh_shape,
                      scale=None):
    # Scaled to the mesh's processor count (MachineConstants.
    # for_processors), as the layout search scales them.
    constants = api._machine_for(self._machine, mesh_shape, "time",  # pylint: disable=protected-access
                                 self._quick)
    estimator = memory_estimator.MemoryEstimator(graph, mesh_shape, outputs,
                                                 self._uneven)
    fixed = {}
    if structure.pipelined:
      fixed[self._model.stage_dimension_name] = STAGE_MESH_DIMENSION
    try:
      free = layout_optimizer.LayoutOptimizer(
          estimator, scheduler_alg=plan_pricing.SCHEDULE, objective="time",
          machine=constants, fixed_rules=fixed, proxy_scale=scale)
      free_layout = free.solve()
    except (layout_optimizer.SolverError, ValueError) as e:
      logging.info("plan: %s on %s has no layout: %s",
                   structure.describe(), _mesh_string(mesh_shape), e)
      return
    self.solved += 1
    bound = free.evaluate_step_seconds(free_layout)
    # Most sharded first: where it has no layout within the budget, the
    # levels storing more have none either.
    too_big = False
    for zero in sorted(self._zero_levels, key=plan_space.ZERO_LEVELS.index,
                       reverse=True):
      candidate = _Candidate(structure, mesh_shape, zero, machine=constants)
      if too_big:
        candidate.smallest_peak = None
        self.candidates.append(candidate)
        continue
      weight_update, parameters = plan_space.zero_flags(zero)
      # In the order the exact pricing runs the step (as TF's executor
      # does), so that what the search admits the pricing mostly keeps.
      optimizer = layout_optimizer.LayoutOptimizer(
          estimator, scheduler_alg=plan_pricing.SCHEDULE, objective="time",
          memory_budget=self._budget,
          machine=constants, shard_weight_update=weight_update,
          shard_parameters=parameters, fixed_rules=fixed,
          step_costs=free.step_costs, proxy_scale=scale)
      peak = optimizer.evaluate_peak_memory(free_layout)
      if self._budget is None or peak <= self._budget:
        self._accept(candidate, free_layout, bound, peak)
        continue
      if self._best is not None and bound >= self._best:
        self.pruned += 1
        self.candidates.append(candidate)
        continue
      try:
        layout = optimizer.solve(explain_budget=False)
      except layout_optimizer.SolverError:
        # Its smallest peak is solved only if reported (_explain).
        candidate.over_budget = True
        candidate.explainer = optimizer
        self.solved += 1
        self.candidates.append(candidate)
        too_big = True
        continue
      self.solved += 1
      self._accept(candidate, layout, optimizer.evaluate_step_seconds(layout),
                   optimizer.evaluate_peak_memory(layout))

  def _accept(self, candidate, layout, seconds, peak):
    """Keeps a fitting candidate, unless its sharding level changes nothing
    (no mesh dimension splits the batch: the same as level "none")."""
    if candidate.zero != "none" and not any(
        "batch" in rule.split(":")[0] for rule in layout.split(";") if rule):
      return
    self.candidates.append(candidate)
    candidate.layout = layout
    candidate.search_seconds = seconds
    candidate.peak = int(peak)
    if self._best is None or seconds < self._best:
      self._best = seconds


def mesh_shapes(num_processors, stages=1, max_mesh_shape_dimensions=2):
  """The mesh shapes a plan of `stages` stages searches: "stage:S" first
  when pipelined, then every factorization of the other processors into
  at most max_mesh_shape_dimensions dimensions mesh_0, mesh_1, ..."""
  if num_processors % stages:
    return []
  rest = num_processors // stages
  shapes = []
  for sizes in api._mesh_shape_iterator(rest, max_mesh_shape_dimensions):  # pylint: disable=protected-access
    dims = [shape_lib.Dimension(f"mesh_{i}", size)
            for i, size in enumerate(sizes) if size > 1 or rest == 1]
    if stages > 1:
      dims = [shape_lib.Dimension(STAGE_MESH_DIMENSION, stages)] + (
          dims if rest > 1 else [])
    shapes.append(shape_lib.Shape(dims))
  return shapes


def _build(model, structure, zero="none", mesh_shape=None, layout_rules=None):
  """The model's graph of one structure, built in a TF graph of its own
  (nothing is lowered or run)."""
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    graph, outputs = model.build(structure, zero=zero, mesh_shape=mesh_shape,
                                 layout_rules=layout_rules)
  return graph, list(outputs)


def _price_exactly(model, candidate, built=None, proxy=True):
  """Prices a candidate on the graph it runs, sharding included (with
  `proxy`, on its proxy, scaled; without sharding, on the graph searched,
  from `built`: {Structure: (graph, outputs, Scale or None)})."""
  if candidate.exact is not None:
    return
  mesh = _mesh_string(candidate.mesh_shape)
  if candidate.zero == "none" and candidate.structure in (built or {}):
    graph, outputs, scale = built[candidate.structure]
  else:
    found = (proxy_layers.build(model, candidate.structure, candidate.zero,
                                mesh, candidate.layout) if proxy else None)
    if found is None:
      graph, outputs = _build(model, candidate.structure, candidate.zero,
                              mesh, candidate.layout)
      scale = None
    else:
      graph, outputs, scale = found.graph, found.outputs, found.scale
  candidate.exact = plan_pricing.price(graph, outputs, candidate.mesh_shape,
                                       candidate.layout, candidate.machine,
                                       scale=scale)


def _no_fit_message(candidates, memory_budget, num_processors):
  """One paragraph: nothing fits; the smallest peak and what reaches it."""
  known = [c for c in candidates if c.smallest_peak is not None]
  if not known:
    return (f"no plan has a layout on {num_processors} processors: no mesh "
            "shape of them can lay out the model's graph.")
  best = min(known, key=lambda c: c.smallest_peak)
  return (
      f"no plan fits memory_budget={_bytes_text(memory_budget)} "
      f"({int(memory_budget)} bytes) per processor on {num_processors} "
      f"processors. The smallest peak any plan reaches is "
      f"{_bytes_text(best.smallest_peak)} ({best.smallest_peak} bytes), with "
      f"mesh {_mesh_string(best.mesh_shape)}, layout "
      f"{best.smallest_layout!r}, sharding level {best.zero!r} and "
      f"{best.structure.describe()} ({len(known)} plans tried). Raise the "
      "budget to at least that, use more processors, or make the model or "
      "its batch smaller.")


def _explain(candidate):
  """Solves a candidate's smallest peak, if over budget and not yet."""
  if candidate.explainer is not None:
    candidate.smallest_peak, candidate.smallest_layout = (
        candidate.explainer.smallest_peak())
    candidate.explainer = None


def _alternatives(chosen, candidates, memory_budget, limit):
  """The best other candidate of each structure and mesh shape, fitting
  ones first (fastest first), then the closest to fitting."""
  fitting_keys = {(c.structure, _mesh_string(c.mesh_shape), c.zero)
                  for c in candidates if c.fits and c is not chosen}
  if len(fitting_keys) < limit:
    # Over-budget ones may be listed: their smallest peaks rank them.
    for c in candidates:
      _explain(c)
  best_of = {}
  for c in candidates:
    if c is chosen:
      continue
    key = (c.structure, _mesh_string(c.mesh_shape))
    if key == (chosen.structure, _mesh_string(chosen.mesh_shape)):
      key += (c.zero,)
    if c.fits and not _over_once_priced(c, memory_budget):
      order = (0, _seconds(c), c.peak)
    elif c.fits:
      order = (1, c.exact[1].total, 0)
    elif c.smallest_peak is not None:
      order = (1, c.smallest_peak, 0)
    else:
      continue
    if key not in best_of or order < best_of[key][0]:
      best_of[key] = (order, c)
  ranked = [c for _, c in sorted(best_of.values(), key=lambda x: x[0])]
  return [_alternative(c, chosen, memory_budget) for c in ranked[:limit]]


def _alternative(candidate, chosen, memory_budget):
  mesh = _mesh_string(candidate.mesh_shape)
  if not candidate.fits:
    return Alternative(
        candidate.structure, candidate.zero, mesh,
        candidate.smallest_layout or "", None, candidate.smallest_peak,
        f"does not fit: its smallest peak is over the budget of "
        f"{_bytes_text(memory_budget)}")
  seconds = _seconds(candidate)
  peak = (candidate.exact[1].total if candidate.exact is not None
          else candidate.peak)
  reason = (f"does not fit once priced on the graph it runs: over the "
            f"budget of {_bytes_text(memory_budget)}"
            if _over_once_priced(candidate, memory_budget) else
            _slower_reason(candidate, chosen))
  return Alternative(candidate.structure, candidate.zero, mesh,
                     candidate.layout, seconds, peak, reason)


def _over_once_priced(candidate, memory_budget):
  """Whether a candidate the search fitted is over the budget as priced
  exactly (with its sharding)."""
  return (memory_budget is not None and candidate.exact is not None and
          candidate.exact[1].total > memory_budget)


def _seconds(candidate):
  if candidate.exact is not None:
    return candidate.exact[0].total
  return candidate.search_seconds


def _slower_reason(candidate, chosen):
  """Why a fitting candidate lost to the chosen one."""
  chosen_time, chosen_memory = chosen.exact
  if candidate.exact is None:
    ratio = candidate.search_seconds / max(chosen_time.total, 1e-30)
    return f"{ratio:.2f}x the step time by the search's estimate"
  step_time, memory = candidate.exact
  ratio = step_time.total / max(chosen_time.total, 1e-30)
  if ratio <= 1.0:
    return (f"as fast ({ratio:.3f}x) but more memory "
            f"(+{_bytes_text(memory.total - chosen_memory.total)})")
  parts = {part: getattr(step_time, part) - getattr(chosen_time, part)
           for part in ("compute", "collectives", "bubble")}
  part = max(parts, key=parts.get)
  return (f"{ratio:.2f}x the step time, mostly {part} "
          f"(+{parts[part] * 1e3:.3f} ms)")


def _exact_key(candidate):
  step_time, memory = candidate.exact
  return (step_time.total, memory.total)


def _rules(layout, allow_uneven):
  rules = shape_lib.convert_to_layout_rules(layout)
  return rules.with_uneven() if allow_uneven else rules


def _mesh_string(mesh_shape):
  return ";".join(f"{d.name}:{d.size}" for d in mesh_shape.dims)


def _bytes_text(n):
  if n is None:
    return "-"
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.2f} {unit}"
  return f"{int(n)} B"
