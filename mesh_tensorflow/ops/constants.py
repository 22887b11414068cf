"""Getting values into the mtf graph: imports, constants and ranges."""

import numpy as np
import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import reshapes


class ImportOperation(graph_lib.Operation):
  """Lays out a full tf.Tensor on the mesh."""

  handles_padding = True
  padding_stays_zero = True  # import_tf_tensor pads with zeros

  def __init__(self, mesh, tf_tensor, shape, name=None):
    super().__init__([], mesh=mesh, name=name or "import")
    tf_tensor = tf.convert_to_tensor(tf_tensor)
    shape = shape_lib.convert_to_shape(shape)
    static = tf_tensor.shape
    if static.rank is not None and (
        static.rank != shape.ndims or
        any(s is not None and s != d.size
            for s, d in zip(static.as_list(), shape))):
      raise errors.ShapeError(
          f"import {self.name!r}: the tf.Tensor has shape {static.as_list()} "
          f"but the mtf shape {shape} needs {shape.to_integer_list}.")
    if not static.is_fully_defined():
      # Slices need static shapes; this also checks the runtime shape.
      tf_tensor = tf.ensure_shape(tf_tensor, shape.to_integer_list)
    self._tf_tensor = tf_tensor
    self._outputs = [graph_lib.Tensor(self, shape, tf_tensor.dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.import_tf_tensor(self._outputs[0], self._tf_tensor))


cost_rules.register(ImportOperation, cost_rules.NO_WORK)


def import_tf_tensor(mesh, tf_tensor, shape=None, name=None):
  """Imports a tf.Tensor (its full value) with the mtf `shape`."""
  if shape is None:
    tf_tensor = tf.convert_to_tensor(tf_tensor)
    shape = [(f"dim{i}", s)
             for i, s in enumerate(slice_utils.static_shape(tf_tensor))]
  return ImportOperation(mesh, tf_tensor, shape, name=name).outputs[0]


def import_fully_replicated(mesh, tf_tensor, shape, name=None):
  """Imports a tf.Tensor that every processor holds in full.

  It is imported with anonymous (never split) dimensions and then reshaped,
  which keeps only each processor's block without communicating.
  """
  shape = shape_lib.convert_to_shape(shape)
  return reshapes.reshape(
      import_tf_tensor(mesh, tf_tensor, shape_lib.anonymous_shape(shape),
                       name=name), shape)


class ImportLaidOutTensorOperation(graph_lib.Operation):
  """Uses slices that the caller already laid out for the mesh.

  The slices are checked against the layout when the graph is lowered,
  before any TF op is created.
  """

  handles_padding = True

  def __init__(self, mesh, laid_out_tensor, shape, name=None):
    super().__init__([], mesh=mesh, name=name or "import_laid_out_tensor")
    if not hasattr(laid_out_tensor, "tensor_list"):
      raise TypeError(
          f"import_laid_out_tensor {self.name!r}: expected an "
          f"mtf.LaidOutTensor (the slices of each processor), got "
          f"{laid_out_tensor!r}; use mtf.import_tf_tensor for a full "
          "tf.Tensor.")
    shape = shape_lib.convert_to_shape(shape)
    slices = list(laid_out_tensor.tensor_list)
    if not slices:
      raise ValueError(
          f"import_laid_out_tensor {self.name!r}: the LaidOutTensor holds no "
          "slices.")
    dtype = slices[0].dtype
    for i, s in enumerate(slices):
      if s.dtype != dtype:
        raise TypeError(
            f"import_laid_out_tensor {self.name!r}: slice {i} has dtype "
            f"{s.dtype.name} but slice 0 has {dtype.name}.")
      if isinstance(s.shape, tf.TensorShape) and (
          not s.shape.is_fully_defined() or s.shape.rank != shape.ndims):
        raise errors.ShapeError(
            f"import_laid_out_tensor {self.name!r}: slice {i} has shape "
            f"{s.shape}, which is not a static shape of rank {shape.ndims} "
            f"as {shape} needs.")
    self._laid_out_tensor = laid_out_tensor
    self._outputs = [graph_lib.Tensor(self, shape, dtype)]
    # As in the original, every dimension counts as unsplittable for
    # automatic layout: the caller's slices already fix the layout.
    self._initialize_splittable_and_unsplittable_dims("unsplittable")

  def check_splits(self, lowering):
    """Checks the slices against the layout (called before lowering).

    Any layout is accepted as long as the slices fit it, so the base
    class's refusal of unsplittable dimensions does not apply.
    """
    impl = lowering.mesh_impl(self)
    shape = self._outputs[0].shape
    slices = self._laid_out_tensor.tensor_list
    expected = len(impl.laid_out_pnum().tensor_list)
    if len(slices) != expected:
      raise errors.LayoutError(
          f"import_laid_out_tensor {self.name!r}: got {len(slices)} slices, "
          f"but {impl!r} holds {expected} per program (one per processor "
          "for PlacementMeshImpl, one for SIMD).")
    want = impl.slice_shape(shape)
    for i, s in enumerate(slices):
      got = slice_utils.static_shape(tf.TensorShape(s.shape))
      if got != list(want):
        raise errors.LayoutError(
            f"import_laid_out_tensor {self.name!r}: slice {i} has shape "
            f"{got}, but {shape} laid out by {impl!r} has "
            f"slices of shape {want}.")

  def lower(self, lowering):
    lowering.set_tensor_lowering(self._outputs[0], self._laid_out_tensor)


cost_rules.register(ImportLaidOutTensorOperation, cost_rules.NO_WORK)


def import_laid_out_tensor(mesh, laid_out_tensor, shape, name=None):
  """Imports data that is already laid out (an expert's path, e.g. infeed).

  Args:
    mesh: an mtf.Mesh.
    laid_out_tensor: an mtf.LaidOutTensor made for the mesh implementation
      that will lower the graph: with PlacementMeshImpl, one slice per
      processor in pnum order, each of the slice shape that the layout gives
      `shape` (see `MeshImpl.slice_shape` and `MeshImpl.slice_begin`).
    shape: the mtf Shape of the whole tensor.
    name: optional name of the operation.

  Returns:
    a Tensor of `shape` with the dtype of the slices.
  """
  return ImportLaidOutTensorOperation(mesh, laid_out_tensor, shape,
                                      name=name).outputs[0]


class Constant(graph_lib.Operation):
  """A constant: a scalar broadcast to `shape`, or a full NumPy array."""

  handles_padding = True

  def __init__(self, mesh, value, shape, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "constant")
    shape = shape_lib.convert_to_shape(shape)
    self._value = np.asarray(value, dtype=tf.as_dtype(dtype).as_numpy_dtype)
    if self._value.ndim and list(self._value.shape) != shape.to_integer_list:
      raise errors.ShapeError(
          f"constant {self.name!r}: value of shape {list(self._value.shape)} "
          f"does not match {shape}.")
    self._outputs = [graph_lib.Tensor(self, shape, tf.as_dtype(dtype))]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    shape = self._outputs[0].shape
    dtype = self._outputs[0].dtype
    slice_shape = impl.slice_shape(shape)
    if self._value.ndim == 0:
      value = self._value
      # No per-processor argument: every slice is the same, and a mesh
      # implementation that shares replicas makes it once.
      y = impl.slicewise(
          lambda: tf.fill(slice_shape, tf.constant(value, dtype=dtype))
          if slice_shape else tf.constant(value, dtype=dtype))
    else:
      y = impl.import_tf_tensor(self._outputs[0],
                                tf.constant(self._value, dtype=dtype))
    lowering.set_tensor_lowering(self._outputs[0], y)


cost_rules.register(Constant, cost_rules.NO_WORK)


def constant(mesh, value, shape=None, dtype=tf.float32, name=None):
  """A constant tensor: `value` is a scalar or an array of `shape`."""
  if shape is None:
    shape = [(f"dim{i}", s) for i, s in enumerate(np.shape(value))]
  return Constant(mesh, value, shape, dtype, name=name).outputs[0]


def zeros(mesh, shape, dtype=tf.float32, name=None):
  return constant(mesh, 0, shape, dtype, name=name or "zeros")


def ones(mesh, shape, dtype=tf.float32, name=None):
  return constant(mesh, 1, shape, dtype, name=name or "ones")


def zeros_like(t, name=None):
  """Zeros of the mesh, shape and dtype of Tensor `t`."""
  return zeros(t.mesh, t.shape, t.dtype, name=name)


def ones_like(t, name=None):
  """Ones of the mesh, shape and dtype of Tensor `t`."""
  return ones(t.mesh, t.shape, t.dtype, name=name)


class RangeOperation(graph_lib.Operation):
  """0, 1, ..., dim.size - 1 along one dimension."""

  handles_padding = True

  def __init__(self, mesh, dim, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "range")
    dim = shape_lib.convert_to_dimension(dim)
    self._outputs = [graph_lib.Tensor(self, shape_lib.Shape([dim]),
                                      tf.as_dtype(dtype))]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dim = self._outputs[0].shape[0]
    dtype = self._outputs[0].dtype
    (block,) = impl.slice_shape(self._outputs[0].shape)
    mesh_axis = impl.tensor_dimension_to_mesh_axis(dim)
    range_dtype = dtype if dtype in (tf.int32, tf.int64, tf.float32,
                                     tf.float64) else tf.float32

    def fn(coordinate):
      # The offset may be a tensor (SIMD); the block size stays static.
      start = tf.cast(coordinate * block, range_dtype)
      values = tf.range(block, dtype=range_dtype) + start
      return values if range_dtype == dtype else tf.cast(values, dtype)

    coordinates = (impl.laid_out_pcoord(mesh_axis) if mesh_axis is not None
                   else impl.slicewise(lambda _: 0, impl.laid_out_pnum()))
    lowering.set_tensor_lowering(self._outputs[0],
                                 impl.slicewise(fn, coordinates))


cost_rules.register(RangeOperation, cost_rules.NO_WORK)


def mtf_range(mesh, dim, dtype, name=None):
  """A 1-d tensor [0, 1, ..., dim.size - 1] of `dtype` (bfloat16 via cast)."""
  return RangeOperation(mesh, dim, dtype, name=name).outputs[0]
