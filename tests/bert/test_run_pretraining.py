"""Tests of the pretraining binary, on the shared pretraining run.

The run (tests/bert/conftest.py) pretrains the tiny config on `batch:8`
for TRAIN_STEPS steps on records that create_pretraining_data made from
the generated corpus, evaluating on held-out records at step 0 (a
--do_eval of the initial weights) and at the end (train_and_eval). What
a run with the fixed seeds gave (held-out records, 17 batches of 32):

  step  masked_lm_accuracy  masked_lm_loss  next_sentence_accuracy / loss
  0     0.011               5.65            0.40 / 0.83
  300   0.399               2.70            0.63 / 0.65

against chance 1/127 = 0.008 and 0.227 for always guessing the most
frequent masked token of the training records ("the").
"""

import re
import shutil
import sys

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.bert import run_common
from mesh_tensorflow.bert import run_pretraining
from tests.bert import conftest
from tests.bert import generated_data

FLAGS = flags.FLAGS


def test_masked_lm_accuracy_rises_above_chance_and_baseline(
    pretraining_run):
  start = pretraining_run["evals"][0]
  end = pretraining_run["evals"][conftest.TRAIN_STEPS]
  baselines = pretraining_run["baselines"]
  assert baselines["chance"] == pytest.approx(1 / 127)
  assert 0.15 < baselines["most_frequent"] < 0.3
  # Observed: 0.011 at step 0, 0.399 at the end, baseline 0.227.
  assert start["masked_lm_accuracy"] < baselines["most_frequent"] - 0.1
  assert end["masked_lm_accuracy"] > baselines["most_frequent"] + 0.1
  assert end["masked_lm_accuracy"] > start["masked_lm_accuracy"] + 0.25
  assert end["masked_lm_loss"] < start["masked_lm_loss"] - 2.0
  assert end["next_sentence_loss"] < start["next_sentence_loss"]
  assert end["loss"] < start["loss"]


def test_one_step_at_learning_rate_zero_keeps_initial_weights(
    pretraining_run):
  # The step-0 evaluation evaluates model.ckpt-1: warm-up starts at 0.
  assert pretraining_run["evals"][0]["global_step"] == 1
  reader = tf.train.load_checkpoint(
      f"{pretraining_run['model_dir']}/model.ckpt-1")
  names = [n for n in reader.get_variable_to_shape_map()
           if n.endswith(("/bias", "/scale")) and "adam" not in n]
  assert len(names) > 20
  for name in names:
    expected = 1.0 if name.endswith("/scale") else 0.0
    np.testing.assert_array_equal(reader.get_tensor(name), expected,
                                  err_msg=name)


def test_train_and_eval_writes_eval_results_and_checkpoint(pretraining_run):
  model_dir = pretraining_run["model_dir"]
  last = f"{model_dir}/eval_results_{conftest.TRAIN_STEPS}.txt"
  with open(last) as f, open(f"{model_dir}/eval_results.txt") as g:
    assert f.read() == g.read()
  assert sorted(pretraining_run["evals"][conftest.TRAIN_STEPS]) == [
      "global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
      "next_sentence_accuracy", "next_sentence_loss"]
  assert pretraining_run["checkpoint"].endswith(
      f"model.ckpt-{conftest.TRAIN_STEPS}")


@pytest.mark.parametrize("mesh_impl", ["placement", "simd"])
def test_eval_mode_on_the_checkpoint_under_another_mesh(pretraining_run,
                                                        tmp_path, mesh_impl):
  """--mode=eval of the final checkpoint on batch:2;model:4 (placement or
  SIMD) gives the metrics train_and_eval computed on batch:8."""
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  prefix = f"model.ckpt-{conftest.TRAIN_STEPS}"
  for name in ("checkpoint", f"{prefix}.index",
               f"{prefix}.data-00000-of-00001"):
    shutil.copy(f"{pretraining_run['model_dir']}/{name}", model_dir)
  flags_of_run = [f for f in pretraining_run["common_flags"]
                  if not f.startswith("--output_dir")]
  conftest.run_main(*flags_of_run, f"--output_dir={model_dir}",
                    "--mesh_shape=batch:2;model:4", "--mode=eval",
                    f"--mesh_impl={mesh_impl}",
                    f"--input_eval_files={pretraining_run['eval_records']}")
  results = conftest.read_eval_results(model_dir / "eval_results.txt")
  expected = pretraining_run["evals"][conftest.TRAIN_STEPS]
  assert results["global_step"] == conftest.TRAIN_STEPS
  for name in ("loss", "masked_lm_loss", "next_sentence_loss"):
    assert results[name] == pytest.approx(expected[name], rel=1e-4), name
  for name in ("masked_lm_accuracy", "next_sentence_accuracy"):
    assert results[name] == pytest.approx(expected[name], abs=2e-3), name


