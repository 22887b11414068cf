"""The binary with a language model on a user's file of text lines.

A tiny LM ("lm", dropout 0.1) trains twice with `utils.run.seed`: the
shuffled lines come in the same order and every step's loss is the same.
The seed reaches the models: another seed, another start.
The trained LM then scores strings (an "lm" has targets only) and decodes
prompts of different lengths in one sequence as long as its position table.
"""

import os

import gin
import numpy as np
import pytest

from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary
from tests import mtf_testing
from tests import test_run_seed
from tests.transformer import test_auto_layout_run
from tests.transformer import test_main

STEPS = 4
LENGTH = 8
WORDS = ["red", "blue", "green", "gold", "grey", "pink", "teal", "tan"]
FILES = ["models/lm_base.gin"]


@gin.configurable(module="tests.transformer.test_seeded_run")
def lines_dataset_fn(sequence_length, vocabulary, dataset_split="train",
                     glob=gin.REQUIRED):
  """A user's dataset function: each line of the files is one example's
  targets (shuffled by dataset.simple_text_line_dataset)."""
  del dataset_split
  lines = dataset.simple_text_line_dataset(glob=glob)
  examples = dataset.encode_all_features(
      lines.map(lambda line: {"targets": line}), vocabulary)
  return dataset.pack_or_pad(examples, sequence_length, pack=False)


def _params(data_dir):
  return [
      "utils.run.vocabulary = @vocabulary.ByteVocabulary()",
      f"utils.run.sequence_length = {{'inputs': {LENGTH}, "
      f"'targets': {LENGTH}}}",
      "utils.run.train_dataset_fn = @test_seeded_run.lines_dataset_fn",
      f"test_seeded_run.lines_dataset_fn.glob = '{data_dir}/*.txt'",
      "num_layers = 2", "dropout_rate = 0.1",
      # Decoding reads prompt and answer in one sequence of 2 * LENGTH:
      # the position table is exactly that long.
      f"Unitransformer.max_length = {2 * LENGTH}",
      f"utils.run.train_steps = {STEPS}",
      "utils.run.iterations_per_loop = 1",
      f"utils.run.save_checkpoints_steps = {STEPS}",
  ]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("lines")
  rng = np.random.RandomState(0)
  lines = [" ".join(rng.choice(WORDS, 2)) for _ in range(64)]
  (directory / "train.txt").write_text("\n".join(lines) + "\n")
  return directory


@pytest.fixture(scope="module")
def seeded_runs(data_dir, tmp_path_factory):
  """Two runs of one command with a seed: (model dirs, losses per step)."""
  runs = []
  for _ in range(2):
    model_dir = tmp_path_factory.mktemp("seeded")
    _, losses = test_auto_layout_run._train(  # pylint: disable=protected-access
        model_dir, *_params(data_dir), "utils.run.seed = 1", files=FILES)
    runs.append((model_dir, losses))
  return runs


def test_seeded_runs_repeat_their_losses_step_for_step(seeded_runs):
  (_, first), (_, second) = seeded_runs
  assert len(first) == STEPS
  assert first == second


def test_seed_is_in_the_operative_config(seeded_runs):
  config = (seeded_runs[0][0] / "operative_config.gin").read_text()
  assert "run.seed = 1" in config.splitlines()


def _start(seed, model_dir):
  """Initial values and a dropout mask of a model that utils.run(seed=seed)
  trains (its train_model_fn builds and lowers it instead)."""
  started = []

  def train_model_fn(*unused_args, **unused_kwargs):
    values, _ = mtf_testing.run_program("all:1", "", "eager",
                                        test_run_seed.model)
    started.append(values)

  gin.clear_config()
  try:
    gin.parse_config_file(os.path.join(utils.gin_dir(), "defaults.gin"))
    gin.parse_config(["utils.run.mesh_shape = 'all:1'",
                      "utils.run.layout_rules = ''"])
    utils.run(None, None, None, None, str(model_dir),
              vocabulary=vocabulary.ByteVocabulary(),
              train_dataset_fn=lines_dataset_fn, sequence_length=LENGTH,
              batch_size=2, train_steps=1, train_model_fn=train_model_fn,
              seed=seed)
  finally:
    gin.clear_config()
  (values,) = started
  return values


def test_the_seed_reaches_initial_values_and_dropout_masks(tmp_path):
  first, again, other = (_start(seed, tmp_path / str(i))
                         for i, seed in enumerate([1, 1, 2]))
  for name in ["dense/kernel", "embedding", "mask", "w"]:
    np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    assert not np.array_equal(first[name], other[name]), name


def _run(model_dir, data_dir, *params):
  return test_main.run_main(model_dir, *_params(data_dir), *params,
                            files=FILES)


def test_lm_scores_strings(seeded_runs, data_dir):
  """score_from_strings of an "lm": targets only, or after an unscored
  prefix (whose ids are left out of the score)."""
  model_dir = seeded_runs[0][0]
  scores, targets = _run(model_dir, data_dir,
                         "utils.run.mode = 'score_from_strings'",
                         "score_from_strings.inputs = None",
                         "score_from_strings.targets = ['red tan', 'tan']")
  assert targets == ["red tan", "tan"]
  assert len(scores) == 2 and all(np.isfinite(scores)) and max(scores) < 0
  # Texts are stripped: the prefix and the target join without a space.
  (whole, prefixed), _ = _run(
      model_dir, data_dir, "utils.run.mode = 'score_from_strings'",
      "score_from_strings.inputs = ['', 'tan']",
      "score_from_strings.targets = ['tanred', 'red']")
  # log p(red | tan) = log p(tanred) - log p(tan).
  assert whole < prefixed < 0


def test_lm_decodes_prompts_of_different_lengths(seeded_runs, data_dir,
                                                 tmp_path):
  """Prompts padded to LENGTH, then LENGTH tokens to decode, in a position
  table of 2 * LENGTH: the rows of longer prompts reach its end first and
  wait there while the others decode (the decodes' tokens are checked in
  test_decoding_options.py)."""
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("r\nred b\nred tan\n")
  output = tmp_path / "decodes"
  _run(seeded_runs[0][0], data_dir, "utils.run.mode = 'infer'",
       f"decode_from_file.input_filename = '{prompts}'",
       f"decode_from_file.output_filename = '{output}'")
  assert (tmp_path / f"decodes-{STEPS}").exists()
