"""Text files -> BERT pretraining TFRecords (masked LM + next sentence).

The data tool of Google's BERT, same algorithm and flags:

  python -m mesh_tensorflow.bert.create_pretraining_data \\
    --input_file=corpus.txt --output_file=train.tfrecord \\
    --vocab_file=vocab.txt --max_seq_length=128 --dupe_factor=10

Input: one sentence per line, documents separated by blank lines. Each
document is cut into chunks of sentences about max_seq_length - 3 tokens
long (shorter with probability short_seq_prob); a chunk is split at a
random sentence boundary into segment A and B, and with probability 1/2
(always for a one-sentence chunk) B is replaced by sentences of another
random document (next_sentence_labels 1). The pair is truncated to fit,
randomly from its front or back, and laid out as [CLS] A [SEP] B [SEP].
Then masked_lm_prob of the tokens (at most max_predictions_per_seq, at
least one) are chosen for prediction, whole words at a time with
--do_whole_word_mask; each chosen token becomes [MASK] 80% of the time,
stays 10% and becomes a random vocabulary token 10%. The documents are
processed dupe_factor times with different masks, and the instances
shuffled. Everything draws from one random.Random(--random_seed), so a
seed gives the same bytes (records are serialized deterministically), and
the same records as Google's tool given the same tokens.

The text is tokenized in batches on tensorflow-text
(tokenization.InGraphTokenizer), which gives FullTokenizer's tokens
(except with --preserve_unused_tokens: see tokenization).

Each record has the features the pretraining binary reads
(`feature_spec`): input_ids, input_mask, segment_ids (int64,
max_seq_length, zero-padded), masked_lm_positions, masked_lm_ids (int64,
max_predictions_per_seq), masked_lm_weights (float: 1 for a prediction, 0
for padding) and next_sentence_labels (int64, 1 if B is random).
"""

import collections
import dataclasses
import random

from absl import flags
from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert import run_common
from mesh_tensorflow.bert import tokenization

FLAGS = flags.FLAGS

_define = run_common.define
_define("string", "input_file", None,
        "Input raw text file (or comma-separated list of files; globs).")
_define("string", "output_file", None,
        "Output TFRecord file (or comma-separated list of files, written "
        "round-robin).")
_define("string", "vocab_file", None,
        "The vocabulary file that the BERT model was trained on.")
_define("bool", "do_lower_case", True,
        "Whether to lower case the input text. Should be True for uncased "
        "models and False for cased models.")
_define("bool", "do_whole_word_mask", False,
        "Whether to use whole word masking rather than per-WordPiece "
        "masking.")
_define("integer", "max_seq_length", 128, "Maximum sequence length.")
_define("integer", "max_predictions_per_seq", 20,
        "Maximum number of masked LM predictions per sequence.")
_define("integer", "random_seed", 12345, "Random seed for data generation.")
_define("integer", "dupe_factor", 10,
        "Number of times to duplicate the input data (with different "
        "masks).")
_define("float", "masked_lm_prob", 0.15, "Masked LM probability.")
_define("float", "short_seq_prob", 0.1,
        "Probability of creating sequences which are shorter than the "
        "maximum length.")
# run_common.run reads it (the binaries define it with the mesh flags).
_define("bool", "show_traceback", False,
        "On bad input, also log the Python traceback.")

# Lines tokenized per call of the in-graph tokenizer.
TOKENIZE_BATCH = 4096


@dataclasses.dataclass(eq=False)
class TrainingInstance(object):
  """One sentence pair: its tokens, segments and masked LM targets."""
  tokens: list
  segment_ids: list
  masked_lm_positions: list
  masked_lm_labels: list
  is_random_next: bool

  def __str__(self):
    return (f"tokens: {' '.join(self.tokens)}\n"
            f"segment_ids: {' '.join(map(str, self.segment_ids))}\n"
            f"is_random_next: {self.is_random_next}\n"
            f"masked_lm_positions: "
            f"{' '.join(map(str, self.masked_lm_positions))}\n"
            f"masked_lm_labels: {' '.join(self.masked_lm_labels)}\n")

  __repr__ = __str__


