"""Prices one laid-out training graph: step time and peak memory, by part.

The layout search sums the same figures into one number per layout; a plan
reports them broken down, on the graph it will run (built with its
data-parallel sharding, whose shard dimensions "d_ff@batch" are split as
their names say):

- step time: compute, collectives and the pipeline's bubble, from the cost
  rules beside each lowering (cost_model, the accounting of
  `lowering.counters`) priced with a machine's constants;
- peak bytes per processor, the operations run as soon as their inputs
  exist (as TF's executor runs them; SCHEDULE), the variables stored as
  PlacementMeshImpl stores them (autostacked: same-shaped variables
  assigned together get their new values stacked): parameters, optimizer
  slots, gradients, activations and pipeline buffers.
"""

import dataclasses

from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import scheduler
from mesh_tensorflow.auto_mtf import stage_memory
from mesh_tensorflow.auto_mtf import step_cost
from mesh_tensorflow.storage import autostack
from mesh_tensorflow.strategies import pipelining

# The order the step's operations are taken to run in: each as soon as its
# inputs exist, as TF's executor runs a graph (it keeps a first-in first-out
# queue of the ready operations), not in the layout search's
# memory-minimizing "LIST" order.
SCHEDULE = "ASAP"

MEMORY_PARTS = ("parameters", "optimizer_slots", "gradients", "activations",
                "pipeline_buffers")


@dataclasses.dataclass(frozen=True)
class StepTime:
  """Predicted seconds of one training step.

  Attributes:
    compute: the operations' arithmetic and memory traffic.
    collectives: their communication.
    bubble: the share of the pipelined stages' work done while stages
      wait, (S - 1) / (M + S - 1) of it (0 without a pipeline).
  """
  compute: float
  collectives: float
  bubble: float = 0.0

  @property
  def total(self):
    return self.compute + self.collectives + self.bubble


@dataclasses.dataclass(frozen=True)
class PeakMemory:
  """Predicted bytes per processor at the step's peak, by part.

  Attributes:
    parameters: the trainable variables' slices.
    optimizer_slots: the other variables (the optimizer's slots).
    gradients: weight gradients alive at the peak (no batch dimension).
    activations: the other tensors of the forward and backward passes.
    pipeline_buffers: the buffers a pipeline hands from stage to stage.
  """
  parameters: int
  optimizer_slots: int
  gradients: int
  activations: int
  pipeline_buffers: int = 0

  @property
  def total(self):
    return sum(getattr(self, part) for part in MEMORY_PARTS)

  def as_dict(self):
    return {part: getattr(self, part) for part in MEMORY_PARTS}


def price(mtf_graph, mtf_outputs, mesh_shape, layout_rules, machine=None,
          scale=None):
  """(StepTime or None, PeakMemory) of a graph under a layout.

  Args:
    mtf_graph: the training step's mtf.Graph (not lowered).
    mtf_outputs: its outputs (kept to the end of the step).
    mesh_shape: an mtf.Shape or spec.
    layout_rules: mtf.LayoutRules or spec (shard names need none).
    machine: a machine.MachineConstants; None prices memory only.
    scale: optional proxy_layers.Scale: the graph is a proxy of fewer
      layers, priced as the model it stands for.
  """
  mesh_shape = shape_lib.convert_to_shape(mesh_shape)
  layout_rules = shape_lib.convert_to_layout_rules(layout_rules)
  time = None
  if machine is not None:
    time = step_time(mtf_graph, mesh_shape, layout_rules, machine, scale,
                     outputs=mtf_outputs)
  return time, peak_memory(mtf_graph, mtf_outputs, mesh_shape,
                           layout_rules, scale)


def step_time(mtf_graph, mesh_shape, layout_rules, machine, scale=None,
              outputs=()):
  """The StepTime of every operation of the graph under the layout, and of
  exporting `outputs` (cost_model.export_cost: a loss's allreduce)."""
  mesh_sizes = {d.name: d.size for d in mesh_shape.dims}
  assignment = {name: mesh_dim for name, mesh_dim in layout_rules
                if mesh_dim in mesh_sizes}
  pricer = cost_model.Pricer(mtf_graph, assignment, mesh_sizes,
                             layout_rules.allow_uneven)
  stages = _pipeline_stages(mtf_graph)
  compute = collectives = bubble = 0.0
  for operation in cost_model.all_operations(mtf_graph):
    op_compute = op_collectives = 0.0
    for term, factor in (scale.terms(operation) if scale else
                         ((operation, 1),)):
      processors = step_cost.computing_processors(term, assignment,
                                                  mesh_sizes, machine)
      term_compute, term_collectives = step_cost.operation_seconds_parts(
          pricer.cost(term), machine, processors)
      op_compute += factor * term_compute
      op_collectives += factor * term_collectives
    idle = stages.idle_fraction(operation)
    bubble += idle * (op_compute + op_collectives)
    compute += (1 - idle) * op_compute
    collectives += (1 - idle) * op_collectives
  _, exported = step_cost.operation_seconds_parts(
      cost_model.export_cost(mtf_graph, outputs, assignment, mesh_sizes,
                             layout_rules.allow_uneven), machine, 1)
  collectives += exported
  return StepTime(compute=compute, collectives=collectives, bubble=bubble)


