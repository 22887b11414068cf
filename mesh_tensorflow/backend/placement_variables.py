"""The TF variables behind mtf variables on a PlacementMeshImpl.

Each mtf variable is held as one slice per processor, either in a TF
variable of its own or, when the Lowering stacks variables (autostack), as
one row of a per-processor TF variable shared by a stack of same-shaped
variables that are always assigned together. Stacking cuts the number of TF
variables, reads and assignments on large meshes; checkpoints and the mtf
program never see it.

Eager / tf.function: the slice variables are created once, eagerly, from the
full initial value computed on the host. Compat graph mode: as in the
original library each mtf variable also has a master variable on the host
(saved by `tf.compat.v1.train.Saver`), copied to and from the slices by
`copy_master_to_slices` / `copy_slices_to_master`; the slices start from
pieces of the master's initial value, in no collection. In both modes the
slices are tracked for `tf.train.Checkpoint` under the store's checkpoint
root (see variable_store).
"""

import weakref

import tensorflow as tf

from mesh_tensorflow.storage import checkpointing
from mesh_tensorflow.storage import legacy_names
from mesh_tensorflow import errors
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow.storage import variable_store as variable_store_lib

LaidOutTensor = mesh_impl_lib.LaidOutTensor


def _read(variable):
  return variable.value() if hasattr(variable, "value") else tf.identity(
      variable)


class SliceVariables:
  """One mtf variable with a TF variable per processor.

  In compat graph mode `master` is its master variable, or, for a
  layer-stacked variable, None and `masters` one master per member (row).
  """

  def __init__(self, master, slices, slice_shape, slice_dtype, masters=None):
    self.master = master
    self.masters = masters
    self.slices = slices
    self.slice_shape = slice_shape
    self.slice_dtype = slice_dtype

  def slice_value(self, pnum):
    return _read(self.slices[pnum])

  def assign_target(self, pnum):
    """What `assign_fn(target, value)` updates for processor `pnum`."""
    return self.slices[pnum]

  def assign_slice(self, pnum, value):
    return self.slices[pnum].assign(tf.cast(value, self.slice_dtype),
                                    read_value=False)

  def assign_slice_row(self, pnum, index, value):
    """Sets row `index` (first dimension) of processor pnum's slice."""
    return self.slices[pnum][index].assign(tf.cast(value, self.slice_dtype))


class VariableStack:
  """Per-processor TF variables holding N same-shaped mtf variables.

  In compat graph mode `masters` are the members' master variables.
  """

  def __init__(self, names, slices, masters):
    self.names = list(names)
    self.slices = slices
    self.masters = list(masters)
    self._copy_ops = weakref.WeakKeyDictionary()

  def copy_masters_to_slices(self, mesh_impl, shape):
    """One op (per tf.Graph) filling every row of the stack from masters."""
    graph = tf.compat.v1.get_default_graph()
    if graph not in self._copy_ops:
      per_master = [mesh_impl.make_slices(m.value(), shape)
                    for m in self.masters]
      ops = []
      for pnum, (device, v) in enumerate(zip(mesh_impl.devices,
                                             self.slices)):
        with tf.device(device):
          rows = [tf.cast(pieces[pnum], v.dtype) for pieces in per_master]
          ops.append(v.assign(tf.stack(rows), read_value=False))
      self._copy_ops[graph] = tf.group(*ops)
    return self._copy_ops[graph]


class _StackRow:
  """Row `index` of a stacked TF variable, updatable by assign functions."""

  def __init__(self, variable, index):
    self._variable = variable
    self._index = index

  @property
  def dtype(self):
    return self._variable.dtype

  @property
  def shape(self):
    return self._variable.shape[1:]

  def value(self):
    return self._variable[self._index]

  read_value = value

  def assign(self, value, read_value=True):
    op = self._variable[self._index].assign(value)
    return self.value() if read_value else op

  def assign_add(self, value, read_value=True):
    return self.assign(self.value() + value, read_value=read_value)

  def assign_sub(self, value, read_value=True):
    return self.assign(self.value() - value, read_value=read_value)


