"""SimdMeshImpl: one SPMD program, run by every processor.

Lowering onto a SimdMeshImpl emits the program of ONE processor: a laid-out
tensor is a single slice, `slicewise` calls the slice function once, and the
processor number is an input of the program. Collectives find their group
from that number at run time, so the program is traced once whatever the
number of processors (the property that keeps lowering time flat as the mesh
grows).

Run a program with `mesh_impl.run(fn, *args)`: `fn` builds the mtf graph,
lowers it onto this mesh implementation and returns TF tensors (e.g.
`lowering.export_to_tf_tensor(loss)`, the same on every processor). `run`
traces `fn` once as a concrete function of (processor number, *args) and
calls it once per device; what processor 0 returns is the result. In eager
mode the calls are dispatched from a tf.function, since every processor
must be running for a collective to complete.

Collective back ends: "host" (simd_collectives: TF's collective ops,
CPU/GPU) and "tpu" (tpu_collectives: XLA TPU collectives, group assignments
in physical replica ids through `logical_to_physical`). With a
`tf.distribute.TPUStrategy` (`strategy=`), `run` is `strategy.run` of the
program, whose processor number comes from the replica id; without one,
`run` calls the program once per local device. `make_simd_mesh_impl` picks
the back end from the strategy, so the same user code runs on both.

The original's TPU placement helpers (`HierarchicalTiling`,
`auto_logical_to_physical_tpu`, `physical_shape_3d_from_topology_proto_4d`)
live in `tpu_topology` and are re-exported here under their original module.
"""

import contextlib
import functools
import threading

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import configurable as configurable_lib
from mesh_tensorflow.storage import checkpointing
from mesh_tensorflow import errors
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import placement_variables
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import collective_deadline
from mesh_tensorflow.backend import simd_collectives
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.backend import tpu_collectives
from mesh_tensorflow.backend import tpu_topology
from mesh_tensorflow import tpu_variables
from mesh_tensorflow.storage import variable_store as variable_store_lib

LaidOutTensor = mesh_impl_lib.LaidOutTensor
RANDOM_STEP = "mtf_random_step"

HierarchicalTiling = tpu_topology.HierarchicalTiling
auto_logical_to_physical_tpu = tpu_topology.auto_logical_to_physical_tpu
physical_shape_3d_from_topology_proto_4d = (
    tpu_topology.physical_shape_3d_from_topology_proto_4d)


