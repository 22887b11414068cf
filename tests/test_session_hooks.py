"""MtfRestoreHook and MtfCheckpointSaverListener in a MonitoredSession."""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

W0 = np.arange(32, dtype=np.float32).reshape(4, 8)


def _program():
  """w starts at W0; each step adds 1. Returns (lowering, train op, w)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", "a:4,b:8", initializer=W0)
  update = mtf.assign_add(w, mtf.ones(mesh, "a:4,b:8"))
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:2",
                                                   "a:rows;b:cols")
  lowering = mtf.Lowering(graph, {mesh: impl})
  step = tf.compat.v1.train.get_or_create_global_step()
  train_op = tf.group(lowering.lowered_operation(update),
                      step.assign_add(1))
  return lowering, train_op, lowering.export_to_tf_tensor(w)


def test_hooks_save_and_restore_the_slices(tmp_path):
  checkpoint_dir = str(tmp_path)
  with tf.Graph().as_default():
    lowering, train_op, value = _program()
    saver_hook = tf.compat.v1.train.CheckpointSaverHook(
        checkpoint_dir, save_steps=1,
        listeners=[mtf.MtfCheckpointSaverListener(lowering)])
    creator = tf.compat.v1.train.ChiefSessionCreator(
        checkpoint_dir=checkpoint_dir)
    with tf.compat.v1.train.MonitoredSession(
        session_creator=creator,
        hooks=[mtf.MtfRestoreHook(lowering), saver_hook]) as sess:
      for _ in range(3):
        sess.run(train_op)
      np.testing.assert_array_equal(sess.run(value), W0 + 3)
  # The checkpoint holds the masters, filled from the slices before saving.
  saved = tf.train.load_checkpoint(checkpoint_dir)
  np.testing.assert_array_equal(saved.get_tensor("w"), W0 + 3)
  assert saved.get_tensor("global_step") == 3

  with tf.Graph().as_default():
    lowering, _, value = _program()
    creator = tf.compat.v1.train.ChiefSessionCreator(
        checkpoint_dir=checkpoint_dir)
    with tf.compat.v1.train.MonitoredSession(
        session_creator=creator,
        hooks=[mtf.MtfRestoreHook(lowering)]) as sess:
      # The restored masters, copied into the slices.
      np.testing.assert_array_equal(sess.run(value), W0 + 3)


def test_hooks_are_session_hooks():
  assert issubclass(mtf.MtfRestoreHook, tf.compat.v1.train.SessionRunHook)
  assert issubclass(mtf.MtfCheckpointSaverListener,
                    tf.compat.v1.train.CheckpointSaverListener)
