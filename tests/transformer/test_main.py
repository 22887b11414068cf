"""The training binary end to end on a tiny model: every mode of utils.run
through transformer.main, and its errors.

main runs in this process (flags and gin reset between calls); the test of
the exit status runs the real binary in a subprocess.
"""

import logging
import os
import pathlib
import re
import subprocess
import sys

from absl import flags
import gin
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.transformer.data import embedded_task
from mesh_tensorflow.transformer import main as main_lib
from mesh_tensorflow.transformer import utils

FLAGS = flags.FLAGS
ROOT = pathlib.Path(__file__).resolve().parents[2]
NUM_EVAL = 12
TRAIN_STEPS = 6

TINY = [
    "d_model = 16", "d_ff = 32", "num_heads = 2", "d_kv = 8",
    "num_layers = 1", "dropout_rate = 0.0",
    "Unitransformer.max_length = 8",
    "max_digits = 2",
    "utils.get_variable_dtype.activation_dtype = 'float32'",
    "utils.serialize_num_microbatches.tokens_per_microbatch_per_replica = "
    "None",
    f"embedded_task.addition_eval_dataset_fn.num_eval_examples = {NUM_EVAL}",
    "utils.run.mesh_shape = 'batch:2;model:2'",
    "utils.run.layout_rules = 'batch:batch,d_ff:model,heads:model,"
    "vocab:model'",
    "utils.run.batch_size = ('sequences_per_batch', 8)",
    f"utils.run.train_steps = {TRAIN_STEPS}",
    "utils.run.iterations_per_loop = 3",
    "utils.run.save_checkpoints_steps = 3",
    "utils.run.learning_rate_schedule = 0.01",
    "utils.run.eval_checkpoint_step = 'latest'",
]
GIN_FILES = ["models/bi_base.gin", "problems/addition.gin"]


def _argv(model_dir, params=(), files=GIN_FILES):
  argv = ["main", f"--model_dir={model_dir}", "--noprogress"]
  argv += [f"--gin_file={f}" for f in files]
  argv += [f"--gin_param={p}" for p in TINY + list(params)]
  return argv


def run_main(model_dir, *params, files=GIN_FILES, with_errors=False,
             extra_flags=()):
  """Runs the binary's main in this process; returns what utils.run did."""
  FLAGS.unparse_flags()
  argv = FLAGS(_argv(model_dir, params, files) + list(extra_flags))
  gin.clear_config()
  try:
    if with_errors:
      return main_lib.main_with_errors(argv)
    return main_lib.main(argv)
  finally:
    gin.clear_config()
    FLAGS.unparse_flags()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("run")
  run_main(model_dir)
  return model_dir


def test_train_writes_checkpoints_command_and_config(trained):
  names = os.listdir(trained)
  assert "model.ckpt-3.index" in names and "model.ckpt-6.index" in names
  assert tf.train.latest_checkpoint(str(trained)).endswith("model.ckpt-6")
  assert "--gin_file=problems/addition.gin" in (trained / "command").read_text()
  config = (trained / "operative_config.gin").read_text()
  assert "run.train_steps = 6" in config
  assert "d_model = 16" in config  # Read while the model was built.
  assert "max_digits = 2" in config
  assert "addition_train_dataset_fn.max_digits = %max_digits" in config
  # Clients (e.g. T5) re-parse it for eval, inference and export.
  gin.clear_config()
  gin.parse_config_file(str(trained / "operative_config.gin"))
  assert gin.query_parameter("utils.run.train_steps") == TRAIN_STEPS
  gin.clear_config()
  assert any(n.startswith("events.out.tfevents") for n in names)


def test_train_again_resumes_and_stops_at_train_steps(trained):
  run_main(trained, f"utils.run.train_steps = {TRAIN_STEPS}")
  assert tf.train.latest_checkpoint(str(trained)).endswith("model.ckpt-6")
  assert (trained / "command.1").exists()


def test_eval_decodes_held_out_set_and_writes_metrics(trained):
  results = run_main(trained, "utils.run.mode = 'eval'",
                     "utils.run.dataset_split = 'validation'")
  assert set(results) == {TRAIN_STEPS}
  metrics = results[TRAIN_STEPS]
  assert 0.0 <= metrics["addition/exact_match"] <= 1.0
  eval_dir = trained / "validation_eval"
  predictions = (eval_dir / f"addition_{TRAIN_STEPS}_predictions").read_text()
  targets = (eval_dir / "addition_targets").read_text()
  assert len(predictions.splitlines()) == len(targets.splitlines()) == NUM_EVAL
  inputs = (eval_dir / "addition_inputs").read_text().splitlines()
  assert all("+" in line for line in inputs)


