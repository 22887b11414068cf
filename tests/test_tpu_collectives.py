"""TpuCollectives: the TPU ops it builds, and its answers on a simulator.

There is no TPU here, so (a) programs are built in a tf.Graph with the real
TPU ops and the ops are inspected, and (b) a lockstep simulator runs every
processor's program eagerly in its own thread; its primitives meet at a
barrier and give TPU semantics over PHYSICAL replica ids, so a wrong
logical-to-physical mapping gives wrong answers.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.backend import tpu_collectives

IDENTITY = list(range(8))
REVERSED = list(range(8))[::-1]
RING = [0, 1, 2, 3, 7, 6, 5, 4]
SHUFFLED = [5, 2, 7, 0, 3, 6, 1, 4]

# Mesh 2x4 (rows of 4): groups along each axis, everything, and a group
# order that is not sorted.
ALONG_ROWS = [[0, 4], [1, 5], [2, 6], [3, 7]]
ALONG_COLS = [[0, 1, 2, 3], [4, 5, 6, 7]]
ALL = [list(range(8))]
UNSORTED = [[3, 1, 0, 2], [6, 7, 5, 4]]
GROUPS = [ALONG_ROWS, ALONG_COLS, ALL, UNSORTED]
GROUP_IDS = ["rows", "cols", "all", "unsorted"]

_TPU_DTYPES = (tf.float32, tf.bfloat16, tf.int32)


# ------------------------------------------------------------- simulator


class LockstepPrimitives:
  """TPU collectives among threads, one thread per physical replica.

  Each call waits until every replica has made it; only float32, bfloat16
  and int32 are accepted, as on a TPU.
  """

  def __init__(self, num_replicas):
    self._barrier = threading.Barrier(num_replicas, timeout=30)
    self._slots = [None] * num_replicas
    self._local = threading.local()

  def set_replica(self, replica):
    self._local.replica = replica

  def abort(self):
    self._barrier.abort()

  def _exchange(self, x, what):
    assert x.dtype in _TPU_DTYPES, x.dtype
    me = self._local.replica
    self._slots[me] = (x, what)
    self._barrier.wait()
    everyone = list(self._slots)
    self._barrier.wait()
    assert all(w == what for _, w in everyone), "replicas disagree"
    return me, [v for v, _ in everyone]

  @staticmethod
  def _group(me, group_assignment):
    (group,) = [list(g) for g in group_assignment if me in g]
    return group

  def cross_replica_sum(self, x, group_assignment):
    me, xs = self._exchange(x, ("crs", str(group_assignment)))
    return tf.add_n([xs[r] for r in self._group(me, group_assignment)])

  def all_to_all(self, x, concat_dimension, split_dimension, split_count,
                 group_assignment):
    me, xs = self._exchange(
        x, ("a2a", concat_dimension, split_dimension, split_count,
            str(group_assignment)))
    group = self._group(me, group_assignment)
    assert split_count == len(group)
    k = group.index(me)
    return tf.concat([tf.split(xs[r], split_count, split_dimension)[k]
                      for r in group], concat_dimension)

  def reduce_scatter(self, x, scatter_dimension, group_assignment,
                     reduce_op):
    me, xs = self._exchange(
        x, ("reduce_scatter", scatter_dimension, reduce_op,
            str(group_assignment)))
    group = self._group(me, group_assignment)
    fn = {"Add": tf.add_n, "Max": lambda v: tf.reduce_max(v, 0),
          "Min": lambda v: tf.reduce_min(v, 0)}[reduce_op]
    reduced = fn([xs[r] for r in group])
    return tf.split(reduced, len(group), scatter_dimension)[group.index(me)]

  def collective_permute(self, x, source_target_pairs):
    me, xs = self._exchange(x, ("permute", str(source_target_pairs)))
    sources = [s for s, t in source_target_pairs if t == me]
    return xs[sources[0]] if sources else tf.zeros_like(x)


class LockstepPrimitivesWithoutReduceScatter(LockstepPrimitives):
  """Primitives of an older TPU runtime: no reduce-scatter."""
  reduce_scatter = None


def run_spmd(l2p, fn, primitives_class=LockstepPrimitives, **kwargs):
  """Runs fn(collectives, pnum) for every logical pnum; their results."""
  n = len(l2p)
  primitives = primitives_class(n)
  local = threading.local()
  collectives = tpu_collectives.TpuCollectives(
      l2p, lambda: tf.constant(local.pnum, tf.int32), primitives=primitives,
      **kwargs)
  results = [None] * n
  failures = []

  def work(pnum):
    local.pnum = pnum
    primitives.set_replica(l2p[pnum])
    try:
      results[pnum] = fn(collectives, pnum).numpy()
    except BaseException as e:  # pylint: disable=broad-except
      failures.append(e)
      primitives.abort()

  threads = [threading.Thread(target=work, args=(p,)) for p in range(n)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  if failures:
    real = [e for e in failures
            if not isinstance(e, threading.BrokenBarrierError)]
    raise (real or failures)[0]
  return results


def _group_of(pnum, groups):
  (group,) = [g for g in groups if pnum in g]
  return group


def _inputs(dtype, shape, seed):
  """Per-processor inputs; floats include -0.0, inf and nan."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(8):
    if dtype == tf.bool:
      v = rng.rand(*shape) < 0.5
    elif dtype == tf.int64:
      v = rng.randint(-2**20, 2**20, size=shape).astype(np.int64) * 2**40 + 1
    elif dtype.is_integer:
      info = np.iinfo(dtype.as_numpy_dtype)
      v = rng.randint(info.min, info.max, size=shape, dtype=np.int64)
      v = v.astype(dtype.as_numpy_dtype)
    else:
      v = rng.randn(*shape).astype(dtype.as_numpy_dtype)
      if dtype.is_floating:
        v.flat[:3] = [-0.0, np.inf, np.nan]
    out.append(v)
  return out