def peak_memory(mtf_graph, mtf_outputs, mesh_shape, layout_rules,
                scale=None):
  """The PeakMemory of the graph under the layout, run in SCHEDULE order.

  The variables' slices (parameters and slots, in their slice dtype) are
  held for the whole step; the other tensors are alive from their
  operation to their last reader's, a variable's output too where it is a
  cast of the slices (memory_estimator.read_through_cast), counted with
  the variable's part.
  """
  impl = _StackingMeshImpl(mesh_shape, layout_rules)
  estimator = memory_estimator.MemoryEstimator(
      mtf_graph, mesh_shape, mtf_outputs, layout_rules.allow_uneven,
      as_lowered=True, stack_groups=autostack.plan(
          mtf_graph, {v.mesh: impl for v in mtf_graph.all_variables},
          **(mtf_graph.stacking_limits or {})))
  graph = estimator.get_graph_interface()
  schedule = scheduler.minimize_peak_memory(graph, SCHEDULE)
  part_of = _memory_parts(mtf_graph)
  sizes = {}
  for name in graph.get_all_tensor_names():
    if graph.is_tensor_on_canonical_device(name):
      sizes[name] = _slice_bytes(impl, part_of.tensors[name])
  if scale is not None:
    for name, weight in scale.tensor_weights(graph, schedule).items():
      sizes[name] = sizes.get(name, 0) * weight
  held = {v.outputs[0].name for v in mtf_graph.all_variables
          if not memory_estimator.read_through_cast(v)}
  transient = {t: b for t, b in sizes.items() if t not in held}
  slices = {v.outputs[0].name: impl.slice_size(v.shape) * v.slice_dtype.size
            for v in mtf_graph.all_variables}
  stage_names, stages = stage_memory.stage_dimensions(
      mtf_graph, mesh_shape, layout_rules)
  if stages > 1:
    _, alive = stage_memory.peak(
        mtf_graph, transient,
        {t for t in transient if graph.is_tensor_final(t)}, stage_names,
        stages, {t: graph.get_tensor_buffer(t) for t in sizes
                 if graph.get_tensor_buffer(t) != t},
        {op: graph.get_operation_apart_groups(op)
         for op in graph.get_all_operation_names()
         if graph.get_operation_apart_groups(op) is not None})
    in_memory = set(alive)
  else:
    deltas = graph.compute_memory_deltas_under_schedule(schedule)
    _, at = layout_optimizer.peak_under_schedule(deltas, transient)
    in_memory = set()
    for added, removed in deltas[:0 if at is None else at + 1]:
      in_memory.difference_update(removed)
      in_memory.update(added)
  parts = dict.fromkeys(MEMORY_PARTS, 0)
  for t in in_memory:
    parts[part_of.part(t)] += sizes.get(t, 0) if t not in held else 0
  for t, size in slices.items():
    weight = sizes.get(t, 0) / max(1, _slice_bytes(impl, part_of.tensors[t]))
    parts[part_of.part(t)] += int(round(size * weight))
  return PeakMemory(**parts)


class _StackingMeshImpl(mesh_impl_lib.MeshImpl):
  """The layout's slices, stacked as PlacementMeshImpl stacks variables
  (on more than one processor)."""

  @property
  def supports_autostack(self):
    return self.size > 1


def _slice_bytes(impl, tensor):
  return impl.slice_size(tensor.shape) * tensor.dtype.size


class _MemoryParts:
  """Which part of PeakMemory each tensor of a graph counts in."""

  def __init__(self, mtf_graph):
    self.tensors = {}
    for op in mtf_graph.operations:
      for t in op.outputs:
        self.tensors[t.name] = t
    trainable = {v.outputs[0].name for v in mtf_graph.trainable_variables}
    self._variables = {v.outputs[0].name: (
        "parameters" if v.outputs[0].name in trainable else
        "optimizer_slots") for v in mtf_graph.all_variables}
    self._buffers = {
        t.name for op in mtf_graph.operations
        if isinstance(op, pipelining.PipelineIterationOperation)
        for t in op.outputs}

  def part(self, name):
    found = self._variables.get(name)
    if found:
      return found
    if name in self._buffers:
      return "pipeline_buffers"
    tensor = self.tensors[name]
    if ("/gradients" in tensor.operation.name and
        not any("batch" in n for n in tensor.shape.dimension_names)):
      return "gradients"
    return "activations"


def _memory_parts(mtf_graph):
  return _MemoryParts(mtf_graph)


class _PipelineStages:
  """The operations of a graph's pipelines that run once per iteration on
  a stage's micro-batch: a (S - 1) / (M + S - 1) share of their work is
  the bubble."""

  def __init__(self, mtf_graph):
    self._fraction = {}  # {stage dimension name: idle fraction}
    for info in pipelining.pipeline_infos(mtf_graph):
      s = info.stage_dim.size
      self._fraction[info.stage_dim.name] = (s - 1) / info.num_iterations

  def idle_fraction(self, operation):
    if not self._fraction:
      return 0.0
    for t in operation.outputs:
      names = t.shape.dimension_names
      if any("batch" in n for n in names):
        for name in names:
          if name in self._fraction:
            return self._fraction[name]
    return 0.0


def _pipeline_stages(mtf_graph):
  return _PipelineStages(mtf_graph)