class StackMember:
  """One mtf variable stored as row `index` of a VariableStack."""

  def __init__(self, stack, index, master, slice_shape, slice_dtype):
    self.stack = stack
    self.index = index
    self.master = master
    self.slice_shape = slice_shape
    self.slice_dtype = slice_dtype

  @property
  def slices(self):
    return [_StackRow(v, self.index) for v in self.stack.slices]

  def slice_value(self, pnum):
    return self.stack.slices[pnum][self.index]

  def assign_target(self, pnum):
    return _StackRow(self.stack.slices[pnum], self.index)

  def assign_slice(self, pnum, value):
    return self.assign_target(pnum).assign(
        tf.cast(value, self.slice_dtype), read_value=False)


class LaidOutVariable(mesh_impl_lib.LaidOutVariable):
  """The per-processor slices of one mtf variable on a PlacementMeshImpl.

  Args:
    variable: the mtf Variable.
    mesh_impl: its PlacementMeshImpl.
    stack_group: the StackGroup the current Lowering puts it in, or None.
  """

  def __init__(self, variable, mesh_impl, stack_group=None):
    self._variable = variable
    self._mesh_impl = mesh_impl
    self._stack_group = stack_group
    store = mesh_impl.variable_store
    self._slice_shape = mesh_impl.slice_shape(variable.shape)

    def create():
      if stack_group is not None and not any(
          store.get(name) is not None for name in stack_group.names):
        _create_stack(stack_group.variables, mesh_impl)
      else:
        _create_single(variable, mesh_impl)

    self._entry = stored_entry(variable, mesh_impl, self._slice_shape, create)

  @property
  def storage(self):
    """The SliceVariables or StackMember holding this variable."""
    return self._entry

  @property
  def slice_variables(self):
    """One TF variable per processor (rows of a stack, when stacked)."""
    return list(self._entry.slices)

  @property
  def master(self):
    return self._entry.master

  @property
  def masters(self):
    """Compat graph mode, layer-stacked: one master per member, else None."""
    return getattr(self._entry, "masters", None)

  def _stack_is_shared_read(self):
    group = self._stack_group
    return (isinstance(self._entry, StackMember) and group is not None and
            group.names == self._entry.stack.names)

  @property
  def laid_out_tensor(self):
    """The current slice values in the variable's activation dtype.

    Members of a stack share one read of it per lowering.
    """
    return self.read(share_stack_read=True)

  def read(self, share_stack_read=False):
    """Reads the slices now (e.g. after an assignment)."""
    dtype = self._variable.activation_dtype
    devices = self._mesh_impl.devices
    # Replicas hold equal values: with shared replicas, all read one copy.
    sources = self._mesh_impl.replica_sources(self._variable.shape)
    if share_stack_read and self._stack_is_shared_read():
      group = self._stack_group
      if group.unstacked_reads is None:
        reads = []
        for pnum, (device, v) in enumerate(zip(devices,
                                               self._entry.stack.slices)):
          if sources[pnum] != pnum:
            reads.append(None)
            continue
          with tf.device(device):
            reads.append(tf.unstack(v.value(), num=len(group.names)))
        group.unstacked_reads = reads
      values = [rows and rows[self._entry.index]
                for rows in group.unstacked_reads]
    else:
      values = []
      for pnum, device in enumerate(devices):
        if sources[pnum] != pnum:
          values.append(None)
          continue
        with tf.device(device):
          values.append(self._entry.slice_value(pnum))
    out = []
    for pnum, (device, value) in enumerate(zip(devices, values)):
      if sources[pnum] != pnum:
        out.append(out[sources[pnum]])
        continue
      with tf.device(device):
        out.append(value if value.dtype == dtype else tf.cast(value, dtype))
    return LaidOutTensor(out)

  def assign_to_slices(self, assign_fn, values):
    """Runs `assign_fn(slice_variable, value)` on every processor."""
    ops = []
    for pnum, (device, value) in enumerate(zip(self._mesh_impl.devices,
                                               values)):
      with tf.device(device):
        ops.append(assign_fn(self._entry.assign_target(pnum), value))
    return _group(ops)

  def copy_master_to_slices(self):
    """Compat graph mode: fills the slices from the master (else a no-op)."""
    master = self._entry.master
    masters = self.masters
    if masters:
      with tf.device(masters[0].device):
        full = tf.stack([m.value() for m in masters])
    elif master is None or self._entry.slices[0] is master:
      return _group([])
    elif isinstance(self._entry, StackMember):
      return self._entry.stack.copy_masters_to_slices(
          self._mesh_impl, self._variable.shape)
    else:
      full = master.value()
    pieces = self._mesh_impl.make_slices(full, self._variable.shape)
    ops = []
    for pnum, (device, piece) in enumerate(zip(self._mesh_impl.devices,
                                               pieces)):
      with tf.device(device):
        ops.append(self._entry.assign_slice(pnum, piece))
    return _group(ops)

  def copy_slices_to_master(self):
    """Compat graph mode: writes the assembled slices to the master (the
    rows of a layer-stacked variable to their members' masters)."""
    master = self._entry.master
    masters = self.masters
    if not masters and (master is None or self._entry.slices[0] is master):
      return _group([])
    slices = []
    for pnum, device in enumerate(self._mesh_impl.devices):
      with tf.device(device):
        slices.append(self._entry.slice_value(pnum))
    device = masters[0].device if masters else master.device
    with tf.device(device):
      full = self._mesh_impl.combine_slices(slices, self._variable.shape,
                                            device=device)
      if not masters:
        return master.assign(tf.cast(full, master.dtype), read_value=False)
      rows = tf.unstack(full, num=len(masters))
      return tf.group(*[m.assign(tf.cast(r, m.dtype), read_value=False)
                        for m, r in zip(masters, rows)])