def _assert_bits_equal(actual, expected):
  assert actual.dtype == expected.dtype
  assert actual.shape == expected.shape
  np.testing.assert_array_equal(actual.view(np.uint8),
                                expected.view(np.uint8))


MOVE_DTYPES = [tf.float32, tf.int32, tf.int64, tf.bool, tf.bfloat16,
               tf.float16, tf.int8, tf.uint16, tf.float64, tf.complex64]


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=lambda d: d.name)
def test_all_gather_every_dtype_bit_exact(dtype):
  xs = _inputs(dtype, [3, 5], seed=1)
  out = run_spmd(SHUFFLED, lambda c, p: c.all_gather(
      tf.constant(xs[p]), UNSORTED))
  for p in range(8):
    expected = np.concatenate([xs[m] for m in _group_of(p, UNSORTED)])
    _assert_bits_equal(out[p], expected)


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=lambda d: d.name)
def test_all_to_all_every_dtype_bit_exact(dtype):
  xs = _inputs(dtype, [8, 3], seed=2)
  out = run_spmd(RING, lambda c, p: c.all_to_all(tf.constant(xs[p]),
                                                  ALONG_COLS))
  for p in range(8):
    group = _group_of(p, ALONG_COLS)
    k = group.index(p)
    expected = np.concatenate([np.split(xs[m], 4)[k] for m in group])
    _assert_bits_equal(out[p], expected)


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=lambda d: d.name)
def test_permute_every_dtype_bit_exact(dtype):
  xs = _inputs(dtype, [3, 3], seed=3)
  # Shift right by one within each row of the 2x4 mesh, no wrap-around.
  pairs = [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)]
  out = run_spmd(REVERSED, lambda c, p: c.permute(tf.constant(xs[p]), pairs,
                                                   ALONG_COLS))
  for p in range(8):
    sources = [s for s, t in pairs if t == p]
    expected = xs[sources[0]] if sources else np.zeros_like(xs[p])
    _assert_bits_equal(out[p], expected)


