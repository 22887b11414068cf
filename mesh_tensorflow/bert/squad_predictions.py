"""SQuAD answers from start and end logits: n-best spans, JSON files.

For each example, every window's n_best_size best start and end tokens
are paired; a pair is a candidate answer when both lie in the context,
the start is in its max-context window, the end is not before the start
and the span is at most max_answer_length tokens. Candidates rank by
start + end logit; the best distinct texts (mapped back to the original
words by get_final_text) are the n-best list, with softmax probabilities.

SQuAD 2.0 (version_2_with_negative): the "no answer" candidate scores the
[CLS] token's start + end logits (the lowest over the windows); the
prediction is "" when that score beats the best non-null answer's by more
than null_score_diff_threshold, and null_odds.json records the difference.
"""

import collections
import json
import math

from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert import squad_data
from mesh_tensorflow.bert import tokenization

RawResult = collections.namedtuple("RawResult",
                                   ["unique_id", "start_logits", "end_logits"])

_PrelimPrediction = collections.namedtuple(
    "PrelimPrediction",
    ["feature_index", "start_index", "end_index", "start_logit", "end_logit"])

_NbestPrediction = collections.namedtuple(
    "NbestPrediction", ["text", "start_logit", "end_logit"])


def write_predictions(all_examples, all_features, all_results, n_best_size,
                      max_answer_length, do_lower_case, output_prediction_file,
                      output_nbest_file, output_null_log_odds_file,
                      version_2_with_negative=None,
                      null_score_diff_threshold=None, verbose_logging=None):
  """Writes predictions.json, nbest_predictions.json and (SQuAD 2.0)
  null_odds.json; returns the predictions {question id: text}.

  Args:
    all_examples: the SquadExamples.
    all_features: their InputFeatures.
    all_results: RawResults (unique_id, start_logits, end_logits), one per
      feature (results of other unique ids are ignored).
    n_best_size: how many start and end tokens to pair, and answers to
      list per question.
    max_answer_length: the longest answer, in tokens.
    do_lower_case: whether the tokenizer lower-cased (get_final_text).
    output_prediction_file, output_nbest_file, output_null_log_odds_file:
      the three JSON files' paths.
    version_2_with_negative, null_score_diff_threshold, verbose_logging:
      default to the flags of those names once parsed, else False, 0.0
      and False.
  """
  if version_2_with_negative is None:
    version_2_with_negative = squad_data.flag_or_default(
        "version_2_with_negative", False)
  if null_score_diff_threshold is None:
    null_score_diff_threshold = squad_data.flag_or_default(
        "null_score_diff_threshold", 0.0)
  if verbose_logging is None:
    verbose_logging = squad_data.flag_or_default("verbose_logging", False)
  logging.info("Writing predictions to %s and the n-best to %s",
               output_prediction_file, output_nbest_file)

  example_index_to_features = collections.defaultdict(list)
  for feature in all_features:
    example_index_to_features[feature.example_index].append(feature)
  unique_id_to_result = {result.unique_id: result for result in all_results}

  all_predictions = collections.OrderedDict()
  all_nbest_json = collections.OrderedDict()
  scores_diff_json = collections.OrderedDict()
  for example_index, example in enumerate(all_examples):
    features = example_index_to_features[example_index]
    prelim, null = _prelim_predictions(
        features, unique_id_to_result, n_best_size, max_answer_length,
        version_2_with_negative)
    nbest = _nbest(example, features, prelim, n_best_size, do_lower_case,
                   verbose_logging)
    if version_2_with_negative and not any(e.text for e in nbest):
      # (The original failed here: no non-null answer to compare with.)
      nbest.append(_NbestPrediction(text="empty", start_logit=0.0,
                                    end_logit=0.0))
    if version_2_with_negative and "" not in (e.text for e in nbest):
      nbest.append(_NbestPrediction(text="", start_logit=null.start_logit,
                                    end_logit=null.end_logit))
    if not nbest:  # No valid span at all: a placeholder answer.
      nbest.append(_NbestPrediction(text="empty", start_logit=0.0,
                                    end_logit=0.0))

    probs = _compute_softmax([e.start_logit + e.end_logit for e in nbest])
    nbest_json = []
    for entry, prob in zip(nbest, probs):
      output = collections.OrderedDict()
      output["text"] = entry.text
      output["probability"] = prob
      output["start_logit"] = entry.start_logit
      output["end_logit"] = entry.end_logit
      nbest_json.append(output)
    all_nbest_json[example.qas_id] = nbest_json

    if not version_2_with_negative:
      all_predictions[example.qas_id] = nbest[0].text
    else:
      best = next(e for e in nbest if e.text)
      score_diff = (null.start_logit + null.end_logit -
                    best.start_logit - best.end_logit)
      scores_diff_json[example.qas_id] = score_diff
      all_predictions[example.qas_id] = (
          "" if score_diff > null_score_diff_threshold else best.text)

  _write_json(output_prediction_file, all_predictions)
  _write_json(output_nbest_file, all_nbest_json)
  if version_2_with_negative:
    _write_json(output_null_log_odds_file, scores_diff_json)
  return all_predictions


def _write_json(path, value):
  with tf.io.gfile.GFile(path, "w") as writer:
    writer.write(json.dumps(value, indent=4) + "\n")


