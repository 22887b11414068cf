"""Convolutional Transformer layers: NumPy, layouts, incremental decoding."""

import collections

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing
from tests.transformer import tiny_layers

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 8)
D_MODEL = 16
_RNG = np.random.RandomState(0)
X = _RNG.normal(size=[8, 8, D_MODEL]).astype(np.float32)
INPUTS = _RNG.randint(1, 20, size=[8, 8]).astype(np.int32)
INPUTS[1, 6:] = 0  # One padded example.
LOSS_WEIGHTS = _RNG.normal(size=[8, 8, D_MODEL]).astype(np.float32)

# Causal filters (offsets -2..0), so that decoding can match a full pass.
_LAYERS = {
    "separable": lambda: transformer_layers.SeparableConv1DLayer(
        -2, 0, D_MODEL, activation="relu"),
    "lightweight": lambda: transformer_layers.LightweightConv1DLocalAttn(
        -2, 0, D_MODEL, num_unique_depth_filters=2),
    "dynamic": lambda: transformer_layers.DynamicConv1DLocalAttn(
        -2, 0, D_MODEL),
    "block_lightweight": lambda: transformer_layers.LocalConvAttnBlock(
        -2, 0, D_MODEL),
    "block_dynamic": lambda: transformer_layers.LocalConvAttnBlock(
        -2, 0, D_MODEL, attention_type="dynamic_conv",
        num_unique_depth_filters=4),
}


def _context(mesh, mode="eval", inputs=INPUTS, **kwargs):
  model = layer_testing.ModelStub(D_MODEL)
  return layer_testing.make_context(
      mesh, model, BATCH, LENGTH, mode=mode,
      inputs=mtf_testing.import_array(mesh, inputs, [BATCH, LENGTH]),
      new_states=[], **kwargs)


def _x(mesh):
  return mtf_testing.import_array(
      mesh, X, [BATCH, LENGTH, mtf.Dimension("d_model", D_MODEL)])


def _builder(make_layer):
  def build(mesh):
    x = _x(mesh)
    y = make_layer().call(_context(mesh), x)
    w = mtf_testing.import_array(
        mesh, LOSS_WEIGHTS[..., :y.shape[-1].size], y.shape.dims)
    return {"y": y}, mtf.reduce_sum(y * w), {"x": x}
  return build


def _masked_x():
  return X * (INPUTS != 0)[:, :, None]


def test_conv1d_layer_matches_numpy():
  got, graph = mtf_testing.run_program(
      "all:1", "", "function",
      _builder(lambda: transformer_layers.Conv1DLayer(3, 12, "relu")))
  assert [v.name for v in graph.trainable_variables] == ["conv2d/kernel"]
  kernel = got["conv2d/kernel"]
  assert kernel.shape == (1, 3, D_MODEL, 12)
  padded = np.pad(_masked_x(), [(0, 0), (1, 1), (0, 0)])
  want = sum(padded[:, j:j + 8] @ kernel[0, j] for j in range(3))
  np.testing.assert_allclose(got["y"], np.maximum(want, 0), rtol=1e-4,
                             atol=1e-5)


def test_conv1d_layer_takes_a_context_without_variable_dtype():
  """As the original: only inputs, activation_dtype and mode are read
  outside incremental decoding; the kernel is then float32."""
  context_cls = collections.namedtuple(
      "Context", ["inputs", "activation_dtype", "mode"])

  def build(mesh):
    context = context_cls(
        inputs=mtf_testing.import_array(mesh, INPUTS, [BATCH, LENGTH]),
        activation_dtype=tf.float32, mode="train")
    y = transformer_layers.Conv1DLayer(3, 12).call(context, _x(mesh))
    return {"y": y}, None, {}

  got, graph = mtf_testing.run_program("all:1", "", "function", build)
  (kernel,) = graph.trainable_variables
  assert kernel.master_dtype == tf.float32
  padded = np.pad(_masked_x(), [(0, 0), (1, 1), (0, 0)])
  k = got["conv2d/kernel"]
  want = sum(padded[:, j:j + 8] @ k[0, j] for j in range(3))
  np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


