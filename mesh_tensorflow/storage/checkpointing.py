"""Layout-independent checkpoints of mtf variables.

In eager and `tf.function` mode a mesh implementation is a trackable object:
`tf.train.Checkpoint(model=mesh_impl)` saves every mtf variable it holds as
ONE full tensor, in the variable's master dtype, at the checkpoint key

    model/<mtf name>/.ATTRIBUTES/VARIABLE_VALUE

(e.g. `model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE`), readable with
`tf.train.load_checkpoint`. The tensor is written as the distinct slices
the processors hold (TF's sliced-tensor checkpoint format, as for
partitioned variables), so no device ever assembles the full value; on
restore each processor reads just its own slice, whatever mesh and layout
wrote the file. A variable restored before it exists (restore, then trace)
is filled when the first lowering creates it.

In `tf.compat.v1` graph mode each mtf variable also has a master variable
named exactly like it; `tf.compat.v1.train.Saver` saves those, after
`Lowering.copy_slices_to_masters()`, as in the original library. The
slices are tracked in graph mode too, under a node of the graph
(`VariableStore.checkpoint_root()`), so `tf.train.Checkpoint` run in a
Session writes the eager keys. `load_variables` reads either kind of
checkpoint back by mtf name.

A layer-stacked variable (mtf.stack_layer_variables) is saved as one entry
per member name, each a row of it (`SlicedVariableNode(row=i)`): the keys
and values the separate per-layer variables would have, written by the
processors holding that row, so it restores into per-layer variables and
the reverse, under any layout.

The original library's checkpoints are name-based (`tf.compat.v1.train.Saver`
of the master variables: key = mtf name, whole value, master dtype, plus
"global_step"). `save_specs` gives what such a checkpoint is written from,
block by block without master variables (the estimator writes its
checkpoints so, see estimator/checkpoints.py). `ValueRestore` fills a mesh
implementation's variables from a checkpoint of either kind by mtf name, as
the lowering creates them, so they load under any mesh, layout or
autostacking.
"""

import functools
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import padding
from mesh_tensorflow.backend import slice_utils

Trackable = tf.__internal__.tracking.Trackable

VALUE_KEY = "VARIABLE_VALUE"
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_ATTRIBUTES = "/.ATTRIBUTES/"
# root (a mesh implementation) -> [ValueRestore], offered every new variable.
_PENDING = weakref.WeakKeyDictionary()


class ScopeNode(Trackable):
  """A checkpoint node named after one component of an mtf name."""

  def child(self, name):
    return self._lookup_dependency(name)  # pylint: disable=no-member


def track(root, name, node):
  """Adds `node` under `root` at path `name` ("scope/.../leaf").

  Missing scope nodes are created on the way. Each new node is offered to
  any pending (deferred) restoration, so a variable created after
  `Checkpoint.restore` is restored at once.
  """
  parts = name.split("/")
  parent = root
  for i, part in enumerate(parts):
    parent._maybe_initialize_trackable()  # pylint: disable=protected-access
    existing = parent._lookup_dependency(part)  # pylint: disable=protected-access
    if i == len(parts) - 1:
      child = node
      node._maybe_initialize_trackable()  # pylint: disable=protected-access
      if existing is not None:
        # A scope node created for deeper names becomes the variable node.
        for grandchild_name, grandchild in existing._trackable_children().items():  # pylint: disable=protected-access
          node._track_trackable(grandchild, grandchild_name)  # pylint: disable=protected-access
    elif existing is not None:
      parent = existing
      continue
    else:
      child = ScopeNode()
    parent._track_trackable(child, part, overwrite=True)  # pylint: disable=protected-access
    parent._handle_deferred_dependencies(part, child)  # pylint: disable=protected-access
    parent = child
  for restore in _PENDING.get(root, ()):
    restore.fill(name, node)


# TF's sliced checkpoints (TensorSlice) take at most 8 dimensions: RestoreV2
# aborts the process on a block of a rank-9 tensor.
_MAX_SLICED_RANK = 8


