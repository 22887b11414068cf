"""Vocabularies: strings to lists of integer ids and back.

As in the original, id 0 is padding and id 1 ends a sequence (EOS); every
vocabulary encodes both in Python (`encode`, `decode`) and in TensorFlow
(`encode_tf`, `decode_tf`, usable inside `tf.data`).

- `ByteVocabulary`: UTF-8 bytes, always available (ids 3..258; 2 is UNK).
- `SentencePieceVocabulary`: a SentencePiece model file, run by
  tensorflow-text in TensorFlow and in Python alike.
- `WordpieceVocabulary`: BERT's WordPiece through tensorflow-text, from a
  token list or learned from a dataset.
- `TFDSVocabulary` / `get_tfds_vocabulary`: a TFDS text encoder, its ids
  shifted up by one to make room for EOS, as in the original.

Where this differs from the original: `Vocabulary` also has `eos_id` and
`unk_id`, and its unimplemented members name the class at fault.
"""

import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow.estimator import host_values

PAD_ID = 0
EOS_ID = 1


class Vocabulary(object):
  """Encodes strings as lists of integers; ids 0 (PAD) and 1 (EOS) are
  reserved."""

  @property
  def vocab_size(self):
    """Number of ids, PAD and EOS included."""
    raise self._missing("vocab_size")

  @property
  def eos_id(self):
    return EOS_ID

  @property
  def unk_id(self):
    """The id of unknown pieces, or None if the vocabulary has none."""
    return None

  def encode(self, s):
    """A Python string to a list of ints (no EOS appended)."""
    raise self._missing("encode")

  def decode(self, ids):
    """A list of ints to a Python string."""
    raise self._missing("decode")

  def encode_tf(self, s):
    """A scalar tf.string to a 1-D int32 tf.Tensor (no EOS appended)."""
    raise self._missing("encode_tf")

  def decode_tf(self, ids):
    """A 1-D integer tf.Tensor to a scalar tf.string."""
    raise self._missing("decode_tf")

  def _missing(self, member):
    return NotImplementedError(
        f"{type(self).__name__}.{member} is not implemented.")


def _before_eos(ids):
  """True for the ids before the first EOS of each sequence (last axis)."""
  return tf.math.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32),
                        axis=-1) == 0


class _TensorFlowVocabulary(Vocabulary):
  """A vocabulary computed by TF ops: Python encoding runs them eagerly.

  Its models reserve UNK=2 after PAD and EOS.
  """

  @property
  def unk_id(self):
    return 2

  def encode(self, s):
    return host_values.evaluate(
        lambda: self.encode_tf(tf.constant(s))).tolist()

  def decode(self, ids):
    return host_values.evaluate(lambda: self.decode_tf(
        tf.constant(list(ids), tf.int32))).decode("utf-8")


@gin.configurable(module="mesh_tensorflow.transformer.vocabulary")
class ByteVocabulary(Vocabulary):
  """The UTF-8 bytes of a string: byte b is id b + 3.

  Ids 0 (PAD), 1 (EOS) and 2 (UNK) are reserved, then 256 byte ids, then
  `extra_ids` sentinel ids (decoded as nothing). Decoding stops at the
  first EOS and drops the other reserved ids; bytes that are not valid
  UTF-8 are dropped (Python) or kept as they are (TensorFlow).
  """

  _OFFSET = 3

  def __init__(self, extra_ids=0):
    if extra_ids < 0:
      raise ValueError(f"ByteVocabulary extra_ids must be >= 0, got "
                       f"{extra_ids}.")
    self._extra_ids = int(extra_ids)

  @property
  def vocab_size(self):
    return self._OFFSET + 256 + self._extra_ids

  @property
  def unk_id(self):
    return 2

  def encode(self, s):
    return [b + self._OFFSET for b in s.encode("utf-8")]

  def decode(self, ids):
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    data = bytes(i - self._OFFSET for i in ids
                 if self._OFFSET <= i < self._OFFSET + 256)
    return data.decode("utf-8", errors="ignore")

  def encode_tf(self, s):
    """Scalar strings to 1-D ids; a 1-D batch of strings to ragged ids."""
    s = tf.convert_to_tensor(s, tf.string)
    pieces = tf.strings.bytes_split(s)
    to_ids = lambda p: tf.cast(
        tf.reshape(tf.io.decode_raw(p, tf.uint8), [-1]), tf.int32
    ) + self._OFFSET
    if isinstance(pieces, tf.RaggedTensor):
      return tf.ragged.map_flat_values(to_ids, pieces)
    return to_ids(pieces)

  def decode_tf(self, ids):
    """1-D ids to a scalar string; [batch, length] ids to 1-D strings."""
    ids = tf.convert_to_tensor(ids)
    ids = tf.cast(ids, tf.int32)
    # Everything from the first EOS on is dropped.
    is_byte = (ids >= self._OFFSET) & (ids < self._OFFSET + 256)
    keep = _before_eos(ids) & is_byte
    table = tf.constant([bytes([b]) for b in range(256)])
    pieces = tf.gather(table, tf.where(keep, ids - self._OFFSET, 0))
    pieces = tf.where(keep, pieces, tf.constant(b""))
    return tf.strings.reduce_join(pieces, axis=-1)