@pytest.mark.parametrize("groups", GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("l2p", [IDENTITY, RING, SHUFFLED],
                         ids=["identity", "ring", "shuffled"])
def test_moves_over_groups_and_mappings(groups, l2p):
  xs = _inputs(tf.int64, [8, 2], seed=4)
  n = len(groups[0])

  def program(c, p):
    x = tf.constant(xs[p])
    return tf.concat([c.all_gather(x, groups), c.all_to_all(x, groups)], 0)

  out = run_spmd(l2p, program)
  for p in range(8):
    group = _group_of(p, groups)
    k = group.index(p)
    gathered = np.concatenate([xs[m] for m in group])
    exchanged = np.concatenate([np.split(xs[m], n)[k] for m in group])
    _assert_bits_equal(out[p], np.concatenate([gathered, exchanged]))


def _numpy_reduce(values, reduction, dtype):
  stacked = np.stack(values)
  if dtype == tf.bool:
    return (stacked.all(0) if reduction == "MIN" else stacked.any(0))
  if reduction == "SUM":
    return stacked.sum(0, dtype=stacked.dtype)
  return stacked.max(0) if reduction == "MAX" else stacked.min(0)


@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
@pytest.mark.parametrize(
    "dtype", [tf.float32, tf.int32, tf.int64, tf.bool, tf.int8, tf.uint32,
              tf.float64, tf.bfloat16], ids=lambda d: d.name)
def test_all_reduce(dtype, reduction):
  xs = _inputs(dtype, [3, 5], seed=5)
  if dtype.is_floating:
    xs = [np.nan_to_num(x.astype(np.float64), posinf=7.0).astype(x.dtype)
          for x in xs]
  out = run_spmd(SHUFFLED, lambda c, p: c.all_reduce(
      tf.constant(xs[p]), ALONG_COLS, reduction))
  for p in range(8):
    expected = _numpy_reduce([xs[m] for m in _group_of(p, ALONG_COLS)],
                             reduction, dtype)
    assert out[p].dtype == expected.dtype
    if dtype.is_floating and reduction == "SUM":
      np.testing.assert_allclose(out[p].astype(np.float64),
                                 expected.astype(np.float64),
                                 rtol=2e-2 if dtype == tf.bfloat16 else 1e-6)
    else:
      np.testing.assert_array_equal(out[p], expected)


@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
@pytest.mark.parametrize(
    "dtype", [tf.float32, tf.int32, tf.int64, tf.bool, tf.bfloat16],
    ids=lambda d: d.name)
@pytest.mark.parametrize("primitives_class", [
    LockstepPrimitives, LockstepPrimitivesWithoutReduceScatter],
                         ids=["xla", "without_reduce_scatter"])
def test_reduce_scatter(dtype, reduction, primitives_class):
  """Member k (in listed group order) gets block k of the reduction."""
  xs = _inputs(dtype, [8, 3], seed=6)
  if dtype.is_floating:
    xs = [np.nan_to_num(x.astype(np.float64), posinf=7.0).astype(x.dtype)
          for x in xs]
  out = run_spmd(SHUFFLED, lambda c, p: c.reduce_scatter(
      tf.constant(xs[p]), UNSORTED, reduction),
                 primitives_class=primitives_class)
  for p in range(8):
    group = _group_of(p, UNSORTED)
    reduced = _numpy_reduce([xs[m] for m in group], reduction, dtype)
    expected = np.split(reduced, len(group))[group.index(p)]
    assert out[p].dtype == expected.dtype
    if dtype.is_floating and reduction == "SUM":
      np.testing.assert_allclose(out[p].astype(np.float64),
                                 expected.astype(np.float64),
                                 rtol=2e-2 if dtype == tf.bfloat16 else 1e-6)
    else:
      np.testing.assert_array_equal(out[p], expected)


def test_all_reduce_int_sums_are_exact_beyond_float_precision():
  big = [np.array([2**24 + 1 + p, -(2**30) + p], np.int32) for p in range(8)]
  huge = [np.array([2**55 + 2 * p + 1], np.int64) for p in range(8)]

  def program(c, p):
    ints = c.all_reduce(tf.constant(big[p]), ALONG_ROWS, "SUM")
    longs = c.all_reduce(tf.constant(huge[p]), ALONG_ROWS, "SUM")
    return tf.concat([tf.cast(ints, tf.int64), longs], 0)

  out = run_spmd(RING, program)
  for p in range(8):
    a, b = _group_of(p, ALONG_ROWS)
    np.testing.assert_array_equal(
        out[p], np.concatenate([big[a].astype(np.int64) + big[b],
                                huge[a] + huge[b]]))


def test_bfloat16_sum_in_float32_over_large_groups():
  xs = [np.full([2], 1 + 2**-7, tf.bfloat16.as_numpy_dtype)] * 8

  def program(c, p):
    return tf.cast(c.all_reduce(tf.constant(xs[p]), ALL, "SUM"), tf.float32)

  # Summed in float32, 8 * (1 + 2**-7) = 8.0625 is exact (and a bfloat16).
  for max_group_size in (4, 8):
    out = run_spmd(IDENTITY, program,
                   allreduce_in_bfloat16_max_group_size=max_group_size)
    np.testing.assert_allclose(out[0], 8.0625,
                               rtol=0 if max_group_size == 4 else 2e-2)


# ------------------------------------------------------- graph building


def _build(fn, l2p=RING, **kwargs):
  """Builds fn(collectives, pnum) in a tf.Graph with the real TPU ops."""
  graph = tf.Graph()
  with graph.as_default():
    pnum = tf.compat.v1.placeholder(tf.int32, [], name="pnum")
    collectives = tpu_collectives.TpuCollectives(l2p, lambda: pnum, **kwargs)
    result = fn(collectives)
  return graph, result


def _ops(graph, op_type):
  return [op for op in graph.get_operations() if op.type == op_type]


def _const(tensor):
  assert tensor.op.type == "Const"
  return tf.make_ndarray(tensor.op.get_attr("value")).tolist()


def _physical(groups, l2p):
  return [[l2p[m] for m in g] for g in groups]


@pytest.mark.parametrize("groups", GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("l2p", [REVERSED, RING], ids=["reversed", "ring"])
def test_graph_all_reduce_sum(groups, l2p):
  def fn(c):
    return (c.all_reduce(tf.zeros([4, 3]), groups, "SUM"),
            c.all_reduce(tf.zeros([4, 3], tf.int32), groups, "SUM"))

  graph, (f, i) = _build(fn, l2p)
  (crs_f,), (crs_i,) = [[op for op in _ops(graph, "CrossReplicaSum")
                         if op.get_attr("T") == d] for d in (tf.float32,
                                                             tf.int32)]
  for op in (crs_f, crs_i):
    assert _const(op.inputs[1]) == _physical(groups, l2p)
  assert f.op is crs_f and i.op is crs_i  # int32 is summed as int32
  assert not _ops(graph, "Cast")
  assert f.shape == [4, 3] and i.dtype == tf.int32


def test_graph_bfloat16_sum_policy():
  def fn(c):
    x = tf.zeros([2], tf.bfloat16)
    return c.all_reduce(x, ALONG_COLS, "SUM"), c.all_reduce(x, ALL, "SUM")

  graph, _ = _build(fn, allreduce_in_bfloat16_max_group_size=4)
  types = sorted((len(_const(op.inputs[1])[0]), op.get_attr("T").name)
                 for op in _ops(graph, "CrossReplicaSum"))
  assert types == [(4, "bfloat16"), (8, "float32")]


@pytest.mark.parametrize("groups", GROUPS, ids=GROUP_IDS)
def test_graph_all_gather(groups):
  graph, out = _build(lambda c: c.all_gather(tf.zeros([2, 3]), groups))
  (crs,) = _ops(graph, "CrossReplicaSum")
  assert _const(crs.inputs[1]) == _physical(groups, RING)
  assert crs.get_attr("T") == tf.int32  # bits, not a float sum
  assert out.shape == [2 * len(groups[0]), 3] and out.dtype == tf.float32
  assert not _ops(graph, "Mul")
  # The member index is looked up from the processor number.
  (lookup,) = _ops(graph, "GatherV2")
  table = _const(lookup.inputs[0])
  for g in groups:
    for k, m in enumerate(g):
      assert table[m] == k
  assert lookup.inputs[1].op.name == "pnum"


def test_graph_max_min_gather_then_reduce_locally():
  def fn(c):
    return (c.all_reduce(tf.zeros([3]), ALL, "MAX"),
            c.all_reduce(tf.zeros([3], tf.bool), ALL, "MIN"))

  graph, (mx, mn) = _build(fn)
  assert mx.op.type == "Max" and mn.op.type == "All"
  assert mx.shape == [3] and mn.shape == [3] and mn.dtype == tf.bool
  assert len(_ops(graph, "CrossReplicaSum")) == 2


@pytest.mark.parametrize("groups", GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("l2p", [REVERSED, RING], ids=["reversed", "ring"])
def test_graph_all_to_all_float32_not_rounded(groups, l2p):
  graph, out = _build(lambda c: c.all_to_all(tf.zeros([8, 5]), groups), l2p)
  (op,) = _ops(graph, "AllToAll")
  assert op.get_attr("T") == tf.float32
  assert op.get_attr("split_count") == len(groups[0])
  assert op.get_attr("concat_dimension") == 0
  assert op.get_attr("split_dimension") == 0
  assert _const(op.inputs[1]) == _physical(groups, l2p)
  assert op.inputs[0].op.type == "Const"  # the input itself, no cast
  assert not _ops(graph, "Cast") and out.shape == [8, 5]


@pytest.mark.parametrize("dtype", [tf.int64, tf.bool, tf.int8],
                         ids=lambda d: d.name)
def test_graph_moves_of_other_dtypes_travel_as_int32(dtype):
  def fn(c):
    x = tf.zeros([8, 3], dtype)
    return (c.all_to_all(x, ALONG_COLS), c.permute(x, [(0, 5)], ALL),
            c.all_gather(x, ALONG_ROWS))

  graph, outs = _build(fn)
  for op_type in ("AllToAll", "CollectivePermute", "CrossReplicaSum"):
    (op,) = _ops(graph, op_type)
    assert op.get_attr("T") == tf.int32
  assert [o.dtype for o in outs] == [dtype] * 3
  assert [o.shape.as_list() for o in outs] == [[8, 3], [8, 3], [16, 3]]


@pytest.mark.parametrize("groups", GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("l2p", [REVERSED, RING], ids=["reversed", "ring"])
def test_graph_reduce_scatter_is_xla_reduce_scatter(groups, l2p):
  def fn(c):
    return (c.reduce_scatter(tf.zeros([8, 5]), groups, "SUM"),
            c.reduce_scatter(tf.zeros([8, 5], tf.int32), groups, "MAX"))

  graph, (f, i) = _build(fn, l2p)
  ops = _ops(graph, "XlaReduceScatter")
  assert [(op.get_attr("T"), op.get_attr("reduce_op")) for op in ops] == [
      (tf.float32, b"Add"), (tf.int32, b"Max")]
  for op in ops:
    assert _const(op.inputs[1]) == _physical(groups, l2p)
    assert _const(op.inputs[2]) == 0
  assert not _ops(graph, "Cast") and not _ops(graph, "CrossReplicaSum")
  assert f.op is ops[0] and i.op is ops[1]


def test_graph_reduce_scatter_bfloat16_policy_and_other_dtypes():
  def fn(c):
    x = tf.zeros([8], tf.bfloat16)
    return (c.reduce_scatter(x, ALONG_COLS, "SUM"),
            c.reduce_scatter(x, ALL, "SUM"),
            c.reduce_scatter(tf.zeros([8], tf.int64), ALL, "SUM"))

  graph, outs = _build(fn, allreduce_in_bfloat16_max_group_size=4)
  types = sorted((len(_const(op.inputs[1])[0]), op.get_attr("T").name)
                 for op in _ops(graph, "XlaReduceScatter"))
  assert types == [(4, "bfloat16"), (8, "float32")]
  # int64: gathered exactly as int32 words, reduced and cut locally.
  assert [op.get_attr("T") for op in _ops(graph, "CrossReplicaSum")] == [
      tf.int32]
  assert [o.shape.as_list() for o in outs] == [[2], [1], [1]]
  assert [o.dtype for o in outs] == [tf.bfloat16, tf.bfloat16, tf.int64]


def test_graph_permute_pairs_are_physical():
  pairs = [(0, 1), (1, 2), (2, 3), (3, 0), (4, 6)]
  graph, out = _build(lambda c: c.permute(tf.zeros([2]), pairs, ALONG_COLS))
  (op,) = _ops(graph, "CollectivePermute")
  assert _const(op.inputs[1]) == [[RING[s], RING[t]] for s, t in pairs]
  assert out.op is op


def test_graph_permute_without_pairs_is_zeros():
  graph, out = _build(lambda c: c.permute(tf.ones([2], tf.bool), [], ALL))
  assert not _ops(graph, "CollectivePermute")
  assert out.dtype == tf.bool and out.shape == [2]


def test_default_primitives_are_tpu_ops():
  c = tpu_collectives.TpuCollectives(IDENTITY, lambda: 0)
  assert isinstance(c.primitives, tpu_collectives.TpuPrimitives)
  assert c.name == "tpu" and c.logical_to_physical == IDENTITY


# ----------------------------------------------------------------- errors


@pytest.mark.parametrize("l2p", [[0, 1, 1, 2], [1, 2, 3, 4]])
def test_bad_logical_to_physical(l2p):
  with pytest.raises(ValueError, match="logical_to_physical"):
    tpu_collectives.TpuCollectives(l2p, lambda: 0)


def test_bad_arguments():
  def check(fn, match):
    with pytest.raises(ValueError, match=match):
      _build(fn)

  check(lambda c: c.all_reduce(tf.zeros([2]), ALL, "PROD"), "reduction")
  check(lambda c: c.all_gather(tf.zeros([2]), [[0, 1], [2, 3]]),
        "group_assignment")
  check(lambda c: c.all_gather(tf.zeros([2]), [[0, 1, 2], [3, 4, 5, 6, 7]]),
        "group_assignment")
  check(lambda c: c.all_gather(tf.zeros([]), ALL), "rank")
  check(lambda c: c.all_to_all(tf.zeros([6]), ALL), "blocks")
  check(lambda c: c.permute(tf.zeros([2]), [(0, 1), (2, 1)], ALL),
        "source_target_pairs")
  check(lambda c: c.permute(tf.zeros([2]), [(0, 4)], ALONG_COLS), "groups")
