"""concat, slice and pad against NumPy, and their layout errors.

Mostly the dimension they work along (b) stays unsplit while the other
dimensions (a, c) take every standard layout; slice and pad also run with
b split evenly (test_slice_and_pad_along_split_b; the uneven splits are in
test_uneven_movement, with concat).
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

DIMS = ["a", "b", "c"]
PARAMS = mtf_testing.layout_mode_params(["a", "c"])


def _x(b_size, seed=0):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=(8, b_size, 16)).astype(np.float32)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_concat_unequal_sizes(mesh_shape, layout, mode):
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.concat([t["x"], t["z"], t["w"]], "b")},
      lambda x, z, w: {"y": np.concatenate([x, z, w], axis=1)},
      {"x": (_x(4), DIMS), "z": (_x(12, seed=1), DIMS),
       "w": (_x(1, seed=2), DIMS)},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_concat_equal_sizes_same_input_twice(mesh_shape, layout, mode):
  # The gradient of x sums the two slices of dy it went to.
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.concat([t["x"], t["x"]], "b")},
      lambda x: {"y": np.concatenate([x, x], axis=1)},
      {"x": (_x(4), DIMS)}, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_slice(mesh_shape, layout, mode):
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.slice(t["x"], 3, 5, "b"),
                       "first": mtf.mtf_slice(t["x"], 0, 1, "b")},
      lambda x: {"y": x[:, 3:8], "first": x[:, :1]},
      {"x": (_x(12), DIMS)}, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_pad(mesh_shape, layout, mode):
  def np_fn(x):
    return {"y": np.pad(x, [(0, 0), (2, 3), (0, 0)]),
            "after": np.pad(x, [(0, 0), (0, 4), (0, 0)])}
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.pad(t["x"], [2, 3], "b"),
                       "after": mtf.pad(t["x"], [0, 4], t["x"].shape[1])},
      np_fn, {"x": (_x(4), DIMS)}, mesh_shape, layout, mode)


@pytest.mark.parametrize(
    "mesh_shape,layout,mode", mtf_testing.layout_mode_params(
        ["b", "a"], modes=("eager", "simd"), layouts=("all8_b", "2d")))
def test_slice_and_pad_along_split_b(mesh_shape, layout, mode):
  """b (16) split 8 or 2 ways: re-partitioned by permutes (the slice
  starts and ends inside blocks). The traced modes run the same lowering
  in test_uneven_movement."""
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.slice(t["x"], 3, 8, "b")},
      lambda x: {"y": x[:, 3:11]},  # its gradient is a pad
      {"x": (_x(16), DIMS)}, mesh_shape, layout, mode)


def test_trivial_cases_return_input():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:4")
  assert mtf.concat([x], "b") is x
  assert mtf.slice(x, 0, 4, "b") is x
  assert mtf.pad(x, [0, 0], "b") is x


@pytest.mark.parametrize("build,match", [
    (lambda x, z: mtf.concat([x, z], "q"), "not a dimension"),
    (lambda x, z: mtf.concat([x, mtf.rename_dimension(z, "a", "e")], "b"),
     "except along"),
    (lambda x, z: mtf.concat([x, mtf.zeros(x.mesh, "a:8,b:4,c:16")], "b"),
     "except along"),
    (lambda x, z: mtf.slice(x, 6, 3, "b"), "outside"),
    (lambda x, z: mtf.slice(x, -1, 2, "b"), "outside"),
    (lambda x, z: mtf.pad(x, [-1, 2], "b"), "non-negative"),
])
def test_shape_errors(build, match):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:8")
  z = mtf.zeros(mesh, "a:8,b:4")
  with pytest.raises(mtf.ShapeError, match=match):
    build(x, z)


def test_concat_dtype_mismatch_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(TypeError, match="dtype"):
    mtf.concat([mtf.zeros(mesh, "a:8,b:8"),
                mtf.zeros(mesh, "a:8,b:4", dtype=tf.int32)], "b")


def test_pad_operation_takes_the_originals_parameters():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, "a:4,b:2")
  y = mtf.PadOperation(x, paddings=[1, 2], pad_dim_name="a",
                       name="padded").outputs[0]
  assert y.shape == mtf.convert_to_shape("a:7,b:2")
  assert y.operation.name.startswith("padded")
