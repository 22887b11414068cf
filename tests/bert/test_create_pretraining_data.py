"""Tests of bert.create_pretraining_data on a generated corpus."""

import random
import re
import sys

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.bert import create_pretraining_data as cpd
from mesh_tensorflow.bert import run_common
from mesh_tensorflow.bert import tokenization
from tests.bert import generated_data

FLAGS = flags.FLAGS

MAX_SEQ_LENGTH = 32
MAX_PREDICTIONS = 5
# Words that WordPiece splits ("cats" -> "cat", "##s"), for whole words.
SUFFIXES = ("s", "ed", "ing", "er", "ly")


def write_corpus(path, num_documents=30, seed=0):
  """Documents of 3-8 sentences, one per line, blank lines between."""
  rng = random.Random(seed)
  documents = []
  for _ in range(num_documents):
    topic = rng.choice(generated_data.TOPICS)
    sentences = []
    for _ in range(rng.randint(3, 8)):
      words = [rng.choice(topic) + rng.choice(("",) + SUFFIXES)
               if rng.random() < 0.6 else
               rng.choice(generated_data.FUNCTION_WORDS)
               for _ in range(rng.randint(3, 9))]
      sentences.append(" ".join(words).capitalize() + rng.choice(".?!"))
    documents.append("\n".join(sentences))
  path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  directory = tmp_path_factory.mktemp("pretraining_data")
  vocab = generated_data.write_vocab(directory / "vocab.txt")
  return {"corpus": write_corpus(directory / "corpus.txt"), "vocab": vocab,
          "dir": directory,
          "tokenizer": tokenization.InGraphTokenizer(vocab)}


def make_instances(files, seed=12345, whole_word=False, tokenizer=None,
                   dupe_factor=5):
  tokenizer = tokenizer or files["tokenizer"]
  return tokenizer, cpd.create_training_instances(
      [files["corpus"]], tokenizer, MAX_SEQ_LENGTH, dupe_factor, 0.1, 0.15,
      MAX_PREDICTIONS, random.Random(seed), do_whole_word_mask=whole_word)


@pytest.fixture(scope="module")
def records(files):
  tokenizer, instances = make_instances(files)
  path = str(files["dir"] / "records.tfrecord")
  cpd.write_instance_to_example_files(instances, tokenizer, MAX_SEQ_LENGTH,
                                      MAX_PREDICTIONS, [path])
  spec = cpd.feature_spec(MAX_SEQ_LENGTH, MAX_PREDICTIONS)
  (parsed,) = tf.data.TFRecordDataset(path).batch(10**6).map(
      lambda records: tf.io.parse_example(records, spec))
  columns = {name: value.numpy() for name, value in parsed.items()}
  return tokenizer, instances, columns


def test_records_layout(records):
  tokenizer, instances, columns = records
  assert len(instances) == len(columns["input_ids"]) > 200
  vocab = tokenizer.vocab
  for row in range(len(instances)):
    ids = columns["input_ids"][row]
    length = int(columns["input_mask"][row].sum())
    assert columns["input_mask"][row].tolist() == (
        [1] * length + [0] * (MAX_SEQ_LENGTH - length))
    assert not ids[length:].any() and not columns["segment_ids"][row][
        length:].any()
    seps = [i for i in range(length) if ids[i] == vocab["[SEP]"]]
    assert ids[0] == vocab["[CLS]"] and len(seps) == 2
    assert seps[1] == length - 1
    assert columns["segment_ids"][row][:length].tolist() == (
        [0] * (seps[0] + 1) + [1] * (length - seps[0] - 1))
    # Predictions first, then padding with weight 0.
    count = int(columns["masked_lm_weights"][row].sum())
    assert columns["masked_lm_weights"][row].tolist() == (
        [1.0] * count + [0.0] * (MAX_PREDICTIONS - count))
    assert 1 <= count <= MAX_PREDICTIONS
    positions = columns["masked_lm_positions"][row]
    assert not positions[count:].any()
    assert not columns["masked_lm_ids"][row][count:].any()
    assert list(positions[:count]) == sorted(set(positions[:count]))
    assert not set(positions[:count]) & {0, *seps}
    assert columns["next_sentence_labels"][row].tolist() == [
        int(instances[row].is_random_next)]
  labels = columns["next_sentence_labels"].ravel()
  assert 0.3 < labels.mean() < 0.7


def test_masking_proportions(records):
  """80% [MASK], 10% the original, 10% random (fixed seed, wide margins)."""
  tokenizer, _, columns = records
  weights = columns["masked_lm_weights"] > 0
  positions = columns["masked_lm_positions"][weights]
  rows = np.nonzero(weights)[0]
  shown = columns["input_ids"][rows, positions]
  original = columns["masked_lm_ids"][weights]
  masked = np.mean(shown == tokenizer.vocab["[MASK]"])
  kept = np.mean(shown == original)
  assert len(shown) > 1000
  assert 0.75 < masked < 0.85
  assert 0.06 < kept < 0.14
  assert 0.06 < 1 - masked - kept < 0.14
  # About 15% of each sequence (capped at MAX_PREDICTIONS), at least one.
  lengths = columns["input_mask"].sum(axis=1)
  expected = np.minimum(MAX_PREDICTIONS,
                        np.maximum(1, np.round(lengths * 0.15)))
  np.testing.assert_array_equal(weights.sum(axis=1), expected)


