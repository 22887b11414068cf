"""PlacementMeshImpl: one TensorFlow op per processor, placed with tf.device.

Every slicewise computation is emitted once per processor under that
processor's device, all in one program; collectives move slices between
devices. This is the CPU/GPU mesh implementation.

Collectives reduce or gather onto one member of each group and hand the result
to the others. Between logical CPUs of one host this moves each byte once and
keeps the op count at O(group size), where the original library's ring
algorithms used O(group size^2) small ops and made an 8-way data-parallel step
2.5x slower than one device. Allreduces among distinct GPUs of one machine use
NCCL (graph and tf.function mode), which spreads the traffic over all links.
The original's ring collectives are here too, as public functions on lists of
per-device tensors (`allreduce_ring`, `allreduce_ring_single_shard`,
`allconcat_ring`, `alltoall_ring`, `alltoall_pointtwise`, from
`placement_collectives`), and PlacementMeshImpl uses them with
`allreduce_algorithm="ring"`.
"""

from absl import logging
import tensorflow as tf
from tensorflow.python.ops import nccl_ops  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import errors
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import placement_collectives
from mesh_tensorflow.backend import placement_variables
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.randomness import stateless_uniform

LaidOutTensor = mesh_impl_lib.LaidOutTensor
LaidOutVariable = placement_variables.LaidOutVariable

# The original library's collectives on lists of per-device tensors.
allconcat_ring = placement_collectives.allconcat_ring
allreduce_ring = placement_collectives.allreduce_ring
allreduce_ring_single_shard = placement_collectives.allreduce_ring_single_shard
alltoall_pointtwise = placement_collectives.alltoall_pointtwise
alltoall_ring = placement_collectives.alltoall_ring
reduce_scatter_ring = placement_collectives.reduce_scatter_ring

_ALGORITHMS = ("auto", "gather", "nccl", "ring")


def local_devices():
  """This process's devices for a mesh: all GPUs if there are any, else all
  logical CPUs."""
  devices = [d.name for d in tf.config.list_logical_devices("GPU")]
  return devices or [d.name for d in tf.config.list_logical_devices("CPU")]


def default_devices(num_processors):
  """Distinct local devices for `num_processors` processors.

  The first of `local_devices()`; when there are fewer devices than
  processors they are used round-robin, with a warning (the collectives
  here are plain ops between devices, which processors sharing a device
  cannot deadlock; SimdMeshImpl's refuse such a mesh instead).
  """
  devices = local_devices()
  if len(devices) < num_processors:
    logging.warning(
        "Mesh has %d processors but only %d devices (%s); several processors "
        "will share a device.", num_processors, len(devices), devices)
  return [devices[i % len(devices)] for i in range(num_processors)]


