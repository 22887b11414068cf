"""Tests of the Evolved Transformer's layers (`evolved_transformer`).

The cells against NumPy with their own variables; the four layers give the
same outputs, gradients and variables under every layout (with dropout in
training: its masks do not depend on the layout), in tf.function and graph
mode; the decoder's layers decode step by step as a full causal pass does;
a Bitransformer of evolved encoder and decoder blocks has the original's
variable names and trains.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import evolved_transformer
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 8)
MEMORY_LENGTH = mtf.Dimension("memory_length", 8)
D_MODEL = 16
EPSILON = 1e-6


def _rand(shape, seed):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


X = _rand([BATCH.size, LENGTH.size, D_MODEL], 1)
ENCODER_OUTPUT = _rand([BATCH.size, MEMORY_LENGTH.size, D_MODEL], 2)


@pytest.fixture(name="small_attention")
def _small_attention():
  """Attention with 4 channels per head, bound through gin (the decoder's
  attention layer builds its attention layers itself, as in the
  original)."""
  with gin.unlock_config():
    gin.parse_config(
        "import mesh_tensorflow.transformer.transformer_layers\n"
        "transformer_layers.SelfAttention.key_value_size = 4\n"
        "transformer_layers.EncDecAttention.key_value_size = 4\n")
  yield
  gin.clear_config()


def _context(mesh, mode="train", **kwargs):
  model = layer_testing.ModelStub(D_MODEL, autoregressive=True)
  position = mtf.range(mesh, LENGTH, tf.int32)
  kwargs.setdefault("position", position)
  kwargs.setdefault("read_priority", position)
  kwargs.setdefault("write_priority", position)
  kwargs.setdefault("encoder_output", mtf_testing.import_array(
      mesh, ENCODER_OUTPUT, [BATCH, MEMORY_LENGTH, model.model_dim]))
  return layer_testing.make_context(mesh, model, BATCH, LENGTH, mode=mode,
                                    **kwargs)


def _layer_build(layers, mode="eval"):
  """build(mesh): each of `layers` (name -> fn() -> layer) on X in its own
  scope; their outputs and the gradients of a random projection of them."""
  def build(mesh):
    x = mtf_testing.import_array(
        mesh, X, [BATCH, LENGTH, mtf.Dimension("d_model", D_MODEL)])
    context = _context(mesh, mode)
    outputs, loss = {}, 0.0
    for seed, (name, make_layer) in enumerate(sorted(layers.items())):
      with tf.compat.v1.variable_scope(name):
        y = make_layer().call(context, x)
      assert y.shape == x.shape, (name, y.shape)
      outputs[name] = y
      loss += mtf.reduce_sum(y * mtf_testing.import_array(
          mesh, _rand(y.shape.to_integer_list, 10 + seed), y.shape.dims))
    wrt = {"x": x}
    for var in mesh.graph.trainable_variables:
      wrt[var.name] = var.outputs[0]
    return outputs, loss, wrt
  return build


# NumPy references, with a layer's own variables.


def _layer_norm(x, got, prefix):
  ln = prefix + "layer_prepostprocess/layer_norm/layer_norm_"
  x = x - x.mean(-1, keepdims=True)
  x = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPSILON)
  return x * got[ln + "scale"] + got[ln + "bias"]


def _separable(x, got, prefix, min_pos, max_pos):
  """A separable convolution over offsets min_pos..max_pos of x."""
  prefix += "separable_conv1d/"
  hack = prefix + "depthwise_conv_hack/depthwise_dense_"
  n = x.shape[1]
  padded = np.pad(x, [(0, 0), (-min_pos, max_pos), (0, 0)])
  depthwise = got[hack + "0/bias"] + sum(
      padded[:, k:k + n] * got[f"{hack}{k}/kernel"]
      for k in range(max_pos - min_pos + 1))
  return (depthwise @ got[prefix + "pointwise_dense/kernel"] +
          got[prefix + "pointwise_dense/bias"])


def _pad(x, size):
  return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


def _relu(x):
  return np.maximum(x, 0.0)


def test_gated_linear_unit_matches_numpy():
  got = layer_testing.run_under("all:1", "", "function", _layer_build(
      {"glu": evolved_transformer.GatedLinearUnitLayer}))
  a = X @ got["glu/glu_0/kernel"] + got["glu/glu_0/bias"]
  b = X @ got["glu/glu_1/kernel"] + got["glu/glu_1/bias"]
  np.testing.assert_allclose(got["glu"], a / (1.0 + np.exp(-b)), rtol=1e-5,
                             atol=1e-5)


def test_encoder_convolutional_layer_matches_numpy():
  got = layer_testing.run_under("all:1", "", "function", _layer_build(
      {"enc": lambda: evolved_transformer.EncoderConvolutionalLayer(
          D_MODEL, 0.1)}))
  left = _relu(X @ got["enc/conv1x1/dense/kernel"])
  kernel = got["enc/conv3x1/conv2d/kernel"][0]  # [3, d_model, d_model / 2]
  assert kernel.shape == (3, D_MODEL, D_MODEL // 2)
  padded = np.pad(X, [(0, 0), (1, 1), (0, 0)])
  right = _relu(sum(padded[:, j:j + 8] @ kernel[j] for j in range(3)))
  hidden = _layer_norm(left + _pad(right, 4 * D_MODEL), got, "enc/")
  want = _pad(_separable(hidden, got, "enc/sep_conv9x1/", -4, 4), D_MODEL)
  np.testing.assert_allclose(got["enc"], want, rtol=1e-4, atol=1e-4)


def test_decoder_convolutional_layer_matches_numpy():
  got = layer_testing.run_under("all:1", "", "function", _layer_build(
      {"dec": lambda: evolved_transformer.DecoderConvolutionalLayer(
          D_MODEL, 0.1)}))
  left = _relu(_separable(X, got, "dec/sep_conv11x1/", -10, 0))
  right = _separable(X, got, "dec/sep_conv7x1_1/", -6, 0)
  assert left.shape[-1] == 2 * D_MODEL and right.shape[-1] == D_MODEL // 2
  hidden = _layer_norm(left + _pad(right, 2 * D_MODEL), got, "dec/")
  want = _separable(hidden, got, "dec/sep_conv7x1_2/", -6, 0)
  np.testing.assert_allclose(got["dec"], want, rtol=1e-4, atol=1e-4)


def test_decoder_attention_layer_sums_its_two_attentions(small_attention):
  """The layer is its SelfAttention (2 * base heads) plus its
  EncDecAttention (base heads), computed here by the layers themselves
  with the same variables."""
  del small_attention

  def build(mesh):
    x = mtf_testing.import_array(
        mesh, X, [BATCH, LENGTH, mtf.Dimension("d_model", D_MODEL)])
    context = _context(mesh, "eval")
    with tf.compat.v1.variable_scope("layer"):
      y = evolved_transformer.DecoderAttentionLayer(4).call(context, x)
    with tf.compat.v1.variable_scope("layer", reuse=True):
      with tf.compat.v1.variable_scope("self_attention"):
        left = transformer_layers.SelfAttention(num_heads=8).call(context, x)
      with tf.compat.v1.variable_scope("enc_dec_attention"):
        right = transformer_layers.EncDecAttention(num_heads=4).call(
            context, x)
    return {"y": y, "want": left + right}, None, {}

  got, graph = mtf_testing.run_program("all:1", "", "function", build)
  shapes = {v.name: v.shape.to_integer_list
            for v in graph.trainable_variables}
  assert shapes == {
      f"layer/{part}/{w}": [D_MODEL, heads * 4] if w != "o" else
                           [heads * 4, D_MODEL]
      for part, heads in (("self_attention", 8), ("enc_dec_attention", 4))
      for w in "qkvo"}
  np.testing.assert_allclose(got["y"], got["want"], rtol=1e-6, atol=1e-6)


# One program per case, so that pytest-xdist can share them out.
_LAYOUT_CASES = {
    "encoder": {
        "glu": evolved_transformer.GatedLinearUnitLayer,
        "enc_conv": lambda: evolved_transformer.EncoderConvolutionalLayer(
            D_MODEL, 0.25)},
    "decoder_attention": {
        "dec_attention": lambda: evolved_transformer.DecoderAttentionLayer(
            8)},
    "decoder_conv": {
        "dec_conv": lambda: evolved_transformer.DecoderConvolutionalLayer(
            D_MODEL, 0.25, initializer_scale=0.5)},
}


@pytest.mark.parametrize("case", sorted(_LAYOUT_CASES))
def test_layers_same_under_layouts(small_attention, case):
  """In training, with dropout: every layout in tf.function, the 2-D one
  (batch and heads split) in graph mode too."""
  del small_attention
  build = _layer_build(_LAYOUT_CASES[case], mode="train")
  layer_testing.assert_same_under_layouts(build, modes=("function",))
  layer_testing.assert_same_under_layouts(
      build, layouts=layer_testing.LAYOUTS[3:], modes=("graph",))


class _DecoderCells(transformer.TransformerLayer):
  """The decoder's two evolved layers in a row, as in a decoder block."""

  def __init__(self):
    self.attention = evolved_transformer.DecoderAttentionLayer(4)
    self.conv = evolved_transformer.DecoderConvolutionalLayer(D_MODEL, 0.0)

  def call(self, context, x):
    with tf.compat.v1.variable_scope("attention"):
      x += self.attention.call(context, x)
    with tf.compat.v1.variable_scope("conv"):
      return x + self.conv.call(context, x)


