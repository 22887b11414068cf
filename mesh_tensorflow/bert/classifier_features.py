"""From classifier examples to model inputs: token ids, TFRecords, datasets.

An example becomes `[CLS] a [SEP]` (one text) or `[CLS] a [SEP] b [SEP]`
(a pair), with segment id 0 up to and including the first [SEP] and 1
after it, truncated to max_seq_length by dropping tokens from the end of
the longer text, one at a time, and zero-padded to max_seq_length (mask 0
on the padding).
"""

import collections

from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert.classifier_data import InputFeatures
from mesh_tensorflow.bert.classifier_data import PaddingInputExample

# How many examples' features are logged, as the original did.
_LOGGED_EXAMPLES = 5


def _truncate_seq_pair(tokens_a, tokens_b, max_length):
  """Pops tokens off the longer list (b on ties) until both fit in
  max_length: a short text keeps its tokens, which carry more of it."""
  while len(tokens_a) + len(tokens_b) > max_length:
    if len(tokens_a) > len(tokens_b):
      tokens_a.pop()
    else:
      tokens_b.pop()


def convert_single_example(ex_index, example, label_list, max_seq_length,
                           tokenizer):
  """The `InputFeatures` of one `InputExample` (or PaddingInputExample).

  Args:
    ex_index: the example's position (the first few are logged).
    example: an InputExample, or a PaddingInputExample (all-zero features,
      is_real_example False).
    label_list: the task's labels; label_id is the label's index.
    max_seq_length: length of the ids, mask and segments.
    tokenizer: a tokenization.FullTokenizer (tokenize,
      convert_tokens_to_ids).

  Returns:
    an InputFeatures.

  Raises:
    ValueError: the example's label is not one of label_list, or
      max_seq_length leaves no room for the special tokens.
  """
  if isinstance(example, PaddingInputExample):
    return InputFeatures(input_ids=[0] * max_seq_length,
                         input_mask=[0] * max_seq_length,
                         segment_ids=[0] * max_seq_length,
                         label_id=0, is_real_example=False)
  label_map = {label: i for i, label in enumerate(label_list)}
  if example.label not in label_map:
    raise ValueError(f"Example {example.guid}: label {example.label!r} is "
                     f"not one of the task's labels {list(label_list)}.")
  tokens_a = tokenizer.tokenize(example.text_a)
  tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else None
  specials = 3 if tokens_b else 2
  if max_seq_length < specials:
    raise ValueError(f"max_seq_length={max_seq_length} leaves no room for "
                     f"the {specials} special tokens of example "
                     f"{example.guid}.")
  if tokens_b:
    _truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
  else:
    tokens_a = tokens_a[:max_seq_length - 2]

  tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
  segment_ids = [0] * len(tokens)
  if tokens_b:
    tokens += tokens_b + ["[SEP]"]
    segment_ids += [1] * (len(tokens_b) + 1)
  input_ids = tokenizer.convert_tokens_to_ids(tokens)
  input_mask = [1] * len(input_ids)
  padding = [0] * (max_seq_length - len(input_ids))
  input_ids = list(input_ids) + padding
  input_mask += padding
  segment_ids += padding
  label_id = label_map[example.label]
  if ex_index < _LOGGED_EXAMPLES:
    logging.info("*** Example %s: %s | ids %s | mask %s | segments %s | "
                 "label %s (id %d)", example.guid, " ".join(tokens),
                 input_ids, input_mask, segment_ids, example.label, label_id)
  return InputFeatures(input_ids=input_ids, input_mask=input_mask,
                       segment_ids=segment_ids, label_id=label_id,
                       is_real_example=True)


def convert_examples_to_features(examples, label_list, max_seq_length,
                                 tokenizer):
  """The `InputFeatures` of each example, in order."""
  return [convert_single_example(i, example, label_list, max_seq_length,
                                 tokenizer)
          for i, example in enumerate(examples)]


def _int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def file_based_convert_examples_to_features(examples, label_list,
                                            max_seq_length, tokenizer,
                                            output_file):
  """Writes the examples' features to a TFRecord file of tf.train.Examples
  (input_ids, input_mask, segment_ids, label_ids, is_real_example)."""
  with tf.io.TFRecordWriter(output_file) as writer:
    for i, example in enumerate(examples):
      feature = convert_single_example(i, example, label_list,
                                       max_seq_length, tokenizer)
      features = collections.OrderedDict(
          input_ids=_int_feature(feature.input_ids),
          input_mask=_int_feature(feature.input_mask),
          segment_ids=_int_feature(feature.segment_ids),
          label_ids=_int_feature([feature.label_id]),
          is_real_example=_int_feature([int(feature.is_real_example)]))
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=features)).SerializeToString())
  logging.info("Wrote %d examples to %s", len(examples), output_file)


def file_based_input_fn_builder(input_file, seq_length, is_training,
                                drop_remainder):
  """input_fn(params) reading a file_based_convert_examples_to_features
  file in batches of params["batch_size"] (int32 features).

  In training the records repeat forever, shuffled (buffer 100).
  """
  name_to_features = {
      "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
      "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
      "label_ids": tf.io.FixedLenFeature([], tf.int64),
      "is_real_example": tf.io.FixedLenFeature([], tf.int64),
  }

  def decode(record):
    # tf.train.Example holds int64; the model (and TPUs) take int32.
    example = tf.io.parse_single_example(record, name_to_features)
    return {name: tf.cast(t, tf.int32) for name, t in example.items()}

  def input_fn(params):
    dataset = tf.data.TFRecordDataset(input_file)
    if is_training:
      dataset = dataset.repeat().shuffle(buffer_size=100)
    return dataset.map(decode).batch(params["batch_size"],
                                     drop_remainder=drop_remainder)

  return input_fn


def input_fn_builder(features, seq_length, is_training, drop_remainder):
  """input_fn(params) over in-memory `InputFeatures` (small sets only: the
  data become constants of the program)."""

  def column(name, shape):
    return tf.constant([getattr(f, name) for f in features], tf.int32,
                       shape=shape)

  def input_fn(params):
    n = len(features)
    dataset = tf.data.Dataset.from_tensor_slices({
        "input_ids": column("input_ids", [n, seq_length]),
        "input_mask": column("input_mask", [n, seq_length]),
        "segment_ids": column("segment_ids", [n, seq_length]),
        "label_ids": column("label_id", [n]),
        "is_real_example": tf.constant(
            [int(f.is_real_example) for f in features], tf.int32,
            shape=[n]),
    })
    if is_training:
      dataset = dataset.repeat().shuffle(buffer_size=100)
    return dataset.batch(params["batch_size"],
                         drop_remainder=drop_remainder)

  return input_fn
