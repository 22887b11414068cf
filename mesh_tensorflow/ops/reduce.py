"""Reductions over named dimensions, and broadcast, their adjoint.

A sum's gradient is a broadcast and a broadcast's a sum, so the two live
together. Softmax and log-sum-exp are in `softmax`.

Each processor reduces its slice; if a reduced dimension is split over mesh
dimensions, the partial results are combined across them: sums lazily (see
`LazyAllreduceSum`), max/min at once.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise
from mesh_tensorflow.ops import slicewise_ops

_LOCAL_REDUCE = {
    "SUM": tf.reduce_sum,
    "MAX": tf.reduce_max,
    "MIN": tf.reduce_min,
    "ALL": tf.reduce_all,
    "ANY": tf.reduce_any,
}
_ACROSS_MESH = {"SUM": "SUM", "MAX": "MAX", "MIN": "MIN", "ALL": "MIN",
                "ANY": "MAX"}


class ReduceOperation(graph_lib.Operation):
  """Reduces `x` to `output_shape` (a subset of its dimensions)."""

  # Padded reduced dimensions hold the reduction's neutral value first.
  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, output_shape, reduction_fn_string, name=None):
    if isinstance(reduction_fn_string, str):
      # The original named reductions in capitals and did not check the
      # name until lowering; "sum" means "SUM" here.
      reduction_fn_string = reduction_fn_string.upper()
    super().__init__([x], name=name or "reduce_" + reduction_fn_string.lower())
    output_shape = shape_lib.convert_to_shape(output_shape)
    extra = [d for d in output_shape if d not in x.shape.dims]
    if extra:
      raise errors.ShapeError(
          f"{self.name}: output shape {output_shape} has dimensions {extra} "
          f"that input {x.name} {x.shape} does not have.")
    if reduction_fn_string not in _LOCAL_REDUCE:
      raise ValueError(f"Unknown reduction {reduction_fn_string!r}; use one "
                       f"of {sorted(_LOCAL_REDUCE)} (any case).")
    self._reduction_fn_string = reduction_fn_string
    self._outputs = [graph_lib.Tensor(self, output_shape, x.dtype)]

  @property
  def reduction_fn_string(self):
    return self._reduction_fn_string

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    x = self._inputs[0]
    if self._reduction_fn_string == "SUM":
      return [broadcast(dy, x.shape)]
    if self._reduction_fn_string in ("MAX", "MIN"):
      # Ties share the gradient equally, as in TensorFlow. The product is
      # mtf.multiply's own einsum (`binary` builds on this module).
      y = self._outputs[0]
      hit = elementwise.cast(comparisons.equal(x, y, output_shape=x.shape),
                             dy.dtype)
      count = reduce_sum(hit, output_shape=y.shape)
      return [contractions.einsum([hit, dy / count], output_shape=x.shape,
                                  name="multiply")]
    return [None]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self._inputs[0]
    out_shape = self._outputs[0].shape
    local_fn = _LOCAL_REDUCE[self._reduction_fn_string]
    local = lambda s: slice_utils.reduce_to(s, x.shape, out_shape, local_fn)
    mesh_axes = sorted({
        impl.tensor_dimension_to_mesh_axis(d) for d in x.shape
        if d not in out_shape and
        impl.tensor_dimension_to_mesh_axis(d) is not None})
    x_lowered = lowering.tensors[x]
    padded_reduced = [x.shape[a.tensor_axis].name
                      for a in impl.padded_axes(x.shape)
                      if x.shape[a.tensor_axis] not in out_shape]
    if padded_reduced and self._reduction_fn_string not in ("SUM", "ANY"):
      x_lowered = impl.fill_padding(
          x_lowered, x.shape, names=padded_reduced,
          fill=padding.neutral_value(x.dtype, self._reduction_fn_string))
    if (self._reduction_fn_string == "SUM" and
        isinstance(x_lowered, mesh_impl_lib.LazyAllreduceSum) and
        x_lowered.mesh_impl.unbound is impl.unbound and
        not set(x_lowered.mesh_axes) & set(mesh_axes)):
      # A sum of pending partial sums: sum the partials locally and leave
      # one allreduce, over both sets of mesh axes, for later.
      y = mesh_impl_lib.LazyAllreduceSum(
          impl, impl.slicewise(local, x_lowered.laid_out_input),
          sorted(set(x_lowered.mesh_axes) | set(mesh_axes)))
      lowering.set_tensor_lowering(self._outputs[0], y)
      return
    y = impl.slicewise(local, x_lowered)
    if mesh_axes:
      across = _ACROSS_MESH[self._reduction_fn_string]
      if across == "SUM":
        y = mesh_impl_lib.LazyAllreduceSum(impl, y, mesh_axes)
      else:
        y = impl.allreduce(y, mesh_axes, across)
    lowering.set_tensor_lowering(self._outputs[0], y)


@cost_rules.rule_for(ReduceOperation)
class _ReduceCost(cost_rules.CostRule):
  """A sum leaves its split reduced dimensions pending (with its input's
  pending sums, when they are over other mesh dimensions); other
  reductions allreduce at once."""

  may_pend = True
  passes = True
  may_keep = True

  def attributes(self, info):
    return (info.op.reduction_fn_string,)

  def run(self, info, ctx):
    layout = ctx.layout
    mesh_dims = layout.summed_mesh_dims(info.in_dims, info.out_dims[0])
    nbytes = cost_rules.io_bytes(info, layout)
    if info.op.reduction_fn_string == "SUM":
      pending = ctx.state(info, 0)
      if pending and not set(pending) & set(mesh_dims):
        return cost_rules.RuleResult([layout.sort(pending + mesh_dims)],
                                     elementwise_bytes=nbytes)
      return cost_rules.RuleResult([mesh_dims], elementwise_bytes=nbytes)
    collectives = []
    if mesh_dims:
      collectives.append(cost_rules.collective(
          layout, "allreduce", mesh_dims,
          cost_rules.slice_bytes(layout, info.out_dims[0],
                                 info.out_itemsize[0])))
    return cost_rules.RuleResult([()], collectives, elementwise_bytes=nbytes)

  def keeps_pending(self, info, index, pending, ctx):
    return (info.op.reduction_fn_string == "SUM" and not set(pending) &
            set(ctx.layout.summed_mesh_dims(info.in_dims, info.out_dims[0])))


def reduction_output_shape(x, output_shape, reduced_dim):
  """The shape a reduction of `x` leaves: `output_shape` if given, else x's
  shape less `reduced_dim` (a Dimension or list), else a scalar."""
  if output_shape is not None and reduced_dim is not None:
    raise ValueError("Give output_shape or reduced_dim, not both.")
  if output_shape is not None:
    return shape_lib.convert_to_shape(output_shape)
  if reduced_dim is None:
    return shape_lib.Shape([])
  if isinstance(reduced_dim, shape_lib.Dimension):
    reduced = [reduced_dim]
  else:
    reduced = [shape_lib.convert_to_dimension(d) for d in reduced_dim]
  for d in reduced:
    if d not in x.shape.dims:
      raise errors.ShapeError(
          f"Cannot reduce over {d}: it is not a dimension of {x.name} "
          f"{x.shape}.")
  return x.shape - reduced


def _reject_positional(fn_name, disable_positional_args):
  """The original's guard: reduce_sum(x, some_shape) is ambiguous (output
  shape or reduced dimension?), so only `x` may be passed positionally."""
  if disable_positional_args is not None:
    raise ValueError(
        f"{fn_name} takes only x positionally; pass output_shape=... or "
        f"reduced_dim=... by keyword (got {disable_positional_args!r} as a "
        "second positional argument).")


def _reduce(x, output_shape, reduced_dim, fn_string, name):
  output_shape = reduction_output_shape(x, output_shape, reduced_dim)
  if output_shape == x.shape:
    return x
  return ReduceOperation(x, output_shape, fn_string, name=name).outputs[0]


def reduce_sum(x, disable_positional_args=None, output_shape=None,
               reduced_dim=None, name=None):
  """Sum over `reduced_dim` (a Dimension or list), or down to
  `output_shape` (a subsequence of x's dimensions, in any order); with
  neither, over everything. Pass them by keyword.

  Args:
    x: a Tensor.
    disable_positional_args: must stay None (see above).
    output_shape: an optional Shape.
    reduced_dim: an optional Dimension or list of Dimensions.
    name: an optional name.
  """
  _reject_positional("reduce_sum", disable_positional_args)
  return _reduce(x, output_shape, reduced_dim, "SUM", name)


def reduce_mean(x, disable_positional_args=None, output_shape=None,
                reduced_dim=None, name=None):
  """Mean over `reduced_dim` or down to `output_shape` (see reduce_sum).

  Integers follow tf.reduce_mean: the exact integer sum divided by the
  number of entries, truncated towards zero.
  """
  _reject_positional("reduce_mean", disable_positional_args)
  if x.dtype == tf.bool or not (x.dtype.is_floating or x.dtype.is_integer or
                                x.dtype.is_complex):
    raise errors.DTypeError(
        f"{name or 'reduce_mean'}: cannot average {x.name} of dtype "
        f"{x.dtype.name}; cast it to a number type first.")
  output_shape = reduction_output_shape(x, output_shape, reduced_dim)
  total = reduce_sum(x, output_shape=output_shape, name=name)
  count = x.shape.size // max(1, output_shape.size)
  if count == 1:
    return total
  if x.dtype.is_integer:
    return slicewise_ops.cwise(
        lambda t: tf.truncatediv(t, tf.constant(count, t.dtype)),
        [total], name=(name or "reduce_mean") + "_divide")
  return total * (output_shape.size / x.shape.size)


def reduce_max(x, disable_positional_args=None, output_shape=None,
               reduced_dim=None, name=None):
  """Maximum over `reduced_dim` or down to `output_shape` (see reduce_sum)."""
  _reject_positional("reduce_max", disable_positional_args)
  return _reduce(x, output_shape, reduced_dim, "MAX", name)


def reduce_min(x, disable_positional_args=None, output_shape=None,
               reduced_dim=None, name=None):
  """Minimum over `reduced_dim` or down to `output_shape` (see reduce_sum)."""
  _reject_positional("reduce_min", disable_positional_args)
  return _reduce(x, output_shape, reduced_dim, "MIN", name)


def reduce_all(x, disable_positional_args=None, output_shape=None,
               reduced_dim=None, name=None):
  """Logical and over `reduced_dim` or down to `output_shape` (bool x)."""
  _reject_positional("reduce_all", disable_positional_args)
  return _reduce(x, output_shape, reduced_dim, "ALL", name)


def reduce_any(x, disable_positional_args=None, output_shape=None,
               reduced_dim=None, name=None):
  """Logical or over `reduced_dim` or down to `output_shape` (bool x)."""
  _reject_positional("reduce_any", disable_positional_args)
  return _reduce(x, output_shape, reduced_dim, "ANY", name)


class BroadcastOperation(graph_lib.Operation):
  """Broadcasts `x` to `output_shape`, which holds all of x's dimensions
  (in any order)."""

  handles_padding = True

  def __init__(self, x, output_shape, name=None):
    super().__init__([x], name=name or "broadcast")
    output_shape = shape_lib.convert_to_shape(output_shape)
    missing = [d for d in x.shape if d not in output_shape.dims]
    if missing:
      raise errors.ShapeError(
          f"Cannot broadcast {x.name} {x.shape} to {output_shape}: {missing} "
          "are missing from the output shape.")
    self._outputs = [graph_lib.Tensor(self, output_shape, x.dtype)]

  @property
  def padding_stays_zero(self):
    """Only a transpose keeps it zero: x is copied into the padding of a
    new dimension."""
    return comparisons.broadcasts_none(self._inputs, self._outputs[0].shape)

  def gradient(self, grad_ys):
    return [reduce_sum(grad_ys[0], output_shape=self._inputs[0].shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self._inputs[0]
    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.broadcast_impl(lowering.laid_out_tensor(x), x.shape,
                            self._outputs[0].shape))


# Broadcasting slices a split new dimension locally.
cost_rules.register(BroadcastOperation, cost_rules.SLICEWISE)


def broadcast(x, new_shape, name=None):
  new_shape = shape_lib.convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return BroadcastOperation(x, new_shape, name=name).outputs[0]
