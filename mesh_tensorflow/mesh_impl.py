"""MeshImpl: how a mesh is laid out and how its processors communicate.

A mesh implementation knows the mesh shape and the layout rules, so it can say
which slice of each tensor every processor holds. `MeshImpl` itself answers
such layout questions; backends (PlacementMeshImpl, SimdMeshImpl) provide a
short list of members (slicewise computation, four collectives, the
processor number, import/export, random numbers, laid-out variables) and
everything else here is derived from them. The lowered values of mtf tensors
(LaidOutTensor and the lazy kinds) and the laid-out variable protocol live
here too.

On the mesh "rows:2;cols:2" with rules "batch:rows", a tensor
[batch=4, d=6] has slices [2, 6]: processors 0 and 1 (row 0) hold batch rows
0-1, processors 2 and 3 (row 1) hold rows 2-3, and each slice is replicated
along "cols".
"""

import contextlib

from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import processors
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.randomness import stateless_random
from mesh_tensorflow.storage import variable_store as variable_store_lib


COLLECTIVE_KINDS = ("allreduce", "reduce_scatter", "allconcat", "alltoall",
                    "receive")


def collective_wire_bytes(kind, group_size, num_groups, slice_bytes,
                          receivers=0):
  """Wire bytes of one collective call, summed over all processors.

  What a bandwidth-optimal algorithm sends for `num_groups` groups of
  `group_size` members, each member holding a `slice_bytes` input: per
  group, allreduce 2(n-1)/n s per member, reduce_scatter and alltoall
  (n-1)/n s, allconcat (n-1) s, and receive s for each of the group's
  `receivers` members that gets another member's slice. Every figure is an
  exact integer (n members times (n-1)/n s is (n-1) s), and a
  reduce_scatter plus the allconcat of its result has the wire bytes of
  the allreduce it replaces. The lowering's counters
  (`comm/<kind>/<mesh dims>/wire_bytes`) and the layout search's cost
  model both use this formula.

  Args:
    kind: one of COLLECTIVE_KINDS.
    group_size: n, the members of each group.
    num_groups: how many groups take part (mesh size / n).
    slice_bytes: s, bytes of one member's input slice.
    receivers: receive only: members per group that get a slice.

  Returns:
    an int.
  """
  n, s = group_size, slice_bytes
  per_group = {
      "allreduce": 2 * (n - 1) * s,
      "reduce_scatter": (n - 1) * s,
      "alltoall": (n - 1) * s,
      "allconcat": n * (n - 1) * s,
      "receive": receivers * s,
  }
  if kind not in per_group:
    raise ValueError(f"Unknown collective {kind!r}; expected one of "
                     f"{list(COLLECTIVE_KINDS)}.")
  return num_groups * per_group[kind]


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
  """True if `xs` are lazy sums on one mesh implementation over the same
  mesh axes (so that they can be added before one allreduce)."""
  if not xs or not all(isinstance(x, LazyAllreduceSum) for x in xs):
    return False
  first = xs[0]
  return all(x.mesh_impl is first.mesh_impl and x.mesh_axes == first.mesh_axes
             for x in xs)


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


# The sets of ignored rules already logged (each is logged once a process).
_LOGGED_MISSING_RULES = set()


def _log_rules_for_missing_mesh_dimensions(layout_rules, mesh_shape):
  """Logs, once per distinct set, the rules naming absent mesh dimensions."""
  mesh_names = set(mesh_shape.dimension_names)
  missing = tuple((t, m) for t, m in layout_rules if m not in mesh_names)
  if not missing or missing in _LOGGED_MISSING_RULES:
    return
  _LOGGED_MISSING_RULES.add(missing)
  logging.info(
      "Ignoring layout rules for mesh dimensions this mesh lacks: %s "
      "(mesh %s).", ";".join(f"{t}:{m}" for t, m in missing),
      mesh_shape.to_string)


def _missing(obj, member):
  return (f"{type(obj).__name__}.{member} is not implemented: a mesh "
          "implementation must provide it.")


