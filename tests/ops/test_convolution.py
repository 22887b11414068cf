"""Convolutions against TensorFlow on one device, in float64.

The reference values and gradients come from tf.nn on the full tensors
(with tf.GradientTape), which is cheaper than central differences for
tensors of this size. Batch and channel dimensions take every standard
layout; split spatial dimensions are tests/ops/test_spatial_splits.py's,
split filter-spatial dimensions are a LayoutError.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

X_DIMS = ["batch", "h", "w", "cin"]
F_DIMS = ["fh", "fw", "cin", "cout"]
TRANSPOSE_F_DIMS = ["fh", "fw", "cout", "cin"]
# Eagerly only: on SimdMeshImpl its one collective, the allreduce of the
# split cin, is the 2d and 2d_swapped layouts' (cin over cols, rows).
EXTRA_LAYOUT = mtf_testing.extra_layout_params(
    "2d_cin_cout", "rows:2;cols:4", "cin:rows;cout:cols", modes=("eager",))
CONV_PARAMS = (mtf_testing.layout_mode_params(["batch", "cin", "cout"]) +
               EXTRA_LAYOUT)


def _u(shape, seed):
  return np.random.RandomState(seed).uniform(-1.0, 1.0,
                                             size=shape).astype(np.float32)


def _check(build, tf_fn, inputs, mesh_shape, layout, mode):
  np_fn, np_grad_fn = mtf_testing.tf_reference(tf_fn)
  mtf_testing.check_op(build, np_fn, inputs, mesh_shape, layout, mode,
                       np_grad_fn=np_grad_fn)


@pytest.mark.parametrize("mesh_shape,layout,mode", CONV_PARAMS)
def test_conv2d(mesh_shape, layout, mode):
  def build(mesh, t):
    del mesh
    return {"same": mtf.conv2d(t["x"], t["f"], [1, 1, 1, 1], "SAME"),
            "valid_strided": mtf.conv2d(t["x"], t["f"], (2, 2), "VALID")}

  def tf_fn(x, f):
    return {"same": tf.nn.conv2d(x, f, 1, "SAME"),
            "valid_strided": tf.nn.conv2d(x, f, 2, "VALID")}

  _check(build, tf_fn, {"x": (_u((8, 5, 6, 8), 0), X_DIMS),
                        "f": (_u((3, 3, 8, 8), 1), F_DIMS)},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    pytest.param("all:1", "", "graph", id="1proc-graph"),
    pytest.param("rows:2;cols:4", "outer:rows;batch:cols", "eager",
                 id="2d-eager"),
    pytest.param("rows:2;cols:4", "batch:rows;cout:cols", "function",
                 id="2d_cout-function"),
])
def test_conv2d_several_batch_dims(mesh_shape, layout, mode):
  def tf_fn(x, f):
    flat = tf.reshape(x, [-1, 4, 4, 8])
    y = tf.nn.conv2d(flat, f, [1, 2, 1, 1], "SAME")
    return {"y": tf.reshape(y, [2, 4, 2, 4, 8])}

  _check(lambda mesh, t: {"y": mtf.conv2d(t["x"], t["f"], (2, 1), "SAME")},
         tf_fn, {"x": (_u((2, 4, 4, 4, 8), 2), ["outer"] + X_DIMS),
                 "f": (_u((2, 3, 8, 8), 3), F_DIMS)},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", CONV_PARAMS)
def test_conv3d(mesh_shape, layout, mode):
  def build(mesh, t):
    del mesh
    return {"same": mtf.conv3d(t["x"], t["f"], [1, 1, 1, 1, 1], "SAME"),
            "valid": mtf.conv3d(t["x"], t["f"], (1, 2, 1), "VALID")}

  def tf_fn(x, f):
    return {"same": tf.nn.conv3d(x, f, [1, 1, 1, 1, 1], "SAME"),
            "valid": tf.nn.conv3d(x, f, [1, 1, 2, 1, 1], "VALID")}

  _check(build, tf_fn, {"x": (_u((8, 3, 4, 3, 8), 4),
                              ["batch", "d", "h", "w", "cin"]),
                        "f": (_u((2, 3, 2, 8, 8), 5),
                              ["fd", "fh", "fw", "cin", "cout"])},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", CONV_PARAMS)
def test_conv2d_transpose(mesh_shape, layout, mode):
  def build(mesh, t):
    del mesh
    return {"same_strided": mtf.conv2d_transpose(t["x"], t["f"], (2, 2),
                                                 "SAME"),
            "valid": mtf.conv2d_transpose(t["x"], t["f"], (1, 1), "VALID")}

  def tf_fn(x, f):
    return {"same_strided": tf.nn.conv2d_transpose(
        x, f, [8, 6, 8, 8], 2, "SAME"),
            "valid": tf.nn.conv2d_transpose(x, f, [8, 5, 6, 8], 1, "VALID")}

  _check(build, tf_fn, {"x": (_u((8, 3, 4, 8), 6), X_DIMS),
                        "f": (_u((3, 3, 8, 8), 7), TRANSPOSE_F_DIMS)},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    pytest.param("all:1", "", "eager", id="1proc-eager"),
    pytest.param("rows:2;cols:4", "cin:rows;batch:cols", "graph",
                 id="2d-graph"),
    pytest.param("all:8", "cout:all", "function", id="all8_cout-function"),
])
def test_conv3d_transpose(mesh_shape, layout, mode):
  def tf_fn(x, f):
    return {"y": tf.nn.conv3d_transpose(x, f, [8, 4, 5, 4, 8],
                                        [1, 2, 1, 2, 1], "VALID")}

  _check(lambda mesh, t: {"y": mtf.conv3d_transpose(t["x"], t["f"],
                                                    (2, 1, 2), "VALID")},
         tf_fn, {"x": (_u((8, 2, 3, 2, 8), 8),
                       ["batch", "d", "h", "w", "cin"]),
                 "f": (_u((2, 3, 1, 8, 8), 9),
                       ["fd", "fh", "fw", "cout", "cin"])},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    pytest.param("all:1", "", "graph", id="1proc-graph"),
    pytest.param("rows:2;cols:4", "batch:rows;cout:cols", "eager",
                 id="2d-eager"),
    pytest.param("rows:2;cols:4", "cout:rows;cin:cols", "function",
                 id="2d_cout_cin-function"),
])
def test_conv2d_backprop_ops_and_their_gradients(mesh_shape, layout, mode):
  # The backprop ops as forward ops: their values, and their own gradients
  # (second-order gradients of conv2d) against TF's.
  def build(mesh, t):
    del mesh
    return {
        "dx": mtf.conv2d_backprop_input(t["x"].shape, t["f"], t["dy"],
                                        (2, 1), "SAME"),
        "df": mtf.conv2d_backprop_filter(t["x"], t["f"].shape, t["dy"],
                                         (2, 1), "SAME"),
    }

  def tf_fn(x, f, dy):
    strides = [1, 2, 1, 1]
    return {
        "dx": tf.raw_ops.Conv2DBackpropInput(
            input_sizes=x.shape.as_list(), filter=f, out_backprop=dy,
            strides=strides, padding="SAME"),
        "df": tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=f.shape.as_list(), out_backprop=dy,
            strides=strides, padding="SAME"),
    }

  _check(build, tf_fn, {"x": (_u((8, 5, 4, 8), 15), X_DIMS),
                        "f": (_u((3, 2, 8, 8), 16), F_DIMS),
                        "dy": (_u((8, 3, 4, 8), 17),
                               ["batch", "h", "w", "cout"])},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    pytest.param("all:1", "", "eager", id="1proc-eager"),
    pytest.param("rows:2;cols:4", "batch:rows;cin:cols", "graph",
                 id="2d-graph"),
    pytest.param("rows:2;cols:4", "cout:rows;batch:cols", "function",
                 id="2d_cout-function"),
])
def test_conv2d_transpose_backprop_ops(mesh_shape, layout, mode):
  """The original's (conv_dimension, is_transpose, ...) operations for the
  gradients of a transposed convolution, and their own gradients."""
  def build(mesh, t):
    del mesh
    x, f, dy = t["x"], t["f"], t["dy"]
    return {
        "dx": mtf.conv2d_transpose_backprop_input(x.shape, f, dy, (2, 1),
                                                  "SAME"),
        "dx_op": mtf.Conv2or3dBackpropInputOperation(
            conv_dimension=2, is_transpose=True, input_shape=x.shape,
            conv_filter=f, dy=dy, strides=(2, 1), padding="SAME",
            name="dx_op").outputs[0],
        "df": mtf.Conv2or3dBackpropFilterOperation(
            2, True, x, f.shape, dy, (2, 1), "SAME").outputs[0],
        "df_fn": mtf.conv2d_transpose_backprop_filter(x, f.shape, dy, (2, 1),
                                                      "SAME"),
    }

  def tf_fn(x, f, dy):
    # The gradients of tf.nn.conv2d_transpose(x, f) for output gradient dy.
    with tf.GradientTape() as tape:
      tape.watch([x, f])
      y = tf.nn.conv2d_transpose(x, f, [8, 10, 4, 8], [1, 2, 1, 1], "SAME")
    dx, df = tape.gradient(y, [x, f], output_gradients=dy)
    return {"dx": dx, "dx_op": dx, "df": df, "df_fn": df}

  _check(build, tf_fn, {"x": (_u((8, 5, 4, 8), 18), X_DIMS),
                        "f": (_u((3, 2, 8, 8), 19), TRANSPOSE_F_DIMS),
                        "dy": (_u((8, 10, 4, 8), 20),
                               ["batch", "h", "w", "cout"])},
         mesh_shape, layout, mode)


def _from_blocks(x, nblock):
  """[b, blocks..., sizes..., c] -> [b, whole spatial..., c]."""
  b, c = x.shape[0], x.shape[-1]
  blocks, sizes = x.shape[1:1 + nblock], x.shape[1 + nblock:-1]
  perm = [0]
  for i in range(nblock):
    perm += [1 + i, 1 + nblock + i]
  perm += list(range(1 + 2 * nblock, len(x.shape)))
  whole = [blocks[i] * sizes[i] for i in range(nblock)]
  return tf.reshape(tf.transpose(x, perm),
                    [b] + whole + list(sizes[nblock:]) + [c])


def _to_blocks(y, blocks, sizes):
  """Inverse of _from_blocks, for the output channel count of y."""
  nblock = len(blocks)
  b, c = y.shape[0], y.shape[-1]
  split = [b]
  for i in range(nblock):
    split += [blocks[i], sizes[i]]
  split += list(sizes[nblock:]) + [c]
  y = tf.reshape(y, split)
  perm = ([0] + [1 + 2 * i for i in range(nblock)] +
          [2 + 2 * i for i in range(nblock)] +
          list(range(1 + 2 * nblock, len(split))))
  return tf.transpose(y, perm)


def _h_blocks_only_reference(x, f):
  """SAME conv along whole columns; w blocks convolved independently."""
  b, hb, wb, h, w, c = x.shape
  per_w_block = tf.reshape(tf.transpose(x, [0, 2, 1, 3, 4, 5]),
                           [b * wb, hb * h, w, c])
  y = tf.nn.conv2d(per_w_block, f, 1, "SAME")
  y = tf.reshape(y, [b, wb, hb, h, w, y.shape[-1]])
  return tf.transpose(y, [0, 2, 1, 3, 4, 5])


BLOCK_LAYOUTS = [
    ("1proc", "all:1", ""),
    ("2d", "rows:2;cols:4", "hb:rows;wb:cols"),
    ("wb_all4", "all:4", "wb:all"),
    ("hb_cin", "rows:2;cols:2", "hb:rows;cin:cols"),
]


def _block_params():
  """Every block layout eagerly, SIMD on the 2-D meshes (halo exchanges over
  either mesh axis), the traced modes on "2d", as layout_mode_params
  chooses: the halo code is the same Python code in every mode."""
  for case, mesh, layout in BLOCK_LAYOUTS:
    for mode in mtf_testing.MODES + (mtf_testing.V1_SHAPES_MODE,):
      if (mode == "eager" or case == "2d"
          or (mode == "simd" and ";" in mesh)):
        yield pytest.param(mesh, layout, mode, id=f"{case}-{mode}")


@pytest.mark.parametrize("mesh_shape,layout,mode", list(_block_params()))
def test_conv2d_with_blocks(mesh_shape, layout, mode):
  # Halos: 1 and 2 rows (blocks of 3 rows), 1 column (blocks of 2 columns).
  # Without w_blocks_dim the w blocks are convolved independently, with zero
  # padding, as in the original.
  def build(mesh, t):
    del mesh
    x = t["x"]
    return {
        "f33": mtf.conv2d_with_blocks(x, t["f33"], (1, 1), "SAME",
                                      h_blocks_dim=x.shape[1],
                                      w_blocks_dim=x.shape[2]),
        "f53_h_only": mtf.conv2d_with_blocks(x, t["f53"], (1, 1), "SAME",
                                             h_blocks_dim="hb"),
    }

  def tf_fn(x, f33, f53):
    whole = _from_blocks(x, 2)
    return {
        "f33": _to_blocks(tf.nn.conv2d(whole, f33, 1, "SAME"), [2, 4],
                          [3, 2]),
        "f53_h_only": _h_blocks_only_reference(x, f53),
    }

  _check(build, tf_fn,
         {"x": (_u((2, 2, 4, 3, 2, 4), 10),
                ["batch", "hb", "wb", "h", "w", "cin"]),
          "f33": (_u((3, 3, 4, 4), 11), F_DIMS),
          "f53": (_u((5, 3, 4, 4), 12), F_DIMS)},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    pytest.param("all:1", "", "graph", id="1proc-graph")] + [
        pytest.param("rows:2;cols:2", "db:rows;hb:cols", mode,
                     id=f"2d-{mode}") for mode in mtf_testing.MODES])
def test_conv3d_with_blocks(mesh_shape, layout, mode):
  def tf_fn(x, f):
    whole = _from_blocks(x, 2)
    return {"y": _to_blocks(tf.nn.conv3d(whole, f, [1] * 5, "SAME"), [2, 2],
                            [2, 2, 3])}

  _check(lambda mesh, t: {"y": mtf.conv3d_with_blocks(
      t["x"], t["f"], (1, 1, 1), "SAME", d_blocks_dim="db",
      h_blocks_dim="hb")},
         tf_fn, {"x": (_u((1, 2, 2, 2, 2, 3, 2), 13),
                       ["batch", "db", "hb", "d", "h", "w", "cin"]),
                 "f": (_u((3, 3, 3, 2, 2), 14),
                       ["fd", "fh", "fw", "cin", "cout"])},
         mesh_shape, layout, mode)


def _transpose_w_independent_reference(x, f, strides):
  """SAME transposed conv along whole columns; w blocks independent."""
  b, hb, wb, h, w, c = x.shape
  sh, sw = strides
  per_w_block = tf.reshape(tf.transpose(x, [0, 2, 1, 3, 4, 5]),
                           [b * wb, hb * h, w, c])
  y = tf.nn.conv2d_transpose(per_w_block, f,
                             [b * wb, hb * h * sh, w * sw, f.shape[2]],
                             [1, sh, sw, 1], "SAME")
  y = tf.reshape(y, [b, wb, hb, h * sh, w * sw, y.shape[-1]])
  return tf.transpose(y, [0, 2, 1, 3, 4, 5])


TRANSPOSE_BLOCK_PARAMS = [
    pytest.param("all:1", "", "graph", id="1proc-graph")] + [
        pytest.param("b1:2;b2:2", "hb:b1;wb:b2", mode, id=f"2d-{mode}")
        for mode in mtf_testing.MODES]


@pytest.mark.parametrize("mesh_shape,layout,mode", TRANSPOSE_BLOCK_PARAMS)
def test_conv2d_transpose_with_blocks(mesh_shape, layout, mode):
  # Blocks of 3 rows and 2 columns. Stride 1 with a 3x3 filter (halo 1);
  # stride 2 with a 3x4 filter (halos of 1 input row / column, the even
  # filter pads asymmetrically); stride (3, 2) with a 5x3 filter along h
  # only (w blocks transposed-convolved independently).
  def build(mesh, t):
    del mesh
    x = t["x"]
    return {
        "s1": mtf.conv2d_transpose_with_blocks(
            x, t["f33"], (1, 1), "SAME", h_blocks_dim=x.shape[1],
            w_blocks_dim=x.shape[2]),
        "s2": mtf.conv2d_transpose_with_blocks(
            x, t["f34"], [1, 2, 2, 1], "SAME", h_blocks_dim="hb",
            w_blocks_dim="wb"),
        "s32_h_only": mtf.conv2d_transpose_with_blocks(
            x, t["f53"], (3, 2), "SAME", h_blocks_dim="hb"),
    }

  def tf_fn(x, f33, f34, f53):
    whole = _from_blocks(x, 2)
    return {
        "s1": _to_blocks(tf.nn.conv2d_transpose(whole, f33, [2, 6, 4, 2], 1,
                                                "SAME"), [2, 2], [3, 2]),
        "s2": _to_blocks(tf.nn.conv2d_transpose(whole, f34, [2, 12, 8, 2], 2,
                                                "SAME"), [2, 2], [6, 4]),
        "s32_h_only": _transpose_w_independent_reference(x, f53, (3, 2)),
    }

  _check(build, tf_fn,
         {"x": (_u((2, 2, 2, 3, 2, 3), 20),
                ["batch", "hb", "wb", "h", "w", "cin"]),
          "f33": (_u((3, 3, 2, 3), 21), TRANSPOSE_F_DIMS),
          "f34": (_u((3, 4, 2, 3), 22), TRANSPOSE_F_DIMS),
          "f53": (_u((5, 3, 2, 3), 23), TRANSPOSE_F_DIMS)},
         mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", TRANSPOSE_BLOCK_PARAMS)
def test_conv3d_transpose_with_blocks(mesh_shape, layout, mode):
  # Strides (2, 1, 2); along h a 5-wide filter at stride 1 needs a halo of
  # 2 rows, larger than the 1-row blocks.
  def tf_fn(x, f):
    whole = _from_blocks(x, 2)
    y = tf.nn.conv3d_transpose(whole, f, [1, 8, 2, 6, 2], [1, 2, 1, 2, 1],
                               "SAME")
    return {"y": _to_blocks(y, [2, 2], [4, 1, 6])}

  _check(lambda mesh, t: {"y": mtf.conv3d_transpose_with_blocks(
      t["x"], t["f"], (2, 1, 2), "SAME", d_blocks_dim="hb",
      h_blocks_dim="wb")},
         tf_fn, {"x": (_u((1, 2, 2, 2, 1, 3, 2), 24),
                       ["batch", "hb", "wb", "d", "h", "w", "cin"]),
                 "f": (_u((3, 5, 2, 2, 2), 25),
                       ["fd", "fh", "fw", "cout", "cin"])},
         mesh_shape, layout, mode)


def _graph_with_conv(x_dims="batch:8,h:4,w:4,cin:8",
                     f_dims="fh:3,fw:3,cin:8,cout:8"):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, x_dims)
  f = mtf.zeros(mesh, f_dims)
  return graph, mesh, x, f


@pytest.mark.parametrize("split", ["fh", "fw"])
def test_split_filter_spatial_dimension_raises_layout_error(split):
  # A split image spatial dimension lowers (tests/ops/test_spatial_splits.py).
  graph, mesh, x, f = _graph_with_conv()
  mtf.conv2d(x, f, (1, 1), "SAME")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:3", f"{split}:all")
  with pytest.raises(mtf.LayoutError,
                     match=f"filter-spatial dimension '{split}'"):
    mtf.Lowering(graph, {mesh: impl})


def test_backprop_operations_mark_every_dimension_splittable():
  # As the original's (automatic layout reads the forward convolution's
  # marks); lowering still refuses a split filter-spatial dimension.
  graph, mesh, x, f = _graph_with_conv()
  dy = mtf.zeros(mesh, "batch:8,h:4,w:4,cout:8")
  ops = [mtf.Conv2or3dBackpropInputOperation(2, False, x.shape, f, dy,
                                             (1, 1), "SAME"),
         mtf.Conv2or3dBackpropFilterOperation(2, False, x, f.shape, dy,
                                              (1, 1), "SAME")]
  for op in ops:
    assert op.splittable_dims == {"batch", "h", "w", "cin", "cout", "fh",
                                  "fw"}
    assert not op.unsplittable_dims
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:3", "fh:all")
  with pytest.raises(mtf.LayoutError, match="conv2d_backprop_input.*'fh'"):
    mtf.Lowering(graph, {mesh: impl})


def test_validation_errors():
  _, _, x, f = _graph_with_conv(f_dims="fh:3,fw:3,cother:8,cout:8")
  with pytest.raises(mtf.ShapeError, match="channel dimension"):
    mtf.conv2d(x, f, (1, 1), "SAME")
  _, _, x, f = _graph_with_conv()
  with pytest.raises(ValueError, match="padding"):
    mtf.conv2d(x, f, (1, 1), "FULL")
  with pytest.raises(ValueError, match="strides"):
    mtf.conv2d(x, f, (1, 1, 1), "SAME")
  with pytest.raises(mtf.ShapeError, match="VALID"):
    mtf.conv2d(x, mtf.zeros(x.mesh, "fh:5,fw:5,cin:8,cout:8"), (1, 1),
               "VALID")
  blocks = mtf.zeros(x.mesh, "batch:2,hb:2,wb:2,h:4,w:4,cin:8")
  with pytest.raises(NotImplementedError, match="SAME"):
    mtf.conv2d_with_blocks(blocks, f, (1, 1), "VALID", h_blocks_dim="hb")
  with pytest.raises(ValueError, match="strides"):
    mtf.conv2d_with_blocks(blocks, f, (2, 2), "SAME", h_blocks_dim="hb")
  with pytest.raises(NotImplementedError, match="SAME"):
    mtf.conv2d_transpose_with_blocks(blocks, f, (2, 2), "VALID",
                                     h_blocks_dim="hb")
  with pytest.raises(ValueError, match="strides"):
    mtf.conv2d_transpose_with_blocks(blocks, f, (0, 2), "SAME",
                                     w_blocks_dim="wb")