def _spans(tokens):
  """Space-joined text of tokens, for substring tests on token runs."""
  return " " + " ".join(tokens) + " "


def test_segments_come_from_the_documents(files, records):
  """A and B are runs of documents; B follows A unless random next."""
  tokenizer, instances, _ = records
  documents = [_spans(token for sentence in document for token in sentence)
               for document in cpd.read_documents([files["corpus"]],
                                                  tokenizer)]
  for instance in instances:
    tokens = list(instance.tokens)
    for index, label in zip(instance.masked_lm_positions,
                            instance.masked_lm_labels):
      tokens[index] = label
    sep = tokens.index("[SEP]")
    a, b = _spans(tokens[1:sep]), _spans(tokens[sep + 1:-1])
    homes_a = [d for d in documents if a in d]
    assert homes_a and any(b in d for d in documents)
    if not instance.is_random_next:
      assert any(b in d[d.index(a) + len(a) - 1:] for d in homes_a)


def test_whole_word_masking(files):
  """With it, a word's pieces are masked all or none; without, not so."""

  def partly_masked_words(instances):
    count = 0
    for instance in instances:
      labels = dict(zip(instance.masked_lm_positions,
                        instance.masked_lm_labels))
      words = []  # As the tool groups them: [CLS] and [SEP] are no words.
      for i, token in enumerate(instance.tokens):
        label = labels.get(i, token)
        if label in ("[CLS]", "[SEP]"):
          continue
        if label.startswith("##") and words:
          words[-1].append(i)
        else:
          words.append([i])
      masked = set(instance.masked_lm_positions)
      count += sum(0 < len(masked.intersection(w)) < len(w) for w in words)
    return count

  _, whole = make_instances(files, whole_word=True, dupe_factor=2)
  assert partly_masked_words(whole) == 0
  assert any(label.startswith("##") for instance in whole
             for label in instance.masked_lm_labels)
  _, pieces = make_instances(files, dupe_factor=2)
  assert partly_masked_words(pieces) > 0


def test_python_tokenizer_gives_the_same_instances(files):
  _, in_graph = make_instances(files, dupe_factor=1)
  _, python = make_instances(
      files, tokenizer=tokenization.FullTokenizer(files["vocab"]),
      dupe_factor=1)
  assert list(map(str, python)) == list(map(str, in_graph))


def run_binary(monkeypatch, *args):
  """Runs the program's main in-process; returns its exit status."""
  monkeypatch.setattr(sys, "argv", ["create_pretraining_data", *args])
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    try:
      with pytest.raises(SystemExit) as exit_info:
        run_common.run(cpd.main)
    finally:
      FLAGS.unparse_flags()
  return exit_info.value.code


def test_binary_is_deterministic_per_seed(files, monkeypatch):
  out = files["dir"] / "binary"
  out.mkdir()
  corpus_glob = str(files["dir"] / "corp*.txt")
  common = [f"--input_file={corpus_glob}", f"--vocab_file={files['vocab']}",
            "--max_seq_length=32", "--max_predictions_per_seq=5",
            "--dupe_factor=2"]
  for name, seed in (("a", 1), ("b", 1), ("c", 2)):
    outputs = f"{out}/{name}0.tfrecord,{out}/{name}1.tfrecord"
    assert run_binary(monkeypatch, *common, f"--random_seed={seed}",
                      f"--output_file={outputs}") in (None, 0)
  read = lambda name: [(out / f"{name}{i}.tfrecord").read_bytes()
                       for i in range(2)]
  assert all(read("a")) and read("a") == read("b") != read("c")
  # Round-robin over the two files.
  counts = [sum(1 for _ in tf.data.TFRecordDataset(str(out / f"a{i}.tfrecord")))
            for i in range(2)]
  assert counts[0] - counts[1] in (0, 1)


@pytest.mark.parametrize("args, message", [
    ((), r"--input_file is required"),
    (("--input_file={dir}/none*.txt",), r"--input_file: no file matches"),
    (("--max_seq_length=4",), r"--max_seq_length=4: needs at least 5"),
    (("--masked_lm_prob=1.5",), r"--masked_lm_prob=1.5: a probability"),
    (("--vocab_file={dir}/missing.txt",), r"missing\.txt"),
])
def test_bad_flag_gives_one_paragraph(files, monkeypatch, capsys, args,
                                      message):
  defaults = {"input_file": files["corpus"], "vocab_file": files["vocab"],
              "output_file": str(files["dir"] / "bad.tfrecord")}
  argv = [arg.format(dir=files["dir"]) for arg in args]
  given = {arg.split("=")[0][2:] for arg in argv}
  if args:
    argv += [f"--{name}={value}" for name, value in defaults.items()
             if name not in given]
  assert run_binary(monkeypatch, *argv) == 1
  err = capsys.readouterr().err
  error = err.strip().splitlines()[-1]
  assert error.startswith("error: ") and "Traceback" not in err
  assert re.search(message, error), error
