"""Tests of mesh_tensorflow.layers against NumPy and Keras.

Layers are checked on one processor and model-parallel (the hidden or vocab
dimension split over `all:8`, or split together with the batch on a 2-D
mesh), in eager, tf.function and tf.compat.v1 graph mode. Variables get
explicit initial values so the references can reproduce the math.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import layers
from tests import mtf_testing

MODES = mtf_testing.MODES
BATCH = mtf.Dimension("batch", 8)
IO = mtf.Dimension("io", 4)
HIDDEN = mtf.Dimension("hidden", 16)
VOCAB = mtf.Dimension("vocab", 16)

HIDDEN_LAYOUTS = [("all:1", ""), ("all:8", "hidden:all"),
                  ("rows:2;cols:4", "batch:rows;hidden:cols")]
VOCAB_LAYOUTS = [("all:1", ""), ("all:8", "vocab:all"),
                 ("rows:2;cols:4", "batch:rows;vocab:cols")]


def _params(layouts, modes=MODES):
  return mtf_testing.mesh_layout_mode_params(layouts, modes)


def _rand(shape, seed, low=-1.0, high=1.0):
  return np.random.RandomState(seed).uniform(
      low, high, size=shape).astype(np.float32)


def _run(mesh_shape, layout, mode, build):
  return mtf_testing.run_program(mesh_shape, layout, mode, build)


_import = mtf_testing.import_array


def _loss(y, cotangent):
  """sum(y * cotangent), a scalar whose gradient is the cotangent."""
  return mtf.reduce_sum(y * _import(y.mesh, cotangent, y.shape.dims))


# ------------------------------------------------------------------ dense

X = _rand([8, 4], 0)
W = _rand([4, 16], 1)
C_HIDDEN = _rand([8, 16], 2)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(HIDDEN_LAYOUTS))
def test_dense_matches_keras(mesh_shape, layout, mode):
  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    y = layers.dense(x, HIDDEN, reduced_dims=[IO], activation=mtf.tanh,
                     kernel_initializer=W)
    variables = mesh.graph.name_to_variable
    return {"y": y}, _loss(y, C_HIDDEN), {
        "x": x, "kernel": variables["dense/kernel"].outputs[0],
        "bias": variables["dense_1/bias"].outputs[0]}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert [v.name for v in graph.trainable_variables] == [
      "dense/kernel", "dense_1/bias"]
  assert graph.name_to_variable["dense/kernel"].shape == mtf.Shape(
      [IO, HIDDEN])
  assert graph.name_to_variable["dense_1/bias"].shape == mtf.Shape([HIDDEN])

  keras_dense = tf.keras.layers.Dense(
      16, activation="tanh",
      kernel_initializer=tf.keras.initializers.Constant(W))
  x = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = keras_dense(x)
    loss = tf.reduce_sum(y * C_HIDDEN)
  dx, dw, db = tape.gradient(loss, [x, keras_dense.kernel, keras_dense.bias])
  np.testing.assert_allclose(got["y"], y.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["dense/kernel"], W)
  np.testing.assert_allclose(got["dense_1/bias"], np.zeros(16))
  for name, want in [("d_x", dx), ("d_kernel", dw), ("d_bias", db)]:
    np.testing.assert_allclose(got[name], want.numpy(), rtol=1e-4, atol=1e-4,
                               err_msg=name)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["batch", "hidden"]))
def test_dense_with_kernel_weights(mesh_shape, layout, mode):
  def build_fn(mesh, t):
    del mesh
    return {"y": layers.dense(t["x"], HIDDEN, reduced_dims=[IO],
                              use_bias=False, activation=mtf.tanh,
                              kernel_weights=t["w"])}

  mtf_testing.check_op(
      build_fn, lambda x, w: {"y": np.tanh(x @ w)},
      {"x": (_rand([8, 4], 3), ["batch", "io"]),
       "w": (_rand([4, 16], 4), ["io", "hidden"])},
      mesh_shape, layout, mode)


def test_dense_renames_reduced_dim_named_like_new_dim():
  square = _rand([16, 16], 5)
  x_value = _rand([8, 16], 6)

  def build(mesh):
    x = _import(mesh, x_value, [BATCH, HIDDEN])
    y = layers.dense(x, HIDDEN, reduced_dims=[HIDDEN],
                     kernel_initializer=square, name="square")
    return {"y": y}, None, {}

  got, graph = _run("all:8", "hidden:all", "eager", build)
  kernel = graph.name_to_variable["square/kernel"]
  assert kernel.shape == mtf.Shape([mtf.Dimension("_hidden", 16), HIDDEN])
  np.testing.assert_allclose(got["y"], x_value @ square, rtol=1e-5,
                             atol=1e-5)


def test_dense_renames_reduced_dim_named_like_new_dim_of_other_size():
  """A channels dimension widened under its own name (hidden:16 ->
  hidden:32, as the Evolved Transformer's cells do)."""
  wide = mtf.Dimension("hidden", 32)
  kernel_value = _rand([16, 32], 5)
  x_value = _rand([8, 16], 6)

  def build(mesh):
    x = _import(mesh, x_value, [BATCH, HIDDEN])
    y = layers.dense(x, wide, reduced_dims=[HIDDEN], use_bias=False,
                     kernel_initializer=kernel_value, name="widen")
    return {"y": y}, None, {}

  got, graph = _run("all:8", "hidden:all", "eager", build)
  kernel = graph.name_to_variable["widen/kernel"]
  assert kernel.shape == mtf.Shape([mtf.Dimension("_hidden", 16), wide])
  np.testing.assert_allclose(got["y"], x_value @ kernel_value, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows")])
def test_dense_uses_a_substituted_kernel_with_its_own_dim_names(
    mesh_shape, layout, monkeypatch):
  """dense gets its kernel from get_dense_kernel_weights, which the
  original's tests patch with a [hidden:16, hidden:32] kernel."""
  wide = mtf.Dimension("hidden", 32)
  kernel_value = _rand([16, 32], 7)
  x_value = _rand([8, 16], 8)
  calls = []

  def build(mesh):
    kernel = _import(mesh, kernel_value, [HIDDEN, wide])

    def substitute(x, new_dims, reduced_dims, *args, **kwargs):
      calls.append((list(new_dims), list(reduced_dims)))
      return kernel

    monkeypatch.setattr(layers, "get_dense_kernel_weights", substitute)
    x = _import(mesh, x_value, [BATCH, HIDDEN])
    y = layers.dense(x, wide, reduced_dims=[HIDDEN], use_bias=False,
                     name="widen")
    return {"y": y}, None, {}

  got, graph = _run(mesh_shape, layout, "eager", build)
  assert calls == [([wide], [mtf.Dimension("_hidden", 16)])]
  assert "widen/kernel" not in graph.name_to_variable
  np.testing.assert_allclose(got["y"], x_value @ kernel_value, rtol=1e-5,
                             atol=1e-5)


def test_dense_default_reduced_dims_warns(monkeypatch):
  warnings = []
  monkeypatch.setattr(layers.logging, "warning",
                      lambda msg, *args: warnings.append(msg % args))

  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    return {"y": layers.dense(x, HIDDEN, kernel_initializer=W,
                              use_bias=False)}, None, {}

  got, _ = _run("all:1", "", "eager", build)
  assert len(warnings) == 1 and "reduced_dims" in warnings[0]
  np.testing.assert_allclose(got["y"], X @ W, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    [("all:1", ""), ("rows:2;cols:4", "experts:rows;hidden:cols")],
    modes=("eager", "graph")))
def test_dense_expert_dims(mesh_shape, layout, mode):
  experts = mtf.Dimension("experts", 2)
  x_value = _rand([2, 8, 4], 7)
  kernel = _rand([2, 4, 16], 8)

  def build(mesh):
    x = _import(mesh, x_value, [experts, BATCH, IO])
    return {"y": layers.dense(x, [HIDDEN], reduced_dims=[IO],
                              expert_dims=[experts],
                              kernel_initializer=kernel)}, None, {}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert graph.name_to_variable["dense_1/bias"].shape == mtf.Shape(
      [experts, HIDDEN])
  np.testing.assert_allclose(got["y"], np.einsum("ebi,eih->ebh", x_value,
                                                 kernel),
                             rtol=1e-5, atol=1e-5)


def test_dense_bfloat16_activations_float32_variables():
  def build(mesh):
    x = mtf.cast(_import(mesh, X, [BATCH, IO]), tf.bfloat16)
    y = layers.dense(x, HIDDEN, reduced_dims=[IO], kernel_initializer=W)
    assert y.dtype == tf.bfloat16
    return {"y": mtf.cast(y, tf.float32)}, None, {}

  got, graph = _run("all:8", "hidden:all", "eager", build)
  kernel = graph.name_to_variable["dense/kernel"]
  assert kernel.master_dtype == tf.float32
  assert kernel.activation_dtype == tf.bfloat16
  np.testing.assert_allclose(got["y"], X @ W, rtol=0.05, atol=0.05)


def test_get_dense_kernel_weights_shares_a_kernel():
  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    w = layers.get_dense_kernel_weights(x, HIDDEN, [IO], None, W,
                                        name="shared")
    y1 = layers.dense(x, HIDDEN, [IO], use_bias=False, kernel_weights=w,
                      name="first")
    y2 = layers.dense(x, HIDDEN, [IO], use_bias=False, kernel_weights=w,
                      name="second")
    return {"y1": y1, "y2": y2}, None, {}

  got, graph = _run("all:8", "hidden:all", "function", build)
  assert list(graph.name_to_variable) == ["shared/kernel"]
  np.testing.assert_allclose(got["y1"], X @ W, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got["y1"], got["y2"])


@pytest.mark.parametrize("mode", MODES)
def test_default_scope_names_are_unique_per_graph(mode):
  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    h = layers.dense(x, HIDDEN, reduced_dims=[IO])
    y = layers.dense(h, IO, reduced_dims=[HIDDEN])
    with tf.compat.v1.variable_scope("outer"):
      y = layers.dense(y, IO, reduced_dims=[IO])
    return {"y": y}, None, {}

  for _ in range(2):  # The same names in a second graph.
    _, graph = _run("all:1", "", mode, build)
    # The original's names: an unnamed dense opens one default scope for
    # its kernel and another for its bias.
    assert sorted(graph.name_to_variable) == [
        "dense/kernel", "dense_1/bias", "dense_2/kernel", "dense_3/bias",
        "outer/dense/kernel", "outer/dense_1/bias"]


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    HIDDEN_LAYOUTS, modes=("eager", "function")))
def test_dense_product_glu(mesh_shape, layout, mode):
  w1, w2 = W, _rand([4, 16], 9)
  inits = iter([w1, w2])

  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    y = layers.dense_product(
        x, [IO], [HIDDEN], activation_functions=["linear", "sigmoid"],
        use_bias=False, kernel_initializer=lambda shape, dtype: next(inits))
    return {"y": y}, _loss(y, C_HIDDEN), {"x": x}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert sorted(graph.name_to_variable) == [
      "dense_product_0/kernel", "dense_product_1/kernel"]
  a, b = X @ w1, X @ w2
  sig = 1.0 / (1.0 + np.exp(-b))
  np.testing.assert_allclose(got["y"], a * sig, rtol=1e-5, atol=1e-5)
  d_x = (C_HIDDEN * sig) @ w1.T + (C_HIDDEN * a * sig * (1 - sig)) @ w2.T
  np.testing.assert_allclose(got["d_x"], d_x, rtol=1e-4, atol=1e-4)