class PlacementMeshImpl(mesh_impl_lib.MeshImpl):
  """Mesh implementation with one set of TF ops per processor.

  Args:
    shape: the mesh shape, e.g. "rows:2;cols:4" or a list of Dimensions.
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    devices: one device string per processor in pnum order; None means
      distinct local devices (see `default_devices`). Devices of other tasks
      of a TF cluster ("/job:worker/task:1/device:CPU:0") are allowed.
    allreduce_algorithm: "gather" reduces onto one member of each group and
      copies the result back (best between logical CPUs, and the fallback);
      "nccl" uses NCCL all-reduce, for groups of distinct GPUs of one task
      in graph or tf.function mode; "auto" picks NCCL where it applies;
      "ring" uses the original library's `allreduce_ring` and
      `allconcat_ring`, and `reduce_scatter_ring` (data moves only between
      ring neighbours).
    share_replicas: whether processors holding the same slice of a tensor
      (replicas along mesh dimensions the tensor is not split over) share
      one computation of it. None (the default) means yes when every
      device is a CPU of one task: logical CPUs share memory and cores, so
      a replica's copy and its repeated work are pure cost (on
      batch:2;model:4, everything of size d_model was computed 4 times).
      Values are identical either way; each processor keeps its own
      variables.
  """

  LaidOutVariable = LaidOutVariable

  def __init__(self, shape, layout, devices=None, *,
               allreduce_algorithm="auto", share_replicas=None):
    super().__init__(shape, layout)
    if allreduce_algorithm not in _ALGORITHMS:
      raise ValueError(
          f"PlacementMeshImpl allreduce_algorithm must be one of "
          f"{_ALGORITHMS}, got {allreduce_algorithm!r}.")
    self._allreduce_algorithm = allreduce_algorithm
    if devices is None:
      devices = default_devices(self.size)
    devices = list(devices)
    if len(devices) != self.size:
      raise errors.LayoutError(
          f"PlacementMeshImpl for mesh {self.shape.to_string} needs "
          f"{self.size} devices (one per processor), got {len(devices)}: "
          f"{devices}.")
    self._devices = devices
    if share_replicas is None:
      share_replicas = _one_task_cpus(devices)
    self._share_replicas = bool(share_replicas)
    self._sources = {}

  @property
  def devices(self):
    return list(self._devices)

  @property
  def share_replicas(self):
    return self._share_replicas

  def replica_sources(self, tensor_shape):
    """Per processor, the processor whose copy of its slice of a tensor of
    `tensor_shape` it uses: the first with the same slice when replicas
    are shared, else itself."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    if not self._share_replicas:
      return list(range(self.size))
    key = (tuple(tensor_shape.to_integer_list), tuple(self.tensor_layout(
        tensor_shape)))
    if key not in self._sources:
      first = {}
      self._sources[key] = [
          first.setdefault(tuple(self.slice_begin(tensor_shape, p)), p)
          for p in range(self.size)]
    return self._sources[key]

  # ----------------------------------------------------------- computation

  def slicewise(self, fn, *inputs):
    inputs = mesh_impl_lib.convert_args_to_laid_out_tensors(inputs)
    results = [None] * self.size
    done = {}  # With shared replicas: the same arguments, the same result.
    idle = self._context.idle
    if len(idle) >= self.size:
      idle = frozenset()
    order = range(self.size)
    if idle:
      # Busy processors first: an idle one gets zeros shaped like theirs.
      order = ([p for p in order if p not in idle] +
               [p for p in order if p in idle])
    for pnum in order:
      device = self._devices[pnum]
      if pnum in idle and _static_tensors(results[order[0]]):
        with tf.device(device):
          results[pnum] = tf.nest.map_structure(
              lambda t: tf.zeros(t.shape, t.dtype), results[order[0]])
        continue
      args = [x.tensor_list[pnum] if isinstance(x, LaidOutTensor) else x
              for x in inputs]
      key = tuple(id(a) for a in args)
      if self._share_replicas and key in done:
        results[pnum] = done[key]
        continue
      with tf.device(device):
        results[pnum] = fn(*args)
      done[key] = results[pnum]
    if isinstance(results[0], tuple):
      return tuple(LaidOutTensor(list(r)) for r in zip(*results))
    return LaidOutTensor(results)

  def laid_out_pnum(self):
    return LaidOutTensor(list(range(self.size)))

  # ----------------------------------------------------------- collectives

  def _gather_device(self, group, group_index):
    """Spreads the work of different groups over their members' devices."""
    return self._devices[group[group_index % len(group)]]

  def allreduce(self, x, mesh_axes, reduction_fn_string):
    x = x.to_laid_out_tensor()
    mesh_axes = sorted(mesh_axes)
    if not mesh_axes or all(self.shape[a].size == 1 for a in mesh_axes):
      return x
    self._count_collective("allreduce", mesh_axes, x)
    dtype = x.tensor_list[0].dtype
    placement_collectives.binary_reduction(reduction_fn_string, dtype)
    out = [None] * self.size
    reduced = {}
    for group_index, group in enumerate(self.processor_groups(mesh_axes)):
      if self._allreduce_algorithm == "ring":
        ys = allreduce_ring([x.tensor_list[p] for p in group],
                            [self._devices[p] for p in group],
                            reduction_fn_string)
        for p, y in zip(group, ys):
          out[p] = y
        continue
      if self._use_nccl(group, dtype):
        slices = []
        for p in group:
          with tf.device(self._devices[p]):
            slices.append(tf.identity(x.tensor_list[p]))
        for p, y in zip(group, _NCCL_REDUCTIONS[reduction_fn_string](slices)):
          out[p] = y
        continue
      key = tuple(id(x.tensor_list[p]) for p in group)
      if self._share_replicas and key in reduced:
        total = reduced[key]  # Another group with the very same inputs.
      else:
        with tf.device(self._gather_device(group, group_index)):
          total = placement_collectives.reduce_list(
              [x.tensor_list[p] for p in group], reduction_fn_string)
        reduced[key] = total
      for p in group:
        out[p] = self._hand_over(total, p)
    return LaidOutTensor(out)

  def _use_nccl(self, group, dtype):
    """Whether to all-reduce `group` with NCCL (see allreduce_algorithm)."""
    if (self._allreduce_algorithm in ("gather", "ring") or
        tf.executing_eagerly()):
      return False
    if dtype not in _NCCL_DTYPES:
      return False
    specs = [tf.DeviceSpec.from_string(self._devices[p]) for p in group]
    distinct_gpus = (
        all(s.device_type == "GPU" for s in specs) and
        len({(s.job, s.replica, s.task) for s in specs}) == 1 and
        len({s.device_index for s in specs}) == len(specs))
    if self._allreduce_algorithm == "nccl" and not distinct_gpus:
      raise ValueError(
          "allreduce_algorithm='nccl' needs distinct GPUs of one task for "
          f"each group, got {[self._devices[p] for p in group]}.")
    return distinct_gpus

  def allconcat(self, x, mesh_axis, concat_axis, stack=False):
    """See MeshImpl.allconcat; `stack` stacks the slices on a new axis
    `concat_axis` instead (as SimdMeshImpl.allconcat's)."""
    x = x.to_laid_out_tensor()
    if self.shape[mesh_axis].size == 1:
      if stack:
        return self.slicewise(lambda t: tf.expand_dims(t, concat_axis), x)
      return x
    self._count_collective("allconcat", [mesh_axis], x)
    inputs = x.tensor_list
    if stack:
      inputs = []
      for device, t in zip(self._devices, x.tensor_list):
        with tf.device(device):
          inputs.append(tf.expand_dims(t, concat_axis))
    out = [None] * self.size
    concatenated = {}
    for group_index, group in enumerate(self.processor_groups([mesh_axis])):
      if self._allreduce_algorithm == "ring":
        ys = allconcat_ring([inputs[p] for p in group],
                            [self._devices[p] for p in group], concat_axis)
        for p, y in zip(group, ys):
          out[p] = y
        continue
      key = tuple(id(inputs[p]) for p in group)
      if self._share_replicas and key in concatenated:
        whole = concatenated[key]
      else:
        with tf.device(self._gather_device(group, group_index)):
          whole = tf.concat([inputs[p] for p in group], axis=concat_axis)
        concatenated[key] = whole
      for p in group:
        out[p] = self._hand_over(whole, p)
    return LaidOutTensor(out)

  def _hand_over(self, value, pnum):
    """`value` for processor `pnum`: a copy on its device, or the value
    itself when replicas are shared."""
    if self._share_replicas:
      return value
    with tf.device(self._devices[pnum]):
      return tf.identity(value)

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    x = x.to_laid_out_tensor()
    if self.shape[mesh_axis].size == 1:
      return x
    self._count_collective("alltoall", [mesh_axis], x)
    out = [None] * self.size
    exchanged = {}  # Groups holding the same (shared) slices: done once.
    for group in self.processor_groups([mesh_axis]):
      key = tuple(id(x.tensor_list[p]) for p in group)
      if self._share_replicas and key in exchanged:
        ys = exchanged[key]
      else:
        ys = alltoall_pointtwise([x.tensor_list[p] for p in group],
                                 [self._devices[p] for p in group],
                                 split_axis, concat_axis)
        exchanged[key] = ys
      for p, y in zip(group, ys):
        out[p] = y
    return LaidOutTensor(out)

  def reduce_scatter(self, x, mesh_axis, split_axis,
                     reduction_fn_string="SUM"):
    """See MeshImpl.reduce_scatter.

    One owner per piece: member k's device reduces piece k of every
    member's slice, so each byte moves once and the reduction work is
    spread over the group (the allreduce's design, 1/n of it per member).
    Groups holding the very same slices (shared replicas) are done once.
    With allreduce_algorithm="ring", pieces travel around the ring
    (`reduce_scatter_ring`). NCCL has no reduce-scatter here: GPU groups
    use the owner design too.
    """
    x = x.to_laid_out_tensor()
    n = self.shape[mesh_axis].size
    if n == 1:
      return x
    self._count_collective("reduce_scatter", [mesh_axis], x)
    placement_collectives.binary_reduction(reduction_fn_string,
                                           x.tensor_list[0].dtype)
    out = [None] * self.size
    pieces = {}  # id(slice) -> its n pieces, split on its own device.
    reduced = {}
    for group in self.processor_groups([mesh_axis]):
      inputs = [x.tensor_list[p] for p in group]
      key = tuple(id(t) for t in inputs)
      if self._share_replicas and key in reduced:
        ys = reduced[key]
      elif self._allreduce_algorithm == "ring":
        ys = reduce_scatter_ring(inputs, [self._devices[p] for p in group],
                                 split_axis, reduction_fn_string)
      else:
        for p, t in zip(group, inputs):
          if id(t) not in pieces:
            with tf.device(self._devices[p]):
              pieces[id(t)] = tf.split(t, n, axis=split_axis)
        ys = []
        for k, owner in enumerate(group):
          with tf.device(self._devices[owner]):
            ys.append(placement_collectives.reduce_list(
                [pieces[id(t)][k] for t in inputs], reduction_fn_string))
      reduced[key] = ys
      for p, y in zip(group, ys):
        out[p] = y
    return LaidOutTensor(out)

  def receive(self, x, mesh_axis, source_pcoord):
    x = x.to_laid_out_tensor()
    self._count_collective("receive", [mesh_axis], x, source_pcoord)
    out = [None] * self.size
    for group in self.processor_groups([mesh_axis]):
      for p, source in zip(group, source_pcoord):
        with tf.device(self._devices[p]):
          if source is None:
            out[p] = tf.zeros_like(x.tensor_list[p])
          else:
            out[p] = tf.identity(x.tensor_list[group[source]])
    return LaidOutTensor(out)

  # ------------------------------------------------------ import / export

  def import_tf_tensor(self, x, tf_x):
    """Each processor's slice of `tf_x` (the value of mtf Tensor `x`)."""
    shape = mesh_impl_lib.full_shape_of(x, "PlacementMeshImpl.import_tf_tensor")
    slices = self.make_slices(tf.convert_to_tensor(tf_x), shape)
    out = []
    for pnum, (device, s) in enumerate(zip(self._devices, slices)):
      source = self.replica_sources(shape)[pnum]
      if source != pnum:
        out.append(out[source])
        continue
      with tf.device(device):
        out.append(tf.identity(s))
    return LaidOutTensor(out)

  def export_to_tf_tensor(self, x, laid_out_x):
    """The full value of mtf Tensor `x`, assembled on processor 0's
    device."""
    shape = mesh_impl_lib.full_shape_of(
        x, "PlacementMeshImpl.export_to_tf_tensor")
    laid_out_x = laid_out_x.to_laid_out_tensor()
    return self.combine_slices(laid_out_x.tensor_list, shape,
                               device=self._devices[0])

  # ------------------------------------------------------------- random

  def random(self, shape, tf_fn, kwargs):
    """Each processor computes its own slice (see MeshImpl.random); with
    shared replicas a small tensor is drawn once, whole, and sliced."""
    shape = shape_lib.convert_to_shape(shape)
    sources = self.replica_sources(shape)
    whole = None
    if (self._share_replicas and len(set(sources)) > 1 and
        shape.size <= stateless_uniform.WHOLE_TENSOR_ELEMENTS):
      with tf.device(self._devices[0]):
        whole = self._random_sampler(shape, tf_fn, kwargs, whole=True)(
            [0] * shape.ndims)
        # Slices of an uneven split reach into the padding (zeroed after).
        whole = padding.pad_full(whole, self.padded_axes(shape))
    else:
      sample = self._random_sampler(shape, tf_fn, kwargs)
    slice_shape = self.slice_shape(shape)
    out = []
    for pnum, device in enumerate(self._devices):
      if sources[pnum] != pnum:
        out.append(out[sources[pnum]])
        continue
      begin = self.slice_begin(shape, pnum)
      with tf.device(device):
        out.append(sample(begin) if whole is None else
                   slice_utils.tf_slice(whole, begin, slice_shape))
    return LaidOutTensor(out)

  # ---------------------------------------------------------- variables

  @property
  def supports_autostack(self):
    return self.size > 1

  def make_laid_out_variable(self, variable, stack_group=None):
    return LaidOutVariable(variable, self, stack_group)

  def assign_to_variables(self, laid_out_variables, laid_out_values,
                          assign_fn):
    return placement_variables.assign_to_variables(
        laid_out_variables, laid_out_values, assign_fn)


def _one_task_cpus(devices):
  """True if every device is a CPU of one task (logical CPUs of a host)."""
  specs = [tf.DeviceSpec.from_string(d) for d in devices]
  return (all((s.device_type or "").upper() == "CPU" for s in specs) and
          len({(s.job, s.replica, s.task) for s in specs}) == 1)


_NCCL_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
_NCCL_REDUCTIONS = {
    "SUM": nccl_ops.all_sum,
    "MAX": nccl_ops.all_max,
    "MIN": nccl_ops.all_min,
}


def _static_tensors(result):
  """Whether `result` (a slice or a tuple of them) is TF tensors of fully
  known shapes, so zeros can stand for it (tf.zeros of the shape, made on
  the idle processor's device, reads nothing from the busy one)."""
  return all(isinstance(t, tf.Tensor) and t.shape.is_fully_defined()
             for t in tf.nest.flatten(result))
