"""Batched weight gradients: one einsum for a weight's repeated uses.

A weight used by many einsums of one shape (the stacked stage weights of
`mtf.pipeline`, used once per iteration; a loop unrolled over time) gets one
gradient term per use, einsum([dy_i, x_i], w.shape), and the terms are
summed. Each term is a small matmul and each sum a pass over the weight's
size; where the contracted dimensions are split (a split batch) each term
is an all-reduce too. Stacking the terms' operands along a new dimension,
contracted as well, gives the same sum as ONE einsum: one large matmul and
one all-reduce. The price is memory: every term's operands stay alive until
the last one is known (the end of the backward pass through the uses).

Einsums opt in with `mark(operation, key)` (mtf.pipeline marks its stages'
einsums when asked: batch_weight_gradients=True), an annotation. The
annotation declares a gradient rewrite (see mesh_tensorflow.extensions,
point 2): `mtf.gradients` over marked einsums defers the terms that reach
one tensor from two or more marked einsums of one key and the same operand
shapes, and sums each such group with one einsum. It is a default of the
graph: `mtf.Graph(batch_gradients=False)` (or `graph.batch_gradients =
False`) computes each term on its own instead.
"""

import dataclasses
from typing import Any

from mesh_tensorflow import extensions
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import stacking

# The name of the dimension a group's terms are stacked along.
TERMS_DIM_NAME = "gradient_terms"


@dataclasses.dataclass(frozen=True)
class GradientBatchKey(extensions.Annotation):
  """The group an einsum's gradient terms may be batched in."""
  key: Any

  @staticmethod
  def gradient_rewrite(operations, downstream):
    """The rewrite of one `mtf.gradients` call (extensions, point 2)."""
    return PendingTerms(deferred_inputs(operations, downstream))


def mark(operation, key):
  """Lets `gradients` batch `operation`'s (an einsum's) gradient terms with
  those of other einsums marked with the same `key`."""
  operation.annotate(GradientBatchKey(key))


def _key(operation):
  mark_ = operation.annotation(GradientBatchKey)
  return None if mark_ is None else mark_.key


def _signature(operation, index):
  """What a deferred term's group must share: the key, the target tensor
  and the shapes and dtype of its operands."""
  others = [x.shape for j, x in enumerate(operation.inputs) if j != index]
  return (_key(operation), operation.inputs[index],
          operation.outputs[0].shape, tuple(others))


def deferred_inputs(operations, downstream):
  """The (operation, input index) pairs whose gradient terms are batched:
  inputs of marked einsums of graphs that batch gradients, in `downstream`,
  floating, reached by at least one other marked einsum's term of the same
  signature."""
  groups = {}
  for op in operations:
    if (_key(op) is None or not op.graph.batch_gradients or
        not isinstance(op, contractions.EinsumOperation)):
      continue
    for i, x in enumerate(op.inputs):
      if x in downstream and x.dtype.is_floating:
        groups.setdefault(_signature(op, i), []).append((op, i))
  return {pair for pairs in groups.values() if len(pairs) > 1
          for pair in pairs}


class PendingTerms(extensions.GradientRewrite):
  """The deferred gradient terms, per target tensor, until it is needed."""

  def __init__(self, deferred):
    self._deferred = deferred
    self._terms = {}  # tensor -> {signature: [operand lists]}

  def takes_over(self, operation):
    return any((operation, i) in self._deferred
               for i in range(len(operation.inputs)))

  def gradient(self, operation, grad_outputs):
    """`operation.gradient(grad_outputs)`, with None for the deferred
    inputs (their terms kept for `pop`)."""
    dy = grad_outputs[0]
    grads = []
    for i, x in enumerate(operation.inputs):
      operands = operation.gradient_operands(dy, i)
      if (operation, i) in self._deferred:
        self._terms.setdefault(x, {}).setdefault(
            _signature(operation, i), []).append(operands)
        grads.append(None)
      else:
        grads.append(contractions.einsum(
            operands, output_shape=x.shape, name=f"{operation.name}_grad_{i}"))
    return grads

  def pop_terms(self, tensor):
    """The sums (one einsum per signature) of `tensor`'s deferred terms."""
    groups = self._terms.pop(tensor, {})
    return [_batched_einsum(terms, tensor.shape)
            for terms in groups.values()]


def _batched_einsum(terms, output_shape):
  """sum_i einsum(terms[i], output_shape), as one einsum."""
  if len(terms) == 1:
    return contractions.einsum(terms[0], output_shape=output_shape,
                               name="batched_gradient")
  names = {d.name for operand in terms[0] for d in operand.shape}
  dim_name = TERMS_DIM_NAME
  while dim_name in names:
    dim_name += "_"
  stacked = []
  for position in range(len(terms[0])):
    shape = terms[0][position].shape
    # Next to the contracted dimensions, so the stacked operand reshapes to
    # a matrix without a transpose.
    axis = next((k for k, d in enumerate(shape) if d not in output_shape),
                len(shape))
    stacked.append(stacking.stack([operands[position] for operands in terms],
                                  dim_name, axis=axis,
                                  name="batched_gradient_operand"))
  return contractions.einsum(stacked, output_shape=output_shape,
                             name="batched_gradient")

