"""Control flow and differentiation: depend, custom gradients, recomputation,
while loops and micro-batched training steps.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import gradients as gradients_lib
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise
from mesh_tensorflow.ops import indexing
from mesh_tensorflow.ops import reshapes

__all__ = [
    "CustomGradientOperation",
    "Depend",
    "WhileLoopOperation",
    "custom_gradient",
    "depend",
    "recompute_grad",
    "serialize_training_step",
    "while_loop",
]


class Depend(graph_lib.Operation):
  """Identity of `x` that runs only after `dependencies` (ops or tensors).

  Args:
    x: an mtf Tensor.
    dependencies: mtf Operations (e.g. an Assign) or Tensors.
    name: optional name.
    required: whether lowering onto a mesh implementation that cannot order
      operations (XLA ignores control dependencies) is an error; when False
      the ordering is dropped there and `x` passes through.
  """

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, dependencies, name=None, required=True):
    dependencies = list(dependencies)
    for d in dependencies:
      if not isinstance(d, (graph_lib.Operation, graph_lib.Tensor)):
        raise TypeError(f"depend: dependencies must be mtf Operations or "
                        f"Tensors, got {d!r}.")
    tensors = [d for d in dependencies if isinstance(d, graph_lib.Tensor)]
    super().__init__([x] + tensors, name=name or "depend")
    self._required = required
    self._op_dependencies = [d for d in dependencies
                             if not isinstance(d, graph_lib.Tensor)]
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [grad_ys[0]] + [None] * (len(self._inputs) - 1)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    value = lowering.tensors[self._inputs[0]]
    if not impl.supports_control_dependencies:
      if self._required:
        raise errors.LayoutError(
            f"depend {self.name!r}: {type(impl).__name__} does not support "
            "control dependencies.")
      lowering.set_tensor_lowering(self._outputs[0], value)
      return
    control = []
    for t in self._inputs[1:]:
      # Waiting for the partial sums orders as well as waiting for their
      # allreduce, without forcing it (the sum may still be combined).
      control.extend(_unreduced(lowering.tensors[t]).tensor_list)
    for op in self._op_dependencies:
      lowered = lowering.lowered_operation(op)
      if lowered is not None:
        control.append(lowered)

    def fn(s):
      with tf.control_dependencies(control):
        return tf.identity(s)

    if isinstance(value, mesh_impl_lib.LazyAllreduceSum):
      out = mesh_impl_lib.LazyAllreduceSum(
          impl, impl.slicewise(fn, value.laid_out_input), value.mesh_axes)
    else:
      out = impl.slicewise(fn, value.to_laid_out_tensor())
    lowering.set_tensor_lowering(self._outputs[0], out)


@cost_rules.rule_for(Depend)
class _DependCost(cost_rules.CostRule):
  """Passes input 0 on (pending or not); waits for the others without
  reducing them."""

  may_pend = True
  passes = True
  may_keep = True

  def run(self, info, ctx):
    nbytes = 2 * cost_rules.slice_bytes(ctx.layout, info.in_dims[0],
                                        info.in_itemsize[0])
    return cost_rules.RuleResult([ctx.state(info, 0)],
                                 elementwise_bytes=nbytes)

  def keeps_pending(self, info, index, pending, ctx):
    return True


def _unreduced(value):
  """The laid-out tensor behind a lowered value, without a pending sum."""
  if isinstance(value, mesh_impl_lib.LazyAllreduceSum):
    return value.laid_out_input
  return value.to_laid_out_tensor()


def depend(x, dependencies, name=None):
  """x, passed on only after `dependencies` (mtf Operations or Tensors).

  Inside tf.function and in graph mode this adds control dependencies to
  a copy of x (eagerly, everything runs in program order). Work that
  produced x earlier is not delayed: to read a variable after an
  assignment, use `mtf.read_variable(var, dependencies=[assign_op])`.
  """
  return Depend(x, list(dependencies), name=name).outputs[0]


class CustomGradientOperation(graph_lib.Operation):
  """The outputs of a captured forward computation, with a given gradient.

  The forward operations stay in the graph and are lowered as usual; this
  operation forwards their outputs and, when differentiated, calls
  `grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
  output_grads)` instead of differentiating them.

  Args:
    explicit_inputs: the Tensors `fn` was called on.
    all_inputs: `explicit_inputs` followed by every other Tensor the forward
      computation reads (e.g. variables); grad_fn returns one gradient per
      tensor of this list.
    fn_outputs: the Tensors the forward computation returned.
    grad_fn: the gradient function (see `custom_gradient`).
    forward_operations: the Operations of the forward computation.
    name: optional name.
  """

  # It passes on the forward computation's outputs, whose lowerings keep
  # their padding zero.
  handles_padding = True
  padding_stays_zero = True

  def __init__(self, explicit_inputs, all_inputs, fn_outputs, grad_fn,
               forward_operations, name=None):
    explicit_inputs = list(explicit_inputs)
    all_inputs = list(all_inputs)
    if all_inputs[:len(explicit_inputs)] != explicit_inputs:
      raise ValueError("CustomGradientOperation: all_inputs must start with "
                       "the explicit inputs.")
    super().__init__(all_inputs, mesh=fn_outputs[0].mesh,
                     name=name or "custom_gradient")
    self._explicit_inputs = explicit_inputs
    self._forward_operations = list(forward_operations)
    self._forward_outputs = list(fn_outputs)
    self._grad_fn = grad_fn
    self._outputs = [graph_lib.Tensor(self, t.shape, t.dtype, index=i)
                     for i, t in enumerate(fn_outputs)]

  @property
  def has_gradient(self):
    return True

  @property
  def forward_outputs(self):
    """The tensors of the forward computation that this op passes on."""
    return list(self._forward_outputs)

  def gradient(self, grad_ys):
    graph = self.graph
    num_variables = len(graph.all_variables)
    grad_ys = [g if g is not None else constants.zeros_like(y)
               for g, y in zip(grad_ys, self._outputs)]
    # The gradient function may read the forward computation's tensors
    # (internal elsewhere).
    internal = [t for op in self._forward_operations for t in op.outputs]
    for t in internal:
      t.usable = True
    try:
      grads = self._grad_fn(self._explicit_inputs, self._inputs,
                            self._forward_operations, self._outputs, grad_ys)
    finally:
      for t in internal:
        t.usable = False
    if len(graph.all_variables) != num_variables:
      raise ValueError(f"The gradient function of {self.name!r} must not "
                       "create variables.")
    grads = list(grads)
    if len(grads) != len(self._inputs):
      raise ValueError(
          f"The gradient function of {self.name!r} returned {len(grads)} "
          f"gradients for {len(self._inputs)} inputs.")
    return grads

  def lower(self, lowering):
    for out, forward in zip(self._outputs, self._forward_outputs):
      lowering.set_tensor_lowering(out, lowering.tensors[forward])


cost_rules.register(CustomGradientOperation, cost_rules.SLICEWISE)


def _external_inputs(operations, explicit_inputs):
  """Float tensors read by `operations` but produced outside them."""
  produced = {t for op in operations for t in op.outputs}
  seen = set(explicit_inputs)
  external = []
  for op in operations:
    for t in op.inputs:
      if t not in produced and t not in seen and t.dtype.is_floating:
        seen.add(t)
        external.append(t)
  return external


def custom_gradient(fn, grad_fn, explicit_inputs):
  """Runs `fn(*explicit_inputs)` but differentiates it with `grad_fn`.

  Args:
    fn: function of mtf Tensors returning a Tensor or a list of Tensors.
    grad_fn: fn(explicit_inputs, all_inputs, forward_operations, outputs,
      output_grads) -> one gradient (or None) per tensor of `all_inputs`,
      which are the explicit inputs followed by every other float tensor the
      forward computation reads (e.g. variables).
    explicit_inputs: list of mtf Tensors.

  Returns:
    what `fn` returns. Tensors computed inside `fn` cannot be used outside.
  """
  explicit_inputs = list(explicit_inputs)
  graph = explicit_inputs[0].graph
  with graph.capture_operations() as forward_operations:
    outputs = fn(*explicit_inputs)
  single = isinstance(outputs, graph_lib.Tensor)
  output_list = [outputs] if single else list(outputs)
  forward_operations = [op for op in forward_operations if op.cloneable]
  all_inputs = explicit_inputs + _external_inputs(forward_operations,
                                                  explicit_inputs)
  op = CustomGradientOperation(explicit_inputs, all_inputs, output_list,
                               grad_fn, forward_operations)
  for forward_op in forward_operations:
    for t in forward_op.outputs:
      t.usable = False
  return op.outputs[0] if single else op.outputs


def recompute_grad(fn, explicit_inputs, control_dependencies=True):
  """Runs `fn` but recomputes its activations in the backward pass.

  The forward activations of `fn` are not kept for the gradient: the
  backward pass copies the forward operations and differentiates the copies,
  trading compute for memory: a stack of blocks then keeps only each
  block's inputs, plus the activations of one block at a time.

  With `control_dependencies` (where the mesh implementation can order
  operations; XLA orders by itself), two orderings make that bound hold
  whatever order TF's executor picks among ready operations:
  - the copies wait for the output gradients, so they cannot run as soon as
    their inputs exist (alongside the forward pass) and hold memory;
  - the gradients passed back wait for all of this block's gradients, so
    the block's recomputed activations and their gradients are released
    before an earlier block is recomputed (otherwise, e.g., a variable's
    gradient may be left until the end, holding what it reads).
  The saving is in compiled programs (tf.function, graph mode, SIMD):
  eagerly, the Lowering keeps every value it lowered, for export.
  benchmarks/recompute_memory.py measures it.

  Args:
    fn: function of mtf Tensors returning a Tensor or a list of Tensors.
    explicit_inputs: list of mtf Tensors.
    control_dependencies: whether to add the orderings above.

  Returns:
    what `fn` returns.
  """
  def grad_fn(explicit, all_inputs, forward_operations, outputs,
              output_grads):
    del explicit
    graph = outputs[0].graph
    if control_dependencies:
      mapping = {x: Depend(x, output_grads, required=False).outputs[0]
                 for x in all_inputs}
    else:
      mapping = {x: x for x in all_inputs}
    copies, copied = graph.clone_operations(forward_operations, mapping)
    recomputed = [copied[t] for t in outputs[0].operation.forward_outputs]
    grads = gradients_lib.gradients(
        recomputed, [mapping[x] for x in all_inputs], grad_ys=output_grads,
        operations=copies)
    present = [g for g in grads if g is not None]
    if not control_dependencies or len(present) < 2:
      return grads
    return [None if g is None else Depend(
        g, [h for h in present if h is not g], required=False).outputs[0]
            for g in grads]

  return custom_gradient(fn, grad_fn, explicit_inputs)


class _LoopPlaceholder(graph_lib.Operation):
  """Stands for a loop variable inside a while loop's body."""

  def __init__(self, mesh, shape, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "loop_var")
    self._outputs = [graph_lib.Tensor(self, shape, dtype)]

  def lower(self, lowering):
    raise ValueError(f"{self.name} is a while-loop variable; it has no value "
                     "outside the loop.")