def test_conv1d_layer_calls_a_replaced_glorot_initializer(monkeypatch):
  """As the original, the layer asks tf.compat.v1.glorot_uniform_initializer
  for its kernel's initializer when called: a program (or test) that
  replaced that name gets its own initial kernel."""
  kernel = _RNG.normal(size=[1, 3, D_MODEL, 4]).astype(np.float32)
  calls = []

  def fixed_kernel_initializer():
    calls.append(1)
    return lambda shape, dtype=tf.float32, **unused: tf.constant(kernel)

  def build(mesh):
    with monkeypatch.context() as patch:
      patch.setattr(tf.compat.v1, "glorot_uniform_initializer",
                    fixed_kernel_initializer)
      y = transformer_layers.Conv1DLayer(3, 4).call(_context(mesh), _x(mesh))
    return {"y": y}, None, {}

  got, _ = mtf_testing.run_program("all:1", "", "function", build)
  assert calls
  np.testing.assert_array_equal(got["conv2d/kernel"], kernel)
  padded = np.pad(_masked_x(), [(0, 0), (1, 1), (0, 0)])
  want = sum(padded[:, j:j + 8] @ kernel[0, j] for j in range(3))
  np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


def test_separable_conv1d_layer_matches_numpy():
  got, graph = mtf_testing.run_program(
      "all:1", "", "function", _builder(_LAYERS["separable"]))
  prefix = "separable_conv1d/"
  assert sorted(v.name for v in graph.trainable_variables) == [
      prefix + n for n in [
          "depthwise_conv_hack/depthwise_dense_0/bias",
          "depthwise_conv_hack/depthwise_dense_0/kernel",
          "depthwise_conv_hack/depthwise_dense_1/kernel",
          "depthwise_conv_hack/depthwise_dense_2/kernel",
          "pointwise_dense/bias", "pointwise_dense/kernel"]]
  x = np.pad(_masked_x(), [(0, 0), (2, 0), (0, 0)])
  hack = prefix + "depthwise_conv_hack/depthwise_dense_"
  depthwise = got[hack + "0/bias"] + sum(
      x[:, k:k + 8] * got[f"{hack}{k}/kernel"] for k in range(3))
  want = (depthwise @ got[prefix + "pointwise_dense/kernel"] +
          got[prefix + "pointwise_dense/bias"])
  np.testing.assert_allclose(got["y"], np.maximum(want, 0), rtol=1e-4,
                             atol=1e-5)


