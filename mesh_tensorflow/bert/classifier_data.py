"""The classifier's examples and the GLUE TSV readers of its four tasks.

Each `DataProcessor` reads one task's files in `data_dir`, in the formats
GLUE (and XNLI) distribute them:

- MRPC: train.tsv, dev.tsv, test.tsv with a header line; columns
  quality (the label, "0" or "1"), #1 ID, #2 ID, #1 String, #2 String (test
  files have an index instead of the quality).
- CoLA: train.tsv and dev.tsv without a header; columns source, label
  ("0"/"1"), the author's mark, sentence. test.tsv has a header and columns
  index, sentence.
- MNLI: train.tsv, dev_matched.tsv, test_matched.tsv with a header;
  sentence1 and sentence2 in columns 8 and 9, the gold label last.
- XNLI: multinli/multinli.train.<language>.tsv (premise, hypo, label; the
  label "contradictory" means "contradiction") and the multilingual
  xnli.dev.tsv (language in column 0, gold label in 1, sentence1 and
  sentence2 in 6 and 7), of which only the rows of `language` are read.

Test examples carry a placeholder label (the first one), as the original
did, so that they go through the same feature conversion.
"""

import csv
import dataclasses
import os
from typing import Optional

import tensorflow as tf


@dataclasses.dataclass(eq=False)
class InputExample(object):
  """One example to classify: one or two texts and, unless a test, a label.

  Args:
    guid: a unique id, e.g. "train-12".
    text_a: the first text (untokenized).
    text_b: the second text of a pair task, or None.
    label: the label as the task's files spell it, or None.
  """
  guid: str
  text_a: str
  text_b: Optional[str] = None
  label: Optional[str] = None


class PaddingInputExample(object):
  """A fake example that fills the last batch of evaluation or prediction.

  The mesh has a fixed batch dimension, so a set whose size the batch size
  does not divide is padded with these instead of dropping its last
  examples; their features have is_real_example=False, which weighs them
  out of the metrics, and their predictions are not written.
  """


@dataclasses.dataclass(eq=False)
class InputFeatures(object):
  """The model's inputs of one example: ids, mask and segments of
  max_seq_length each, the label's index and whether it is real."""
  input_ids: list
  input_mask: list
  segment_ids: list
  label_id: int
  is_real_example: bool = True


class DataProcessor(object):
  """Reads the examples of one classification task from its data folder."""

  def get_train_examples(self, data_dir):
    """The training set's `InputExample`s."""
    raise NotImplementedError()

  def get_dev_examples(self, data_dir):
    """The dev (evaluation) set's `InputExample`s."""
    raise NotImplementedError()

  def get_test_examples(self, data_dir):
    """The test (prediction) set's `InputExample`s."""
    raise NotImplementedError()

  def get_labels(self):
    """The task's labels; the model's classes are their indices."""
    raise NotImplementedError()

  @classmethod
  def _read_tsv(cls, input_file, quotechar=None):
    """The rows of a tab-separated file, each a list of strings.

    Without a quotechar no quoting applies: GLUE's sentences contain
    unbalanced quotes that must stay as they are.
    """
    if not tf.io.gfile.exists(input_file):
      raise FileNotFoundError(
          f"{cls.__name__}: {input_file} does not exist (--data_dir must "
          f"hold the task's TSV files).")
    with tf.io.gfile.GFile(input_file, "r") as f:
      return list(csv.reader(f, delimiter="\t", quotechar=quotechar))


def _column(line, index, input_name):
  """line[index], or a ValueError naming the file and the row."""
  try:
    return line[index]
  except IndexError:
    raise ValueError(
        f"{input_name}: a row has {len(line)} tab-separated columns, "
        f"expected at least {abs(index) + (index >= 0)}: {line!r}.") from None