MaskedLmInstance = collections.namedtuple("MaskedLmInstance",
                                          ["index", "label"])


def feature_spec(max_seq_length, max_predictions_per_seq):
  """tf.io.parse_example features of the records this tool writes."""
  ints = lambda n: tf.io.FixedLenFeature([n], tf.int64)
  return {
      "input_ids": ints(max_seq_length),
      "input_mask": ints(max_seq_length),
      "segment_ids": ints(max_seq_length),
      "masked_lm_positions": ints(max_predictions_per_seq),
      "masked_lm_ids": ints(max_predictions_per_seq),
      "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq],
                                                 tf.float32),
      "next_sentence_labels": ints(1),
  }


def create_int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def create_float_feature(values):
  return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def _padded(values, length, pad):
  return list(values) + [pad] * (length - len(values))


def instance_to_example(instance, tokenizer, max_seq_length,
                        max_predictions_per_seq):
  """A tf.train.Example of one TrainingInstance, padded to the lengths."""
  input_ids = tokenizer.convert_tokens_to_ids(instance.tokens)
  if len(input_ids) > max_seq_length:
    raise ValueError(f"An instance of {len(input_ids)} tokens does not fit "
                     f"max_seq_length={max_seq_length}.")
  masked_lm_ids = tokenizer.convert_tokens_to_ids(instance.masked_lm_labels)
  features = collections.OrderedDict()
  features["input_ids"] = create_int_feature(
      _padded(input_ids, max_seq_length, 0))
  features["input_mask"] = create_int_feature(
      _padded([1] * len(input_ids), max_seq_length, 0))
  features["segment_ids"] = create_int_feature(
      _padded(instance.segment_ids, max_seq_length, 0))
  features["masked_lm_positions"] = create_int_feature(
      _padded(instance.masked_lm_positions, max_predictions_per_seq, 0))
  features["masked_lm_ids"] = create_int_feature(
      _padded(masked_lm_ids, max_predictions_per_seq, 0))
  features["masked_lm_weights"] = create_float_feature(
      _padded([1.0] * len(masked_lm_ids), max_predictions_per_seq, 0.0))
  features["next_sentence_labels"] = create_int_feature(
      [1 if instance.is_random_next else 0])
  return tf.train.Example(features=tf.train.Features(feature=features))


def write_instance_to_example_files(instances, tokenizer, max_seq_length,
                                    max_predictions_per_seq, output_files):
  """Writes the instances round-robin to the files; returns how many."""
  writers = [tf.io.TFRecordWriter(path) for path in output_files]
  try:
    for index, instance in enumerate(instances):
      example = instance_to_example(instance, tokenizer, max_seq_length,
                                    max_predictions_per_seq)
      writers[index % len(writers)].write(
          example.SerializeToString(deterministic=True))
      if index < 5:
        logging.info("Example %d:\n%s", index, instance)
  finally:
    for writer in writers:
      writer.close()
  logging.info("Wrote %d instances to %s.", len(instances),
               ", ".join(output_files))
  return len(instances)


def tokenize_lines(tokenizer, lines):
  """The tokens of each line: batched in-graph, or FullTokenizer per line."""
  if not isinstance(tokenizer, tokenization.InGraphTokenizer):
    return [tokenizer.tokenize(line) for line in lines]
  tokenize = tf.function(
      tokenizer.tokenize,
      input_signature=[tf.TensorSpec([None], tf.string)])
  tokens = []
  for start in range(0, len(lines), TOKENIZE_BATCH):
    batch = tokenize(tf.constant(lines[start:start + TOKENIZE_BATCH]))
    tokens.extend(tokenizer.convert_ids_to_tokens(ids)
                  for ids in batch.to_list())
  return tokens