def assign_to_variables(laid_out_variables, laid_out_values, assign_fn):
  """Lowers one (possibly combined) Assign; returns its TF op or None.

  Variables that make up a whole stack, in the stack's order, are assigned
  with one `assign_fn` call per processor on the stacked values.
  """
  by_stack = {}
  for i, v in enumerate(laid_out_variables):
    entry = v.storage
    if isinstance(entry, StackMember):
      by_stack.setdefault(id(entry.stack), []).append(i)
  whole_stacks = {}
  for indices in by_stack.values():
    stack = laid_out_variables[indices[0]].storage.stack
    rows = [laid_out_variables[i].storage.index for i in indices]
    if sorted(rows) == list(range(len(stack.names))) and len(set(rows)) == len(
        rows):
      whole_stacks[indices[0]] = (stack, indices)
  in_whole_stack = {i for _, ids in whole_stacks.values() for i in ids}
  ops = []
  for i, v in enumerate(laid_out_variables):
    if i in whole_stacks:
      stack, indices = whole_stacks[i]
      ordered = sorted(indices,
                       key=lambda j: laid_out_variables[j].storage.index)
      mesh_impl = v._mesh_impl  # pylint: disable=protected-access
      for pnum, device in enumerate(mesh_impl.devices):
        with tf.device(device):
          stacked = tf.stack(
              [laid_out_values[j].tensor_list[pnum] for j in ordered])
          ops.append(assign_fn(stack.slices[pnum], stacked))
    elif i not in in_whole_stack:
      ops.append(v.assign_to_slices(assign_fn,
                                    laid_out_values[i].all_slices))
  return _group(ops)


def checkpoint_node(variable, mesh_impl, entry, row=None):
  # The node outlives the lowering: it keeps no reference to its counters.
  mesh_impl = mesh_impl.counting(None)
  return checkpointing.SlicedVariableNode(
      mesh_impl, variable.shape, variable.master_dtype, entry,
      mesh_impl.devices, row=row,
      earlier_names=legacy_names.for_graph(variable.mesh.graph))


