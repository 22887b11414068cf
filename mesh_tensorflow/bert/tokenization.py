"""BERT's WordPiece tokenization, in Python and inside the TensorFlow graph.

`FullTokenizer` (= `BasicTokenizer` then `WordpieceTokenizer`) behaves as
the original's, character for character:

1. Clean: drop U+0000, U+FFFD and control characters (Unicode Cc and Cf,
   except tab, newline and carriage return); map whitespace (Zs, tab,
   newline, carriage return) to a space.
2. Put spaces around CJK ideographs (the CJK Unified Ideographs blocks and
   their compatibility blocks; not kana or hangul), then split on
   whitespace.
3. Per word, unless preserved (below): with do_lower_case, lower-case
   (`str.lower`), decompose (NFD) and drop non-spacing marks (Mn), so
   "Héllo" -> "hello"; then split off every punctuation character
   (Unicode P*, and all non-alphanumeric printable ASCII such as "$", "^",
   "`").
4. WordPiece: greedy longest match first, continuation pieces prefixed
   "##"; a word with a character sequence the vocabulary cannot cover, or
   longer than max_input_chars_per_word characters, becomes "[UNK]" whole.

With preserve_unused_tokens (the `--preserve_unused_tokens` flag, or the
argument), a whitespace-delimited word that is exactly "[unusedN]" and is
in the vocabulary is kept whole, neither lower-cased nor split. Other
bracketed tokens such as "[MASK]" are not preserved: they become
"[", "mask", "]" as in the original.

`InGraphTokenizer` does the same in TensorFlow ops (tensorflow-text's
`BertTokenizer`), so an input pipeline can tokenize inside `tf.data`.
tensorflow-text's tokenizer alone differs from the original: it case-folds
("ß" -> "ss", no final sigma "ς"), turns control and format characters
into spaces instead of dropping them, keeps U+FFFD, does not split on some
whitespace (U+2028, U+2029, U+1680) and limits words by bytes, not
characters. `InGraphTokenizer` therefore cleans the text first (step 1 as
regular expressions), lower-cases with `tf.strings.lower` (the full
lower-case mapping of `str.lower`) and turns over-long words into "[UNK]"
by their character count, which makes it agree with `FullTokenizer`.
Where the two still differ, by design:

- preserve_unused_tokens: tensorflow-text keeps any "[unusedN]" whole,
  wherever it is (also inside a word, "a[unused0]b" -> "a", "[unused0]",
  "b"), after lower-casing ("[UNUSED0]" is kept too) and whether or not
  it is in the vocabulary (if not, it becomes "[UNK]"); the Python
  tokenizer splits all of these as ordinary text.

Both read the vocabulary with `load_vocab` (lines stripped, a repeated
token keeps its first id and takes none of its own), so their ids agree;
tensorflow-text reading the file itself would number its lines instead.
"""

import collections
import functools
import re
import unicodedata

from absl import flags
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.python.ops import bert_tokenizer

from mesh_tensorflow.bert import run_common

FLAGS = flags.FLAGS

run_common.define(
    "bool", "preserve_unused_tokens", False,
    "If True, words of the form [unusedN] that are in the vocabulary are "
    "kept whole instead of being split by WordPiece.")

UNKNOWN_TOKEN = "[UNK]"
MAX_INPUT_CHARS_PER_WORD = 200

_UNUSED_TOKEN_RE = re.compile(r"^\[unused\d+\]$")

# Code point ranges of the CJK ideographs that are split into single
# characters (as BERT's multilingual and Chinese models were trained).
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
              (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
              (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))

# Checkpoints of Google's releases whose casing is known.
_UNCASED_MODELS = ("uncased_L-24_H-1024_A-16", "uncased_L-12_H-768_A-12",
                   "multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12")
_CASED_MODELS = ("cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16",
                 "multi_cased_L-12_H-768_A-12")


def _preserving(preserve_unused_tokens):
  """The argument, or --preserve_unused_tokens (its value) when None."""
  if preserve_unused_tokens is not None:
    return bool(preserve_unused_tokens)
  return bool(FLAGS["preserve_unused_tokens"].value)


