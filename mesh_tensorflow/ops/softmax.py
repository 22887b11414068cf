"""Softmax, log-softmax and log-sum-exp over a named dimension.

`softmax` is one operation rather than exp(log_softmax(x)) (eight passes over
the tensor forward and as many back): each processor runs TensorFlow's fused
softmax kernel on its slice, and its gradient y * (dy - sum(y * dy)) is one
operation too. When the softmax dimension is split over the mesh, the max
and the sum are combined across it (two small allreduces forward, one back).
Slices of rank above 5 reach the kernel with their other axes merged
(`slice_utils.softmax`): oneDNN's Softmax kernel takes at most 5.
On an attention model's [batch, heads, length, memory] weights this is the
largest element-wise cost of a training step.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise
from mesh_tensorflow.ops import reduce as reduce_lib


def _check_dim(x, reduced_dim, what):
  reduced_dim = shape_lib.convert_to_dimension(reduced_dim)
  if reduced_dim not in x.shape.dims:
    raise errors.ShapeError(
        f"{what}: {reduced_dim} is not a dimension of {x.name} {x.shape}.")
  return reduced_dim


def _split_axis(impl, dim):
  """The mesh axis `dim` is split over, as a list (empty if local)."""
  axis = impl.tensor_dimension_to_mesh_axis(dim)
  return [] if axis is None else [axis]


def _sum_over(impl, laid_out, axis, mesh_axes):
  """Per slice, the sum over tensor axis `axis` (kept as size 1), combined
  across `mesh_axes`."""
  partial = impl.slicewise(
      lambda s: tf.reduce_sum(s, axis=axis, keepdims=True), laid_out)
  return impl.allreduce(partial, mesh_axes, "SUM") if mesh_axes else partial


class SoftmaxOperation(graph_lib.Operation):
  """softmax(x) over `reduced_dim`, fused per slice.

  Uneven splits: a padded `reduced_dim` is filled with -inf first, so that
  the padding is neither the max nor in the sum (exp(-inf) = 0).
  """

  handles_padding = True

  def __init__(self, x, reduced_dim, name=None):
    super().__init__([x], name=name or "softmax")
    self._reduced_dim = _check_dim(x, reduced_dim, self.name)
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  @property
  def reduced_dim(self):
    return self._reduced_dim

  def gradient(self, grad_ys):
    return [SoftmaxGradOperation(self._outputs[0], grad_ys[0],
                                 self._reduced_dim).outputs[0]]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self._inputs[0]
    axis = x.shape.dims.index(self._reduced_dim)
    mesh_axes = _split_axis(impl, self._reduced_dim)
    x_lowered = lowering.tensors[x]
    if not mesh_axes:
      y = impl.slicewise(lambda s: slice_utils.softmax(s, axis), x_lowered)
    else:
      if any(a.tensor_axis == axis for a in impl.padded_axes(x.shape)):
        x_lowered = impl.fill_padding(
            x_lowered, x.shape, names=[self._reduced_dim.name],
            fill=padding.neutral_value(x.dtype, "MAX"))
      local_max = impl.slicewise(
          lambda s: tf.reduce_max(s, axis=axis, keepdims=True), x_lowered)
      # The max only steadies the exponentials: no gradient flows through
      # it, so it may differ between processors' copies without harm.
      top = impl.allreduce(local_max, mesh_axes, "MAX")
      exp = impl.slicewise(lambda s, m: tf.exp(s - m), x_lowered, top)
      total = _sum_over(impl, exp, axis, mesh_axes)
      y = impl.slicewise(tf.math.divide, exp, total)
    lowering.set_tensor_lowering(self._outputs[0], y)


class SoftmaxGradOperation(graph_lib.Operation):
  """The softmax gradient dx = y * (dy - sum(y * dy)) over `reduced_dim`,
  from the softmax output y and its cotangent dy."""

  # Zero padding in y and dy adds nothing to the sum and gives dx = 0.
  handles_padding = True
  padding_stays_zero = True

  def __init__(self, y, dy, reduced_dim, name=None):
    super().__init__([y, dy], name=name or "softmax_grad")
    if y.shape != dy.shape:
      raise errors.ShapeError(
          f"{self.name}: y {y.shape} and dy {dy.shape} differ in shape.")
    self._reduced_dim = _check_dim(y, reduced_dim, self.name)
    self._outputs = [graph_lib.Tensor(self, y.shape, dy.dtype)]

  @property
  def reduced_dim(self):
    return self._reduced_dim

  def gradient(self, grad_ys):
    # dx = y * dy - y * s with s = sum(y * dy). For a cotangent g of dx:
    #   d/d(dy) = y * (g - sum(g * y)), the same softmax gradient;
    #   d/dy = g * (dy - s) - sum(g * y) * dy.
    g = grad_ys[0]
    y, dy = self._inputs
    reduced = y.shape - [self._reduced_dim]
    s = reduce_lib.reduce_sum(binary.multiply(y, dy), output_shape=reduced)
    t = reduce_lib.reduce_sum(binary.multiply(g, y), output_shape=reduced)
    d_y = binary.sub(binary.multiply(g, binary.sub(dy, s)),
                     binary.multiply(dy, t), output_shape=y.shape)
    d_dy = SoftmaxGradOperation(y, g, self._reduced_dim).outputs[0]
    return [d_y, d_dy]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    y, dy = self._inputs
    axis = y.shape.dims.index(self._reduced_dim)
    mesh_axes = _split_axis(impl, self._reduced_dim)
    y_lowered, dy_lowered = lowering.tensors[y], lowering.tensors[dy]
    product = impl.slicewise(tf.math.multiply, y_lowered, dy_lowered)
    total = _sum_over(impl, product, axis, mesh_axes)
    dx = impl.slicewise(lambda p, s, y_: p - y_ * s, product, total, y_lowered)
    lowering.set_tensor_lowering(self._outputs[0], dx)


class _SoftmaxCost(cost_rules.AlongDimensionCost):
  """Over a split dimension: `allreduces` allreduces of the slices summed
  (or maxed) over it, as the lowerings above do."""

  def __init__(self, allreduces):
    self.allreduces = allreduces

  def dimension(self, info):
    return info.op.reduced_dim

  def attributes(self, info):
    return (info.op.reduced_dim.name, self.allreduces)

  def collectives_along(self, info, layout, mesh_dim):
    nbytes = cost_rules.slice_bytes_without(
        layout, info.in_dims[0], info.op.reduced_dim.name,
        info.in_itemsize[0])
    return [cost_rules.collective(layout, "allreduce", (mesh_dim,), nbytes)
           ] * self.allreduces


# The max and the sum forward; the sum of y * dy back.
cost_rules.register(SoftmaxOperation, _SoftmaxCost(allreduces=2))
cost_rules.register(SoftmaxGradOperation, _SoftmaxCost(allreduces=1))


def log_softmax(x, reduced_dim, extra_logit=None, name=None):
  """x - logsumexp(x) over `reduced_dim` (see reduce_logsumexp)."""
  return binary.sub(x, reduce_logsumexp(x, reduced_dim, extra_logit),
                    output_shape=x.shape, name=name or "log_softmax")


def softmax(x, reduced_dim, extra_logit=None, name=None):
  """exp(x) / sum(exp(x)) over `reduced_dim`.

  With `extra_logit` (one more logit of that value in every sum; a scalar
  or a Tensor of x's other dimensions) it is exp(log_softmax), as in the
  original; without, one fused operation (see the module docstring).
  """
  if extra_logit is not None:
    return elementwise.exp(log_softmax(x, reduced_dim, extra_logit),
                           name=name or "softmax")
  return SoftmaxOperation(x, reduced_dim, name=name).outputs[0]


def reduce_logsumexp(x, reduced_dim, extra_logit=None, name=None):
  """log(sum(exp(x))) over `reduced_dim`, computed stably.

  `extra_logit` (a scalar or a Tensor of the reduced shape) adds one more
  logit to the sum, as if an extra entry of that value were present.
  """
  reduced_shape = reduce_lib.reduction_output_shape(x, None, reduced_dim)
  max_logit = reduce_lib.reduce_max(elementwise.stop_gradient(x),
                                    output_shape=reduced_shape)
  if extra_logit is not None:
    max_logit = binary.maximum(max_logit, extra_logit)
  exp_x = elementwise.exp(binary.sub(x, max_logit, output_shape=x.shape))
  sum_exp = reduce_lib.reduce_sum(exp_x, output_shape=reduced_shape)
  if extra_logit is not None:
    sum_exp += elementwise.exp(binary.sub(extra_logit, max_logit))
  return binary.add(elementwise.log(sum_exp), max_logit,
                    name=name or "reduce_logsumexp")
