"""Reverse-mode differentiation over an mtf graph.

`gradients(ys, xs)` walks the operations backwards from `ys`, asking each
operation for the gradients of its inputs (built from more mtf operations),
and sums the contributions that reach the same tensor. The gradient
rewrites that operations' annotations declare may take over some
operations' gradients and deliver their terms later, and the annotations
see the operations their gradients create (see mesh_tensorflow.extensions).
"""

from mesh_tensorflow import extensions
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import constants


def gradients(ys, xs, grad_ys=None, operations=None):
  """The gradients of sum(ys) (weighted by `grad_ys`) with respect to `xs`.

  Args:
    ys: list of mtf Tensors.
    xs: list of mtf Tensors, e.g. `[v.outputs[0] for v in
      graph.trainable_variables]`.
    grad_ys: optional list of gradients of `ys` (default: ones).
    operations: optional list of operations to differentiate through
      (default: the whole graph).

  Returns:
    a list with a gradient per x (None where x does not affect ys).
  """
  ys = list(ys)
  xs = list(xs)
  if not ys:
    raise ValueError("gradients needs at least one y.")
  graph = ys[0].graph
  if operations is None:
    operations = graph.operations
  if grad_ys is None:
    grad_ys = [constants.ones_like(y, name="gradients/ones") for y in ys]

  downstream = set(xs)
  for op in operations:
    if any(t in downstream for t in op.inputs):
      downstream.update(op.outputs)

  tensor_to_gradient = {}

  def accumulate(tensor, grad):
    if grad.shape != tensor.shape:
      raise ValueError(
          f"Gradient of {tensor.name} has shape {grad.shape}, expected "
          f"{tensor.shape}.")
    previous = tensor_to_gradient.get(tensor)
    tensor_to_gradient[tensor] = grad if previous is None else binary.add(
        previous, grad)

  rewrites = extensions.gradient_rewrites(operations, downstream)

  def gradient_of(tensor):
    for rewrite in rewrites:
      for g in rewrite.pop_terms(tensor):
        accumulate(tensor, g)
    return tensor_to_gradient.get(tensor)

  for y, grad_y in zip(ys, grad_ys):
    accumulate(y, grad_y)

  for op in reversed(operations):
    grad_outputs = [gradient_of(t) for t in op.outputs]
    if all(g is None for g in grad_outputs):
      continue
    if not any(t in downstream for t in op.inputs):
      continue
    if not op.has_gradient:
      continue
    with graph.name_scope(op.name + "/gradients"), (
        graph.capture_operations()) as created:
      rewrite = next((r for r in rewrites if r.takes_over(op)), None)
      if rewrite is not None:
        input_grads = rewrite.gradient(op, grad_outputs)
      else:
        input_grads = op.gradient(grad_outputs)
    for annotation in op.annotations:
      annotation.gradient_created(op, created)
    for t, g in zip(op.inputs, input_grads):
      if g is not None and t in downstream and t.dtype.is_floating:
        accumulate(t, g)
  return [gradient_of(x) for x in xs]