def test_dense_product_single_named_activation():
  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    return {"y": layers.dense_product(x, [IO], [HIDDEN], "relu",
                                      use_bias=False,
                                      kernel_initializer=W)}, None, {}

  got, graph = _run("all:8", "hidden:all", "eager", build)
  assert sorted(graph.name_to_variable) == ["dense_product/kernel"]
  np.testing.assert_allclose(got["y"], np.maximum(X @ W, 0), rtol=1e-5,
                             atol=1e-5)


# ------------------------------------------------------------ initializer

@pytest.mark.parametrize("mode,distribution", [
    ("fan_in", "normal"), ("fan_out", "uniform"), ("fan_avg", "normal")])
def test_variance_scaling_initializer(mode, distribution):
  a, b, c = (mtf.Dimension("a", 8), mtf.Dimension("b", 32),
             mtf.Dimension("c", 64))
  init = layers.VarianceScalingInitializer(2.0, mode, distribution)
  fan = {"fan_in": 8 * 32, "fan_out": 64, "fan_avg": (8 * 32 + 64) / 2}[mode]
  stddev = np.sqrt(2.0 / fan)
  # Fans come from the dimensions, not from their order in the kernel.
  assert init.stddev([a, b], [c]) == init.stddev([b, a], [c])
  assert np.isclose(init.stddev([a, b], [c]), stddev)
  fn = init([a, b], [c])
  value = np.asarray(fn([64, 8, 32], tf.float32))
  np.testing.assert_array_equal(value, np.asarray(fn([64, 8, 32])))
  if distribution == "normal":
    # A normal truncated at 2 stddev has standard deviation 0.8796 stddev.
    assert np.abs(value).max() <= 2 * stddev + 1e-6
    assert np.isclose(value.std(), 0.8796 * stddev, rtol=0.05)
  else:
    limit = stddev * np.sqrt(3)
    assert np.abs(value).max() <= limit and value.max() > 0.9 * limit
    assert np.isclose(value.std(), stddev, rtol=0.05)


