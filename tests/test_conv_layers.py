"""Tests of mesh_tensorflow.layers.conv_layers against Keras and plain TensorFlow.

Each layer runs on one processor and with the batch (or the spatial blocks)
split over the mesh, eagerly and inside a tf.function. Filters get explicit
initial values so the references can reproduce the math.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing
from mesh_tensorflow.layers import conv_layers

MODES = ("eager", "function")
BATCH = mtf.Dimension("batch", 8)
H = mtf.Dimension("h", 6)
W = mtf.Dimension("w", 6)
CIN = mtf.Dimension("cin", 3)
COUT = mtf.Dimension("cout", 4)

BATCH_LAYOUTS = [("all:1", ""), ("all:8", "batch:all")]


def _params(layouts, modes=MODES):
  return [pytest.param(m, l, mode, id=f"{m}-{l or 'none'}-{mode}")
          for m, l in layouts for mode in modes]


def _rand(shape, seed):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


def _run(mesh_shape, layout, mode, build):
  return mtf_testing.run_program(mesh_shape, layout, mode, build,
                                  fetch_variables=False)


_import = mtf_testing.import_array


def _loss(y, cotangent):
  """sum(y * cotangent), a scalar whose gradient is the cotangent."""
  return mtf.reduce_sum(y * _import(y.mesh, cotangent, y.shape.dims))


def _keras_reference(layer, x_value, cotangent):
  """(y, dx, dkernel) of a bias-free Keras conv layer."""
  x = tf.constant(x_value)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x)
    loss = tf.reduce_sum(y * cotangent)
  dx, dk = tape.gradient(loss, [x, layer.kernel])
  return y.numpy(), dx.numpy(), dk.numpy()


def _assert_close(got, want):
  np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["d_x"], want[1], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got["d_kernel"], want[2], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------- conv2d

X2 = _rand([8, 6, 6, 3], 0)


@pytest.mark.parametrize("filter_size,strides,padding",
                         [((3, 3), (1, 1), "SAME"), ((3, 2), (2, 2), "VALID")])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BATCH_LAYOUTS))
def test_conv2d_matches_keras(mesh_shape, layout, mode, filter_size, strides,
                              padding):
  kernel = _rand(list(filter_size) + [3, 4], 1)
  out_h = 6 // strides[0] if padding == "SAME" else (
      (6 - filter_size[0]) // strides[0] + 1)
  out_w = 6 // strides[1] if padding == "SAME" else (
      (6 - filter_size[1]) // strides[1] + 1)
  cotangent = _rand([8, out_h, out_w, 4], 2)

  def build(mesh):
    x = _import(mesh, X2, [BATCH, H, W, CIN])
    y = conv_layers.conv2d(x, COUT, filter_size=filter_size, strides=strides,
                           padding=padding, filter_initializer=kernel)
    k = mesh.graph.name_to_variable["conv2d/kernel"].outputs[0]
    return {"y": y}, _loss(y, cotangent), {"x": x, "kernel": k}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert [v.name for v in graph.trainable_variables] == ["conv2d/kernel"]
  assert graph.name_to_variable["conv2d/kernel"].shape == mtf.Shape(
      [mtf.Dimension("fh", filter_size[0]),
       mtf.Dimension("fw", filter_size[1]), CIN, COUT])
  keras_conv = tf.keras.layers.Conv2D(
      4, filter_size, strides=strides, padding=padding.lower(),
      use_bias=False, kernel_initializer=tf.keras.initializers.Constant(
          kernel))
  _assert_close(got, _keras_reference(keras_conv, X2, cotangent))


def test_conv2d_default_names_are_unique_and_initializer_is_glorot():
  mid = mtf.Dimension("mid", 4)

  def build(mesh):
    x = _import(mesh, X2, [BATCH, H, W, CIN])
    y = conv_layers.conv2d(x, mid)
    y = conv_layers.conv2d(y, COUT)
    y = conv_layers.conv2d(y, mid, filter_size=(1, 1), name="proj")
    kernel = mesh.graph.name_to_variable["conv2d_1/kernel"].outputs[0]
    return {"y": y, "kernel": kernel}, None, {}

  got, graph = _run("all:1", "", "eager", build)
  assert [v.name for v in graph.trainable_variables] == [
      "conv2d/kernel", "conv2d_1/kernel", "proj/kernel"]
  assert got["y"].shape == (8, 6, 6, 4)
  # Glorot uniform bounds for a [3, 3, 4, 4] filter: sqrt(6 / (36 + 36)).
  bound = np.sqrt(6.0 / (36 + 36))
  assert np.all(np.abs(got["kernel"]) <= bound)
  assert got["kernel"].std() > bound / 4


def test_conv2d_rejects_bad_filter_size():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _import(mesh, X2, [BATCH, H, W, CIN])
  with pytest.raises(mtf.ShapeError, match="filter_size"):
    conv_layers.conv2d(x, COUT, filter_size=(3,))


# ----------------------------------------------------------------- conv1d

LENGTH = mtf.Dimension("length", 8)
X1 = _rand([8, 8, 3], 3)


def test_conv1d_without_batch_dimensions_matches_keras():
  """As the original's layers_test.testConv1d: [length, channels] only."""

  def build(mesh):
    x = _import(mesh, X1[0], [LENGTH, CIN])
    y = conv_layers.conv1d(x, COUT, filter_size=3)
    kernel = mesh.graph.trainable_variables[0].outputs[0]
    return {"y": y, "kernel": kernel}, None, {}

  got, _ = _run("all:1", "", "eager", build)
  want = tf.nn.conv1d(X1[0][None], got["kernel"][0], 1, "SAME")[0]
  np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride,padding", [(1, "SAME"), (2, "VALID")])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BATCH_LAYOUTS))
