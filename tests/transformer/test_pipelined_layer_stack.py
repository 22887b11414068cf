"""PipelinedLayerStack: a pipelined LM trains exactly like the plain one.

A 4-layer tiny LM (self-attention and a feed-forward layer per block) is
trained a few Adafactor steps with its LayerStack on one processor, and
with a PipelinedLayerStack of 2 or 4 stages under meshes that split the
stage dimension alone or with batch and model splits: the losses agree to
float32 round-off, so the pipeline, the stacked weights (initialised per
layer) and the optimizer's per-layer statistics are exact. Checkpoints of
the pipelined model hold the plain model's variable names and restore
into it.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing
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
  with pytest.raises(ValueError, match="differs from layer 0"):
    transformer.PipelinedLayerStack(layers, num_stages=2)


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