def track(variable, mesh_impl, entry):
  """Tracks `variable`'s storage for checkpoints: under its name, or, if it
  is layer-stacked, each row under its member's name."""
  store = mesh_impl.variable_store
  members = variable.member_names
  if members is None:
    store.track(variable.name, checkpoint_node(variable, mesh_impl, entry))
    return
  for row, name in enumerate(members):
    store.track(name, checkpoint_node(variable, mesh_impl, entry, row=row))


def _eager_slices(variable, mesh_impl):
  """The initial per-processor pieces of `variable`, computed on the host."""
  with tf.device("/cpu:0"):
    full = variable_store_lib.initial_value(variable)
    return mesh_impl.make_slices(full, variable.shape)


def _create_master(variable):
  with tf.compat.v1.device(variable.mesh.variable_placer_fn):
    return tf.compat.v1.Variable(
        lambda: variable_store_lib.initial_value(variable),
        name=variable.name, trainable=variable.trainable,
        dtype=variable.master_dtype, use_resource=True)


def _master_pieces(master, variable, mesh_impl):
  """Compat graph mode: the per-processor pieces of the master's initial
  value (the slices' own initial values, so that initialising them without
  the masters, as the estimator's graph mode does, starts from the same
  values)."""
  with tf.device("/cpu:0"):
    return mesh_impl.make_slices(master.initial_value, variable.shape)


def create_eager_slices(variable, mesh_impl):
  """Eager / tf.function: creates, stores and tracks one TF variable per
  processor holding its slice of the initial value; returns the entry."""
  store = mesh_impl.variable_store
  with tf.init_scope(), variable_store_lib.root_name_scope():
    pieces = _eager_slices(variable, mesh_impl)
    slices = []
    for pnum, (device, piece) in enumerate(zip(mesh_impl.devices, pieces)):
      with tf.device(device):
        slices.append(variable_store_lib.plain_variable(
            tf.cast(piece, variable.slice_dtype),
            name=f"{variable.name}_slice_{pnum}",
            trainable=variable.trainable))
    entry = SliceVariables(None, slices, mesh_impl.slice_shape(variable.shape),
                           variable.slice_dtype)
    store.put(variable.name, entry)
    track(variable, mesh_impl, entry)
  return entry


def stored_entry(variable, mesh_impl, slice_shape, create):
  """The variable store's entry of mtf `variable`: the stored one, checked
  against its slices, else the one `create()` stores.

  The look-up and the creation hold the store's lock: lowerings on several
  threads share one mesh implementation's store.
  """
  store = mesh_impl.variable_store
  with store.lock:
    entry = store.get(variable.name)
    if entry is not None:
      check_existing(entry, variable, slice_shape)
      return entry
    create()
    return store.get(variable.name)


def check_existing(entry, variable, slice_shape):
  """Raises if a stored variable does not fit `variable`'s slices."""
  if (entry.slice_shape != slice_shape or
      entry.slice_dtype != variable.slice_dtype):
    raise errors.ShapeError(
        f"Variable {variable.name!r} exists with slice shape "
        f"{entry.slice_shape} and dtype {entry.slice_dtype.name}, but is "
        f"now requested with shape {variable.shape} (slice shape "
        f"{slice_shape}) and dtype {variable.slice_dtype.name}.")


def _create_single(variable, mesh_impl):
  """Creates and stores the slice variables of one mtf variable."""
  store = mesh_impl.variable_store
  slice_shape = mesh_impl.slice_shape(variable.shape)
  with tf.init_scope(), variable_store_lib.root_name_scope():
    if variable_store_lib.outer_context_is_eager():
      create_eager_slices(variable, mesh_impl)
      return
    if variable.member_names is not None:
      _create_layer_stacked(variable, mesh_impl)
      return
    master = _create_master(variable)
    slice_is_master = (
        mesh_impl.size == 1 and
        variable.master_dtype == variable.slice_dtype and
        mesh_impl.devices[0] in ("", master.device))
    if slice_is_master:
      slices = [master]
    else:
      slices = _slice_variables(
          variable, mesh_impl, _master_pieces(master, variable, mesh_impl))
    entry = SliceVariables(master, slices, slice_shape, variable.slice_dtype)
    store.put(variable.name, entry)
    track(variable, mesh_impl, entry)


