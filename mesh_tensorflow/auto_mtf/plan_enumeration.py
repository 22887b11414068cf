"""Many priced plans of one model, spanning every choice the planner makes.

The planner (planner.plan) returns one plan and the best of each structure
and mesh shape. Checking its time and memory model against measurement
(benchmarks/plan.py) needs more: plans that differ in each choice, the
planner's pick among them, each priced as the planner prices its
finalists. `enumerate_plans` gives them:

- every structure of the model (pipeline stages S, micro-batches M,
  recomputed layers) and every mesh shape the planner searches for it;
- on each, the layouts the search would weigh: its best by predicted time
  (the planner's choice on that mesh), its best by peak memory, and the
  plain ones: replicated, data parallel (the batch over one mesh
  dimension), model parallel (the model's wide dimensions over one), and
  both on two;
- every sharding level (plan_space.ZERO_LEVELS) where the layout splits
  the batch (elsewhere a level shards nothing: the same plan as "none").

With more plans than `max_plans`, it keeps the search's fastest
(`finalists`, the planner's own finalists, so its pick is among them),
then at least one of every value of each choice (mesh shape, layout kind,
level, stages, micro-batches, recompute) and every layout of the plain
structure, then the fastest of the rest,
taking structures in turn. Each kept plan is priced exactly on the graph
it runs, sharding included (plan_pricing.price).
"""

import dataclasses
import logging

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.auto_mtf import api
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import plan_pricing
from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import planner

# Names a model parallel layout splits, where a model has them (the
# Transformer's and the dense stack's wide dimensions).
MODEL_DIMENSION_NAMES = ("d_ff", "hidden", "heads", "vocab", "experts")
BATCH_DIMENSION_NAME = "batch"
LAYOUT_KINDS = ("time search", "memory search", "replicated",
                "data parallel", "model parallel", "data x model",
                "model x data")


@dataclasses.dataclass(frozen=True)
class PricedPlan:
  """One plan and its exact prices.

  Attributes:
    structure: the plan_space.Structure.
    zero: the sharding level (plan_space.ZERO_LEVELS).
    mesh_shape: the mesh, e.g. "mesh_0:4;mesh_1:2".
    layout_rules: the rules, e.g. "batch:mesh_0;d_ff:mesh_1".
    kind: how the layout was made (one of LAYOUT_KINDS).
    search_seconds: the layout search's estimate of its step time (without
      the sharding's communication).
    step_time: plan_pricing.StepTime on the graph it runs.
    memory: plan_pricing.PeakMemory on that graph.
  """
  structure: plan_space.Structure
  zero: str
  mesh_shape: str
  layout_rules: str
  kind: str
  search_seconds: float
  step_time: plan_pricing.StepTime
  memory: plan_pricing.PeakMemory

  @property
  def predicted_step_seconds(self):
    return self.step_time.total

  @property
  def peak_memory_bytes(self):
    return self.memory.total

  def describe(self):
    return (f"{self.mesh_shape} [{self.layout_rules}] zero={self.zero} "
            f"{self.structure.describe()} ({self.kind}): "
            f"{self.predicted_step_seconds * 1e3:.3f} ms, "
            f"{self.peak_memory_bytes} B")


@dataclasses.dataclass
class _Candidate:
  structure: plan_space.Structure
  mesh_shape: shape_lib.Shape
  layout: str
  kind: str
  zero: str
  search_seconds: float
  machine: object

  @property
  def mesh(self):
    return planner._mesh_string(self.mesh_shape)  # pylint: disable=protected-access

  def key(self):
    return (self.structure, self.mesh, self.layout, self.zero)


