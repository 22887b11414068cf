"""A configuration mistake ends a binary with one paragraph, never a
traceback: a table of mistakes run through the real binaries (the
Transformer's and the BERT ones), each checked for exit status 1, no
traceback and the binding or flag to fix named; --show_traceback and a
real bug still show the traceback.

One subprocess (config_errors_worker) imports TensorFlow once and runs each
command line in a child forked from it, through the binary's own entry
point: a subprocess per case would import TensorFlow once per case.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.bert import generated_data

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRANSFORMER = "mesh_tensorflow.transformer.main"
PRETRAINING = "mesh_tensorflow.bert.run_pretraining"
CLASSIFIER = "mesh_tensorflow.bert.run_classifier"
SQUAD = "mesh_tensorflow.bert.run_squad"
TRACEBACK = "Traceback (most recent call last)"

# Gin files written for the cases ({dir} is the case's directory).
GIN_FILES = {
    # The example: a TFDS dataset without its dataset_name.
    "tfds.gin": "utils.run.train_dataset_fn = "
                "@dataset.untokenized_tfds_dataset\n",
    "unknown_configurable.gin": "d_model = 16\nnosuch.thing = 3\n",
    "unknown_parameter.gin": "d_model = 16\nutils.run.train_stepz = 3\n",
}
MESH = ["--gin_param=utils.run.mesh_shape = 'batch:1'",
        "--gin_param=utils.run.layout_rules = ''"]
ADDITION = ["--gin_file=models/bi_base.gin",
            "--gin_file=problems/addition.gin"] + MESH


def _transformer(*args, files=ADDITION):
  return (TRANSFORMER,
          ["--model_dir={dir}/run", "--noprogress"] + files + list(args))


def _bert_common():
  return ["--bert_config_file={dir}/bert_config.json", "--output_dir={dir}/out",
          "--max_seq_length=32"]


# id: (binary and argv, a regex the message must match).
CASES = {
    "required_binding_of_a_dataset_fn": (
        _transformer("--gin_file={dir}/tfds.gin"),
        r"`dataset\.untokenized_tfds_dataset` \(which "
        r"`utils\.run\.train_dataset_fn` names\) needs values for "
        r"dataset_name, .*add `dataset\.untokenized_tfds_dataset\."
        r"dataset_name = \.\.\.`"),
    "required_binding_of_the_default_mesh_shape": (
        _transformer(files=ADDITION[:2]),
        r"`utils\.tpu_mesh_shape` \(which `utils\.run\.mesh_shape` names\) "
        r"needs a value for tpu_topology.*add "
        r"`utils\.tpu_mesh_shape\.tpu_topology = \.\.\.`"),
    "required_positional_parameter": (
        _transformer("--gin_param=utils.run.vocabulary = "
                     "@vocabulary.SentencePieceVocabulary()"),
        r"add `vocabulary\.SentencePieceVocabulary\."
        r"sentencepiece_model_file = \.\.\.`"),
    "no_vocabulary": (
        _transformer(files=["--gin_file=models/bi_base.gin"] + MESH),
        r"add `utils\.run\.vocabulary = "),
    "unknown_configurable_in_a_gin_file": (
        _transformer("--gin_file={dir}/unknown_configurable.gin"),
        r"No configurable matching 'nosuch'.*"
        r"unknown_configurable\.gin\", line 2"),
    "unknown_parameter_in_a_gin_file": (
        _transformer("--gin_file={dir}/unknown_parameter.gin"),
        r"'utils\.run' doesn't have a parameter named 'train_stepz'.*"
        r"unknown_parameter\.gin\", line 2"),
    "string_for_a_function_in_gin": (
        _transformer("--gin_param=utils.run.train_steps = 'many'"),
        r"`utils\.run\.train_steps = 'many'` is a string where a function "
        r"is expected"),
    "string_for_an_integer_in_gin": (
        _transformer("--gin_param=utils.run.iterations_per_loop = 'ten'"),
        r"`utils\.run\.iterations_per_loop = 'ten'` is a string where an "
        r"integer is expected"),
    "string_for_an_integer_flag": (
        _transformer("--task_index=abc"),
        r"--task_index=abc: invalid literal for int"),
    "glob_that_matches_nothing": (
        _transformer(
            "--gin_param=utils.run.train_dataset_fn = "
            "@dataset.packed_parallel_tsv_dataset",
            "--gin_param=dataset.packed_parallel_tsv_dataset.dataset = "
            "@dataset.simple_text_line_dataset()",
            "--gin_param=dataset.simple_text_line_dataset.glob = "
            "'{dir}/none/*.tsv'"),
        r"no files match '.*/none/\*\.tsv'.*set by "
        r"`dataset\.simple_text_line_dataset\.glob = "),
    "missing_sentencepiece_model": (
        _transformer("--gin_param=utils.run.vocabulary = "
                     "@vocabulary.SentencePieceVocabulary()",
                     "--gin_param=vocabulary.SentencePieceVocabulary."
                     "sentencepiece_model_file = '{dir}/no_such.model'"),
        r"no_such\.model.*set by `vocabulary\.SentencePieceVocabulary\."
        r"sentencepiece_model_file = "),
    "missing_module_to_import": (
        _transformer("--module_import=no_such_module_of_the_test"),
        r"--module_import=no_such_module_of_the_test: no module"),
    "bert_pretraining_glob_that_matches_nothing": (
        (PRETRAINING, _bert_common() + [
            "--mode=train", "--input_train_files={dir}/none/*.tfrecord"]),
        r"--input_train_files: '.*/none/\*\.tfrecord' matches no file"),
    "bert_pretraining_string_for_an_integer_flag": (
        (PRETRAINING, _bert_common() + ["--train_batch_size=many"]),
        r"--train_batch_size=many: invalid literal for int"),
    "bert_classifier_missing_vocab_file": (
        (CLASSIFIER, _bert_common() + [
            "--task_name=mrpc", "--do_train", "--data_dir={dir}",
            "--vocab_file={dir}/no_vocab.txt"]),
        r"no_vocab\.txt.*given by --vocab_file"),
    "bert_squad_missing_vocab_file": (
        (SQUAD, _bert_common() + [
            "--do_predict", "--predict_file={dir}/dev.json",
            "--max_query_length=8", "--vocab_file={dir}/no_vocab.txt"]),
        r"no_vocab\.txt.*given by --vocab_file"),
}

# Cases that must show the traceback (exit status 1 too).
TRACEBACK_CASES = {
    "show_traceback": (
        _transformer("--gin_file={dir}/tfds.gin", "--show_traceback"),
        r"add `dataset\.untokenized_tfds_dataset\.dataset_name = \.\.\.`"),
    "a_bug_in_an_imported_module": (
        _transformer("--module_import=buggy_module_of_the_test"),
        r"ZeroDivisionError"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """id -> (exit status, output) of every case, run by one worker."""
  directory = tmp_path_factory.mktemp("config_errors")
  for name, text in GIN_FILES.items():
    (directory / name).write_text(text)
  (directory / "buggy_module_of_the_test.py").write_text("x = 1 / 0\n")
  generated_data.write_config(directory / "bert_config.json")
  table = {**CASES, **TRACEBACK_CASES}
  cases = [[module, [a.format(dir=directory) for a in argv]]
           for (module, argv), _ in table.values()]
  cases_path = directory / "cases.json"
  cases_path.write_text(json.dumps(cases))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join(
                 [str(ROOT), str(directory), os.environ.get("PYTHONPATH", "")]))
  worker = subprocess.run(
      [sys.executable, "-m", "tests.transformer.config_errors_worker",
       str(cases_path), str(directory / "results.json")],
      env=env, cwd=ROOT, timeout=600, check=False, capture_output=True,
      text=True)
  assert worker.returncode == 0, worker.stderr[-3000:]
  outputs = json.loads((directory / "results.json").read_text())
  return dict(zip(table, outputs))


@pytest.mark.parametrize("case", sorted(CASES))
def test_mistake_is_one_paragraph_naming_the_fix(results, case):
  status, output = results[case]
  assert status == 1, output
  assert TRACEBACK not in output, output
  assert re.search(CASES[case][1], output), output
  if "FATAL Flags parsing error" not in output:
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: ") and re.search(CASES[case][1], last), (
        output)


@pytest.mark.parametrize("case", sorted(TRACEBACK_CASES))
def test_show_traceback_and_bugs_keep_the_traceback(results, case):
  status, output = results[case]
  assert status == 1, output
  assert TRACEBACK in output, output
  assert re.search(TRACEBACK_CASES[case][1], output), output
