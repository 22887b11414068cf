"""Pooling and convolution along split spatial dimensions, with gradients.

The spatial dimensions "h" and "w" split over `all:8`, `b:2;m:4` and
`b:4;m:2` (mtf_testing.uneven_layouts), evenly and not (sizes 5, 7 and 12;
windows and filters that cross block boundaries), against TensorFlow's
own kernels in float64. Each table runs as one program per layout and mode.
The lowerings move only the window rows that change processor; their
collectives are pinned and must be what the cost rules predict.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from tests import mtf_testing

PARAMS = mtf_testing.uneven_layout_mode_params(["h", "w"])


def _u(shape, seed):
  return np.random.RandomState(seed).uniform(-1.0, 1.0,
                                             size=shape).astype(np.float32)


def _np_pool(x, ksize, reduce_fn):
  """Non-overlapping VALID pooling of x[b, spatial..., c]."""
  shape = [x.shape[0]]
  index = [slice(None)]
  for n, k in zip(x.shape[1:-1], ksize):
    shape += [n // k, k]
    index.append(slice(0, n // k * k))
  x = x[tuple(index + [slice(None)])].reshape(shape + [x.shape[-1]])
  return reduce_fn(x, axis=tuple(range(2, 2 * len(ksize) + 1, 2)))


# (name, mtf function, NumPy reduction, ksize, shape [b, (d,) h, w, c]).
POOLS = [
    ("max_7x12", mtf.max_pool2d, np.max, (2, 3), (2, 7, 12, 2)),
    ("avg_12x5", mtf.avg_pool2d, np.mean, (3, 2), (1, 12, 5, 2)),
    ("max_12x12", mtf.max_pool2d, np.max, (2, 2), (1, 12, 12, 1)),
    ("avg3d_5x7", mtf.avg_pool3d, np.mean, (1, 2, 3), (1, 2, 5, 7, 2)),
]


def _pool_case(fn, reduce_fn, ksize, shape, seed):
  names = ["b", "h", "w", "c"] if len(shape) == 4 else ["b", "d", "h", "w",
                                                        "c"]
  return (lambda mesh, t: {"y": fn(t["x"], ksize=ksize)},
          lambda x: {"y": _np_pool(x, ksize, reduce_fn)},
          {"x": (_u(shape, seed), names)})


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_pooling_along_split_spatial_dimensions(mesh_shape, layout, mode):
  """Windows that cross blocks (7 rows over 8 processors in pairs, 12 over
  8 in threes, ...): each output block gets its windows' rows by
  receives; the gradient (PoolBackPropOperation) sends them back."""
  pools = POOLS if mode == "eager" else POOLS[:1]
  cases = {name: _pool_case(fn, reduce_fn, ksize, shape, i)
           for i, (name, fn, reduce_fn, ksize, shape) in enumerate(pools)}
  mtf_testing.check_ops(cases, mesh_shape, layout, mode)


def _collectives(build, mesh_shape, rules):
  """The collectives (kind, mesh dims) of lowering build(mesh), checked
  against what the cost model predicts."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  build(mesh)
  rules = mtf.LayoutRules(rules, allow_uneven=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules,
                                                   [""] * 8)
  counters = dict(mtf.Lowering(graph, {mesh: impl}).counters)
  counted = cost_model.counted_collectives(counters)
  assert cost_model.graph_cost(graph, mesh_shape, rules).collectives == (
      counted)
  return counters


def _pool_and_gradient(mesh, x_dims, ksize):
  x = mtf.zeros(mesh, x_dims)
  y = mtf.max_pool2d(x, ksize=ksize)
  mtf.gradients([mtf.reduce_sum(y)], [x])


def test_pooling_collectives():
  """h = 12 over 8 (blocks of 2) pooled by 3 (output 4 over 8: blocks of
  1): output block p reads rows [3p, 3p + 3) of blocks p - ..., so the
  receives move only those rows, and the gradient moves them back; whole
  windows in each block (h = 16, windows of 2) move nothing."""
  counters = _collectives(
      lambda mesh: _pool_and_gradient(mesh, "b:2;h:12;w:4;c:2", (3, 2)),
      "all:8", [("h", "all")])
  assert counters["comm/receive/all/calls"] > 0
  assert "comm/allconcat/all/calls" not in counters
  counters = _collectives(
      lambda mesh: _pool_and_gradient(mesh, "b:2;h:16;w:4;c:2", (2, 2)),
      "all:8", [("h", "all")])
  assert not [k for k in counters if k.startswith("comm/")]