def test_variance_scaling_initializer_errors():
  with pytest.raises(ValueError, match="mode"):
    layers.VarianceScalingInitializer(mode="fan_sideways")
  with pytest.raises(ValueError, match="distribution"):
    layers.VarianceScalingInitializer(distribution="cauchy")


def test_dense_default_kernel_is_variance_scaled():
  big = mtf.Dimension("big", 256)

  def build(mesh):
    x = _import(mesh, np.ones([8, 256], np.float32), [BATCH, big])
    return {"y": layers.dense(x, HIDDEN, reduced_dims=[big])}, None, {}

  got, _ = _run("all:1", "", "eager", build)
  assert np.isclose(got["dense/kernel"].std(), 0.8796 / 16, rtol=0.1)


# --------------------------------------------------- unit-scaling convention


@pytest.fixture(name="unit_scaling")
def fixture_unit_scaling(monkeypatch):
  """Turns the convention on as a gin binding would: by replacing the
  module's `unit_scaling_convention`."""
  monkeypatch.setattr(layers, "unit_scaling_convention",
                      lambda value=True: value)


def test_unit_scaling_convention_is_off_by_default():
  assert layers.unit_scaling_convention() is False
  assert layers.unit_scaling_convention(True) is True
  assert mtf.layers.unit_scaling_convention is layers.unit_scaling_convention


