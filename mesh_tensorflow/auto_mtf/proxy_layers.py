"""Prices a model of many like layers by a proxy of a few, scaled.

A layer-stacked model of L layers costs its first and last layer, L - 2
copies of a middle one, and what is outside the stack. The planner builds
a proxy of 3 layers per run of like layers (PlanModel.build_proxy) and
weighs the middle layer by L - 2:

- time: each operation's predicted seconds times its layer's weight, so
  the proxy's step time is the full graph's (time is linear in the layers,
  and the middle layer's operations price alike under every layout);
- memory: the middle layer's tensors count `weight` times where they are
  stored across layers (variables and slots, activations kept for the
  backward pass, values kept until after every layer ran), once where
  they are transient (see Scale.tensor_weights).
  This is an approximation of the full graph's schedule (tests bound it).

A layer's operations are found by name: the model gives each layer's name
prefix (e.g. "decoder/block_001/"), which its operations, their gradients
("<op>/gradients/...") and its variables carry. An operation with no
layer name takes the layer of its inputs when they come from one layer
(an optimizer's update of a layer's weight), or of the operations that
read it when they are one layer's. An operation with no
outputs reading several layers (the optimizer's combined assignment) is
priced as the sum over its inputs it is: its cost plus, per weighted
layer, (weight - 1) times what that layer's inputs add to it.
"""

import copy
import dataclasses
import logging

import tensorflow as tf

from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.ops import variables as variables_lib


class Scale:
  """The weights of a proxy graph's operations and tensors.

  Attributes:
    layer_weights: {layer name prefix: weight}.
  """

  def __init__(self, mtf_graph, layer_weights):
    self.layer_weights = dict(layer_weights)
    self._layer_of = {}  # {operation: prefix} of layered operations.
    self._terms = {}  # {operation: [(operation, factor)]} of mixed ones.
    operations = list(cost_model.all_operations(mtf_graph))
    for op in operations:
      layer = self._named_layer(op.name)
      if layer is None:
        layers = {self._layer_of.get(t.operation) for t in op.inputs}
        layered = layers - {None}
        if len(layered) == 1 and not (None in layers and not op.outputs):
          layer = layered.pop()
      if layer is not None:
        self._layer_of[op] = layer
    # Upstream: what only one layer reads is that layer's (an optimizer's
    # per-variable learning rate, say).
    readers = {}
    for op in operations:
      for t in op.inputs:
        readers.setdefault(t, []).append(op)
    for op in reversed(operations):
      if op in self._layer_of or not op.outputs:
        continue
      layers = {self._layer_of.get(r) for t in op.outputs
                for r in readers.get(t, ())}
      if len(layers) == 1 and None not in layers:
        self._layer_of[op] = layers.pop()
    for op in operations:
      if op not in self._layer_of and not op.outputs and len(
          {self._layer_of.get(t.operation) for t in op.inputs} - {None}) > 1:
        self._terms[op] = self._mixed_terms(op)

  def _named_layer(self, name):
    """The prefix of the layer `name` belongs to: the one found first in
    it, at its start or after a "/"."""
    best = None
    for prefix in self.layer_weights:
      if name.startswith(prefix):
        at = 0
      else:
        at = name.find("/" + prefix)
        if at < 0:
          continue
      if best is None or at < best[0]:
        best = (at, prefix)
    return None if best is None else best[1]

  def _mixed_terms(self, op):
    """[(operation, factor)] whose weighted cost is `op`'s scaled: its cost
    plus (w - 1) times (its cost less its cost without layer p's inputs)
    for each layer p of weight w."""
    terms = [(op, 1.0)]
    for prefix in sorted({self._layer_of.get(t.operation)
                          for t in op.inputs} - {None}):
      w = self.layer_weights[prefix]
      if w == 1:
        continue
      without = copy.copy(op)
      kept = [self._layer_of.get(t.operation) != prefix for t in op.inputs]
      without._inputs = [t for t, k in zip(op.inputs, kept) if k]  # pylint: disable=protected-access
      if isinstance(op, variables_lib.Assign):
        # An Assign's variables go with its new values, one each.
        without._variables = [v for v, k in zip(op.variables, kept) if k]  # pylint: disable=protected-access
      terms[0] = (op, terms[0][1] + (w - 1))
      terms.append((without, -(w - 1)))
    return terms

  def layer_of(self, op):
    """The layer prefix of an operation, or None."""
    return self._layer_of.get(op)

  def weight(self, op):
    """The factor of an operation with one term (see terms)."""
    layer = self._layer_of.get(op)
    return 1 if layer is None else self.layer_weights[layer]

  def terms(self, op):
    """[(operation, factor)]: the operation's scaled seconds are the sum
    of each one's priced seconds times its factor."""
    found = self._terms.get(op)
    return found if found is not None else [(op, self.weight(op))]

  def tensor_weights(self, graph_interface, schedule):
    """{tensor name: weight} of the tensors weighted other than 1, under
    `schedule` (ids into graph_interface's operations, in run order).

    A weighted layer's tensor is stored across layers (each layer of the
    model holds its own at once) if it is a variable or final, is alive
    across the turn from the forward to the backward pass (the step
    computing the first final output, the loss: an activation kept for
    the backward pass, an optimizer's term computed early), or is
    read last by an operation of no layer (a new value that the combined
    assignment of every layer's variables writes); else it is transient
    (one at a time).
    """
    ops = [graph_interface._operation(name)  # pylint: disable=protected-access
           for name in graph_interface.get_all_operation_names()]
    step_of = {i: s for s, i in enumerate(schedule)}
    last_read = {}  # {tensor name: (step, reader)}
    turn = None
    for s, i in enumerate(schedule):
      op = ops[i]
      for t in op.inputs:
        last_read[t.name] = (s, op)
      if turn is None and not isinstance(op, variables_lib.Variable) and any(
          graph_interface.is_tensor_final(t.name) for t in op.outputs):
        turn = s
    end = len(schedule) - 1
    weights = {}
    for i, op in enumerate(ops):
      layer = self._layer_of.get(op)
      if layer is None or self.layer_weights[layer] == 1:
        continue
      w = self.layer_weights[layer]
      first = step_of[i]
      for t in op.outputs:
        last, reader = last_read.get(t.name, (first, op))
        if (isinstance(op, variables_lib.Variable) or
            graph_interface.is_tensor_final(t.name) or
            (turn is not None and first < turn <= last) or
            reader not in self._layer_of or last == end):
          weights[t.name] = w
    return weights


