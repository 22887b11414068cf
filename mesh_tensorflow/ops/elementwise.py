"""Element-wise unary operations.

Each is a `cwise` of a TF function with a hand-written gradient (none for
`sign` and `logical_not`). Gradients use TensorFlow's own gradient kernels
(ReluGrad, EluGrad, ...) on each slice, so that a one-processor mesh runs the
same kernels as plain TensorFlow.
"""

import math

import tensorflow as tf

from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import slicewise_ops


def _unary(tf_fn, x, name, grad_tf_fn=None, grad_uses_output=False,
           keeps_zero=False, grad_keeps_zero=True):
  """An element-wise op whose gradient is `grad_tf_fn(x_or_y, dy)` per slice.

  `keeps_zero`: f(0) = 0, so zero padding (uneven splits) stays zero. The
  gradient dy * f'(x or y) keeps it too (dy's padding is zero) wherever f'
  is finite at 0; `grad_keeps_zero=False` where it is not (log, sqrt).
  """
  if grad_tf_fn is None:
    return slicewise_ops.cwise(tf_fn, [x], name=name, keeps_zero=keeps_zero)

  def grad_function(op, dy):
    source = op.outputs[0] if grad_uses_output else op.inputs[0]
    return [slicewise_ops.cwise(grad_tf_fn, [source, dy],
                                name=name + "_grad",
                                keeps_zero=grad_keeps_zero)]

  return slicewise_ops.cwise(tf_fn, [x], grad_function=grad_function,
                             name=name, keeps_zero=keeps_zero)


def _unary_of_output(tf_fn, x, name, grad_kernel, **kwargs):
  """An element-wise op whose gradient is TF's kernel `grad_kernel(y=, dy=)`
  of its output y (kwargs: _unary's)."""
  return _unary(tf_fn, x, name, lambda y, dy: grad_kernel(y=y, dy=dy),
                grad_uses_output=True, **kwargs)


def _unary_of_activation(tf_fn, x, name, grad_kernel):
  """An element-wise op with f(0) = 0 whose gradient is TF's kernel
  `grad_kernel(gradients=, outputs=)` of its output."""
  return _unary(tf_fn, x, name,
                lambda y, dy: grad_kernel(gradients=dy, outputs=y),
                grad_uses_output=True, keeps_zero=True)


def identity(x, name="identity"):
  return slicewise_ops.cwise(tf.identity, [x], name=name,
                             grad_function=lambda op, dy: [dy],
                             keeps_zero=True)


def negative(x, name="negative"):
  return slicewise_ops.cwise(tf.negative, [x], name=name,
                             grad_function=lambda op, dy: [negative(dy)],
                             keeps_zero=True)


def relu(x, name="relu"):
  return _unary(tf.nn.relu, x, name,
                lambda x, dy: tf.raw_ops.ReluGrad(gradients=dy, features=x),
                keeps_zero=True)


def exp(x, name="exp"):
  return _unary(tf.exp, x, name, lambda y, dy: dy * y, grad_uses_output=True)


def log(x, name="log"):
  return _unary(tf.math.log, x, name, lambda x, dy: dy / x,
                grad_keeps_zero=False)


def sqrt(x, name="sqrt"):
  return _unary_of_output(tf.sqrt, x, name, tf.raw_ops.SqrtGrad,
                          keeps_zero=True, grad_keeps_zero=False)


def rsqrt(x, name="rsqrt"):
  return _unary_of_output(tf.math.rsqrt, x, name, tf.raw_ops.RsqrtGrad)


def square(x, name="square"):
  return _unary(tf.square, x, name, lambda x, dy: dy * (2 * x),
                keeps_zero=True)


def sigmoid(x, name="sigmoid"):
  return _unary_of_output(tf.sigmoid, x, name, tf.raw_ops.SigmoidGrad)


def tanh(x, name="tanh"):
  return _unary_of_output(tf.tanh, x, name, tf.raw_ops.TanhGrad,
                          keeps_zero=True)