A2 = _rand([8, 4, 16], 40)
B2 = _rand([4, 16, 2], 41)


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(
    [("all:1", ""), ("all:8", "hidden:all"),
     ("rows:2;cols:4", "batch:rows;io:cols")], modes=("eager", "function")))
def test_us_einsum(mesh_shape, layout, mode, scaled, request):
  if scaled:
    request.getfixturevalue("unit_scaling")

  def build_fn(mesh, t):
    del mesh
    out = mtf.Shape([BATCH, mtf.Dimension("o", 2)])
    return {"y": layers.us_einsum([t["a"], t["b"]], out),
            # Keyword arguments go to mtf.einsum too.
            "z": layers.us_einsum([t["a"], t["b"]], reduced_dims=[HIDDEN])}

  def np_fn(a, b):
    # Contracted: io (4) and hidden (16) for y; hidden for z.
    y = np.einsum("bih,iho->bo", a, b)
    z = np.einsum("bih,iho->bio", a, b)
    if scaled:
      y, z = y / np.sqrt(64.0), z / np.sqrt(16.0)
    return {"y": y, "z": z}

  mtf_testing.check_op(build_fn, np_fn,
                       {"a": (A2, ["batch", "io", "hidden"]),
                        "b": (B2, ["io", "hidden", "o"])},
                       mesh_shape, layout, mode)