@configurable_lib.configurable
class SimdMeshImpl(mesh_impl_lib.MeshImpl):
  """Mesh implementation lowering to one program run by every processor.

  Args:
    shape: the mesh shape, e.g. "b:2;m:4".
    layout: layout rules, e.g. "batch:b;hidden:m".
    devices: one distinct device per physical processor, in physical
      (replica) order (default: the strategy's TPU cores, else the devices
      of `device_assignment`, else the first local devices: GPUs, else
      logical CPUs). Logical processor p runs on
      devices[logical_to_physical[p]]. Unlike PlacementMeshImpl, processors
      never share a device: a collective waits for every processor of its
      group, and two on one device would wait for each other forever, so a
      mesh larger than the devices is an error.
    device_assignment: a tf.tpu.experimental.DeviceAssignment (TPU).
    logical_to_physical: a permutation of processor numbers (default:
      identity).
    allreduce_in_bfloat16_max_group_size: TPU: bfloat16 sums over larger
      groups are done in float32.
    collectives: "host" or "tpu".
    collective_timeout_seconds: host back end: a collective whose group
      does not complete it in this time fails (with a DeadlineExceededError
      naming the mesh; default simd_collectives.DEFAULT_TIMEOUT_SECONDS).
    strategy: a tf.distribute.TPUStrategy with one replica per processor;
      `run` then runs the program through it (collectives "tpu" only).
  """

  def __init__(self, shape, layout, devices=None, device_assignment=None,
               logical_to_physical=None,
               allreduce_in_bfloat16_max_group_size=8, collectives="host",
               collective_timeout_seconds=None, strategy=None):
    super().__init__(shape, layout)
    if collectives not in ("host", "tpu"):
      raise ValueError(f"SimdMeshImpl collectives={collectives!r}: expected "
                       "'host' (TF collective ops on CPU/GPU) or 'tpu'.")
    if strategy is not None and collectives != "tpu":
      raise ValueError("SimdMeshImpl: a strategy runs TPU programs; use "
                       "collectives='tpu' with it.")
    if logical_to_physical is None:
      logical_to_physical = list(range(self.size))
    logical_to_physical = [int(p) for p in logical_to_physical]
    if sorted(logical_to_physical) != list(range(self.size)):
      raise ValueError(
          f"SimdMeshImpl logical_to_physical={logical_to_physical} is not a "
          f"permutation of range({self.size}) for mesh {self.shape.to_string}.")
    self._logical_to_physical = logical_to_physical
    self._physical_to_logical = [0] * self.size
    for logical, physical in enumerate(logical_to_physical):
      self._physical_to_logical[physical] = logical
    _check_replicas(self.shape, strategy)
    if devices is None:
      devices = _default_devices(self.shape, strategy, device_assignment)
    devices = list(devices)
    _check_devices(self.shape, devices)
    self._physical_devices = devices
    self._devices = [devices[p] for p in logical_to_physical]
    self._device_assignment = device_assignment
    self._strategy = strategy
    # Per thread, so that several programs can be traced and run at once:
    # `pnum`, the processor number of the program being traced (set by
    # `run` around it), and `last`, the last program `run` traced, as
    # (fn, signature, concrete function, eager dispatcher).
    self._program = threading.local()
    self._tokens = None
    self._per_device_captures = {}
    self._replicated = {}  # id(slice list) -> ReplicatedVariable (TPU)
    self._timeout = None
    if collectives == "host":
      self._collectives = simd_collectives.HostCollectives(
          self._devices, self._current_pnum, self._current_token,
          timeout_seconds=collective_timeout_seconds)
      self._timeout = self._collectives.timeout_seconds
      self._token_variables()
    else:
      self._collectives = tpu_collectives.TpuCollectives(
          logical_to_physical, self._current_pnum,
          allreduce_in_bfloat16_max_group_size)

  @property
  def logical_to_physical(self):
    return list(self._logical_to_physical)

  def l2p(self, logical_pnum):
    """The physical processor (TPU replica) number of a logical one."""
    return self._logical_to_physical[logical_pnum]

  def p2l(self, physical_pnum):
    """The logical processor number of a physical one."""
    return self._physical_to_logical[physical_pnum]

  @property
  def device_assignment(self):
    """The tf.tpu.experimental.DeviceAssignment given, or None."""
    return self._device_assignment

  @property
  def supports_control_dependencies(self):
    # XLA ignores control dependencies.
    return self._collectives.name != "tpu"

  @property
  def strategy(self):
    return self._strategy

  @property
  def devices(self):
    """The device of each logical processor."""
    return list(self._devices)

  @property
  def collectives(self):
    return self._collectives

  # ------------------------------------------------------------- running

  @property
  def pnum_tensor(self):
    """The processor number of the program being traced (int32 scalar)."""
    return self._current_pnum()

  def _current_pnum(self):
    pnum = getattr(self._program, "pnum", None)
    if pnum is None:
      raise errors.LayoutError(
          "SimdMeshImpl lowers the program of one processor and needs its "
          "processor number: build and lower inside mesh_impl.run(fn).")
    return pnum

  def _token_variables(self):
    if self._tokens is None:
      with tf.init_scope():
        tokens = []
        for pnum, device in enumerate(self._devices):
          with tf.device(device):
            tokens.append(variable_store_lib.plain_variable(
                0, name=f"ordering_token_{pnum}", trainable=False))
        self._tokens = tokens
        self._register_per_device([t.handle for t in tokens])
    return self._tokens

  def _current_token(self):
    return self._token_variables()[0].handle

  def _register_per_device(self, handles):
    """Calls of the program on device p get handles[p] for handles[0]."""
    self._per_device_captures[id(handles[0])] = handles

  def run(self, fn, *args):
    """Runs `fn(*args)` as one SPMD program on every processor.

    Args:
      fn: builds and lowers an mtf graph on this mesh implementation and
        returns a structure of tf.Tensors (the same on every processor, e.g.
        exported mtf tensors); may return None.
      *args: tf.Tensors (or values convertible to them) passed to fn.

    Returns:
      processor 0's result.
    """
    return self.run_each(fn, *args)[0]

  def run_each(self, fn, *args):
    """Like `run`, returning the list of every processor's result."""
    args = [tf.convert_to_tensor(a) for a in args]
    if self._strategy is not None:
      return self._run_with_strategy(fn, args)
    if isinstance(getattr(self._collectives, "primitives", None),
                  tpu_collectives.TpuPrimitives):
      raise errors.LayoutError(
          "SimdMeshImpl with TPU collectives runs under a TPUStrategy: "
          "pass strategy= (see make_simd_mesh_impl).")
    signature = tuple(tf.TensorSpec(a.shape, a.dtype) for a in args)
    cached = getattr(self._program, "last", None)
    if cached is None or cached[0] is not fn or cached[1] != signature:
      concrete = self.trace_program(fn, *signature)
      # One function calling the program on every device (so that all of
      # its collectives are in flight together), kept as a function of its
      # own when called from the user's tf.function ("_noinline").
      dispatcher = tf.function(
          functools.partial(self._dispatch, concrete), autograph=False,
          experimental_attributes={"_noinline": True})
      cached = self._program.last = (fn, signature, concrete, dispatcher)
    _, _, _, dispatcher = cached
    with _without_graph_optimizer(), self.collective_errors():
      return dispatcher(*args)

  @contextlib.contextmanager
  def collective_errors(self, steps=1):
    """Bounds the host collectives run inside (by collective_timeout_seconds
    per step, for `steps` steps) and re-raises their timeout as a
    DeadlineExceededError naming this mesh, its devices and the limit.

    `run` called eagerly does this itself; a caller running `run` inside
    its own tf.function wraps the function's calls in this (the estimator
    does, with the steps of one loop).
    """
    if self._timeout is None:
      yield
      return
    try:
      with collective_deadline.deadline(
          self._timeout * max(1, steps),
          f"{_mesh_name(self.shape)}: collectives waited longer than "
          f"{self._timeout:g} s per step"):
        yield
    except tf.errors.OpError as e:
      if self._timeout is None or not simd_collectives.is_timeout(e):
        raise
      raise tf.errors.DeadlineExceededError(
          None, None,
          f"{_mesh_name(self.shape)} on {self._devices}: a collective did "
          f"not complete within {self._timeout:g} s "
          "(collective_timeout_seconds): a processor never reached it (a "
          "task of the cluster that froze or died, or a program whose "
          "processors took different branches). TensorFlow's collectives "
          "stay aborted in this process: restart it (training resumes from "
          "the last checkpoint). If a step legitimately takes longer, raise "
          "collective_timeout_seconds.") from e

  def trace_program(self, fn, *signature):
    """The concrete function of fn's program, taking (pnum, *args).

    `signature` holds tf.TensorSpecs of fn's arguments. Useful to look at
    the program of one processor (e.g. the TPU collectives it calls).
    """

    def program(pnum, *program_args):
      with self._processor(pnum):
        return fn(*program_args)

    return tf.function(program, autograph=False).get_concrete_function(
        tf.TensorSpec([], tf.int32), *signature)

  @contextlib.contextmanager
  def _processor(self, pnum):
    previous = getattr(self._program, "pnum", None)
    self._program.pnum = pnum
    try:
      yield
    finally:
      self._program.pnum = previous

  def _run_with_strategy(self, fn, args):
    """strategy.run of the program; each replica finds its processor
    number from its (physical) replica id."""
    def replica_fn(*replica_args):
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      pnum = tf.gather(tf.constant(self._physical_to_logical, tf.int32),
                       tf.cast(replica, tf.int32))
      with self._processor(pnum):
        return fn(*replica_args)

    results = self._strategy.run(replica_fn, args=tuple(args))
    local = list(self._strategy.experimental_local_results(results))
    if len(local) != self.size:  # Several hosts: this host's replicas.
      return local
    return [local[physical] for physical in self._logical_to_physical]

  def program_variable(self, name, slices):
    """The variable the program reads and assigns for per-processor
    `slices` (in logical processor order): slice 0, substituted per device
    by `run` (host), or a ReplicatedVariable over the cores (TPU)."""
    if self._collectives.name != "tpu":
      return slices[0]
    key = id(slices[0])
    with self.variable_store.lock:  # Lowerings on several threads share it.
      if key not in self._replicated:
        replicated = tpu_variables.ReplicatedVariable(
            name, [slices[logical] for logical in self._physical_to_logical])
        # Outside a TPU replicate context it stands for its first variable
        # (physical processor 0's); calls per device substitute their own.
        self._per_device_captures[id(replicated.variables[0].handle)] = [
            v.handle for v in slices]
        self._replicated[key] = replicated
      return self._replicated[key]

  def _dispatch(self, concrete, *args):
    """Calls `concrete` once per device, each with its own variables."""
    results = []
    for pnum, device in enumerate(self._devices):
      captures = []
      for c in concrete.captured_inputs:
        per_device = self._per_device_captures.get(id(c))
        captures.append(c if per_device is None else per_device[pnum])
      with tf.device(device):
        results.append(concrete._call_flat(  # pylint: disable=protected-access
            [tf.constant(pnum, tf.int32)] + list(args), captures))
    return results

  # --------------------------------------------------------- computation

  def slicewise(self, fn, *inputs):
    inputs = mesh_impl_lib.convert_args_to_laid_out_tensors(inputs)
    args = [x.tensor_list[0] if isinstance(x, LaidOutTensor) else x
            for x in inputs]
    result = fn(*args)
    if isinstance(result, tuple):
      return tuple(LaidOutTensor([r]) for r in result)
    return LaidOutTensor([result])

  def laid_out_pnum(self):
    return LaidOutTensor([self.pnum_tensor])

  def _pcoord(self, mesh_axis):
    stride = shape_lib.list_product(
        self.shape.to_integer_list[mesh_axis + 1:])
    return (self.pnum_tensor // stride) % self.shape[mesh_axis].size

  def _slice_begin_tensor(self, tensor_shape):
    """This processor's slice offsets: ints or int32 scalar tensors."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    slice_shape = self.slice_shape(tensor_shape)
    return [0 if mesh_axis is None else
            self._pcoord(mesh_axis) * slice_shape[tensor_axis]
            for tensor_axis, mesh_axis in enumerate(
                self.tensor_layout(tensor_shape))]

  # ---------------------------------------------------------- collectives

  def allreduce(self, x, mesh_axes, reduction_fn_string):
    x = x.to_laid_out_tensor()
    mesh_axes = sorted(mesh_axes)
    if not mesh_axes or all(self.shape[a].size == 1 for a in mesh_axes):
      return x
    if reduction_fn_string not in ("SUM", "MAX", "MIN"):
      raise ValueError(f"Unknown reduction {reduction_fn_string!r}; "
                       "expected SUM, MAX or MIN.")
    self._count_collective("allreduce", mesh_axes, x)
    t = x.one_slice
    reduced = self._collectives.all_reduce(
        t, self.processor_groups(mesh_axes), reduction_fn_string)
    reduced.set_shape(t.shape)
    return LaidOutTensor([reduced])

  def _gather_on_axis0(self, t, mesh_axis):
    """[group size * d0, ...]: the group's slices stacked in order."""
    gathered = self._collectives.all_gather(
        t, self.processor_groups([mesh_axis]))
    shape = slice_utils.static_shape(t)
    gathered.set_shape([shape[0] * self.shape[mesh_axis].size] + shape[1:])
    return gathered

  def allconcat(self, x, mesh_axis, concat_axis, stack=False):
    """See MeshImpl.allconcat; with `stack`, the group's slices are stacked
    on a new axis `concat_axis` instead of concatenated."""
    x = x.to_laid_out_tensor()
    if stack:
      x = self.slicewise(lambda t: tf.expand_dims(t, concat_axis), x)
    n = self.shape[mesh_axis].size
    if n == 1:
      return x
    self._count_collective("allconcat", [mesh_axis], x)
    t = x.one_slice
    moved = _move_axis_to_front(t, concat_axis)
    gathered = self._gather_on_axis0(moved, mesh_axis)
    return LaidOutTensor([_move_front_axis_to(gathered, concat_axis)])

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    x = x.to_laid_out_tensor()
    n = self.shape[mesh_axis].size
    if n == 1:
      return x
    self._count_collective("alltoall", [mesh_axis], x)
    t = x.one_slice
    # Blocks to send, stacked on a new front axis, travel as one tensor.
    pieces = tf.stack(tf.split(t, n, axis=split_axis))
    received = self._collectives.all_to_all(
        pieces, self.processor_groups([mesh_axis]))
    received = tf.unstack(tf.reshape(received, pieces.shape), num=n)
    return LaidOutTensor([tf.concat(received, axis=concat_axis)])

  def reduce_scatter(self, x, mesh_axis, split_axis,
                     reduction_fn_string="SUM"):
    """See MeshImpl.reduce_scatter. The back end's `reduce_scatter` takes
    the slice cut into group-size pieces stacked on a new front axis."""
    x = x.to_laid_out_tensor()
    n = self.shape[mesh_axis].size
    if n == 1:
      return x
    if reduction_fn_string not in ("SUM", "MAX", "MIN"):
      raise ValueError(f"Unknown reduction {reduction_fn_string!r}; "
                       "expected SUM, MAX or MIN.")
    self._count_collective("reduce_scatter", [mesh_axis], x)
    t = x.one_slice
    pieces = tf.stack(tf.split(t, n, axis=split_axis))
    mine = self._collectives.reduce_scatter(
        pieces, self.processor_groups([mesh_axis]), reduction_fn_string)
    mine = tf.reshape(mine, pieces.shape[1:])
    return LaidOutTensor([mine])

  def receive(self, x, mesh_axis, source_pcoord):
    x = x.to_laid_out_tensor()
    self._count_collective("receive", [mesh_axis], x, source_pcoord)
    groups = self.processor_groups([mesh_axis])
    pairs = []
    for group in groups:  # Members are in pcoord order along mesh_axis.
      for pcoord, target in enumerate(group):
        source = source_pcoord[pcoord]
        if source is not None:
          pairs.append((group[source], target))
    return LaidOutTensor([self._collectives.permute(x.one_slice, pairs,
                                                    groups)])

  # ------------------------------------------------------ import / export

  def slice(self, tf_tensor, tensor_shape):
    """This processor's slice of full tensor `tf_tensor` of mtf shape
    `tensor_shape`, as a LaidOutTensor."""
    tensor_shape = shape_lib.convert_to_shape(tensor_shape)
    tf_tensor = tf.convert_to_tensor(tf_tensor)
    slice_shape = self.slice_shape(tensor_shape)
    axes = self.padded_axes(tensor_shape)
    # A dimension of size 1 split unevenly is padded on all but one
    # processor, though its slices have its full size.
    if not axes and slice_shape == tensor_shape.to_integer_list:
      return LaidOutTensor([tf_tensor])
    tf_tensor = padding.pad_full(tf_tensor, axes)
    begin = tf.stack([tf.cast(b, tf.int32)
                      for b in self._slice_begin_tensor(tensor_shape)])
    return LaidOutTensor([slice_utils.tf_slice(tf_tensor, begin,
                                               slice_shape)])

  def import_tf_tensor(self, x, tf_x):
    """This processor's slice of `tf_x` (the value of mtf Tensor `x`)."""
    return self.slice(tf_x, mesh_impl_lib.full_shape_of(
        x, "SimdMeshImpl.import_tf_tensor"))

  def export_to_tf_tensor(self, x, laid_out_x):
    """The full value of mtf Tensor `x`, assembled on every processor."""
    shape = mesh_impl_lib.full_shape_of(x, "SimdMeshImpl.export_to_tf_tensor")
    laid_out_x = laid_out_x.to_laid_out_tensor()
    layout = self.tensor_layout(shape)
    for tensor_axis, mesh_axis in enumerate(layout):
      if mesh_axis is not None:
        laid_out_x = self.allconcat(laid_out_x, mesh_axis, tensor_axis)
    return padding.strip_full(laid_out_x.one_slice, self.padded_axes(shape))

  # --------------------------------------------------------------- random

  def random(self, shape, tf_fn, kwargs):
    """This processor's slice, computed locally (see MeshImpl.random)."""
    shape = shape_lib.convert_to_shape(shape)
    sample = self._random_sampler(shape, tf_fn, kwargs)
    return LaidOutTensor([sample(self._slice_begin_tensor(shape))])

  # ------------------------------------------------------------ variables

  def next_random_step(self):
    """Like MeshImpl's, with one counter per processor (all equal), so
    every processor's call advances its own copy."""
    store = self.variable_store
    with store.lock:
      entry = store.get(RANDOM_STEP)
      if entry is None:
        entry = self._make_random_step(store)
    counter = self.program_variable(RANDOM_STEP, entry.slices)
    after = counter.assign_add(tf.constant(1, tf.int64), read_value=True)
    return tf.convert_to_tensor(after) - 1

  def _make_random_step(self, store):
    """Creates, stores and returns the per-processor random step counters."""
    with tf.init_scope():
      slices = []
      for pnum, device in enumerate(self._devices):
        with tf.device(device):
          slices.append(variable_store_lib.plain_variable(
              tf.constant(0, tf.int64), name=f"{RANDOM_STEP}_slice_{pnum}",
              trainable=False))
      entry = placement_variables.SliceVariables(None, slices, [], tf.int64)
      store.put(RANDOM_STEP, entry)
      store.track(RANDOM_STEP, checkpointing.SlicedVariableNode(
          self.unbound, shape_lib.Shape([]), tf.int64, entry, self._devices))
      self._register_per_device([v.handle for v in slices])
    return entry


@contextlib.contextmanager
def _without_graph_optimizer():
  """Function calls made inside run without Grappler.

  The dispatcher inlines one copy of the program per device: Grappler
  would optimise all of them, one after another, making the first step
  grow with the number of processors, for no gain in step time (measured
  by benchmarks/lowering_scale.py). The call op records this config, so it
  holds when the call sits in the user's tf.function too.
  """
  ctx = context.context()
  previous = ctx.function_call_options
  config = config_pb2.ConfigProto()
  config.ParseFromString(previous.config_proto_serialized)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  ctx.function_call_options = context.FunctionCallOptions(
      executor_type=previous.executor_type, config_proto=config)
  try:
    yield
  finally:
    ctx.function_call_options = previous


def _mesh_name(mesh_shape):
  """"SimdMeshImpl for mesh b:2;m:4 (8 processors)", as the mesh is
  written."""
  spelled = ";".join(f"{d.name}:{d.size}" for d in mesh_shape.dims)
  return f"SimdMeshImpl for mesh {spelled} ({mesh_shape.size} processors)"


def _default_devices(mesh_shape, strategy, device_assignment):
  """Physical processors' devices: TPU cores in replica order, or the first
  local devices (an error if there are too few)."""
  size = mesh_shape.size
  if strategy is not None:
    devices = list(strategy.extended.worker_devices)
  elif device_assignment is not None:
    devices = [device_assignment.tpu_device(replica=r)
               for r in range(device_assignment.num_replicas)]
  else:
    devices = placement_mesh_impl.local_devices()
    if len(devices) < size:
      raise errors.LayoutError(
          f"{_mesh_name(mesh_shape)} needs {size} distinct devices, one per "
          f"processor, but found {len(devices)}: {devices}. Its collectives "
          "wait for every processor of a group, so processors cannot share "
          f"a device. Use a mesh of at most {len(devices)} processors, "
          f"split the CPU into {size} logical devices before TensorFlow "
          "starts (tf.config.set_logical_device_configuration), pass "
          "devices=, or use PlacementMeshImpl, which lets processors share "
          "a device.")
    return devices[:size]
  if len(devices) != size:
    raise errors.LayoutError(
        f"SimdMeshImpl: the mesh has {size} processors but the TPU "
        f"replicas are {len(devices)}: use one replica per core "
        "(num_cores_per_replica=1).")
  return devices


def _check_replicas(mesh_shape, strategy):
  """A strategy runs the program once per replica: one per processor."""
  replicas = getattr(strategy, "num_replicas_in_sync", None)
  if replicas is not None and replicas != mesh_shape.size:
    raise errors.LayoutError(
        f"{_mesh_name(mesh_shape)} runs one replica per processor, but the "
        f"strategy has {replicas} replicas (local devices "
        f"{list(strategy.extended.worker_devices)}): use a mesh of "
        f"{replicas} processors, or a strategy with {mesh_shape.size} "
        "replicas.")


def _device_key(device):
  """A device name's (job, replica, task, type, index), local defaults
  filled in, so that "/cpu:0" and "/job:localhost/.../device:CPU:0" match."""
  spec = tf.DeviceSpec.from_string(device)
  return (spec.job or "localhost", spec.replica or 0, spec.task or 0,
          (spec.device_type or "").upper(), spec.device_index or 0)


def _check_devices(mesh_shape, devices):
  """One distinct device per processor: processors sharing a device would
  wait for each other in every collective, forever."""
  if len(devices) != mesh_shape.size:
    raise errors.LayoutError(
        f"{_mesh_name(mesh_shape)} needs {mesh_shape.size} devices, one per "
        f"processor, got {len(devices)}: {devices}.")
  first = {}
  for pnum, device in enumerate(devices):
    other = first.setdefault(_device_key(device), pnum)
    if other != pnum:
      raise errors.LayoutError(
          f"{_mesh_name(mesh_shape)} needs a distinct device per processor "
          f"(its collectives wait for every processor of a group), but "
          f"processors {other} and {pnum} are both on {device}: {devices}. "
          "Use PlacementMeshImpl to let processors share a device.")


def make_simd_mesh_impl(shape, layout, strategy=None, **kwargs):
  """A SimdMeshImpl for where the program will run.

  With a tf.distribute.TPUStrategy: TPU collectives on its cores, run by
  `strategy.run`. Without: the host back end on the local devices (GPUs,
  else logical CPUs). Either way, run a step with `mesh_impl.run(fn, ...)`.
  """
  if strategy is not None:
    return SimdMeshImpl(shape, layout, collectives="tpu", strategy=strategy,
                        **kwargs)
  return SimdMeshImpl(shape, layout, collectives="host", **kwargs)


def _move_axis_to_front(t, axis):
  if axis == 0:
    return t
  perm = [axis] + [i for i in range(t.shape.rank) if i != axis]
  return tf.transpose(t, perm)


def _move_front_axis_to(t, axis):
  if axis == 0:
    return t
  rank = t.shape.rank
  perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
  return tf.transpose(t, perm)


class SimdLaidOutVariable(mesh_impl_lib.LaidOutVariable):
  """The slice variables of one mtf variable on a SimdMeshImpl.

  One TF variable per processor, created eagerly with its slice of the
  initial value. The program reads and assigns processor 0's variable;
  `SimdMeshImpl.run` gives each processor's call its own.
  """

  def __init__(self, variable, mesh_impl):
    if not variable_store_lib.outer_context_is_eager():
      raise errors.LayoutError(
          "SimdMeshImpl variables need eager or tf.function mode; "
          "tf.compat.v1 graph mode is not supported by it yet.")
    self._variable = variable
    self._mesh_impl = mesh_impl

    def create():
      entry = placement_variables.create_eager_slices(variable, mesh_impl)
      mesh_impl._register_per_device([v.handle for v in entry.slices])  # pylint: disable=protected-access

    self._entry = placement_variables.stored_entry(
        variable, mesh_impl, mesh_impl.slice_shape(variable.shape), create)

  @property
  def storage(self):
    return self._entry

  @property
  def slice_variables(self):
    return list(self._entry.slices)

  @property
  def master(self):
    return None

  @property
  def laid_out_tensor(self):
    return self.read()

  def _program_variable(self):
    return self._mesh_impl.program_variable(self._variable.name,
                                            self._entry.slices)

  def read(self, share_stack_read=False):
    del share_stack_read
    value = tf.convert_to_tensor(self._program_variable().read_value())
    dtype = self._variable.activation_dtype
    return LaidOutTensor([value if value.dtype == dtype else
                          tf.cast(value, dtype)])

  def assign_to_slices(self, assign_fn, values):
    op = assign_fn(self._program_variable(), values[0])
    return None if tf.executing_eagerly() else op

  def copy_master_to_slices(self):
    return None if tf.executing_eagerly() else tf.no_op()

  def copy_slices_to_master(self):
    return None if tf.executing_eagerly() else tf.no_op()


# Defined after SimdMeshImpl, which it uses.
SimdMeshImpl.LaidOutVariable = SimdLaidOutVariable
