"""The Transformer binary's main in a TF1-style program (a subprocess).

Usage: python -m tests.transformer.tf1_main_worker MODEL_DIR WORK_DIR

Disables v2 behaviour before anything else, as the original's main.py did,
then runs transformer.main on test_main's tiny model in each mode of
utils.run: train, eval, perplexity_eval, infer, score_from_strings,
score_from_dataset, export_infer and export_score. Writes what they
returned to WORK_DIR/results.json.
"""

import json
import os
import sys

import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

# pylint: disable=g-import-not-at-top,wrong-import-position
from tests import mtf_testing
from tests import this_checkout

this_checkout.import_transformer()
from tests.transformer import test_main
from tests.transformer.test_tf1_main import SCORE_INPUTS
from tests.transformer.test_tf1_main import SCORE_TARGETS


def main(model_dir, work_dir):
  mtf_testing.configure_logical_devices()
  assert not tf.executing_eagerly()
  run = lambda *params: test_main.run_main(model_dir, *params)
  run()  # Trains.
  results = {}
  results["eval"] = run("utils.run.mode = 'eval'",
                        "utils.run.dataset_split = 'validation'")
  results["perplexity_eval"] = run(
      "utils.run.mode = 'perplexity_eval'",
      "utils.run.dataset_split = 'validation'",
      "utils.run.perplexity_eval_steps = 4")
  inputs = os.path.join(work_dir, "inputs.txt")
  with open(inputs, "w") as f:
    f.write("1+2\n30+4\n5+67\n")
  run("utils.run.mode = 'infer'",
      f"decode_from_file.input_filename = '{inputs}'",
      f"decode_from_file.output_filename = "
      f"'{os.path.join(work_dir, 'decodes')}'")
  results["scores"] = run(
      "utils.run.mode = 'score_from_strings'",
      f"score_from_strings.inputs = {SCORE_INPUTS}",
      f"score_from_strings.targets = {SCORE_TARGETS}",
      f"save_scores.scores_filename = '{os.path.join(work_dir, 'scores')}'")
  results["dataset_scores"] = run(
      "utils.run.mode = 'score_from_dataset'",
      "utils.run.dataset_split = 'validation'",
      "score_from_dataset.score_dataset_fn = "
      "@embedded_task.addition_eval_dataset_fn",
      "save_scores.scores_filename = "
      f"'{os.path.join(work_dir, 'dataset_scores')}'")
  for mode in ("export_infer", "export_score"):
    results[mode] = run(
        f"utils.run.mode = '{mode}'",
        f"utils.run.export_path = '{os.path.join(work_dir, mode)}'")
  with open(os.path.join(work_dir, "results.json"), "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