def test_perplexity_eval_weighs_padding_nothing(trained):
  results = run_main(trained, "utils.run.mode = 'perplexity_eval'",
                     "utils.run.dataset_split = 'validation'",
                     "utils.run.perplexity_eval_steps = 4")
  metrics = results[TRAIN_STEPS]["addition"]
  # 12 examples in 4 batches of 8: 20 padding examples that count nothing.
  eval_dataset, = embedded_task.addition_eval_dataset_fn(
      {"inputs": 8, "targets": 8}, embedded_task.addition_vocabulary(),
      num_eval_examples=NUM_EVAL, max_digits=2)
  target_tokens = sum(int(np.count_nonzero(ex["targets"]))
                      for ex in eval_dataset.dataset_fn().as_numpy_iterator())
  assert metrics["num_eval_tokens"] == target_tokens
  assert 0.0 <= metrics["token_accuracy"] <= 1.0
  assert metrics["neg_log_perplexity"] < 0


@pytest.fixture(scope="module")
def decoded(trained, tmp_path_factory):
  """The lines infer mode writes for three inputs (read-only: shared by the
  test of infer and the test that the export decodes the same)."""
  work = tmp_path_factory.mktemp("infer")
  inputs = work / "inputs.txt"
  inputs.write_text("1+2\n30+4\n5+67\n")
  output = work / "decodes"
  run_main(trained, "utils.run.mode = 'infer'",
           f"decode_from_file.input_filename = '{inputs}'",
           f"decode_from_file.output_filename = '{output}'")
  return (work / f"decodes-{TRAIN_STEPS}").read_text().splitlines()


def test_infer_from_file(decoded):
  assert len(decoded) == 3


def test_infer_waiting_for_checkpoints_says_so(trained, tmp_path, caplog):
  """eval_checkpoint_step None (the original's default): decode, then say
  that it waits for new checkpoints and how to stop; the timeout ends it."""
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("1+2\n")
  output = tmp_path / "decodes"
  # INFO, as the binary logs by default under app.run (pytest's absl
  # defaults to WARNING).
  caplog.set_level(logging.INFO)
  run_main(trained, "utils.run.mode = 'infer'",
           "utils.run.eval_checkpoint_step = None",
           "utils.get_checkpoint_iterator.timeout = 0.5",
           f"decode_from_file.input_filename = '{inputs}'",
           f"decode_from_file.output_filename = '{output}'",
           extra_flags=["--verbosity=0"])
  assert (tmp_path / f"decodes-{TRAIN_STEPS}").read_text().splitlines()
  messages = [r.getMessage() for r in caplog.records]
  (waiting,) = [m for m in messages if "Waiting for new checkpoints" in m]
  assert f"model.ckpt-{TRAIN_STEPS}" in waiting and str(trained) in waiting
  assert 'utils.run.eval_checkpoint_step = "latest"' in waiting
  assert any(m.startswith(f"No new checkpoint in {trained} for") and
             m.endswith("done.") for m in messages), messages[-5:]


@pytest.fixture(scope="module")
def scored(trained, tmp_path_factory):
  """(scores, targets, the folder save_scores wrote to) of score_from_strings
  on two examples (read-only: shared by the test of that mode and the test
  that the score export serves the same)."""
  work = tmp_path_factory.mktemp("score")
  scores, targets = run_main(
      trained, "utils.run.mode = 'score_from_strings'",
      "score_from_strings.inputs = ['1+2', '30+4']",
      "score_from_strings.targets = ['3', '34']",
      f"save_scores.scores_filename = '{work / 'scores'}'")
  return scores, targets, work


def test_score_from_strings(scored):
  # As the original: (scores, targets), the scores written with "%g", the
  # targets' lengths (tokens before padding: the bytes and EOS).
  scores, targets, tmp_path = scored
  assert len(scores) == 2 and all(s < 0 for s in scores)
  assert targets == ["3", "34"]
  assert sorted(os.listdir(tmp_path)) == [
      "scores.lengths", "scores.scores", "scores.targets"]
  assert (tmp_path / "scores.scores").read_text().splitlines() == [
      "%g" % s for s in scores]
  assert (tmp_path / "scores.lengths").read_text().splitlines() == ["2", "3"]
  assert (tmp_path / "scores.targets").read_text().splitlines() == ["3", "34"]


def test_export_and_serve_one_request(trained, decoded, tmp_path):
  export_dir = run_main(trained, "utils.run.mode = 'export_infer'",
                        f"utils.run.export_path = '{tmp_path / 'export'}'")
  assert os.path.isdir(export_dir)
  served = tf.saved_model.load(export_dir).signatures["serving_default"]
  # Inputs of different lengths, fewer than the batch.
  outputs = served(inputs=tf.constant(["1+2", "30+4", "5+67"]))["outputs"]
  assert outputs.shape == [3] and outputs.dtype == tf.string
  # The export decodes as the estimator does (on the same three inputs).
  assert [o.decode(errors="replace") for o in outputs.numpy()] == decoded


