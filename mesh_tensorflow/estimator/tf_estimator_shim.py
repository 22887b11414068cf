"""A stand-in `tf.estimator` namespace, so that `import gin.tf` works on TF2.

TensorFlow 2.16 removed `tf.estimator`. gin-config's `gin.tf` still defines
`GinConfigSaverHook(tf.estimator.SessionRunHook)` when it is imported, so
`import gin.tf` fails with an AttributeError, and with it every program built
on the original Mesh TensorFlow's Transformer package (T5's `MtfModel` starts
with `import gin.tf`).

`install()` (called by `import mesh_tensorflow`) gives TensorFlow a small
`estimator` namespace only when it has none; a real `tf.estimator` is never
replaced. The namespace holds what stays meaningful without the TF1
Estimator:

- the session hooks that `tf.estimator` re-exported from
  `tf.compat.v1.train` (`SessionRunHook`, `SessionRunArgs`,
  `CheckpointSaverListener`, `StopAtStepHook`, ...): the very same classes;
- `ModeKeys` from `mesh_tensorflow.estimator`, whose values ("train", "eval",
  "infer") are tf.estimator's, so `tf.estimator.ModeKeys.TRAIN` keeps working.

`Estimator`, `EstimatorSpec`, `RunConfig` and the canned estimators are left
out on purpose: `mesh_tensorflow.estimator.Estimator` runs mtf model
functions only, and a plain TensorFlow model function handed to it under the
name `tf.estimator.Estimator` would fail far from the cause. Asking the
namespace for one of them raises an AttributeError that says so.
"""

import importlib
import sys
import types

import tensorflow as tf

from mesh_tensorflow.estimator.mode_keys import ModeKeys

# tf.estimator's own names for tf.compat.v1.train's session hooks.
_HOOK_NAMES = (
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "FeedFnHook",
    "FinalOpsHook",
    "GlobalStepWaiterHook",
    "LoggingTensorHook",
    "NanLossDuringTrainingError",
    "NanTensorHook",
    "ProfilerHook",
    "SecondOrStepTimer",
    "SessionRunArgs",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "StepCounterHook",
    "StopAtStepHook",
    "SummarySaverHook",
)

# Set on the stand-in module, so that it can be told from a real one.
SHIM_MARKER = "_mesh_tensorflow_tf_estimator_shim"

_MODULE_NAME = "tensorflow.estimator"


def _missing_name(name):
  """Module-level __getattr__: names the stand-in does not provide."""
  if name.startswith("__"):
    raise AttributeError(name)
  raise AttributeError(
      f"tf.estimator.{name} is not available: TensorFlow {tf.__version__} "
      "has no tf.estimator, and the stand-in installed by mesh_tensorflow "
      "only holds the session hooks and ModeKeys (enough for gin.tf). For "
      "mtf model functions use mesh_tensorflow.estimator."
      f"{name if name in _MTF_ESTIMATOR_NAMES else 'Estimator'}.")


_MTF_ESTIMATOR_NAMES = ("Estimator", "EstimatorSpec", "RunConfig",
                        "TPUEstimator", "TPUEstimatorSpec", "TPUConfig")


def build_namespace():
  """Returns a new stand-in `tf.estimator` module (not installed)."""
  module = types.ModuleType(_MODULE_NAME, __doc__.split("\n", 1)[0])
  for name in _HOOK_NAMES:
    value = getattr(tf.compat.v1.train, name, None)
    if value is not None:
      setattr(module, name, value)
  module.ModeKeys = ModeKeys
  module.__getattr__ = _missing_name
  setattr(module, SHIM_MARKER, True)
  return module


def _has_estimator(namespace):
  try:
    return getattr(namespace, "estimator", None) is not None
  except ImportError:  # A lazy loader that finds no module says so this way.
    return False


def _namespaces():
  """Every module object a program may reach as `tf`, `tf.compat.v1`, ...

  `tf.compat.v1` read as an attribute, `import tensorflow.compat.v1` and the
  module it wraps are distinct objects, so each gets the namespace.
  """
  found = [tf, tf.compat.v1, tf.compat.v2]
  for name in ("tensorflow.compat.v1", "tensorflow.compat.v2"):
    try:
      found.append(importlib.import_module(name))
    except ImportError:
      pass
  for module in list(found):
    wrapped = module.__dict__.get("_tfmw_wrapped_module")
    if wrapped is not None:
      found.append(wrapped)
  unique = []
  for module in found:
    if all(module is not seen for seen in unique):
      unique.append(module)
  return unique


def install():
  """Gives `tf`, `tf.compat.v1` and `tf.compat.v2` a stand-in estimator.

  It is also importable as the module `tensorflow.estimator`.

  Does nothing for a namespace that already has an `estimator` (a real
  tf.estimator on an older TensorFlow, or a stand-in installed before), so
  calling it again is harmless.

  Returns:
    the namespace now at `tf.estimator` (real or stand-in).
  """
  shim = None
  for namespace in _namespaces():
    if _has_estimator(namespace):
      continue
    if shim is None:
      shim = build_namespace()
    setattr(namespace, "estimator", shim)
  if shim is not None:
    # So that `from tensorflow.estimator import SessionRunHook` works too.
    sys.modules.setdefault(_MODULE_NAME, shim)
  return tf.estimator


def is_shim(module):
  """True if `module` is the stand-in this file installs."""
  return bool(getattr(module, "__dict__", {}).get(SHIM_MARKER, False))
