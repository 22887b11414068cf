"""Binary operations broadcast by dimension name, and those without gradients.

Operands are matched by dimension *name*, not position. The output shape is
the longer shape when one is a subsequence of the other, else the dimensions
of the first operand followed by the new dimensions of the second (or an
explicit `output_shape`). Python scalars are allowed as either operand.

This module holds what every binary operation shares (`broadcast_shape`,
`binary_arguments_to_tensors`, `BinaryOpWithBroadcasting`) and the
operations that, as in the original, have no gradient: comparisons, logical
and/or, floordiv and mod. The arithmetic ones, whose gradients sum over
broadcast dimensions, are in `binary`.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import cost_rules


def broadcast_shape(shape1, shape2, output_shape=None, context="binary op"):
  """The output shape of a broadcasting binary op (see module docstring)."""
  shape_lib.check_consistent_sizes([shape1, shape2], context)
  if output_shape is not None:
    output_shape = shape_lib.convert_to_shape(output_shape)
    shape_lib.check_consistent_sizes([shape1, shape2, output_shape], context)
    missing = [d.name for d in shape1.dims + shape2.dims
               if d.name not in output_shape.dimension_names]
    if missing:
      raise errors.ShapeError(
          f"{context}: output shape {output_shape} lacks input dimensions "
          f"{sorted(set(missing))}; reduce them explicitly first.")
    return output_shape
  if shape_lib.is_subsequence(shape1.dims, shape2.dims):
    return shape2
  if shape_lib.is_subsequence(shape2.dims, shape1.dims):
    return shape1
  return shape_lib.Shape(
      shape1.dims + [d for d in shape2.dims if d not in shape1.dims])


def broadcasts_none(operands, output_shape):
  """Whether every operand has every dimension of `output_shape`.

  Then an element-wise op with f(0, ..., 0) = 0 keeps its output's padding
  zero (uneven splits): an operand broadcast along a padded dimension
  would fill that dimension's padding with its own values.
  """
  names = set(output_shape.dimension_names)
  return all(names <= set(x.shape.dimension_names) for x in operands)


def require_a_tensor(x1, x2):
  """Raises TypeError unless x1 or x2 is an mtf Tensor."""
  if not isinstance(x1, graph_lib.Tensor) and not isinstance(
      x2, graph_lib.Tensor):
    raise TypeError(f"At least one operand must be an mtf Tensor, got {x1!r} "
                    f"and {x2!r}.")


def binary_arguments_to_tensors(x1, x2):
  """Converts a Python/NumPy scalar operand into a 0-d mtf Tensor."""
  require_a_tensor(x1, x2)
  if not isinstance(x1, graph_lib.Tensor):
    x1 = constants.constant(x2.mesh, x1, shape_lib.Shape([]), dtype=x2.dtype)
  elif not isinstance(x2, graph_lib.Tensor):
    x2 = constants.constant(x1.mesh, x2, shape_lib.Shape([]), dtype=x1.dtype)
  if x1.dtype != x2.dtype:
    raise errors.DTypeError(
        f"Operands must have the same dtype, got {x1.dtype.name} "
        f"({x1.name}) and {x2.dtype.name} ({x2.name}).")
  return x1, x2


class BinaryOpWithBroadcasting(graph_lib.Operation):
  """Applies `tf_fn` to two slices lined up by dimension name.

  As in the original it has no gradient (comparisons, floordiv, mod, ...);
  the subclasses below that have one override `gradient`.

  Args:
    tf_fn: fn(tf.Tensor, tf.Tensor) -> tf.Tensor, element-wise.
    x1, x2: mtf Tensors of the same dtype.
    output_shape: the output Shape (default: see `broadcast_shape`).
    output_dtype: the output dtype (default: that of x1).
    name: an optional name.
  """

  handles_padding = True

  def __init__(self, tf_fn, x1, x2, output_shape=None, output_dtype=None,
               name=None):
    super().__init__([x1, x2], name=name or "binary_op")
    if x1.dtype != x2.dtype:
      raise errors.DTypeError(
          f"{self.name}: operands must have the same dtype, got "
          f"{x1.dtype.name} ({x1.name}) and {x2.dtype.name} ({x2.name}).")
    self._tf_fn = tf_fn
    shape = broadcast_shape(x1.shape, x2.shape, output_shape, self.name)
    self._outputs = [graph_lib.Tensor(self, shape, output_dtype or x1.dtype)]

  @property
  def has_gradient(self):
    return False

  def gradient(self, unused_grad_ys):
    return [None, None]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x1, x2 = self._inputs
    out_shape = self._outputs[0].shape
    out_slice_shape = impl.slice_shape(out_shape)

    def fn(a, b):
      y = slice_utils.broadcasting(
          self._tf_fn, slice_utils.broadcastable(
              [slice_utils.expand_to(a, x1.shape, out_shape),
               slice_utils.expand_to(b, x2.shape, out_shape)]))
      if slice_utils.static_shape(y) != out_slice_shape:
        y = slice_utils.broadcast_to(y, out_slice_shape)
      return y

    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.slicewise(fn, lowering.tensors[x1], lowering.tensors[x2]))


cost_rules.register(BinaryOpWithBroadcasting, cost_rules.SLICEWISE)


def binary_op_with_broadcasting(tf_fn, x1, x2, output_shape=None,
                                output_dtype=None):
  """`tf_fn` of x1 and x2 (Tensors or scalars), broadcast by dimension name;
  no gradient."""
  x1, x2 = binary_arguments_to_tensors(x1, x2)
  return BinaryOpWithBroadcasting(tf_fn, x1, x2, output_shape=output_shape,
                                  output_dtype=output_dtype).outputs[0]


def _no_grad_binary(tf_fn, default_name, output_dtype=None):
  def op(x1, x2, output_shape=None, name=None):
    x1, x2 = binary_arguments_to_tensors(x1, x2)
    return BinaryOpWithBroadcasting(
        tf_fn, x1, x2, output_shape=output_shape, output_dtype=output_dtype,
        name=name or default_name).outputs[0]
  op.__name__ = default_name
  op.__doc__ = f"Element-wise {default_name} with broadcasting (no gradient)."
  return op


less = _no_grad_binary(tf.less, "less", tf.bool)
greater = _no_grad_binary(tf.greater, "greater", tf.bool)
less_equal = _no_grad_binary(tf.less_equal, "less_equal", tf.bool)
greater_equal = _no_grad_binary(tf.greater_equal, "greater_equal", tf.bool)
equal = _no_grad_binary(tf.equal, "equal", tf.bool)
not_equal = _no_grad_binary(tf.not_equal, "not_equal", tf.bool)
logical_and = _no_grad_binary(tf.logical_and, "logical_and", tf.bool)
logical_or = _no_grad_binary(tf.logical_or, "logical_or", tf.bool)
floordiv = _no_grad_binary(tf.math.floordiv, "floordiv")
mod = _no_grad_binary(tf.math.floormod, "mod")
