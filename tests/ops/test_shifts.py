"""shift, dynamic_shift and halo exchange against NumPy.

The shifted dimension takes every standard layout too: split over "all:8"
its blocks hold 2 entries, so the offsets below cover whole blocks, parts of
a block, more than a block and more than the whole dimension.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

# Offsets by whole blocks, by parts of blocks, and by more than the dimension.
OFFSETS = {False: (2, -5, 8, 20), True: (3, -4, 21)}


def _x(shape, seed=0):
  return np.random.RandomState(seed).uniform(-1.0, 1.0,
                                             size=shape).astype(np.float32)


@pytest.mark.parametrize("wrap", [False, True], ids=["zeros", "wrap"])
@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["b", "a"]))
def test_shift(mesh_shape, layout, mode, wrap):
  def build(mesh, t):
    del mesh
    out = {f"y{i}": mtf.shift(t["x"], off, t["x"].shape[1], wrap)
           for i, off in enumerate(OFFSETS[wrap])}
    out["by_name"] = mtf.shift(t["x"], 3, "a", wrap)
    return out

  def np_fn(x):
    out = {f"y{i}": mtf_testing.np_shift(x, off, 1, wrap)
           for i, off in enumerate(OFFSETS[wrap])}
    out["by_name"] = mtf_testing.np_shift(x, 3, 0, wrap)
    return out

  mtf_testing.check_op(build, np_fn, {"x": (_x((8, 16)), ["a", "b"])},
                       mesh_shape, layout, mode)


def test_shift_by_zero_returns_input_and_checks_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:4")
  assert mtf.shift(x, 0, "b", wrap=False) is x
  assert mtf.shift(x, -8, "b", wrap=True) is x
  with pytest.raises(mtf.ShapeError, match="'c'"):
    mtf.shift(x, 1, "c", wrap=False)
  with pytest.raises(TypeError, match="dynamic_shift"):
    mtf.shift(x, 1.5, "b", wrap=False)


def _np_halo(x, halo, wrap, right=True):
  """x[blocks, size, c]: windows of the flattened long dimension."""
  blocks, size, c = x.shape
  long = x.reshape(blocks * size, c)
  if wrap:
    padded = np.take(long, np.arange(-halo, len(long) + halo) % len(long),
                     axis=0)
  else:
    padded = np.pad(long, [(halo, halo), (0, 0)])
  width = size + (2 * halo if right else halo)
  return np.stack([padded[b * size:b * size + width] for b in range(blocks)])


# Splitting "c" alone (all8_c) leaves the exchange local, the one-processor
# path; the 2-D layouts split "c" together with "blocks".
@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(
                             ["blocks", "c"],
                             layouts=("1proc", "all8_blocks", "2d",
                                      "2d_swapped")))
def test_halo_exchange(mesh_shape, layout, mode):
  # Halos of less than, exactly and more than one block of 3 entries.
  def build(mesh, t):
    del mesh
    x = t["x"]
    blocks_dim, size_dim = x.shape[0], x.shape[1]
    return {
        "h1": mtf.halo_exchange(x, blocks_dim, size_dim, 1),
        "h3_wrap": mtf.halo_exchange(x, "blocks", "size", 3, wrap=True),
        "h4": mtf.halo_exchange(x, blocks_dim, size_dim, 4),
        "left5_wrap": mtf.left_halo_exchange(x, blocks_dim, size_dim, 5,
                                             wrap=True),
    }

  def np_fn(x):
    return {
        "h1": _np_halo(x, 1, False),
        "h3_wrap": _np_halo(x, 3, True),
        "h4": _np_halo(x, 4, False),
        "left5_wrap": _np_halo(x, 5, True)[:, :3 + 5],
    }

  mtf_testing.check_op(build, np_fn,
                       {"x": (_x((8, 3, 8)), ["blocks", "size", "c"])},
                       mesh_shape, layout, mode)


def test_halo_exchange_with_split_block_raises_layout_error():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.zeros([2, 8]), "blocks:2,size:8")
  y = mtf.halo_exchange(x, "blocks", "size", 1)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "size:all")
  with pytest.raises(mtf.LayoutError, match="'size'"):
    mtf.Lowering(graph, {mesh: impl})
  del y


@pytest.mark.parametrize("wrap", [False, True], ids=["zeros", "wrap"])
@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["b", "a"]))
def test_dynamic_shift(mesh_shape, layout, mode, wrap):
  offsets = np.array([0, 1, -1, 3, -7, 8, 9, -12], np.int32)

  def np_fn(x, offset):
    return {"y": np.stack([mtf_testing.np_shift(row, o, 0, wrap)
                           for row, o in zip(x, offset)])}

  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.dynamic_shift(t["x"], t["offset"], "b",
                                              wrap)},
      np_fn, {"x": (_x((8, 8)), ["a", "b"]), "offset": (offsets, ["a"])},
      mesh_shape, layout, mode)


def test_dynamic_shift_validates_offset_shape():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:4")
  with pytest.raises(mtf.ShapeError, match="must not have"):
    mtf.dynamic_shift(x, mtf.zeros(mesh, "b:4", tf.int32), "b", False)
  with pytest.raises(mtf.ShapeError, match="c"):
    mtf.dynamic_shift(x, mtf.zeros(mesh, "c:4", tf.int32), "b", False)
