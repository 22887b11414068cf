"""Utilities: ops outside rewrites, balanced variable placement, summaries
through a TPUEstimator-style host call, and the rank of a TPU topology."""

import contextlib
import heapq
import weakref

from absl import logging
import tensorflow as tf

from mesh_tensorflow import global_step as global_step_lib
from mesh_tensorflow.ops import debug

# Lowering an mtf.scalar_summary outside eager execution adds (name, scalar
# tf.Tensor) to this collection of the TF graph being built, as in the
# original; create_host_call reads it and remove_summaries empties it.
SCALAR_SUMMARIES_COLLECTION_KEY = debug.SCALAR_SUMMARIES_COLLECTION_KEY

_VARIABLE_OP_TYPES = ("Variable", "VariableV2", "VarHandleOp")


@contextlib.contextmanager
def outside_all_rewrites():
  """Builds ops outside control-dependency (and TPU rewrite) contexts."""
  if tf.executing_eagerly():
    yield
    return
  with tf.control_dependencies(None):
    yield


class BalancedVariablePlacer:
  """Places each new variable on the device with the fewest bytes so far.

  `device_function(var)` is a device function (`tf.device(placer.
  device_function)`, or `mtf.Mesh(graph, name, variable_placer=placer)`
  for the master variables of compat graph mode): a variable op goes to
  the device with the least memory in use (ties: the smallest device name),
  which is then charged its bytes; any other op goes to the device of the
  last variable placed (at first, `devices[0]`).

  Args:
    devices: list of device strings.
    init_usage: optional list of bytes already used on each device.
  """

  def __init__(self, devices, init_usage=None):
    if not devices:
      raise ValueError("BalancedVariablePlacer needs at least one device.")
    if not init_usage:
      init_usage = [0] * len(devices)
    if len(init_usage) != len(devices):
      raise ValueError(f"init_usage has {len(init_usage)} entries for "
                       f"{len(devices)} devices.")
    self._devices = list(devices)
    self._heap = [(usage, str(d), i) for i, (usage, d) in enumerate(
        zip(init_usage, devices))]
    heapq.heapify(self._heap)
    self._last_device = self._devices[0]

  def device_function(self, var):
    """The device of op `var` (a variable op, or any other op)."""
    if var.type not in _VARIABLE_OP_TYPES:
      return self._last_device
    usage, name, index = heapq.heappop(self._heap)
    usage += _variable_bytes(var)
    heapq.heappush(self._heap, (usage, name, index))
    self._last_device = self._devices[index]
    logging.debug("Placed variable %s on %s (%d bytes there).", var.name,
                  self._last_device, usage)
    return self._last_device

  @property
  def usage(self):
    """Bytes placed on each device, in device order."""
    return [u for u, _, _ in sorted(self._heap, key=lambda e: e[2])]


def _variable_bytes(op):
  """Bytes of the variable an op creates (from its shape and dtype attrs)."""
  node = op.node_def if hasattr(op, "node_def") else op
  shape = tf.TensorShape(node.attr["shape"].shape)
  dtype = tf.as_dtype(node.attr["dtype"].type)
  size = shape.num_elements() if shape.is_fully_defined() else 0
  return size * dtype.size


# model_dir -> the summary writer of host calls in eager and tf.function
# code; in graph mode, one per graph.
_WRITERS = {}
_GRAPH_WRITERS = weakref.WeakKeyDictionary()


def host_call_writer(model_dir):
  """The summary writer of host calls writing to `model_dir` (one per
  graph in graph mode)."""
  if tf.executing_eagerly() or tf.inside_function():
    with tf.init_scope():
      if model_dir not in _WRITERS:
        _WRITERS[model_dir] = tf.summary.create_file_writer(model_dir)
      return _WRITERS[model_dir]
  writers = _GRAPH_WRITERS.setdefault(tf.compat.v1.get_default_graph(), {})
  if model_dir not in writers:
    writers[model_dir] = tf.summary.create_file_writer(model_dir)
  return writers[model_dir]


def create_host_call(model_dir):
  """A TPUEstimator host call writing the graph's mtf scalar summaries.

  Reads the (name, scalar) pairs that lowering mtf.scalar_summary added to
  the graph being built (SCALAR_SUMMARIES_COLLECTION_KEY) and returns
  `(host_call_fn, [global_step] + values)`, each value reshaped to [1]
  (int64 ones as int32, bfloat16 ones as float32), or None if there are no
  summaries. `host_call_fn(global_step, *values)` writes each value's mean
  as a scalar summary to `model_dir` at `global_step`. Give it to
  `TPUEstimatorSpec(host_call=...)`: the estimator calls it after each
  training step and then writes the summaries only through it. In
  `tf.compat.v1` graph mode it returns the summary ops; run
  `host_call_writer(model_dir).init()` once before them and its `flush()`
  after.

  Args:
    model_dir: the directory of the summaries.

  Returns:
    (host_call_fn, list of tf.Tensors), or None.
  """
  graph = tf.compat.v1.get_default_graph()
  summaries = list(graph.get_collection(SCALAR_SUMMARIES_COLLECTION_KEY))
  if not summaries:
    return None
  names = [name for name, _ in summaries]

  def for_host(value):
    if value.shape.rank:
      raise ValueError(f"create_host_call: summary {value.name!r} is not a "
                       f"scalar (shape {value.shape}).")
    if value.dtype == tf.int64:
      value = tf.cast(value, tf.int32)
    elif value.dtype == tf.bfloat16:
      value = tf.cast(value, tf.float32)
    return tf.reshape(value, [1])

  values = [for_host(value) for _, value in summaries]
  step = global_step_lib.get_or_create_tf_global_step()
  step = tf.reshape(tf.cast(step, tf.int32), [1])

  def host_call_fn(global_step, *args):
    """Writes the summaries at global_step[0] (runs on the host)."""
    if len(args) != len(names):
      raise ValueError(f"host_call_fn got {len(args)} values for the "
                       f"{len(names)} summaries {names}.")
    writer = host_call_writer(model_dir)
    with writer.as_default(step=tf.cast(global_step[0], tf.int64)):
      for name, value in zip(names, args):
        debug.write_scalar(name, tf.reduce_mean(value))
    if tf.inside_function() or tf.executing_eagerly():
      # Its own writer: flushed here, as no training loop knows of it.
      writer.flush()
      return None
    return tf.compat.v1.summary.all_v2_summary_ops()

  return host_call_fn, [step] + values


def remove_summaries():
  """Empties the graph's collection of lowered mtf scalar summaries.

  After it, create_host_call finds no summaries (e.g. once a host call has
  been made of them). The estimator still writes the summaries of a
  model_fn that gives no host call.
  """
  graph = tf.compat.v1.get_default_graph()
  collection = graph.get_collection_ref(SCALAR_SUMMARIES_COLLECTION_KEY)
  logging.debug("Removing summaries %s", collection)
  del collection[:]


def topology_rank(topology):
  """The number of dimensions of a TPU topology's mesh.

  Args:
    topology: a tf.tpu.experimental.Topology, or its serialized proto
      (bytes).

  Returns:
    len(topology.mesh_shape), e.g. 4 for the [x, y, z, cores] meshes of
    TPU v3/v4.
  """
  if isinstance(topology, bytes):
    topology = tf.tpu.experimental.Topology(serialized=topology)
  if not isinstance(topology, tf.tpu.experimental.Topology):
    raise ValueError("topology_rank: `topology` is not a "
                     f"tf.tpu.experimental.Topology; got {type(topology)}.")
  return len(topology.mesh_shape)
