"""Imports OR-tools' CP-SAT only when a layout search runs.

OR-tools is the optional extra `auto_mtf` (pip install
"mesh-tensorflow-tf2[auto_mtf]"), so `import mesh_tensorflow` and
`import mesh_tensorflow.auto_mtf` work without it; a search without it
raises an ImportError that names the extra. OR-tools 9.15 crashes the
process (a segmentation fault in CpSolver.solve) once TensorFlow 2.21 is
loaded, so it is refused with the same kind of error instead.
"""

import importlib
import sys

EXTRA_HINT = ('pip install "mesh-tensorflow-tf2[auto_mtf]" (which installs '
              '"ortools>=9.14,<9.15")')
_CRASHING_RELEASES = ("9.15.",)


def cp_model_module():
  """The `ortools.sat.python.cp_model` module.

  Raises:
    ImportError: OR-tools is missing, or is a release known to crash next
      to TensorFlow; the message names the extra to install.
  """
  try:
    cp_model = importlib.import_module("ortools.sat.python.cp_model")
  except ImportError as e:
    raise ImportError(
        f"the layout search needs OR-tools: {EXTRA_HINT} ({e}).") from e
  version = getattr(sys.modules.get("ortools"), "__version__", "")
  if version.startswith(_CRASHING_RELEASES):
    raise ImportError(
        f"OR-tools {version} crashes (segmentation fault) in a process that "
        f"has loaded TensorFlow; {EXTRA_HINT}.")
  return cp_model
