"""Max and average pooling against NumPy, with gradients.

Spatial sizes that do not divide by the window check that the leftover
entries are dropped (and get zero gradient). Batch and channel dimensions
take every standard layout; a spatial dimension is split too (splits
through windows: tests/ops/test_spatial_splits.py).
"""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import mtf_testing


def _params(spatial_split):
  return mtf_testing.layout_mode_params(
      ["batch", "c"]) + mtf_testing.extra_layout_params(
          f"{spatial_split}_split", "rows:2;cols:4",
          f"{spatial_split}:rows;c:cols")


def _np_pool(x, ksize, reduce_fn):
  """x[batch, spatial..., c] pooled over non-overlapping windows."""
  rank = len(ksize)
  spatial = x.shape[1:1 + rank]
  out = [n // k for n, k in zip(spatial, ksize)]
  x = x[(slice(None),) + tuple(slice(0, o * k) for o, k in zip(out, ksize))]
  shape = [x.shape[0]]
  for o, k in zip(out, ksize):
    shape += [o, k]
  x = x.reshape(shape + [x.shape[-1]])
  return reduce_fn(x, axis=tuple(2 + 2 * i for i in range(rank)))


def _x(shape, seed=0):
  return np.random.RandomState(seed).uniform(-1.0, 1.0,
                                             size=shape).astype(np.float32)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params("h"))
def test_pool2d(mesh_shape, layout, mode):
  def build(mesh, t):
    del mesh
    return {"max": mtf.max_pool2d(t["x"]),
            "avg": mtf.avg_pool2d(t["x"], ksize=(1, 3))}

  mtf_testing.check_op(
      build,
      lambda x: {"max": _np_pool(x, (2, 2), np.max),
                 "avg": _np_pool(x, (1, 3), np.mean)},
      {"x": (_x((8, 4, 5, 8)), ["batch", "h", "w", "c"])},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params("w"))
def test_pool3d(mesh_shape, layout, mode):
  def build(mesh, t):
    del mesh
    return {"max": mtf.max_pool3d(t["x"], ksize=(1, 2, 2)),
            "avg": mtf.avg_pool3d(t["x"])}

  mtf_testing.check_op(
      build,
      lambda x: {"max": _np_pool(x, (1, 2, 2), np.max),
                 "avg": _np_pool(x, (2, 2, 2), np.mean)},
      {"x": (_x((8, 2, 3, 4, 8), 1), ["batch", "d", "h", "w", "c"])},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    pytest.param("all:1", "", "eager", id="1proc-eager"),
    pytest.param("rows:2;cols:4", "outer:rows;batch:cols", "graph",
                 id="2d-graph"),
])
def test_pool2d_several_batch_dims(mesh_shape, layout, mode):
  def np_fn(x):
    flat = x.reshape((8, 4, 4, 2))
    return {"y": _np_pool(flat, (2, 2), np.max).reshape((2, 4, 2, 2, 2))}

  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.max_pool2d(t["x"])}, np_fn,
      {"x": (_x((2, 4, 4, 4, 2), 2), ["outer", "batch", "h", "w", "c"])},
      mesh_shape, layout, mode)


def test_validation_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "batch:2,h:4,w:4,c:2")
  with pytest.raises(ValueError, match="non-overlapping"):
    mtf.PoolOperation(x, (2, 2), (1, 1), "MAX_2D")
  with pytest.raises(ValueError, match="ksize"):
    mtf.max_pool2d(x, ksize=(2, 2, 2))
  with pytest.raises(mtf.ShapeError, match="smaller"):
    mtf.avg_pool2d(x, ksize=(5, 1))
  with pytest.raises(ValueError, match="unknown pool"):
    mtf.PoolOperation(x, (2, 2), (2, 2), "SUM_2D")
