"""Collective back ends of SimdMeshImpl.

A SIMD program is the program of one processor; its collectives name the
groups of processors that take part (lists of processor numbers, one list
per group) and find their own group at run time from the processor number.

`HostCollectives` uses TensorFlow's V2 collective ops (CPU, and GPU where TF
picks NCCL): group sizes and keys come from `assign_group_v2` on the
processor-number tensor, so one traced program serves every device. Each
device's call passes an ordering token (the handle of a resource variable
on that device); without it the V2 ops wait forever for each other.

Member order. TF ranks the members of a collective group its own way (on
CPU by device name; on GPU possibly by interconnect), and all-gather and
all-to-all follow that rank order, not the order a group is listed in.
Mesh TensorFlow's groups are listed in coordinate order, which need not be
TF's (devices given in another order, a logical-to-physical permutation).
So the first all-gather or all-to-all of a program over a grouping asks
each member's rank once (a gather of one int per member) and blocks are
reordered to the listed order.

Timeouts. A V2 collective waits until every member of its group has
called it. A member that never does (a frozen or dead task of a cluster, a
processor that took another branch) would leave the others waiting
forever, so every call that runs collectives holds a deadline
(module collective_deadline: DEFAULT_TIMEOUT_SECONDS per step unless the
mesh implementation is given another), after which the process's
collectives are aborted; later ones fail at once with the same cause.
`is_timeout` recognises both. TF's own per-op timeout is used only when a
timeout is given explicitly (a cluster, whose remote ops the local abort
may not reach): it holds a thread per collective call for the timeout's
length.
"""

import math

import itertools
import threading
import weakref

import tensorflow as tf
from tensorflow.python.ops import collective_ops  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow.backend import slice_utils

# Group and instance keys are process-wide in TF's collective executor.
_KEY_LOCK = threading.Lock()
_NEXT_GROUP_KEY = itertools.count(1000)
_NEXT_INSTANCE_KEY = itertools.count(1)
_GROUP_BASE_KEYS = {}

# Seconds a collective may wait for its group: long enough for any step's
# work between two collectives, short enough that a lost member is
# reported the same hour.
DEFAULT_TIMEOUT_SECONDS = 600.0

_TIMEOUT_MESSAGES = ("Collective has timed out",
                     "timed out waiting for other workers",
                     "Collective ops is aborted by")

_MERGE_OPS = {"SUM": "Add", "MAX": "Max", "MIN": "Min"}
_LOCAL_REDUCTIONS = {"SUM": tf.reduce_sum, "MAX": tf.reduce_max,
                     "MIN": tf.reduce_min}

# Dtypes that TF's host collective kernels lack, and the dtype each travels
# as; every value of the first is exactly a value of the second. TF 2.21's
# all-reduce and all-to-all take bfloat16, its all-gather does not.
_WIRE_DTYPES = {tf.bool: tf.int32}
_GATHER_WIRE_DTYPES = {tf.bool: tf.int32, tf.bfloat16: tf.float32}


def _group_base_key(devices, group_assignment):
  """A base key for `group_assignment` on `devices`, the same on every call.

  Groups of the assignment take keys base, base + 1, ...
  """
  key = (tuple(devices), tuple(tuple(g) for g in group_assignment))
  with _KEY_LOCK:
    if key not in _GROUP_BASE_KEYS:
      base = next(_NEXT_GROUP_KEY)
      for _ in range(len(group_assignment) - 1):
        next(_NEXT_GROUP_KEY)
      _GROUP_BASE_KEYS[key] = base
    return _GROUP_BASE_KEYS[key]


def _instance_key():
  with _KEY_LOCK:
    return next(_NEXT_INSTANCE_KEY)


