"""Laid-out values: what an mtf tensor or variable is once lowered.

A LaidOutTensor holds the slices of one mtf tensor (one per processor on
PlacementMeshImpl, the running processor's on SimdMeshImpl). The lazy kinds
defer work: LazyAllreduceSum keeps partial sums so that linear operations
share one allreduce; LazyLaidOutTensor computes its value when first read.
LaidOutVariable is the protocol of the TF variables behind an mtf variable.
"""

import tensorflow as tf

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils


class LaidOutTensor:
  """The lowered value of an mtf Tensor: the slices this program holds.

  PlacementMeshImpl holds one slice per processor; SIMD implementations hold
  the one slice of the processor running the program.
  """

  def __init__(self, tensor_list):
    self._tensor_list = list(tensor_list)

  def __repr__(self):
    return f"LaidOutTensor({self._tensor_list!r})"

  @property
  def tensor_list(self):
    return self._tensor_list

  @property
  def all_slices(self):
    return self._tensor_list

  @property
  def one_slice(self):
    """The only slice (SIMD implementations hold exactly one)."""
    if len(self._tensor_list) != 1:
      raise ValueError(f"one_slice of a LaidOutTensor with "
                       f"{len(self._tensor_list)} slices.")
    return self._tensor_list[0]

  @property
  def slice_shape(self):
    return slice_utils.static_shape(self._tensor_list[0])

  @classmethod
  def from_tensor_list(cls, tensor_list):
    return cls(tensor_list)

  def to_laid_out_tensor(self):
    return self


class LazyAllreduceSum:
  """A laid-out value whose sum over some mesh axes has not been taken yet.

  Reductions over split dimensions produce partial sums. Deferring the
  allreduce lets linear operations (adds, reshapes, scalar multiplies) act on
  the partial sums first, so that several of them share one allreduce.

  Args:
    mesh_impl: the MeshImpl that will do the allreduce.
    laid_out_input: the LaidOutTensor of partial sums.
    mesh_axes: the mesh axes (ints) to sum over.
    add_counter_fn: optional function of no arguments, called once if and
      when the allreduce is built (to count it in a Lowering's counters).
  """

  def __init__(self, mesh_impl, laid_out_input, mesh_axes,
               add_counter_fn=None):
    self.mesh_impl = mesh_impl
    self.laid_out_input = laid_out_input
    self.mesh_axes = tuple(sorted(mesh_axes))
    self.add_counter_fn = add_counter_fn
    self._reduced = None

  def to_laid_out_tensor(self):
    """The reduced LaidOutTensor (the allreduce is built once, here)."""
    if self._reduced is None:
      self._reduced = self.mesh_impl.allreduce(
          self.laid_out_input, self.mesh_axes, "SUM")
      if self.add_counter_fn is not None:
        self.add_counter_fn()
    return self._reduced

  def __add__(self, other):
    """The sum with `other`: still lazy when `other` is a lazy sum over the
    same mesh axes (one allreduce for both), else reduced now."""
    if compatible_lazy_allreduce_sums([self, other]):
      return LazyAllreduceSum(
          self.mesh_impl,
          self.mesh_impl.slicewise(tf.add, self.laid_out_input,
                                   other.laid_out_input),
          self.mesh_axes, add_counter_fn=self.add_counter_fn)
    return self.mesh_impl.slicewise(tf.add, *convert_args_to_laid_out_tensors(
        [self, other]))

  @property
  def slice_shape(self):
    return self.laid_out_input.slice_shape


class LazyLaidOutTensor:
  """A laid-out value computed when first needed.

  Args:
    to_laid_out_tensor_fn: function of no arguments returning the
      LaidOutTensor; called at most once.
    slice_shape: the static shape of one slice (list of ints), known before
      the value is computed.
  """

  def __init__(self, to_laid_out_tensor_fn, slice_shape):
    self._to_laid_out_tensor_fn = to_laid_out_tensor_fn
    self._slice_shape = list(slice_shape)
    self._value = None

  def to_laid_out_tensor(self):
    if self._value is None:
      self._value = self._to_laid_out_tensor_fn().to_laid_out_tensor()
    return self._value

  @property
  def slice_shape(self):
    return self._slice_shape