@pytest.mark.parametrize("params, files, message", [
    ((), GIN_FILES + ["models/no_such_model.gin"],
     r"Gin file 'models/no_such_model.gin' not found"),
    (("utils.run.train_stepz = 3",), GIN_FILES,
     r"doesn't have a parameter named 'train_stepz'"),
    (("utils.run.mesh_shape = 'batch:3'",
      "utils.run.layout_rules = 'batch:batch'"), GIN_FILES,
     r"batch.*3"),
    # This process has 8 logical CPUs: a 16-processor mesh stops at once.
    (("utils.run.mesh_shape = 'x:4;y:4'",), GIN_FILES,
     r"16 processors .* 8 CPU device\(s\) \(.*CPU:0, .*CPU:7\)"),
])
def test_bad_input_gives_one_paragraph_and_exit_1(tmp_path, capsys, params,
                                                   files, message):
  with pytest.raises(SystemExit) as exit_info:
    run_main(tmp_path / "run", *params, files=files, with_errors=True)
  assert exit_info.value.code == 1
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert error.startswith("error: ")
  assert re.search(message, error), error
  assert "Traceback" not in capsys.readouterr().err


def test_unreadable_checkpoint_is_named(trained, tmp_path, capsys):
  broken = tmp_path / "broken"
  broken.mkdir()
  for name in os.listdir(trained):
    if name.startswith(("model.ckpt-6", "checkpoint")):
      data = (trained / name).read_bytes()
      if name.endswith(".index"):
        data = data[:len(data) // 2]  # Truncated.
      (broken / name).write_bytes(data)
  with pytest.raises(SystemExit):
    run_main(broken, "utils.run.mode = 'export_infer'",
             f"utils.run.export_path = '{tmp_path / 'export'}'",
             with_errors=True)
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert "model.ckpt-6" in error, error


def test_binary_exit_status(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get(
                 "PYTHONPATH", ""))
  argv = _argv(tmp_path, files=["models/no_such.gin"])
  result = subprocess.run(
      [sys.executable, "-m", "mesh_tensorflow.transformer.main"] + argv[1:],
      capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
      check=False)
  assert result.returncode == 1
  assert "error: ValueError: Gin file 'models/no_such.gin' not found" in (
      result.stderr)
  assert "Traceback" not in result.stderr


def test_gin_file_lookup_order(tmp_path):
  own = tmp_path / "models"
  own.mkdir()
  (own / "mine.gin").write_text("")
  assert utils.find_gin_file("models/mine.gin", [str(tmp_path)]) == str(
      own / "mine.gin")
  assert utils.find_gin_file("models/tiny", [utils.gin_dir()]).endswith(
      "models/tiny.gin")


def _readme_gin_params():
  """The --gin_param bindings of the README's "Other data" commands and of
  docs/transformer_binary.md's (the language model on lm1b)."""
  params = []
  for path, start, end in (
      ("README.md", "**Other data.**", "**Checkpoints of the original**"),
      ("docs/transformer_binary.md", "\n## Other data\n", "\n## ")):
    text = (ROOT / path).read_text()
    begin = text.index(start)
    section = text[begin:text.index(end, begin + len(start))]
    params += re.findall(r'--gin_param="([^"]+)"', section)
  return params


def test_readme_dataset_bindings_parse():
  params = _readme_gin_params()
  assert len(params) >= 8
  assert "utils.run.model_type = 'lm'" in params
  gin.clear_config()
  try:
    gin.parse_config_file(os.path.join(utils.gin_dir(), "defaults.gin"))
    for param in params:
      gin.parse_config(param)
  finally:
    gin.clear_config()


def test_score_from_dataset(trained, tmp_path):
  prefix = tmp_path / "scores"
  scores, targets = run_main(
      trained, "utils.run.mode = 'score_from_dataset'",
      "utils.run.dataset_split = 'validation'",
      "score_from_dataset.score_dataset_fn = "
      "@embedded_task.addition_eval_dataset_fn",
      f"save_scores.scores_filename = '{prefix}'")
  assert len(scores) == len(targets) == NUM_EVAL  # Padding dropped.
  assert all(s < 0 for s in scores)
  eval_dataset, = embedded_task.addition_eval_dataset_fn(
      {"inputs": 8, "targets": 8}, embedded_task.addition_vocabulary(),
      num_eval_examples=NUM_EVAL, max_digits=2)
  assert targets == [
      ex["targets_pretokenized"].decode()
      for ex in eval_dataset.dataset_fn().as_numpy_iterator()]
  assert (tmp_path / "scores.targets").read_text().splitlines() == targets


def test_export_score_serves_log_likelihoods(trained, scored, tmp_path):
  export_dir = run_main(trained, "utils.run.mode = 'export_score'",
                        f"utils.run.export_path = '{tmp_path / 'export'}'")
  served = tf.saved_model.load(export_dir).signatures["serving_default"]
  scores = served(inputs=tf.constant(["1+2", "30+4"]),
                  targets=tf.constant(["3", "34"]))["scores"].numpy()
  expected, _, _ = scored  # score_from_strings on the same examples
  np.testing.assert_allclose(scores, expected, rtol=1e-4)
