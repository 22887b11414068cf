"""SimdMeshImpl with the TPU back end, without a TPU.

Two checks: (1) the lowered program of one processor, traced as a graph,
calls the XLA TPU collectives with group assignments and permutation pairs
in physical replica ids; (2) the same program, with the TPU primitives
simulated by host collectives on 8 logical CPUs (each processor on the
device of its physical id), gives PlacementMeshImpl's answers.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.backend import processors
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.backend import tpu_topology
from tests import simulated_tpu
from tests import simd_programs

BATCH, IO, HIDDEN = simd_programs.BATCH, simd_programs.IO, simd_programs.HIDDEN
REVERSED = list(range(8))[::-1]
RING = tpu_topology.auto_logical_to_physical_tpu([2, 4], [2, 2, 2])
CASES = [
    ("all:8", "batch:all", None),
    ("all:8", "hidden:all", REVERSED),
    ("b:2;m:4", "batch:b;hidden:m", RING),
    ("b:2;m:4", "hidden:b;batch:m", REVERSED),
]
CASE_IDS = ["data", "model-reversed", "2d-ring", "2d_swapped-reversed"]
TPU_DTYPES = simulated_tpu.TPU_DTYPES


def _tpu_impl(mesh_shape, layout, logical_to_physical):
  size = mtf.convert_to_shape(mesh_shape).size
  return simd_mesh_impl.SimdMeshImpl(
      mesh_shape, layout, devices=simulated_tpu.cpu_devices(size),
      collectives="tpu",
      logical_to_physical=logical_to_physical)


def _program(impl):
  def program(x, ints):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs, update = simd_programs.ops_program(mesh, x, ints)
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowering.lowered_operation(update)
    return {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}
  return program


def _const_input(op, index):
  return tf.make_ndarray(op.inputs[index].op.get_attr("value")).tolist()


def _physical(groups, logical_to_physical):
  return [[logical_to_physical[p] for p in g] for g in groups]


# ------------------------------------------------- graph construction


@pytest.mark.parametrize("mesh_shape,layout,l2p", CASES, ids=CASE_IDS)
def test_program_calls_tpu_collectives_in_physical_ids(mesh_shape, layout,
                                                       l2p):
  impl = _tpu_impl(mesh_shape, layout, l2p)
  l2p = impl.logical_to_physical
  concrete = impl.trace_program(
      _program(impl), tf.TensorSpec(simd_programs.X.shape, tf.float32),
      tf.TensorSpec(simd_programs.INTS.shape, tf.int32))
  ops = concrete.graph.get_operations()
  types = {op.type for op in ops}
  assert "CrossReplicaSum" in types and "CollectivePermute" in types
  # No host collectives, no ordering tokens.
  assert not any(t.startswith("Collective") and t != "CollectivePermute"
                 for t in types), types
  mesh = impl.shape
  valid_groups = [_physical(impl.processor_groups(axes), l2p)
                  for axes in ([0], [1], [0, 1]) if max(axes) < mesh.ndims]
  for op in ops:
    if op.type == "CrossReplicaSum":
      groups = _const_input(op, 1)
      assert groups in valid_groups, (groups, valid_groups)
      assert op.inputs[0].dtype in TPU_DTYPES
    if op.type == "CollectivePermute":
      pairs = _const_input(op, 1)
      physical_groups = [set(g) for g in valid_groups[0]] + [
          set(g) for g in valid_groups[-1]]
      for source, target in pairs:
        assert any({source, target} <= g for g in physical_groups)
      # The pairs are a shift: a permutation between sources and targets.
      assert len({s for s, _ in pairs}) == len(pairs)
      assert len({t for _, t in pairs}) == len(pairs)
  # The int sum over the batch stays int32 (exact), never float.
  int_sums = [op for op in ops if op.type == "CrossReplicaSum"
              and op.inputs[0].dtype == tf.int32]
  assert int_sums


def test_shift_pairs_are_the_neighbours_in_physical_ids():
  impl = _tpu_impl("all:8", "hidden:all", REVERSED)

  def program(x):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    h = mtf.import_tf_tensor(mesh, x, [BATCH, HIDDEN])
    shifted = mtf.shift(h, 2, HIDDEN, wrap=True)  # Blocks of 2: one hop.
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.laid_out_tensor(shifted).one_slice

  concrete = impl.trace_program(program, tf.TensorSpec([8, 16], tf.float32))
  (permute,) = [op for op in concrete.graph.get_operations()
                if op.type == "CollectivePermute"]
  pairs = sorted(map(tuple, _const_input(permute, 1)))
  # Logical p sends to p + 1 (mod 8); physical id of logical p is 7 - p.
  assert pairs == sorted((7 - p, 7 - (p + 1) % 8) for p in range(8))


def test_alltoall_keeps_float32():
  impl = _tpu_impl("b:2;m:4", "", RING)

  def program(x):
    laid_out = mtf.mesh_impl.LaidOutTensor([x])
    return impl.alltoall(laid_out, 1, split_axis=1, concat_axis=0).one_slice

  concrete = impl.trace_program(program, tf.TensorSpec([8, 8], tf.float32))
  ops = concrete.graph.get_operations()
  (all_to_all,) = [op for op in ops if op.type == "AllToAll"]
  assert all_to_all.inputs[0].dtype == tf.float32
  assert all_to_all.get_attr("split_count") == 4
  assert _const_input(all_to_all, 1) == _physical(
      processors.processor_groups(impl.shape, [1]), RING)
  assert not any(op.type == "Cast" for op in ops)


def test_reduce_scatter_is_xla_reduce_scatter_in_physical_ids():
  impl = _tpu_impl("b:2;m:4", "", RING)

  def program(x):
    laid_out = mtf.mesh_impl.LaidOutTensor([x])
    return impl.reduce_scatter(laid_out, 1, split_axis=1).one_slice

  concrete = impl.trace_program(program, tf.TensorSpec([8, 8], tf.float32))
  ops = concrete.graph.get_operations()
  (scatter,) = [op for op in ops if op.type == "XlaReduceScatter"]
  assert scatter.get_attr("T") == tf.float32
  assert scatter.get_attr("reduce_op") == b"Add"
  assert _const_input(scatter, 1) == _physical(
      processors.processor_groups(impl.shape, [1]), RING)
  assert concrete.outputs[0].shape == [8, 2]
  assert not any(op.type in ("Cast", "CrossReplicaSum") for op in ops)


def test_tpu_impl_has_no_control_dependencies_and_needs_a_strategy():
  impl = _tpu_impl("all:2", "batch:all", None)
  assert not impl.supports_control_dependencies
  assert simd_mesh_impl.SimdMeshImpl("all:2", "").supports_control_dependencies
  with pytest.raises(mtf.LayoutError, match="TPUStrategy"):
    impl.run(lambda: tf.constant(0))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(logical_to_physical=[0, 0]), ValueError, "not a permutation"),
    (dict(collectives="nccl"), ValueError, "collectives='nccl'"),
    (dict(strategy=object()), ValueError, "collectives='tpu'"),
])
def test_constructor_errors(kwargs, error, match):
  with pytest.raises(error, match=match):
    simd_mesh_impl.SimdMeshImpl("all:2", "", **kwargs)


def test_make_simd_mesh_impl_without_strategy_is_host():
  impl = simd_mesh_impl.make_simd_mesh_impl("all:2", "batch:all")
  assert impl.collectives.name == "host" and impl.strategy is None


# ----------------------------------------------- simulated TPU, on CPUs


def _assert_runs_like_placement(impl, mesh_shape, layout):
  """The ops program on `impl` gives PlacementMeshImpl's results."""
  simd = simd_programs.run_ops_program(impl, "function")
  placement = simd_programs.run_ops_program(
      mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout),
      "function")
  simd_programs.assert_same_results(simd, placement)
  assert not np.allclose(simd[0]["h"], simd[1]["h"])