def test_conv1d_matches_keras(mesh_shape, layout, mode, stride, padding):
  kernel = _rand([3, 3, 4], 4)
  out_len = 8 // stride if padding == "SAME" else (8 - 3) // stride + 1
  cotangent = _rand([8, out_len, 4], 5)

  def build(mesh):
    x = _import(mesh, X1, [BATCH, LENGTH, CIN])
    y = conv_layers.conv1d(x, COUT, filter_size=3, stride=stride,
                           padding=padding,
                           filter_initializer=kernel.reshape([1, 3, 3, 4]),
                           name="c1")
    k = mesh.graph.name_to_variable["c1/kernel"].outputs[0]
    return {"y": y}, _loss(y, cotangent), {"x": x, "kernel": k}

  got, graph = _run(mesh_shape, layout, mode, build)
  y_shape = got["y"].shape
  assert y_shape == (8, out_len, 4)
  assert graph.name_to_variable["c1/kernel"].shape.to_integer_list == [
      1, 3, 3, 4]
  got["d_kernel"] = got["d_kernel"].reshape([3, 3, 4])
  keras_conv = tf.keras.layers.Conv1D(
      4, 3, strides=stride, padding=padding.lower(), use_bias=False,
      kernel_initializer=tf.keras.initializers.Constant(kernel))
  _assert_close(got, _keras_reference(keras_conv, X1, cotangent))


# ----------------------------------------------------- conv2d_with_blocks

H_BLOCKS = mtf.Dimension("h_blocks", 4)
W_BLOCKS = mtf.Dimension("w_blocks", 2)
BH = mtf.Dimension("bh", 3)
BW = mtf.Dimension("bw", 4)
SMALL_BATCH = mtf.Dimension("batch", 2)
XB = _rand([2, 12, 8, 3], 6)  # A 12 x 8 image cut into 4 x 2 blocks.


def _to_blocks(image):
  """[b, 12, 8, c] -> [b, 4, 2, 3, 4, c]."""
  b, _, _, c = image.shape
  return image.reshape([b, 4, 3, 2, 4, c]).transpose([0, 1, 3, 2, 4, 5])


def _from_blocks(blocks):
  b = blocks.shape[0]
  c = blocks.shape[-1]
  return blocks.transpose([0, 1, 3, 2, 4, 5]).reshape([b, 12, 8, c])


@pytest.mark.parametrize(
    "mesh_shape,layout,mode",
    _params([("all:1", ""), ("rows:4;cols:2", "h_blocks:rows;w_blocks:cols")]))
