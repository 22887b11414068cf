"""FunnelTransformerLayerStack and BitransformerFunnel."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import funnel_transformer
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing
from tests.transformer import tiny_layers

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 8)
D_MODEL = 16
X = np.random.RandomState(0).normal(size=[8, 8, D_MODEL]).astype(np.float32)
LOSS_WEIGHTS = np.random.RandomState(1).normal(
    size=[8, 4, D_MODEL]).astype(np.float32)
# Rows padded after 8, 6, 5, ... tokens (sequence id 0 there).
SEQUENCE_ID = (np.arange(8)[None, :] <
               np.array([8, 6, 5, 8, 3, 7, 8, 4])[:, None]).astype(np.int32)


class _Zero(transformer.TransformerLayer):
  """Adds nothing: a stack of these with residuals only pools."""

  def call(self, context, x):
    return x * 0.0


def _stack(layers, **kwargs):
  kwargs.setdefault("n_blocks", 2)
  kwargs.setdefault("block_param_size", [1, 1])
  kwargs.setdefault("block_repeat_size", [1, 2])
  return funnel_transformer.FunnelTransformerLayerStack(layers, **kwargs)


def _tiny_stack():
  return _stack([tiny_layers.TinySelfAttention(),
                 tiny_layers.TinyDenseRelu()] * 2)


def _builder(stack, sequence_id=SEQUENCE_ID, fetch_context=False):
  """build(mesh): the stack on X (non-autoregressive), a weighted sum."""

  def build(mesh):
    model = layer_testing.ModelStub(D_MODEL, autoregressive=False)
    context = layer_testing.make_context(
        mesh, model, BATCH, LENGTH,
        sequence_id=mtf_testing.import_array(mesh, sequence_id,
                                             [BATCH, LENGTH]),
        position=mtf.range(mesh, LENGTH, tf.int32), layer_outputs=[])
    x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, model.model_dim])
    y = stack.call(context, x)
    w = mtf_testing.import_array(mesh, LOSS_WEIGHTS, y.shape.dims)
    outputs = {"y": y}
    if fetch_context:
      outputs.update(position=context.position,
                     sequence_id=context.sequence_id,
                     n_outputs=mtf.constant(mesh, len(context.layer_outputs)))
    wrt = {"x": x}
    wrt.update({v.name: v.outputs[0]
                for v in mesh.graph.trainable_variables})
    return outputs, mtf.reduce_sum(y * w), wrt

  return build


@pytest.mark.parametrize("pooling_type,np_fn", [
    ("mean", np.mean), ("max", np.max), ("min", np.min)])
def test_pooling_matches_numpy(pooling_type, np_fn):
  """With layers that add nothing, the stack pools X once (block 1) and
  zeroes the pooled padding."""
  stack = _stack([_Zero(), _Zero()] * 2, pooling_type=pooling_type,
                 sublayers_initial=[],
                 sublayers_per_layer=[transformer.sublayer_call_layer,
                                      transformer.sublayer_residual],
                 sublayers_final=[])
  got, _ = mtf_testing.run_program(
      "all:1", "", "function", _builder(stack, fetch_context=True))
  pooled = np_fn(X.reshape(8, 4, 2, D_MODEL), axis=2)
  pooled_ids = SEQUENCE_ID[:, ::2]
  np.testing.assert_allclose(got["y"], pooled * pooled_ids[..., None],
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(got["sequence_id"], pooled_ids)
  np.testing.assert_array_equal(got["position"], np.arange(4))
  # The initial output, then one per call but the last (3 calls of 2
  # submodules), then the final output.
  assert got["n_outputs"] == 1 + 5 + 1


def test_repeats_share_parameters_and_names_follow_the_original():
  """Block 1's group runs twice on one set of variables."""

  def variable_names(block_repeat_size):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    stack = _stack([tiny_layers.TinySelfAttention(),
                    tiny_layers.TinyDenseRelu()] * 2,
                   block_repeat_size=block_repeat_size)
    _builder(stack)(mesh)
    return sorted(v.name for v in graph.trainable_variables)

  names = variable_names([1, 2])
  assert names == variable_names([1, 1])
  assert sorted({"/".join(n.split("/")[:3]) for n in names}) == [
      "funnel_block_000/param_idx_000/submodule_000",
      "funnel_block_000/param_idx_000/submodule_001",
      "funnel_block_001/param_idx_000/submodule_000",
      "funnel_block_001/param_idx_000/submodule_001",
      "rms_norm/scale"]  # The final sublayers' norm.


@pytest.mark.parametrize("mode,layouts", [
    ("function", layer_testing.LAYOUTS),
    ("graph", layer_testing.LAYOUTS[3:])])  # 2-D only: the time budget.
def test_same_under_layouts(mode, layouts):
  layer_testing.assert_same_under_layouts(_builder(_tiny_stack()),
                                          layouts=layouts, modes=(mode,))