def _slice_spec(full_shape, begin, size):
  """TF's "shape offsets,lengths:..." spec of one block of a tensor."""
  shape = " ".join(str(d) for d in full_shape)
  blocks = ":".join(f"{b},{s}" for b, s in zip(begin, size))
  return f"{shape} {blocks}"


class SlicedVariableNode(ScopeNode):
  """Checkpoints one mtf variable from the slices its processors hold.

  Args:
    mesh_impl: the mesh implementation (layout and devices).
    shape: the variable's mtf Shape.
    master_dtype: the dtype it is saved in.
    storage: gives `slice_value(pnum)` (a tf.Tensor) and
      `assign_slice(pnum, value)` for every processor (and, for a row,
      `assign_slice_row(pnum, index, value)`).
    devices: the device of each processor, in pnum order.
    row: None, or the index of one row of a layer-stacked variable (along
      its first dimension) that this node saves as a variable of its own,
      of shape `shape` without its first dimension: only the processors
      whose slices hold that row write and read it.
    earlier_names: the `legacy_names.LegacyScopes` of the variable's mtf
      graph, for restoring checkpoints of earlier versions.
  """

  def __init__(self, mesh_impl, shape, master_dtype, storage, devices,
               row=None, earlier_names=None):
    self.earlier_names = earlier_names
    self._mesh_impl = mesh_impl
    self._stored_shape = shape_lib.convert_to_shape(shape)
    self._row = row
    self._shape = (self._stored_shape if row is None else
                   shape_lib.Shape(self._stored_shape.dims[1:]))
    self._master_dtype = master_dtype
    self._storage = storage
    self._devices = list(devices)

  @property
  def master_dtype(self):
    return self._master_dtype

  def device(self, pnum):
    return self._devices[pnum]

  def _block(self, pnum):
    """(begin, size, index of the row in the slice) of processor pnum's
    block of this node's value, or None if it holds none of it."""
    begin = self._mesh_impl.slice_begin(self._stored_shape, pnum)
    size = self._mesh_impl.slice_shape(self._stored_shape)
    # An uneven split's padding is not saved: the block is cut to the
    # logical tensor (a slice of padding only has no block).
    clipped = padding.clip_block(self._padded_axes(), begin, size)
    if clipped is None:
      return None
    begin, size = clipped
    if self._row is None:
      return begin, size, None
    index = self._row - begin[0]
    if not 0 <= index < size[0]:
      return None
    return begin[1:], size[1:], index

  def _padded_axes(self):
    return self._mesh_impl.padded_axes(self._stored_shape)

  def read_block(self, pnum):
    """Processor `pnum`'s block (its slice without padding), in the master
    dtype, on its device."""
    with tf.device(self._devices[pnum]):
      value = self._storage.slice_value(pnum)
      _, size, row = self._block(pnum)
      if self._row is not None:
        value = value[row]
      if self._padded_axes():
        value = slice_utils.tf_slice(value, [0] * len(size), size)
      return tf.cast(value, self._master_dtype)

  @property
  def shape(self):
    return self._shape

  def assign_block(self, pnum, value):
    with tf.device(self._devices[pnum]):
      if self._padded_axes():
        value = self._pad_block(value)
      if self._row is None:
        return self._storage.assign_slice(pnum, value)
      return self._storage.assign_slice_row(pnum, self._block(pnum)[2],
                                            value)

  def _pad_block(self, value):
    """A block cut to the logical tensor, padded back to the slice shape
    with zeros."""
    slice_shape = self._mesh_impl.slice_shape(self._stored_shape)
    if self._row is not None:
      slice_shape = slice_shape[1:]
    block_shape = slice_utils.static_shape(value)
    if None not in block_shape:  # Static: any rank (slice_utils.tf_pad).
      return slice_utils.tf_pad(value, [[0, s - b] for s, b in
                                        zip(slice_shape, block_shape)])
    block_shape = tf.shape(value)
    return tf.pad(value, [[0, s - block_shape[i]]
                          for i, s in enumerate(slice_shape)])

  def assign_full(self, value):
    """Gives every processor its slice of the full `value` (a NumPy array).

    Eager: at once; returns None. Compat graph mode: returns (op,
    feed_dict) to run in a Session; the value is fed to a placeholder, not
    embedded in the graph.
    """
    with tf.init_scope():
      feed = None
      with tf.device("/cpu:0"):
        if tf.executing_eagerly():
          full = tf.convert_to_tensor(value)
        else:
          value = np.asarray(value)
          full = tf.compat.v1.placeholder(tf.as_dtype(value.dtype),
                                          value.shape)
          feed = {full: value}
        full = tf.cast(full, self._master_dtype)
      ops = []
      for _, pnums in self.blocks():
        begin, size, _ = self._block(pnums[0])
        with tf.device("/cpu:0"):
          block = slice_utils.tf_slice(full, begin, size) if size else full
        for pnum in pnums:
          ops.append(self.assign_block(pnum, block))
      if feed is None:
        return None
      return tf.group(*[op for op in ops if op is not None]), feed

  @property
  def saved_whole(self):
    """Whether the checkpoint holds this split variable as one whole
    tensor (assembled from its blocks when saved, cut into them when
    restored): beyond the rank TF's sliced checkpoints take."""
    return (self._shape.ndims > _MAX_SLICED_RANK and
            self.blocks()[0][0] != "")

  def read_full(self):
    """The whole tensor, assembled from the processors' blocks (on the
    CPU), in the master dtype."""
    pieces = []
    for _, pnums in self.blocks():
      begin, _, _ = self._block(pnums[0])
      pieces.append((tuple(begin), self.read_block(pnums[0])))
    with tf.device("/cpu:0"):
      return _assemble(pieces, 0)

  def assign_from_full(self, value):
    """Gives every processor its block of the whole tensor `value`."""
    ops = []
    for _, pnums in self.blocks():
      begin, size, _ = self._block(pnums[0])
      with tf.device("/cpu:0"):
        block = slice_utils.tf_slice(value, begin, size)
      for pnum in pnums:
        ops.append(self.assign_block(pnum, block))
    return ops

  def blocks(self):
    """[(slice spec, [pnums holding that block])]; spec "" if unsplit."""
    full = self._shape.to_integer_list
    blocks = {}
    for pnum in range(self._mesh_impl.size):
      block = self._block(pnum)
      if block is None:
        continue
      begin, size, _ = block
      spec = "" if size == full else _slice_spec(full, begin, size)
      blocks.setdefault(spec, []).append(pnum)
    return list(blocks.items())

  def _gather_saveables_for_checkpoint(self):
    # A SaveableObject with one SaveSpec per distinct block: the form TF
    # reads and writes sliced tensors in, in TF2 and compat checkpoints.
    return {VALUE_KEY: lambda name: _SlicedSaveable(self, name)}


