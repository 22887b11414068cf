"""Checkpoints hold each mtf variable whole, whatever mesh and layout wrote
them, and restore exactly under any other mesh and layout."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

RNG = np.random.RandomState(7)
W0 = RNG.randn(8, 16).astype(np.float32)
B0 = RNG.randn(16).astype(np.float32)
E0 = RNG.randn(4, 8, 16).astype(np.float32)

# (mesh shape, layout) written -> (mesh shape, layout) read.
TRANSFERS = [
    (("b:2;m:4", "batch:b;hidden:m"), ("all:1", "")),
    (("all:8", "batch:all"), ("all:8", "hidden:all")),
    (("all:8", "hidden:all"), ("rows:2;cols:4", "io:rows;hidden:cols")),
    (("all:1", ""), ("rows:2;cols:4", "experts:rows;io:cols")),
]
TRANSFER_IDS = ["2d_to_1", "data_to_model", "model_to_2d", "1_to_2d"]


def _build(mesh, scale):
  """Variables w, b, e (bfloat16 slices of e), each multiplied by `scale`
  once through an Assign, so the values saved differ from initial ones."""
  w = mtf.get_variable(mesh, "layer/w", [("io", 8), ("hidden", 16)],
                       initializer=W0)
  b = mtf.get_variable(mesh, "layer/b", [("hidden", 16)], initializer=B0)
  e = mtf.get_variable(mesh, "e", [("experts", 4), ("io", 8), ("hidden", 16)],
                       master_dtype=tf.float32, slice_dtype=tf.bfloat16,
                       activation_dtype=tf.float32, initializer=E0)
  assigns = [mtf.assign(v, v * scale) for v in (w, b)]
  mtf.dropout(w, rate=0.5)  # uses (and creates) the random step counter
  return {"layer/w": w, "layer/b": b, "e": e}, assigns


def _values(lowering, tensors):
  return {k: lowering.export_to_tf_tensor(v) for k, v in tensors.items()}


def _lower(impl, scale, autostack=True, read_after_assign=False):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  tensors, assigns = _build(mesh, scale)
  if read_after_assign:
    tensors = {k: mtf.read_variable(v, dependencies=assigns)
               for k, v in tensors.items()}
  lowering = mtf.Lowering(graph, {mesh: impl}, autostack=autostack)
  return lowering, tensors, assigns


def _train_and_save_tf2(mesh_shape, layout, path, mode):
  """Runs one scaling step and saves; returns the saved values."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)

  def step():
    lowering, tensors, _ = _lower(impl, 3.0, read_after_assign=True)
    return _values(lowering, tensors)

  if mode == "function":
    step = tf.function(step)
  values = tf.nest.map_structure(np.asarray, step())
  tf.train.Checkpoint(model=impl).write(path)
  return values


def _restore_tf2(mesh_shape, layout, path, mode, restore_first):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  checkpoint = tf.train.Checkpoint(model=impl)

  def read():
    lowering, tensors, _ = _lower(impl, 1.0)
    return _values(lowering, tensors)

  if mode == "function":
    read = tf.function(read)
  if restore_first:
    # Restored into variables the first lowering creates.
    checkpoint.restore(path).expect_partial()
  else:
    read()  # creates the variables from their initializers
    checkpoint.restore(path).expect_partial()
  return tf.nest.map_structure(np.asarray, read())


@pytest.mark.parametrize("restore_first", [True, False],
                         ids=["deferred", "existing"])
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("source,target", TRANSFERS, ids=TRANSFER_IDS)
def test_tf2_checkpoint_restores_under_another_layout(
    tmp_path, source, target, mode, restore_first):
  path = os.path.join(tmp_path, "ckpt")
  saved = _train_and_save_tf2(*source, path, mode)
  np.testing.assert_allclose(saved["layer/w"], W0 * 3, rtol=1e-6)
  restored = _restore_tf2(*target, path, mode, restore_first)
  for name in saved:
    np.testing.assert_array_equal(restored[name], saved[name], err_msg=name)