def test_decoder_layers_decode_as_full_pass(small_attention):
  """"first_part" on a prefix, then one "incremental" step per position,
  gives the full causal pass's outputs."""
  del small_attention
  prefix = 3

  def build(mesh):
    d_model = mtf.Dimension("d_model", D_MODEL)
    layer = _DecoderCells()
    outputs = {"full": layer.call(
        _context(mesh, "eval"),
        mtf_testing.import_array(mesh, X, [BATCH, LENGTH, d_model]))}
    garbage = X.copy()
    garbage[:, prefix:] = _rand(garbage[:, prefix:].shape, 9)
    first = _context(mesh, "first_part", new_states=[], constant_states=[],
                     initial_position=mtf.constant(
                         mesh, prefix, mtf.Shape([BATCH]), tf.int32))
    layer.call(first, mtf_testing.import_array(
        mesh, garbage, [BATCH, LENGTH, d_model]))
    states = first.new_states
    for p in range(prefix, LENGTH.size):
      position = mtf.constant(mesh, p, mtf.Shape([BATCH]), tf.int32)
      step = _context(
          mesh, "incremental", position=position, states=states,
          new_states=[], initial_position=position,
          constant_states=first.constant_states, read_priority=position)
      outputs[f"step{p}"] = layer.call(
          step, mtf_testing.import_array(mesh, X[:, p], [BATCH, d_model]))
      states = step.new_states
    return outputs, None, {}

  got = layer_testing.run_under("all:1", "", "function", build)
  for p in range(prefix, LENGTH.size):
    np.testing.assert_allclose(got[f"step{p}"], got["full"][:, p],
                               rtol=1e-4, atol=1e-4, err_msg=f"step {p}")