@gin.configurable(module="mesh_tensorflow.transformer.vocabulary")
class SentencePieceVocabulary(_TensorFlowVocabulary):
  """A SentencePiece model file, run by tensorflow-text.

  The model should reserve PAD=0, EOS=1 and UNK=2 (T5's models do; train
  with `pad_id=0, eos_id=1, unk_id=2, bos_id=-1`). `extra_ids` sentinel ids
  follow the model's pieces; decoding drops them and stops at EOS.
  """

  def __init__(self, sentencepiece_model_file, extra_ids=0):
    try:
      with tf.io.gfile.GFile(sentencepiece_model_file, "rb") as f:
        self._model = f.read()
    except (tf.errors.NotFoundError, OSError) as e:
      raise ValueError(f"SentencePieceVocabulary: cannot read the model "
                       f"file {sentencepiece_model_file!r} ({e}).") from e
    self._model_file = sentencepiece_model_file
    self._extra_ids = int(extra_ids)
    self._tokenizer = None

  @property
  def tokenizer(self):
    """The tensorflow_text.SentencepieceTokenizer (made on first use)."""
    if self._tokenizer is None:
      # Late import of tensorflow-text: only the SentencePiece and WordPiece
      # vocabularies need it (its ops load with it).
      import tensorflow_text  # pylint: disable=g-import-not-at-top
      try:
        self._tokenizer = tensorflow_text.SentencepieceTokenizer(
            model=self._model, out_type=tf.int32)
      except tf.errors.OpError as e:
        raise ValueError(f"SentencePieceVocabulary: {self._model_file!r} is "
                         f"not a SentencePiece model ({e.message}).") from e
    return self._tokenizer

  @property
  def _piece_count(self):
    return int(self.tokenizer.vocab_size())

  @property
  def vocab_size(self):
    return self._piece_count + self._extra_ids

  def encode_tf(self, s):
    return self.tokenizer.tokenize(s)

  def decode_tf(self, ids):
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    keep = _before_eos(ids) & (ids > EOS_ID) & (ids < self._piece_count)
    return self.tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep))


RESERVED_TOKENS = ("[PAD]", "[EOS]", "[UNK]")


