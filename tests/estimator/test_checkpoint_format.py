"""The estimator's checkpoints are the original's: name-based, readable by
a TF1 `tf.compat.v1.train.Saver`, restored under any layout; the
object-based ones of earlier versions still restore, with one notice.
"""

import logging
import os

from absl import logging as absl_logging
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-direct-tensorflow-import

import mesh_tensorflow as mtf
from tests.estimator import toy_model

SHAPES = {"hidden/kernel": [toy_model.IO, toy_model.HIDDEN],
          "hidden/bias": [toy_model.HIDDEN],
          "out/kernel": [toy_model.HIDDEN, toy_model.IO],
          "out/bias": [toy_model.IO]}


def _assert_close(a, b):
  """Equal to round-off (a layout changes the order of reductions)."""
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _predictions(est):
  return np.concatenate([p["out"][None] for p in est.predict(
      toy_model.predict_input_fn)])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  est = toy_model.make_estimator(tmp_path_factory.mktemp("run"))
  est.train(toy_model.input_fn, steps=2)
  return est


def test_keys_are_mtf_names_with_master_dtypes_and_an_int64_step(trained):
  path = trained.latest_checkpoint()
  listing = dict(tf.train.list_variables(path))
  # The sampling counter of the dropout comes along (the original had none).
  assert listing == dict(SHAPES, global_step=[], mtf_random_step=[])
  reader = tf.train.load_checkpoint(path)
  dtypes = reader.get_variable_to_dtype_map()
  assert dtypes["global_step"] == tf.int64
  assert all(dtypes[name] == tf.float32 for name in SHAPES)
  assert reader.get_tensor("global_step") == 2


def test_a_tf1_saver_restores_them(trained):
  path = trained.latest_checkpoint()
  graph = tf.Graph()
  with graph.as_default():
    variables = {name: tf.compat.v1.get_variable(name, shape)
                 for name, shape in SHAPES.items()}
    step = tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      saver.restore(session, path)
      values = session.run(variables)
      assert session.run(step) == 2
  for name, value in values.items():
    np.testing.assert_array_equal(value, trained.get_variable_value(name))


def test_another_layout_restores_them(trained):
  other = toy_model.make_estimator(trained.model_dir, mesh_shape="all:2",
                                   layout="hidden:all")
  _assert_close(_predictions(other), _predictions(trained))


def _write_object_based(model_dir, values, step):
  """A checkpoint as earlier versions wrote it: tf.train.Checkpoint of the
  mesh implementation (under "model") and of the step."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "io:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  for name, value in values.items():
    dims = ["io", "hidden"] if name == "hidden/kernel" else (
        ["hidden", "io"] if name == "out/kernel" else [name.split("/")[0]])
    dims = [mtf.Dimension("io" if d == "out" else d, n)
            for d, n in zip(dims, value.shape)]
    mtf.get_variable(mesh, name, dims,
                     initializer=tf.constant_initializer(value))
  mtf.Lowering(graph, {mesh: impl})
  tf.io.gfile.makedirs(model_dir)
  path = tf.train.Checkpoint(
      model=impl, global_step=tf.Variable(step, dtype=tf.int64)).write(
          os.path.join(model_dir, f"model.ckpt-{step}"))
  checkpoint_management.update_checkpoint_state_internal(
      model_dir, os.path.basename(path))
  return path


def test_object_based_checkpoint_restores_with_one_notice(trained, tmp_path,
                                                          caplog):
  values = {name: trained.get_variable_value(name) for name in SHAPES}
  path = _write_object_based(str(tmp_path), values, 7)
  assert "model/out/kernel/.ATTRIBUTES/VARIABLE_VALUE" in dict(
      tf.train.list_variables(path))
  old = toy_model.make_estimator(tmp_path, mesh_shape="all:2",
                                 layout="hidden:all")
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  try:
    with caplog.at_level(logging.INFO):
      first = _predictions(old)
      again = _predictions(old)
  finally:
    absl_logging.set_verbosity(verbosity)
  notices = [r for r in caplog.records if "object-based" in r.getMessage()]
  assert len(notices) == 1, [r.getMessage() for r in notices]
  assert path in notices[0].getMessage()
  expected = _predictions(trained)
  _assert_close(first, expected)
  np.testing.assert_array_equal(again, first)

  # Training on writes the original's names, the step carried over.
  old.train(toy_model.input_fn, steps=1)
  latest = old.latest_checkpoint()
  assert latest.endswith("model.ckpt-8")
  names = {name for name, _ in tf.train.list_variables(latest)}
  assert names == set(SHAPES) | {"global_step", "mtf_random_step"}