def read_documents(input_files, tokenizer):
  """The tokenized documents: lists of sentences (lists of tokens).

  A blank line ends a document; lines with no tokens are skipped; empty
  documents are dropped.
  """
  lines = []
  for path in input_files:
    with tf.io.gfile.GFile(path, "rb") as reader:
      lines.extend(tokenization.convert_to_unicode(line).strip()
                   for line in reader)
  documents = [[]]
  for line, tokens in zip(lines, tokenize_lines(tokenizer, lines)):
    if not line:
      documents.append([])
    elif tokens:
      documents[-1].append(tokens)
  return [document for document in documents if document]


def create_training_instances(input_files, tokenizer, max_seq_length,
                              dupe_factor, short_seq_prob, masked_lm_prob,
                              max_predictions_per_seq, rng,
                              do_whole_word_mask=False):
  """The shuffled TrainingInstances of the text files (module docstring).

  Args:
    input_files: paths of text files, one sentence per line, blank lines
      between documents.
    tokenizer: a tokenization.InGraphTokenizer (batched) or FullTokenizer.
    max_seq_length, dupe_factor, short_seq_prob, masked_lm_prob,
      max_predictions_per_seq, do_whole_word_mask: as the flags.
    rng: a random.Random, the only source of randomness.

  Returns:
    a list of TrainingInstance.
  """
  documents = read_documents(input_files, tokenizer)
  rng.shuffle(documents)
  vocab_words = list(tokenizer.vocab.keys())
  instances = []
  for _ in range(dupe_factor):
    for document_index in range(len(documents)):
      instances.extend(create_instances_from_document(
          documents, document_index, max_seq_length, short_seq_prob,
          masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
          do_whole_word_mask=do_whole_word_mask))
  rng.shuffle(instances)
  return instances


def _random_next_tokens(all_documents, document_index, target_length, rng):
  """Sentences of another random document, from a random one, to length."""
  # Ten tries at a different document (with one document, the same one).
  for _ in range(10):
    random_index = rng.randint(0, len(all_documents) - 1)
    if random_index != document_index:
      break
  document = all_documents[random_index]
  tokens = []
  for sentence in document[rng.randint(0, len(document) - 1):]:
    tokens.extend(sentence)
    if len(tokens) >= target_length:
      break
  return tokens


def create_instances_from_document(all_documents, document_index,
                                   max_seq_length, short_seq_prob,
                                   masked_lm_prob, max_predictions_per_seq,
                                   vocab_words, rng, do_whole_word_mask=False):
  """The TrainingInstances of one document (module docstring)."""
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP].
  # Mostly full sequences; sometimes shorter ones, so pretraining also
  # sees the short inputs of fine-tuning.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)

  instances = []
  chunk = []
  chunk_length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target_seq_length:
      # A is the chunk's first a_end sentences.
      a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
      tokens_a = [token for sentence in chunk[:a_end] for token in sentence]
      if len(chunk) == 1 or rng.random() < 0.5:
        is_random_next = True
        tokens_b = _random_next_tokens(
            all_documents, document_index,
            target_seq_length - len(tokens_a), rng)
        # The chunk's unused sentences start the next chunk.
        i -= len(chunk) - a_end
      else:
        is_random_next = False
        tokens_b = [token for sentence in chunk[a_end:]
                    for token in sentence]
      truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
      assert tokens_a and tokens_b
      tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
      segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
      tokens, masked_lm_positions, masked_lm_labels = (
          create_masked_lm_predictions(
              tokens, masked_lm_prob, max_predictions_per_seq, vocab_words,
              rng, do_whole_word_mask=do_whole_word_mask))
      instances.append(TrainingInstance(
          tokens=tokens, segment_ids=segment_ids,
          is_random_next=is_random_next,
          masked_lm_positions=masked_lm_positions,
          masked_lm_labels=masked_lm_labels))
      chunk = []
      chunk_length = 0
    i += 1
  return instances


