"""Tests of mesh_tensorflow.bert.tokenization.

The expected tokens are worked out by hand from the rules in the module
docstring (not computed with the code under test); the in-graph tokenizer
must then give the same ids, except where the module docstring says the
two differ.
"""

from absl import flags
from absl.testing import flagsaver
import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from mesh_tensorflow.bert import tokenization

FLAGS = flags.FLAGS

VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]",
    "[", "]", "mask", "hello", "the", "dog", "cafe", "s", "##s", "straße",
    "strasse", "中", "国", "人", "日", "本", "です", "てす", "un", "##aff",
    "##able",
    ",", ".", "!", "?", "'", "$", "^", "`", "a", "##a", "H", "##é", "##llo",
    "οδος", "é",
]

# Everything at once: accents, ß, CJK next to kana, punctuation runs, a
# NUL and a zero-width space inside a word (dropped, so it joins), a bell,
# tab, newline, no-break and ideographic spaces, an unknown word, a word
# of 201 characters, the Greek final sigma, [MASK] and [unused0]. Lower-
# casing strips the voicing mark of "で" too (NFD: "て" + U+3099, an Mn).
SAMPLE = ("Héllo, the DOG's CAFÉ!!  Straße\t中国人 日本語です\n"
          "[MASK] [unused0] un\x00aff\u200bable\x07 xyzzy aaa " + "a" * 201 +
          " ΟΔΟΣ?! the\u00a0dog\u3000$^`")

EXPECTED_UNCASED = [
    "hello", ",", "the", "dog", "'", "s", "cafe", "!", "!",
    "straße", "中", "国", "人", "日", "本", "[UNK]", "てす",
    "[", "mask", "]", "[", "[UNK]", "]", "un", "##aff", "##able",
    "[UNK]", "a", "##a", "##a", "[UNK]",
    "οδος", "?", "!", "the", "dog", "$", "^", "`",
]

EXPECTED_CASED = [
    "H", "##é", "##llo", ",", "the", "[UNK]", "'", "s", "[UNK]", "!",
    "!", "[UNK]", "中", "国", "人", "日", "本", "[UNK]", "です",
    "[", "[UNK]", "]", "[", "[UNK]", "]", "un", "##aff", "##able",
    "[UNK]", "a", "##a", "##a", "[UNK]",
    "[UNK]", "?", "!", "the", "dog", "$", "^", "`",
]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
  return str(path)


def ids(tokens):
  return [VOCAB.index(token) for token in tokens]


@pytest.mark.parametrize("do_lower_case, expected", [
    (True, EXPECTED_UNCASED), (False, EXPECTED_CASED)])
def test_full_tokenizer_on_the_sample(vocab_file, do_lower_case, expected):
  tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case)
  tokens = tokenizer.tokenize(SAMPLE)
  assert tokens == expected
  assert tokenizer.convert_tokens_to_ids(tokens) == ids(expected)
  assert tokenizer.convert_ids_to_tokens(ids(expected)) == expected
  assert tokenizer.tokenize(SAMPLE.encode("utf-8")) == expected


@pytest.mark.parametrize("do_lower_case, expected", [
    (True, EXPECTED_UNCASED), (False, EXPECTED_CASED)])
def test_in_graph_tokenizer_gives_the_same_ids(vocab_file, do_lower_case,
                                               expected):
  tokenizer = tokenization.InGraphTokenizer(vocab_file, do_lower_case)
  assert tokenizer.tokenize(SAMPLE).numpy().tolist() == ids(expected)
  # Batched, inside tf.data (graph mode), several rows.
  dataset = tf.data.Dataset.from_tensor_slices(
      [SAMPLE, "", "the dog"]).batch(3).map(tokenizer.tokenize)
  (batch,) = list(dataset)
  assert batch.to_list() == [ids(expected), [], ids(["the", "dog"])]


def test_basic_and_wordpiece_tokenizers():
  basic = tokenization.BasicTokenizer(do_lower_case=True)
  assert basic.tokenize(" \tHeLLo!How  \n Are yoU?  ") == [
      "hello", "!", "how", "are", "you", "?"]
  assert basic.tokenize("ah\u535A\u63A8zz") == ["ah", "\u535A", "\u63A8",
                                                 "zz"]
  assert basic.tokenize("\u00E9t\u00E9 na\u0308ive") == ["ete", "naive"]
  assert tokenization.BasicTokenizer(do_lower_case=False).tokenize(
      " \tHeLLo!How  \n Are yoU?  ") == ["HeLLo", "!", "How", "Are", "yoU",
                                         "?"]
  vocab = {"[UNK]": 0, "un": 1, "##aff": 2, "##able": 3, "want": 4,
           "##want": 5, "##ed": 6, "wa": 7, "runn": 8, "##ing": 9}
  wordpiece = tokenization.WordpieceTokenizer(vocab)
  assert wordpiece.tokenize("") == []
  assert wordpiece.tokenize("unwanted running") == [
      "un", "##want", "##ed", "runn", "##ing"]
  assert wordpiece.tokenize("unwantedX running") == [
      "[UNK]", "runn", "##ing"]
  short = tokenization.WordpieceTokenizer(
      vocab, unk_token="[UNK]", max_input_chars_per_word=5)
  assert short.tokenize("unaff unaffable") == ["un", "##aff", "[UNK]"]


