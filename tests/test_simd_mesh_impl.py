"""SimdMeshImpl with the host back end gives PlacementMeshImpl's answers."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from tests import simd_programs

X, INTS = simd_programs.X, simd_programs.INTS
BATCH, IO, HIDDEN = simd_programs.BATCH, simd_programs.IO, simd_programs.HIDDEN
_run = simd_programs.run_ops_program
assert_same_results = simd_programs.assert_same_results

LAYOUTS = [
    ("all:8", "batch:all"),
    ("all:8", "hidden:all"),
    ("b:2;m:4", "batch:b;hidden:m"),
    ("b:2;m:4", "hidden:b;batch:m"),
]
LAYOUT_IDS = ["data", "model", "2d", "2d_swapped"]


@pytest.mark.parametrize("mode", ["function", "eager"])
@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_simd_matches_placement(mesh_shape, layout, mode):
  simd = _run(simd_mesh_impl.SimdMeshImpl(mesh_shape, layout,
                                     collective_timeout_seconds=30), mode)
  placement = _run(
      mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout),
      "function")
  assert_same_results(simd, placement)
  # The update ran: the second step saw a different w.
  assert not np.allclose(simd[0]["h"], simd[1]["h"])
  np.testing.assert_array_equal(simd[0]["int_sum"], INTS.sum(axis=0))


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("all:2", "batch:all"), ("b:2;m:4", "batch:b;io:m")])
def test_program_is_traced_once_whatever_the_mesh(mesh_shape, layout):
  impl = simd_mesh_impl.SimdMeshImpl(mesh_shape, layout)
  traces = []

  def program(x):
    traces.append(1)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    total = mtf.reduce_sum(mtf.import_tf_tensor(mesh, x, [BATCH, IO]))
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(total)

  result = tf.function(lambda x: impl.run(program, x))(tf.constant(X))
  assert len(traces) == 1
  np.testing.assert_allclose(result, X.sum(), rtol=1e-5)


@pytest.mark.parametrize("mode", ["function", "eager"])
def test_alltoall_sends_block_k_to_member_k(mode):
  impl = simd_mesh_impl.SimdMeshImpl("a:2;b:4", "")
  full = np.arange(8 * 8, dtype=np.float32).reshape(8, 8)

  def program(x):
    laid_out = mtf.mesh_impl.LaidOutTensor([x])
    result = impl.alltoall(laid_out, 1, split_axis=1, concat_axis=0)
    return result.one_slice

  step = lambda x: impl.run(program, x)
  if mode == "function":
    step = tf.function(step)
  got = step(tf.constant(full)).numpy()
  # Processor 0 (coordinate 0 along b) gets block 0 from each of 4 members.
  np.testing.assert_array_equal(got, np.concatenate([full[:, 0:2]] * 4))


def test_lowering_outside_run_is_a_clear_error():
  impl = simd_mesh_impl.SimdMeshImpl("all:2", "batch:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.import_tf_tensor(mesh, tf.constant(X), [BATCH, IO])
  with pytest.raises(mtf.LayoutError, match="mesh_impl.run"):
    mtf.Lowering(graph, {mesh: impl})


def test_simd_checkpoint_restores_on_placement(tmp_path):
  impl = simd_mesh_impl.SimdMeshImpl("b:2;m:4", "batch:b;hidden:m")
  trained = _run(impl, "function", steps=3)
  path = tf.train.Checkpoint(model=impl).save(os.path.join(tmp_path, "c"))
  placement = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
  tf.train.Checkpoint(model=placement).restore(path)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", [IO, HIDDEN])
  value = mtf.Lowering(graph, {mesh: placement}).export_to_tf_tensor(w)
  # w after three updates: the fourth step would start from it.
  expected = mtf.storage.checkpointing.load_variables(path, prefix="model")["w"]
  np.testing.assert_array_equal(value.numpy(), expected)
  assert not np.allclose(trained[0]["grad"], trained[2]["grad"])


def test_logical_and_physical_processor_numbers():
  impl = simd_mesh_impl.SimdMeshImpl("all:4", "",
                                     logical_to_physical=[2, 0, 3, 1])
  assert [impl.l2p(p) for p in range(4)] == [2, 0, 3, 1]
  assert [impl.p2l(impl.l2p(p)) for p in range(4)] == list(range(4))
  assert impl.device_assignment is None


def test_slice_gives_each_processor_its_block():
  impl = simd_mesh_impl.SimdMeshImpl("r:2;c:2", "a:r;b:c")
  full = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
  shape = mtf.convert_to_shape("a:4,b:6")

  def program(x):
    return impl.slice(x, shape).one_slice

  got = tf.function(lambda x: impl.run_each(program, x))(tf.constant(full))
  for pnum, block in enumerate(got):
    row, col = divmod(pnum, 2)
    np.testing.assert_array_equal(
        block, full[2 * row:2 * row + 2, 3 * col:3 * col + 3])


def test_tpu_placement_helpers_under_the_original_module():
  assert simd_mesh_impl.auto_logical_to_physical_tpu([2, 4], [2, 2, 2]) == (
      mtf.backend.tpu_topology.auto_logical_to_physical_tpu([2, 4], [2, 2, 2]))
  assert simd_mesh_impl.physical_shape_3d_from_topology_proto_4d(
      [2, 2, 1, 2]) == [2, 2, 2]
  tiling = simd_mesh_impl.HierarchicalTiling(
      [("batch", None), ("model", [2, 2, 2])], [4, 4, 2])
  assert tiling.mesh_shape == mtf.convert_to_shape("batch:4,model:8")
