"""PipelinedLayerStack: a pipelined LM trains exactly like the plain one.

A 4-layer tiny LM (self-attention and a feed-forward layer per block) is
trained a few Adafactor steps with its LayerStack on one processor, and
with a PipelinedLayerStack of 2 or 4 stages under meshes that split the
stage dimension alone or with batch and model splits: the losses agree to
float32 round-off, so the pipeline, the stacked weights (initialised per
layer) and the optimizer's per-layer statistics are exact. Checkpoints of
the pipelined model hold the plain model's variable names and restore
into it.

A per-example tensor that a layer reads from the context under a name the
stack does not know is cut into micro-batches like the known ones, or
refused with its name; stages are checked to repeat stage 0's layers by
their structure, nested hyperparameters included.
"""

import os
import types

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing
from tests.transformer import tiny_layers

NUM_LAYERS = 4
STEPS = 3
MODEL_SPLITS = "d_ff:model;heads:model;vocab:model"
# tf.function mode on one processor; the 2x2x2 mesh in graph mode. SIMD
# runs the stack on the stage mesh: tests/test_pipelining.py runs
# mtf.pipeline with batch and model splits on the 2x2x2 mesh in SIMD mode
# (and recomputation in SIMD mode), so the stack there would add only its
# ~30 s of tracing.
CASES = (
    # (case id, stages, micro-batches, mesh, layout, mode); 2 stages
    # recompute (GPipe), 4 stages on SIMD batch their weight gradients.
    ("s2m2_1proc", 2, 2, "all:1", "", "function"),
    ("s4m4_stage4", 4, 4, "stage:4", "stage:stage", "eager"),
    ("s4m8_stage4_simd_batched", 4, 8, "stage:4", "stage:stage", "simd"),
    ("s2m2_3d_graph", 2, 2, "stage:2;batch:2;model:2",
     "stage:stage;batch:batch;" + MODEL_SPLITS, "graph"),
)


def _layers():
  return model_testing.block_layers(NUM_LAYERS)


def _lm(stack):
  return model_testing.lm_on_stack(stack)


def _losses(stack, mesh_shape, layout, mode):
  return model_testing.train_losses(
      lambda mesh: model_testing.lm_loss(_lm(stack), mesh), mesh_shape,
      layout, mode, STEPS,
      lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.05))


@pytest.fixture(scope="module")
def plain_losses():
  return _losses(transformer.LayerStack(_layers()), "all:1", "", "function")