def test_conv2d_with_blocks_matches_whole_image_conv(mesh_shape, layout,
                                                     mode):
  kernel = _rand([3, 3, 3, 4], 7)
  cotangent = _rand([2, 12, 8, 4], 8)

  def build(mesh):
    x = _import(mesh, _to_blocks(XB),
                [SMALL_BATCH, H_BLOCKS, W_BLOCKS, BH, BW, CIN])
    y = conv_layers.conv2d_with_blocks(
        x, COUT, (3, 3), (1, 1), "SAME", h_blocks_dim=H_BLOCKS,
        w_blocks_dim=W_BLOCKS, filter_initializer=kernel)
    k = mesh.graph.name_to_variable["conv2d/kernel"].outputs[0]
    return {"y": y}, _loss(y, _to_blocks(cotangent)), {"x": x, "kernel": k}

  got, _ = _run(mesh_shape, layout, mode, build)
  got["y"] = _from_blocks(got["y"])
  got["d_x"] = _from_blocks(got["d_x"])
  keras_conv = tf.keras.layers.Conv2D(
      4, 3, padding="same", use_bias=False,
      kernel_initializer=tf.keras.initializers.Constant(kernel))
  _assert_close(got, _keras_reference(keras_conv, XB, cotangent))


# ---------------------------------------------------------------- pooling

D = mtf.Dimension("d", 4)


@pytest.mark.parametrize("pool,tf_pool,ndims", [
    (conv_layers.max_pool2d, tf.nn.max_pool2d, 2),
    (conv_layers.avg_pool2d, tf.nn.avg_pool2d, 2),
    (conv_layers.max_pool3d, tf.nn.max_pool3d, 3),
    (conv_layers.avg_pool3d, tf.nn.avg_pool3d, 3)])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BATCH_LAYOUTS))