def test_too_narrow_model_dimension_is_a_clear_error():
  """d_model larger than the model's: the output cannot be padded back."""
  with pytest.raises(ValueError, match="cannot pad the channels"):
    layer_testing.run_under("all:1", "", "function", _layer_build(
        {"enc": lambda: evolved_transformer.EncoderConvolutionalLayer(
            4 * D_MODEL, 0.0)}))


# A Bitransformer of evolved blocks, configured through gin with the
# original's names.
_EVOLVED_GIN = """
import mesh_tensorflow.transformer.evolved_transformer
import mesh_tensorflow.transformer.transformer_layers

D = 16
evolved_transformer.EncoderConvolutionalLayer.d_model = %D
evolved_transformer.EncoderConvolutionalLayer.dropout_rate = 0.0
evolved_transformer.DecoderConvolutionalLayer.d_model = %D
evolved_transformer.DecoderConvolutionalLayer.dropout_rate = 0.0
evolved_transformer.DecoderAttentionLayer.base_num_heads = 4
transformer_layers.SelfAttention.num_heads = 8
transformer_layers.SelfAttention.key_value_size = 4
transformer_layers.EncDecAttention.num_heads = 8
transformer_layers.EncDecAttention.key_value_size = 4
transformer_layers.DenseReluDense.hidden_size = 32

encoder/make_layer_stack.layers = [
    @evolved_transformer.GatedLinearUnitLayer,
    @mesh_tensorflow.transformer.evolved_transformer.EncoderConvolutionalLayer,
    @transformer_layers.SelfAttention,
    @transformer_layers.DenseReluDense,
]
decoder/make_layer_stack.layers = [
    @evolved_transformer.DecoderAttentionLayer,
    @evolved_transformer.DecoderConvolutionalLayer,
    @transformer_layers.SelfAttention,
    @transformer_layers.EncDecAttention,
    @transformer_layers.DenseReluDense,
]
make_layer_stack.num_layers = 1
"""