def reciprocal(x, name="reciprocal"):
  return _unary_of_output(tf.math.reciprocal, x, name,
                          tf.raw_ops.ReciprocalGrad)


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_grad(x, dy):
  """Derivative of the tanh approximation of GELU."""
  inner = _GELU_C * (x + 0.044715 * x * x * x)
  t = tf.tanh(inner)
  d_inner = _GELU_C * (1.0 + 3.0 * 0.044715 * x * x)
  return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)


def gelu(x, name="gelu"):
  """Gaussian Error Linear Unit, tanh approximation (as in the original)."""
  return _unary(lambda x: tf.nn.gelu(x, approximate=True), x, name,
                _gelu_grad, keeps_zero=True)


def cast(x, dtype, name="cast"):
  """Casts to `dtype`; the gradient is cast back (float to float only)."""
  dtype = tf.as_dtype(dtype)
  if x.dtype == dtype:
    return x

  def grad_function(op, dy):
    if not op.inputs[0].dtype.is_floating:
      return [None]
    return [cast(dy, op.inputs[0].dtype)]

  return slicewise_ops.cwise(lambda t: tf.cast(t, dtype), [x],
                             output_dtype=dtype, grad_function=grad_function,
                             name=name, keeps_zero=True)


class StopGradient(graph_lib.Operation):
  """Like tf.stop_gradient: the identity, and mtf.gradients stops here.

  It lowers to its input's slices as they are (a pending allreduce stays
  pending), with no TF op of its own.
  """

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, name=None):
    super().__init__([x], mesh=x.mesh, name=name or "stop_gradient")
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    lowering.set_tensor_lowering(self._outputs[0],
                                 lowering.tensors[self._inputs[0]])


cost_rules.register(StopGradient, cost_rules.PassThroughCost())


def stop_gradient(x, name="stop_gradient"):
  """Identity whose gradient is zero (None)."""
  return StopGradient(x, name=name).outputs[0]


def logical_not(x, name="logical_not"):
  return slicewise_ops.cwise(tf.logical_not, [x], name=name)


def to_float(x, name="to_float"):
  return cast(x, tf.float32, name=name)


def to_int32(x, name="to_int32"):
  return cast(x, tf.int32, name=name)


def to_bfloat16(x, name="to_bfloat16"):
  return cast(x, tf.bfloat16, name=name)


def sin(x, name="sin"):
  return _unary(tf.sin, x, name, lambda x, dy: dy * tf.cos(x),
                keeps_zero=True)


def cos(x, name="cos"):
  return _unary(tf.cos, x, name, lambda x, dy: -dy * tf.sin(x))


def elu(x, name="elu"):
  return _unary_of_activation(tf.nn.elu, x, name, tf.raw_ops.EluGrad)


def selu(x, name="selu"):
  return _unary_of_activation(tf.nn.selu, x, name, tf.raw_ops.SeluGrad)


def softplus(x, name="softplus"):
  return _unary(
      tf.nn.softplus, x, name,
      lambda x, dy: tf.raw_ops.SoftplusGrad(gradients=dy, features=x))


def _swish_grad(x, dy):
  s = tf.sigmoid(x)
  return dy * (s * (1.0 + x * (1.0 - s)))


def swish(x, name="swish"):
  """x * sigmoid(x) (https://arxiv.org/abs/1710.05941), also called SiLU."""
  return _unary(tf.nn.silu, x, name, _swish_grad, keeps_zero=True)


def leaky_relu(x, alpha=0.2, name="leaky_relu"):
  """x where x > 0, else alpha * x."""
  return _unary(
      lambda t: tf.nn.leaky_relu(t, alpha=alpha), x, name,
      lambda x, dy: tf.raw_ops.LeakyReluGrad(gradients=dy, features=x,
                                             alpha=alpha), keeps_zero=True)


def sign(x, name="sign"):
  """-1, 0 or 1 by the sign of x; its gradient is zero (None)."""
  return slicewise_ops.cwise(tf.sign, [x], name=name,
                             grad_function=lambda op, dy: [None],
                             keeps_zero=True)


def mtf_abs(x, name="abs"):
  """|x|; the gradient is sign(x) * dy (0 at x = 0, as in TensorFlow).

  Call it as `mtf.abs` too.
  """
  return _unary(tf.abs, x, name, lambda x, dy: dy * tf.sign(x),
                keeps_zero=True)