def compatible_lazy_allreduce_sums(xs):
  """True if `xs` are lazy sums on one mesh implementation (whichever
  lowering context's view of it) over the same mesh axes, so that they can
  be added before one allreduce."""
  if not xs or not all(isinstance(x, LazyAllreduceSum) for x in xs):
    return False
  first = xs[0]
  return all(_unbound(x.mesh_impl) is _unbound(first.mesh_impl) and
             x.mesh_axes == first.mesh_axes for x in xs)


def _unbound(mesh_impl):
  """The implementation a lowering context's view is of."""
  return getattr(mesh_impl, "unbound", mesh_impl)


def convert_args_to_laid_out_tensors(xs):
  """Materialises lazy values; other arguments pass through."""
  return [x.to_laid_out_tensor() if hasattr(x, "to_laid_out_tensor") else x
          for x in xs]


def full_shape_of(x, what):
  """The mtf Shape of `x`, an mtf Tensor or a Shape (or convertible).

  `what` names the caller in the error raised for a tf.Tensor or array,
  i.e. for arguments given in the order (tf_x, shape) instead of the
  original's (x, tf_x).
  """
  if hasattr(x, "operation") and hasattr(x, "shape"):
    return x.shape
  if tf.is_tensor(x) or hasattr(x, "__array__"):
    raise TypeError(
        f"{what}: x must be the mtf Tensor (or its mtf Shape) whose value is "
        f"given, got {type(x).__name__} {x!r:.80}. The arguments are "
        "(x, tf_x) / (x, laid_out_x), as in the original Mesh TensorFlow.")
  return shape_lib.convert_to_shape(x)


class LaidOutVariable:
  """The protocol of the TF variables behind one mtf variable on a mesh.

  A mesh implementation's `make_laid_out_variable(variable)` returns one of
  these (its class is the implementation's `LaidOutVariable`); the Variable,
  ReadVariable and Assign operations and the Lowering use only the members
  below. Each slice variable holds one processor's slice in the variable's
  slice dtype; reads give the activation dtype.
  """

  @property
  def laid_out_tensor(self):
    """The slices' current values (activation dtype), as a LaidOutTensor."""
    raise NotImplementedError(_missing(self, "laid_out_tensor"))

  def read(self, share_stack_read=False):
    """Reads the slices anew (after an assignment, say).

    `share_stack_read` lets members of one stacked variable share a read.
    """
    raise NotImplementedError(_missing(self, "read"))

  def assign_to_slices(self, assign_fn, values):
    """Runs `assign_fn(slice_variable, value)` for every slice; returns the
    grouped TF op (None when eager)."""
    raise NotImplementedError(_missing(self, "assign_to_slices"))

  def copy_master_to_slices(self):
    """Compat graph mode: an op filling the slices from the master variable
    (None when eager, where the slices are the variables)."""
    raise NotImplementedError(_missing(self, "copy_master_to_slices"))

  def copy_slices_to_master(self):
    """Compat graph mode: an op writing the assembled slices to the master
    (None when eager)."""
    raise NotImplementedError(_missing(self, "copy_slices_to_master"))

  @property
  def slice_variables(self):
    """The TF variables holding the slices, in processor order."""
    raise NotImplementedError(_missing(self, "slice_variables"))

  @property
  def master(self):
    """The master (full-size, host) TF variable, or None."""
    raise NotImplementedError(_missing(self, "master"))

  @property
  def storage(self):
    """The implementation's record of the slice variables (what the
    variable store keeps under the variable's name)."""
    raise NotImplementedError(_missing(self, "storage"))


def _missing(obj, member):
  return (f"{type(obj).__name__}.{member} is not implemented: a mesh "
          "implementation must provide it.")