def test_vocabulary_and_conversions(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("[UNK]\n  a \nb\r\na\nc\n", encoding="utf-8")
  vocab = tokenization.load_vocab(str(path))
  # Lines stripped; the repeated "a" takes no id of its own.
  assert list(vocab.items()) == [("[UNK]", 0), ("a", 1), ("b", 2), ("c", 3)]
  assert tokenization.convert_tokens_to_ids(vocab, ["c", "a"]) == [3, 1]
  assert tokenization.convert_ids_to_tokens({3: "c"}, [3]) == ["c"]
  assert tokenization.convert_by_vocab(vocab, ["b"]) == [2]
  assert tokenization.whitespace_tokenize("  a\tb \n") == ["a", "b"]
  assert tokenization.whitespace_tokenize(" ") == []
  assert tokenization.convert_to_unicode(b"caf\xc3\xa9\xff") == "café"
  assert tokenization.printable_text(b"x") == "x"
  with pytest.raises(ValueError, match="Unsupported string type"):
    tokenization.convert_to_unicode(3)
  # The in-graph tokenizer reads the same ids (duplicates shift "c").
  assert tokenization.InGraphTokenizer(str(path)).tokenize(
      "C b A").numpy().tolist() == [3, 2, 1]


PRESERVE_SAMPLE = "[unused0] [UNUSED0] a[unused0]s [unused1]. [unused9]"


def test_preserve_unused_tokens(vocab_file):
  expected = ["[unused0]", "[", "[UNK]", "]", "a", "[", "[UNK]", "]", "s",
              "[", "[UNK]", "]", ".", "[", "[UNK]", "]"]
  tokenizer = tokenization.FullTokenizer(vocab_file,
                                         preserve_unused_tokens=True)
  assert tokenizer.tokenize(PRESERVE_SAMPLE) == expected
  assert tokenization.preserve_token("[unused0]", tokenizer.vocab, True)
  assert not tokenization.preserve_token("[unused9]", tokenizer.vocab, True)
  assert not tokenization.preserve_token("[MASK]", tokenizer.vocab, True)
  assert not tokenization.preserve_token("[unused0]", tokenizer.vocab, False)
  # None reads the flag (False before flags are parsed).
  assert not tokenization.preserve_token("[unused0]", tokenizer.vocab)
  with flagsaver.flagsaver(preserve_unused_tokens=True):
    assert tokenization.preserve_token("[unused0]", tokenizer.vocab)
    assert tokenization.FullTokenizer(vocab_file).tokenize(
        "[unused0]") == ["[unused0]"]


def test_in_graph_preserve_unused_tokens_differs(vocab_file):
  """tensorflow-text keeps every "[unusedN]" match whole (docstring)."""
  tokenizer = tokenization.InGraphTokenizer(vocab_file,
                                            preserve_unused_tokens=True)
  assert tokenizer.tokenize(PRESERVE_SAMPLE).numpy().tolist() == ids([
      "[unused0]", "[unused0]", "a", "[unused0]", "s", "[unused1]", ".",
      "[UNK]"])
  # Without preserving, the two agree.
  tokenizer = tokenization.InGraphTokenizer(vocab_file)
  assert tokenizer.tokenize(PRESERVE_SAMPLE).numpy().tolist() == ids(
      tokenization.FullTokenizer(vocab_file).tokenize(PRESERVE_SAMPLE))


@pytest.mark.parametrize("text, do_lower_case, original, stock", [
    ("Straße", True, ["straße"], ["strasse"]),  # Case folding.
    ("ΟΔΟΣ", True, ["οδος"], ["[UNK]"]),  # No final sigma.
    ("s\x07s", True, ["s", "##s"], ["s", "s"]),  # Controls become spaces.
    ("the\u2028dog", True, ["the", "dog"], ["[UNK]"]),  # Not \s in RE2.
    ("s\ufffds", True, ["s", "##s"], ["[UNK]"]),  # U+FFFD is kept.
    ("é" * 150, False, ["é"] + ["##é"] * 149, ["[UNK]"]),  # Bytes, not chars.
])
def test_stock_bert_tokenizer_differs_where_ours_agrees(
    vocab_file, text, do_lower_case, original, stock):
  """Why InGraphTokenizer cleans, lower-cases and counts characters itself."""
  python = tokenization.FullTokenizer(vocab_file, do_lower_case)
  ours = tokenization.InGraphTokenizer(vocab_file, do_lower_case)
  plain = tf_text.BertTokenizer(vocab_file, lower_case=do_lower_case,
                                max_bytes_per_word=200)
  assert python.tokenize(text) == original
  assert ours.tokenize(text).numpy().tolist() == ids(original)
  assert plain.tokenize([text]).merge_dims(-2, -1).to_list() == [ids(stock)]


def test_validate_case_matches_checkpoint():
  tokenization.validate_case_matches_checkpoint(True, None)
  tokenization.validate_case_matches_checkpoint(True, "/m/model.ckpt")
  tokenization.validate_case_matches_checkpoint(
      True, "/m/uncased_L-12_H-768_A-12/bert_model.ckpt")
  with pytest.raises(ValueError, match="--do_lower_case=False"):
    tokenization.validate_case_matches_checkpoint(
        True, "/m/cased_L-12_H-768_A-12/bert_model.ckpt")
  with pytest.raises(ValueError, match="--do_lower_case=True"):
    tokenization.validate_case_matches_checkpoint(
        False, "gs://b/multilingual_L-12_H-768_A-12/bert_model.ckpt")