class _SlicedSaveable(saveable_object.SaveableObject):
  """Saves one mtf variable block by block; restores each processor's."""

  def __init__(self, node, name):
    self._node = node
    self._blocks = node.blocks()
    self._whole = node.saved_whole
    if self._whole:
      specs = [saveable_object.SaveSpec(
          node.read_full, "", name, dtype=node.master_dtype,
          device="/cpu:0")]
    else:
      specs = [saveable_object.SaveSpec(
          functools.partial(node.read_block, pnums[0]), spec, name,
          dtype=node.master_dtype, device=node.device(pnums[0]))
               for spec, pnums in self._blocks]
    saveable_object.SaveableObject.__init__(self, node, specs, name)

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes  # the variable's own shape is known
    if self._whole:
      ops = self._node.assign_from_full(restored_tensors[0])
    else:
      ops = [self._node.assign_block(pnum, value)
             for (_, pnums), value in zip(self._blocks, restored_tensors)
             for pnum in pnums]
    if tf.executing_eagerly():
      return None
    return tf.group(*[op for op in ops if op is not None])


def _assemble(pieces, axis):
  """The tensor whose blocks are `pieces` ((begin, block) pairs forming a
  grid): concatenated along each axis in turn."""
  if len(pieces) == 1:
    return pieces[0][1]
  by_begin = {}
  for begin, block in pieces:
    by_begin.setdefault(begin[axis], []).append((begin, block))
  if len(by_begin) == 1:
    return _assemble(pieces, axis + 1)
  return tf.concat([_assemble(by_begin[b], axis + 1)
                    for b in sorted(by_begin)], axis)