def preserve_token(token, vocab, preserve_unused_tokens=None):
  """Whether `token` skips tokenization: an in-vocabulary "[unusedN]".

  Only when preserving unused tokens: preserve_unused_tokens, or when it
  is None the --preserve_unused_tokens flag.
  """
  if not _preserving(preserve_unused_tokens):
    return False
  return token in vocab and bool(_UNUSED_TOKEN_RE.match(token))


def validate_case_matches_checkpoint(do_lower_case, init_checkpoint):
  """Raises ValueError if do_lower_case contradicts a known checkpoint.

  The casing is not stored with Google's checkpoints; the directory name of
  one of their releases (".../uncased_L-12_H-768_A-12/bert_model.ckpt")
  tells it. Other names are not checked.
  """
  if not init_checkpoint:
    return
  match = re.match(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt", init_checkpoint)
  if match is None:
    return
  model_name = match.group(1)
  if model_name in _UNCASED_MODELS and not do_lower_case:
    given, kind, wanted = False, "lower-cased", True
  elif model_name in _CASED_MODELS and do_lower_case:
    given, kind, wanted = True, "cased", False
  else:
    return
  raise ValueError(
      f"--do_lower_case={given} does not match --init_checkpoint="
      f"{init_checkpoint}: {model_name} is a {kind} model, so pass "
      f"--do_lower_case={wanted} to fine-tune it as it was pretrained.")


def convert_to_unicode(text):
  """`text` as str; bytes are decoded as UTF-8 (bad bytes dropped)."""
  if isinstance(text, str):
    return text
  if isinstance(text, bytes):
    return text.decode("utf-8", "ignore")
  raise ValueError(f"Unsupported string type: {type(text)}")


def printable_text(text):
  """`text` as str for printing or logging (the same as Python 3 strings)."""
  return convert_to_unicode(text)


def load_vocab(vocab_file):
  """An OrderedDict token -> id from a file of one token per line.

  Lines are stripped; a repeated token keeps the id of its first line and
  takes no id of its own.
  """
  vocab = collections.OrderedDict()
  with tf.io.gfile.GFile(vocab_file, "r") as reader:
    for line in reader:
      token = convert_to_unicode(line).strip()
      if token not in vocab:
        vocab[token] = len(vocab)
  return vocab


def convert_by_vocab(vocab, items):
  """[vocab[item] for item in items] (tokens to ids or ids to tokens)."""
  return [vocab[item] for item in items]


def convert_tokens_to_ids(vocab, tokens):
  return convert_by_vocab(vocab, tokens)


def convert_ids_to_tokens(inv_vocab, ids):
  return convert_by_vocab(inv_vocab, ids)


def whitespace_tokenize(text):
  """Splits text on whitespace (str.split); [] for blank text."""
  return text.split()


class FullTokenizer(object):
  """Text to WordPiece tokens and ids: basic tokenization, then WordPiece."""

  def __init__(self, vocab_file, do_lower_case=True,
               preserve_unused_tokens=None):
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {i: token for token, i in self.vocab.items()}
    self.preserve_unused_tokens = preserve_unused_tokens
    self.basic_tokenizer = BasicTokenizer(
        do_lower_case=do_lower_case, vocab=self.vocab,
        preserve_unused_tokens=preserve_unused_tokens)
    self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)

  def tokenize(self, text):
    tokens = []
    for word in self.basic_tokenizer.tokenize(text):
      if preserve_token(word, self.vocab, self.preserve_unused_tokens):
        tokens.append(word)
      else:
        tokens.extend(self.wordpiece_tokenizer.tokenize(word))
    return tokens

  def convert_tokens_to_ids(self, tokens):
    return convert_by_vocab(self.vocab, tokens)

  def convert_ids_to_tokens(self, ids):
    return convert_by_vocab(self.inv_vocab, ids)


