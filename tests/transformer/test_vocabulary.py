"""Tests of the vocabularies: Python and TensorFlow encodings agree."""

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.transformer import vocabulary

TEXTS = ["", "hello", "Grüße, 世界!", "tab\there\nnewline"]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_vocabulary_round_trip_in_python_and_tf(text):
  vocab = vocabulary.ByteVocabulary()
  ids = vocab.encode(text)
  assert ids == [b + 3 for b in text.encode("utf-8")]
  assert vocab.decode(ids) == text
  assert np.asarray(vocab.encode_tf(tf.constant(text))).tolist() == ids
  assert vocab.decode_tf(tf.constant(ids, tf.int32)).numpy().decode(
      "utf-8") == text


def test_byte_vocabulary_sizes_and_reserved_ids():
  vocab = vocabulary.ByteVocabulary(extra_ids=5)
  assert vocab.vocab_size == 264
  assert (vocab.eos_id, vocab.unk_id) == (1, 2)
  assert vocabulary.ByteVocabulary().vocab_size == 259
  with pytest.raises(ValueError, match="extra_ids"):
    vocabulary.ByteVocabulary(extra_ids=-1)


def test_decoding_stops_at_eos_and_drops_reserved_ids():
  vocab = vocabulary.ByteVocabulary(extra_ids=2)
  ids = [0, 2] + vocab.encode("ab") + [259, 0] + vocab.encode("c") + [
      1] + vocab.encode("dropped")
  assert vocab.decode(ids) == "abc"
  assert vocab.decode_tf(tf.constant(ids)).numpy() == b"abc"


def test_tf_encoding_works_in_batches_and_in_tf_data():
  vocab = vocabulary.ByteVocabulary()
  ragged = vocab.encode_tf(tf.constant(["ab", "xyz"]))
  assert ragged.to_list() == [vocab.encode("ab"), vocab.encode("xyz")]
  padded = tf.constant([vocab.encode("ab") + [1, 0],
                        vocab.encode("xyz") + [1]])
  assert vocab.decode_tf(padded).numpy().tolist() == [b"ab", b"xyz"]
  ds = tf.data.Dataset.from_tensor_slices(["one", "two"]).map(
      vocab.encode_tf)
  assert [vocab.decode(x) for x in ds.as_numpy_iterator()] == ["one", "two"]


class _FakeTfdsEncoder:
  """A TFDS-like encoder: 0 is padding, words are 1.."""

  def __init__(self, words):
    self._words = list(words)
    self.vocab_size = len(self._words) + 1

  def encode(self, s):
    return [self._words.index(w) + 1 for w in s.split()]

  def decode(self, ids):
    return " ".join(self._words[i - 1] for i in ids)


def test_tfds_vocabulary_shifts_ids_for_eos():
  vocab = vocabulary.TFDSVocabulary(_FakeTfdsEncoder(["a", "b", "c"]))
  assert vocab.vocab_size == 5
  assert vocab.encode("b c a") == [3, 4, 2]
  assert vocab.decode([3, 4, 2]) == "b c a"
  assert np.asarray(vocab.encode_tf(tf.constant("c a"))).tolist() == [4, 2]
  assert vocab.decode_tf(tf.constant([2, 3])).numpy() == b"a b"