class WhileLoopOperation(graph_lib.Operation):
  """A tf.while_loop whose condition and body are mtf computations.

  The operations `cond_fn` and `body_fn` create are taken out of the graph
  and lowered by this operation, inside the loop; they are still checked
  against the layout by the Lowering, as operations outside a loop are
  (see `internal_operations`).

  Args:
    cond_fn: fn(*loop vars) -> scalar bool mtf Tensor.
    body_fn: fn(*loop vars) -> new loop vars, then accumulators when
      `has_accumulators`.
    inputs: the initial loop variables.
    tf_kwargs: dict of keyword arguments for tf.while_loop.
    has_accumulators: whether body_fn returns accumulators.
    name: optional name.
  """

  # Each operation of the condition and body handles padding itself when
  # the loop lowers it; loop variables and accumulators (which start at
  # zero) are outputs of those, so their padding stays zero.
  handles_padding = True
  padding_stays_zero = True

  def __init__(self, cond_fn, body_fn, inputs, tf_kwargs=None,
               has_accumulators=False, name=None):
    inputs = list(inputs)
    if not inputs:
      raise ValueError("while_loop needs at least one loop variable.")
    mesh = inputs[0].mesh
    graph = mesh.graph
    placeholders = [
        _LoopPlaceholder(mesh, x.shape, x.dtype).outputs[0] for x in inputs]
    with graph.capture_operations() as cond_ops:
      cond_output = cond_fn(*placeholders)
    with graph.capture_operations() as body_ops:
      body_outputs = list(body_fn(*placeholders))
    if cond_output.dtype != tf.bool or cond_output.shape.ndims:
      raise ValueError(f"while_loop: cond_fn must return a scalar bool "
                       f"Tensor, got {cond_output}.")
    num_accumulators = len(body_outputs) - len(inputs)
    if num_accumulators < 0 or (num_accumulators and not has_accumulators):
      raise ValueError(
          f"while_loop: body_fn returned {len(body_outputs)} tensors for "
          f"{len(inputs)} loop variables (pass has_accumulators=True to "
          "return extra accumulators).")
    for x, y in zip(inputs, body_outputs):
      if x.shape != y.shape or x.dtype != y.dtype:
        raise errors.ShapeError(
            f"while_loop: body output {y.name} {y.shape} {y.dtype.name} does "
            f"not match loop variable {x.name} {x.shape} {x.dtype.name}.")
    # Variables created while tracing stay outside the loop.
    self._cond_ops = [op for op in cond_ops if op.cloneable]
    self._body_ops = [op for op in body_ops if op.cloneable]
    internal = self._cond_ops + self._body_ops
    external = []
    produced = {t for op in internal for t in op.outputs} | set(placeholders)
    for op in internal:
      for t in op.inputs:
        if t not in produced and t not in external:
          external.append(t)
    graph.remove_operations(internal + [p.operation for p in placeholders])
    super().__init__(inputs + external, mesh=mesh, name=name or "while_loop")
    self._num_loop_vars = len(inputs)
    self._placeholders = placeholders
    self._cond_output = cond_output
    self._body_outputs = body_outputs
    self._tf_kwargs = dict(tf_kwargs or {})
    self._outputs = [graph_lib.Tensor(self, y.shape, y.dtype, index=i)
                     for i, y in enumerate(body_outputs)]
    self._initialize_splittable_and_unsplittable_dims("splittable")

  @property
  def has_gradient(self):
    return False

  @property
  def internal_operations(self):
    """The operations this loop lowers itself: its loop variables'
    stand-ins, then those of `cond_fn` and `body_fn`, in order."""
    return ([p.operation for p in self._placeholders] + self._cond_ops +
            self._body_ops)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    n = self._num_loop_vars
    loop_vars = [lowering.laid_out_tensor(x) for x in self._inputs[:n]]
    # A lazily reduced value from outside the loop is reduced here, once:
    # reduced inside, its cached result would belong to the loop's graph
    # and be unusable after the loop.
    for x in self._inputs[n:]:
      lowering.laid_out_tensor(x)
    accumulators = self._body_outputs[n:]
    acc_init = [
        impl.slicewise(lambda _, s=impl.slice_shape(a.shape), d=a.dtype:
                       tf.zeros(s, d), impl.laid_out_pnum())
        for a in accumulators]
    sizes = [len(v.tensor_list) for v in loop_vars + acc_init]
    lazy_axes = {}

    def unflatten(flat):
      values, i = [], 0
      for size in sizes:
        values.append(mesh_impl_lib.LaidOutTensor(list(flat[i:i + size])))
        i += size
      return values

    def lower_ops(ops, flat):
      values = unflatten(flat)
      for p, v in zip(self._placeholders, values[:n]):
        lowering.tensors[p] = v
      for op in ops:
        lowering.lower_operation(op)
      return values

    def cond(*flat):
      lower_ops(self._cond_ops, flat)
      return lowering.laid_out_tensor(self._cond_output).tensor_list[0]

    def body(*flat):
      values = lower_ops(self._body_ops, flat)
      out = []
      for y in self._body_outputs[:n]:
        out.extend(lowering.laid_out_tensor(y).tensor_list)
      for i, (y, acc) in enumerate(zip(accumulators, values[n:])):
        value = lowering.tensors[y]
        if isinstance(value, mesh_impl_lib.LazyAllreduceSum):
          # Sum partial sums across iterations; allreduce once after.
          lazy_axes[i] = value.mesh_axes
          value = value.laid_out_input
        else:
          lazy_axes.setdefault(i, None)
        summed = impl.slicewise(tf.add, acc, value)
        out.extend(summed.tensor_list)
      return out

    flat_init = [t for v in loop_vars + acc_init for t in v.tensor_list]
    flat_out = tf.while_loop(cond, body, flat_init, **self._tf_kwargs)
    results = unflatten(list(flat_out))
    for i, (t, value) in enumerate(zip(self._outputs, results)):
      if i >= n and lazy_axes.get(i - n):
        value = mesh_impl_lib.LazyAllreduceSum(impl, value, lazy_axes[i - n])
      lowering.set_tensor_lowering(t, value)


