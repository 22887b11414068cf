"""SQuAD data for BERT: JSON -> examples -> windowed features -> TFRecords.

A SQuAD paragraph's context is split on whitespace into words; an
answer's character offset becomes the positions of its first and last
word. Each example is then WordPiece-tokenized into one or more
features: "[CLS] question [SEP] window of the context [SEP]", where the
windows of a long context start `doc_stride` tokens apart. A context
token that falls in several windows is "max context" in the window where
it has the most context on its shorter side; predictions only start at
such tokens.
"""

import collections
import dataclasses
import json
from typing import Optional

from absl import flags
from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert import tokenization

FLAGS = flags.FLAGS

# Features' unique ids count up from here (an int32 on the device); 0 marks
# the padding examples of a partial predict batch.
FIRST_UNIQUE_ID = 1000000000

_DocSpan = collections.namedtuple("DocSpan", ["start", "length"])


def flag_or_default(name, default):
  """The value of flag --name once flags are parsed, else `default`.

  The original's functions read a few flags (--version_2_with_negative,
  --verbose_logging, ...) directly; here those are also parameters, and
  a library user who never parses flags gets the defaults.
  """
  if name in FLAGS and FLAGS.is_parsed():
    return FLAGS[name].value
  return default


@dataclasses.dataclass(eq=False)
class SquadExample(object):
  """One question about one context.

  doc_tokens are the context's whitespace-separated words; start_position
  and end_position the answer's first and last word (-1 for a SQuAD 2.0
  question without an answer; None when not training).
  """
  qas_id: str
  question_text: str
  doc_tokens: list
  orig_answer_text: Optional[str] = None
  start_position: Optional[int] = None
  end_position: Optional[int] = None
  is_impossible: bool = False

  def __str__(self):
    return self.__repr__()

  def __repr__(self):
    # (The original printed positions only when nonzero: not word 0.)
    parts = [f"qas_id: {tokenization.printable_text(self.qas_id)}",
             "question_text: "
             f"{tokenization.printable_text(self.question_text)}",
             f"doc_tokens: [{' '.join(self.doc_tokens)}]"]
    if self.start_position is not None:
      parts += [f"start_position: {self.start_position}",
                f"end_position: {self.end_position}",
                f"is_impossible: {self.is_impossible!r}"]
    return ", ".join(parts)


@dataclasses.dataclass(eq=False)
class InputFeatures(object):
  """One window of an example, as the model's inputs.

  token_to_orig_map maps a position of `tokens` in the context window to
  its word in the example's doc_tokens; token_is_max_context tells whether
  this window is that token's max-context window. start_position and
  end_position index `tokens` (0, the [CLS], when the answer is not in
  the window or there is none).
  """
  unique_id: int
  example_index: int
  doc_span_index: int
  tokens: list
  token_to_orig_map: dict
  token_is_max_context: dict
  input_ids: list
  input_mask: list
  segment_ids: list
  start_position: Optional[int] = None
  end_position: Optional[int] = None
  is_impossible: Optional[bool] = None


def _is_whitespace(c):
  return c in " \t\r\n" or ord(c) == 0x202F


def _split_words(text):
  """(words, char_to_word): the whitespace-separated words of `text` and,
  for each character, the index of its word (a space: the word before)."""
  words, char_to_word = [], []
  after_space = True
  for c in text:
    if _is_whitespace(c):
      after_space = True
    else:
      if after_space:
        words.append(c)
      else:
        words[-1] += c
      after_space = False
    char_to_word.append(len(words) - 1)
  return words, char_to_word


def read_squad_examples(input_file, is_training,
                        version_2_with_negative=None):
  """The SquadExamples of a SQuAD JSON file.

  In training each question needs exactly one answer (or, with
  version_2_with_negative, is_impossible); an answer whose text is not
  found at its offset is skipped with a warning, as in the original.

  Args:
    input_file: SQuAD 1.1 or 2.0 JSON.
    is_training: read the answers' positions.
    version_2_with_negative: read is_impossible (default: the flag of that
      name, else False).
  """
  if version_2_with_negative is None:
    version_2_with_negative = flag_or_default("version_2_with_negative",
                                              False)
  with tf.io.gfile.GFile(input_file, "r") as reader:
    text = reader.read()
  try:
    input_data = json.loads(text)["data"]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"SQuAD file {input_file!r} is not SQuAD JSON (an "
                     f"object with a \"data\" list): {e!r}") from e

  examples = []
  for entry in input_data:
    for paragraph in entry["paragraphs"]:
      doc_tokens, char_to_word = _split_words(paragraph["context"])
      for qa in paragraph["qas"]:
        example = _example(qa, doc_tokens, char_to_word, is_training,
                           version_2_with_negative, input_file)
        if example is not None:
          examples.append(example)
  return examples