def _prelim_predictions(features, unique_id_to_result, n_best_size,
                        max_answer_length, version_2_with_negative):
  """(candidate spans sorted best first, the null candidate or None)."""
  prelim = []
  null = None  # The window whose [CLS] start + end logit is lowest.
  for feature_index, feature in enumerate(features):
    result = unique_id_to_result[feature.unique_id]
    if version_2_with_negative:
      null_score = result.start_logits[0] + result.end_logits[0]
      if null is None or null_score < null.start_logit + null.end_logit:
        null = _PrelimPrediction(feature_index, 0, 0, result.start_logits[0],
                                 result.end_logits[0])
    for start_index in _get_best_indexes(result.start_logits, n_best_size):
      for end_index in _get_best_indexes(result.end_logits, n_best_size):
        if (start_index >= len(feature.tokens) or
            end_index >= len(feature.tokens) or
            start_index not in feature.token_to_orig_map or
            end_index not in feature.token_to_orig_map or
            not feature.token_is_max_context.get(start_index, False) or
            end_index < start_index or
            end_index - start_index + 1 > max_answer_length):
          continue
        prelim.append(_PrelimPrediction(
            feature_index, start_index, end_index,
            result.start_logits[start_index], result.end_logits[end_index]))
  if null is not None:
    prelim.append(null)
  prelim.sort(key=lambda p: p.start_logit + p.end_logit, reverse=True)
  return prelim, null


def _nbest(example, features, prelim, n_best_size, do_lower_case,
           verbose_logging):
  """The first n_best_size distinct answer texts of the candidates."""
  seen = set()
  nbest = []
  for pred in prelim:
    if len(nbest) >= n_best_size:
      break
    if pred.start_index > 0:
      feature = features[pred.feature_index]
      tok_tokens = feature.tokens[pred.start_index:pred.end_index + 1]
      orig_start = feature.token_to_orig_map[pred.start_index]
      orig_end = feature.token_to_orig_map[pred.end_index]
      orig_text = " ".join(example.doc_tokens[orig_start:orig_end + 1])
      # Glue WordPieces back together, then collapse whitespace.
      tok_text = " ".join(tok_tokens).replace(" ##", "").replace("##", "")
      tok_text = " ".join(tok_text.split())
      text = get_final_text(tok_text, orig_text, do_lower_case,
                            verbose_logging)
    else:
      text = ""  # The null answer.
    if text in seen:
      continue
    seen.add(text)
    nbest.append(_NbestPrediction(text=text, start_logit=pred.start_logit,
                                  end_logit=pred.end_logit))
  return nbest


def _strip_spaces(text):
  """(text without spaces, {index there: index in text})."""
  chars = []
  ns_to_s_map = {}
  for i, c in enumerate(text):
    if c == " ":
      continue
    ns_to_s_map[len(chars)] = i
    chars.append(c)
  return "".join(chars), ns_to_s_map


def get_final_text(pred_text, orig_text, do_lower_case,
                   verbose_logging=None):
  """The part of orig_text that the tokenized prediction pred_text covers.

  orig_text is the whole original words of the predicted span, which may
  hold more than the answer: for pred_text "steve smith" and orig_text
  "Steve Smith's" the answer is "Steve Smith", keeping the original's case
  and accents. orig_text is tokenized with BasicTokenizer; when it and
  orig_text have the same characters apart from spaces, pred_text's
  position there maps back character by character. When that alignment
  fails, orig_text is returned whole.
  """
  if verbose_logging is None:
    verbose_logging = squad_data.flag_or_default("verbose_logging", False)

  def fail(message, *args):
    if verbose_logging:
      logging.info(message, *args)
    return orig_text

  tokenizer = tokenization.BasicTokenizer(do_lower_case=do_lower_case)
  tok_text = " ".join(tokenizer.tokenize(orig_text))
  start_position = tok_text.find(pred_text)
  if start_position == -1:
    return fail("Unable to find text: %r in %r", pred_text, orig_text)
  end_position = start_position + len(pred_text) - 1

  orig_ns_text, orig_ns_to_s_map = _strip_spaces(orig_text)
  tok_ns_text, tok_ns_to_s_map = _strip_spaces(tok_text)
  if len(orig_ns_text) != len(tok_ns_text):
    return fail("Length not equal after stripping spaces: %r vs %r",
                orig_ns_text, tok_ns_text)
  tok_s_to_ns_map = {s: ns for ns, s in tok_ns_to_s_map.items()}

  def to_orig(position):
    ns_position = tok_s_to_ns_map.get(position)
    return orig_ns_to_s_map.get(ns_position)

  orig_start_position = to_orig(start_position)
  if orig_start_position is None:
    return fail("Couldn't map start position")
  orig_end_position = to_orig(end_position)
  if orig_end_position is None:
    return fail("Couldn't map end position")
  return orig_text[orig_start_position:orig_end_position + 1]


def _get_best_indexes(logits, n_best_size):
  """The indexes of the n_best_size largest logits, largest first."""
  order = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
  return [index for index, _ in order[:n_best_size]]


def _compute_softmax(scores):
  """Softmax of a list of floats (as Python floats)."""
  if not scores:
    return []
  max_score = max(scores)
  exp_scores = [math.exp(s - max_score) for s in scores]
  total = sum(exp_scores)
  return [e / total for e in exp_scores]
