"""one_hot and gather against NumPy, under many layouts and every mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

V = 16  # Size of the looked-up (vocabulary) dimension.


def _layouts(dim_names, extra):
  """layout_mode_params, plus `extra` (id, mesh, layout[, modes]) cases."""
  return mtf_testing.layout_mode_params(dim_names) + [
      param for case in extra
      for param in mtf_testing.extra_layout_params(*case)]


EAGER = ("eager",)


def _indices(shape, seed=1, low=0, high=V):
  return np.random.RandomState(seed).randint(
      low, high, size=shape).astype(np.int32)


def _weights(shape, seed=0):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


# ---------------------------------------------------------------- one_hot

ONE_HOT_PARAMS = _layouts(["i", "j", "v"], [
    ("2d_i_v", "rows:2;cols:4", "i:rows;v:cols"),
    ("2d_v_j", "rows:2;cols:4", "v:rows;j:cols"),
])


@pytest.mark.parametrize("mesh_shape,layout,mode", ONE_HOT_PARAMS)
def test_one_hot(mesh_shape, layout, mode):
  # Out-of-range indices (-1 and V) give rows of off values.
  indices = _indices([8, 8], low=-1, high=V + 1)

  def np_fn(i):
    hot = i[..., None] == np.arange(V)
    return {"f": np.where(hot, 2.0, -0.5).astype(np.float32),
            "n": hot.astype(np.int32)}

  mtf_testing.check_op(
      lambda mesh, t: {
          "f": mtf.one_hot(t["i"], mtf.Dimension("v", V), on_value=2.0,
                           off_value=-0.5),
          "n": mtf.one_hot(t["i"], mtf.Dimension("v", V), dtype=tf.int32)},
      np_fn, {"i": (indices, ["i", "j"])}, mesh_shape, layout, mode)


def test_one_hot_rejects_float_indices():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(TypeError, match="must be integers"):
    mtf.one_hot(mtf.zeros(mesh, "i:8"), mtf.Dimension("v", V))


# ----------------------------------------------------------------- gather

# weights[v, h] looked up at indices[i, j]: the gathered dimension v split or
# not, indices split (their gradient needs an allreduce over those mesh
# dimensions), and v and an indices dimension on the same mesh dimension.
# Every extra layout runs eagerly. SIMD runs where the collectives differ
# from those of the standard 2d and 2d_swapped layouts (an allreduce over
# rows or cols for the split v): 2d_i_j's gradient allreduces over both
# mesh axes, and v split with i or j on one mesh axis (rows, cols)
# allconcats and reduce-scatters; the other layouts' collectives are
# allreduces over one axis, which those run.
GATHER_PARAMS = _layouts(["v", "h", "i", "j"], [
    ("2d_v_i", "rows:2;cols:4", "v:rows;i:cols", EAGER),
    ("2d_i_v", "rows:2;cols:4", "i:rows;v:cols", EAGER),
    ("2d_i_h", "rows:2;cols:4", "i:rows;h:cols", EAGER),
    ("2d_i_j", "rows:2;cols:4", "i:rows;j:cols"),
    ("all8_v_and_i", "all:8", "v:all;i:all", EAGER),
    ("2d_v_and_i_rows", "rows:2;cols:4", "v:rows;i:rows;h:cols"),
    ("2d_v_and_j_cols", "rows:2;cols:4", "v:cols;j:cols;i:rows"),
])

# Few distinct indices, so that repeated rows test the segment sum.
GATHER_INPUTS = {"w": (_weights([V, 8]), ["v", "h"]),
                 "i": (_indices([8, 8], high=5), ["i", "j"])}


@pytest.mark.parametrize("mesh_shape,layout,mode", GATHER_PARAMS)
def test_gather(mesh_shape, layout, mode):
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.gather(t["w"], t["i"],
                                       mtf.Dimension("v", V))},
      lambda w, i: {"y": w[i]}, GATHER_INPUTS, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", _layouts(
    ["h", "v", "i"], [("all8_v_and_i", "all:8", "v:all;i:all")]))
def test_gather_inner_dim_and_output_shape(mesh_shape, layout, mode):
  # v is the second weights dimension; the output puts h first.
  def build(mesh, t):
    return {"y": mtf.gather(t["w"], t["i"], mtf.Dimension("v", V),
                            output_shape="h:8,i:8")}
  mtf_testing.check_op(
      build, lambda w, i: {"y": w[:, i]},
      {"w": (_weights([8, V]), ["h", "v"]), "i": (_indices([8]), ["i"])},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", _layouts(
    ["b", "v", "i"], [("2d_v_i", "rows:2;cols:4", "v:rows;i:cols")]))
def test_gather_with_shared_batch_dim(mesh_shape, layout, mode):
  # b is in weights and indices: a batched lookup (one-hot einsum path).
  def np_fn(w, i):
    return {"y": np.stack([w[b][i[b]] for b in range(8)])}
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.gather(t["w"], t["i"],
                                       mtf.Dimension("v", V))},
      np_fn,
      {"w": (_weights([8, V, 8]), ["b", "v", "h"]),
       "i": (_indices([8, 8], high=5), ["b", "i"])},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", _layouts(["v", "i"], []))
def test_gather_bool_weights(mesh_shape, layout, mode):
  w = np.random.RandomState(0).uniform(size=[V, 8]) > 0.5
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.gather(t["w"], t["i"],
                                       mtf.Dimension("v", V))},
      lambda w, i: {"y": w[i]},
      {"w": (w, ["v", "h"]), "i": (_indices([8]), ["i"])},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_gather_python_list_indices(mode):
  w = _weights([V, 8])
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.gather(t["w"], [3, 0, 3, 15],
                                       mtf.Dimension("v", V))},
      lambda w: {"y": w[[3, 0, 3, 15]]},
      {"w": (w, ["v", "h"])}, "all:8", "v:all", mode)


def test_gather_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.zeros(mesh, "v:16,h:8")
  i = mtf.zeros(mesh, "i:8", dtype=tf.int32)
  with pytest.raises(mtf.ShapeError, match="not a dimension"):
    mtf.gather(w, i, mtf.Dimension("q", 16))
  with pytest.raises(mtf.ShapeError, match="output_shape"):
    mtf.gather(w, i, mtf.Dimension("v", 16), output_shape="i:8,z:8")


@pytest.mark.parametrize("indices_shape", ["i:8", "i:8,h:8"])
def test_gather_refuses_float_indices_at_construction(indices_shape):
  """Was a raw TF InvalidArgumentError at lowering (or a one_hot error when
  indices share a dimension with the weights)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.zeros(mesh, "v:16,h:8")
  i = mtf.zeros(mesh, indices_shape)
  with pytest.raises(mtf.DTypeError, match="gather.*float32") as info:
    mtf.gather(w, i, mtf.Dimension("v", 16))
  assert isinstance(info.value, TypeError)
  assert isinstance(info.value, ValueError)
  with pytest.raises(mtf.DTypeError, match="GatherOperation.*float32"):
    mtf.GatherOperation(w, i, mtf.Dimension("v", 16), mtf.Shape(
        i.shape.dims + [d for d in w.shape.dims[1:] if d not in i.shape]))