def test_tf2_checkpoint_keys_are_mtf_names_with_full_shapes(tmp_path):
  path = os.path.join(tmp_path, "ckpt")
  saved = _train_and_save_tf2("rows:2;cols:4", "io:rows;hidden:cols", path,
                              "function")
  shapes = dict(tf.train.list_variables(path))
  key = "model/{}/.ATTRIBUTES/VARIABLE_VALUE"
  assert shapes[key.format("layer/w")] == [8, 16]
  assert shapes[key.format("layer/b")] == [16]
  assert shapes[key.format("e")] == [4, 8, 16]
  assert shapes[key.format("mtf_random_step")] == []
  reader = tf.train.load_checkpoint(path)
  np.testing.assert_array_equal(reader.get_tensor(key.format("layer/w")),
                                saved["layer/w"])
  # Saved in the master dtype, not the bfloat16 slice dtype.
  assert reader.get_tensor(key.format("e")).dtype == np.float32
  loaded = mtf.storage.checkpointing.load_variables(path, prefix="model")
  assert sorted(loaded) == ["e", "layer/b", "layer/w", "mtf_random_step"]
  np.testing.assert_array_equal(loaded["layer/b"], saved["layer/b"])


def _saved_blocks(impl, *path):
  node = impl
  for part in path:
    node = node._lookup_dependency(part)  # pylint: disable=protected-access
  (factory,) = node._gather_saveables_for_checkpoint().values()  # pylint: disable=protected-access
  return {spec.slice_spec: spec for spec in factory("key").specs}


def test_saving_reads_slices_not_the_full_variable():
  """Each distinct block is written from the processor that holds it; no
  tensor of the variable's full size is made."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "rows:2;cols:4", "io:rows;hidden:cols")
  _lower(impl, 1.0)
  blocks = _saved_blocks(impl, "layer", "w")
  assert len(blocks) == 8
  assert {tuple(spec.tensor.shape) for spec in blocks.values()} == {(4, 4)}
  assert blocks["8 16 4,4:12,4"].device.endswith("CPU:7")
  # b is replicated over rows: 4 distinct blocks, read from row 0.
  blocks = _saved_blocks(impl, "layer", "b")
  specs = ["16 0,4", "16 4,4", "16 8,4", "16 12,4"]
  assert sorted(blocks) == sorted(specs)
  for pnum, spec in enumerate(specs):
    assert blocks[spec].device.endswith(f"CPU:{pnum}")
    assert blocks[spec].tensor.shape == (4,)


def _compat_save(mesh_shape, layout, path):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  with tf.Graph().as_default():
    lowering, tensors, assigns = _lower(impl, 5.0)
    train = [lowering.lowered_operation(a) for a in assigns]
    values = _values(lowering, tensors)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      sess.run(train)
      sess.run(lowering.copy_slices_to_masters())
      saver.save(sess, path)
      return sess.run(values)


def _compat_restore(mesh_shape, layout, path):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  with tf.Graph().as_default():
    lowering, tensors, _ = _lower(impl, 1.0)
    values = _values(lowering, tensors)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, path)
      sess.run(lowering.copy_masters_to_slices())
      return sess.run(values)


@pytest.mark.parametrize("source,target", TRANSFERS, ids=TRANSFER_IDS)
def test_compat_saver_restores_under_another_layout(tmp_path, source,
                                                     target):
  path = os.path.join(tmp_path, "model.ckpt")
  saved = _compat_save(*source, path)
  np.testing.assert_allclose(saved["layer/b"], B0 * 5, rtol=1e-6)
  shapes = dict(tf.train.list_variables(path))
  assert shapes["layer/w"] == [8, 16]
  assert shapes["e"] == [4, 8, 16]
  restored = _compat_restore(*target, path)
  for name in saved:
    np.testing.assert_array_equal(restored[name], saved[name], err_msg=name)
  loaded = mtf.storage.checkpointing.load_variables(path)
  np.testing.assert_array_equal(loaded["layer/w"], saved["layer/w"])


def test_restore_reports_a_shape_mismatch(tmp_path):
  path = os.path.join(tmp_path, "ckpt")
  _train_and_save_tf2("all:2", "hidden:all", path, "eager")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "hidden:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.get_variable(mesh, "layer/w", [("io", 4), ("hidden", 16)])
  mtf.Lowering(graph, {mesh: impl})
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                     match="layer"):
    tf.train.Checkpoint(model=impl).restore(path).expect_partial()