# Layers kept at each end of a run of like layers: a run of n > 2 * EDGE
# + 1 is priced as its EDGE first and EDGE last layers and one middle
# layer weighted n - 2 * EDGE. Two, not one: the layers next to the ends
# run while the peak's tensors of the ends are alive, and are not like the
# layers far from them (an optimizer update done or not yet), so the one
# weighted is a layer far from both ends (memory agrees more closely).
EDGE = 2


def runs(kinds, edge=EDGE):
  """The proxy of layers of `kinds` (a list, one entry per layer; like
  layers have equal kinds): [(kind, weight)], each run of n > 2 * edge + 1
  like layers kept as its `edge` first, a middle one (weight n - 2 *
  edge) and its `edge` last; None when no run is that long (the proxy
  would be the model)."""
  result = []
  shrunk = False
  i = 0
  while i < len(kinds):
    j = i
    while j < len(kinds) and kinds[j] == kinds[i]:
      j += 1
    n = j - i
    if n > 2 * edge + 1:
      result += ([(kinds[i], 1)] * edge + [(kinds[i], n - 2 * edge)] +
                 [(kinds[i], 1)] * edge)
      shrunk = True
    else:
      result += [(kinds[i], 1)] * n
    i = j
  return result if shrunk else None


@dataclasses.dataclass
class ProxyGraph:
  """A proxy's graph, its outputs and the Scale that weighs it."""
  graph: object
  outputs: list
  scale: Scale

  def price(self, mesh_shape, layout_rules, machine=None):
    """(StepTime, PeakMemory) of the full model, priced on the proxy
    (plan_pricing.price with the scale)."""
    # Imported here: plan_pricing imports the layout search's modules.
    from mesh_tensorflow.auto_mtf import plan_pricing  # pylint: disable=g-import-not-at-top
    return plan_pricing.price(self.graph, self.outputs, mesh_shape,
                              layout_rules, machine, scale=self.scale)


def build(model, structure, zero="none", mesh_shape=None,
          layout_rules=None):
  """The ProxyGraph of `model` (a plan_space.PlanModel) in `structure`,
  built in a TF graph of its own; None where the model has no proxy (or
  none smaller than the model)."""
  builder = getattr(model, "build_proxy", None)
  if builder is None:
    return None
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    built = builder(structure, zero=zero, mesh_shape=mesh_shape,
                    layout_rules=layout_rules)
  if built is None:
    return None
  graph, outputs, layer_weights = built
  scale = Scale(graph, layer_weights)
  named = {scale.layer_of(op) for op in graph.operations}
  missing = [p for p, w in layer_weights.items() if w != 1 and p not in named]
  if missing:
    # The model named a layer its graph does not have: price it whole.
    logging.warning("proxy_layers: %s has no operations of layer %s; "
                    "building %s whole.", type(model).__name__, missing[0],
                    structure.describe())
    return None
  return ProxyGraph(graph, list(outputs), scale)