def _slice_variables(variable, mesh_impl, pieces):
  """Compat graph mode: one slice variable per processor, on its device,
  initialised from its piece of the initial value."""
  slices = []
  for pnum, device in enumerate(mesh_impl.devices):
    with tf.device(device):
      slices.append(tf.compat.v1.Variable(
          tf.cast(pieces[pnum], variable.slice_dtype),
          name=f"{variable.name}_slice_{pnum}", trainable=False,
          collections=[], use_resource=True))
  return slices


def _create_layer_stacked(variable, mesh_impl):
  """Compat graph mode: one master per member (named as the member, holding
  its row, so a Saver writes the per-layer names) and the slices of the
  stacked value."""
  store = mesh_impl.variable_store
  masters = []
  for row, name in enumerate(variable.member_names):
    with tf.compat.v1.device(variable.mesh.variable_placer_fn):
      masters.append(tf.compat.v1.Variable(
          lambda row=row: variable_store_lib.initial_row_value(variable, row),
          name=name, trainable=variable.trainable,
          dtype=variable.master_dtype, use_resource=True))
  with tf.device("/cpu:0"):
    full = tf.stack([m.initial_value for m in masters])
    pieces = mesh_impl.make_slices(full, variable.shape)
  slices = _slice_variables(variable, mesh_impl, pieces)
  entry = SliceVariables(None, slices, mesh_impl.slice_shape(variable.shape),
                         variable.slice_dtype, masters=masters)
  store.put(variable.name, entry)
  track(variable, mesh_impl, entry)


def _create_stack(variables, mesh_impl):
  """Creates and stores one stacked slice variable per processor."""
  store = mesh_impl.variable_store
  first = variables[0]
  slice_shape = mesh_impl.slice_shape(first.shape)
  dtype = first.slice_dtype
  stack_name = f"autostack/{first.name}/{len(variables)}"
  eager = variable_store_lib.outer_context_is_eager()
  with tf.init_scope(), variable_store_lib.root_name_scope():
    if eager:
      masters = [None] * len(variables)
      per_variable = [_eager_slices(v, mesh_impl) for v in variables]
      slices = []
      for pnum, device in enumerate(mesh_impl.devices):
        with tf.device(device):
          rows = [tf.cast(pieces[pnum], dtype) for pieces in per_variable]
          slices.append(variable_store_lib.plain_variable(
              tf.stack(rows), name=f"{stack_name}_slice_{pnum}",
              trainable=first.trainable))
    else:
      masters = [_create_master(v) for v in variables]
      per_variable = [_master_pieces(m, v, mesh_impl)
                      for m, v in zip(masters, variables)]
      slices = []
      for pnum, device in enumerate(mesh_impl.devices):
        with tf.device(device):
          rows = [tf.cast(pieces[pnum], dtype) for pieces in per_variable]
          slices.append(tf.compat.v1.Variable(
              tf.stack(rows), name=f"{stack_name}_slice_{pnum}",
              trainable=False, collections=[], use_resource=True))
    stack = VariableStack([v.name for v in variables], slices, masters)
    for index, (variable, master) in enumerate(zip(variables, masters)):
      entry = StackMember(stack, index, master, slice_shape, dtype)
      store.put(variable.name, entry)
      track(variable, mesh_impl, entry)


def _group(ops):
  ops = [op for op in ops if op is not None]
  if tf.executing_eagerly():
    return None
  return tf.group(*ops) if ops else tf.no_op()
