"""Trains the toy model to a step count (run as a subprocess and killed).

Usage: python -m tests.estimator.kill_worker MODEL_DIR MAX_STEPS
"""

import sys

from tests import mtf_testing
from tests.estimator import toy_model

# tf_random_seed: the data's shuffle order depends on TF's global seed, which
# other tests in the same process may have set.
SETTINGS = dict(mesh_shape="all:2", layout="batch:all", tf_random_seed=5,
                save_checkpoints_steps=2, keep_checkpoint_max=3,
                log_step_count_steps=1000, save_summary_steps=1000,
                checkpoint_input_pipeline=True)


def main(model_dir, max_steps):
  toy_model.make_estimator(model_dir, **SETTINGS).train(
      toy_model.varying_input_fn, max_steps=max_steps)


if __name__ == "__main__":
  mtf_testing.configure_logical_devices()
  main(sys.argv[1], int(sys.argv[2]))
