"""Generated example data for the BERT binaries: no downloads needed.

A WordPiece vocabulary of lower-case words, a few "##" continuation
pieces, punctuation and the special tokens, and tiny model configurations
(Google's JSON keys). Pretraining, the classifier and SQuAD share the
vocabulary, so a classifier fine-tunes from a pretraining checkpoint. The
README's BERT commands and the tests run on these.
"""

import json

__all__ = ["SPECIAL_TOKENS", "TOPICS", "FUNCTION_WORDS", "PIECES",
           "PUNCTUATION", "CHARACTERS", "vocabulary", "write_vocab",
           "tiny_config", "write_config"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                  "[unused0]", "[unused1]")

# Content words: 8 topics of 8 words each, so that generated text has
# structure a tiny model can learn (words of a sentence share a topic).
TOPICS = (
    ("cat", "dog", "horse", "bird", "fish", "mouse", "lion", "tiger"),
    ("red", "blue", "green", "yellow", "black", "white", "pink", "brown"),
    ("one", "two", "three", "four", "five", "six", "seven", "eight"),
    ("paris", "london", "berlin", "rome", "madrid", "tokyo", "oslo", "lima"),
    ("apple", "bread", "cheese", "rice", "soup", "cake", "milk", "tea"),
    ("run", "walk", "jump", "swim", "read", "sing", "cook", "play"),
    ("king", "queen", "doctor", "farmer", "pilot", "teacher", "baker",
     "singer"),
    ("car", "train", "boat", "plane", "bus", "bike", "ship", "truck"),
)

FUNCTION_WORDS = ("the", "a", "is", "and", "of", "in", "to", "was", "what",
                  "who", "where", "which", "lives", "likes", "has", "with")

PIECES = ("##s", "##ed", "##ing", "##er", "##ly")

PUNCTUATION = (".", ",", "?", "!", "'", "-")

# Characters the tokenization tests use (single-character pieces).
CHARACTERS = tuple("abcdefghijklmnopqrstuvwxyz") + ("中", "国", "日", "本")


def vocabulary():
  """The vocabulary's tokens, in id order (no duplicates)."""
  tokens = list(SPECIAL_TOKENS)
  for group in (FUNCTION_WORDS, *TOPICS, PIECES, PUNCTUATION, CHARACTERS):
    for token in group:
      if token not in tokens:
        tokens.append(token)
  return tokens


def write_vocab(path):
  """Writes the vocabulary, one token per line; returns the path."""
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(vocabulary()) + "\n")
  return str(path)


def tiny_config(**overrides):
  """A BERT config (Google's JSON keys plus mtf ones) small enough for tests.

  8 heads, an intermediate size of 64 and the vocabulary (padded to 128 by
  the model) split over 8 processors, so `model:8` and `b:2;m:4` apply.
  """
  config = {
      "vocab_size": len(vocabulary()),
      "hidden_size": 32,
      "num_hidden_layers": 2,
      "num_attention_heads": 8,
      "intermediate_size": 64,
      "hidden_act": "gelu",
      "hidden_dropout_prob": 0.0,
      "attention_probs_dropout_prob": 0.0,
      "max_position_embeddings": 64,
      "type_vocab_size": 2,
      "initializer_range": 0.02,
  }
  config.update(overrides)
  return config


def write_config(path, **overrides):
  """Writes tiny_config(**overrides) as JSON; returns the path."""
  with open(path, "w") as f:
    json.dump(tiny_config(**overrides), f, indent=2)
  return str(path)
