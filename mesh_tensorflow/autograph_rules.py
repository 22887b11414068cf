"""Keeps tf.function's autograph from converting this library.

Programs build and lower mtf graphs inside `tf.function`s, usually with
autograph on. Autograph would otherwise rewrite every library function it
reaches (lowering, slice arithmetic, every op) on every trace: tracing the
README's MLP took 2.8 s instead of 0.5 s. The library's Python control flow is
about shapes and layouts, never about tensor values, so converting it buys
nothing. TensorFlow keeps such rules for its own packages; this adds one for
`mesh_tensorflow`.
"""

from absl import logging

try:
  # TensorFlow's private autograph configuration: present in every TF 2
  # release so far, but not a public API, so it may go.
  from tensorflow.python.autograph.core import config  # pylint: disable=g-direct-tensorflow-import
except ImportError:  # pragma: no cover - depends on the TF version
  config = None


def register():
  """Adds a do-not-convert rule for the `mesh_tensorflow` package."""
  if config is None:  # pragma: no cover - depends on the TF version
    logging.warning("Could not register mesh_tensorflow with autograph; "
                    "tracing inside tf.function will be slower.")
    return
  rule = config.DoNotConvert("mesh_tensorflow")
  if not any(getattr(r, "_prefix", None) == "mesh_tensorflow"
             for r in config.CONVERSION_RULES):
    config.CONVERSION_RULES = (rule,) + tuple(config.CONVERSION_RULES)
