"""cumsum, pool_tensor_1d, stride_tensor_1d and reduce_first against NumPy.

All of them run with the dimension they work along ("d") split over the
mesh in the standard layouts.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

PARAMS = mtf_testing.layout_mode_params(["a", "d"])


def _x(shape, seed=0):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_cumsum(mesh_shape, layout, mode):
  def build(mesh, t):
    x = t["x"]
    return {"inclusive": mtf.cumsum(x, "d"),
            "exclusive": mtf.cumsum(x, x.shape[1], exclusive=True),
            "along_a": mtf.cumsum(x, "a", exclusive=True)}

  def np_fn(x):
    inclusive = np.cumsum(x, axis=1)
    along_a = np.cumsum(x, axis=0)
    return {"inclusive": inclusive, "exclusive": inclusive - x,
            "along_a": along_a - x}

  mtf_testing.check_op(build, np_fn, {"x": (_x((8, 16, 3)), ["a", "d", "c"])},
                       mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_pool_and_stride(mesh_shape, layout, mode):
  def build(mesh, t):
    x = t["x"]
    return {"mean2": mtf.pool_tensor_1d(x, x.shape[1]),
            "max4": mtf.pool_tensor_1d(x, "d", mtf.reduce_max, pool_size=4),
            "stride2": mtf.stride_tensor_1d(x, "d"),
            "stride4": mtf.stride_tensor_1d(x, "d", pool_size=4)}

  def np_fn(x):
    windows2 = x.reshape(8, 16, 2, 2)
    windows4 = x.reshape(8, 8, 4, 2)
    return {"mean2": windows2.mean(axis=2), "max4": windows4.max(axis=2),
            "stride2": x[:, ::2], "stride4": x[:, ::4]}

  mtf_testing.check_op(build, np_fn, {"x": (_x((8, 32, 2)), ["a", "d", "c"])},
                       mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_reduce_first(mesh_shape, layout, mode):
  mtf_testing.check_op(
      lambda mesh, t: {"first_d": mtf.reduce_first(t["x"], "d"),
                       "first_a": mtf.reduce_first(t["x"], t["x"].shape[0])},
      lambda x: {"first_d": x[:, 0], "first_a": x[0]},
      {"x": (_x((8, 16, 3)), ["a", "d", "c"])}, mesh_shape, layout, mode)


def _lower(build, mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = build(mesh)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return {k: np.asarray(lowering.export_to_tf_tensor(v))
          for k, v in outputs.items()}


@pytest.mark.parametrize("layout", ["", "d:all"])
def test_int_cumsum_and_reduce_first_are_exact(layout):
  value = np.arange(3 * 16, dtype=np.int32).reshape(3, 16) * 1000003

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(value), "c:3,d:16")
    return {"cumsum": mtf.cumsum(x, "d"),
            "exclusive": mtf.cumsum(x, "d", exclusive=True),
            "first": mtf.reduce_first(x, "d")}

  got = _lower(build, "all:8", layout)
  np.testing.assert_array_equal(got["cumsum"], np.cumsum(value, axis=1))
  np.testing.assert_array_equal(got["exclusive"],
                                np.cumsum(value, axis=1) - value)
  np.testing.assert_array_equal(got["first"], value[:, 0])


def test_reduce_first_ignores_non_finite_entries_elsewhere():
  value = np.full([2, 16], np.inf, dtype=np.float32)
  value[:, 8] = np.nan
  value[:, 0] = [1.0, -2.0]

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(value), "c:2,d:16")
    return {"first": mtf.reduce_first(x, "d")}

  got = _lower(build, "all:8", "d:all")
  np.testing.assert_array_equal(got["first"], [1.0, -2.0])


def test_cumsum_of_split_dimension_communicates_block_totals_only():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.zeros([4, 64]), "c:4,d:64")
  y = mtf.cumsum(x, "d")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "d:all")
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(y)
  counters = dict(lowering.counters)
  # Each of 8 processors sends its 4 block totals (float32).
  assert counters["comm/allconcat/all/bytes"] == 8 * 4 * 4


@pytest.mark.parametrize("build,match", [
    (lambda x: mtf.cumsum(x, "q"), "not a dimension"),
    (lambda x: mtf.cumsum(x, mtf.Dimension("d", 8)), "has size 8"),
    (lambda x: mtf.pool_tensor_1d(x, "d", pool_size=3), "not divisible"),
    (lambda x: mtf.stride_tensor_1d(x, "d", pool_size=0), "not divisible"),
    (lambda x: mtf.reduce_first(x, "q"), "not a dimension"),
])
def test_shape_errors(build, match):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,d:16")
  with pytest.raises(mtf.ShapeError, match=match):
    build(x)


def test_cumsum_of_bool_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(TypeError, match="bool"):
    mtf.cumsum(mtf.zeros(mesh, "d:4", dtype=tf.bool), "d")


def test_pool_indivisible_block_raises_at_lowering():
  # d:16 pooled by 4 leaves 4 entries, which "all:8" cannot split.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.pool_tensor_1d(mtf.zeros(mesh, "a:8,d:16"), "d", pool_size=4)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "d:all")
  with pytest.raises(mtf.IndivisibleError, match="'d' \\(size 4\\)"):
    mtf.Lowering(graph, {mesh: impl})