class BasicTokenizer(object):
  """Cleaning, lower-casing, accent stripping, CJK and punctuation splits."""

  def __init__(self, do_lower_case=True, vocab=tuple(),
               preserve_unused_tokens=None):
    """Makes a BasicTokenizer.

    Args:
      do_lower_case: lower-case the text and strip its accents.
      vocab: the vocabulary; preserved "[unusedN]" words must be in it.
      preserve_unused_tokens: keep in-vocabulary "[unusedN]" words whole;
        None reads the --preserve_unused_tokens flag.
    """
    self.do_lower_case = do_lower_case
    self.vocab = vocab
    self.preserve_unused_tokens = preserve_unused_tokens

  def tokenize(self, text):
    """The words and punctuation characters of `text` (str or UTF-8)."""
    text = _tokenize_chinese_chars(_clean_text(convert_to_unicode(text)))
    tokens = []
    for word in whitespace_tokenize(text):
      if preserve_token(word, self.vocab, self.preserve_unused_tokens):
        tokens.append(word)
        continue
      if self.do_lower_case:
        word = _strip_accents(word.lower())
      tokens.extend(_split_on_punctuation(word))
    # Split again, as the original did (drops any empty token).
    return whitespace_tokenize(" ".join(tokens))


class WordpieceTokenizer(object):
  """Greedy longest-match-first WordPiece over a vocabulary."""

  def __init__(self, vocab, unk_token=UNKNOWN_TOKEN,
               max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD):
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word

  def tokenize(self, text):
    """The word pieces of each whitespace-separated word of `text`.

    "unaffable" -> ["un", "##aff", "##able"] with those pieces in the
    vocabulary. A word is unk_token whole if any of its remainders has no
    piece, or if it has more than max_input_chars_per_word characters.
    """
    tokens = []
    for word in whitespace_tokenize(convert_to_unicode(text)):
      if len(word) > self.max_input_chars_per_word:
        tokens.append(self.unk_token)
      else:
        tokens.extend(self._word_pieces(word) or [self.unk_token])
    return tokens

  def _word_pieces(self, word):
    """The pieces of one word, or None if the vocabulary cannot cover it."""
    pieces = []
    start = 0
    while start < len(word):
      prefix = "##" if start else ""
      for end in range(len(word), start, -1):
        piece = prefix + word[start:end]
        if piece in self.vocab:
          break
      else:
        return None
      pieces.append(piece)
      start = end
    return pieces


def _is_whitespace(char):
  """Space, tab, newline, carriage return or a Unicode space (Zs)."""
  return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char):
  """A control or format character (Cc, Cf), except tab, newline, CR."""
  if char in "\t\n\r":
    return False
  return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char):
  """Unicode punctuation (P*) or printable ASCII that is not alphanumeric."""
  cp = ord(char)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp):
  return any(low <= cp <= high for low, high in CJK_RANGES)


def _clean_text(text):
  """Drops NUL, U+FFFD and control characters; whitespace becomes " "."""
  output = []
  for char in text:
    if char in "\x00\ufffd" or _is_control(char):
      continue
    output.append(" " if _is_whitespace(char) else char)
  return "".join(output)


def _tokenize_chinese_chars(text):
  """Puts spaces around CJK ideographs, so each is a word of its own."""
  return "".join(f" {char} " if _is_chinese_char(ord(char)) else char
                 for char in text)


def _strip_accents(text):
  """NFD, then drops non-spacing marks: "é" -> "e"."""
  return "".join(char for char in unicodedata.normalize("NFD", text)
                 if unicodedata.category(char) != "Mn")


def _split_on_punctuation(text):
  """Each punctuation character a token; the runs between them tokens."""
  tokens = []
  start_new = True
  for char in text:
    if _is_punctuation(char):
      tokens.append(char)
      start_new = True
    else:
      if start_new:
        tokens.append("")
        start_new = False
      tokens[-1] += char
  return tokens


# The cleaning of step 1 as regular expressions (RE2): control characters
# are Cc (U+0000-U+001F, U+007F-U+009F) and Cf; whitespace is what
# str.split() splits on once those are gone.
_DROPPED_CHARS = (r"[\x{0}-\x{8}\x{b}\x{c}\x{e}-\x{1f}\x{7f}-\x{9f}"
                  r"\x{fffd}\p{Cf}]")
