"""Arithmetic binary operations with broadcasting by dimension name.

add, sub, multiply, divide, minimum, maximum, pow, where and add_n. They
broadcast as every binary operation does (see `comparisons`), and their
gradients sum over the dimensions an operand was broadcast along.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import elementwise
from mesh_tensorflow.ops import reduce as reduce_lib
from mesh_tensorflow.ops import slicewise_ops


def reduce_to_shape(dy, shape):
  """Sums a broadcast gradient back to an operand's shape."""
  if dy.shape == shape:
    return dy
  return reduce_lib.reduce_sum(dy, output_shape=shape)


class _BinaryOpWithGradFunction(comparisons.BinaryOpWithBroadcasting):
  """A BinaryOpWithBroadcasting whose gradient is grad_function(op, dy)."""

  def __init__(self, tf_fn, x1, x2, grad_function, output_shape=None,
               name=None):
    super().__init__(tf_fn, x1, x2, output_shape=output_shape, name=name)
    self._grad_function = grad_function

  has_gradient = graph_lib.Operation.has_gradient

  def gradient(self, grad_ys):
    return self._grad_function(self, grad_ys[0])


class AddOperation(comparisons.BinaryOpWithBroadcasting):
  """x1 + x2 (or x1 - x2 with `subtract`); keeps pending allreduces pending
  when it can."""

  def __init__(self, x1, x2, output_shape=None, name=None, subtract=False):
    self._subtract = subtract
    super().__init__(tf.subtract if subtract else tf.add, x1, x2,
                     output_shape=output_shape,
                     name=name or ("sub" if subtract else "add"))

  has_gradient = graph_lib.Operation.has_gradient

  @property
  def padding_stays_zero(self):
    """0 + 0 = 0, unless an operand is broadcast (see broadcasts_none)."""
    return comparisons.broadcasts_none(self._inputs, self._outputs[0].shape)

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    x1, x2 = self._inputs
    g2 = reduce_to_shape(dy, x2.shape)
    return [reduce_to_shape(dy, x1.shape),
            elementwise.negative(g2) if self._subtract else g2]

  def lower(self, lowering):
    x1, x2 = self._inputs
    out = self._outputs[0]
    if x1.shape == x2.shape == out.shape:
      impl = lowering.mesh_impl(self)
      lowering.set_tensor_lowering(out, impl.slicewise_delay_allreduce(
          self._tf_fn, lowering.tensors[x1], lowering.tensors[x2]))
    else:
      super().lower(lowering)


class MinMaxOperation(comparisons.BinaryOpWithBroadcasting):
  """minimum or maximum (`tf_fn`) with broadcasting.

  The gradient goes to the operand that was chosen, to x1 on ties (as
  TensorFlow's Minimum/Maximum gradients do).
  """

  def __init__(self, tf_fn, x1, x2, output_shape=None, name=None):
    super().__init__(tf_fn, x1, x2, output_shape=output_shape,
                     name=name or "min_max")

  has_gradient = graph_lib.Operation.has_gradient

  @property
  def padding_stays_zero(self):
    """max(0, 0) = 0, unless an operand is broadcast (a scalar, say)."""
    return comparisons.broadcasts_none(self._inputs, self._outputs[0].shape)

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    x1, x2 = self._inputs
    y = self._outputs[0]
    first = elementwise.cast(
        comparisons.equal(x1, y, output_shape=y.shape), dy.dtype)
    return [reduce_to_shape(dy * first, x1.shape),
            reduce_to_shape(dy - dy * first, x2.shape)]