class XnliProcessor(DataProcessor):
  """XNLI: MultiNLI training data translated into `language`, and the
  rows of that language of the multilingual dev set.

  Args:
    language: the XNLI language code ("zh", as in the original, which
      fixed it; run_classifier's --xnli_language sets it).
  """

  def __init__(self, language="zh"):
    self.language = language

  def get_train_examples(self, data_dir):
    """See base class."""
    path = os.path.join(data_dir, "multinli",
                        f"multinli.train.{self.language}.tsv")
    examples = []
    for i, line in enumerate(self._read_tsv(path)):
      if i == 0:
        continue
      label = _column(line, 2, path)
      if label == "contradictory":
        label = "contradiction"
      examples.append(InputExample(
          guid=f"train-{i}", text_a=_column(line, 0, path),
          text_b=_column(line, 1, path), label=label))
    return examples

  def get_dev_examples(self, data_dir):
    """See base class."""
    path = os.path.join(data_dir, "xnli.dev.tsv")
    examples = []
    for i, line in enumerate(self._read_tsv(path)):
      if i == 0 or _column(line, 0, path) != self.language:
        continue
      examples.append(InputExample(
          guid=f"dev-{i}", text_a=_column(line, 6, path),
          text_b=_column(line, 7, path), label=_column(line, 1, path)))
    return examples

  def get_labels(self):
    """See base class."""
    return ["contradiction", "entailment", "neutral"]


class _GlueProcessor(DataProcessor):
  """A GLUE task of train.tsv, dev.tsv and test.tsv files (or the files
  _SPLITS names: split -> (file, set type)) read by _create_examples."""

  _SPLITS = {"train": ("train.tsv", "train"), "dev": ("dev.tsv", "dev"),
             "test": ("test.tsv", "test")}

  def _split_examples(self, data_dir, split):
    file_name, set_type = self._SPLITS[split]
    return self._create_examples(
        self._read_tsv(os.path.join(data_dir, file_name)), set_type)

  def get_train_examples(self, data_dir):
    """See base class."""
    return self._split_examples(data_dir, "train")

  def get_dev_examples(self, data_dir):
    """See base class."""
    return self._split_examples(data_dir, "dev")

  def get_test_examples(self, data_dir):
    """See base class."""
    return self._split_examples(data_dir, "test")

  def _create_examples(self, lines, set_type):
    raise NotImplementedError()


class MnliProcessor(_GlueProcessor):
  """MultiNLI (GLUE version), matched dev and test sets."""

  _SPLITS = {"train": ("train.tsv", "train"),
             "dev": ("dev_matched.tsv", "dev_matched"),
             "test": ("test_matched.tsv", "test")}

  def get_labels(self):
    """See base class."""
    return ["contradiction", "entailment", "neutral"]

  def _create_examples(self, lines, set_type):
    """Examples of the rows after the header; guids name the pair id."""
    name = f"MNLI {set_type}"
    examples = []
    for i, line in enumerate(lines):
      if i == 0:
        continue
      label = ("contradiction" if set_type == "test" else
               _column(line, -1, name))
      examples.append(InputExample(
          guid=f"{set_type}-{_column(line, 0, name)}",
          text_a=_column(line, 8, name), text_b=_column(line, 9, name),
          label=label))
    return examples


class MrpcProcessor(_GlueProcessor):
  """Microsoft Research Paraphrase Corpus (GLUE version)."""

  def get_labels(self):
    """See base class."""
    return ["0", "1"]

  def _create_examples(self, lines, set_type):
    """Examples of the rows after the header; guids count the rows."""
    name = f"MRPC {set_type}"
    examples = []
    for i, line in enumerate(lines):
      if i == 0:
        continue
      label = "0" if set_type == "test" else _column(line, 0, name)
      examples.append(InputExample(
          guid=f"{set_type}-{i}", text_a=_column(line, 3, name),
          text_b=_column(line, 4, name), label=label))
    return examples


class ColaProcessor(_GlueProcessor):
  """Corpus of Linguistic Acceptability (GLUE version): single sentences."""

  def get_labels(self):
    """See base class."""
    return ["0", "1"]

  def _create_examples(self, lines, set_type):
    """Examples of every row (only the test file has a header)."""
    name = f"CoLA {set_type}"
    examples = []
    for i, line in enumerate(lines):
      if set_type == "test":
        if i == 0:
          continue
        text, label = _column(line, 1, name), "0"
      else:
        text, label = _column(line, 3, name), _column(line, 1, name)
      examples.append(InputExample(guid=f"{set_type}-{i}", text_a=text,
                                   text_b=None, label=label))
    return examples