class MeshImpl(tf.__internal__.tracking.Trackable):
  """A mesh's shape and layout rules; the base of mesh implementations.

  Built directly, `MeshImpl(shape, layout_rules)` answers layout questions
  without devices: `tensor_layout`, `tensor_dimension_to_mesh_axis`,
  `slice_shape`, `slice_begin`, `laid_out_size`, `processor_groups`, ...
  Lowering needs a backend (PlacementMeshImpl, SimdMeshImpl), which provides
  the members that raise NotImplementedError here: `slicewise`, the
  collectives `allreduce`, `allconcat`, `alltoall`, `receive`,
  `laid_out_pnum`, `import_tf_tensor`, `export_to_tf_tensor`, `random`,
  `devices` and `LaidOutVariable` (or `make_laid_out_variable`). Everything
  else is derived from them; backends also override derived members where
  they can do better (`reduce_scatter`, the weight-update-sharding
  collective, is allreduce + allsplit here).

  A mesh implementation owns the TF variables of the mtf variables lowered
  onto it (its `variable_store`), and is trackable:
  `tf.train.Checkpoint(model=mesh_impl)` saves them by mtf name,
  independently of the layout (see `checkpointing`).

  Args:
    shape: the mesh shape, e.g. "rows:2;cols:4" or a list of Dimensions.
    layout_rules: e.g. "batch:rows;hidden:cols" or a LayoutRules.

  A rule naming a mesh dimension the mesh lacks is ignored, as in the
  original (T5's default rules name "ensemble", which most meshes lack); such
  rules are logged once at INFO, so that a typo can still be seen.
  """

  LaidOutTensor = LaidOutTensor
  # The backend's LaidOutVariable class, built as
  # LaidOutVariable(variable, mesh_impl) by `make_laid_out_variable`.
  LaidOutVariable = None

  def __init__(self, shape, layout_rules):
    self._shape = shape_lib.convert_to_shape(shape)
    self._layout_rules = shape_lib.convert_to_layout_rules(layout_rules)
    _log_rules_for_missing_mesh_dimensions(self._layout_rules, self._shape)
    self._counter_fn = None
    self._variable_store = None

  def __repr__(self):
    rules = ";".join(f"{t}:{m}" for t, m in self._layout_rules)
    return f"{type(self).__name__}({self._shape.to_string}, {rules!r})"

  def _not_implemented(self, member):
    """The error of a member only backends provide."""
    return NotImplementedError(
        f"{type(self).__name__}.{member} is not implemented: MeshImpl itself "
        "only answers layout questions (tensor_layout, slice_shape, ...). "
        "Lower onto a PlacementMeshImpl or a SimdMeshImpl.")

  # ---------------------------------------------------------------- layout

  @property
  def shape(self):
    return self._shape

  @property
  def ndims(self):
    return self._shape.ndims

  @property
  def size(self):
    return self._shape.size

  @property
  def layout_rules(self):
    return self._layout_rules

  @property
  def supports_control_dependencies(self):
    """Whether lowered ops may carry control dependencies (XLA: no)."""
    return True

  def tensor_dimension_to_mesh_axis(self, tensor_dimension):
    """The mesh axis (int) `tensor_dimension` is split over, or None."""
    return self._layout_rules.tensor_dimension_to_mesh_axis(
        tensor_dimension, self._shape)

  def tensor_layout(self, arg):
    """The TensorLayout of an mtf Tensor or a Shape on this mesh."""
    tensor_shape = arg.shape if hasattr(arg, "operation") else arg
    return self._layout_rules.tensor_layout(tensor_shape, self._shape)
  def mesh_axis_to_cumprod(self, tensor_shape):
    """For each mesh axis, the exclusive cumprod of the tensor axis split
    over it (None if none is): where that split sits in row-major order."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    cumprod = tensor_shape.cumprod
    return [None if tensor_axis is None else cumprod[tensor_axis]
            for tensor_axis in self.tensor_layout(
                tensor_shape).mesh_axis_to_tensor_axis(self.ndims)]

  def slice_shape(self, tensor_shape):
    """The static shape of one slice of a tensor of `tensor_shape`.

    A dimension split unevenly (allowed by `LayoutRules.allow_uneven`) has
    slices of ceil(size / pieces); see `padded_axes`.

    Raises:
      IndivisibleError: a split dimension does not divide by its mesh
        dimension, and the layout rules do not allow uneven splits.
    """
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    allow_uneven = self._layout_rules.allow_uneven
    result = []
    for dim, mesh_axis in zip(tensor_shape, self.tensor_layout(tensor_shape)):
      if mesh_axis is None:
        result.append(dim.size)
        continue
      mesh_dim = self._shape[mesh_axis]
      size = padding.slice_size(dim.size, mesh_dim.size, allow_uneven)
      if size is None:
        raise errors.IndivisibleError(
            f"Tensor dimension {dim.name!r} (size {dim.size}) of "
            f"{tensor_shape} is split over mesh dimension {mesh_dim.name!r} "
            f"(size {mesh_dim.size}) by the rule {dim.name}:{mesh_dim.name}, "
            f"but {dim.size} is not divisible by {mesh_dim.size}. Use a size "
            f"that is a multiple of {mesh_dim.size}, a layout that leaves "
            f"{dim.name!r} replicated, or allow uneven splits "
            "(mtf.LayoutRules(rules, allow_uneven=True); in the Transformer "
            "binary the gin binding `utils.run.allow_uneven_splits = True`), "
            f"which pads {dim.name!r} to "
            f"{-(-dim.size // mesh_dim.size) * mesh_dim.size}.")
      result.append(size)
    return result

  def padded_axes(self, tensor_shape):
    """The PaddedAxis of each unevenly split axis of `tensor_shape`."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    if not self._layout_rules.allow_uneven:
      return []
    result = []
    for tensor_axis, (dim, mesh_axis) in enumerate(
        zip(tensor_shape, self.tensor_layout(tensor_shape))):
      if mesh_axis is None:
        continue
      pieces = self._shape[mesh_axis].size
      if dim.size % pieces:
        result.append(padding.PaddedAxis(
            tensor_axis, mesh_axis, dim.size, -(-dim.size // pieces), pieces))
    return result

  def fill_padding(self, x, tensor_shape, fill=0, names=None):
    """Laid-out `x` of `tensor_shape` with its padding set to `fill` (only
    along the dimensions named in `names`, if given).

    Padding is kept zero by the lowering (see `backend.padding`); operations
    that need another neutral value there (a max, -inf) call this.
    """
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    axes = [a for a in self.padded_axes(tensor_shape)
            if names is None or tensor_shape[a.tensor_axis].name in names]
    x = x.to_laid_out_tensor()
    if not axes:
      return x
    def fn(s, pnum):
      return padding.fill_slice(s, axes, self._begins(tensor_shape, pnum),
                                fill)
    return self.slicewise(fn, x, self.laid_out_pnum())

  def _begins(self, tensor_shape, pnum):
    """slice_begin for an int pnum, or as int tensors for a tensor one."""
    if isinstance(pnum, (int, np.integer)):
      return self.slice_begin(tensor_shape, int(pnum))
    slice_shape = self.slice_shape(tensor_shape)
    begins = []
    for tensor_axis, mesh_axis in enumerate(self.tensor_layout(tensor_shape)):
      if mesh_axis is None:
        begins.append(0)
        continue
      stride = shape_lib.list_product(
          self._shape.to_integer_list[mesh_axis + 1:])
      pcoord = (pnum // stride) % self._shape[mesh_axis].size
      begins.append(pcoord * slice_shape[tensor_axis])
    return begins

  def gather_dimensions(self, x, tensor_shape, names):
    """Laid-out `x` with the split dimensions named in `names` gathered
    whole (and their padding cut off): its layout as if `names` were
    replicated."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    x = x.to_laid_out_tensor()
    padded = {a.tensor_axis: a for a in self.padded_axes(tensor_shape)}
    for tensor_axis, (dim, mesh_axis) in enumerate(
        zip(tensor_shape, self.tensor_layout(tensor_shape))):
      if mesh_axis is None or dim.name not in names:
        continue
      x = self.allconcat(x, mesh_axis, tensor_axis)
      if tensor_axis in padded:
        x = self.slicewise(
            lambda s, a=tensor_axis, n=dim.size: padding.strip_axis(s, a, n),
            x)
    return x

  def split_dimensions(self, x, tensor_shape, names):
    """The inverse of gather_dimensions: laid-out `x`, whose dimensions
    named in `names` are whole, split (and padded) as the layout says. No
    communication."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    x = x.to_laid_out_tensor()
    slice_shape = self.slice_shape(tensor_shape)
    for tensor_axis, (dim, mesh_axis) in enumerate(
        zip(tensor_shape, self.tensor_layout(tensor_shape))):
      if mesh_axis is None or dim.name not in names:
        continue
      full = slice_shape[tensor_axis] * self._shape[mesh_axis].size
      if full != dim.size:
        x = self.slicewise(
            lambda s, a=tensor_axis, n=dim.size, m=full: padding.pad_axis(
                s, a, n, m), x)
      x = self.allsplit(x, mesh_axis, tensor_axis)
    return x

  @contextlib.contextmanager
  def replicating(self, names):
    """A context in which tensor dimensions named in `names` are laid out
    replicated: how an operation whose lowering does not handle padding
    is lowered on padded inputs (see Lowering.lower_operation)."""
    previous = self._layout_rules
    self._layout_rules = previous.without(names)
    try:
      yield
    finally:
      self._layout_rules = previous

  def slice_begin(self, tensor_shape, pnum):
    """Where processor `pnum`'s slice starts in the full tensor."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    coordinates = processors.pnum_to_processor_coordinates(self._shape, pnum)
    slice_shape = self.slice_shape(tensor_shape)
    return [0 if mesh_axis is None else
            coordinates[mesh_axis] * slice_shape[tensor_axis]
            for tensor_axis, mesh_axis in enumerate(
                self.tensor_layout(tensor_shape))]

  def replica_sources(self, tensor_shape):
    """Per processor, the processor whose copy of its slice of a tensor of
    `tensor_shape` it uses. Each its own here; PlacementMeshImpl on one
    host's CPUs lets replicas share the first copy."""
    del tensor_shape
    return list(range(self.size))

  def slice_size(self, tensor_shape):
    return shape_lib.list_product(self.slice_shape(tensor_shape))

  def laid_out_size(self, tensor_shape):
    """Elements held on all processors together, counting replicas."""
    return self.slice_size(tensor_shape) * self.size

  def processor_groups(self, mesh_axes):
    return processors.processor_groups(self._shape, mesh_axes)

  def laid_out_slice_num(self, tensor_shape):
    """A laid-out integer that is equal exactly for identical slices."""
    layout = self.tensor_layout(tensor_shape)
    split_axes = [a for a in layout if a is not None]
    def fn(pnum):
      num = 0
      for mesh_axis in range(self.ndims):
        if mesh_axis in split_axes:
          stride = shape_lib.list_product(
              self._shape.to_integer_list[mesh_axis + 1:])
          num = num * self._shape[mesh_axis].size + (
              pnum // stride) % self._shape[mesh_axis].size
      return num
    return self.slicewise(fn, self.laid_out_pnum())

  # ---------------------------------------------------------- counters

  def set_counter_fn(self, counter_fn):
    """Installs fn(key, value) that collectives report their traffic to;
    returns the previous one (the Lowering installs its `add_counter`)."""
    previous = self._counter_fn
    self._counter_fn = counter_fn
    return previous

  def _count(self, key, value):
    if self._counter_fn is not None:
      self._counter_fn(key, value)

  def _count_collective(self, kind, mesh_axes, x, source_pcoord=None):
    """Counts one collective call, the bytes its inputs hold on all
    processors together and its wire bytes (see `collective_wire_bytes`;
    the same whichever implementation lowers it). `source_pcoord` is
    receive's argument."""
    axes = "_".join(self._shape[a].name for a in mesh_axes) or "none"
    first = x.tensor_list[0]
    slice_bytes = first.dtype.size * first.shape.num_elements()
    n = shape_lib.list_product(self._shape[a].size for a in mesh_axes)
    receivers = sum(1 for i, source in enumerate(source_pcoord or ())
                    if source is not None and source != i)
    wire_bytes = collective_wire_bytes(kind, n, self.size // n, slice_bytes,
                                       receivers)
    self._count(f"comm/{kind}/{axes}/calls", 1)
    self._count(f"comm/{kind}/{axes}/bytes", slice_bytes * self.size)
    self._count(f"comm/{kind}/{axes}/wire_bytes", wire_bytes)

  # ------------------------------------------------------ backend members

  @property
  def devices(self):
    """The device of each processor, in processor number order."""
    raise self._not_implemented("devices")

  def slicewise(self, fn, *inputs):
    """Applies `fn` to each slice; non-laid-out arguments go to every call.

    Returns a LaidOutTensor, or a tuple of them when `fn` returns a tuple.
    """
    raise self._not_implemented("slicewise")

  def allreduce(self, x, mesh_axes, reduction_fn_string):
    """Sums ("SUM") or takes "MAX"/"MIN" of `x` within groups along
    `mesh_axes`; every member of a group gets the result."""
    raise self._not_implemented("allreduce")

  def allconcat(self, x, mesh_axis, concat_axis):
    """Concatenates the slices of each group along `mesh_axis` on tensor
    axis `concat_axis`, in coordinate order; every member gets the result."""
    raise self._not_implemented("allconcat")

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    """Within groups along `mesh_axis`: splits each slice into group-size
    pieces on `split_axis` and gives piece k to member k, which
    concatenates what it receives on `concat_axis` in coordinate order."""
    raise self._not_implemented("alltoall")

  def receive(self, x, mesh_axis, source_pcoord):
    """Member i of each group along `mesh_axis` gets the slice of member
    `source_pcoord[i]`, or zeros where that is None."""
    raise self._not_implemented("receive")

  def laid_out_pnum(self):
    """A laid-out value holding each processor's number."""
    raise self._not_implemented("laid_out_pnum")

  def import_tf_tensor(self, x, tf_x):
    """Lays out `tf_x`, the full value of mtf Tensor `x`.

    Args:
      x: the mtf Tensor (or its Shape) that `tf_x` is the value of.
      tf_x: a tf.Tensor (or anything convertible) of x's full shape.

    Returns:
      a LaidOutTensor.
    """
    raise self._not_implemented("import_tf_tensor")

  def export_to_tf_tensor(self, x, laid_out_x):
    """The full tf.Tensor of mtf Tensor `x` from its laid-out value.

    Args:
      x: the mtf Tensor (or its Shape).
      laid_out_x: its LaidOutTensor (or lazy laid-out value).

    Returns:
      a tf.Tensor of x's full shape.
    """
    raise self._not_implemented("export_to_tf_tensor")

  def random(self, shape, tf_fn, kwargs):
    """A laid-out random tensor of mtf `shape`, the same under every layout.

    `tf_fn` names the distribution the way the original library did, by a
    TensorFlow random function: tf.random.uniform, tf.random.normal,
    tf.random.truncated_normal (or their tf.compat.v1 names), or one of
    the strings "uniform", "normal", "truncated_normal". `kwargs` holds its
    arguments: `seed` (an int or a scalar integer tensor; default 0),
    `dtype`, and minval/maxval (uniform) or mean/stddev (normal, truncated
    normal); `name` is ignored. Other functions raise ValueError: their
    values could not be made independent of the layout.

    Each processor computes its own slice with `stateless_random.sample`:
    every element is a pure function of (seed, its linear index in the full
    tensor), so replicated slices agree, different blocks differ, and the
    exported full tensor does not depend on the mesh or the layout. No
    communication; O(slice size) work.

    On "rows:2;cols:2" with rules "a:rows", a tensor [a=4, b=6] is drawn as
    rows 0-1 of the full tensor on processors 0 and 1 and rows 2-3 on
    processors 2 and 3.

    Args:
      shape: the mtf Shape of the full tensor.
      tf_fn: the TensorFlow random function (or distribution name).
      kwargs: dict of its arguments (see above).

    Returns:
      a LaidOutTensor.
    """
    raise self._not_implemented("random")

  def _random_sampler(self, shape, tf_fn, kwargs, whole=False):
    """A function of `begin` (ints, or scalar integer tensors in an SPMD
    program) giving the slice of `random(shape, tf_fn, kwargs)` that starts
    there (the whole tensor, from begin 0, with `whole`)."""
    shape = shape_lib.convert_to_shape(shape)
    distribution, seed, dtype, params = stateless_random.parse_tf_fn(
        tf_fn, kwargs, f"{type(self).__name__}.random")
    full_shape = shape.to_integer_list
    slice_shape = full_shape if whole else self.slice_shape(shape)

    compiled = stateless_random.compiled_sampler(
        distribution, full_shape, slice_shape, dtype=dtype, **params)

    def sample(begin):
      if compiled is not None and full_shape:
        return compiled(seed, begin)
      return stateless_random.sample(distribution, seed, full_shape,
                                     slice_shape, begin, dtype=dtype,
                                     **params)

    return sample

  # ------------------------------------------------------------ variables

  @property
  def variable_store(self):
    """The VariableStore holding the TF variables of this mesh's mtf
    variables (by mtf name, per execution context), checkpointed under
    this object."""
    if self._variable_store is None:
      self._variable_store = variable_store_lib.VariableStore(
          checkpoint_root=self)
    return self._variable_store

  def make_laid_out_variable(self, variable, stack_group=None):
    """The LaidOutVariable (per-processor TF variables) of mtf `variable`.

    `stack_group` (from the Lowering's autostack plan, or None) names the
    variables to store together with it, where the implementation stacks
    (see `supports_autostack`).
    """
    del stack_group
    if self.LaidOutVariable is None:
      raise self._not_implemented("make_laid_out_variable")
    return self.LaidOutVariable(variable, self)  # pylint: disable=not-callable

  def next_random_step(self):
    """Advances the "mtf_random_step" counter; returns its old value.

    The counter lives in the variable store (on the host), so it is
    checkpointed with the model.
    """
    counter = self.variable_store.counter("mtf_random_step")
    with tf.device(counter.device):
      after = tf.convert_to_tensor(counter.assign_add(1, read_value=True))
      return after - 1

  @property
  def supports_autostack(self):
    """Whether `make_laid_out_variable` honours stack groups."""
    return False

  def assign_to_variables(self, laid_out_variables, laid_out_values,
                          assign_fn):
    """Lowers one Assign of several variables; returns a TF op or None."""
    ops = [v.assign_to_slices(assign_fn, x.all_slices)
           for v, x in zip(laid_out_variables, laid_out_values)]
    ops = [op for op in ops if op is not None]
    if tf.executing_eagerly():
      return None
    return tf.group(*ops)

  def run(self, fn, *args):
    """Runs a step program `fn(*args)` on this mesh; returns its result.

    Here a direct call: one program holds every processor's ops.
    SimdMeshImpl runs `fn` as the program of each processor instead, so
    calling `mesh_impl.run(fn, ...)` works on every implementation.
    """
    return fn(*args)

  # --------------------------------------------------- derived collectives

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    """Keeps, on each processor, its own piece along `split_axis`.

    The inverse of allconcat; no communication. `which` (a laid-out integer)
    defaults to the processor's coordinate along `mesh_axis`.
    """
    if which is None:
      which = self.laid_out_pcoord(mesh_axis)
    num_splits = self._shape[mesh_axis].size

    def my_piece(x, which):
      size = slice_utils.static_shape(x)
      piece = size[split_axis] // num_splits
      begin = [0] * len(size)
      size[split_axis] = piece
      if isinstance(which, int):
        begin[split_axis] = which * piece
      else:
        begin = tf.one_hot(split_axis, len(size), dtype=tf.int32) * (
            tf.cast(which, tf.int32) * piece)
      return slice_utils.tf_slice(x, begin, size)

    return self.slicewise(my_piece, x, which)

  def reduce_scatter(self, x, mesh_axis, split_axis,
                     reduction_fn_string="SUM"):
    """Within groups along `mesh_axis`: reduces ("SUM", "MAX", "MIN") the
    members' slices elementwise and gives member k (in coordinate order)
    the k-th of group-size equal pieces of the result along tensor axis
    `split_axis`: allreduce followed by allsplit, with half the wire
    bytes. A size-1 mesh axis returns `x`.

    This default is exactly that allreduce and allsplit (so a backend
    with only the other collectives still lowers everything); backends
    override it with a real reduce-scatter.
    """
    if self._shape[mesh_axis].size == 1:
      return x.to_laid_out_tensor()
    return self.allsplit(self.allreduce(x, [mesh_axis], reduction_fn_string),
                         mesh_axis, split_axis)

  def shift_by_n_processors(self, x, mesh_axis, offset, wrap):
    """Member i of each group along `mesh_axis` gets member i-offset's
    slice (wrapping around the ring if `wrap`, else zeros)."""
    n = self._shape[mesh_axis].size
    source_pcoord = []
    for i in range(n):
      c = i - offset
      if not 0 <= c < n:
        c = c % n if wrap else None
      source_pcoord.append(c)
    return self.receive(x, mesh_axis, source_pcoord)

  def laid_out_pcoord(self, mesh_axis):
    """A laid-out integer: each processor's coordinate along `mesh_axis`."""
    stride = shape_lib.list_product(
        self._shape.to_integer_list[mesh_axis + 1:])
    size = self._shape[mesh_axis].size
    return self.slicewise(lambda pnum: (pnum // stride) % size,
                          self.laid_out_pnum())

  def idle_processors(self, pnums):
    """Context in which `slicewise` may skip processors `pnums`, giving them
    zeros (e.g. they hold idle pipeline slots, see mtf.strategies.idle_slots).
    Only an implementation whose processors run their own operations can
    (PlacementMeshImpl); by default every processor computes."""
    del pnums
    return contextlib.nullcontext()

  def slicewise_delay_allreduce(self, fn, *inputs):
    """slicewise for a function that is linear in its laid-out inputs.

    If every input is a lazy sum over the same mesh axes, applies `fn` to the
    partial sums and keeps the result lazy.
    """
    if compatible_lazy_allreduce_sums(inputs):
      return LazyAllreduceSum(
          self, self.slicewise(fn, *[x.laid_out_input for x in inputs]),
          inputs[0].mesh_axes)
    return self.slicewise(fn, *convert_args_to_laid_out_tensors(inputs))

  def broadcast_impl(self, old_slices, old_shape, new_shape):
    """Broadcasts laid-out `old_slices` of `old_shape` to `new_shape`."""
    old_shape = shape_lib.convert_to_shape(old_shape)
    new_shape = shape_lib.convert_to_shape(new_shape)
    new_slice_shape = self.slice_shape(new_shape)
    if old_shape == new_shape:
      return old_slices

    def fn(x):
      x = slice_utils.expand_to(x, old_shape, new_shape)
      if slice_utils.static_shape(x) == new_slice_shape:
        return x
      return slice_utils.broadcast_to(x, new_slice_shape)

    return self.slicewise(fn, old_slices)

  def einsum(self, equation, *slices):
    """Local einsum of slices; an override point for backends.

    mtf's equations are canonical (one letter per dimension, explicit
    output, no ellipsis), so one or two operands go straight to the Einsum
    op: tf.einsum would parse and validate the equation again in Python for
    every slice, a large share of PlacementMeshImpl's lowering time on big
    meshes. More operands take tf.einsum's contraction-order search.
    """
    if len(slices) <= 2:
      return tf.raw_ops.Einsum(inputs=list(slices), equation=equation)
    return tf.einsum(equation, *slices)

  def make_slices(self, tf_tensor, tensor_shape):
    """The slice of a full tensor for every processor (in pnum order);
    padded with zeros where the split is uneven."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    slice_shape = self.slice_shape(tensor_shape)
    tf_tensor = padding.pad_full(tf_tensor, self.padded_axes(tensor_shape))
    by_begin = {}
    result = []
    for pnum in range(self.size):
      begin = tuple(self.slice_begin(tensor_shape, pnum))
      if begin not in by_begin:
        by_begin[begin] = (
            tf_tensor if slice_shape == tensor_shape.to_integer_list else
            slice_utils.tf_slice(tf_tensor, list(begin), slice_shape))
      result.append(by_begin[begin])
    return result

  def combine_slices(self, slices, tensor_shape, device=None):
    """Assembles the full tensor from per-processor slices (pnum order).

    Replicated copies are not read: each distinct block is taken from the
    first processor that holds it.
    """
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    layout = self.tensor_layout(tensor_shape)
    blocks = {}
    for pnum, s in enumerate(slices):
      blocks.setdefault(tuple(self.slice_begin(tensor_shape, pnum)), s)
    with tf.device(device):
      for tensor_axis in reversed(range(tensor_shape.ndims)):
        if layout[tensor_axis] is None:
          continue
        merged = {}
        for begin in sorted(blocks):
          key = begin[:tensor_axis] + (0,) + begin[tensor_axis + 1:]
          merged.setdefault(key, []).append(blocks[begin])
        blocks = {key: tf.concat(parts, axis=tensor_axis)
                  for key, parts in merged.items()}
      (result,) = blocks.values()
      return padding.strip_full(result, self.padded_axes(tensor_shape))

  def Print(self, x, data, message, **kwargs):  # pylint: disable=invalid-name
    """Returns laid-out x, printing `message` and the tf.Tensors `data` when
    it is computed (at once when eager)."""
    print_op = tf.print(message, *data, **kwargs)
    if tf.executing_eagerly():
      return x

    def fn(s):
      with tf.control_dependencies([print_op]):
        return tf.identity(s)

    return self.slicewise(fn, x)