def test_dense_under_unit_scaling(unit_scaling):
  del unit_scaling
  big = mtf.Dimension("big", 256)
  ones = np.ones([8, 256], np.float32)

  def build(mesh):
    x = _import(mesh, ones, [BATCH, big])
    return {"y": layers.dense(x, HIDDEN, reduced_dims=[big])}, None, {}

  got, _ = _run("all:8", "hidden:all", "eager", build)
  kernel = got["dense/kernel"]
  # Unit-variance weights (a normal truncated at 2 standard deviations);
  # the output is divided by sqrt(256).
  assert np.isclose(kernel.std(), 0.8796, rtol=0.1)
  np.testing.assert_allclose(got["y"], ones @ kernel / 16.0, rtol=1e-5,
                             atol=1e-5)


def test_variance_scaling_under_unit_scaling(unit_scaling):
  del unit_scaling
  a, b = mtf.Dimension("a", 8), mtf.Dimension("b", 32)
  assert layers.VarianceScalingInitializer(2.0).stddev([a], [b]) == 2.0 ** 0.5
  for mode in ("fan_out", "fan_avg"):
    with pytest.raises(ValueError, match="fan_in"):
      layers.VarianceScalingInitializer(mode=mode).stddev([a], [b])


# ------------------------------------------------------------- layer norm

LN_X = _rand([8, 16], 10, -2.0, 3.0)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(HIDDEN_LAYOUTS))
def test_layer_norm_matches_keras(mesh_shape, layout, mode):
  def build(mesh):
    x = _import(mesh, LN_X, [BATCH, HIDDEN])
    y = layers.layer_norm(x, HIDDEN)
    variables = mesh.graph.name_to_variable
    prefix = "layer_prepostprocess/layer_norm/"
    return {"y": y}, _loss(y, C_HIDDEN), {
        "x": x, "scale": variables[prefix + "layer_norm_scale"].outputs[0],
        "bias": variables[prefix + "layer_norm_bias"].outputs[0]}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert [v.name for v in graph.trainable_variables] == [
      "layer_prepostprocess/layer_norm/layer_norm_scale",
      "layer_prepostprocess/layer_norm/layer_norm_bias"]
  keras_norm = tf.keras.layers.LayerNormalization(epsilon=1e-6)
  x = tf.constant(LN_X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = keras_norm(x)
    loss = tf.reduce_sum(y * C_HIDDEN)
  dx, dscale, dbias = tape.gradient(loss, [x, keras_norm.gamma,
                                           keras_norm.beta])
  np.testing.assert_allclose(got["y"], y.numpy(), rtol=1e-5, atol=1e-5)
  for name, want in [("d_x", dx), ("d_scale", dscale), ("d_bias", dbias)]:
    np.testing.assert_allclose(got[name], want.numpy(), rtol=1e-4, atol=1e-4,
                               err_msg=name)


# -------------------------------------------------------------- embedding

EMB = _rand([16, 4], 11)
IDS = np.random.RandomState(12).randint(0, 16, size=[8]).astype(np.int32)


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(VOCAB_LAYOUTS))
def test_embedding(mesh_shape, layout, mode):
  c = _rand([8, 4], 13)

  def build(mesh):
    ids = _import(mesh, IDS, [BATCH])
    weights = layers.embedding_weights(mesh, VOCAB, IO, tf.float32,
                                       initializer=EMB)
    y = mtf.gather(weights, ids, VOCAB)
    return {"y": y}, _loss(y, c), {"weights": weights}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert list(graph.name_to_variable) == ["embedding"]
  np.testing.assert_allclose(got["y"], EMB[IDS])
  want = np.zeros_like(EMB)
  np.add.at(want, IDS, c)
  np.testing.assert_allclose(got["d_weights"], want, rtol=1e-5, atol=1e-5)


