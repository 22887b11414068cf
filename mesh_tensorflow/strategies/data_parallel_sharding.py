"""Weight-update sharding and sharded parameters over data-parallel dims.

Under data parallelism every processor of a data-parallel group holds a full
copy of each weight, applies the full optimizer update to it and keeps full
optimizer slots. Sharding the update (as in "Automatic Cross-Replica
Sharding of Weight Update in Data-Parallel Training", and ZeRO stages 1-2)
splits that work and the slots over the group; sharding the parameters too
(ZeRO stage 3, FSDP) stores the weights themselves split.

In Mesh TensorFlow terms both are layouts. One dimension of the variable
that no layout rule splits, and whose size the data-parallel mesh dimension
divides, is renamed to a shard dimension "<name>@<mesh dim>", which every
LayoutRules splits over that mesh dimension (`shape.shard_dimension_name`).
With uneven splits (`LayoutRules(..., allow_uneven=True)`) a variable that no
such dimension divides is sharded too, padded, over the dimension that
leaves the smallest shard:

- sharded updates: the optimizer renames the gradient into the variable's
  "update shape". The gradient is still a pending sum over the batch's
  mesh dimension, so the rename lowers to one reduce-scatter in place of
  the all-reduce. The slots are variables of the update shape, and the new
  value renamed back to the variable's shape is one all-gather. Statistics
  over the whole variable (Adafactor's RMS, clipping, factored means) are
  ordinary mtf reductions over a split dimension, so they are exact.
- sharded parameters: the variable itself is created in the update shape;
  `mtf.get_variable` returns its value renamed to the requested shape (an
  all-gather where it is used, redone inside `mtf.recompute_grad` blocks),
  and its gradient arrives reduce-scattered.

Names and sizes do not change, so checkpoints are the same with or without
sharding, under any layout. Say it once per mesh, before building the
model:

    mtf.shard_data_parallel(mesh, "b:4;m:2", "batch:b;d_ff:m")
"""

import collections

from absl import logging

from mesh_tensorflow import errors
from mesh_tensorflow import extensions
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import reshapes
from mesh_tensorflow.ops import variables as variables_lib

# Why a variable keeps its layout, per data-parallel mesh dimension.
_SPLIT_ALREADY = "its layout splits it over {mesh_dim} already"
_NO_DIVISIBLE_DIM = ("no unsplit dimension whose size {mesh_dim} (size "
                     "{size}) divides")


