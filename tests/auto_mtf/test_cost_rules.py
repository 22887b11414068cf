"""Every operation has a cost rule beside its lowering.

The layout search prices operations through the rules their modules
register (mesh_tensorflow.ops.cost_rules). An operation class without one
would be costed as plain slicewise work, silently: this test makes a new
operation name its rule, or join the short list below. Reshapes, whose
rule prices the plan their lowering follows, are checked against the
lowering's counters in layouts the model tests do not reach.
"""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import transformer  # pylint: disable=unused-import
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.ops import cost_rules

# Operations costed as slicewise work without registering a rule: none
# now. (An entry here must be a real operation class without a rule.)
COSTED_AS_SLICEWISE = set()


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


@pytest.mark.parametrize("old,new,rules,mesh", [
    # The same blocks of elements (both splits start at the first
    # element): local, though the split axes differ in size.
    ("a:4;b:6", "c:8;d:3", "a:m;c:m", "m:2"),
    # Splits starting after different numbers of elements, with no free
    # axis of the input to move to: allconcat, then split after.
    ("a:4;b:6", "c:3;d:8", "b:m;d:m", "m:2"),
    ("a:4;b:6", "c:24", "a:m", "m:2"),
    ("a:4;b:6;e:2", "c:8;d:6", "a:m;b:n;d:n", "m:2;n:2"),
])
def test_a_reshape_costs_what_its_lowering_does(old, new, rules, mesh):
  """The rule prices reshape_plan, the plan the lowering follows."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh, rules)
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mtf_mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mtf_mesh, mtf.convert_to_shape(old))
    mtf.reduce_sum(mtf.reshape(x * 2.0, mtf.convert_to_shape(new)))
    counters = dict(mtf.Lowering(graph, {mtf_mesh: impl}).counters)
  assert cost_model.graph_cost(graph, mesh, rules).collectives == (
      cost_model.counted_collectives(counters))