@pytest.mark.parametrize("stages,microbatches,mesh_shape,layout,mode",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pipelined_lm_trains_like_the_plain_one(plain_losses, stages,
                                                 microbatches, mesh_shape,
                                                 layout, mode):
  stack = transformer.PipelinedLayerStack(
      _layers(), num_stages=stages, num_microbatches=microbatches,
      recompute_grads=(stages == 2),
      batch_weight_gradients=(stages == 4 and mode == "simd"))
  losses = _losses(stack, mesh_shape, layout, mode)
  assert plain_losses[-1] < plain_losses[0]
  np.testing.assert_allclose(losses, plain_losses, rtol=2e-5, atol=2e-6)


def test_checkpoint_names_are_the_plain_models_and_restore_into_it(tmp_path):
  """After a training step, a pipelined model's checkpoint has the plain
  model's keys, and the plain model restored from it gives the pipelined
  model's loss (so each row went to its own layer's name)."""
  def build(stack, impl, train=False):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = model_testing.lm_loss(_lm(stack), mesh)
    updates = []
    if train:
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      updates = mtf.optimize.SgdOptimizer(0.5).apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    for u in updates:
      lowering.lowered_operation(u)
    return graph, float(lowering.export_to_tf_tensor(loss))

  pipelined_impl = mtf_testing.make_impl("eager", "stage:4", "stage:stage")
  pipelined = transformer.PipelinedLayerStack(_layers(), num_stages=4,
                                              num_microbatches=2)
  _, initial_loss = build(pipelined, pipelined_impl, train=True)
  _, trained_loss = build(pipelined, pipelined_impl)
  path = tf.train.Checkpoint(model=pipelined_impl).write(
      os.path.join(str(tmp_path), "ckpt"))
  keys = {k.split("/.ATTRIBUTES")[0][len("model/"):]
          for k, _ in tf.train.list_variables(path) if k.startswith("model/")}

  plain_impl = mtf_testing.make_impl("eager", "all:1", "")
  plain_stack = transformer.LayerStack(_layers())
  graph, fresh_loss = build(plain_stack, plain_impl)
  assert keys == {v.name for v in graph.all_variables}
  assert "decoder/block_003/layer_001/TinyDenseRelu/wi" in keys, sorted(keys)
  np.testing.assert_allclose(fresh_loss, initial_loss, rtol=1e-5)
  assert trained_loss < initial_loss - 1e-3
  tf.train.Checkpoint(model=plain_impl).read(path).expect_partial()
  _, restored_loss = build(plain_stack, plain_impl)
  np.testing.assert_allclose(restored_loss, trained_loss, rtol=1e-5)


def test_a_stage_count_that_does_not_divide_the_layers_is_named():
  with pytest.raises(ValueError, match=r"num_stages=3 .* 8 layers"):
    transformer.PipelinedLayerStack(
        transformer.make_layer_stack(
            [tiny_layers.TinySelfAttention, tiny_layers.TinyDenseRelu],
            num_layers=4).layers, num_stages=3)


def test_stages_with_different_layers_are_named():
  layers = transformer.make_layer_stack(
      [tiny_layers.TinySelfAttention, tiny_layers.TinyDenseRelu],
      num_layers=1).layers
  with pytest.raises(ValueError, match=(
      r"layer 1 \(block_000/layer_001, TinyDenseRelu\) differs from layer 0 "
      r"\(block_000/layer_000, TinySelfAttention\).* in the class: "
      r"TinySelfAttention vs TinyDenseRelu")):
    transformer.PipelinedLayerStack(layers, num_stages=2)


class _Wrapper(transformer.TransformerLayer):
  """A layer configured by a nested layer and a nested dict (what the
  stack compares), which calls the nested layer."""

  def __init__(self, inner_size=16, options=None):
    self.inner = tiny_layers.TinyDenseRelu(hidden_size=inner_size)
    self.inner.set_name("inner")
    self.options = options or {"scale": [1.0, {"bias": 0.0}]}

  def call(self, context, x):
    return self.inner.call(context, x) * self.options["scale"][0]


def _wrappers(*kwargs):
  layers = [_Wrapper(**k) for k in kwargs]
  for i, layer in enumerate(layers):
    layer.set_name(f"layer_{i:03d}")
  return layers


@pytest.mark.parametrize("second,difference", [
    ({"inner_size": 32}, "inner.hidden_size: 16 vs 32"),
    ({"options": {"scale": [1.0, {"bias": 0.5}]}},
     "options['scale'][1]['bias']: 0.0 vs 0.5"),
    ({"options": {"scale": [1.0, {"bias": 0}]}},
     "options['scale'][1]['bias']: float vs int"),
], ids=["nested_layer", "nested_dict", "number_type"])
def test_stages_differing_in_a_nested_hyperparameter_are_named(second,
                                                               difference):
  with pytest.raises(ValueError) as error:
    transformer.PipelinedLayerStack(_wrappers({}, second), num_stages=2)
  assert (f"layer 1 (layer_001, _Wrapper) differs from layer 0 "
          f"(layer_000, _Wrapper), the same position in stage 0, in "
          f"{difference};") in str(error.value)


def test_stages_of_equal_layers_are_accepted_whatever_their_names():
  """Equal configurations held by distinct objects (whose reprs differ)
  are the same; so are the names of nested layers."""
  layers = _wrappers({}, {}, {"inner_size": 16})
  layers[1].inner.set_name("another_inner")
  stack = transformer.PipelinedLayerStack(layers, num_stages=3)
  assert stack.num_stages == 3


class _ReadsANewField(transformer.TransformerLayer):
  """Scales x by a per-example feature the test puts on the context under
  a name the stack has never heard of (directly, in a list, a dict, or as
  a boolean mask)."""

  def call(self, context, x):
    feature = context.my_new_feature
    if isinstance(feature, list):
      feature = feature[1]
    elif isinstance(feature, dict):
      feature = feature["nested"][0]
    return x * mtf.cast(feature, x.dtype)


_FEATURE = np.random.RandomState(7).uniform(0.5, 1.5, (model_testing.B,))


def _new_field_value(mesh, how):
  """The per-example feature [batch] (or a bool mask [batch, length]),
  held as `how` says, with a shared tensor beside it."""
  if how == "mask":
    return mtf.import_tf_tensor(
        mesh, tf.constant(model_testing.TARGETS > 2),
        [model_testing.BATCH, model_testing.LENGTH])
  feature = mtf.import_tf_tensor(mesh, tf.constant(_FEATURE, tf.float32),
                                 [model_testing.BATCH])
  shared = mtf.ones(mesh, [model_testing.LENGTH])
  return {"tensor": feature,
          "list": [shared, feature],
          "dict": {"nested": (feature, shared), "count": 3}}[how]


def _stack_with_new_field(stack, how, mesh_shape, layout):
  """The stack's output and input gradient, its context carrying
  `my_new_feature`."""
  def build(mesh):
    model = layer_testing.ModelStub(model_testing.D)
    context = layer_testing.make_context(
        mesh, model, model_testing.BATCH, model_testing.LENGTH,
        layer_outputs=[], sequence_id=1)
    context.my_new_feature = _new_field_value(mesh, how)
    x = mtf.import_tf_tensor(
        mesh, tf.constant(np.random.RandomState(0).normal(
            size=(model_testing.B, model_testing.L, model_testing.D)),
                          tf.float32),
        [model_testing.BATCH, model_testing.LENGTH, model.model_dim])
    y = stack.call(context, x)
    return {"y": y}, mtf.reduce_sum(y * y), {"x": x}
  values, _ = mtf_testing.run_program(mesh_shape, layout, "function", build,
                                      fetch_variables=False)
  return values


def _feature_layers():
  return transformer.make_layer_stack(
      [tiny_layers.TinyDenseRelu, _ReadsANewField], num_layers=2).layers


@pytest.mark.parametrize("how", ["tensor", "list", "dict", "mask"])
def test_a_new_per_example_context_field_is_cut_into_microbatches(how):
  plain = _stack_with_new_field(transformer.LayerStack(_feature_layers()),
                                how, "all:1", "")
  pipelined = _stack_with_new_field(
      transformer.PipelinedLayerStack(_feature_layers(), num_stages=2,
                                      num_microbatches=4),
      how, "stage:2", "stage:stage")
  assert set(pipelined) == set(plain) == {"y", "d_x"}
  for key, want in plain.items():
    np.testing.assert_allclose(pipelined[key], want, rtol=1e-5, atol=1e-6,
                               err_msg=key)


@pytest.mark.parametrize("value,message", [
    (lambda mesh: mtf.ones(mesh, [mtf.Dimension("batch", 4)]),
     r"context\.my_new_feature has shape .*batch.*4.*, whose dimension "
     r"'batch' is not the batch dimension .*8"),
    (lambda mesh: {"a": [mtf.ones(mesh, [mtf.Dimension("batch", 2)])]},
     r"context\.my_new_feature\['a'\]\[0\] has shape"),
    (lambda mesh: types.SimpleNamespace(
        scale=mtf.ones(mesh, [model_testing.BATCH])),
     r"context\.my_new_feature is a SimpleNamespace holding a per-example "
     r"tensor \(context\.my_new_feature\.scale, shape"),
    (lambda mesh: frozenset([mtf.ones(mesh, [model_testing.BATCH])]),
     r"context\.my_new_feature is a frozenset holding a per-example tensor"),
], ids=["other_batch_size", "nested_other_batch_size", "object", "set"])
def test_a_context_field_that_cannot_be_cut_is_named(value, message):
  stack = transformer.PipelinedLayerStack(_feature_layers(), num_stages=2,
                                          num_microbatches=2)
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  model = layer_testing.ModelStub(model_testing.D)
  context = layer_testing.make_context(mesh, model, model_testing.BATCH,
                                       model_testing.LENGTH)
  context.my_new_feature = value(mesh)
  x = mtf.zeros(mesh, [model_testing.BATCH, model_testing.LENGTH,
                       model.model_dim])
  with pytest.raises(ValueError, match=message):
    stack.call(context, x)


def test_recompute_and_batched_weight_gradients_exclude_each_other():
  with pytest.raises(ValueError, match="set one of the two"):
    transformer.PipelinedLayerStack(_layers(), num_stages=2,
                                    recompute_grads=True,
                                    batch_weight_gradients=True)


def test_gin_builds_the_pipelined_stack():
  stack = model_testing.stack_from_gin("""
import mesh_tensorflow.transformer.transformer_layers
transformer.make_layer_stack.layers = [
    @transformer_layers.SelfAttention, @transformer_layers.DenseReluDense]
transformer.make_layer_stack.num_layers = 4
transformer.make_layer_stack.layer_stack_cls = @transformer.PipelinedLayerStack
transformer.PipelinedLayerStack.num_stages = 2
transformer.PipelinedLayerStack.num_microbatches = 4
transformer.PipelinedLayerStack.recompute_grads = True
""")
  assert isinstance(stack, transformer.PipelinedLayerStack)
  assert (stack.num_stages, stack.num_microbatches) == (2, 4)