_SPACE_CHARS = r"[\t\n\r\p{Zs}\x{2028}\x{2029}]"


class _BasicTokenizerOp(bert_tokenizer.BasicTokenizer):
  """tensorflow-text's basic tokenizer, made to match `BasicTokenizer`.

  It cleans the text as the Python tokenizer does, lower-cases with
  `str.lower`'s mapping, and replaces words longer than max_chars
  characters by unk_token (which the vocabulary maps to its id whole).
  """

  def __init__(self, lower_case, keep_whitespace, normalization_form,
               preserve_unused_token, *, max_chars, unk_token):
    super().__init__(lower_case, keep_whitespace, normalization_form,
                     preserve_unused_token)
    self._max_chars = max_chars
    self._unk_token = unk_token

  def lower_case(self, text_input):
    text_input = tf.strings.lower(text_input, encoding="utf-8")
    text_input = tf_text.normalize_utf8(text_input, "NFD")
    return tf.strings.regex_replace(text_input, r"\p{Mn}", "")

  def tokenize_with_offsets(self, text_input):
    text_input = tf.strings.regex_replace(text_input, _DROPPED_CHARS, "")
    text_input = tf.strings.regex_replace(text_input, _SPACE_CHARS, " ")
    words, begin, end = super().tokenize_with_offsets(text_input)
    too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR")
    too_long = too_long > self._max_chars
    words = words.with_flat_values(
        tf.where(too_long, self._unk_token, words.flat_values))
    return words, begin, end


class InGraphTokenizer(tf.Module):
  """`FullTokenizer` in TensorFlow ops: strings -> ragged WordPiece ids.

  Usable inside `tf.data.Dataset.map` and `tf.function`. Built on
  tensorflow-text's `BertTokenizer` over the vocabulary of `load_vocab`
  (same ids as the Python tokenizer); see the module docstring for what
  it reproduces and where it differs.
  """

  def __init__(self, vocab_file, do_lower_case=True,
               preserve_unused_tokens=None, unk_token=UNKNOWN_TOKEN,
               max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD):
    super().__init__(name="in_graph_tokenizer")
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {i: token for token, i in self.vocab.items()}
    if unk_token not in self.vocab:
      raise ValueError(f"The unknown token {unk_token!r} is not in the "
                       f"vocabulary {vocab_file}.")
    self.do_lower_case = do_lower_case
    initializer = tf.lookup.KeyValueTensorInitializer(
        tf.constant(list(self.vocab), tf.string),
        tf.constant(list(self.vocab.values()), tf.int64))
    self._table = tf.lookup.StaticVocabularyTable(initializer,
                                                  num_oov_buckets=1)
    basic = functools.partial(_BasicTokenizerOp,
                              max_chars=max_input_chars_per_word,
                              unk_token=unk_token)
    self._tokenizer = tf_text.BertTokenizer(
        self._table, token_out_type=tf.int64, unknown_token=unk_token,
        # A word of at most max chars has at most 4 bytes per char; longer
        # words are unk_token already.
        max_bytes_per_word=4 * max_input_chars_per_word,
        lower_case=do_lower_case,
        preserve_unused_token=_preserving(preserve_unused_tokens),
        basic_tokenizer_class=basic)

  def tokenize(self, strings):
    """Token ids of UTF-8 strings: shape [..., (tokens)], int64.

    A scalar string gives a 1-D Tensor of ids, a vector of n strings a
    RaggedTensor [n, (tokens)].
    """
    strings = tf.convert_to_tensor(strings, tf.string)
    if strings.shape.rank == 0:
      return self.tokenize(strings[tf.newaxis])[0]
    return self._tokenizer.tokenize(strings).merge_dims(-2, -1)

  def convert_tokens_to_ids(self, tokens):
    return convert_by_vocab(self.vocab, tokens)

  def convert_ids_to_tokens(self, ids):
    return convert_by_vocab(self.inv_vocab, ids)