def enumerate_plans(model, num_processors, machine=None, max_plans=32,
                    zero_levels=plan_space.ZERO_LEVELS,
                    max_mesh_shape_dimensions=2, finalists=6,
                    memory_search=True, quick_calibration=False):
  """Priced plans of `model` on `num_processors`, fastest predicted first.

  Args:
    model: a plan_space.PlanModel.
    num_processors: N.
    machine: machine constants (as planner.plan takes them); None measures
      this machine (cached).
    max_plans: the most plans returned (None: all).
    zero_levels: the sharding levels to include.
    max_mesh_shape_dimensions: as planner.plan's.
    finalists: how many of the search's fastest are always kept (the
      planner prices this many exactly; its pick is among them).
    memory_search: also take each mesh's least-memory layout.
    quick_calibration: as planner.plan's.

  Returns:
    a list of PricedPlan, by predicted step time.
  """
  zero_levels = [z for z in zero_levels if z in model.zero_levels]
  candidates = []
  graphs = {}
  for structure in model.structures(num_processors):
    try:
      graph, outputs = planner._build(model, structure)  # pylint: disable=protected-access
    except ValueError as e:
      logging.warning("enumerate_plans: %s cannot be built: %s",
                      structure.describe(), e)
      continue
    graphs[structure] = (graph, outputs)
    for mesh_shape in planner.mesh_shapes(num_processors, structure.stages,
                                          max_mesh_shape_dimensions):
      candidates.extend(_mesh_candidates(
          model, structure, graph, outputs, mesh_shape, machine, zero_levels,
          memory_search, quick_calibration))
  chosen = select(_distinct(candidates), max_plans, finalists)
  plans = [_priced(model, c, graphs[c.structure]) for c in chosen]
  return sorted(plans, key=lambda p: (p.predicted_step_seconds,
                                      p.peak_memory_bytes))


def _mesh_candidates(model, structure, graph, outputs, mesh_shape, machine,
                     zero_levels, memory_search, quick_calibration):
  """The candidates of one structure on one mesh shape."""
  constants = api._machine_for(machine, mesh_shape, "time",  # pylint: disable=protected-access
                               quick_calibration)
  estimator = memory_estimator.MemoryEstimator(graph, mesh_shape, outputs)
  fixed = {}
  if structure.pipelined:
    fixed[model.stage_dimension_name] = planner.STAGE_MESH_DIMENSION
  try:
    search = layout_optimizer.LayoutOptimizer(
        estimator, objective="time", machine=constants, fixed_rules=fixed)
    layouts = {"time search": search.solve()}
  except (layout_optimizer.SolverError, ValueError) as e:
    logging.info("enumerate_plans: %s on %s has no layout: %s",
                 structure.describe(), planner._mesh_string(mesh_shape), e)  # pylint: disable=protected-access
    return []
  if memory_search:
    try:
      layouts["memory search"] = layout_optimizer.LayoutOptimizer(
          estimator, objective="memory", fixed_rules=fixed).solve()
    except (layout_optimizer.SolverError, KeyError) as e:
      # Optional: a failure here leaves the other layouts (KeyError: the
      # memory program's schedule steps, a known bug of tensor aliases).
      logging.warning("enumerate_plans: no least-memory layout of %s on "
                      "%s: %r", structure.describe(),
                      planner._mesh_string(mesh_shape), e)  # pylint: disable=protected-access
  validator = estimator.get_layout_validator()
  layouts.update(plain_layouts(mesh_shape, validator, fixed))
  out = []
  seen = set()
  for kind in LAYOUT_KINDS:
    if kind not in layouts:
      continue
    layout = _normalized(layouts[kind])
    if layout in seen:
      continue
    try:
      seconds = search.evaluate_step_seconds(layout)
    except ValueError:  # An assignment the graph does not allow.
      continue
    seen.add(layout)
    for zero in zero_levels:
      if zero != "none" and not _splits_batch(layout):
        continue  # Shards nothing: the same plan as "none".
      out.append(_Candidate(structure, mesh_shape, layout, kind, zero,
                            seconds, constants))
  return out