def test_get_tfds_vocabulary_reads_the_targets_encoder(monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class Feature:
    encoder = _FakeTfdsEncoder(["x"])

  class Info:
    supervised_keys = ("inputs", "targets")
    features = {"targets": Feature()}

  class Builder:
    info = Info()

  monkeypatch.setattr(tfds, "builder", lambda name: Builder())
  vocab = vocabulary.get_tfds_vocabulary("fake_dataset")
  assert vocab.vocab_size == 3 and vocab.encode("x") == [2]
  Info.features = {"targets": object()}
  with pytest.raises(ValueError, match="no text encoder"):
    vocabulary.get_tfds_vocabulary("fake_dataset")


def test_the_interface_names_what_is_missing():
  with pytest.raises(NotImplementedError, match="Vocabulary.encode_tf"):
    vocabulary.Vocabulary().encode_tf(tf.constant("a"))


_CORPUS = ["the quick brown fox jumps over the lazy dog",
           "a lazy dog sleeps in the sun", "the fox runs quick and brown",
           "sun and dog and fox"] * 20


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory):
  """A tiny SentencePiece model trained here (PAD 0, EOS 1, UNK 2)."""
  sentencepiece = pytest.importorskip("sentencepiece")
  folder = tmp_path_factory.mktemp("spm")
  corpus = folder / "corpus.txt"
  corpus.write_text("\n".join(_CORPUS))
  sentencepiece.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(folder / "tiny"), vocab_size=32,
      model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      minloglevel=2)
  return str(folder / "tiny.model")


@pytest.mark.parametrize("text", ["the lazy fox", "dog and sun", ""])
def test_sentencepiece_round_trip_in_python_and_tf(sentencepiece_model, text):
  vocab = vocabulary.SentencePieceVocabulary(sentencepiece_model, extra_ids=3)
  assert vocab.vocab_size == 35 and (vocab.eos_id, vocab.unk_id) == (1, 2)
  ids = vocab.encode(text)
  assert all(3 <= i < 32 for i in ids)
  assert vocab.decode(ids) == text
  assert np.asarray(vocab.encode_tf(tf.constant(text))).tolist() == ids
  assert vocab.decode_tf(tf.constant(ids + [1, 33] + ids)).numpy().decode(
      "utf-8") == text
  ds = tf.data.Dataset.from_tensor_slices([text]).map(vocab.encode_tf)
  assert [list(x) for x in ds.as_numpy_iterator()] == [ids]


def test_sentencepiece_bad_files_are_named(tmp_path):
  with pytest.raises(ValueError, match="cannot read the model file"):
    vocabulary.SentencePieceVocabulary(str(tmp_path / "missing.model"))
  junk = tmp_path / "junk.model"
  junk.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    _ = vocabulary.SentencePieceVocabulary(str(junk)).vocab_size


@pytest.fixture(scope="module")
def wordpiece_vocab(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("wp") / "vocab.txt")
  ds = tf.data.Dataset.from_tensor_slices(_CORPUS)
  vocabulary.WordpieceVocabulary.from_dataset(ds, vocab_size=60,
                                              vocab_file=path)
  return vocabulary.WordpieceVocabulary(vocab_file=path)


@pytest.mark.parametrize("text", ["the lazy fox", "dog and sun", ""])
def test_wordpiece_round_trip_in_python_and_tf(wordpiece_vocab, text):
  vocab = wordpiece_vocab
  assert (vocab.eos_id, vocab.unk_id) == (1, 2) and vocab.vocab_size > 30
  ids = vocab.encode(text)
  assert all(3 <= i < vocab.vocab_size for i in ids)
  assert vocab.decode(ids) == text
  assert np.asarray(vocab.encode_tf(tf.constant(text))).tolist() == ids
  assert vocab.decode_tf(tf.constant(ids + [1] + ids)).numpy().decode(
      "utf-8") == text


def test_wordpiece_batches_unknowns_and_bad_vocabularies(wordpiece_vocab):
  vocab = wordpiece_vocab
  batch = vocab.encode_tf(tf.constant(["the dog", "sun"]))
  assert batch.to_list() == [vocab.encode("the dog"), vocab.encode("sun")]
  assert 2 in vocab.encode("the 42")  # No digits in the corpus.
  with pytest.raises(ValueError, match="first tokens must be"):
    vocabulary.WordpieceVocabulary(tokens=["a", "b", "c"])
  with pytest.raises(ValueError, match="cannot read the vocabulary file"):
    vocabulary.WordpieceVocabulary(vocab_file="/nonexistent/vocab.txt")
  with pytest.raises(ValueError, match="give vocab_file or tokens"):
    vocabulary.WordpieceVocabulary()