def test_runs_its_layers_with_the_layer_stacks_code():
  """The funnel wraps its layers in sublayers with LayerStack's own code
  (they share a base class), not a copy of it; it is still no LayerStack."""
  stack = _stack([_Zero(), _Zero(), _Zero(), _Zero()])
  for name in ("_call_sublayers", "_layer_fn", "layers", "num_layers"):
    assert (getattr(funnel_transformer.FunnelTransformerLayerStack, name)
            is getattr(transformer.LayerStack, name)), name
  assert not isinstance(stack, transformer.LayerStack)
  assert stack.num_layers == 4


def test_rejects_inconsistent_sizes():
  with pytest.raises(ValueError, match="block_param_size"):
    _stack([_Zero()] * 4, block_param_size=[1, 1, 1])
  with pytest.raises(ValueError, match="needs 4"):
    _stack([_Zero()] * 3)
  with pytest.raises(ValueError, match="pooling_type"):
    _stack([_Zero()] * 4, pooling_type="median")


def _make_funnel_bitransformer():
  gin_layers = [tiny_layers.TinySelfAttention(), tiny_layers.TinyDenseRelu()]
  encoder = transformer.Unitransformer(
      _stack(gin_layers * 2), d_model=model_testing.D,
      input_vocab_size=model_testing.V, output_vocab_size=None,
      autoregressive=False, max_length=model_testing.L,
      vocab_divisor=model_testing.VOCAB_DIVISOR, name="encoder")
  decoder = transformer.Unitransformer(
      transformer.make_layer_stack(
          [tiny_layers.TinySelfAttention, tiny_layers.TinyEncDecAttention,
           tiny_layers.TinyDenseRelu], num_layers=1),
      d_model=model_testing.D, input_vocab_size=model_testing.V,
      output_vocab_size=model_testing.V, autoregressive=True,
      max_length=model_testing.L, vocab_divisor=model_testing.VOCAB_DIVISOR,
      name="decoder")
  return funnel_transformer.BitransformerFunnel(encoder, decoder)


def test_bitransformer_funnel_trains_and_decodes():
  model = _make_funnel_bitransformer()
  losses = model_testing.train_losses(
      lambda mesh: model_testing.bi_loss(model, mesh), "batch:2",
      "batch:batch", "function", 6,
      lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.1))
  assert np.all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.3, losses

  def build(mesh):
    inputs = model_testing.import_ids(mesh, model_testing.INPUTS)
    outputs = model.decode(inputs)
    # The decoder attended to the pooled encoder: 8 -> 4 positions.
    pooled = model.encoder.layer_stack.context.length_dim
    return {"outputs": outputs,
            "pooled": mtf.constant(mesh, pooled.size)}, None, {}

  got, _ = mtf_testing.run_program("all:1", "", "function", build,
                                   fetch_variables=False)
  assert got["outputs"].shape == (model_testing.B, model_testing.L)
  assert got["pooled"] == 4


def test_gin_configures_the_original_names():
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config("""
    funnel_transformer.FunnelTransformerLayerStack.n_blocks = 2
    funnel_transformer.FunnelTransformerLayerStack.block_param_size = [1, 2]
    funnel_transformer.FunnelTransformerLayerStack.block_repeat_size = [2, 1]
    funnel_transformer.FunnelTransformerLayerStack.pooling_type = "max"
    BitransformerFunnel.decode.beam_size = 1
    """)
    try:
      stack = gin.get_configurable(
          "mesh_tensorflow.transformer.funnel_transformer."
          "FunnelTransformerLayerStack")([_Zero()] * 6)
      cls = gin.get_configurable(
          "mesh_tensorflow.transformer.funnel_transformer.BitransformerFunnel")
    finally:
      gin.clear_config()
  assert stack.pool_fn is mtf.reduce_max
  assert issubclass(cls, transformer.Bitransformer)


def test_gin_builds_a_funnel_bitransformer_as_the_original_configs_do():
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config("""
    import mesh_tensorflow.transformer.funnel_transformer
    transformer.make_bitransformer.bitransformer_cls = \\
        @funnel_transformer.BitransformerFunnel
    encoder/transformer.make_layer_stack.layer_stack_cls = \\
        @funnel_transformer.FunnelTransformerLayerStack
    encoder/transformer.make_layer_stack.num_layers = 3
    encoder/transformer.make_layer_stack.layers = [
        @transformer_layers.SelfAttention,
        @transformer_layers.DenseReluDense]
    decoder/transformer.make_layer_stack.layers = [
        @transformer_layers.SelfAttention,
        @transformer_layers.EncDecAttention,
        @transformer_layers.DenseReluDense]
    FunnelTransformerLayerStack.n_blocks = 2
    FunnelTransformerLayerStack.block_param_size = [1, 2]
    FunnelTransformerLayerStack.block_repeat_size = [1, 1]
    transformer.Unitransformer.max_length = 8
    """)
    try:
      model = transformer.make_bitransformer(input_vocab_size=30,
                                             output_vocab_size=30)
    finally:
      gin.clear_config()
  assert isinstance(model, funnel_transformer.BitransformerFunnel)
  stack = model.encoder.layer_stack
  assert isinstance(stack, funnel_transformer.FunnelTransformerLayerStack)
  assert (stack.num_layers, stack.block_param_size) == (6, [1, 2])