def plain_layouts(mesh_shape, validator, fixed_rules=None):
  """{kind: layout} of the plain layouts on a mesh: replicated, data
  parallel (the batch over the largest free mesh dimension), model
  parallel (every wide dimension it divides over that one) and, on two
  free mesh dimensions, both (each way round). Rules the validator does
  not allow are left out; `fixed_rules` are in every layout."""
  fixed = dict(fixed_rules or {})
  free = [d.name for d in sorted(
      (d for d in mesh_shape.dims if d.name not in fixed.values()),
      key=lambda d: -d.size)]
  names = validator.splittable_mtf_dimension_names

  def rules(batch_dim, model_dim):
    r = dict(fixed)
    if batch_dim and validator.is_valid_assignment(BATCH_DIMENSION_NAME,
                                                   batch_dim):
      r[BATCH_DIMENSION_NAME] = batch_dim
    if model_dim:
      for name in MODEL_DIMENSION_NAMES:
        if name in names and validator.is_valid_assignment(name, model_dim):
          r[name] = model_dim
    return ";".join(f"{k}:{v}" for k, v in sorted(r.items()))

  out = {"replicated": rules(None, None)}
  if free:
    out["data parallel"] = rules(free[0], None)
    out["model parallel"] = rules(None, free[0])
  if len(free) >= 2:
    out["data x model"] = rules(free[0], free[1])
    out["model x data"] = rules(free[1], free[0])
  return out


def _distinct(candidates):
  """The candidates less repeats: a layout leaving a mesh dimension
  unused is the same plan on every mesh shape that differs there only."""
  out = {}
  for c in candidates:
    out.setdefault(effective_key(c.structure, c.zero, c.mesh_shape,
                                 c.layout), c)
  return list(out.values())


def effective_key(structure, zero, mesh_shape, layout):
  """What decides how a plan runs: its structure and level, and for each
  mesh dimension its layout uses, that dimension's size and the names split
  over it (the other mesh dimensions only replicate)."""
  sizes = {d.name: d.size for d in shape_lib.convert_to_shape(mesh_shape)}
  by_mesh = {}
  for name, mesh_dim in shape_lib.convert_to_layout_rules(layout or ""):
    by_mesh.setdefault(mesh_dim, set()).add(name)
  return (structure, zero, frozenset(
      (frozenset(names), sizes[m]) for m, names in by_mesh.items()))


def _normalized(layout):
  pairs = shape_lib.convert_to_layout_rules(layout or "")
  return ";".join(sorted(f"{d}:{m}" for d, m in pairs))


def _splits_batch(layout):
  return any(BATCH_DIMENSION_NAME in rule.split(":")[0]
             for rule in layout.split(";") if rule)


_FEATURES = (
    lambda c: c.mesh,
    lambda c: c.kind,
    lambda c: c.zero,
    lambda c: c.structure.stages,
    lambda c: c.structure.micro_batches,
    lambda c: c.structure.recompute_layers > 0,
    lambda c: c.structure,
    # Every plain layout on every mesh shape of the plain structure.
    lambda c: ((c.mesh, c.kind) if c.structure == plan_space.Structure()
               and c.zero == "none" else None),
)


def select(candidates, max_plans, finalists=6):
  """At most max_plans candidates: the `finalists` fastest by the search's
  estimate, then the fastest of every value of each choice not yet taken,
  then the fastest of the rest, structures taken in turn."""
  ranked = sorted(candidates, key=lambda c: c.search_seconds)
  if max_plans is None or len(ranked) <= max_plans:
    return ranked
  chosen = {}

  def take(c):
    if len(chosen) < max_plans and c.key() not in chosen:
      chosen[c.key()] = c

  for c in ranked[:finalists]:
    take(c)
  for feature in _FEATURES:
    covered = {feature(c) for c in chosen.values()}
    for c in ranked:
      if feature(c) not in covered:
        take(c)
        covered.add(feature(c))
  by_structure = {}
  for c in ranked:
    by_structure.setdefault(c.structure, []).append(c)
  queues = list(by_structure.values())
  while len(chosen) < max_plans and any(queues):
    for queue in queues:
      while queue and queue[0].key() in chosen:
        queue.pop(0)
      if queue:
        take(queue.pop(0))
  return list(chosen.values())


def _priced(model, candidate, base):
  """The PricedPlan of a candidate: priced on the graph it runs."""
  if candidate.zero == "none":
    graph, outputs = base
  else:
    graph, outputs = planner._build(  # pylint: disable=protected-access
        model, candidate.structure, candidate.zero, candidate.mesh,
        candidate.layout)
  step_time, memory = plan_pricing.price(
      graph, outputs, candidate.mesh_shape, candidate.layout,
      candidate.machine)
  return PricedPlan(candidate.structure, candidate.zero, candidate.mesh,
                    candidate.layout, candidate.kind,
                    candidate.search_seconds, step_time, memory)