def test_pooling_matches_tf(mesh_shape, layout, mode, pool, tf_pool, ndims):
  spatial = [H, W] if ndims == 2 else [D, H, W]
  x_value = _rand([8] + [d.size for d in spatial] + [3], 9)
  ksize = [2] * ndims
  cotangent = _rand([8] + [d.size // 2 for d in spatial] + [3], 10)

  def build(mesh):
    x = _import(mesh, x_value, [BATCH] + spatial + [CIN])
    y = pool(x, ksize=ksize)
    return {"y": y}, _loss(y, cotangent), {"x": x}

  got, _ = _run(mesh_shape, layout, mode, build)
  x = tf.constant(x_value)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf_pool(x, ksize, ksize, "VALID")
    loss = tf.reduce_sum(y * cotangent)
  np.testing.assert_allclose(got["y"], y.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["d_x"], tape.gradient(loss, x).numpy(),
                             rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------- batch_norm

XN = _rand([8, 6, 6, 3], 11) * 3.0 + 0.5


def _tf_batch_norm(x):
  mean = tf.reduce_mean(x, axis=[0, 1, 2])
  variance = tf.reduce_mean(tf.square(x - mean), axis=[0, 1, 2])
  return (x - mean) * tf.math.rsqrt(variance + 1e-9), mean, variance


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BATCH_LAYOUTS))
def test_batch_norm_training_matches_tf(mesh_shape, layout, mode):
  cotangent = _rand([8, 6, 6, 3], 12)

  def build(mesh):
    x = _import(mesh, XN, [BATCH, H, W, CIN])
    y, updates = conv_layers.batch_norm(x, True, 0.9)
    assert [u.name for u in updates] == [
        "batch_norm/bn_mean_update", "batch_norm/bn_var_update"]
    variables = mesh.graph.name_to_variable
    return {"y": y}, _loss(y, cotangent), {
        "x": x,
        "scale": variables["batch_norm/batch_norm_scale"].outputs[0],
        "bias": variables["batch_norm/batch_norm_bias"].outputs[0]}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert [v.name for v in graph.trainable_variables] == [
      "batch_norm/batch_norm_scale", "batch_norm/batch_norm_bias"]
  assert sorted(v.name for v in graph.all_variables) == sorted([
      "batch_norm/batch_norm_scale", "batch_norm/batch_norm_bias",
      "batch_norm/bn_moving_mean", "batch_norm/bn_moving_variance"])
  x = tf.constant(XN)
  scale = tf.ones([3])
  bias = tf.zeros([3])
  with tf.GradientTape() as tape:
    tape.watch([x, scale, bias])
    y = _tf_batch_norm(x)[0] * scale + bias
    loss = tf.reduce_sum(y * cotangent)
  dx, dscale, dbias = tape.gradient(loss, [x, scale, bias])
  np.testing.assert_allclose(got["y"], y.numpy(), rtol=1e-5, atol=1e-5)
  for name, want in [("d_x", dx), ("d_scale", dscale), ("d_bias", dbias)]:
    np.testing.assert_allclose(got[name], want.numpy(), rtol=1e-4, atol=1e-4,
                               err_msg=name)


@pytest.mark.parametrize("mesh_shape,layout", BATCH_LAYOUTS)
def test_batch_norm_updates_moving_statistics(mesh_shape, layout):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _import(mesh, XN, [BATCH, H, W, CIN])
  conv_layers.batch_norm(x, True, 0.9, name="bn")
  # Eagerly, lowering runs the Assign operations.
  lowering = mtf.Lowering(graph, {mesh: impl})
  _, mean, variance = _tf_batch_norm(tf.constant(XN))
  for var_name, want in [("bn/bn_moving_mean", 0.1 * mean.numpy()),
                         ("bn/bn_moving_variance",
                          0.9 + 0.1 * variance.numpy())]:
    slices = lowering.variables[
        graph.name_to_variable[var_name]].slice_variables
    for s in slices:
      np.testing.assert_allclose(s.numpy(), want, rtol=1e-5, atol=1e-5,
                                 err_msg=var_name)


def test_batch_norm_inference_uses_moving_statistics():
  def build(mesh):
    x = _import(mesh, XN, [BATCH, H, W, CIN])
    y, updates = conv_layers.batch_norm(x, False, 0.9, epsilon=1e-3,
                                        init_zero=True)
    y2, _ = conv_layers.batch_norm(x, False, 0.9, epsilon=1e-3)
    assert not updates
    return {"y": y, "y2": y2}, None, {}

  got, graph = _run("all:8", "batch:all", "function", build)
  assert "batch_norm_1/batch_norm_scale" in graph.name_to_variable
  np.testing.assert_allclose(got["y"], np.zeros_like(XN))
  np.testing.assert_allclose(got["y2"], XN / np.sqrt(1.0 + 1e-3), rtol=1e-5,
                             atol=1e-5)


def test_batch_norm_rejects_empty_dims():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _import(mesh, XN, [BATCH, H, W, CIN])
  with pytest.raises(mtf.ShapeError, match="no dimension"):
    conv_layers.batch_norm(x, True, 0.9, dims_idx_start=3)


# ------------------------------------------------- jitter and grad clipping


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BATCH_LAYOUTS))
def test_multiplicative_jitter(mesh_shape, layout, mode):
  def build(mesh):
    x = _import(mesh, XN, [BATCH, H, W, CIN])
    y = conv_layers.multiplicative_jitter(x, epsilon=0.1)
    assert conv_layers.multiplicative_jitter(x, epsilon=0) is x
    return {"y": y}, None, {}

  got, _ = _run(mesh_shape, layout, mode, build)
  ratio = got["y"] / XN
  assert np.all(ratio >= 0.9 - 1e-6) and np.all(ratio <= 1.1 + 1e-6)
  assert ratio.std() > 0.03


@pytest.mark.parametrize("clip", [0.1, 100.0])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(BATCH_LAYOUTS))
def test_clip_activation_gradient(mesh_shape, layout, mode, clip):
  cotangent = _rand([8, 6, 6, 3], 13)

  def build(mesh):
    x = _import(mesh, XN, [BATCH, H, W, CIN])
    y = conv_layers.clip_activation_gradient(x * 2.0, clip)
    assert conv_layers.clip_activation_gradient(x) is x
    return {"y": y}, _loss(y, cotangent), {"x": x}

  got, _ = _run(mesh_shape, layout, mode, build)
  np.testing.assert_allclose(got["y"], XN * 2.0, rtol=1e-6)
  rms = np.sqrt(np.mean(np.square(cotangent)))
  want = 2.0 * cotangent / max(1.0, rms / clip)
  np.testing.assert_allclose(got["d_x"], want, rtol=1e-5, atol=1e-5)
