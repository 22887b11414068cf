"""The search counts memory as data-parallel sharding stores it."""

import pytest

from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator
from tests import sharding_training

MESH = "b:4;m:2"
LAYOUT = "batch:b;d_ff:m"


def _optimizer(sharding):
  """A memory-objective optimizer of the MLP stack's training step (every
  optimizer kind), counting `sharding` ("none", "update", "parameters")."""
  graph, loss = sharding_training.unlowered_training_step(
      sharding_training.mlp_loss, sharding_training.make_optimizers())
  estimator = memory_estimator.MemoryEstimator(graph, MESH, [loss])
  optimizer = layout_optimizer.LayoutOptimizer(
      estimator, shard_weight_update=sharding != "none",
      shard_parameters=sharding == "parameters")
  return optimizer, graph


@pytest.mark.parametrize("sharding", ["none", "update", "parameters"])
def test_variable_bytes_are_those_the_lowering_stores(sharding):
  optimizer, graph = _optimizer(sharding)
  _, stored, _ = sharding_training.lower_only(
      sharding_training.mlp_loss, sharding_training.make_optimizers, MESH,
      LAYOUT, sharding)
  layout = dict(pair.split(":") for pair in LAYOUT.split(";"))
  counted = {}
  for variable in graph.all_variables:
    name = variable.outputs[0].name
    assignment = {d: m for d, m in layout.items()
                  if d in optimizer._tensor_dimension_set[name]}  # pylint: disable=protected-access
    counted[variable.name] = optimizer._tensor_bytes(name, assignment)  # pylint: disable=protected-access
  assert counted == stored


def test_sharding_lowers_the_peak():
  peaks = [_optimizer(s)[0].evaluate_peak_memory(LAYOUT)
           for s in ("none", "update", "parameters")]
  assert peaks[0] > peaks[1] > peaks[2]


def test_variables_are_priced_once_not_per_memory_step():
  """Every step holds the sharded variables: their bytes are one
  expression of the program, not terms of each step's constraint (which
  made the planner's programs of T5-11B take minutes to set up)."""
  optimizer, graph = _optimizer("parameters")
  proto = optimizer._model.Proto()  # pylint: disable=protected-access
  z = [v.name for v in proto.variables].index("z")
  step_terms = [len(c.linear.vars) for c in proto.constraints
                if c.HasField("linear") and z in c.linear.vars]
  assert len(step_terms) > 1
  assert sum(step_terms) < len(step_terms) * len(graph.all_variables)


def test_a_budget_below_the_peak_bound_is_refused_unbuilt():
  """peak_lower_bound is at most every layout's peak; a budget below it
  has no layout, said without building the program."""
  optimizer, _ = _optimizer("parameters")
  bound = optimizer.peak_lower_bound()
  smallest, _ = optimizer.smallest_peak()
  assert 0 < bound <= smallest <= optimizer.evaluate_peak_memory(LAYOUT)
  budgeted = layout_optimizer.LayoutOptimizer(
      optimizer._estimator, memory_budget=bound - 1,  # pylint: disable=protected-access
      shard_parameters=True)
  with pytest.raises(layout_optimizer.SolverError, match="no layout fits"):
    budgeted.solve(explain_budget=False)
  assert budgeted._program is None  # pylint: disable=protected-access


def test_sharded_bytes_are_computed_once_per_estimator(monkeypatch):
  """The planner prices a layout with an optimizer per sharding level:
  a sharded variable's bytes under an assignment are computed once."""
  optimizer, _ = _optimizer("parameters")
  calls = []
  compute = layout_optimizer.LayoutOptimizer._compute_sharded_bytes  # pylint: disable=protected-access

  def counted(self, tensor, assignment):
    calls.append(tensor.name)
    return compute(self, tensor, assignment)

  monkeypatch.setattr(layout_optimizer.LayoutOptimizer,
                      "_compute_sharded_bytes", counted)
  again = layout_optimizer.LayoutOptimizer(
      optimizer._estimator, shard_parameters=True)  # pylint: disable=protected-access
  peak = optimizer.evaluate_peak_memory(LAYOUT)
  first = len(calls)
  assert again.evaluate_peak_memory(LAYOUT) == peak
  assert first > 0 and len(calls) == first