def test_lightweight_weights_are_softmaxed_and_repeated():
  got, _ = mtf_testing.run_program(
      "all:1", "", "function", _builder(_LAYERS["lightweight"]))
  raw = np.stack([got[f"lightwt_depthwise_dense_{k}/kernel"]
                  for k in range(3)])  # [3, d_model / 2]
  assert raw.shape == (3, D_MODEL // 2)
  w = np.exp(raw) / np.exp(raw).sum(0)
  w = np.concatenate([w, w], axis=1)  # Repeated twice along channels.
  prefix = "separable_conv1d/"
  x = np.pad(_masked_x(), [(0, 0), (2, 0), (0, 0)])
  depthwise = got[prefix + "depthwise_conv_hack/depthwise_dense_0/bias"] + sum(
      x[:, k:k + 8] * w[k] for k in range(3))
  want = (depthwise @ got[prefix + "pointwise_dense/kernel"] +
          got[prefix + "pointwise_dense/bias"])
  np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


# The block with a lightweight convolution is left out: its parts are
# covered by "lightweight" and "block_dynamic" (the suite's time budget).
@pytest.mark.parametrize("name,modes", [
    ("separable", ("function", "graph")),
    ("lightweight", ("function", "graph")),
    ("dynamic", ("function",)),
    ("block_dynamic", ("function",)),
])
def test_same_under_layouts(name, modes):
  layer_testing.assert_same_under_layouts(_builder(_LAYERS[name]),
                                          modes=modes)


def test_conv1d_layer_same_under_layouts_and_simd():
  build = _builder(lambda: transformer_layers.Conv1DLayer(3, D_MODEL))
  layer_testing.assert_same_under_layouts(build, modes=("function",))
  layer_testing.assert_same_under_layouts(
      build, layouts=layer_testing.LAYOUTS[3:], modes=("simd",))


def _decoding_builder(make_layer, prefix):
  """Full pass, then "first_part" on the first `prefix` positions and one
  "incremental" step per later position, all with the same variables."""

  def build(mesh):
    layer = make_layer()
    x = _x(mesh)
    outputs = {"full": layer.call(_context(mesh), x)}
    prefix_inputs = INPUTS * (np.arange(8) < prefix)
    context = _context(mesh, mode="first_part", inputs=prefix_inputs,
                       initial_position=prefix)
    outputs["first_part"] = layer.call(context, x)
    states = context.new_states
    for t in range(prefix, LENGTH.size):
      context = _context(
          mesh, mode="incremental", states=states,
          position=mtf.constant(mesh, t, shape=[], dtype=tf.int32))
      outputs[f"step{t}"] = layer.call(context, mtf.gather(x, t, LENGTH))
      states = context.new_states
    return outputs, None, {}

  return build


@pytest.mark.parametrize("name", sorted(_LAYERS))
def test_incremental_decoding_equals_full_pass(name):
  prefix = 3
  got, _ = mtf_testing.run_program(
      "all:1", "", "function", _decoding_builder(_LAYERS[name], prefix))
  full = got["full"]
  # Example 1 is padded from position 6: the full pass zeroes its inputs
  # there, decoding does not (it never sees inputs), so compare up to 5.
  for t in range(prefix, 8):
    rows = slice(None) if t < 6 else [b for b in range(8) if b != 1]
    np.testing.assert_allclose(got[f"step{t}"][rows], full[rows, t],
                               rtol=1e-4, atol=1e-5, err_msg=f"step {t}")
  np.testing.assert_allclose(got["first_part"][:, :prefix],
                             full[:, :prefix], rtol=1e-4, atol=1e-5)


def test_incremental_decoding_same_under_layouts():
  """Decoding states split along batch (and the block's weights on 2-D)."""
  layer_testing.assert_same_under_layouts(
      _decoding_builder(_LAYERS["dynamic"], 6),
      layouts=(layer_testing.LAYOUTS[1], layer_testing.LAYOUTS[3]),
      modes=("function",))


# V1_SHAPES_MODE: TF1's TensorShape behaviour, as under
# tf.compat.v1.disable_v2_behavior() (the window's shift reads slice shapes).
@pytest.mark.parametrize("mode", ["function", mtf_testing.V1_SHAPES_MODE])
def test_conv1d_layer_incremental_is_valid_convolution_of_window(mode):
  """As in the original, a decoding step of Conv1DLayer is a VALID
  convolution over the last filter_size inputs (a causal filter), while
  the full pass is a SAME convolution."""
  prefix = 2
  got, _ = mtf_testing.run_program(
      "all:1", "", mode,
      _decoding_builder(lambda: transformer_layers.Conv1DLayer(3, D_MODEL),
                        prefix))
  kernel = got["conv2d/kernel"][0]
  x = np.pad(X, [(0, 0), (2, 0), (0, 0)])
  for t in range(prefix, 8):
    want = sum(x[:, t + j] @ kernel[j] for j in range(3))
    np.testing.assert_allclose(got[f"step{t}"], want, rtol=1e-4, atol=1e-5)


def test_first_part_state_with_per_example_initial_position():
  """initial_position may differ per example (partial sequences of
  different lengths): the state is the filter_size inputs before it, zero
  before the start."""
  starts = np.array([0, 1, 2, 3, 4, 5, 8, 2], np.int32)

  def build(mesh):
    context = _context(mesh, mode="first_part", initial_position=(
        mtf_testing.import_array(mesh, starts, [BATCH])))
    transformer_layers.Conv1D().record_states_first_part_mode(
        context, _x(mesh), 3)
    (state,) = context.new_states
    assert state.shape.dims[1] == mtf.Dimension("length", 3)
    return {"state": state}, None, {}

  for case_id, mesh_shape, layout in layer_testing.LAYOUTS[:2]:
    got, _ = mtf_testing.run_program(mesh_shape, layout, "function", build)
    x = np.pad(X, [(0, 0), (3, 0), (0, 0)])
    want = np.stack([x[b, starts[b]:starts[b] + 3] for b in range(8)])
    np.testing.assert_allclose(got["state"], want, err_msg=case_id)


def test_update_state_slides_window():
  def build(mesh):
    filter_dim = mtf.Dimension("length", 3)
    d = mtf.Dimension("d_model", 2)
    old = mtf_testing.import_array(
        mesh, np.arange(48, dtype=np.float32).reshape([8, 3, 2]),
        [BATCH, filter_dim, d])
    x = mtf_testing.import_array(mesh, -np.ones([8, 2], np.float32),
                                 [BATCH, d])
    position = mtf.constant(mesh, 2, shape=[BATCH], dtype=tf.int32)
    new = transformer_layers.Conv1D().update_state(
        old, x, position, filter_dim, tf.float32)
    return {"new": new}, None, {}

  got, _ = mtf_testing.run_program("all:1", "", "function", build)
  old = np.arange(48, dtype=np.float32).reshape([8, 3, 2])
  want = np.concatenate([old[:, 1:], -np.ones([8, 1, 2])], axis=1)
  np.testing.assert_allclose(got["new"], want)


def test_bad_arguments_name_the_layer():
  with pytest.raises(ValueError, match="num_unique_depth_filters=3"):
    transformer_layers.Conv1DLocalAttn(-2, 0, 16, num_unique_depth_filters=3)
  with pytest.raises(NotImplementedError, match="attention_type 'bogus'"):
    transformer_layers.LocalConvAttnBlock(-2, 0, 16, attention_type="bogus")


def test_gin_configures_layers_under_original_names():
  with gin.unlock_config():
    gin.parse_config(
        "import mesh_tensorflow.transformer.transformer_layers\n"
        "transformer_layers.LocalConvAttnBlock.min_relative_pos = -4\n"
        "transformer_layers.LocalConvAttnBlock.max_relative_pos = 0\n"
        "transformer_layers.LocalConvAttnBlock.output_size = 16\n"
        "transformer_layers.LocalConvAttnBlock.attention_type = "
        "'dynamic_conv'\n"
        "mesh_tensorflow.transformer.transformer_layers.Conv1DLayer"
        ".filter_size = 5\n"
        "transformer_layers.Conv1DLayer.output_size = 8\n")
  try:
    block = transformer_layers.LocalConvAttnBlock()
    assert isinstance(block.conv_local_attn_layer,
                      transformer_layers.DynamicConv1DLocalAttn)
    assert block.conv_local_attn_layer.filter_size == 5
    assert transformer_layers.Conv1DLayer().filter_size == 5
  finally:
    gin.clear_config()


def test_lm_with_conv_layers_decodes_alike_with_v1_tensor_shapes():
  """A Unitransformer with convolution layers decodes (first part, then a
  while loop of incremental steps) to the same ids in a TF1-style graph,
  with TF1's TensorShape behaviour, as in a tf.function."""
  model = transformer.Unitransformer(
      transformer.LayerStack([
          transformer_layers.Conv1DLayer(3, model_testing.D),
          transformer_layers.SeparableConv1DLayer(-2, 0, model_testing.D),
          tiny_layers.TinySelfAttention(),
          tiny_layers.TinyDenseRelu()]),
      d_model=model_testing.D, input_vocab_size=model_testing.V,
      output_vocab_size=model_testing.V, autoregressive=True,
      max_length=model_testing.L, vocab_divisor=model_testing.VOCAB_DIVISOR,
      name="decoder")
  prefix = np.where(np.arange(model_testing.L) < 3, model_testing.TARGETS, 0)

  def build(mesh):
    ids = model.sample_autoregressive(
        model_testing.import_ids(mesh, prefix), stop_at_token=None)
    return {"ids": ids}, None, {}

  want, _ = mtf_testing.run_program("all:1", "", "function", build,
                                    fetch_variables=False)
  got, _ = mtf_testing.run_program("rows:2;cols:4", "batch:rows;d_ff:cols",
                                   mtf_testing.V1_SHAPES_MODE, build,
                                   fetch_variables=False)
  np.testing.assert_array_equal(want["ids"][:, :3], prefix[:, :3])
  assert (want["ids"][:, 3:] != 0).any()
  np.testing.assert_array_equal(got["ids"], want["ids"])
