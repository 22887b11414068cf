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

Collective back ends (see simd_collectives): "host" (TF's collective ops,
CPU/GPU; runs here).
"""

import functools

import numpy as np
import tensorflow as tf

from mesh_tensorflow import checkpointing
from mesh_tensorflow import errors
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import placement_variables
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow import simd_collectives
from mesh_tensorflow import stateless_random
from mesh_tensorflow import variable_store as variable_store_lib

LaidOutTensor = mesh_impl_lib.LaidOutTensor
RANDOM_STEP = "mtf_random_step"


class SimdMeshImpl(mesh_impl_lib.MeshImpl):
  """Mesh implementation lowering to one program run by every processor.

  Args:
    shape: the mesh shape, e.g. "b:2;m:4".
    layout: layout rules, e.g. "batch:b;hidden:m".
    devices: one device per processor (default: distinct local devices,
      as for PlacementMeshImpl).
    device_assignment: TPU device assignment (TPU back end only).
    logical_to_physical: permutation of processor numbers (TPU only; the
      host back end uses the identity).
    allreduce_in_bfloat16_max_group_size: accepted for compatibility (TPU).
    collectives: "host".
    collective_timeout_seconds: raise if a collective's group does not
      assemble in this time (default: wait forever).
  """

  def __init__(self, shape, layout, devices=None, device_assignment=None,
               logical_to_physical=None,
               allreduce_in_bfloat16_max_group_size=8, collectives="host",
               collective_timeout_seconds=None):
    super().__init__(shape, layout)
    if collectives != "host":
      raise ValueError(
          f"SimdMeshImpl collectives={collectives!r}: only the 'host' back "
          "end (TF collective ops on CPU/GPU) is available.")
    if logical_to_physical is not None and list(logical_to_physical) != list(
        range(self.size)):
      raise ValueError("The host back end maps processors to devices in "
                       "order; give the device order with `devices` instead "
                       "of logical_to_physical.")
    del device_assignment, allreduce_in_bfloat16_max_group_size
    if devices is None:
      devices = placement_mesh_impl.default_devices(self.size)
    devices = list(devices)
    if len(devices) != self.size:
      raise errors.LayoutError(
          f"SimdMeshImpl for mesh {self.shape.to_string} needs {self.size} "
          f"devices (one per processor), got {len(devices)}: {devices}.")
    self._devices = devices
    self._variable_store = variable_store_lib.VariableStore(
        checkpoint_root=self)
    self._pnum = None
    self._tokens = None
    self._per_device_captures = {}
    self._last_program = None  # (fn, signature, concrete, eager dispatcher)
    self._collectives = simd_collectives.HostCollectives(
        devices, self._current_pnum, self._current_token,
        timeout_seconds=collective_timeout_seconds)
    self._token_variables()

  @property
  def devices(self):
    return list(self._devices)

  @property
  def variable_store(self):
    return self._variable_store

  @property
  def collectives(self):
    return self._collectives

  # ------------------------------------------------------------- running

  @property
  def pnum_tensor(self):
    """The processor number of the program being traced (int32 scalar)."""
    return self._current_pnum()

  def _current_pnum(self):
    if self._pnum is None:
      raise errors.LayoutError(
          "SimdMeshImpl lowers the program of one processor and needs its "
          "processor number: build and lower inside mesh_impl.run(fn).")
    return self._pnum

  def _token_variables(self):
    if self._tokens is None:
      with tf.init_scope():
        tokens = []
        for pnum, device in enumerate(self._devices):
          with tf.device(device):
            tokens.append(tf.Variable(0, name=f"ordering_token_{pnum}",
                                      trainable=False))
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
    signature = tuple(tf.TensorSpec(a.shape, a.dtype) for a in args)
    cached = self._last_program
    if cached is None or cached[0] is not fn or cached[1] != signature:
      concrete = self._trace_program(fn, signature)
      dispatcher = tf.function(
          functools.partial(self._dispatch, concrete), autograph=False)
      cached = self._last_program = (fn, signature, concrete, dispatcher)
    _, _, concrete, dispatcher = cached
    if tf.executing_eagerly():
      return dispatcher(*args)
    return self._dispatch(concrete, *args)

  def _trace_program(self, fn, signature):
    """The concrete function of fn's program, taking (pnum, *args)."""

    def program(pnum, *program_args):
      previous = self._pnum
      self._pnum = pnum
      try:
        return fn(*program_args)
      finally:
        self._pnum = previous

    return tf.function(program, autograph=False).get_concrete_function(
        tf.TensorSpec([], tf.int32), *signature)

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
        self.shape.to_integer_list()[mesh_axis + 1:])
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
    shape = t.shape.as_list()
    gathered.set_shape([shape[0] * self.shape[mesh_axis].size] + shape[1:])
    return gathered

  def allconcat(self, x, mesh_axis, concat_axis):
    x = x.to_laid_out_tensor()
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

  def receive(self, x, mesh_axis, source_pcoord):
    x = x.to_laid_out_tensor()
    self._count_collective("receive", [mesh_axis], x)
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

  def import_tf_tensor(self, x, shape):
    shape = shape_lib.convert_to_shape(shape)
    x = tf.convert_to_tensor(x)
    slice_shape = self.slice_shape(shape)
    if slice_shape == shape.to_integer_list():
      return LaidOutTensor([x])
    begin = tf.stack([tf.cast(b, tf.int32)
                      for b in self._slice_begin_tensor(shape)])
    return LaidOutTensor([tf.slice(x, begin, slice_shape)])

  def export_to_tf_tensor(self, x, shape):
    """The full tensor, assembled on every processor."""
    shape = shape_lib.convert_to_shape(shape)
    x = x.to_laid_out_tensor()
    layout = self.tensor_layout(shape)
    for tensor_axis, mesh_axis in enumerate(layout):
      if mesh_axis is not None:
        x = self.allconcat(x, mesh_axis, tensor_axis)
    return x.one_slice

  # --------------------------------------------------------------- random

  def random(self, shape, distribution, seed, dtype=tf.float32, **params):
    shape = shape_lib.convert_to_shape(shape)
    return LaidOutTensor([stateless_random.sample(
        distribution, seed, shape.to_integer_list(), self.slice_shape(shape),
        self._slice_begin_tensor(shape), dtype=dtype, **params)])

  # ------------------------------------------------------------ variables

  def next_random_step(self):
    """Like MeshImpl's, with one counter per processor (all equal), so
    every processor's call advances its own copy."""
    store = self._variable_store
    entry = store.get(RANDOM_STEP)
    if entry is None:
      with tf.init_scope():
        slices = []
        for pnum, device in enumerate(self._devices):
          with tf.device(device):
            slices.append(tf.Variable(tf.constant(0, tf.int64),
                                      name=f"{RANDOM_STEP}_slice_{pnum}",
                                      trainable=False))
        entry = placement_variables.SliceVariables(None, slices, [],
                                                   tf.int64)
        store.put(RANDOM_STEP, entry)
        store.track(RANDOM_STEP, checkpointing.SlicedVariableNode(
            self, shape_lib.Shape([]), tf.int64, entry, self._devices))
        self._register_per_device([v.handle for v in slices])
    after = entry.slices[0].assign_add(1, read_value=True)
    return tf.convert_to_tensor(after) - 1

  def make_laid_out_variable(self, variable, stack_group=None):
    del stack_group
    return SimdLaidOutVariable(variable, self)


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


class SimdLaidOutVariable:
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
    store = mesh_impl.variable_store
    slice_shape = mesh_impl.slice_shape(variable.shape)
    entry = store.get(variable.name)
    if entry is None:
      entry = placement_variables.create_eager_slices(variable, mesh_impl)
      mesh_impl._register_per_device([v.handle for v in entry.slices])  # pylint: disable=protected-access
    else:
      placement_variables.check_existing(entry, variable, slice_shape)
    self._entry = entry

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

  def read(self, share_stack_read=False):
    del share_stack_read
    value = self._entry.slices[0].value()
    dtype = self._variable.activation_dtype
    return LaidOutTensor([value if value.dtype == dtype else
                          tf.cast(value, dtype)])

  def assign_to_slices(self, assign_fn, values):
    op = assign_fn(self._entry.slices[0], values[0])
    return None if tf.executing_eagerly() else op

  def copy_master_to_slices(self):
    return None if tf.executing_eagerly() else tf.no_op()

  def copy_slices_to_master(self):
    return None if tf.executing_eagerly() else tf.no_op()
