"""One view of a tf.Graph or an mtf.Graph for the layout search.

The scheduler and the layout optimizer need operations in order, their
input and output tensors, each tensor's dtype, shape, size (whole, or per
processor under a partial layout) and mtf dimension names, which tensors are
final outputs (never freed), and the tensors held in memory at each step of
a schedule. `GraphInterface` answers these for either kind of graph by name
("op", "op:0"), and writes a `CostGraphDef` protocol buffer of the graph
(tensorflow/core/framework/cost_graph.proto), the form TF's own memory
schedulers read.

Changed from the original: tensor sizes per processor use exact integer
ceiling division; `get_tensor_slice_size` gives the bytes of one slice
exactly, dimension by dimension (a dimension split unevenly is padded).
"""

import collections

import tensorflow as tf
from tensorflow.core.framework import cost_graph_pb2

from mesh_tensorflow import graph as graph_lib


class GraphInterface(object):
  """A tf.Graph or mtf.Graph seen through names.

  Example:
    graph = GraphInterface(mtf_graph)
    for op_name in graph.get_all_operation_names():
      inputs = list(graph.get_operation_input_names(op_name))
    schedule = scheduler.minimize_peak_memory(graph, "LIST")
    contents = graph.compute_memory_contents_under_schedule(schedule)

  Attributes:
    canonical_device: the device whose tensors count for memory (others,
      in a tf.Graph, count zero); None counts every tensor.
  """

  def __init__(self, graph, canonical_device=None):
    """Indexes `graph`.

    Args:
      graph: a tf.Graph or an mtf.Graph.
      canonical_device: optional device name for
        is_tensor_on_canonical_device.

    Raises:
      TypeError: `graph` is neither.
    """
    if isinstance(graph, tf.Graph):
      operations = graph.get_operations()
    elif isinstance(graph, graph_lib.Graph):
      operations = graph.operations
    else:
      raise TypeError(
          f"GraphInterface needs a tf.Graph or an mtf.Graph, got "
          f"{type(graph).__name__}.")
    self._graph = graph
    self.canonical_device = canonical_device
    self._operations = list(operations)
    self._operation_by_name = {op.name: op for op in self._operations}
    self._tensor_by_name = {}
    self._tensor_ids = {}
    for i, op in enumerate(self._operations):
      for j, tensor in enumerate(op.outputs):
        self._tensor_by_name[tensor.name] = tensor
        self._tensor_ids[tensor.name] = (i, j)
    self._final_tensor_names = set()
    self._alias_of = {}  # {tensor name: the tensor whose buffer it is}
    # {operation name: groups of its inputs, each read once all exist}.
    self._apart = {}
    self._facts = {}

  # ------------------------------------------------------------ operations

  def get_num_operations(self):
    """The number of operations."""
    return len(self._operations)

  def get_all_operation_names(self):
    """Yields the operations' names in graph order."""
    for op in self._operations:
      yield op.name

  def get_operation_input_names(self, operation_name):
    """Yields the names of the operation's inputs, in order."""
    for tensor in self._operation(operation_name).inputs:
      yield tensor.name

  def get_operation_output_names(self, operation_name):
    """Yields the names of the operation's outputs, in order."""
    for tensor in self._operation(operation_name).outputs:
      yield tensor.name

  def get_operation_device(self, operation_name):
    """The operation's device (a tf op's), or None (an mtf op's)."""
    op = self._operation(operation_name)
    return op.device if isinstance(op, tf.Operation) else None

  def get_operation_mtf_dimension_names(self, operation_name):
    """Set of the mtf dimension names of the operation's inputs and
    outputs."""
    names = set()
    for tensor_name in self.get_operation_input_names(operation_name):
      names.update(self.get_tensor_mtf_dimension_names(tensor_name))
    for tensor_name in self.get_operation_output_names(operation_name):
      names.update(self.get_tensor_mtf_dimension_names(tensor_name))
    return names

  # --------------------------------------------------------------- tensors

  def get_all_tensor_names(self):
    """Yields every output tensor's name, operation by operation."""
    for op in self._operations:
      for tensor in op.outputs:
        yield tensor.name

  def get_tensor_dtype(self, tensor_name):
    """The tensor's tf.DType."""
    return self._tensor_facts(tensor_name)[0]

  def get_tensor_shape(self, tensor_name):
    """The tensor's tf.TensorShape."""
    tensor = self._tensor(tensor_name)
    if isinstance(tensor, graph_lib.Tensor):
      return tf.TensorShape(tensor.shape.to_integer_list)
    return tensor.shape

  def get_tensor_mtf_dimension_names(self, tensor_name):
    """The tensor's mtf dimension names (none for a tf tensor)."""
    return list(self._tensor_facts(tensor_name)[2])

  def get_tensor_num_entries(self, tensor_name, partial_layout=None,
                             mesh_dimension_to_size=None):
    """Entries of the tensor; per processor under `partial_layout`.

    Args:
      tensor_name: the tensor's name.
      partial_layout: optional {mtf dimension name: mesh dimension name}.
      mesh_dimension_to_size: {mesh dimension name: size}, needed with
        partial_layout.
    """
    num_entries = self._tensor_facts(tensor_name)[1]
    if not partial_layout:
      return num_entries
    for name in self.get_tensor_mtf_dimension_names(tensor_name):
      mesh_name = partial_layout.get(name)
      if mesh_name is not None:
        size = mesh_dimension_to_size[mesh_name]
        num_entries = -(-num_entries // size)
    return num_entries

  def get_tensor_size(self, tensor_name, partial_layout=None,
                      mesh_dimension_to_size=None):
    """Bytes of the tensor; per processor under `partial_layout` (see
    get_tensor_num_entries)."""
    return self.get_tensor_dtype(tensor_name).size * (
        self.get_tensor_num_entries(tensor_name, partial_layout,
                                    mesh_dimension_to_size))

  def get_tensor_slice_size(self, tensor_name, partial_layout,
                            mesh_dimension_to_size):
    """Bytes of one processor's slice of the tensor under `partial_layout`
    ({mtf dimension name: mesh dimension name}), padding included: each
    dimension split k ways has ceil(size / k) entries, as the lowering
    holds it (the same as get_tensor_size when every k divides)."""
    dtype, num_entries, names, sizes = self._tensor_facts(tensor_name)
    if partial_layout:
      num_entries = 1
      for name, size in zip(names, sizes):
        mesh_name = partial_layout.get(name)
        if mesh_name is not None:
          size = -(-size // mesh_dimension_to_size[mesh_name])
        num_entries *= size
    return dtype.size * num_entries

  def get_tensor_device(self, tensor_name):
    """The tensor's device (a tf tensor's), or None (an mtf tensor's)."""
    tensor = self._tensor(tensor_name)
    return tensor.device if isinstance(tensor, tf.Tensor) else None

  def is_tensor_on_canonical_device(self, tensor_name):
    """Whether the tensor counts for the canonical device's memory: it has
    no device, or that device."""
    device = self.get_tensor_device(tensor_name)
    return not device or device == self.canonical_device

  def set_tensor_final(self, tensor_name):
    """Marks the tensor as a final output: it is never freed."""
    self._tensor(tensor_name)
    self._final_tensor_names.add(tensor_name)

  def is_tensor_final(self, tensor_name):
    """Whether set_tensor_final marked the tensor."""
    self._tensor(tensor_name)
    return tensor_name in self._final_tensor_names

  def set_tensor_alias(self, tensor_name, source_name):
    """Marks the tensor as another name for `source_name`'s buffer (e.g.
    an operation whose lowering passes its input on): it is never
    allocated, and its readers keep the source in memory."""
    self._tensor(tensor_name)
    self._alias_of[tensor_name] = self.get_tensor_buffer(source_name)

  def set_operation_reads_apart(self, operation_name, groups=()):
    """Marks the operation as one whose lowering takes its inputs apart,
    each as soon as it exists (mtf.Assign: one TF assignment per
    variable), not once all of them exist: an input it alone reads is
    freed as soon as made.

    Args:
      operation_name: the operation's name.
      groups: optional iterables of its input names taken together, once
        the last of the group exists (autostacked variables' new values,
        stacked before they are assigned); each member is held until then.
    """
    self._operation(operation_name)
    inputs = set(self.get_operation_input_names(operation_name))
    groups = tuple(tuple(dict.fromkeys(g)) for g in groups)
    for group in groups:
      for name in group:
        if name not in inputs:
          raise ValueError(f"{name!r} is not an input of {operation_name!r}.")
    self._apart[operation_name] = tuple(g for g in groups if len(g) > 1)

  def get_operation_apart_groups(self, operation_name):
    """The groups of set_operation_reads_apart, or None if the operation
    reads its inputs together."""
    return self._apart.get(operation_name)

  def get_tensor_buffer(self, tensor_name):
    """The name of the tensor whose buffer `tensor_name` is (itself unless
    set_tensor_alias made it an alias)."""
    self._tensor(tensor_name)
    return self._alias_of.get(tensor_name, tensor_name)

  # ---------------------------------------------------------------- memory

  def compute_cost_graph(self, devices=None):
    """A CostGraphDef with a node per operation (in order, id = position)
    giving each input's producer and each output's size, dtype and shape.

    Args:
      devices: optional list of device names; an output on a device not
        listed gets size 0 and no shape (device-less mtf tensors are not
        affected).

    An operation with a final output is marked final (the proto marks
    nodes, not tensors).
    """
    cost_graph = cost_graph_pb2.CostGraphDef()
    for i, op_name in enumerate(self.get_all_operation_names()):
      node = cost_graph.node.add(
          name=op_name, device=self.get_operation_device(op_name), id=i)
      for input_name in self.get_operation_input_names(op_name):
        producer, port = self._tensor_ids[input_name]
        node.input_info.add(preceding_node=producer, preceding_port=port)
      for output_name in self.get_operation_output_names(op_name):
        device = self.get_tensor_device(output_name)
        dtype = self.get_tensor_dtype(output_name).as_datatype_enum
        if devices is None or device is None or device in devices:
          node.output_info.add(
              size=self.get_tensor_size(output_name), alias_input_port=-1,
              dtype=dtype,
              shape=self.get_tensor_shape(output_name).as_proto())
        else:
          node.output_info.add(size=0, alias_input_port=-1, dtype=dtype)
        if self.is_tensor_final(output_name):
          node.is_final = True
    return cost_graph

  def compute_memory_contents_under_schedule(self, schedule):
    """The tensors in memory while each scheduled operation runs.

    Running the operations in `schedule` order (ids into
    get_all_operation_names, assumed topological), an operation's outputs
    are allocated when it runs; then outputs nobody reads and inputs whose
    last reader it was are freed (final tensors never are). An alias
    (set_tensor_alias) is never allocated; reading it reads its source.

    Returns:
      a list of frozensets of tensor names, the i-th while schedule[i]
      runs.
    """
    in_memory = set()
    contents = []
    for allocated, freed in self.compute_memory_deltas_under_schedule(
        schedule):
      in_memory.difference_update(freed)
      in_memory.update(allocated)
      contents.append(frozenset(in_memory))
    return contents

  def compute_memory_deltas_under_schedule(self, schedule):
    """compute_memory_contents_under_schedule as changes: the i-th entry is
    (names allocated, names freed) from step i - 1's contents to step i's.
    Consecutive steps differ by a few tensors, so this takes time and space
    linear in the graph where the contents take the steps times their
    sizes."""
    readers_left = self._count_readers()
    buffer_of = self._alias_of
    # An apart operation's group is read when its last member is made.
    groups = self._group_buffers()
    members_left = [set(g) for g in groups]
    groups_of = collections.defaultdict(list)
    for g, members in enumerate(groups):
      for name in members:
        groups_of[name].append(g)
    deltas = []
    freed = []
    for op_id in schedule:
      op_name = self._operations[op_id].name
      outputs = tuple(name for name in self.get_operation_output_names(
          op_name) if name not in buffer_of)
      deltas.append((outputs, tuple(freed)))
      freed = []
      for name in outputs:
        if readers_left[name] == 0:
          freed.append(name)
      for name in outputs:
        for g in groups_of.get(name, ()):
          members_left[g].discard(name)
          if members_left[g]:
            continue
          for member in groups[g]:
            readers_left[member] -= 1
            if readers_left[member] == 0:
              freed.append(member)
      if op_name in self._apart:
        continue
      for name in self.get_operation_input_names(op_name):
        name = buffer_of.get(name, name)
        readers_left[name] -= 1
        if readers_left[name] == 0:
          freed.append(name)
    return deltas

  # --------------------------------------------------------------- helpers

  def _count_readers(self):
    """{tensor name: reads by operations}; a final tensor gets one extra
    read that never happens, so it stays in memory."""
    readers = collections.Counter()
    for name in self.get_all_tensor_names():
      readers[name] = 1 if self.is_tensor_final(name) else 0
    for name, source in self._alias_of.items():
      if name in self._final_tensor_names:
        readers[source] += 1
    for op_name in self.get_all_operation_names():
      if op_name in self._apart:
        continue
      for name in self.get_operation_input_names(op_name):
        readers[self._alias_of.get(name, name)] += 1
    for members in self._group_buffers():
      for name in members:
        readers[name] += 1
    return readers

  def _group_buffers(self):
    """[buffer names] of each group of the apart operations, once each."""
    return [sorted({self._alias_of.get(name, name) for name in group})
            for groups in self._apart.values() for group in groups]

  def _tensor_facts(self, tensor_name):
    """(tf.DType, number of entries, mtf dimension names, their sizes) of
    a tensor, computed once: the optimizer asks for them many times."""
    facts = self._facts.get(tensor_name)
    if facts is None:
      tensor = self._tensor(tensor_name)
      if isinstance(tensor, graph_lib.Tensor):
        num_entries = tensor.shape.size
        names = tuple(d.name for d in tensor.shape.dims)
        sizes = tuple(d.size for d in tensor.shape.dims)
      else:
        num_entries = 1
        for dim in tensor.shape.as_list():
          num_entries *= dim
        names = sizes = ()
      facts = (tf.as_dtype(tensor.dtype), num_entries, names, sizes)
      self._facts[tensor_name] = facts
    return facts

  def _operation(self, operation_name):
    try:
      return self._operation_by_name[operation_name]
    except KeyError:
      raise KeyError(f"the graph has no operation {operation_name!r}") from None

  def _tensor(self, tensor_name):
    try:
      return self._tensor_by_name[tensor_name]
    except KeyError:
      raise KeyError(f"the graph has no tensor {tensor_name!r}") from None