@pytest.mark.parametrize("mesh_shape,layout,l2p", CASES, ids=CASE_IDS)
def test_simulated_tpu_matches_placement(mesh_shape, layout, l2p):
  impl = _tpu_impl(mesh_shape, layout, l2p)
  simulated_tpu.install(impl)
  _assert_runs_like_placement(impl, mesh_shape, layout)


@pytest.mark.parametrize("mesh_shape,layout,l2p", CASES[2:], ids=CASE_IDS[2:])
def test_strategy_run_matches_placement(mesh_shape, layout, l2p):
  """SimdMeshImpl's strategy path: strategy.run of the program, processor
  numbers from replica ids, each replica on its own core's variables."""
  strategy = simulated_tpu.stand_in_strategy()
  impl = simd_mesh_impl.make_simd_mesh_impl(
      mesh_shape, layout, strategy=strategy, logical_to_physical=l2p)
  assert impl.collectives.name == "tpu"
  simulated_tpu.install(impl)
  with strategy.scope():  # As TPU programs are often written.
    _assert_runs_like_placement(impl, mesh_shape, layout)
  # The strategy's replicas are the physical processors.
  index = lambda device: tf.DeviceSpec.from_string(device).device_index
  assert [index(d) for d in impl.devices] == impl.logical_to_physical
  # Each processor's slices are plain variables on its own device, made in
  # the replica context of the first trace and not mirrored by the strategy.
  for name, entry in impl.variable_store.eager_entries().items():
    for pnum, variable in enumerate(entry.slices):
      assert not isinstance(variable, tf.distribute.DistributedValues), name
      assert index(variable.device) == impl.logical_to_physical[pnum], name