def _unescape(name):
  """Inverts TF's escaping of '/' (".S") and '.' ("..") in node names."""
  out = []
  i = 0
  while i < len(name):
    if name[i] == "." and i + 1 < len(name):
      out.append("/" if name[i + 1] == "S" else name[i + 1])
      i += 2
    else:
      out.append(name[i])
      i += 1
  return "".join(out)


def load_variables(checkpoint, prefix=None):
  """Reads the mtf variables of a checkpoint: {mtf name: numpy value}.

  Args:
    checkpoint: a checkpoint path or directory (its latest checkpoint).
    prefix: for object-based (TF2) checkpoints, the attribute the mesh
      implementation was saved under (e.g. "model"); None reads every
      variable and names it by its full object path.

  Works for `tf.train.Checkpoint` files written from a mesh implementation
  and for `tf.compat.v1.train.Saver` files of master variables.
  """
  reader = tf.train.load_checkpoint(checkpoint)
  values = {}
  for key, dtype in reader.get_variable_to_dtype_map().items():
    if key.startswith(OBJECT_GRAPH_KEY) or dtype == tf.variant:
      continue  # not a variable (the object graph, an iterator's state)
    if _ATTRIBUTES in key:
      path, attribute = key.split(_ATTRIBUTES, 1)
      if attribute != VALUE_KEY:
        continue
      parts = [_unescape(p) for p in path.split("/")]
      if prefix is not None:
        if parts[0] != prefix:
          continue
        parts = parts[1:]
      name = "/".join(parts)
    else:
      name = key
    values[name] = reader.get_tensor(key)
  return values


def is_name_based(reader):
  """True if a checkpoint (a CheckpointReader) is a TF1 `Saver` one: keys
  are variable names, with no object graph (the original library's kind)."""
  return not reader.has_tensor(OBJECT_GRAPH_KEY)


def variable_keys(reader, prefix="model"):
  """{mtf name: checkpoint key} of the mtf variables of a checkpoint.

  Name-based checkpoints key each variable by its name; object-based ones
  by its object path under `prefix` (see the module docstring).
  """
  keys = {}
  for key in reader.get_variable_to_shape_map():
    if key.startswith(OBJECT_GRAPH_KEY):
      continue
    if _ATTRIBUTES not in key:
      keys[key] = key
      continue
    path, attribute = key.split(_ATTRIBUTES, 1)
    parts = [_unescape(p) for p in path.split("/")]
    if attribute == VALUE_KEY and parts[0] == prefix and len(parts) > 1:
      keys["/".join(parts[1:])] = key
  return keys


def save_specs(node):
  """{mtf name: {slice spec: SaveSpec}} of the variables tracked under node.

  What a name-based checkpoint (the original's keys: one per mtf variable,
  its mtf name, its master dtype) is written from: each distinct block of
  a variable is read on a processor holding it, as `_SlicedSaveable` does,
  so no device assembles the whole value.
  """
  specs = {}
  for name, variable in _tracked_nodes(node):
    if isinstance(variable, tf.Variable):
      specs[name] = {"": saveable_object.SaveSpec(
          variable.read_value, "", name, dtype=variable.dtype,
          device=variable.device)}
      continue
    blocks = {}
    for spec, pnums in variable.blocks():
      pnum = pnums[0]
      blocks[spec] = saveable_object.SaveSpec(
          functools.partial(variable.read_block, pnum), spec, name,
          dtype=variable.master_dtype, device=variable.device(pnum))
    specs[name] = blocks
  return specs


def restore_into(node, checkpoint):
  """Fills the variables tracked under `node` from `checkpoint` (a prefix
  or directory, of either format) by their names relative to `node`.

  Returns the ValueRestore (its `restored` and `missing` names). Eager
  only: the values are assigned at once.
  """
  reader = tf.train.load_checkpoint(checkpoint)
  restore = ValueRestore(checkpoint, reader, variable_keys(reader))
  for name, variable in list(_tracked_nodes(node)):
    restore.fill(name, variable)
  return restore


