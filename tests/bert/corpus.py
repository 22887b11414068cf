"""The pretraining tests' corpus, and the masked-LM baselines it allows.

The text is the package's example corpus (example_data.corpus): documents
of sentences about one topic of generated_data.TOPICS each, in a few set
phrases ("the cat and the dog .", "a cat is with the dog ."), so a masked
word is predictable from its context: function words and punctuation
from the phrase, content words from the document's topic (one of eight).
Training and held-out text differ by seed only.

A masked-LM accuracy means something next to the two baselines here:
chance (a uniform guess over the vocabulary) and always guessing the
token most often masked in the training records.
"""

import collections

import numpy as np
import tensorflow as tf

from mesh_tensorflow.bert import example_data

TRAIN_SEED, HELD_OUT_SEED = 0, 1


def write_corpus(path, num_documents=200, seed=TRAIN_SEED):
  """Writes one sentence per line, a blank line between documents (BERT's
  pretraining text format); returns the path."""
  return example_data.write_corpus(path, num_documents=num_documents,
                                   sentences_per_document=6, seed=seed)


def masked_tokens(record_files):
  """The masked-LM labels of pretraining records: ids with weight > 0."""
  ids = []
  for record in tf.data.TFRecordDataset(list(record_files)):
    features = tf.train.Example.FromString(record.numpy()).features.feature
    labels = features["masked_lm_ids"].int64_list.value
    weights = features["masked_lm_weights"].float_list.value
    ids.extend(i for i, w in zip(labels, weights) if w > 0)
  return np.array(ids, dtype=np.int64)


def masked_lm_baselines(train_files, eval_files, vocab_size):
  """{"chance": 1 / vocab_size, "most_frequent": held-out accuracy of always
  predicting the training records' most frequent masked token,
  "most_frequent_token": that token's id}."""
  train_ids = masked_tokens(train_files)
  eval_ids = masked_tokens(eval_files)
  token, _ = collections.Counter(train_ids.tolist()).most_common(1)[0]
  return {"chance": 1.0 / vocab_size,
          "most_frequent": float(np.mean(eval_ids == token)),
          "most_frequent_token": int(token)}
