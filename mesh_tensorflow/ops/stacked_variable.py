"""StackedVariable: several same-shaped variables seen as one.

`StackedVariable([v1, ..., vn])` is a Variable whose value is the stack of
the members' values along a new first dimension "stacked" (of size n).
Reading it reads the members; assigning to it assigns each member its row,
so the members keep their own TF variables and checkpoint entries (under
their own names), as the original's stacked variables kept their masters.

In the original, `Graph.rewrite_stack_variables` replaced groups of
variables by StackedVariables to cut the number of TF variables. Here that
is a storage decision of the mesh implementation (see
`mesh_tensorflow.storage.autostack`), which leaves the graph alone; build a
StackedVariable directly to handle a group of variables as one tensor.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import variables

__all__ = ["StackedVariable"]

STACKED_DIM_NAME = "stacked"


class StackedVariable(variables.Variable):
  """A Variable combining the same-shaped Variables `vs` (see module doc).

  Its shape is [stacked=len(vs)] + the members' shape; it has their
  VariableDType and trainability and is named "stacked/<first member>".
  The "stacked" dimension cannot be split across the mesh.
  """

  has_own_storage = False

  def __init__(self, vs):
    vs = list(vs)
    if not vs:
      raise ValueError("StackedVariable needs at least one variable.")
    first = vs[0]
    for v in vs:
      if not isinstance(v, variables.Variable):
        raise TypeError(f"StackedVariable: {v!r} is not an mtf Variable.")
      if (v.mesh, v.shape, v.dtype, v.trainable) != (
          first.mesh, first.shape, first.dtype, first.trainable):
        raise errors.ShapeError(
            f"StackedVariable: variable {v.name!r} ({v.shape}, {v.dtype}, "
            f"trainable={v.trainable}) differs from {first.name!r} "
            f"({first.shape}, {first.dtype}, trainable={first.trainable}); "
            "stacked variables need the same mesh, shape, dtypes and "
            "trainability.")
    shape = shape_lib.Shape(
        [shape_lib.Dimension(STACKED_DIM_NAME, len(vs))] + first.shape.dims)
    self._members = vs
    super().__init__(first.mesh, "stacked/" + first.name, shape, first.dtype,
                     None, first.trainable)
    self._initialize_splittable_and_unsplittable_dims(
        "splittable", [STACKED_DIM_NAME])

  @property
  def original_names(self):
    """The names of the stacked variables, in stack order."""
    return [v.name for v in self._members]

  @property
  def master_device(self):
    return self._members[0].master_device

  def get_master(self):
    """The stack of the members' master values."""
    with tf.device(self.master_device):
      return tf.stack([v.get_master() for v in self._members])

  def assign_to_master(self, val):
    """Assigns row i of `val` to the i-th member's master."""
    rows = tf.unstack(tf.convert_to_tensor(val), num=len(self._members))
    ops = [v.assign_to_master(row) for v, row in zip(self._members, rows)]
    ops = [op for op in ops if op is not None]
    if tf.executing_eagerly():
      return None
    return tf.group(*ops)

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    laid_out = _StackedLaidOutVariable(
        mesh_impl, [lowering.variables[v] for v in self._members])
    self._lowered_as = (mesh_impl, laid_out)
    lowering.variables[self] = laid_out
    lowering.set_tensor_lowering(self.outputs[0], laid_out.laid_out_tensor)


class _StackedLaidOutVariable:
  """The laid-out view of a StackedVariable over its members' storage."""

  def __init__(self, mesh_impl, members):
    self._mesh_impl = mesh_impl
    self._members = members

  # Not a stack of the mesh implementation's own (autostack) storage.
  storage = None
  master = None

  def _stacked(self, member_values):
    return self._mesh_impl.slicewise(lambda *xs: tf.stack(list(xs)),
                                     *member_values)

  @property
  def laid_out_tensor(self):
    return self._stacked([m.laid_out_tensor for m in self._members])

  @property
  def slice_variables(self):
    return [v for m in self._members for v in m.slice_variables]

  def read(self, share_stack_read=False):
    del share_stack_read
    return self._stacked([m.read() for m in self._members])

  def assign_to_slices(self, assign_fn, values):
    """Assigns row i of every processor's value to the i-th member."""
    n = len(self._members)
    devices = getattr(self._mesh_impl, "devices", None)
    rows = []
    for pnum, value in enumerate(values):
      # One value per processor (placement): unstack on its device. A SIMD
      # program has one value for all processors and no device scope.
      device = (devices[pnum] if devices is not None and
                len(values) == len(devices) else None)
      with tf.device(device):
        rows.append(tf.unstack(value, num=n))
    ops = [m.assign_to_slices(assign_fn, [r[i] for r in rows])
           for i, m in enumerate(self._members)]
    return _group(ops)

  def copy_master_to_slices(self):
    return _group([])  # The members copy their own.

  def copy_slices_to_master(self):
    return _group([])


def _group(ops):
  ops = [op for op in ops if op is not None]
  if tf.executing_eagerly():
    return None
  return tf.group(*ops) if ops else tf.no_op()