def _is_variable(node):
  """An mtf variable's node, or a plain TF variable (e.g. a counter)."""
  return isinstance(node, (SlicedVariableNode, tf.Variable))


def _assign_plain(variable, value):
  """Assigns a NumPy `value` to a plain TF variable: at once (eager, returns
  None) or as (op, feed_dict) to run in a Session."""
  with tf.init_scope():
    if tf.executing_eagerly():
      variable.assign(tf.cast(value, variable.dtype))
      return None
    value = np.asarray(value)
    feed = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape)
    op = variable.assign(tf.cast(feed, variable.dtype), read_value=False)
    return op, {feed: value}


def _tracked_nodes(node, prefix=""):
  """(name, node) of every variable tracked under node: mtf variables'
  SlicedVariableNodes and plain TF variables (counters)."""
  children = node._trackable_children()  # pylint: disable=protected-access
  for part, child in children.items():
    name = prefix + part
    if _is_variable(child):
      yield name, child
    if isinstance(child, ScopeNode):
      yield from _tracked_nodes(child, name + "/")


class ValueRestore:
  """Fills mtf variables from whole values in a checkpoint, by mtf name.

  Attached to a mesh implementation, it fills the variables tracked under
  it now and every variable the lowering creates later (each processor
  gets its slice; autostacked variables member by member), casting the
  stored value to the variable's master dtype.

  Args:
    path: the checkpoint prefix (named in errors).
    reader: its tf.train.CheckpointReader.
    keys: {mtf name: checkpoint key} of the values to load.
    wanted: optional predicate on mtf names; variables it rejects keep
      their initial values without being reported missing.
  """

  def __init__(self, path, reader, keys, wanted=None):
    self._path = path
    self._reader = reader
    self._keys = dict(keys)
    self._wanted = wanted
    self._seen = set()
    self._uses_earlier_names = {}  # LegacyScopes -> bool
    self.restored = []
    self.missing = []
    # Compat graph mode: the assignments to run, and their feeds.
    self.graph_ops = []
    self.feed_dict = {}

  @property
  def path(self):
    return self._path

  def attach(self, root):
    """Fills root's variables, now and as they are created."""
    _PENDING.setdefault(root, []).append(self)
    for name, node in list(_tracked_nodes(root)):
      self.fill(name, node)

  def _name_in_checkpoint(self, name, node):
    """`name`, or its name in earlier versions if the checkpoint has the
    earlier names (legacy_names.py): more of the graph's renamed
    variables are there under their earlier names than under their
    names now (some names are both: "dense_1/bias" was a second dense's
    bias, and is now the first's)."""
    table = getattr(node, "earlier_names", None)
    earlier = None if table is None else table.earlier_name(name)
    if earlier is None:
      return name
    if table not in self._uses_earlier_names:
      renamed = table.renamed_variables()
      now = sum(n in self._keys for n in renamed)
      before = sum(n in self._keys for n in renamed.values())
      self._uses_earlier_names[table] = before > now
    return earlier if self._uses_earlier_names[table] else name

  def fill(self, name, node):
    """Loads variable `name` (its checkpoint node) if the checkpoint has it.

    Raises:
      ValueError: the stored value's shape differs from the variable's.
    """
    if not _is_variable(node) or name in self._seen:
      return
    self._seen.add(name)
    if self._wanted is not None and not self._wanted(name):
      return
    key = self._keys.get(self._name_in_checkpoint(name, node))
    if key is None:
      self.missing.append(name)
      return
    value = self._reader.get_tensor(key)
    stored = list(value.shape)
    if isinstance(node, tf.Variable):
      expected, described = node.shape.as_list(), "a TF variable"
    else:
      expected, described = node.shape.to_integer_list, str(node.shape)
    if stored != expected:
      raise ValueError(
          f"Checkpoint {self._path}: variable {name!r} has shape {stored} "
          f"there, but the model's variable has shape {expected} "
          f"({described}).")
    if isinstance(node, tf.Variable):
      pending = _assign_plain(node, value)
    else:
      pending = node.assign_full(value)
    if pending is not None:
      self.graph_ops.append(pending[0])
      self.feed_dict.update(pending[1])
    self.restored.append(name)
