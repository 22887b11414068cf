"""Residual-stream helpers: reversible (RevNet) blocks, annealed dropout and
a gradient-RMS summary.

Part of `mesh_tensorflow.layers` (re-exported there).

A reversible block (https://arxiv.org/abs/1707.04585) computes
y1 = x1 + f(x2), y2 = x2 and swaps the halves. Its inputs can be rebuilt
from its outputs (x2 = y2, x1 = y1 - f(y2)), so backpropagation does not
need the activations inside f: the gradient recomputes f from the rebuilt
x2. As in the original, the rebuilt values travel down the stack as the
"gradients" of the extra `x1_backwards` / `x2_backwards` tensors: each block
passes its rebuilt inputs to the block below, which uses them instead of its
own forward outputs.
"""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow.layers import layer_helpers
from mesh_tensorflow.gradients import gradients as mtf_gradients
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import cost_rules

__all__ = [
    "ReversibleHalfResidualOperation",
    "annealed_dropout",
    "reversible_half_residual_and_swap",
    "summary_for_clip_activation_gradient",
]


class ReversibleHalfResidualOperation(graph_lib.Operation):
  """(x2, x2_backwards, x1 + f(x2), x1_backwards), differentiated by
  rebuilding the inputs from the outputs.

  f and the addition are built (and lowered) as ordinary operations; this
  operation passes their result on. Its inputs are x1, x1_backwards, x2,
  x2_backwards and every other float tensor f reads (e.g. variables), so
  those get gradients too. The forward activations of f are unusable
  outside: the gradient never reads them.
  """

  def __init__(self, x1, x1_backwards, x2, x2_backwards, f, name=None):
    for t in (x1_backwards, x2, x2_backwards):
      if t.shape != x1.shape or t.dtype != x1.dtype:
        raise ValueError(
            "reversible_half_residual_and_swap: all inputs must have the "
            f"shape and dtype of x1 {x1.shape} {x1.dtype}, got {t.name} "
            f"{t.shape} {t.dtype}.")
    graph = x1.graph
    with graph.capture_operations() as f_operations:
      fx2 = f(x2)
    if not isinstance(fx2, graph_lib.Tensor) or fx2.shape != x2.shape:
      raise ValueError(
          "reversible_half_residual_and_swap: f must return a Tensor shaped "
          f"like its input {x2.shape}, got {fx2!r}.")
    with graph.capture_operations() as add_operations:
      y1 = binary.add(x1, fx2, output_shape=x1.shape)
    # Variables created by f are not part of the computation to redo.
    f_operations = [op for op in f_operations if op.cloneable]
    forward_operations = f_operations + list(add_operations)
    explicit = [x1, x1_backwards, x2, x2_backwards]
    produced = {t for op in forward_operations for t in op.outputs}
    extra = []
    for op in f_operations:
      for t in op.inputs:
        if (t not in produced and t not in explicit and t not in extra and
            t.dtype.is_floating):
          extra.append(t)
    if fx2 not in produced and fx2 not in explicit and fx2 not in extra:
      extra.append(fx2)  # f returned an outside tensor.
    super().__init__(explicit + extra, name=name or "reversible_half_residual")
    self._f_operations = f_operations
    self._fx2 = fx2
    self._forward_outputs = [x2, x2_backwards, y1, x1_backwards]
    self._outputs = [graph_lib.Tensor(self, x1.shape, x1.dtype, index=i)
                     for i in range(4)]
    for op in forward_operations:
      for t in op.outputs:
        t.usable = False

  @property
  def has_gradient(self):
    return True

  def gradient(self, grad_ys):
    dy2, dy2_backwards, dy1, dy1_backwards = grad_ys
    orig_x2 = self._inputs[2]
    extra = self._inputs[4:]
    # The rebuilt outputs come from the block above; at the top of the
    # stack, use this block's own outputs.
    x2 = orig_x2 if dy2_backwards is None else dy2_backwards
    y1 = self._outputs[2] if dy1_backwards is None else dy1_backwards
    if dy1 is None:
      dy1 = constants.zeros_like(y1)
    graph = self.graph
    copies, mapping = graph.clone_operations(self._f_operations,
                                             {orig_x2: x2})
    fx2 = mapping.get(self._fx2, self._fx2)
    x1 = binary.sub(y1, fx2, output_shape=y1.shape)
    grads = mtf_gradients([fx2], [x2] + extra, grad_ys=[dy1],
                         operations=copies)
    dx2 = grads[0]
    if dy2 is not None:
      dx2 = dy2 if dx2 is None else binary.add(dy2, dx2)
    return [dy1, x1, dx2, x2] + list(grads[1:])

  def lower(self, lowering):
    for out, forward in zip(self._outputs, self._forward_outputs):
      lowering.set_tensor_lowering(out, lowering.tensors[forward])