# Not modelled: a loop's body is costed as slicewise work, once.
cost_rules.register(_LoopPlaceholder, cost_rules.SLICEWISE)
cost_rules.register(WhileLoopOperation, cost_rules.SLICEWISE)


def while_loop(cond_fn, body_fn, inputs, num_loop_vars=None,
               has_accumulators=False, name=None, **tf_kwargs):
  """Loops `inputs = body_fn(*inputs)` while `cond_fn(*inputs)`.

  Args:
    cond_fn: fn(*loop vars) -> scalar bool mtf Tensor.
    body_fn: fn(*loop vars) -> new loop vars, followed by accumulators when
      `has_accumulators` (values summed over iterations, starting at zero;
      a pending allreduce of an accumulator is done once, after the loop).
    inputs: list of mtf Tensors, the initial loop variables.
    num_loop_vars: optional k: return only the first k outputs, as the
      original did (there the other loop variables were kept in variables,
      to save memory on multi-GPU set-ups; here every input stays a loop
      variable of one tf.while_loop, which holds each value once).
    has_accumulators: whether body_fn returns accumulators.
    name: optional name.
    **tf_kwargs: passed to tf.while_loop (e.g. maximum_iterations).

  Returns:
    the final loop variables, then the accumulators (or the first
    `num_loop_vars` of these). No gradient.
  """
  inputs = list(inputs)
  if num_loop_vars is not None and not 0 < num_loop_vars <= len(inputs):
    raise ValueError(
        f"while_loop: num_loop_vars must be between 1 and the number of "
        f"loop variables ({len(inputs)}), got {num_loop_vars}.")
  outputs = WhileLoopOperation(cond_fn, body_fn, inputs, tf_kwargs=tf_kwargs,
                               has_accumulators=has_accumulators,
                               name=name).outputs
  return outputs if num_loop_vars is None else outputs[:num_loop_vars]


