"""Tests of mesh_tensorflow.layers.conv_transpose_layers against float64 TensorFlow.

Each layer runs under several layouts (one processor, batch split, input or
output channels split, spatial blocks split) in the three execution modes;
values and gradients (input and kernel) are compared with tf.nn in float64.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

BATCH = mtf.Dimension("batch", 4)
CIN = mtf.Dimension("cin", 4)
COUT = mtf.Dimension("cout", 2)
D = mtf.Dimension("d", 2)
H = mtf.Dimension("h", 3)
W = mtf.Dimension("w", 3)

LAYOUTS = [("all:1", ""), ("all:4", "batch:all"),
           ("rows:2;cols:2", "batch:rows;cout:cols"), ("all:2", "cin:all")]


def _params(layouts, modes=mtf_testing.MODES):
  return mtf_testing.mesh_layout_mode_params(layouts, modes)


def _rand(shape, seed):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


def _reference(tf_fn, x_value, kernel, cotangent):
  """(y, dx, dkernel) of tf_fn(x, kernel) in float64."""
  x = tf.constant(x_value, tf.float64)
  k = tf.constant(kernel, tf.float64)
  with tf.GradientTape() as tape:
    tape.watch([x, k])
    y = tf_fn(x, k)
    loss = tf.reduce_sum(y * cotangent)
  dx, dk = tape.gradient(loss, [x, k])
  return y.numpy(), dx.numpy(), dk.numpy()


def _run_layer(mesh_shape, layout, mode, layer_fn, var_name, x_value, x_dims,
               kernel, out_shape, cotangent_seed):
  """Runs layer_fn(x) with the kernel initialised to `kernel`.

  Returns (fetched values, the cotangent, the kernel variable's shape).
  """
  cotangent = _rand(out_shape, cotangent_seed)

  def build(mesh):
    x = mtf_testing.import_array(mesh, x_value, x_dims)
    y = layer_fn(x, kernel)
    c = mtf_testing.import_array(mesh, cotangent, y.shape.dims)
    k = mesh.graph.name_to_variable[var_name].outputs[0]
    return {"y": y}, mtf.reduce_sum(y * c), {"x": x, "kernel": k}

  got, graph = mtf_testing.run_program(mesh_shape, layout, mode, build,
                                       fetch_variables=False)
  assert [v.name for v in graph.trainable_variables] == [var_name]
  return got, cotangent, graph.name_to_variable[var_name].shape


def _assert_close(got, want):
  np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["d_x"], want[1], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got["d_kernel"], want[2], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------- plain layers

X2 = _rand([4, 3, 3, 4], 0)
X3 = _rand([4, 2, 3, 3, 4], 1)


@pytest.mark.parametrize("filter_size,padding", [(2, "SAME"), (3, "VALID")])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(LAYOUTS))
def test_conv2d_transpose(mesh_shape, layout, mode, filter_size, padding):
  kernel = _rand([filter_size, 2, 2, 4], 2)
  out_h = 6 if padding == "SAME" else 6 + filter_size - 2

  def layer(x, k):
    return mtf.layers.conv2d_transpose(
        x, COUT, filter_size=(filter_size, 2), strides=(2, 2),
        padding=padding, filter_initializer=k)

  got, cotangent, kshape = _run_layer(
      mesh_shape, layout, mode, layer, "conv2d_transpose/kernel", X2,
      [BATCH, H, W, CIN], kernel, [4, out_h, 6, 2], 3)
  assert kshape.to_integer_list == [filter_size, 2, 2, 4]
  assert kshape.dimension_names == ["fh", "fw", "cout", "cin"]

  def tf_fn(x, k):
    return tf.nn.conv2d_transpose(x, k, [4, out_h, 6, 2], [1, 2, 2, 1],
                                  padding)

  _assert_close(got, _reference(tf_fn, X2, kernel, cotangent))


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(LAYOUTS))
def test_conv3d(mesh_shape, layout, mode):
  kernel = _rand([3, 3, 1, 4, 2], 4)

  def layer(x, k):
    return mtf.layers.conv3d(x, COUT, filter_size=(3, 3, 1),
                             filter_initializer=k)

  got, cotangent, kshape = _run_layer(
      mesh_shape, layout, mode, layer, "conv3d/kernel", X3,
      [BATCH, D, H, W, CIN], kernel, [4, 2, 3, 3, 2], 5)
  assert kshape.dimension_names == ["fd", "fh", "fw", "cin", "cout"]

  def tf_fn(x, k):
    return tf.nn.conv3d(x, k, [1, 1, 1, 1, 1], "SAME")

  _assert_close(got, _reference(tf_fn, X3, kernel, cotangent))


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(LAYOUTS))
def test_conv3d_transpose(mesh_shape, layout, mode):
  kernel = _rand([2, 2, 2, 2, 4], 6)

  def layer(x, k):
    return mtf.layers.conv3d_transpose(x, COUT, filter_initializer=k)

  got, cotangent, kshape = _run_layer(
      mesh_shape, layout, mode, layer, "conv3d_transpose/kernel", X3,
      [BATCH, D, H, W, CIN], kernel, [4, 4, 6, 6, 2], 7)
  assert kshape.dimension_names == ["fd", "fh", "fw", "cout", "cin"]

  def tf_fn(x, k):
    return tf.nn.conv3d_transpose(x, k, [4, 4, 6, 6, 2], [1, 2, 2, 2, 1],
                                  "SAME")

  _assert_close(got, _reference(tf_fn, X3, kernel, cotangent))


# ------------------------------------------------------- spatial blocks

SB = mtf.Dimension("batch", 2)
HB = mtf.Dimension("h_blocks", 4)
WB = mtf.Dimension("w_blocks", 2)
DB = mtf.Dimension("d_blocks", 2)
BD = mtf.Dimension("bd", 2)
BH = mtf.Dimension("bh", 2)
BW = mtf.Dimension("bw", 3)

BLOCK_LAYOUTS_2D = [("all:1", ""),
                    ("rows:4;cols:2", "h_blocks:rows;w_blocks:cols")]
BLOCK_LAYOUTS_3D = [("all:1", ""),
                    ("rows:2;cols:4", "d_blocks:rows;h_blocks:cols")]


def _to_blocks_2d(image, hb, wb):
  """[b, H, W, c] -> [b, hb, wb, H / hb, W / wb, c]."""
  b, h, w, c = image.shape
  return image.reshape([b, hb, h // hb, wb, w // wb, c]).transpose(
      [0, 1, 3, 2, 4, 5])


def _from_blocks_2d(blocks):
  b, hb, wb, bh, bw, c = blocks.shape
  return blocks.transpose([0, 1, 3, 2, 4, 5]).reshape(
      [b, hb * bh, wb * bw, c])


def _to_blocks_3d(volume, db, hb):
  """[b, D, H, W, c] -> [b, db, hb, D / db, H / hb, W, c]."""
  b, d, h, w, c = volume.shape
  return volume.reshape([b, db, d // db, hb, h // hb, w, c]).transpose(
      [0, 1, 3, 2, 4, 5, 6])


def _from_blocks_3d(blocks):
  b, db, hb, bd, bh, w, c = blocks.shape
  return blocks.transpose([0, 1, 3, 2, 4, 5, 6]).reshape(
      [b, db * bd, hb * bh, w, c])


def _check_blocks(mesh_shape, layout, mode, layer, var_name, image, kernel,
                  blocks_dims, to_blocks, from_blocks, tf_fn, out_shape, seed):
  cotangent = _rand(out_shape, seed)
  x_value = to_blocks(image)
  c_value = to_blocks(cotangent)

  def build(mesh):
    x = mtf_testing.import_array(mesh, x_value, blocks_dims)
    y = layer(x, kernel)
    c = mtf_testing.import_array(mesh, c_value, y.shape.dims)
    k = mesh.graph.name_to_variable[var_name].outputs[0]
    return {"y": y}, mtf.reduce_sum(y * c), {"x": x, "kernel": k}

  got, _ = mtf_testing.run_program(mesh_shape, layout, mode, build,
                                   fetch_variables=False)
  got["y"] = from_blocks(got["y"])
  got["d_x"] = from_blocks(got["d_x"])
  _assert_close(got, _reference(tf_fn, image, kernel, cotangent))


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BLOCK_LAYOUTS_2D))
def test_conv2d_transpose_with_blocks(mesh_shape, layout, mode):
  image = _rand([2, 8, 6, 4], 8)  # 4 x 2 blocks of 2 x 3 pixels.
  kernel = _rand([4, 2, 2, 4], 9)

  def layer(x, k):
    return mtf.layers.conv2d_transpose_with_blocks(
        x, COUT, filter_size=(4, 2), strides=(2, 2), h_blocks_dim=HB,
        w_blocks_dim=WB, filter_initializer=k)

  def tf_fn(x, k):
    return tf.nn.conv2d_transpose(x, k, [2, 16, 12, 2], [1, 2, 2, 1], "SAME")

  _check_blocks(mesh_shape, layout, mode, layer, "conv2d_transpose/kernel",
                image, kernel, [SB, HB, WB, BH, BW, CIN],
                lambda a: _to_blocks_2d(a, 4, 2), _from_blocks_2d, tf_fn,
                [2, 16, 12, 2], 10)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BLOCK_LAYOUTS_3D))
def test_conv3d_with_blocks(mesh_shape, layout, mode):
  volume = _rand([2, 4, 8, 3, 4], 11)  # 2 x 4 blocks of 2 x 2 x 3.
  kernel = _rand([3, 3, 3, 4, 2], 12)

  def layer(x, k):
    return mtf.layers.conv3d_with_blocks(
        x, COUT, d_blocks_dim=DB, h_blocks_dim=HB, filter_initializer=k)

  def tf_fn(x, k):
    return tf.nn.conv3d(x, k, [1, 1, 1, 1, 1], "SAME")

  _check_blocks(mesh_shape, layout, mode, layer, "conv3d/kernel", volume,
                kernel, [SB, DB, HB, BD, BH, BW, CIN],
                lambda a: _to_blocks_3d(a, 2, 4), _from_blocks_3d, tf_fn,
                [2, 4, 8, 3, 2], 13)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BLOCK_LAYOUTS_3D))
def test_conv3d_transpose_with_blocks(mesh_shape, layout, mode):
  volume = _rand([2, 4, 8, 3, 4], 14)
  kernel = _rand([2, 2, 2, 2, 4], 15)

  def layer(x, k):
    return mtf.layers.conv3d_transpose_with_blocks(
        x, COUT, d_blocks_dim=DB, h_blocks_dim=HB, filter_initializer=k)

  def tf_fn(x, k):
    return tf.nn.conv3d_transpose(x, k, [2, 8, 16, 6, 2], [1, 2, 2, 2, 1],
                                  "SAME")

  _check_blocks(mesh_shape, layout, mode, layer, "conv3d_transpose/kernel",
                volume, kernel, [SB, DB, HB, BD, BH, BW, CIN],
                lambda a: _to_blocks_3d(a, 2, 4), _from_blocks_3d, tf_fn,
                [2, 8, 16, 6, 2], 16)


def test_without_blocks_dims_is_the_plain_layer_and_names_are_unique():
  def build(mesh):
    x = mtf_testing.import_array(mesh, X3, [BATCH, D, H, W, CIN])
    y1 = mtf.layers.conv3d_with_blocks(x, COUT)
    y2 = mtf.layers.conv3d_transpose_with_blocks(x, COUT)
    y3 = mtf.layers.conv3d(x, COUT, name="c")
    return {"y1": y1, "y2": y2, "y3": y3}, None, {}

  got, graph = mtf_testing.run_program("all:1", "", "eager", build)
  assert [v.name for v in graph.trainable_variables] == [
      "conv3d/kernel", "conv3d_transpose/kernel", "c/kernel"]
  assert got["y1"].shape == (4, 2, 3, 3, 2)
  assert got["y2"].shape == (4, 4, 6, 6, 2)


def test_bad_filter_size():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf_testing.import_array(mesh, X3, [BATCH, D, H, W, CIN])
  with pytest.raises(mtf.ShapeError, match="filter_size"):
    mtf.layers.conv3d(x, COUT, filter_size=(3, 3))


# ------------------------------------------------------ separable_conv1d

LENGTH = mtf.Dimension("length", 8)
C = mtf.Dimension("c", 4)
OUT = mtf.Dimension("out", 6)
XS = _rand([4, 8, 4], 20)

SEP_LAYOUTS = [("all:1", ""), ("all:4", "length:all"),
               ("rows:2;cols:2", "batch:rows;c:cols")]


def _tf_separable(x, depthwise, bias_d, pointwise, bias_p, min_pos):
  """sum_r w_r[c] x[i + r, c] + b_d, then a dense layer."""
  length = x.shape[1]
  y = 0.0
  for k, w in enumerate(depthwise):
    r = min_pos + k
    padded = tf.pad(x, [[0, 0], [max(-r, 0), max(r, 0)], [0, 0]])
    y += padded[:, max(r, 0):max(r, 0) + length, :] * w
  if bias_d is not None:
    y += bias_d
  y = tf.einsum("blc,co->blo", y, pointwise)
  return y + bias_p if bias_p is not None else y


@pytest.mark.parametrize("min_pos,max_pos", [(-1, 1), (-2, 0)])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(SEP_LAYOUTS))
def test_separable_conv1d(mesh_shape, layout, mode, min_pos, max_pos):
  size = max_pos - min_pos + 1
  cotangent = _rand([4, 8, 6], 21)
  prefix = "separable_conv1d/depthwise_conv_hack/depthwise_dense_"
  names = ([f"{prefix}{k}/kernel" for k in range(size)] +
           [f"{prefix}0/bias", "separable_conv1d/pointwise_dense/kernel",
            "separable_conv1d/pointwise_dense/bias"])

  def build(mesh):
    x = mtf_testing.import_array(mesh, XS, [BATCH, LENGTH, C])
    y = mtf.layers.separable_conv1d(x, OUT, min_pos, max_pos)
    c = mtf_testing.import_array(mesh, cotangent, y.shape.dims)
    wrt = {"x": x}
    wrt.update({n: mesh.graph.name_to_variable[n].outputs[0] for n in names})
    return {"y": y}, mtf.reduce_sum(y * c), wrt

  got, graph = mtf_testing.run_program(mesh_shape, layout, mode, build)
  assert sorted(v.name for v in graph.trainable_variables) == sorted(names)
  assert graph.name_to_variable[names[0]].shape == mtf.Shape([C])
  assert graph.name_to_variable[names[-2]].shape == mtf.Shape([C, OUT])
  # Biases start at zero; make the reference use the fetched variables.
  values = [tf.constant(got[n], tf.float64) for n in names]
  x = tf.constant(XS, tf.float64)
  with tf.GradientTape() as tape:
    tape.watch([x] + values)
    y = _tf_separable(x, values[:size], values[size], values[size + 1],
                      values[size + 2], min_pos)
    loss = tf.reduce_sum(y * cotangent)
  grads = tape.gradient(loss, [x] + values)
  np.testing.assert_allclose(got["y"], y.numpy(), rtol=1e-5, atol=1e-5)
  for name, want in zip(["x"] + names, grads):
    np.testing.assert_allclose(got["d_" + name], want.numpy(), rtol=1e-4,
                               atol=1e-4, err_msg=name)
  # Variance-scaling initialisation: depthwise stddev sqrt(1 / size).
  depthwise = np.stack([got[n] for n in names[:size]])
  assert 0.2 / np.sqrt(size) < depthwise.std() < 2.0 / np.sqrt(size)


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_separable_conv1d_with_kernel_depth_weights(mode):
  weights = [_rand([4], 22 + k) for k in range(3)]

  def build(mesh):
    x = mtf_testing.import_array(mesh, XS, [BATCH, LENGTH, C])
    w = [mtf_testing.import_array(mesh, v, [C]) for v in weights]
    y = mtf.layers.separable_conv1d(x, OUT, -1, 1, use_bias=False,
                                    kernel_depth_weights=w, name="sep")
    return {"y": y}, mtf.reduce_sum(y), {"w0": w[0]}

  got, graph = mtf_testing.run_program("all:4", "length:all", mode, build)
  assert [v.name for v in graph.trainable_variables] == [
      "sep/pointwise_dense/kernel"]
  pointwise = tf.constant(got["sep/pointwise_dense/kernel"], tf.float64)
  w = [tf.constant(v, tf.float64) for v in weights]
  with tf.GradientTape() as tape:
    tape.watch(w[0])
    y = _tf_separable(tf.constant(XS, tf.float64), w, None, pointwise, None,
                      -1)
    loss = tf.reduce_sum(y)
  np.testing.assert_allclose(got["y"], y.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["d_w0"], tape.gradient(loss, w[0]).numpy(),
                             rtol=1e-4, atol=1e-4)