class ScalarMultiplyOperation(graph_lib.Operation):
  """x * scalar, for a Python/NumPy scalar (no gradient to the scalar)."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, scalar, name=None):
    super().__init__([x], name=name or "scalar_mul")
    self._scalar = scalar
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  @property
  def scalar(self):
    return self._scalar

  def gradient(self, grad_ys):
    return [grad_ys[0] * self._scalar]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dtype = self._outputs[0].dtype
    scalar = tf.constant(self._scalar, dtype=dtype) if dtype != tf.bool else (
        self._scalar)
    lowering.set_tensor_lowering(self._outputs[0],
                                 impl.slicewise_delay_allreduce(
                                     lambda x: x * scalar,
                                     lowering.tensors[self._inputs[0]]))


cost_rules.register(ScalarMultiplyOperation, cost_rules.LinearCost())


class ScalarAddOperation(graph_lib.Operation):
  """x + scalar, for a Python/NumPy scalar."""

  handles_padding = True

  def __init__(self, x, scalar, name=None):
    super().__init__([x], name=name or "scalar_add")
    self._scalar = scalar
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [grad_ys[0]]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    scalar = tf.constant(self._scalar, dtype=self._outputs[0].dtype)
    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.slicewise(lambda x: x + scalar,
                       lowering.tensors[self._inputs[0]]))


cost_rules.register(ScalarAddOperation, cost_rules.SLICEWISE)


def _is_scalar(x):
  return not isinstance(x, graph_lib.Tensor)


def _tensor_and_scalar(x1, x2, output_shape):
  """(the Tensor, the scalar) of a commutative op's operands when one is a
  Python scalar and no output shape is asked for, else None."""
  comparisons.require_a_tensor(x1, x2)
  if output_shape is None and _is_scalar(x2):
    return x1, x2
  if output_shape is None and _is_scalar(x1):
    return x2, x1
  return None


def add(x1, x2, output_shape=None, name=None):
  """x1 + x2 with broadcasting."""
  with_scalar = _tensor_and_scalar(x1, x2, output_shape)
  if with_scalar:
    return ScalarAddOperation(*with_scalar, name=name).outputs[0]
  x1, x2 = comparisons.binary_arguments_to_tensors(x1, x2)
  return AddOperation(x1, x2, output_shape=output_shape, name=name).outputs[0]


def sub(x1, x2, output_shape=None, name=None):
  """x1 - x2 with broadcasting."""
  comparisons.require_a_tensor(x1, x2)
  if _is_scalar(x2) and output_shape is None:
    return ScalarAddOperation(x1, -x2, name=name or "sub").outputs[0]
  if _is_scalar(x1) and output_shape is None:
    return ScalarAddOperation(elementwise.negative(x2), x1,
                              name=name or "sub").outputs[0]
  x1, x2 = comparisons.binary_arguments_to_tensors(x1, x2)
  return AddOperation(x1, x2, output_shape=output_shape, name=name,
                      subtract=True).outputs[0]


def multiply(x1, x2, output_shape=None, name=None):
  """x1 * x2 with broadcasting (an einsum that reduces nothing)."""
  with_scalar = _tensor_and_scalar(x1, x2, output_shape)
  if with_scalar:
    return ScalarMultiplyOperation(*with_scalar, name=name).outputs[0]
  x1, x2 = comparisons.binary_arguments_to_tensors(x1, x2)
  output_shape = comparisons.broadcast_shape(x1.shape, x2.shape,
                                             output_shape, "multiply")
  return contractions.einsum([x1, x2], output_shape=output_shape,
                           name=name or "multiply")


def _divide_grad(op, dy):
  x1, x2 = op.inputs
  y = op.outputs[0]
  return [reduce_to_shape(divide(dy, x2, output_shape=y.shape), x1.shape),
          reduce_to_shape(elementwise.negative(dy * y / x2), x2.shape)]


def divide(x1, x2, output_shape=None, name=None):
  """x1 / x2 with broadcasting."""
  comparisons.require_a_tensor(x1, x2)
  if _is_scalar(x2) and output_shape is None and x1.dtype.is_floating:
    return ScalarMultiplyOperation(x1, 1.0 / x2,
                                   name=name or "divide").outputs[0]
  x1, x2 = comparisons.binary_arguments_to_tensors(x1, x2)
  if not x1.dtype.is_floating:
    raise errors.DTypeError(
        f"divide needs floating-point operands, got {x1.dtype.name} "
        f"({x1.name}); use floordiv for integers.")
  return _BinaryOpWithGradFunction(
      tf.math.truediv, x1, x2, _divide_grad, output_shape=output_shape,
      name=name or "divide").outputs[0]


def minimum(x1, x2, output_shape=None, name=None):
  """Element-wise minimum with broadcasting."""
  x1, x2 = comparisons.binary_arguments_to_tensors(x1, x2)
  return MinMaxOperation(tf.minimum, x1, x2, output_shape=output_shape,
                         name=name or "minimum").outputs[0]


def maximum(x1, x2, output_shape=None, name=None):
  """Element-wise maximum with broadcasting."""
  x1, x2 = comparisons.binary_arguments_to_tensors(x1, x2)
  return MinMaxOperation(tf.maximum, x1, x2, output_shape=output_shape,
                         name=name or "maximum").outputs[0]


class WhereOperation(graph_lib.Operation):
  """Element-wise choice between if_true and if_false by a bool condition."""

  handles_padding = True

  def __init__(self, condition, if_true, if_false, output_shape=None,
               name=None):
    super().__init__([condition, if_true, if_false], name=name or "where")
    if condition.dtype != tf.bool:
      raise errors.DTypeError(
          f"where: condition {condition.name} must be bool, got "
          f"{condition.dtype.name}.")
    if if_true.dtype != if_false.dtype:
      raise errors.DTypeError(
          f"where: if_true and if_false must have the same dtype, got "
          f"{if_true.dtype.name} and {if_false.dtype.name}.")
    shape = comparisons.broadcast_shape(
        comparisons.broadcast_shape(condition.shape, if_true.shape,
                                    context="where"),
        if_false.shape, output_shape, "where")
    self._outputs = [graph_lib.Tensor(self, shape, if_true.dtype)]

  @property
  def padding_stays_zero(self):
    """Either branch's padding is zero, unless a branch is broadcast."""
    return comparisons.broadcasts_none(self._inputs[1:],
                                       self._outputs[0].shape)

  def gradient(self, grad_ys):
    condition, x, y = self._inputs
    dy = grad_ys[0]
    zeros = constants.zeros_like(dy)
    return [None,
            reduce_to_shape(where(condition, dy, zeros, output_shape=dy.shape),
                            x.shape),
            reduce_to_shape(where(condition, zeros, dy, output_shape=dy.shape),
                            y.shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out_shape = self._outputs[0].shape
    out_slice_shape = impl.slice_shape(out_shape)
    shapes = [t.shape for t in self._inputs]

    def fn(c, a, b):
      c, a, b = [slice_utils.broadcast_to(
                     slice_utils.expand_to(t, s, out_shape), out_slice_shape)
                 for t, s in zip((c, a, b), shapes)]
      return slice_utils.elementwise(tf.where, c, a, b)

    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.slicewise(fn, *[lowering.tensors[t] for t in self._inputs]))


cost_rules.register(WhereOperation, cost_rules.SLICEWISE)


def where(condition, if_true, if_false, output_shape=None, name=None):
  """if_true where `condition` is true, else if_false (either may be a
  scalar), broadcast by dimension name.

  Unlike the original (if_true * cond + if_false * !cond), values in the
  branch not taken never leak in, so an inf or NaN there is harmless.
  """
  if _is_scalar(if_true) and _is_scalar(if_false):
    raise TypeError("where: at least one of if_true and if_false must be an "
                    "mtf Tensor.")
  if_true, if_false = comparisons.binary_arguments_to_tensors(if_true, if_false)
  return WhereOperation(condition, if_true, if_false,
                        output_shape=output_shape, name=name).outputs[0]


class AddNOperation(graph_lib.Operation):
  """The sum of several tensors, broadcast by dimension name."""

  handles_padding = True

  def __init__(self, xs, output_shape=None, name=None):
    super().__init__(xs, name=name or "add_n")
    dtypes = {x.dtype for x in xs}
    if len(dtypes) != 1:
      raise errors.DTypeError(
          f"{self.name}: operands must have the same dtype, got "
          f"{', '.join(f'{x.dtype.name} ({x.name})' for x in xs)}.")
    shape = xs[0].shape
    for x in xs[1:]:
      shape = comparisons.broadcast_shape(shape, x.shape, context=self.name)
    if output_shape is not None:
      shape = comparisons.broadcast_shape(shape, shape, output_shape, self.name)
    self._outputs = [graph_lib.Tensor(self, shape, xs[0].dtype)]

  @property
  def padding_stays_zero(self):
    """A sum of zeros, unless an operand is broadcast."""
    return comparisons.broadcasts_none(self._inputs, self._outputs[0].shape)

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    return [reduce_to_shape(dy, x.shape) for x in self._inputs]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out_shape = self._outputs[0].shape
    inputs = [lowering.tensors[x] for x in self._inputs]
    if all(x.shape == out_shape for x in self._inputs):
      # A sum is linear: lazy partial sums over the same mesh dimensions
      # stay lazy, and share one allreduce later.
      y = impl.slicewise_delay_allreduce(lambda *s: tf.add_n(list(s)),
                                         *inputs)
    else:
      out_slice_shape = impl.slice_shape(out_shape)
      shapes = [x.shape for x in self._inputs]

      def fn(*slices):
        return tf.add_n([
            slice_utils.broadcast_to(
                slice_utils.expand_to(s, shape, out_shape), out_slice_shape)
            for s, shape in zip(slices, shapes)])

      y = impl.slicewise(fn, *inputs)
    lowering.set_tensor_lowering(self._outputs[0], y)


@cost_rules.rule_for(AddOperation, AddNOperation)
class _AddCost(cost_rules.LinearCost):
  """add and add_n delay the allreduces only when every operand has the
  output's shape (see their lower)."""

  def applies(self, info):
    return all(d == info.out_dims[0] for d in info.in_dims)


def add_n(xs, output_shape=None, name=None):
  """The sum of a list of Tensors, with broadcasting by dimension name.

  The output shape is built as for `add`, operand by operand, unless
  `output_shape` is given. Python scalars in the list are added at the end.
  One Tensor is returned as it is; an empty list gives 0, as in the original.
  If every operand is a pending partial sum over the same mesh dimensions
  (see `LazyAllreduceSum`), the result stays pending: one allreduce instead
  of one per operand.
  """
  xs = list(xs)
  tensors = [x for x in xs if isinstance(x, graph_lib.Tensor)]
  scalars = [x for x in xs if not isinstance(x, graph_lib.Tensor)]
  if not tensors:
    return sum(scalars)
  if len(tensors) == 1 and output_shape is None:
    total = tensors[0]
  else:
    total = AddNOperation(tensors, output_shape=output_shape,
                          name=name).outputs[0]
  if scalars:
    total = add(total, sum(scalars))
  return total


def _pow_grad(op, dy):
  """d(x^y)/dx = y x^(y-1); d(x^y)/dy = x^y log(x), taken as 0 where x <= 0
  (as TensorFlow's Pow gradient does)."""
  x, y = op.inputs
  z = op.outputs[0]
  out = z.shape
  dz_dx = comparisons.BinaryOpWithBroadcasting(
      lambda a, b: b * tf.pow(a, b - 1), x, y, output_shape=out,
      name=op.name + "_dx").outputs[0]

  def log_term(a, c):
    positive = a > 0
    return tf.where(positive, c * tf.math.log(tf.where(positive, a,
                                                       tf.ones_like(a))),
                    tf.zeros_like(c))

  dz_dy = comparisons.BinaryOpWithBroadcasting(
      log_term, x, z, output_shape=out, name=op.name + "_dy").outputs[0]
  return [reduce_to_shape(dy * dz_dx, x.shape),
          reduce_to_shape(dy * dz_dy, y.shape)]


def mtf_pow(x, y, output_shape=None, name=None):
  """x ** y element-wise, with broadcasting by dimension name.

  `x` is a Tensor; `y` a Tensor or a Python scalar. Unlike the original
  (exp(log(x) * y), which needs x > 0), this is `tf.pow`, so negative bases
  with integer exponents work, and both operands get gradients. Call it as
  `mtf.pow` too.
  """
  if not isinstance(x, graph_lib.Tensor):
    raise TypeError(f"mtf_pow: the base must be an mtf Tensor, got {x!r}.")
  if not x.dtype.is_floating:
    raise errors.DTypeError(f"mtf_pow needs a floating-point base, got "
                            f"{x.dtype.name} ({x.name}).")
  if _is_scalar(y) and output_shape is None:
    exponent = float(y)

    def grad_function(op, dy):
      return [slicewise_ops.cwise(
          lambda a, d: d * (exponent * tf.pow(a, exponent - 1.0)),
          [op.inputs[0], dy], name=op.name + "_grad")]

    return slicewise_ops.cwise(lambda a: tf.pow(a, exponent), [x],
                               grad_function=grad_function,
                               name=name or "pow")
  x, y = comparisons.binary_arguments_to_tensors(x, y)
  return _BinaryOpWithGradFunction(tf.pow, x, y, _pow_grad,
                                   output_shape=output_shape,
                                   name=name or "pow").outputs[0]
