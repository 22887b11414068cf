"""Autostack: variables assigned together share one TF variable per
processor; results and checkpoints are those of unstacked variables."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.backend import placement_variables
from tests import mtf_testing
from tests import training_loop

NUM_LAYERS = 4
RNG = np.random.RandomState(3)
X = RNG.randn(8, 16).astype(np.float32)


def _model(mesh, optimizer):
  """A stack of dense layers with biases; returns (loss, update ops)."""
  batch = mtf.Dimension("batch", 8)
  io = mtf.Dimension("io", 16)
  hidden = mtf.Dimension("hidden", 16)
  x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, io])
  h = x
  for i in range(NUM_LAYERS):
    h = mtf.layers.dense(h, hidden, reduced_dims=[h.shape.dims[-1]],
                         activation=mtf.tanh, name=f"layer{i}")
    h = mtf.rename_dimension(h, "hidden", "io")
  loss = mtf.reduce_mean(mtf.square(h - x))
  graph = mesh.graph
  grads = mtf.gradients([loss], [v.outputs[0]
                                 for v in graph.trainable_variables])
  updates = optimizer().apply_grads(grads, graph.trainable_variables)
  return loss, updates


def _train(mesh_shape, layout, mode, autostack, steps=3,
           optimizer=lambda: mtf.optimize.AdamWeightDecayOptimizer(0.01)):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  lowerings = []

  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, updates = _model(mesh, optimizer)
    lowering = mtf.Lowering(graph, {mesh: impl}, autostack=autostack)
    lowerings.append(lowering)
    return lowering, [lowering.lowered_operation(u) for u in updates], (
        lowering.export_to_tf_tensor(loss))

  losses = training_loop.run_steps(step, impl, mode, steps)
  return np.array([float(loss) for loss in losses]), impl, lowerings[-1]


def test_variables_updated_together_are_stacked():
  _, impl, lowering = _train("all:8", "hidden:all", "function", True,
                             steps=1)
  kinds = {}
  for var, laid_out in lowering.variables.items():
    kinds[var.name] = type(laid_out.storage).__name__
  # Kernels [io, hidden] and their two Adam slots stack; so do biases.
  assert kinds["layer0/kernel"] == "StackMember"
  assert kinds["layer3/bias"] == "StackMember"
  stacks = {id(laid_out.storage.stack)
            for laid_out in lowering.variables.values()
            if isinstance(laid_out.storage, placement_variables.StackMember)}
  # 4 kernels, 4 biases, 2 slots each: 24 variables in few stacks.
  assert len(lowering.variables) == 3 * 2 * NUM_LAYERS
  assert len(stacks) <= 4
  tf_variables = {id(v) for v in
                  (lambda e: [s for x in e.values() for s in
                              getattr(getattr(x, "stack", x), "slices", [])])(
                                  impl.variable_store.eager_entries())}
  assert len(tf_variables) == 8 * len(stacks)


def test_no_stacking_on_one_processor_or_when_disabled():
  for mesh_shape, autostack in (("all:1", True), ("all:8", False)):
    _, _, lowering = _train(mesh_shape, "hidden:all", "eager", autostack,
                            steps=1)
    assert not any(isinstance(v.storage, placement_variables.StackMember)
                   for v in lowering.variables.values())


@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;hidden:cols")])
def test_stacked_training_matches_unstacked(mesh_shape, layout, mode):
  stacked, _, _ = _train(mesh_shape, layout, mode, True)
  plain, _, _ = _train(mesh_shape, layout, mode, False)
  reference, _, _ = _train("all:1", "", "eager", False)
  np.testing.assert_allclose(stacked, plain, rtol=1e-6)
  np.testing.assert_allclose(stacked, reference, rtol=1e-5)
  assert stacked[-1] < stacked[0]


def test_stacked_checkpoint_restores_unstacked_under_another_layout(
    tmp_path):
  path = os.path.join(tmp_path, "ckpt")
  _, impl, lowering = _train("all:8", "hidden:all", "function", True,
                             steps=2)
  assert any(isinstance(v.storage, placement_variables.StackMember)
             for v in lowering.variables.values())
  tf.train.Checkpoint(model=impl).write(path)
  saved = mtf.storage.checkpointing.load_variables(path, prefix="model")
  assert "layer2/kernel" in saved and saved[
      "layer2/kernel"].shape == (16, 16)

  for mesh_shape, layout, autostack in (("rows:2;cols:4", "io:rows", False),
                                        ("all:4", "batch:all", True)):
    target = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
    tf.train.Checkpoint(model=target).restore(path).expect_partial()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    _model(mesh, lambda: mtf.optimize.AdamWeightDecayOptimizer(0.01))
    lowering = mtf.Lowering(graph, {mesh: target}, autostack=autostack)
    for var in graph.all_variables:
      np.testing.assert_array_equal(
          lowering.export_to_tf_tensor(var.outputs[0]).numpy(),
          saved[var.name], err_msg=var.name)


def test_rewrite_stack_variables_stacks_without_autostack():
  """graph.rewrite_stack_variables() then Lowering(..., autostack=False),
  as the original suggested for fine control: the variables are stacked
  within the given limits, and the graph is unchanged."""
  def lower(rewrite, **limits):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    _model(mesh, lambda: mtf.optimize.SgdOptimizer(0.1))
    variables = graph.all_variables
    if rewrite:
      graph.rewrite_stack_variables(**limits)
      with pytest.raises(ValueError, match="twice"):
        graph.rewrite_stack_variables()
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "batch:all")
    lowering = mtf.Lowering(graph, {mesh: impl}, autostack=False)
    assert graph.all_variables == variables
    return [lowering.stack_group(v) for v in variables]

  assert all(g is None for g in lower(rewrite=False))
  groups = lower(rewrite=True)
  assert any(g is not None for g in groups)
  # A slice limit below two variables' slices stacks nothing.
  assert all(g is None for g in lower(rewrite=True,
                                      max_combined_slice_size=16))
