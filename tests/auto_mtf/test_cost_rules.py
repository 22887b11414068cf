"""Every operation has a cost rule beside its lowering.

The layout search prices operations through the rules their modules
register (mesh_tensorflow.ops.cost_rules). An operation class without one
would be costed as plain slicewise work, silently: this test makes a new
operation name its rule, or join the short list below.
"""

import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow import transformer  # pylint: disable=unused-import
from mesh_tensorflow.auto_mtf import cost_model  # pylint: disable=unused-import
from mesh_tensorflow.ops import cost_rules

# Operations costed as slicewise work whose modules register no rule yet
# (their modules are edited elsewhere; each is slicewise or, for the
# reversible residual, runs operations that are costed themselves).
COSTED_AS_SLICEWISE = {
    "mesh_tensorflow.ops.stacking.SplitOperation",
    "mesh_tensorflow.ops.stacking.StackOperation",
    "mesh_tensorflow.ops.variables.Assign",
    "mesh_tensorflow.ops.variables.ReadVariable",
    "mesh_tensorflow.layers.residual_layers.ReversibleHalfResidualOperation",
}


def _subclasses(cls):
  for sub in cls.__subclasses__():
    yield sub
    yield from _subclasses(sub)


def _operation_classes():
  """Operation classes of mesh_tensorflow and its transformer (not the
  tests')."""
  return sorted({c for c in _subclasses(mtf.Operation)
                 if c.__module__.startswith("mesh_tensorflow.")},
                key=_name)


def _name(cls):
  return f"{cls.__module__}.{cls.__qualname__}"


def test_the_walk_finds_the_operations():
  names = {_name(c) for c in _operation_classes()}
  assert "mesh_tensorflow.ops.contractions.EinsumOperation" in names
  assert any(n.endswith(".pipelining.PipelineIterationOperation")
             for n in names)
  assert COSTED_AS_SLICEWISE <= names


@pytest.mark.parametrize("cls", _operation_classes(), ids=_name)
def test_every_operation_has_a_cost_rule(cls):
  rule = cost_rules.registered_rule(cls)
  if _name(cls) in COSTED_AS_SLICEWISE:
    assert rule is None, (
        f"{_name(cls)} has a rule now: take it off COSTED_AS_SLICEWISE")
  else:
    assert rule is not None, (
        f"{_name(cls)} has no cost rule: register one beside its lowering "
        "(mesh_tensorflow.ops.cost_rules.rule_for, or "
        "cost_rules.register(cls, cost_rules.SLICEWISE) if its lowering is "
        "slicewise work without collectives)")


def test_rules_are_found_through_the_mro():
  # Classes made here, so registering leaves no mark on other tests.

  class Unregistered(mtf.Operation):
    pass

  class Registered(Unregistered):
    pass

  class Sub(Registered):
    pass

  rule = cost_rules.NoWorkCost()
  cost_rules.register(Registered, rule)
  assert cost_rules.registered_rule(Unregistered) is None
  assert cost_rules.registered_rule(Registered) is rule
  assert cost_rules.registered_rule(Sub) is rule
  with pytest.raises(ValueError, match="already has the cost rule"):
    cost_rules.register(Registered, cost_rules.SLICEWISE)
