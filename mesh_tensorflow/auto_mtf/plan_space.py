"""What a run plan decides besides the layout, and the models it plans.

A plan (mtf.auto_mtf.plan) picks, together: the mesh shape, the layout
rules, the weight-update sharding level (ZeRO) and a `Structure`: the
choices that change the training graph itself (pipeline stages,
micro-batches, recomputed layers). The planner builds the graph of each
structure through a `PlanModel`, which also says which structures the
model has and the settings (gin bindings or keyword arguments) that run
one.

  GraphModel(graph, [loss])       a fixed graph: only Structure()
  TransformerPlanModel (transformer package), DenseStackModel
                                  layer-stacked models: every structure
"""

import abc
import dataclasses

# The weight-update sharding levels (docs/zero.md): none; the optimizer's
# slots and update sharded over the data-parallel mesh dimensions
# (ZeRO-1/2, mtf.shard_data_parallel); the variables too (ZeRO-3).
ZERO_LEVELS = ("none", "weight_update", "parameters")


def zero_flags(zero):
  """(shard_weight_update, shard_parameters) of a ZERO_LEVELS entry."""
  if zero not in ZERO_LEVELS:
    raise ValueError(f"zero must be one of {ZERO_LEVELS}, got {zero!r}.")
  return zero != "none", zero == "parameters"


@dataclasses.dataclass(frozen=True, order=True)
class Structure:
  """The choices of a plan that change the training graph.

  Attributes:
    stages: S, the pipeline stages of the layer stack (1: not pipelined).
      The stacked layers' "stage" dimension is then split over a mesh
      dimension of size S.
    micro_batches: M, the micro-batches streamed through the stages (1
      when not pipelined).
    recompute_layers: how many layers of each stack recompute their
      activations in the backward pass instead of keeping them (the first
      ones; a pipelined stack recomputes all its layers or none).
  """
  stages: int = 1
  micro_batches: int = 1
  recompute_layers: int = 0

  def __post_init__(self):
    for field in ("stages", "micro_batches", "recompute_layers"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < (
          0 if field == "recompute_layers" else 1):
        raise ValueError(f"Structure.{field} must be an integer >= "
                         f"{0 if field == 'recompute_layers' else 1}, got "
                         f"{value!r}.")
    if self.stages == 1 and self.micro_batches != 1:
      raise ValueError(
          f"Structure: micro_batches={self.micro_batches} needs a pipeline "
          "(stages > 1).")

  @property
  def pipelined(self):
    return self.stages > 1

  def describe(self):
    """Short text, e.g. "S=4 M=16 recompute 8"."""
    parts = []
    if self.pipelined:
      parts.append(f"S={self.stages} M={self.micro_batches}")
    if self.recompute_layers:
      parts.append(f"recompute {self.recompute_layers}")
    return " ".join(parts) or "plain"


class PlanModel(abc.ABC):
  """A model the planner can build in each of its structures.

  Subclasses give the structures the model allows on a processor count and
  build the training step's mtf graph (model, loss, gradients, optimizer
  update; not lowered) of each. The graph must not depend on the layout:
  the planner searches the layout of the graph it is given.
  """

  @abc.abstractmethod
  def structures(self, num_processors):
    """The Structures worth searching on num_processors processors (every
    stage count must divide num_processors)."""

  @abc.abstractmethod
  def build(self, structure, zero="none", mesh_shape=None,
            layout_rules=None):
    """(mtf.Graph, [output mtf Tensors]) of one training step, not lowered.

    Called inside a TF graph (or tf.function) that has a global step. With
    zero other than "none", the mesh is sharded for data parallelism as
    that level stores it (mtf.shard_data_parallel with mesh_shape and
    layout_rules) before the model is built; else those are ignored.
    """

  def build_proxy(self, structure, zero="none", mesh_shape=None,
                  layout_rules=None):
    """A smaller graph priced as `structure`'s, or None (the default: the
    planner prices the graph build() makes).

    A layer-stacked model builds each run of L > 3 like layers (per stack,
    or per pipeline stage) with 3 and names the middle one's weight L - 2
    (auto_mtf.proxy_layers: time scales exactly, memory closely).

    Returns:
      (mtf.Graph, [outputs], {layer name prefix: weight}), the prefixes
      those of every layer the proxy has, e.g. "block_001/", or None.
    """
    del structure, zero, mesh_shape, layout_rules
    return None

  def settings(self, structure):
    """{name: value}: what runs `structure` (gin bindings for the
    Transformer binary, keyword arguments elsewhere)."""
    del structure
    return {}

  def plan_settings(self, structure, zero, mesh_shape, layout_rules):
    """settings(structure) plus the mesh shape, layout rules and sharding
    level: everything that runs a plan (keyword arguments by default; the
    Transformer's model gives gin bindings)."""
    shard_weight_update, shard_parameters = zero_flags(zero)
    result = {"mesh_shape": mesh_shape, "layout_rules": layout_rules,
              "shard_weight_update": shard_weight_update,
              "shard_parameters": shard_parameters}
    result.update(self.settings(structure))
    return result

  @property
  def zero_levels(self):
    """The sharding levels build() can make (ZERO_LEVELS by default)."""
    return ZERO_LEVELS

  @property
  def stage_dimension_name(self):
    """The tensor dimension a pipelined graph stacks its stages along."""
    return "stage"


class GraphModel(PlanModel):
  """A fixed graph: the plan searches its mesh shape and layout only (a
  graph built without sharding cannot be rebuilt with it; a PlanModel
  can)."""

  def __init__(self, mtf_graph, mtf_outputs=()):
    self._graph = mtf_graph
    self._outputs = list(mtf_outputs)

  def structures(self, num_processors):
    del num_processors
    return [Structure()]

  @property
  def zero_levels(self):
    return ("none",)

  def build(self, structure, zero="none", mesh_shape=None,
            layout_rules=None):
    del mesh_shape, layout_rules
    if zero != "none":
      raise ValueError(
          "a fixed graph is searched as built; build it after "
          "mtf.shard_data_parallel to run it sharded.")
    if structure != Structure():
      raise ValueError(
          f"a fixed graph has only the plain structure, not "
          f"{structure.describe()!r}.")
    return self._graph, self._outputs
