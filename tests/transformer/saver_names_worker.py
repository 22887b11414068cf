"""What a TF1 `tf.compat.v1.train.Saver` of the binary's model writes
(a subprocess).

Usage: python -m tests.transformer.saver_names_worker MODEL_DIR SAVER_PREFIX
    [GIN_PARAM ...]

Disables v2 behaviour, as the original's main.py did, and trains
test_main's tiny model for one step with the binary (the estimator's graph
mode, which gives every mtf variable a master variable named like it, as
the original's lowering did). Once the graph is built and initialised, a
`tf.compat.v1.train.Saver` of its global variables, as the original's
TPUEstimator made, saves them to SAVER_PREFIX.
"""

import sys

import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

# pylint: disable=g-import-not-at-top,wrong-import-position
from tests import mtf_testing
from tests import this_checkout

this_checkout.import_transformer()
from mesh_tensorflow.estimator import graph_mode
from tests.transformer import test_main


def main(model_dir, saver_prefix, *params):
  mtf_testing.configure_logical_devices()
  start = graph_mode._Call.start  # pylint: disable=protected-access
  saved = []

  def start_and_save(call, *args, **kwargs):
    restored = start(call, *args, **kwargs)
    if not saved:
      with call.graph.as_default():
        saver = tf.compat.v1.train.Saver(sharded=True)
        saved.append(saver.save(call.session, saver_prefix))
    return restored

  graph_mode._Call.start = start_and_save  # pylint: disable=protected-access
  test_main.run_main(model_dir, *params)
  assert saved, "the binary built no graph-mode training call"


if __name__ == "__main__":
  main(*sys.argv[1:])