def _example(qa, doc_tokens, char_to_word, is_training,
             version_2_with_negative, input_file):
  """The SquadExample of one question (None if its answer is not found)."""
  start_position = end_position = orig_answer_text = None
  is_impossible = False
  if is_training:
    if version_2_with_negative:
      is_impossible = bool(qa.get("is_impossible", False))
    answers = qa.get("answers", [])
    if len(answers) != 1 and not is_impossible:
      raise ValueError(
          f"SQuAD file {input_file!r}, question {qa['id']!r}: for training "
          f"each question needs exactly 1 answer, it has {len(answers)}.")
    if is_impossible:
      start_position = end_position = -1
      orig_answer_text = ""
    else:
      orig_answer_text = answers[0]["text"]
      offset = answers[0]["answer_start"]
      last = offset + len(orig_answer_text) - 1
      if not orig_answer_text or offset < 0 or last >= len(char_to_word):
        raise ValueError(
            f"SQuAD file {input_file!r}, question {qa['id']!r}: answer "
            f"{orig_answer_text!r} at character {offset} is outside its "
            f"context ({len(char_to_word)} characters).")
      start_position = char_to_word[offset]
      end_position = char_to_word[last]
      found = " ".join(doc_tokens[start_position:end_position + 1])
      wanted = " ".join(tokenization.whitespace_tokenize(orig_answer_text))
      if wanted not in found:
        logging.warning("Could not find answer: %r vs. %r", found, wanted)
        return None
  return SquadExample(
      qas_id=qa["id"],
      question_text=qa["question"],
      doc_tokens=doc_tokens,
      orig_answer_text=orig_answer_text,
      start_position=start_position,
      end_position=end_position,
      is_impossible=is_impossible)


def convert_examples_to_features(examples, tokenizer, max_seq_length,
                                 doc_stride, max_query_length, is_training,
                                 output_fn):
  """Calls output_fn(InputFeatures) for each window of each example.

  The question is cut to max_query_length tokens; the context is cut into
  windows of max_seq_length - question - 3 tokens starting doc_stride
  tokens apart (the last window ends at the context's end). Unique ids
  count up from FIRST_UNIQUE_ID.
  """
  unique_id = FIRST_UNIQUE_ID
  for example_index, example in enumerate(examples):
    query_tokens = tokenizer.tokenize(example.question_text)
    query_tokens = query_tokens[:max_query_length]

    tok_to_orig_index = []
    orig_to_tok_index = []
    all_doc_tokens = []
    for i, word in enumerate(example.doc_tokens):
      orig_to_tok_index.append(len(all_doc_tokens))
      for sub_token in tokenizer.tokenize(word):
        tok_to_orig_index.append(i)
        all_doc_tokens.append(sub_token)

    tok_start = tok_end = None
    if is_training and example.is_impossible:
      tok_start = tok_end = -1
    elif is_training:
      tok_start = orig_to_tok_index[example.start_position]
      if example.end_position < len(example.doc_tokens) - 1:
        tok_end = orig_to_tok_index[example.end_position + 1] - 1
      else:
        tok_end = len(all_doc_tokens) - 1
      tok_start, tok_end = _improve_answer_span(
          all_doc_tokens, tok_start, tok_end, tokenizer,
          example.orig_answer_text)

    max_tokens_for_doc = max_seq_length - len(query_tokens) - 3
    if max_tokens_for_doc <= 0:
      raise ValueError(
          f"max_seq_length {max_seq_length} leaves no room for the context "
          f"after a question of {len(query_tokens)} tokens: it must exceed "
          "max_query_length + 3.")
    doc_spans = _doc_spans(len(all_doc_tokens), max_tokens_for_doc,
                           doc_stride)

    for doc_span_index, doc_span in enumerate(doc_spans):
      tokens = ["[CLS]"] + query_tokens + ["[SEP]"]
      segment_ids = [0] * len(tokens)
      token_to_orig_map = {}
      token_is_max_context = {}
      for i in range(doc_span.length):
        split_token_index = doc_span.start + i
        token_to_orig_map[len(tokens)] = tok_to_orig_index[split_token_index]
        token_is_max_context[len(tokens)] = _check_is_max_context(
            doc_spans, doc_span_index, split_token_index)
        tokens.append(all_doc_tokens[split_token_index])
        segment_ids.append(1)
      tokens.append("[SEP]")
      segment_ids.append(1)

      input_ids = tokenizer.convert_tokens_to_ids(tokens)
      input_mask = [1] * len(input_ids)
      padding = max_seq_length - len(input_ids)
      input_ids += [0] * padding
      input_mask += [0] * padding
      segment_ids += [0] * padding

      start_position = end_position = None
      if is_training:
        doc_start = doc_span.start
        doc_end = doc_span.start + doc_span.length - 1
        if (example.is_impossible or tok_start < doc_start or
            tok_end > doc_end):
          # No answer in this window: the model should point at [CLS].
          start_position = end_position = 0
        else:
          doc_offset = len(query_tokens) + 2
          start_position = tok_start - doc_start + doc_offset
          end_position = tok_end - doc_start + doc_offset

      if example_index < 5:
        logging.info("SQuAD feature %d (example %d, window %d): %s",
                     unique_id, example_index, doc_span_index,
                     " ".join(tokenization.printable_text(t)
                              for t in tokens))
        if start_position is not None:
          logging.info("  answer tokens %d-%d: %s", start_position,
                       end_position,
                       " ".join(tokens[start_position:end_position + 1]))

      output_fn(InputFeatures(
          unique_id=unique_id,
          example_index=example_index,
          doc_span_index=doc_span_index,
          tokens=tokens,
          token_to_orig_map=token_to_orig_map,
          token_is_max_context=token_is_max_context,
          input_ids=input_ids,
          input_mask=input_mask,
          segment_ids=segment_ids,
          start_position=start_position,
          end_position=end_position,
          is_impossible=example.is_impossible))
      unique_id += 1


