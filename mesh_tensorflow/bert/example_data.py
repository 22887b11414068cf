"""Generated example data for the BERT binaries: no downloads needed.

A WordPiece vocabulary of lower-case words, a few "##" continuation
pieces, punctuation and the special tokens, and tiny model configurations
(Google's JSON keys). Pretraining, the classifier and SQuAD share the
vocabulary, so a classifier fine-tunes from a pretraining checkpoint. The
BERT commands of docs/bert.md and the tests run on these.
"""

import json
import os

from absl import app
from absl import flags
import numpy as np

__all__ = ["SPECIAL_TOKENS", "TOPICS", "FUNCTION_WORDS", "PIECES",
           "PUNCTUATION", "CHARACTERS", "vocabulary", "write_vocab",
           "tiny_config", "write_config", "PRETRAINING_OVERRIDES", "corpus",
           "write_corpus",
           "sentence_pairs", "write_mrpc", "write_squad", "write_all"]

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


# The example model's settings for pretraining from scratch: a pre-norm
# ("direct") residual structure and initial weights of about
# 1/sqrt(hidden). With the original structure and BERT's 0.02 the tiny
# model predicts the most frequent masked token (the masked-LM accuracy of
# the unigram distribution) for 300-1,000 steps before it uses the
# context; like this it passes that stage within 200.
PRETRAINING_OVERRIDES = {"residual_structure": "direct",
                         "initializer_range": 0.2}


def write_config(path, **overrides):
  """Writes tiny_config(**overrides) as JSON; returns the path."""
  with open(path, "w") as f:
    json.dump(tiny_config(**overrides), f, indent=2)
  return str(path)


def _document_sentences(rng, topic, count):
  """`count` sentences about one topic, in set phrases. A sentence names a
  word of the topic and the word after it in TOPICS' order, so a masked
  word is predictable from its context: the phrase gives the function
  words, the other word of the pair the content word."""
  people, foods, places = TOPICS[6], TOPICS[4], TOPICS[3]
  sentences = []
  for _ in range(count):
    k = rng.integers(len(topic))
    a, b = topic[k], topic[(k + 1) % len(topic)]
    form = rng.integers(4)
    if form == 0:
      sentences.append(f"the {a} and the {b} .")
    elif form == 1:
      sentences.append(f"a {a} is with the {b} .")
    elif form == 2:
      sentences.append(f"the {rng.choice(people)} likes the {a} and "
                       f"the {b} .")
    else:
      sentences.append(f"the {a} of {rng.choice(places)} has "
                       f"{rng.choice(foods)} and the {b} .")
  return sentences


def corpus(num_documents=200, sentences_per_document=6, seed=0):
  """Pretraining text: documents (lists of sentences), one topic each."""
  rng = np.random.default_rng(seed)
  return [_document_sentences(rng, TOPICS[rng.integers(len(TOPICS))],
                              sentences_per_document)
          for _ in range(num_documents)]


def write_corpus(path, **kwargs):
  """corpus(**kwargs) as BERT's pretraining text format: one sentence per
  line, a blank line between documents. Returns the path."""
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(d) for d in corpus(**kwargs)) + "\n")
  return str(path)


def sentence_pairs(count, rng):
  """(label, sentence 1, sentence 2): 1 when sentence 2 is about animals
  (TOPICS[0]), 0 when about colours (TOPICS[1]); sentence 1 is about any
  topic. Labels alternate, so the classes are balanced.

  A label comparing the two sentences (paraphrase or not) would be truer
  to MRPC, but the tiny example model does not learn such an XOR-like
  target in a few hundred steps: this one shows the pipeline learning.
  """
  pairs = []
  for i in range(count):
    label = i % 2
    a, b = rng.choice(TOPICS[rng.integers(len(TOPICS))], 2, replace=False)
    c, d = rng.choice(TOPICS[label], 2, replace=False)
    pairs.append((label, f"the {a} and the {b} .", f"a {c} is with the {d} ."))
  return pairs


def write_mrpc(data_dir, num_train=512, num_dev=60, num_test=20, seed=0):
  """GLUE MRPC's train.tsv, dev.tsv and test.tsv of sentence_pairs in
  data_dir (run_classifier --task_name=MRPC --data_dir=...)."""
  os.makedirs(data_dir, exist_ok=True)
  rng = np.random.default_rng(seed)
  header = "#1 ID\t#2 ID\t#1 String\t#2 String"
  for split, count in (("train", num_train), ("dev", num_dev),
                       ("test", num_test)):
    lines = [("index\t" if split == "test" else "Quality\t") + header]
    for i, (label, s1, s2) in enumerate(sentence_pairs(count, rng)):
      first = i if split == "test" else label
      lines.append(f"{first}\t{2 * i}\t{2 * i + 1}\t{s1}\t{s2}")
    with open(os.path.join(data_dir, f"{split}.tsv"), "w",
              encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
  return str(data_dir)


def _squad_article(rng, index):
  """One SQuAD paragraph: facts about people, each question's answer a
  span of the context."""
  people = rng.choice(TOPICS[6], size=3, replace=False)
  facts = (("likes", TOPICS[4], "what"), ("lives in", TOPICS[3], "where"),
           ("has", TOPICS[7], "which"))
  sentences, questions = [], []
  for person, (verb, words, asks) in zip(people, facts):
    answer = str(rng.choice(words))
    sentences.append((f"the {person} {verb} ", answer, " ."))
    questions.append((f"{asks} the {person} {verb} ?", answer))
  rng.shuffle(sentences)
  context, starts = "", {}
  for before, answer, after in sentences:
    starts[answer] = len(context) + len(before)
    context += before + answer + after + " "
  qas = [{"id": f"q{index}_{k}", "question": question,
          "answers": [{"text": answer, "answer_start": starts[answer]}]}
         for k, (question, answer) in enumerate(questions)]
  return {"title": f"article {index}",
          "paragraphs": [{"context": context.strip(), "qas": qas}]}


def write_squad(path, num_articles=100, seed=0):
  """A SQuAD 1.1 JSON file of generated articles whose answers are spans
  of their contexts. Returns the path."""
  rng = np.random.default_rng(seed)
  data = {"version": "1.1",
          "data": [_squad_article(rng, i) for i in range(num_articles)]}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)
  return str(path)


def write_all(output_dir, seed=0):
  """Everything the BERT commands of docs/bert.md read, under output_dir:
  vocab.txt, bert_config.json, corpus.txt, MRPC/{train,dev,test}.tsv,
  squad/train.json and squad/dev.json. Returns {name: path}."""
  os.makedirs(output_dir, exist_ok=True)
  join = lambda *p: os.path.join(output_dir, *p)
  os.makedirs(join("squad"), exist_ok=True)
  return {
      "vocab": write_vocab(join("vocab.txt")),
      "config": write_config(join("bert_config.json"),
                             **PRETRAINING_OVERRIDES),
      "corpus": write_corpus(join("corpus.txt"), seed=seed),
      "mrpc": write_mrpc(join("MRPC"), seed=seed),
      "squad_train": write_squad(join("squad", "train.json"), seed=seed),
      "squad_dev": write_squad(join("squad", "dev.json"), num_articles=20,
                               seed=seed + 1),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.output_dir:
    raise ValueError("--output_dir is required: the folder to write the "
                     "example data to.")
  for name, path in write_all(FLAGS.output_dir, FLAGS.seed).items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", None, "Folder to write the data to.")
  flags.DEFINE_integer("seed", 0, "Seed of the generated text.")
  FLAGS = flags.FLAGS
  app.run(main)
