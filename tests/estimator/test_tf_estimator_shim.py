"""`import mesh_tensorflow` lets gin-config's `gin.tf` import on TF 2.16+.

The import-order cases run in fresh interpreters: once a process has
imported mesh_tensorflow, tf.estimator is there for good.
"""

import pathlib
import subprocess
import sys
import types

import pytest
import tensorflow as tf

import mesh_tensorflow  # pylint: disable=unused-import
from mesh_tensorflow.estimator import ModeKeys
from mesh_tensorflow.estimator import tf_estimator_shim

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def _run(code):
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, cwd=ROOT, timeout=300, check=False)


_GIN_TF_AFTER_MTF = r"""
import os, sys, tempfile
import mesh_tensorflow
assert mesh_tensorflow.__file__.startswith(os.getcwd())
import gin
import gin.tf
import gin.tf.external_configurables
import tensorflow as tf
import tensorflow.compat.v1 as tf1

@gin.configurable
def scale(factor=1.0):
  return factor

gin.parse_config("scale.factor = 3.0")
assert scale() == 3.0
out = tempfile.mkdtemp()
# As a MonitoredSession would: in a graph, with the global step in it.
with tf1.Graph().as_default():
  tf1.train.get_or_create_global_step()
  hook = gin.tf.GinConfigSaverHook(out, include_step_in_filename=False)
  assert isinstance(hook, tf.estimator.SessionRunHook)
  with tf1.Session() as session:
    session.run(tf1.global_variables_initializer())
    hook.after_create_session(session, None)
text = open(os.path.join(out, "operative_config.gin")).read()
assert "scale.factor = 3.0" in text, text
assert any(f.startswith("events.out") for f in os.listdir(out))
from tensorflow.estimator import SessionRunHook
assert SessionRunHook is tf1.train.SessionRunHook
print(tf.estimator.ModeKeys.TRAIN, tf1.estimator.ModeKeys.PREDICT)
"""


def test_gin_tf_imports_after_mesh_tensorflow_and_saves_config():
  result = _run(_GIN_TF_AFTER_MTF)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split()[-2:] == ["train", "infer"]


def test_gin_tf_imports_after_mesh_tensorflow_transformer():
  # tests.conftest imports mesh_tensorflow.transformer from this checkout.
  result = _run("import tests.conftest\nimport gin.tf\n"
                "print(gin.tf.GinConfigSaverHook('/tmp')._base_name)")
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split()[-1] == "operative_config"


def test_gin_tf_alone_still_fails_on_this_tensorflow():
  """Documents why the README says: import mesh_tensorflow first."""
  if hasattr(tf, "estimator") and not tf_estimator_shim.is_shim(
      tf.estimator):
    pytest.skip("this TensorFlow has a real tf.estimator")
  result = _run("import gin.tf")
  assert result.returncode != 0
  assert "estimator" in result.stderr


def test_namespace_holds_hooks_and_mode_keys():
  assert tf_estimator_shim.is_shim(tf.estimator)
  assert tf.estimator.ModeKeys is ModeKeys
  assert tf.estimator.SessionRunHook is tf.compat.v1.train.SessionRunHook
  assert (tf.estimator.CheckpointSaverListener
          is tf.compat.v1.train.CheckpointSaverListener)
  assert tf.estimator.StopAtStepHook is tf.compat.v1.train.StopAtStepHook
  assert tf.compat.v1.estimator is tf.estimator
  assert tf.compat.v2.estimator is tf.estimator


def test_missing_names_say_where_to_go():
  with pytest.raises(AttributeError,
                     match=r"tf\.estimator\.RunConfig.*"
                     r"mesh_tensorflow\.estimator\.RunConfig"):
    tf.estimator.RunConfig  # pylint: disable=pointless-statement
  with pytest.raises(AttributeError,
                     match=r"tf\.estimator\.DNNClassifier.*"
                     r"mesh_tensorflow\.estimator\.Estimator"):
    tf.estimator.DNNClassifier  # pylint: disable=pointless-statement
  assert not hasattr(tf.estimator, "Estimator")


def test_install_never_replaces_an_existing_estimator(monkeypatch):
  real = types.ModuleType("tensorflow.estimator")
  with_one = types.SimpleNamespace(estimator=real)
  without = types.SimpleNamespace()
  monkeypatch.setattr(tf_estimator_shim, "_namespaces",
                      lambda: [with_one, without])
  tf_estimator_shim.install()
  assert with_one.estimator is real
  assert tf_estimator_shim.is_shim(without.estimator)
  installed = without.estimator
  tf_estimator_shim.install()  # Again: nothing changes.
  assert without.estimator is installed
  assert not tf_estimator_shim.is_shim(real)
