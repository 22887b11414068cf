"""BERT test fixtures: one pretraining run that every BERT test shares.

`pretraining_run` pretrains the tiny config on records that
`create_pretraining_data` made from the generated corpus (tests/bert/
corpus.py), once per pytest run, even across xdist workers
(`shared_result`), in a directory all workers see. It runs the binary's
`main` in this process, three times, as a user would:

1. `--do_train --input_file=...` (Google BERT's names) for one step,
   whose learning rate is 0 (warm-up starts at 0): a checkpoint of the
   initial weights, on one processor (quickest to lower);
2. `--do_eval` on that checkpoint: the step-0 evaluation, likewise;
3. `--mode=train_and_eval` on `batch:8` (the binary's default mesh) on to
   TRAIN_STEPS, evaluating at the end.

`pretrained_checkpoint` is what fine-tuning tests need from it:
(checkpoint prefix, vocabulary file, config file).
"""

import os
import random
import re
import shutil

from absl import flags
from absl.testing import flagsaver
import pytest
import tensorflow as tf

from mesh_tensorflow.bert import create_pretraining_data
from mesh_tensorflow.bert import run_pretraining
from mesh_tensorflow.bert import tokenization
from tests.bert import corpus
from tests.bert import generated_data

FLAGS = flags.FLAGS

SEQ_LENGTH = 32
MAX_PREDICTIONS = 5
BATCH_SIZE = 32
TRAIN_STEPS = 300
WARMUP_STEPS = 30
LEARNING_RATE = 3e-3
SEED = 1


def run_main(*args):
  """Runs run_pretraining.main on the command-line flags `args` in this
  process; every flag is restored afterwards."""
  with flagsaver.flagsaver():
    was_parsed = FLAGS.is_parsed()
    FLAGS.unparse_flags()
    try:
      FLAGS(["run_pretraining", *args])
      run_pretraining.main([])
    finally:
      FLAGS.unparse_flags()
      if was_parsed:
        FLAGS.mark_as_parsed()


def read_eval_results(path):
  """{name: float} of an eval_results file ("name = value" lines)."""
  results = {}
  with open(path) as f:
    for line in f:
      name, value = re.fullmatch(r"(\S+) = (\S+)\n?", line).groups()
      results[name] = float(value)
  return results


def write_records(text_file, vocab_file, output_file, seed):
  """Pretraining records of a text file, as the data tool writes them."""
  tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
  instances = create_pretraining_data.create_training_instances(
      [text_file], tokenizer, SEQ_LENGTH, dupe_factor=5, short_seq_prob=0.1,
      masked_lm_prob=0.15, max_predictions_per_seq=MAX_PREDICTIONS,
      rng=random.Random(seed))
  create_pretraining_data.write_instance_to_example_files(
      instances, tokenizer, SEQ_LENGTH, MAX_PREDICTIONS, [output_file])
  return output_file


def common_flags(directory, model_dir):
  """The flags every stage of the run shares (not the mesh or the mode)."""
  return [f"--bert_config_file={directory}/bert_config.json",
          f"--output_dir={model_dir}",
          f"--max_seq_length={SEQ_LENGTH}",
          f"--max_predictions_per_seq={MAX_PREDICTIONS}",
          f"--train_batch_size={BATCH_SIZE}",
          f"--eval_batch_size={BATCH_SIZE}",
          f"--learning_rate={LEARNING_RATE}",
          f"--num_warmup_steps={WARMUP_STEPS}",
          "--iterations_per_loop=100", "--save_checkpoints_steps=1000",
          "--max_eval_steps=0", f"--tf_random_seed={SEED}"]


def pretrain(directory):
  """Makes the data and runs the three stages (see the module docstring);
  returns paths, eval results and baselines."""
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  vocab = generated_data.write_vocab(f"{directory}/vocab.txt")
  config = generated_data.write_config(f"{directory}/bert_config.json",
                                       **generated_data.PRETRAINING_OVERRIDES)
  train_text = corpus.write_corpus(f"{directory}/train.txt")
  eval_text = corpus.write_corpus(f"{directory}/held_out.txt",
                                  num_documents=40,
                                  seed=corpus.HELD_OUT_SEED)
  train_records = write_records(train_text, vocab,
                                f"{directory}/train.tfrecord", seed=SEED)
  eval_records = write_records(eval_text, vocab,
                               f"{directory}/held_out.tfrecord", seed=SEED)
  model_dir = f"{directory}/model"
  common = common_flags(directory, model_dir)
  # On one processor: checkpoints do not depend on the mesh, and lowering
  # onto one processor is quickest.
  run_main(*common, "--mesh_shape=batch:1", "--do_train",
           f"--input_file={train_records}", "--num_train_steps=1")
  run_main(*common, "--mesh_shape=batch:1", "--do_eval",
           f"--input_eval_files={eval_records}")
  evals = {0: read_eval_results(f"{model_dir}/eval_results.txt")}
  run_main(*common, "--mesh_shape=batch:8", "--mode=train_and_eval",
           f"--input_train_files={train_records}",
           f"--input_eval_files={eval_records}",
           f"--num_train_steps={TRAIN_STEPS}",
           f"--steps_per_eval={TRAIN_STEPS}")
  evals[TRAIN_STEPS] = read_eval_results(
      f"{model_dir}/eval_results_{TRAIN_STEPS}.txt")
  return {
      "directory": directory, "model_dir": model_dir,
      "checkpoint": tf.train.latest_checkpoint(model_dir), "vocab_file": vocab,
      "bert_config_file": config, "train_records": train_records,
      "eval_records": eval_records, "common_flags": common, "evals": evals,
      "baselines": corpus.masked_lm_baselines(
          [train_records], [eval_records],
          generated_data.tiny_config()["vocab_size"])}


@pytest.fixture(scope="session")
def pretraining_run(shared_result, tmp_path_factory):
  """The shared pretraining run: a dict of paths, eval results per step
  and the masked-LM baselines (see pretrain)."""
  run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
  if run_id is None:
    directory = tmp_path_factory.mktemp("bert_pretraining")
  else:
    directory = (tmp_path_factory.getbasetemp().parent / f"shared-{run_id}" /
                 "bert_pretraining")
  return shared_result("bert_pretraining", lambda: pretrain(str(directory)))


@pytest.fixture(scope="session")
def pretrained_checkpoint(pretraining_run):
  """(checkpoint prefix, vocabulary file, config file) of the shared
  pretraining run: --init_checkpoint, --vocab_file, --bert_config_file."""
  return (pretraining_run["checkpoint"], pretraining_run["vocab_file"],
          pretraining_run["bert_config_file"])