def serialize_training_step(features, model_fn, batch_dim, num_splits):
  """Runs a training step as `num_splits` micro-batches, summing gradients.

  Args:
    features: dict of mtf Tensors that have `batch_dim`.
    model_fn: fn(features) -> dict of output Tensors, with a scalar "loss".
    batch_dim: the batch Dimension.
    num_splits: number of micro-batches (divides batch_dim.size).

  Returns:
    (gradients of the summed loss for graph.trainable_variables, outputs):
    outputs with the micro-batch dimension are put back together along
    `batch_dim`; the others (e.g. the loss) are summed over micro-batches.
  """
  if batch_dim.size % num_splits:
    raise errors.ShapeError(
        f"serialize_training_step: batch dimension {batch_dim} does not "
        f"divide into {num_splits} micro-batches.")
  mesh = next(iter(features.values())).mesh
  graph = mesh.graph
  split_dim = shape_lib.Dimension("microbatch_index", num_splits)
  micro_dim = shape_lib.Dimension(batch_dim.name,
                                  batch_dim.size // num_splits)
  keys = sorted(features)
  split_features = [
      reshapes.replace_dimensions(
          features[k], batch_dim, [split_dim, micro_dim]) for k in keys]
  # Filled in when the loop body is traced.
  probe = {}

  def body(i, *accumulated):
    del accumulated
    selector = indexing.one_hot(i, split_dim, dtype=tf.float32)
    micro = {k: indexing.gather(x, i, split_dim)
             for k, x in zip(keys, split_features)}
    outputs = model_fn(micro)
    variables = graph.trainable_variables
    grads = gradients_lib.gradients([outputs["loss"]],
                                    [v.outputs[0] for v in variables])
    probe["output_keys"] = sorted(outputs)
    results = []
    for k in probe["output_keys"]:
      y = outputs[k]
      if micro_dim in y.shape.dims:
        y = binary.multiply(y, elementwise.cast(selector, y.dtype),
                            output_shape=y.shape + split_dim)
      results.append(y)
    probe["grad_mask"] = [g is not None for g in grads]
    results.extend(g for g in grads if g is not None)
    return [i + 1] + results

  i0 = constants.constant(mesh, 0, shape_lib.Shape([]), dtype=tf.int32)
  out = while_loop(lambda i, *unused: comparisons.less(i, num_splits), body,
                   [i0], has_accumulators=True)
  num_outputs = len(probe["output_keys"])
  outputs = {}
  for k, y in zip(probe["output_keys"], out[1:1 + num_outputs]):
    if split_dim in y.shape.dims:
      y = reshapes.replace_dimensions(
          _split_dim_before(y, split_dim, micro_dim),
          [split_dim, micro_dim], batch_dim)
    outputs[k] = y
  grads_iter = iter(out[1 + num_outputs:])
  grads = [next(grads_iter) if present else None
           for present in probe["grad_mask"]]
  return grads, outputs


def _split_dim_before(y, split_dim, micro_dim):
  """Puts split_dim right before micro_dim so the two can be merged."""
  dims = [d for d in y.shape.dims if d != split_dim]
  position = dims.index(micro_dim)
  new_shape = shape_lib.Shape(dims[:position] + [split_dim] + dims[position:])
  return contractions.transpose(y, new_shape)