@pytest.fixture(name="evolved_gin")
def _evolved_gin():
  with gin.unlock_config():
    gin.parse_config(_EVOLVED_GIN)
  yield
  gin.clear_config()


def _make_evolved_bitransformer():
  with gin.config_scope("encoder"):
    encoder_stack = transformer.make_layer_stack()
  with gin.config_scope("decoder"):
    decoder_stack = transformer.make_layer_stack()
  common = dict(d_model=D_MODEL, input_vocab_size=model_testing.V,
                max_length=LENGTH.size,
                vocab_divisor=model_testing.VOCAB_DIVISOR)
  encoder = transformer.Unitransformer(
      encoder_stack, output_vocab_size=None, autoregressive=False,
      name="encoder", **common)
  decoder = transformer.Unitransformer(
      decoder_stack, output_vocab_size=model_testing.V, autoregressive=True,
      name="decoder", **common)
  return transformer.Bitransformer(encoder, decoder)


def test_bitransformer_variables_have_original_names(evolved_gin):
  del evolved_gin
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  model_testing.bi_loss(_make_evolved_bitransformer(), mesh)
  names = {v.name for v in graph.trainable_variables}
  enc = "encoder/block_000/"
  dec = "decoder/block_000/"
  sep = "separable_conv1d/pointwise_dense/kernel"
  want = {
      enc + "layer_000/GatedLinearUnitLayer/glu_0/kernel",
      enc + "layer_000/GatedLinearUnitLayer/glu_1/bias",
      enc + "layer_001/EncoderConvolutionalLayer/conv1x1/dense/kernel",
      enc + "layer_001/EncoderConvolutionalLayer/conv3x1/conv2d/kernel",
      enc + "layer_001/EncoderConvolutionalLayer/layer_prepostprocess/"
      "layer_norm/layer_norm_scale",
      enc + "layer_001/EncoderConvolutionalLayer/sep_conv9x1/" + sep,
      enc + "layer_002/SelfAttention/q",
      enc + "layer_003/DenseReluDense/wi/kernel",
      dec + "layer_000/DecoderAttentionLayer/self_attention/q",
      dec + "layer_000/DecoderAttentionLayer/enc_dec_attention/o",
      dec + "layer_001/DecoderConvolutionalLayer/sep_conv11x1/" + sep,
      dec + "layer_001/DecoderConvolutionalLayer/sep_conv7x1_1/" + sep,
      dec + "layer_001/DecoderConvolutionalLayer/sep_conv7x1_2/" + sep,
      dec + "layer_001/DecoderConvolutionalLayer/sep_conv7x1_2/"
      "separable_conv1d/depthwise_conv_hack/depthwise_dense_6/kernel",
      dec + "layer_001/DecoderConvolutionalLayer/layer_prepostprocess/"
      "layer_norm/layer_norm_bias",
      dec + "layer_003/EncDecAttention/k",
  }
  assert want <= names, sorted(want - names)
  shapes = {v.name: v.shape.to_integer_list
            for v in graph.trainable_variables}
  assert shapes[enc + "layer_001/EncoderConvolutionalLayer/conv1x1/"
                "dense/kernel"] == [D_MODEL, 4 * D_MODEL]
  assert shapes[dec + "layer_000/DecoderAttentionLayer/self_attention/"
                "q"] == [D_MODEL, 8 * 4]


def test_evolved_bitransformer_trains(evolved_gin):
  del evolved_gin
  losses = model_testing.train_losses(
      lambda mesh: model_testing.bi_loss(_make_evolved_bitransformer(), mesh),
      "all:1", "", "function", 6, lambda: mtf.optimize.SgdOptimizer(0.5))
  assert all(np.isfinite(losses)), losses
  assert losses[-1] < 0.8 * losses[0], losses
