"""Imports, constants and ranges against NumPy, under every layout and mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

DIMS = ["a", "b"]
PARAMS = mtf_testing.layout_mode_params(DIMS)
SHAPE = "a:8,b:16"


def _x(seed=0):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=(8, 16)).astype(np.float32)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_import_tf_tensor(mesh_shape, layout, mode):
  x, n = _x(), np.arange(128, dtype=np.int32).reshape(8, 16)
  mtf_testing.check_op(
      lambda mesh, t: {
          "x": mtf.import_tf_tensor(mesh, tf.constant(x), SHAPE),
          "n": mtf.import_tf_tensor(mesh, tf.constant(n), SHAPE)},
      lambda: {"x": x, "n": n}, {}, mesh_shape, layout, mode)


@pytest.mark.parametrize("layout", ["", "a:all"])
@pytest.mark.parametrize("static_shape", [[None, 16], None],
                         ids=["unknown_dim", "unknown_rank"])
def test_import_tensor_without_static_shape(static_shape, layout):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", layout)

  @tf.function(input_signature=[tf.TensorSpec(static_shape, tf.float32)])
  def double(x):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    y = mtf.import_tf_tensor(mesh, x, SHAPE) * 2.0
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y)

  x = _x()
  np.testing.assert_array_equal(double(x), 2 * x)
  with pytest.raises(tf.errors.InvalidArgumentError):
    double(np.zeros([4, 16], np.float32))


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_import_fully_replicated(mesh_shape, layout, mode):
  # Gradients flow through to y, which is multiplied by the import.
  z = _x(seed=1)
  mtf_testing.check_op(
      lambda mesh, t: {"y": t["y"] * mtf.import_fully_replicated(
          mesh, tf.constant(z), t["y"].shape)},
      lambda y: {"y": y * z},
      {"y": (_x(), DIMS)}, mesh_shape, layout, mode)


def test_import_default_shape_and_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.zeros([2, 3]))
  assert x.shape.to_integer_list == [2, 3]
  with pytest.raises(mtf.ShapeError, match=r"\[2, 3\]"):
    mtf.import_tf_tensor(mesh, tf.zeros([2, 3]), "a:3,b:2")
  with pytest.raises(mtf.ShapeError, match=r"\[2, 3\]"):
    mtf.import_tf_tensor(mesh, tf.zeros([2, 3]), "a:2")


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_constant(mesh_shape, layout, mode):
  x = _x()
  full = np.arange(128, dtype=np.float32).reshape(8, 16)
  mtf_testing.check_op(
      lambda mesh, t: {
          "scalar": mtf.constant(mesh, 2.5, SHAPE),
          "full": mtf.constant(mesh, full, SHAPE),
          "int": mtf.constant(mesh, 7, SHAPE, dtype=tf.int32),
          "rank0": mtf.constant(mesh, 3.0, []),
          "bf16": mtf.cast(mtf.constant(mesh, 1.5, SHAPE, dtype=tf.bfloat16),
                           tf.float32),
          "y": t["x"] * mtf.constant(mesh, full, SHAPE)},
      lambda x: {"scalar": np.full((8, 16), 2.5, np.float32), "full": full,
                 "int": np.full((8, 16), 7, np.int32),
                 "rank0": np.float32(3.0),
                 "bf16": np.full((8, 16), 1.5, np.float32), "y": x * full},
      {"x": (x, DIMS)}, mesh_shape, layout, mode)


def test_constant_wrong_shape_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(mtf.ShapeError, match="does not match"):
    mtf.constant(mesh, np.zeros([4, 4]), SHAPE)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_zeros_ones(mesh_shape, layout, mode):
  def build(mesh, t):
    outputs = {"zeros": mtf.zeros(mesh, SHAPE),
               "ones_int": mtf.ones(mesh, SHAPE, dtype=tf.int32),
               "zeros_like": mtf.zeros_like(t["x"]),
               "ones_like": mtf.ones_like(t["x"]),
               # Gradient of (x + 1) * x is 2x + 1; ones_like has none.
               "y": (t["x"] + mtf.ones_like(t["x"])) * t["x"]}
    assert outputs["ones_int"].dtype == tf.int32
    return outputs
  mtf_testing.check_op(
      build,
      lambda x: {"zeros": np.zeros((8, 16), np.float32),
                 "ones_int": np.ones((8, 16), np.int32),
                 "zeros_like": np.zeros_like(x), "ones_like": np.ones_like(x),
                 "y": (x + 1) * x},
      {"x": (_x(), DIMS)}, mesh_shape, layout, mode)


RANGE_DTYPES = {"int32": tf.int32, "float32": tf.float32,
                "bfloat16": tf.bfloat16}


@pytest.mark.parametrize("dtype_name", sorted(RANGE_DTYPES))
@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["r"]))
def test_range(dtype_name, mesh_shape, layout, mode):
  dtype = RANGE_DTYPES[dtype_name]

  def build(mesh, t):
    r = mtf.range(mesh, mtf.Dimension("r", 64), dtype)
    assert r.dtype == dtype and r.shape.dimension_names == ["r"]
    # NumPy compares bfloat16 poorly; integers up to 64 are exact anyway.
    return {"r": r if dtype != tf.bfloat16 else mtf.cast(r, tf.float32)}

  want = np.arange(64).astype(np.int32 if dtype == tf.int32 else np.float32)
  mtf_testing.check_op(build, lambda: {"r": want}, {}, mesh_shape, layout,
                       mode)


def test_mtf_range_is_range():
  assert mtf.range is mtf.mtf_range