def test_embedding_defaults_and_ensemble():
  ensemble = mtf.Dimension("ensemble", 2)
  big = mtf.Dimension("big", 64)

  def build(mesh):
    ids = _import(mesh, IDS, [BATCH])
    y = layers.embedding(ids, VOCAB, big, tf.float32, name="emb")
    ens = layers.embedding_weights(mesh, VOCAB, IO, tf.float32,
                                   name="ens", ensemble_dim=ensemble)
    return {"y": y, "ens": ens}, None, {}

  got, graph = _run("all:8", "vocab:all", "eager", build)
  assert graph.name_to_variable["ens"].shape == mtf.Shape(
      [ensemble, VOCAB, IO])
  table = got["emb"]
  np.testing.assert_array_equal(got["y"], table[IDS])
  assert abs(table.std() - 1.0) < 0.1 and abs(table.mean()) < 0.1


# ----------------------------------------------------------------- losses

LOGITS = _rand([8, 16], 14, -3.0, 3.0)
HARD = np.random.RandomState(15).randint(0, 16, size=[8]).astype(np.int32)
SOFT = np.random.RandomState(16).dirichlet(np.ones(16), size=8).astype(
    np.float32)


def _np_softmax_xent(logits, targets, z_loss):
  log_z = np.log(np.sum(np.exp(logits), axis=-1))
  loss = -np.sum((logits - log_z[:, None]) * targets, axis=-1)
  return loss + z_loss * log_z ** 2


@pytest.mark.parametrize("targets", ["hard", "soft"])
@pytest.mark.parametrize("z_loss", [0.0, 0.1])
@pytest.mark.parametrize("mesh_shape,layout,mode", _params(VOCAB_LAYOUTS))
def test_softmax_cross_entropy(mesh_shape, layout, mode, z_loss, targets):
  if targets == "hard":
    inputs = {"logits": (LOGITS, ["batch", "vocab"]),
              "targets": (HARD, ["batch"])}
  else:
    inputs = {"logits": (LOGITS, ["batch", "vocab"]),
              "targets": (SOFT, ["batch", "vocab"])}

  def np_fn(logits, targets):
    if targets.dtype.kind == "i":
      targets = np.eye(16)[targets]
    return {"loss": _np_softmax_xent(logits, targets, z_loss)}

  mtf_testing.check_op(
      lambda mesh, t: {"loss": layers.softmax_cross_entropy_with_logits(
          t["logits"], t["targets"], VOCAB, z_loss=z_loss)},
      np_fn, inputs, mesh_shape, layout, mode)


def test_softmax_cross_entropy_shape_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  logits = mtf.zeros(mesh, [BATCH, VOCAB])
  with pytest.raises(mtf.ShapeError, match="hard targets"):
    layers.softmax_cross_entropy_with_logits(
        logits, mtf.zeros(mesh, [BATCH, IO], dtype=tf.int32), VOCAB)
  with pytest.raises(mtf.ShapeError, match="soft targets"):
    layers.softmax_cross_entropy_with_logits(
        logits, mtf.zeros(mesh, [BATCH]), VOCAB)
  with pytest.raises(mtf.ShapeError, match="vocab_dim"):
    layers.softmax_cross_entropy_with_logits(
        logits, mtf.zeros(mesh, [BATCH]), IO)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["batch", "vocab"]))
