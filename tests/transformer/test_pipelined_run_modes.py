"""The binary's other modes with the pipelined gin it trained with.

The tiny LM of tests/transformer/test_pipelined_run.py trained 3 steps as
a PipelinedLayerStack of 4 stages on mesh stage:4 (its run "stage4", the
session fixture `pipelined_lm_run`); with the same gin the
binary then evaluates (decodes the held-out set), infers from a file,
with the decodes of the plain LayerStack model restored from the same
checkpoint, and exports a model that serves those decodes.
"""

import os

import numpy as np

import pytest
import tensorflow as tf

from tests.transformer import test_auto_layout_run
from tests.transformer import test_main
from tests.transformer import test_pipelined_run

STEPS = test_pipelined_run.STEPS
LM = test_pipelined_run.LM
PIPELINED = LM + test_pipelined_run.RUNS["stage4"]
PLAIN = LM + test_pipelined_run.RUNS["plain"]
FILES = test_auto_layout_run.LM_FILES
PROMPTS = "1+2\n30+4\n5+67\n"


def _run(model_dir, *params):
  return test_main.run_main(model_dir, *params, files=FILES)


@pytest.fixture(scope="module")
def trained(pipelined_lm_run):
  model_dir = pipelined_lm_run("stage4")["dir"]
  assert tf.train.latest_checkpoint(str(model_dir)).endswith(
      f"model.ckpt-{STEPS}")
  return model_dir


def _infer(model_dir, params, work):
  inputs = work / "inputs.txt"
  inputs.write_text(PROMPTS)
  output = work / "decodes"
  _run(model_dir, *params, "utils.run.mode = 'infer'",
       f"decode_from_file.input_filename = '{inputs}'",
       f"decode_from_file.output_filename = '{output}'")
  return (work / f"decodes-{STEPS}").read_text().splitlines()


@pytest.fixture(scope="module")
def decoded(trained, tmp_path_factory):
  """The pipelined gin's infer decodes (read only)."""
  return _infer(trained, PIPELINED, tmp_path_factory.mktemp("infer"))


def test_infer_decodes_like_the_plain_model(trained, decoded, tmp_path):
  assert len(decoded) == 3
  assert decoded == _infer(trained, PLAIN, tmp_path)


def test_eval_decodes_the_held_out_set(trained):
  """(Its decoding is the one infer mode runs, compared above.)"""
  results = _run(trained, *PIPELINED, "utils.run.mode = 'eval'",
                 "utils.run.dataset_split = 'validation'")
  assert set(results) == {STEPS}
  assert 0.0 <= results[STEPS]["addition/exact_match"] <= 1.0
  predictions = (trained / "validation_eval" /
                 f"addition_{STEPS}_predictions").read_text()
  assert len(predictions.splitlines()) == test_main.NUM_EVAL


def test_export_with_the_pipelined_gin_serves_its_decodes(trained, decoded,
                                                          tmp_path):
  export_dir = _run(trained, *PIPELINED, "utils.run.mode = 'export_infer'",
                    f"utils.run.export_path = '{tmp_path / 'export'}'")
  assert os.path.isdir(export_dir)
  served = tf.saved_model.load(export_dir).signatures["serving_default"]
  outputs = served(inputs=tf.constant(PROMPTS.split()))["outputs"]
  assert [o.decode(errors="replace") for o in outputs.numpy()] == decoded


def _perplexity(model_dir, params):
  # The training data (targets only, as an "lm" reads them).
  results = _run(model_dir, *params, "utils.run.mode = 'perplexity_eval'",
                 "utils.run.eval_dataset_fn = None",
                 "utils.run.perplexity_eval_steps = 2")
  metrics, = results[STEPS].values()
  return metrics


def test_perplexity_eval_is_the_plain_models(trained):
  """The teacher-forced evaluation runs pipelined, as training does."""
  metrics = _perplexity(trained, PIPELINED)
  plain = _perplexity(trained, PLAIN)
  assert metrics["neg_log_perplexity"] < 0
  for key in ("neg_log_perplexity", "token_accuracy", "num_eval_tokens"):
    np.testing.assert_allclose(metrics[key], plain[key], rtol=1e-5,
                               err_msg=key)