def test_simd_trains_like_placement(pretraining_run, tmp_path):
  """Three training steps on SIMD (b:2;m:4) give placement's weights: the
  binary runs on either implementation. Placement on one processor
  (quickest to lower; the shared run trains on its batch:8)."""
  flags_of_run = [f for f in pretraining_run["common_flags"]
                  if not f.startswith(("--output_dir", "--iterations"))]
  weights = {}
  for mesh_impl, mesh_shape in (("placement", "batch:1"),
                                ("simd", "batch:2;model:4")):
    output_dir = tmp_path / mesh_impl
    conftest.run_main(*flags_of_run, f"--output_dir={output_dir}",
                      f"--mesh_shape={mesh_shape}", f"--mesh_impl={mesh_impl}",
                      "--do_train", "--num_train_steps=3",
                      "--iterations_per_loop=3",
                      f"--input_file={pretraining_run['train_records']}")
    checkpoint = tf.train.latest_checkpoint(str(output_dir))
    assert checkpoint.endswith("model.ckpt-3"), checkpoint
    weights[mesh_impl] = {
        name: tf.train.load_variable(checkpoint, name)
        for name, _ in tf.train.list_variables(checkpoint)
        if name.startswith(("bert/", "cls/"))}
  assert len(weights["simd"]) > 20
  assert set(weights["simd"]) == set(weights["placement"])
  for name, value in weights["placement"].items():
    np.testing.assert_allclose(weights["simd"][name], value, rtol=1e-4,
                               atol=1e-6, err_msg=name)


def _write_records(path, count):
  """`count` records of sequence length 4 and 2 predictions; record i has
  input_ids [i, i, i, i]."""
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i in range(count):
      ints = lambda v: tf.train.Feature(
          int64_list=tf.train.Int64List(value=v))
      feature = {
          "input_ids": ints([i] * 4), "input_mask": ints([1] * 4),
          "segment_ids": ints([0, 0, 1, 1]),
          "masked_lm_positions": ints([1, 2]),
          "masked_lm_ids": ints([i, i]),
          "masked_lm_weights": tf.train.Feature(
              float_list=tf.train.FloatList(value=[1.0, 0.0])),
          "next_sentence_labels": ints([i % 2])}
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=feature)).SerializeToString())
  return str(path)


def test_input_fn_batches_int32_features(tmp_path):
  files = [_write_records(tmp_path / "a.tfrecord", 7),
           _write_records(tmp_path / "b.tfrecord", 4)]
  eval_batches = list(run_pretraining.input_fn_builder(
      files, 4, 2, is_training=False)({"batch_size": 3}))
  # Read once, in order, the remainder of 11 records dropped.
  assert len(eval_batches) == 3
  first = eval_batches[0]
  assert first["input_ids"].dtype == tf.int32
  assert first["masked_lm_weights"].dtype == tf.float32
  assert first["input_ids"].shape == (3, 4)
  assert first["masked_lm_positions"].shape == (3, 2)
  assert first["next_sentence_labels"].shape == (3, 1)
  ids = np.concatenate([b["input_ids"][:, 0] for b in eval_batches])
  np.testing.assert_array_equal(ids, [0, 1, 2, 3, 4, 5, 6, 0, 1])
  train = run_pretraining.input_fn_builder(
      files, 4, 2, is_training=True)({"batch_size": 5})
  train_batches = list(train.take(10))  # Repeats past 11 records.
  assert len(train_batches) == 10
  assert all(b["input_ids"].shape == (5, 4) for b in train_batches)


def _run_binary(monkeypatch, capsys, args):
  """(exit code, stderr) of the binary run in this process."""
  monkeypatch.setattr(sys, "argv", ["run_pretraining", *args])
  with flagsaver.flagsaver():
    was_parsed = FLAGS.is_parsed()
    FLAGS.unparse_flags()
    try:
      with pytest.raises(SystemExit) as exit_info:
        run_common.run(run_pretraining.main)
    finally:
      FLAGS.unparse_flags()
      if was_parsed:
        FLAGS.mark_as_parsed()
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return exit_info.value.code, err


@pytest.mark.parametrize("args, message", [
    ([], r"--bert_config_file is required"),
    (["--bert_config_file={missing}"],
     r"--bert_config_file='.*no_such\.json': no such file"),
    (["--bert_config_file={config}"], r"--output_dir is required"),
    (["--bert_config_file={config}", "--output_dir={out}",
      "--max_seq_length=32"],
     r"--input_train_files \(or --input_file\) is required"),
    (["--bert_config_file={config}", "--output_dir={out}",
      "--max_seq_length=32", "--mode=eval",
      "--input_eval_files={out}/*.tfrecord"],
     r"--input_eval_files: '.*\*\.tfrecord' matches no file"),
    (["--bert_config_file={config}", "--output_dir={out}",
      "--max_seq_length=128"],
     r"--max_seq_length=128 is longer than the model's "
     r"max_position_embeddings \(64\)"),
    (["--mode=train", "--do_eval"], r"--mode=train contradicts"),
    (["--mesh_shape=batch:x"], r"--mesh_shape='batch:x'"),
    # TensorFlow runs with this process's 8 logical CPUs: the binary stops
    # before any SIMD collective could wait for a 9th.
    (["--mesh_impl=simd", "--mesh_shape=x:4;y:4"],
     r"16 processors .* 8 CPU device\(s\) \(.*CPU:0, .*CPU:7\)"),
])
def test_bad_flags_give_one_paragraph_naming_the_flag(
    monkeypatch, capsys, tmp_path, args, message):
  values = {"config": generated_data.write_config(tmp_path / "config.json"),
            "missing": tmp_path / "no_such.json", "out": tmp_path / "out"}
  code, err = _run_binary(monkeypatch, capsys,
                          [a.format(**values) for a in args])
  assert code == 1
  error = err.strip().splitlines()[-1]
  assert error.startswith("error: "), err
  assert re.search(message, error), error


def test_bad_enum_value_is_named_by_flag_parsing(monkeypatch, capsys):
  code, err = _run_binary(monkeypatch, capsys, ["--mode=pretrain"])
  assert code == 1
  assert re.search(r"--mode=pretrain: value should be one of "
                   r"<train\|eval\|train_and_eval>", err), err
