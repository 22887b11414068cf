"""The official SQuAD scores: exact match and token F1.

The definitions of SQuAD's evaluation scripts (v1.1 and v2.0): an answer
is normalized (lower case, punctuation removed, the articles a/an/the
removed, whitespace collapsed); exact match is 1 when the normalized
prediction equals a normalized gold answer; F1 is the harmonic mean of
the precision and recall of the shared tokens (a bag of words). Each
question scores its best gold answer, and the totals are percentages.

SQuAD 2.0 adds questions with no answer: their gold answer is the empty
string, and an empty (normalized) prediction or gold answer scores 1 only
when both are empty, for exact match and F1 alike. In v1.1 an empty
prediction always scores 0.

A question without a prediction scores 0 (v1.1 did that; v2.0's script
left such questions out of its totals instead).
"""

import collections
import json
import re
import string

import tensorflow as tf

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text):
  """Lower case, no punctuation, no articles, single spaces."""
  text = text.lower()
  text = "".join(c for c in text if c not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def exact_match_score(prediction, ground_truth):
  """1.0 when the normalized answers are equal, else 0.0."""
  return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction, ground_truth, version_2_with_negative=False):
  """Token F1 of the normalized answers.

  With version_2_with_negative an empty side scores 1.0 only when both
  are empty (a correct "no answer"), as in SQuAD 2.0's script.
  """
  prediction_tokens = normalize_answer(prediction).split()
  truth_tokens = normalize_answer(ground_truth).split()
  if version_2_with_negative and (not prediction_tokens or
                                  not truth_tokens):
    return float(prediction_tokens == truth_tokens)
  common = (collections.Counter(prediction_tokens) &
            collections.Counter(truth_tokens))
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(prediction_tokens)
  recall = num_same / len(truth_tokens)
  return 2 * precision * recall / (precision + recall)


def gold_answers(qa, version_2_with_negative=False):
  """A question's gold answer texts; [""] for a v2 unanswerable one."""
  answers = [a["text"] for a in qa.get("answers", [])]
  if version_2_with_negative:
    answers = [a for a in answers if normalize_answer(a)]
    if not answers:
      answers = [""]
  return answers


def has_answers(dataset):
  """True when every question of the SQuAD "data" list has gold answers
  (or is marked is_impossible), so predictions can be scored."""
  found = False
  for article in dataset:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        if not qa.get("answers") and not qa.get("is_impossible", False):
          return False
        found = True
  return found


def evaluate(dataset, predictions, version_2_with_negative=False):
  """Scores predictions ({question id: text}) on a SQuAD "data" list.

  Returns {"exact_match": %, "f1": %, "total": questions}; with
  version_2_with_negative also the scores and counts of the answerable
  ("HasAns_*") and unanswerable ("NoAns_*") questions.
  """
  scores = {True: [], False: []}  # has an answer -> [(exact, f1)]
  for article in dataset:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        golds = gold_answers(qa, version_2_with_negative)
        prediction = predictions.get(qa["id"])
        if prediction is None:
          exact = f1 = 0.0
        else:
          exact = max(exact_match_score(prediction, g) for g in golds)
          f1 = max(f1_score(prediction, g, version_2_with_negative)
                   for g in golds)
        scores[golds != [""]].append((exact, f1))
  results = _totals(scores[True] + scores[False])
  if version_2_with_negative:
    for prefix, has in (("HasAns", True), ("NoAns", False)):
      if scores[has]:
        part = _totals(scores[has])
        results.update({f"{prefix}_exact": part["exact_match"],
                        f"{prefix}_f1": part["f1"],
                        f"{prefix}_total": part["total"]})
  return results


def _totals(pairs):
  total = len(pairs)
  if not total:
    return {"exact_match": 0.0, "f1": 0.0, "total": 0}
  return {"exact_match": 100.0 * sum(e for e, _ in pairs) / total,
          "f1": 100.0 * sum(f for _, f in pairs) / total,
          "total": total}


def evaluate_files(dataset_file, prediction_file,
                   version_2_with_negative=False):
  """evaluate() on a SQuAD JSON file and a predictions.json file."""
  with tf.io.gfile.GFile(dataset_file, "r") as f:
    dataset = json.load(f)["data"]
  with tf.io.gfile.GFile(prediction_file, "r") as f:
    predictions = json.load(f)
  return evaluate(dataset, predictions, version_2_with_negative)