def reversible_half_residual_and_swap(x1, x1_backwards, x2, x2_backwards, f,
                                      recompute_grads=True):
  """A RevNet block: returns (x2, x2_backwards, x1 + f(x2), x1_backwards).

  Pass None as the backwards tensors of the first block, then feed each
  block's outputs to the next:

    x1, x1_bw, x2, x2_bw = x, None, x, None
    for f in fns:
      x1, x1_bw, x2, x2_bw = reversible_half_residual_and_swap(
          x1, x1_bw, x2, x2_bw, f)
    y = (x1 + x2) / 2

  With `recompute_grads`, backpropagation rebuilds each block's inputs from
  its outputs and recomputes f, instead of keeping f's activations; the
  values and gradients are those of the plain computation (up to roundoff).

  Args:
    x1: an mtf Tensor.
    x1_backwards: an mtf Tensor like x1, or None.
    x2: an mtf Tensor like x1.
    x2_backwards: an mtf Tensor like x1, or None.
    f: a function from an mtf Tensor to one of the same shape; besides its
      argument it may read variables and other tensors from outside the
      stack, but not x1 or other activations of the stack.
    recompute_grads: whether to use the reversible gradient.

  Returns:
    (y2, y2_backwards, y1, y1_backwards).
  """
  if not recompute_grads:
    return x2, x2_backwards, x1 + f(x2), x1_backwards
  if x1_backwards is None:
    x1_backwards = constants.zeros_like(x1)
  if x2_backwards is None:
    x2_backwards = constants.zeros_like(x2)
  return tuple(ReversibleHalfResidualOperation(
      x1, x1_backwards, x2, x2_backwards, f).outputs)


def annealed_dropout(x, is_training, start_step, end_step, init_rate=1.0,
                     noise_shape=None, name=None):
  """Dropout whose rate falls linearly from init_rate to 0 over training.

  The rate is init_rate until the global step (`mtf.optimize.
  get_or_create_global_step`) reaches start_step, then decreases linearly to
  0 at end_step. Kept values are scaled by 1 / keep_prob; at keep_prob 0
  (rate 1) the result is 0.

  Args:
    x: a float mtf Tensor.
    is_training: if False, x is returned unchanged.
    start_step: the step where annealing starts.
    end_step: the step where the rate reaches 0 (> start_step).
    init_rate: the initial dropout rate, in [0, 1].
    noise_shape: optional subset of x's dimensions the mask varies over.
    name: optional name of the dropout's operations (its random mask is
      seeded by it).

  Returns:
    an mtf Tensor like x.
  """
  if not is_training or init_rate == 0:
    return x
  if end_step <= start_step:
    raise ValueError(f"annealed_dropout: end_step {end_step} must be after "
                     f"start_step {start_step}.")
  name = name or "annealed_dropout"
  step = mtf.cast(mtf.optimize.get_or_create_global_step(x.mesh), tf.float32)
  progress = mtf.minimum(mtf.maximum(
      (step - float(start_step)) / float(end_step - start_step), 0.0), 1.0)
  keep_prob = 1.0 - float(init_rate) * (1.0 - progress)
  noise_shape = x.shape if noise_shape is None else mtf.convert_to_shape(
      noise_shape)
  u = mtf.random_uniform(x.mesh, noise_shape, dtype=tf.float32,
                         name=name + "/uniform")
  mask = mtf.cast(mtf.less(u, keep_prob), tf.float32) / mtf.maximum(
      keep_prob, 1e-9)
  return mtf.multiply(x, mtf.cast(mask, x.dtype), name=name)


def summary_for_clip_activation_gradient(t, name, batch_dims=None):
  """Identity whose backward pass records the RMS of t's gradient.

  Use it to choose the `clip_rms_norm` of `clip_activation_gradient`: the
  scalar summary `name` (see `Lowering.scalar_summaries`) is the RMS of the
  gradient dt, over all of it; with batch_dims, the RMS of each example
  (over the other dimensions), averaged over the batch. The gradient passes
  through unchanged.

  Args:
    t: a float mtf Tensor.
    name: the summary's name.
    batch_dims: optional Dimensions of t that index examples.

  Returns:
    an mtf Tensor equal to t.

  Raises:
    ShapeError: a batch dimension is not a dimension of t.
  """
  batch_dims = layer_helpers.as_list(batch_dims)
  for d in batch_dims:
    if d not in t.shape.dims:
      raise mtf.ShapeError(
          f"summary_for_clip_activation_gradient {name!r}: batch dimension "
          f"{d} is not a dimension of {t.name} {t.shape}.")

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
              output_grads):
    del explicit_inputs, all_inputs, forward_operations, outputs
    dt = output_grads[0]
    square = mtf.square(mtf.cast(dt, tf.float32))
    if batch_dims:
      rms = mtf.reduce_mean(mtf.sqrt(mtf.reduce_mean(
          square, output_shape=mtf.Shape(batch_dims))))
    else:
      rms = mtf.sqrt(mtf.reduce_mean(square))
    mtf.scalar_summary(name, rms)
    return [dt]

  return mtf.custom_gradient(mtf.identity, grad_fn, [t])


# Priced as the slicewise work of its own outputs; the operations of f it
# runs are those of the graph, priced themselves.
cost_rules.register(ReversibleHalfResidualOperation, cost_rules.SLICEWISE)