def _padded_shard_key(size, pieces, index):
  """Orders the dimensions a padded shard could cut: the smallest shard of
  the variable first (the fewest of its elements per processor, i.e. the
  least ceil(size / pieces) / size), then the largest dimension, then the
  first."""
  return (-(-size // pieces) / size, -size, index)


def default_data_mesh_dims(mesh_shape, layout_rules):
  """The mesh dimensions a dimension named like "batch" is split over.

  These are the data-parallel mesh dimensions: those that split every
  batch of examples (rules "batch:b", "outer_batch:rows", ...).
  """
  mesh_shape = shape_lib.convert_to_shape(mesh_shape)
  layout_rules = shape_lib.convert_to_layout_rules(layout_rules)
  names = {m for t, m in layout_rules if "batch" in t}
  return [d.name for d in mesh_shape if d.name in names]


class DataParallelSharding(extensions.MeshExtension):
  """Which dimension of each variable is split over the data-parallel dims.

  Attached to a mesh (`shard_data_parallel`), it plugs into the core as a
  mesh extension (see mesh_tensorflow.extensions): it chooses the storage
  of the mesh's variables and slots and the shape updates run in.

  Args:
    mesh_shape: the mesh shape the graph will be lowered on.
    layout_rules: the layout rules it will be lowered with.
    shard_weight_update: run each optimizer update on a shard (ZeRO-1/2).
    shard_parameters: also store the variables as shards (ZeRO-3); implies
      shard_weight_update.
    data_mesh_dims: the mesh dimension names to shard over; default: those
      that the batch is split over (`default_data_mesh_dims`).

  Attributes:
    decisions: ordered dict from variable name to a readable record of what
      was split over what, or why the variable was kept whole.
  """

  def __init__(self, mesh_shape, layout_rules, shard_weight_update=True,
               shard_parameters=False, data_mesh_dims=None):
    self.mesh_shape = shape_lib.convert_to_shape(mesh_shape)
    self.layout_rules = shape_lib.convert_to_layout_rules(layout_rules)
    self.shard_parameters = bool(shard_parameters)
    self.shard_weight_update = bool(shard_weight_update) or (
        self.shard_parameters)
    if data_mesh_dims is None:
      data_mesh_dims = default_data_mesh_dims(self.mesh_shape,
                                              self.layout_rules)
    mesh_names = [d.name for d in self.mesh_shape]
    for name in data_mesh_dims:
      if name not in mesh_names:
        raise errors.LayoutError(
            f"DataParallelSharding: data-parallel mesh dimension {name!r} "
            f"is not a dimension of the mesh {self.mesh_shape.to_string}.")
    self.data_mesh_dims = [d for d in self.mesh_shape
                           if d.name in data_mesh_dims]
    self.decisions = collections.OrderedDict()

  def __repr__(self):
    return (f"DataParallelSharding(mesh={self.mesh_shape.to_string!r}, "
            f"data_mesh_dims={[d.name for d in self.data_mesh_dims]}, "
            f"shard_weight_update={self.shard_weight_update}, "
            f"shard_parameters={self.shard_parameters})")

  def _mesh_dim_of(self, tensor_dim):
    """The name of the mesh dimension `tensor_dim` is split over, or None."""
    axis = self.layout_rules.tensor_dimension_to_mesh_axis(tensor_dim,
                                                           self.mesh_shape)
    return None if axis is None else self.mesh_shape[axis].name

  def update_shape(self, shape):
    """`shape` with one dimension per data-parallel mesh dimension renamed
    to its shard dimension: the largest unsplit dimension the mesh
    dimension's size divides (the first of equal ones). Deterministic, and
    idempotent: a shard dimension already counts as split."""
    shape, _ = self._plan(shape_lib.convert_to_shape(shape))
    return shape

  def _plan(self, shape):
    """(update shape, list of reasons a mesh dimension was not used)."""
    dims = list(shape.dims)
    used = {self._mesh_dim_of(d) for d in dims} - {None}
    reasons = []
    for mesh_dim in self.data_mesh_dims:
      if mesh_dim.name in used:
        if not any(shape_lib.split_shard_dimension_name(d.name)[1] ==
                   mesh_dim.name for d in dims):
          reasons.append(_SPLIT_ALREADY.format(mesh_dim=mesh_dim.name))
        continue
      unsplit = [i for i, d in enumerate(dims)
                 if self._mesh_dim_of(d) is None and d.size > 0]
      candidates = [i for i in unsplit if dims[i].size % mesh_dim.size == 0]
      if candidates:
        best = max(candidates, key=lambda i: (dims[i].size, -i))
      elif self.layout_rules.allow_uneven and any(
          dims[i].size > 1 for i in unsplit):
        # A dimension of 1 would be padded to a whole copy on every
        # processor: never worth it.
        best = min((i for i in unsplit if dims[i].size > 1),
                   key=lambda i: _padded_shard_key(dims[i].size,
                                                   mesh_dim.size, i))
      else:
        reasons.append(_NO_DIVISIBLE_DIM.format(mesh_dim=mesh_dim.name,
                                                size=mesh_dim.size))
        continue
      base, _ = shape_lib.split_shard_dimension_name(dims[best].name)
      dims[best] = shape_lib.Dimension(
          shape_lib.shard_dimension_name(base, mesh_dim.name),
          dims[best].size)
      used.add(mesh_dim.name)
    return shape_lib.Shape(dims), reasons

  def plan_variable(self, name, shape):
    """The update shape of variable `name`, recording the decision."""
    shape = shape_lib.convert_to_shape(shape)
    update_shape, reasons = self._plan(shape)
    split = []
    mesh_sizes = {m.name: m.size for m in self.mesh_shape}
    for d in update_shape.dims:
      mesh_dim = shape_lib.split_shard_dimension_name(d.name)[1]
      if mesh_dim is not None:
        pieces = mesh_sizes.get(mesh_dim, 1)
        padded = -(-d.size // pieces) * pieces
        split.append(f"{d.name} over {mesh_dim}" + (
            f" (padded {d.size} -> {padded})" if padded != d.size else ""))
    record = "; ".join(
        (["sharded: " + ", ".join(split)] if split else []) +
        (["kept whole: " + ", ".join(reasons)] if reasons else []))
    if name not in self.decisions:
      self.decisions[name] = record
      if reasons and not split:
        logging.info("Data-parallel sharding leaves %s %s whole: %s.", name,
                     shape, ", ".join(reasons))
    return update_shape

  def create_variable(self, next_creator, request):
    """Stores parameters (with shard_parameters) and optimizer slots (with
    shard_weight_update) in their update shape."""
    if self.shard_parameters if request.slot_of is None else (
        self.shard_weight_update):
      request = request.replace(
          storage_shape=self.plan_variable(request.name, request.shape))
    return next_creator(request)

  def update_view(self, grad, variable):
    """The gradient renamed to the variable's update shape (its pending sum
    becomes a reduce-scatter) and a view whose assignments gather."""
    if not self.shard_weight_update:
      return grad, variable
    update_shape = self.plan_variable(variable.name, variable.shape)
    if update_shape == variable.shape:
      return grad, variable
    return (reshapes.reshape(grad, update_shape),
            variables_lib.VariableView(variable, update_shape))

  def check_lowering(self, mesh_impl, mesh):
    self.check_mesh(mesh_impl.shape, mesh.name)

  def check_mesh(self, mesh_impl_shape, mesh_name):
    """Raises LayoutError unless lowering on `mesh_impl_shape` matches."""
    if shape_lib.convert_to_shape(mesh_impl_shape) != self.mesh_shape:
      raise errors.LayoutError(
          f"Mesh {mesh_name!r} was sharded for data parallelism on mesh "
          f"{self.mesh_shape.to_string} (mtf.shard_data_parallel), but is "
          f"lowered on {shape_lib.convert_to_shape(mesh_impl_shape).to_string}"
          "; pass the mesh shape you lower on.")


def base_shape(shape):
  """`shape` with every shard dimension renamed back to its base name."""
  return shape_lib.Shape([
      shape_lib.Dimension(shape_lib.split_shard_dimension_name(d.name)[0],
                          d.size)
      for d in shape_lib.convert_to_shape(shape).dims])


def shard_data_parallel(mesh, mesh_shape, layout_rules,
                        shard_weight_update=True, shard_parameters=False,
                        data_mesh_dims=None):
  """Shards weight updates (and optionally parameters) of `mesh`'s variables.

  Call it after creating the mtf.Mesh and before creating variables and
  calling an optimizer's `apply_grads`. See the module docstring.

  Args:
    mesh: the mtf.Mesh.
    mesh_shape, layout_rules: what the graph will be lowered with.
    shard_weight_update: shard the optimizer's update and slots (ZeRO-1/2).
    shard_parameters: shard the variables themselves too (ZeRO-3).
    data_mesh_dims: mesh dimension names to shard over (default: those the
      batch is split over).

  Returns:
    the DataParallelSharding (see `sharding_of`), or None when neither is
    asked for (which removes the mesh's sharding).
  """
  if not (shard_weight_update or shard_parameters):
    mesh.remove_extension(DataParallelSharding)
    return None
  sharding = DataParallelSharding(
      mesh_shape, layout_rules, shard_weight_update=shard_weight_update,
      shard_parameters=shard_parameters, data_mesh_dims=data_mesh_dims)
  if sharding.shard_parameters:
    existing = [v.name for v in mesh.graph.all_variables
                if v.mesh is mesh][:3]
    if existing:
      raise ValueError(
          f"Mesh {mesh.name!r}: sharded parameters must be asked for "
          f"before variables are created; {existing} exist already.")
  mesh.add_extension(sharding)
  return sharding


def sharding_of(mesh):
  """The DataParallelSharding of `mesh`, or None."""
  return mesh.extension(DataParallelSharding)