def check_timeout(timeout_seconds, what="collective_timeout_seconds"):
  """`timeout_seconds` as a float (None: the default); raises ValueError
  unless it is positive and finite (no collective waits without bound)."""
  if timeout_seconds is None:
    return DEFAULT_TIMEOUT_SECONDS
  try:
    value = float(timeout_seconds)
  except (TypeError, ValueError):
    value = math.nan
  if not 0 < value < math.inf:
    raise ValueError(
        f"{what}={timeout_seconds!r}: expected a positive, finite number of "
        f"seconds (default {DEFAULT_TIMEOUT_SECONDS:g}); a collective "
        "never waits without bound.")
  return value


def is_timeout(error):
  """Whether tf.errors.OpError `error` is a host collective's timeout (or
  a collective failing because an earlier one timed out)."""
  message = getattr(error, "message", "") or ""
  return isinstance(error, tf.errors.OpError) and any(
      m in message for m in _TIMEOUT_MESSAGES)


class HostCollectives:
  """Collectives among the devices of one host (or of a TF cluster).

  Args:
    devices: the device of each processor, in processor order.
    pnum_fn: returns the processor-number tensor of the program being
      traced.
    token_fn: returns this program's ordering token (a resource handle).
    timeout_seconds: the deadline of one step's collectives (None:
      DEFAULT_TIMEOUT_SECONDS, kept by collective_deadline alone; a given
      value also sets TF's per-op timeout, which costs a thread per
      collective call while it lasts).
  """

  name = "host"

  def __init__(self, devices, pnum_fn, token_fn, timeout_seconds=None):
    self._timeout = check_timeout(timeout_seconds)
    self._op_timeout = 0 if timeout_seconds is None else self._timeout
    self._devices = list(devices)
    self._pnum_fn = pnum_fn
    self._token_fn = token_fn
    # Graph -> {grouping: rank order tensor} (see _rank_order).
    self._rank_orders = weakref.WeakKeyDictionary()

  @property
  def timeout_seconds(self):
    """How long a collective waits for its group before it fails."""
    return self._timeout

  def _instance_key(self):
    """A new instance key for the next collective of the program."""
    return _instance_key()

  def _group(self, group_assignment):
    base = _group_base_key(self._devices, group_assignment)
    return collective_ops.assign_group_v2(group_assignment, self._pnum_fn(),
                                          base_key=base)

  def all_reduce(self, x, group_assignment, reduction):
    """Reduces `x` ("SUM", "MAX", "MIN") within each group, exactly."""
    wire = _WIRE_DTYPES.get(x.dtype)
    if wire is not None:
      return tf.cast(
          self.all_reduce(tf.cast(x, wire), group_assignment, reduction),
          x.dtype)
    group_size, group_key = self._group(group_assignment)
    return collective_ops.all_reduce_v2(
        x, group_size, group_key, self._instance_key(),
        merge_op=_MERGE_OPS[reduction], final_op="Id",
        ordering_token=self._token_fn(), timeout=self._op_timeout)

  def _raw_all_gather(self, x, group_assignment):
    """all_gather_v2: the members' x on axis 0, in TF's rank order."""
    group_size, group_key = self._group(group_assignment)
    return collective_ops.all_gather_v2(
        x, group_size, group_key, self._instance_key(),
        ordering_token=self._token_fn(), timeout=self._op_timeout)

  def _rank_order(self, group_assignment):
    """int32 [group size]: entry r is the position in its listed group of
    the member TF ranks r. One small gather per grouping and program."""
    graph = tf.compat.v1.get_default_graph()
    orders = self._rank_orders.setdefault(graph, {})
    pnum = self._pnum_fn()
    # Per processor-number tensor too: a strategy's replicas may be traced
    # into one graph, and each must take part in its own probe.
    key = (pnum.ref() if tf.is_tensor(pnum) else pnum,
           tuple(tuple(g) for g in group_assignment))
    if key not in orders:
      position = [0] * len(self._devices)
      for group in group_assignment:
        for i, member in enumerate(group):
          position[member] = i
      mine = tf.gather(tf.constant(position, tf.int32), pnum)
      orders[key] = self._raw_all_gather(mine[tf.newaxis], group_assignment)
    return orders[key]

  def _reorder_blocks(self, x, n, order):
    """x cut into n equal blocks on axis 0, block order[i] put at i."""
    shape = tf.shape(x)
    blocks = tf.reshape(x, tf.concat([[n, shape[0] // n], shape[1:]], 0))
    result = tf.reshape(tf.gather(blocks, order), shape)
    result.set_shape(x.shape)
    return result

  def all_gather(self, x, group_assignment):
    """Concatenates the groups' `x` on axis 0, in group order."""
    wire = _GATHER_WIRE_DTYPES.get(x.dtype)
    if wire is not None:
      return tf.cast(self.all_gather(tf.cast(x, wire), group_assignment),
                     x.dtype)
    n = len(group_assignment[0])
    gathered = self._raw_all_gather(x, group_assignment)
    # Block r came from the member ranked r: the listed i-th member's block
    # is at its rank.
    return self._reorder_blocks(
        gathered, n,
        tf.math.invert_permutation(self._rank_order(group_assignment)))

  def all_to_all(self, x, group_assignment):
    """Member k of a group gets block k (axis 0) of every member's `x`,
    concatenated on axis 0 in group order."""
    wire = _WIRE_DTYPES.get(x.dtype)
    if wire is not None:
      return tf.cast(self.all_to_all(tf.cast(x, wire), group_assignment),
                     x.dtype)
    n = len(group_assignment[0])
    order = self._rank_order(group_assignment)
    # TF sends block r to the member ranked r and stacks what arrives by the
    # sender's rank.
    send = self._reorder_blocks(x, n, order)
    group_size, group_key = self._group(group_assignment)
    received = collective_ops.all_to_all_v2(
        send, group_size, group_key, self._instance_key(),
        ordering_token=self._token_fn(), timeout=self._op_timeout)
    return self._reorder_blocks(received, n,
                                tf.math.invert_permutation(order))

  def reduce_scatter(self, x, group_assignment, reduction):
    """Member k of a group gets the reduction ("SUM", "MAX", "MIN") of
    block k (axis 0) of every member's `x`; axis 0 shrinks group-size
    times.

    TF's CollectiveReduceScatterV2 has no CPU implementation (TF 2.21
    fails with "did not find collective implementation"), so this is an
    all-to-all of the blocks (member order handled there) and a local
    reduction of the n blocks received: each member sends (n-1)/n of x,
    the bandwidth-optimal amount, and reduces 1/n of the group's data.
    """
    n = len(group_assignment[0])
    wire = _WIRE_DTYPES.get(x.dtype)
    if wire is not None:
      return tf.cast(
          self.reduce_scatter(tf.cast(x, wire), group_assignment, reduction),
          x.dtype)
    received = self.all_to_all(x, group_assignment)
    shape = tf.shape(x)
    blocks = tf.reshape(received, tf.concat([[n, shape[0] // n], shape[1:]],
                                            0))
    result = _LOCAL_REDUCTIONS[reduction](blocks, axis=0)
    static = x.shape.as_list()
    result.set_shape([None if static[0] is None else static[0] // n] +
                     static[1:])
    return result

  def permute(self, x, source_target_pairs, group_assignment):
    """Each target of a (source, target) pair of processor numbers gets the
    source's `x`; processors that are no target get zeros. Pairs stay within
    the groups of `group_assignment`."""
    source_of = {target: source for source, target in source_target_pairs}
    index_in_group = {member: i for group in group_assignment
                      for i, member in enumerate(group)}
    table = [index_in_group[source_of[p]] if p in source_of else -1
             for p in range(len(self._devices))]
    gathered = self.all_gather(tf.expand_dims(x, 0), group_assignment)
    source = tf.gather(tf.constant(table, tf.int32), self._pnum_fn())
    value = tf.gather(gathered, tf.maximum(source, 0))
    return slice_utils.broadcasting(
        tf.where, [source >= 0, value, tf.zeros_like(value)])