def test_sigmoid_cross_entropy_and_weights_nonzero(mesh_shape, layout, mode):
  labels = (np.random.RandomState(17).rand(8, 16) > 0.5).astype(np.float32)
  ids = np.random.RandomState(18).randint(0, 3, size=[8, 16]).astype(
      np.int32)

  def np_fn(logits, labels, ids):
    x = logits.astype(np.float64)
    loss = np.maximum(x, 0) - x * labels + np.log1p(np.exp(-np.abs(x)))
    return {"loss": loss, "weights": (ids != 0).astype(np.float32)}

  mtf_testing.check_op(
      lambda mesh, t: {
          "loss": layers.sigmoid_cross_entropy_with_logits(t["logits"],
                                                           t["labels"]),
          "weights": layers.weights_nonzero(t["ids"])},
      np_fn,
      {"logits": (LOGITS, ["batch", "vocab"]),
       "labels": (labels, ["batch", "vocab"]),
       "ids": (ids, ["batch", "vocab"])},
      mesh_shape, layout, mode, grad_wrt=["logits"])


# -------------------------------------------------------- dense_relu_dense

@pytest.mark.parametrize("mesh_shape,layout,mode", _params(HIDDEN_LAYOUTS))
def test_dense_relu_dense(mesh_shape, layout, mode):
  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    y = layers.dense_relu_dense(x, HIDDEN, dropout=0.5)  # Not training.
    return {"y": y}, None, {}

  got, graph = _run(mesh_shape, layout, mode, build)
  assert [v.name for v in graph.trainable_variables] == [
      "dense_relu_dense/wi/kernel", "dense_relu_dense/wo/kernel"]
  wi, wo = got["dense_relu_dense/wi/kernel"], got["dense_relu_dense/wo/kernel"]
  assert wi.shape == (4, 16) and wo.shape == (16, 4)
  np.testing.assert_allclose(got["y"], np.maximum(X @ wi, 0) @ wo,
                             rtol=1e-5, atol=1e-5)


def test_dense_relu_dense_dropout_broadcast():
  length = mtf.Dimension("length", 8)
  x_value = np.tile(X[:, None, :], [1, 8, 1])

  def build(mesh):
    x = _import(mesh, x_value, [BATCH, length, IO])
    y = layers.dense_relu_dense(x, HIDDEN, is_training=True, dropout=0.5,
                                dropout_broadcast_dims=[length], name="ffn")
    return {"y": y}, None, {}

  got, _ = _run("all:8", "hidden:all", "eager", build)
  y = got["y"]
  # The mask is shared along `length`, whose positions all hold the same x.
  np.testing.assert_allclose(y, np.broadcast_to(y[:, :1], y.shape),
                             rtol=1e-6, atol=1e-6)
  full = np.maximum(X @ got["ffn/wi/kernel"], 0) @ got["ffn/wo/kernel"]
  assert not np.allclose(y[:, 0], full)


def test_default_initial_values_do_not_depend_on_layout():
  def build(mesh):
    x = _import(mesh, X, [BATCH, IO])
    ids = _import(mesh, IDS, [BATCH])
    return {"y": layers.dense_relu_dense(x, HIDDEN),
            "e": layers.embedding(ids, VOCAB, IO, tf.float32)}, None, {}

  one, _ = _run("all:1", "", "eager", build)
  split, _ = _run("rows:2;cols:4", "batch:rows;hidden:cols;vocab:cols",
                  "eager", build)
  for name in ["embedding", "e", "dense_relu_dense/wi/kernel",
               "dense_relu_dense/wo/kernel"]:
    np.testing.assert_array_equal(one[name], split[name])
  hidden = np.maximum(X @ split["dense_relu_dense/wi/kernel"], 0)
  np.testing.assert_allclose(
      split["y"], hidden @ split["dense_relu_dense/wo/kernel"],
      rtol=1e-5, atol=1e-5)