def create_masked_lm_predictions(tokens, masked_lm_prob,
                                 max_predictions_per_seq, vocab_words, rng,
                                 do_whole_word_mask=False):
  """Masks tokens for the masked LM task.

  Returns:
    (output_tokens, masked_lm_positions, masked_lm_labels): the tokens
    with the chosen ones replaced (80% [MASK], 10% kept, 10% random),
    the chosen positions in increasing order and their original tokens.
  """
  candidates = []  # Lists of positions masked together.
  for i, token in enumerate(tokens):
    if token in ("[CLS]", "[SEP]"):
      continue
    # Whole word masking: a "##" piece goes with the word before it.
    if do_whole_word_mask and candidates and token.startswith("##"):
      candidates[-1].append(i)
    else:
      candidates.append([i])
  rng.shuffle(candidates)

  output_tokens = list(tokens)
  num_to_predict = min(max_predictions_per_seq,
                       max(1, int(round(len(tokens) * masked_lm_prob))))
  masked_lms = []
  covered = set()
  for positions in candidates:
    if len(masked_lms) >= num_to_predict:
      break
    # A whole word that would exceed the budget is skipped.
    if len(masked_lms) + len(positions) > num_to_predict:
      continue
    if covered.intersection(positions):
      continue
    for index in positions:
      covered.add(index)
      if rng.random() < 0.8:
        masked_token = "[MASK]"
      elif rng.random() < 0.5:
        masked_token = tokens[index]
      else:
        masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]
      output_tokens[index] = masked_token
      masked_lms.append(MaskedLmInstance(index=index, label=tokens[index]))
  masked_lms.sort(key=lambda masked: masked.index)
  return (output_tokens, [masked.index for masked in masked_lms],
          [masked.label for masked in masked_lms])


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  """Shortens the longer list (in place) until the two fit max_num_tokens.

  Each token is taken from the front or the back at random, so that
  neither end is favoured.
  """
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    assert longer
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()


def _split_flag(name):
  value = getattr(FLAGS, name)
  if not value:
    raise ValueError(f"--{name} is required.")
  return [part for part in value.split(",") if part]


def _check_flags():
  """Raises ValueError naming the first flag with a bad value."""
  if FLAGS.max_seq_length < 5:
    raise ValueError(f"--max_seq_length={FLAGS.max_seq_length}: needs at "
                     f"least 5 ([CLS] A [SEP] B [SEP] with 2 tokens each).")
  if FLAGS.max_predictions_per_seq < 0:
    raise ValueError(f"--max_predictions_per_seq="
                     f"{FLAGS.max_predictions_per_seq}: must be >= 0.")
  if FLAGS.dupe_factor < 1:
    raise ValueError(f"--dupe_factor={FLAGS.dupe_factor}: must be >= 1.")
  for name in ("masked_lm_prob", "short_seq_prob"):
    if not 0 <= getattr(FLAGS, name) <= 1:
      raise ValueError(f"--{name}={getattr(FLAGS, name)}: a probability "
                       f"must be in [0, 1].")


def input_files_of(patterns):
  """The files matching comma-separated globs; ValueError if none match."""
  files = []
  for pattern in patterns:
    matches = sorted(tf.io.gfile.glob(pattern))
    if not matches:
      raise ValueError(f"--input_file: no file matches {pattern!r}.")
    files.extend(matches)
  return files


def main(argv):
  del argv
  input_patterns = _split_flag("input_file")
  output_files = _split_flag("output_file")
  if not FLAGS.vocab_file:
    raise ValueError("--vocab_file is required.")
  _check_flags()
  input_files = input_files_of(input_patterns)
  logging.info("Reading %s", ", ".join(input_files))
  tokenizer = tokenization.InGraphTokenizer(
      FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case)
  instances = create_training_instances(
      input_files, tokenizer, FLAGS.max_seq_length, FLAGS.dupe_factor,
      FLAGS.short_seq_prob, FLAGS.masked_lm_prob,
      FLAGS.max_predictions_per_seq, random.Random(FLAGS.random_seed),
      do_whole_word_mask=FLAGS.do_whole_word_mask)
  if not instances:
    raise ValueError(f"--input_file={FLAGS.input_file}: no text to make "
                     f"instances of.")
  write_instance_to_example_files(instances, tokenizer, FLAGS.max_seq_length,
                                  FLAGS.max_predictions_per_seq, output_files)


if __name__ == "__main__":
  run_common.run(main)
