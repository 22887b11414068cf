"""Optimizers update each row of a layer-stacked variable exactly as they
update the per-layer variable it stands for, and its slots are checkpointed
under the per-layer slot names."""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import layer_stacked_models as models
from tests import training_loop

STEPS = 3
optimize = mtf.optimize

OPTIMIZERS = {
    # Factored second moments over [d, h] kernels (min size 4), momentum.
    "adafactor_factored": functools.partial(
        optimize.AdafactorOptimizer, min_dim_size_to_factor=4, beta1=0.5),
    "adafactor_unfactored": functools.partial(
        optimize.AdafactorOptimizer, factored=False, clipping_threshold=0.5),
    "adam": functools.partial(
        optimize.AdamWeightDecayOptimizer, learning_rate=0.01,
        weight_decay_rate=0.1, exclude_from_weight_decay=["bias"]),
    "momentum": functools.partial(optimize.MomentumOptimizer, 0.1, 0.9),
}


def _train(make_optimizer, mesh_shape, layout, stacked, directory,
           sharding=None, graphs=None, simd=False):
  """STEPS training steps in a tf.function (`training_loop.run_steps`);
  returns the checkpoint's values by name (variables and slots).
  `sharding`: None, "update" (weight-update sharding) or "parameters"
  (sharded parameters too); `graphs`, a list, gets the mtf Graph; `simd`
  runs on a SimdMeshImpl."""
  if simd:
    impl = mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, layout)
  else:
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)

  def build():
    graph = mtf.Graph()
    if graphs is not None:
      graphs.append(graph)
    mesh = mtf.Mesh(graph, "mesh")
    if sharding is not None:
      mtf.shard_data_parallel(mesh, mesh_shape, layout,
                              shard_parameters=sharding == "parameters")
    loss = models.loss(mesh, stacked)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = make_optimizer().apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    train_ops = [lowering.lowered_operation(u) for u in updates]
    with tf.control_dependencies(train_ops):
      return lowering, train_ops, tf.identity(
          lowering.export_to_tf_tensor(loss))

  training_loop.run_steps(build, impl, "simd" if simd else "function", STEPS)
  path = tf.train.Checkpoint(model=impl).write(
      os.path.join(directory, f"{stacked}_{mesh_shape}_{simd}"))
  return mtf.storage.checkpointing.load_variables(path, prefix="model")


def _assert_trained_alike(got, want):
  """The same variables and slots by name, to float32 round-off; slots
  moved from zero (the steps ran)."""
  assert sorted(got) == sorted(want)
  slots = set(want) - set(models.MEMBERS)
  assert slots and set(models.MEMBERS) < set(want)
  assert all(np.any(want[k] != 0) for k in slots)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6,
                               err_msg=key)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_stacked_training_equals_per_layer_training(tmp_path, name):
  make_optimizer = OPTIMIZERS[name]
  want = _train(make_optimizer, "all:1", "", False, tmp_path)
  got = _train(make_optimizer, "p:2;b:2;m:2", "stage:p;batch:b;h:m", True,
               tmp_path)
  _assert_trained_alike(got, want)
  if name == "adafactor_factored":
    assert want["block_002/dense/kernel_slot_vr"].shape == (8,)
    assert want["block_002/dense/kernel_slot_vc"].shape == (16,)
    assert "block_003/bias_slot_v" in want


def test_stacked_training_on_simd_equals_per_layer_training(tmp_path):
  make_optimizer = OPTIMIZERS["adafactor_factored"]
  want = _train(make_optimizer, "all:1", "", False, tmp_path)
  got = _train(make_optimizer, "p:2;b:2;m:2", "stage:p;batch:b;h:m", True,
               tmp_path, simd=True)
  _assert_trained_alike(got, want)


@pytest.mark.parametrize("sharding", ["update", "parameters"])
def test_stacked_training_with_data_parallel_sharding(tmp_path, sharding):
  """Weight-update sharding over "b" (the stack is split over "p")."""
  make_optimizer = OPTIMIZERS["adafactor_factored"]
  want = _train(make_optimizer, "all:1", "", False, tmp_path)
  graphs = []
  got = _train(make_optimizer, "p:2;b:2;m:2", "stage:p;batch:b;h:m", True,
               tmp_path, sharding=sharding, graphs=graphs)
  stored = {v.name: v.shape.dimension_names
            for v in graphs[-1].all_variables}
  # Slots (and with "parameters" the variables) are stored split over "b".
  assert stored["stacked_stage/block_000/bias_slot_v"] == ["stage", "d@b"]
  assert (stored["stacked_stage/block_000/dense/kernel"] ==
          ["stage", "d@b" if sharding == "parameters" else "d", "h"])
  _assert_trained_alike(got, want)


def test_compat_graph_mode_saves_per_layer_slot_names(tmp_path):
  """A Saver writes one master per member, slots included."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "all:4", "stage:all")
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = models.loss(mesh, True)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = OPTIMIZERS["adafactor_factored"]().apply_grads(grads,
                                                             variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    train = [lowering.lowered_operation(u) for u in updates]
    saver = tf.compat.v1.train.Saver()
    path = os.path.join(tmp_path, "model.ckpt")
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      sess.run(train)
      sess.run(lowering.copy_slices_to_masters())
      saver.save(sess, path)
  keys = dict(tf.train.list_variables(path))
  for i in range(models.LAYERS):
    assert keys[f"block_{i:03d}/dense/kernel"] == [8, 16]
    assert keys[f"block_{i:03d}/dense/kernel_slot_vr"] == [8]
    assert keys[f"block_{i:03d}/dense/kernel_slot_m"] == [8, 16]
    assert keys[f"block_{i:03d}/scale_slot_v"] == [8]
  assert not [k for k in keys if k.startswith("stacked_")]


def test_regexes_must_agree_on_all_members():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = models.loss(mesh, True)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  optimizer = optimize.AdamWeightDecayOptimizer(
      0.01, weight_decay_rate=0.1, exclude_from_weight_decay=["block_001"])
  with pytest.raises(ValueError, match="stacked_stage/.*weight decay"):
    optimizer.apply_grads(grads, variables)