def _doc_spans(num_tokens, max_tokens_for_doc, doc_stride):
  """Windows (start, length) over num_tokens tokens, doc_stride apart,
  the last one reaching the end."""
  spans = []
  start = 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens_for_doc)
    spans.append(_DocSpan(start=start, length=length))
    if start + length == num_tokens:
      break
    start += min(length, doc_stride)
  return spans


def _improve_answer_span(doc_tokens, input_start, input_end, tokenizer,
                         orig_answer_text):
  """The sub-span of [input_start, input_end] whose tokens are exactly the
  answer's tokens, if any, else the span itself.

  The answer's words may carry more than the answer: for the answer
  "1895" of the word "(1895-1943)." the tokens are "( 1895 - 1943 ) .",
  of which "1895" alone matches.
  """
  answer = " ".join(tokenizer.tokenize(orig_answer_text))
  for new_start in range(input_start, input_end + 1):
    for new_end in range(input_end, new_start - 1, -1):
      if " ".join(doc_tokens[new_start:new_end + 1]) == answer:
        return new_start, new_end
  return input_start, input_end


def _check_is_max_context(doc_spans, cur_span_index, position):
  """True if window cur_span_index gives token `position` its most context.

  A token's context in a window is the smaller of its left and right
  context (plus 0.01 per token of the window, to break ties towards
  longer windows); the first best window wins.
  """
  best_score = None
  best_span_index = None
  for span_index, span in enumerate(doc_spans):
    end = span.start + span.length - 1
    if position < span.start or position > end:
      continue
    score = min(position - span.start, end - position) + 0.01 * span.length
    if best_score is None or score > best_score:
      best_score = score
      best_span_index = span_index
  return cur_span_index == best_span_index


def _int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


class FeatureWriter(object):
  """Writes InputFeatures to a TFRecord file as tf.train.Examples."""

  def __init__(self, filename, is_training):
    self.filename = filename
    self.is_training = is_training
    self.num_features = 0
    self._writer = tf.io.TFRecordWriter(filename)

  def process_feature(self, feature):
    """Writes one InputFeatures (with its answer positions in training)."""
    self.num_features += 1
    features = collections.OrderedDict()
    features["unique_ids"] = _int_feature([feature.unique_id])
    features["input_ids"] = _int_feature(feature.input_ids)
    features["input_mask"] = _int_feature(feature.input_mask)
    features["segment_ids"] = _int_feature(feature.segment_ids)
    if self.is_training:
      features["start_positions"] = _int_feature([feature.start_position])
      features["end_positions"] = _int_feature([feature.end_position])
      features["is_impossible"] = _int_feature([int(bool(
          feature.is_impossible))])
    example = tf.train.Example(features=tf.train.Features(feature=features))
    self._writer.write(example.SerializeToString())

  def close(self):
    self._writer.close()


def input_fn_builder(input_file, seq_length, is_training, drop_remainder):
  """An input_fn(params) reading FeatureWriter's records in batches of
  params["batch_size"] (int32 features).

  Training repeats and shuffles. Without drop_remainder the last partial
  batch is padded to a full one with examples of unique id 0 (a mesh
  splits a fixed batch; TPUEstimator padded predict batches the same
  way); their predictions belong to no feature.
  """
  name_to_features = {
      "unique_ids": tf.io.FixedLenFeature([], tf.int64),
      "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
      "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
  }
  if is_training:
    name_to_features["start_positions"] = tf.io.FixedLenFeature([], tf.int64)
    name_to_features["end_positions"] = tf.io.FixedLenFeature([], tf.int64)

  def decode(record):
    example = tf.io.parse_single_example(record, name_to_features)
    return {name: tf.cast(t, tf.int32) for name, t in example.items()}

  def pad(batch, batch_size):
    padded = {}
    for name, t in batch.items():
      missing = batch_size - tf.shape(t)[0]
      paddings = [[0, missing]] + [[0, 0]] * (t.shape.rank - 1)
      t = tf.pad(t, paddings)
      t.set_shape([batch_size] + t.shape.as_list()[1:])
      padded[name] = t
    return padded

  def input_fn(params):
    batch_size = params["batch_size"]
    d = tf.data.TFRecordDataset(input_file)
    if is_training:
      d = d.repeat()
      d = d.shuffle(buffer_size=100)
    d = d.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    d = d.batch(batch_size, drop_remainder=drop_remainder)
    if not drop_remainder:
      d = d.map(lambda batch: pad(batch, batch_size))
    return d

  return input_fn