@gin.configurable(module="mesh_tensorflow.transformer.vocabulary")
class WordpieceVocabulary(_TensorFlowVocabulary):
  """WordPiece (BERT's tokenizer) through tensorflow-text.

  `tokens` (or a file of one token per line) starts with RESERVED_TOKENS,
  so PAD=0, EOS=1 and UNK=2; continuation pieces start with "##". Text is
  split at whitespace and punctuation first, so decoding joins words with
  single spaces ("hi, you" comes back as "hi , you"). Build a vocabulary
  from text with `WordpieceVocabulary.from_dataset`.
  """

  def __init__(self, vocab_file=None, tokens=None, lower_case=True):
    if (vocab_file is None) == (tokens is None):
      raise ValueError("WordpieceVocabulary: give vocab_file or tokens.")
    if vocab_file is not None:
      try:
        with tf.io.gfile.GFile(vocab_file) as f:
          tokens = [line.rstrip("\n") for line in f]
      except (tf.errors.NotFoundError, OSError) as e:
        raise ValueError(f"WordpieceVocabulary: cannot read the vocabulary "
                         f"file {vocab_file!r} ({e}).") from e
    tokens = list(tokens)
    if tuple(tokens[:3]) != RESERVED_TOKENS:
      raise ValueError(f"WordpieceVocabulary: the first tokens must be "
                       f"{list(RESERVED_TOKENS)}, got {tokens[:3]}.")
    self._tokens = tokens
    self._lower_case = lower_case
    self._tokenizer = None

  @classmethod
  def from_dataset(cls, dataset, vocab_size, lower_case=True,
                   vocab_file=None):
    """Learns a vocabulary of about `vocab_size` tokens from a dataset of
    strings (tensorflow-text's BERT vocabulary learner); writes it to
    `vocab_file` if given."""
    # Late import of tensorflow-text (its vocabulary learner): only the
    # SentencePiece and WordPiece vocabularies need it.
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset  # pylint: disable=g-import-not-at-top
    tokens = bert_vocab_from_dataset.bert_vocab_from_dataset(
        dataset.batch(1024), vocab_size=vocab_size,
        reserved_tokens=list(RESERVED_TOKENS),
        bert_tokenizer_params={"lower_case": lower_case}, learn_params={})
    if vocab_file is not None:
      with tf.io.gfile.GFile(vocab_file, "w") as f:
        f.write("".join(t + "\n" for t in tokens))
    return cls(tokens=tokens, lower_case=lower_case)

  @property
  def tokenizer(self):
    """The tensorflow_text.BertTokenizer (made on first use)."""
    if self._tokenizer is None:
      # Late import of tensorflow-text: only the SentencePiece and WordPiece
      # vocabularies need it (its ops load with it).
      import tensorflow_text  # pylint: disable=g-import-not-at-top
      table = tf.lookup.StaticVocabularyTable(
          tf.lookup.KeyValueTensorInitializer(
              self._tokens, tf.range(len(self._tokens), dtype=tf.int64)),
          num_oov_buckets=1)
      self._tokenizer = tensorflow_text.BertTokenizer(
          table, token_out_type=tf.int32, lower_case=self._lower_case,
          unknown_token=RESERVED_TOKENS[2])
    return self._tokenizer

  @property
  def vocab_size(self):
    return len(self._tokens)

  def encode_tf(self, s):
    """Scalar strings to 1-D ids; a 1-D batch of strings to ragged ids."""
    s = tf.convert_to_tensor(s, tf.string)
    pieces = self.tokenizer.tokenize(s)  # [batch (1 if scalar), words, pieces]
    if s.shape.rank == 0:
      return pieces.flat_values
    return pieces.merge_dims(-2, -1)

  def decode_tf(self, ids):
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    keep = _before_eos(ids) & (ids > EOS_ID) & (ids < len(self._tokens))
    single = ids.shape.rank == 1
    if single:  # The detokenizer wants a batch.
      ids, keep = ids[tf.newaxis], keep[tf.newaxis]
    words = self.tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep))
    text = tf.strings.reduce_join(words, axis=-1, separator=" ")
    return text[0] if single else text


class TFDSVocabulary(Vocabulary):
  """A TFDS text encoder (`encode`, `decode`, `vocab_size`), its ids
  shifted up by one: TFDS reserves 0 for padding, and 1 becomes EOS."""

  def __init__(self, tfds_encoder):
    self._tfds_encoder = tfds_encoder

  @property
  def vocab_size(self):
    return self._tfds_encoder.vocab_size + 1

  def encode(self, s):
    return [i + 1 for i in self._tfds_encoder.encode(s)]

  def decode(self, ids):
    return self._tfds_encoder.decode([int(i) - 1 for i in ids])

  def encode_tf(self, s):
    """Through `tf.py_function` (TFDS encoders are Python)."""
    ids = tf.py_function(
        lambda t: np.array(self.encode(t.numpy().decode("utf-8")), np.int32),
        [s], tf.int32)
    ids.set_shape([None])
    return ids

  def decode_tf(self, ids):
    text = tf.py_function(
        lambda t: self.decode(t.numpy().tolist()).encode("utf-8"),
        [ids], tf.string)
    text.set_shape([])
    return text


@gin.configurable(module="mesh_tensorflow.transformer.vocabulary")
def get_tfds_vocabulary(dataset_name=gin.REQUIRED):
  """The TFDS encoder of a dataset's targets feature, as a TFDSVocabulary.

  Assumes the inputs, if any, use the same encoder (as the original did).
  """
  # Late import of tensorflow-datasets (seconds to import): only TFDS
  # vocabularies and datasets need it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  info = tfds.builder(dataset_name).info
  if not info.supervised_keys:
    raise ValueError(f"get_tfds_vocabulary: TFDS dataset {dataset_name!r} "
                     "has no supervised keys to find its targets feature.")
  feature = info.features[info.supervised_keys[1]]
  encoder = getattr(feature, "encoder", None)
  if encoder is None:
    raise ValueError(
        f"get_tfds_vocabulary: the targets feature of TFDS dataset "
        f"{dataset_name!r} has no text encoder (plain-text datasets need "
        "a vocabulary such as ByteVocabulary).")
  return TFDSVocabulary(encoder)
