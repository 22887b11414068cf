"""Beam search and greedy decoding written in mtf operations.

A port of the original Mesh TensorFlow's `beam_search.py`: the
Tensor2Tensor/GNMT beam search with separate *alive* and *finished* beams,
the length penalty ((5 + length) / 6) ** alpha and early stopping, and a
greedy (or sampling) decoder. Both run as one `mtf.while_loop`, so they work
under any layout (the batch and vocabulary dimensions may be split) and in
eager, `tf.function` and graph mode.

Differences from the original:

- The TPU-only vocabulary prefilter of `beam_search` (splitting the vocab
  into major x minor chunks and keeping `num_prefilter` candidates per chunk
  before the final top-k, a lossy speed trick) is not implemented: the
  candidates are always chosen exactly. `layout`, `mesh_shape`,
  `num_prefilter` and `use_tpu` are accepted for compatibility and ignored.
- Decoder states keep their `[batch, beam, ...]` dimensions inside the loop
  (the original merged batch and beam into one dimension, a TPU memory
  workaround) and are reordered with `mtf.gather` along the beam dimension.
- `greedy_decode` keeps the non-zero entries of `initial_ids` (a prompt),
  writes 0 after a row's EOS, and does not print the output length.
"""

import tensorflow as tf

from mesh_tensorflow import configurable as configurable_lib
from mesh_tensorflow import shape as shape_lib
import mesh_tensorflow as mtf

EOS_ID = 1
INF = 1e7


def compute_topk_scores_and_seq(sequences, scores, scores_to_gather, flags,
                                beam_dim, prefix="default", states=None):
  """Keeps the `beam_dim.size` best candidates of a larger candidate set.

  Args:
    sequences: int Tensor [batch, candidates, length].
    scores: Tensor [batch, candidates], what the candidates are ranked by.
    scores_to_gather: Tensor [batch, candidates] to gather with them.
    flags: bool Tensor [batch, candidates] to gather with them.
    beam_dim: the Dimension of the output beams (smaller than candidates).
    prefix: a name prefix for the ops.
    states: optional list of Tensors [batch, candidates, ...].

  Returns:
    (sequences, scores, scores_to_gather, flags, states), each with the
    candidate dimension replaced by `beam_dim`, best first.
  """
  candidate_dim = scores.shape.dims[-1]
  _, top_indices = mtf.top_k(scores, candidate_dim, beam_dim,
                             name=f"{prefix}_top_k")

  def gather(tensor):
    output_shape = shape_lib.Shape(
        [beam_dim if d == candidate_dim else d for d in tensor.shape.dims])
    return mtf.gather(tensor, top_indices, candidate_dim,
                      output_shape=output_shape, name=f"{prefix}_gather")

  return (gather(sequences), gather(scores), gather(scores_to_gather),
          gather(flags), [gather(s) for s in states or []])


@configurable_lib.configurable
def beam_search(logits_fn, initial_ids, alpha, states=None, eos_id=EOS_ID,
                stop_early=True, decode_length=None, use_tpu=True,
                dtype=tf.float32, layout=None, mesh_shape=None,
                num_prefilter=2):
  """Beam search with a length penalty (Wu et al. 2016, as in T2T).

  Position i of every beam is chosen at step i. At each step the 2 * beam
  best one-token extensions of the alive beams are found; those ending in
  EOS compete for the finished beams (scored by log probability divided by
  ((5 + length) / 6) ** alpha, length counting the EOS), the others for the
  alive beams. With `stop_early`, the loop ends as soon as no alive beam can
  beat the worst finished beam of every batch row.

  Args:
    logits_fn: fn(step_num, ids, states) -> (logits, new_states). step_num is
      a scalar int32 Tensor, ids the int32 alive sequences [batch, beam,
      length] (zeros from position step_num on), states a list of Tensors
      whose first dimensions are [batch, beam]. logits [batch, beam, vocab]
      score the token at position step_num; new_states match states.
    initial_ids: int32 Tensor [batch, beam, length], all zeros (what is
      decoded is written into it).
    alpha: the length-penalty exponent (0 ranks by plain log probability).
    states: optional list of Tensors with leading dimensions [batch, beam].
    eos_id: the end-of-sequence token.
    stop_early: whether to stop once the finished beams cannot be beaten.
    decode_length: optional scalar int32 Tensor (or int), at most length.
    use_tpu: ignored (see the module docstring).
    dtype: the dtype of the scores.
    layout: ignored (vocabulary prefilter; see the module docstring).
    mesh_shape: ignored (vocabulary prefilter).
    num_prefilter: ignored (vocabulary prefilter).

  Returns:
    (decoded, scores): int32 [batch, beam, length] and dtype [batch, beam],
    best first. For a batch row where no beam finished, the alive beams and
    their log probabilities are returned instead.
  """
  del use_tpu, layout, mesh_shape, num_prefilter
  batch_dim, beam_dim, length_dim = initial_ids.shape.dims
  mesh = initial_ids.mesh
  states = list(states or [])
  batch_by_beam = shape_lib.Shape([batch_dim, beam_dim])
  double_beam = shape_lib.Dimension("double_beam", beam_dim.size * 2)
  triple_beam = shape_lib.Dimension("triple_beam", beam_dim.size * 3)

  # Only beam 0 is alive at first, so the first step does not pick the same
  # token beam.size times.
  initial_log_probs = mtf.broadcast(
      mtf.one_hot(mtf.constant(mesh, 0, dtype=tf.int32), beam_dim,
                  on_value=0.0, off_value=-INF, dtype=dtype), batch_by_beam)
  length_scalar = mtf.constant(mesh, length_dim.size, dtype=tf.int32)
  if decode_length is None:
    decode_length = length_scalar
  else:
    if not isinstance(decode_length, mtf.Tensor):
      decode_length = mtf.constant(mesh, decode_length, dtype=tf.int32)
    decode_length = mtf.minimum(decode_length, length_scalar)
  finished_scores = mtf.constant(mesh, -INF, batch_by_beam, dtype=dtype)
  finished_flags = mtf.constant(mesh, False, batch_by_beam, dtype=tf.bool)

  def length_penalty(length):
    return mtf.pow((5.0 + mtf.cast(length, dtype)) / 6.0, alpha)

  def grow_topk(i, alive_seq, alive_log_probs, states):
    """The 2 * beam best extensions of the alive beams."""
    logits, new_states = logits_fn(i, alive_seq, states)
    vocab_dim = logits.shape.dims[-1]
    log_probs = mtf.log_softmax(mtf.cast(logits, dtype), vocab_dim)
    log_probs += alive_log_probs
    penalty = length_penalty(i + 1)
    curr_scores = log_probs / penalty
    beam_and_vocab = shape_lib.Dimension(
        "beam_and_vocab", beam_dim.size * vocab_dim.size)
    flat_scores = mtf.reshape(
        curr_scores, shape_lib.Shape([batch_dim, beam_and_vocab]))
    top_scores, top_flat_ids = mtf.top_k(flat_scores, beam_and_vocab,
                                         double_beam)
    top_log_probs = top_scores * penalty
    top_beam_index = mtf.floordiv(top_flat_ids, vocab_dim.size)
    top_ids = mtf.mod(top_flat_ids, vocab_dim.size)

    def gather_beams(tensor):
      output_shape = shape_lib.Shape(
          [double_beam if d == beam_dim else d for d in tensor.shape.dims])
      return mtf.gather(tensor, top_beam_index, beam_dim,
                        output_shape=output_shape)

    top_seq = gather_beams(alive_seq)
    top_states = [gather_beams(s) for s in new_states]
    top_seq += top_ids * mtf.one_hot(i, length_dim, dtype=tf.int32)
    top_finished = mtf.equal(top_ids, eos_id)
    return top_seq, top_log_probs, top_scores, top_finished, top_states

  def grow_alive(curr_seq, curr_scores, curr_log_probs, curr_finished,
                 curr_states):
    curr_scores += mtf.cast(curr_finished, dtype) * -INF
    seq, _, log_probs, _, new_states = compute_topk_scores_and_seq(
        curr_seq, curr_scores, curr_log_probs, curr_finished, beam_dim,
        "grow_alive", curr_states)
    return seq, log_probs, new_states

  def grow_finished(finished_seq, finished_scores, finished_flags,
                    curr_seq, curr_scores, curr_finished):
    curr_scores += (1.0 - mtf.cast(curr_finished, dtype)) * -INF

    def concat(a, b):
      return mtf.concat([
          mtf.rename_dimension(a, beam_dim.name, triple_beam.name),
          mtf.rename_dimension(b, double_beam.name, triple_beam.name)],
                        triple_beam.name)

    seq, scores, _, flags, _ = compute_topk_scores_and_seq(
        concat(finished_seq, curr_seq),
        concat(finished_scores, curr_scores),
        concat(finished_scores, curr_scores),
        concat(finished_flags, curr_finished), beam_dim, "grow_finished")
    return seq, scores, flags

  def body(i, alive_seq, alive_log_probs, finished_seq, finished_scores,
           finished_flags, *states):
    top_seq, top_log_probs, top_scores, top_finished, top_states = (
        grow_topk(i, alive_seq, alive_log_probs, list(states)))
    alive_seq, alive_log_probs, states = grow_alive(
        top_seq, top_scores, top_log_probs, top_finished, top_states)
    finished_seq, finished_scores, finished_flags = grow_finished(
        finished_seq, finished_scores, finished_flags, top_seq, top_scores,
        top_finished)
    return [i + 1, alive_seq, alive_log_probs, finished_seq,
            finished_scores, finished_flags] + list(states)

  def cond(i, unused_alive_seq, alive_log_probs, unused_finished_seq,
           finished_scores, finished_flags, *unused_states):
    not_done = mtf.less(i, decode_length)
    if not stop_early:
      return not_done
    # The best an alive beam can still reach: its log probability can only
    # fall, and the penalty is largest at the maximum length.
    best_alive = mtf.gather(alive_log_probs, 0, beam_dim) / length_penalty(
        decode_length)
    worst_finished = mtf.reduce_min(
        finished_scores * mtf.cast(finished_flags, dtype), reduced_dim=beam_dim)
    worst_finished += (1.0 - mtf.cast(
        mtf.reduce_any(finished_flags, reduced_dim=beam_dim), dtype)) * -INF
    bound_is_met = mtf.reduce_all(mtf.greater(worst_finished, best_alive))
    return mtf.logical_and(not_done, mtf.logical_not(bound_is_met))

  loop_inputs = [mtf.constant(mesh, 0, dtype=tf.int32), initial_ids,
                 initial_log_probs, initial_ids, finished_scores,
                 finished_flags] + states
  outputs = mtf.while_loop(cond, body, loop_inputs)
  _, alive_seq, alive_log_probs, finished_seq, finished_scores = outputs[:5]
  finished_flags = outputs[5]
  any_finished = mtf.reduce_any(finished_flags, reduced_dim=beam_dim)
  decoded = mtf.where(any_finished, finished_seq, alive_seq)
  scores = mtf.where(any_finished, finished_scores, alive_log_probs)
  return decoded, scores


@configurable_lib.configurable
def greedy_decode(logits_fn, initial_ids, temperature=0.0,
                  initial_states=None, eos_id=EOS_ID, forced_ids=None,
                  use_tpu=True):
  """Decodes one token per step by argmax (or sampling) until EOS.

  Position i is filled at step i when `initial_ids` holds 0 there; non-zero
  entries (a prompt) are kept. After a row's EOS its positions stay 0. The
  loop stops when every row holds an EOS or the length is used up.

  Args:
    logits_fn: fn(step_num, ids, states) -> (logits, new_states): step_num a
      scalar int32 Tensor, ids int32 [batch..., length], logits [batch...,
      vocab] for the token at position step_num.
    initial_ids: int32 Tensor [batch..., length]; 0 marks positions to fill.
    temperature: 0.0 for argmax, else the sampling temperature (a Python
      number or a scalar Tensor; see `mtf.sample_with_temperature`).
    initial_states: optional list of Tensors, the states' start values.
    eos_id: the end-of-sequence token.
    forced_ids: optional int32 Tensor like initial_ids; its non-zero entries
      are written instead of the decoded token.
    use_tpu: ignored (kept for compatibility).

  Returns:
    int32 Tensor like initial_ids, the decoded sequences.
  """
  del use_tpu
  length_dim = initial_ids.shape.dims[-1]
  mesh = initial_ids.mesh
  num_steps = mtf.constant(mesh, length_dim.size, dtype=tf.int32)

  def has_eos(ids):
    return mtf.reduce_any(mtf.equal(ids, eos_id), reduced_dim=length_dim)

  def cond(step_num, ids, *unused_states):
    overflow = mtf.greater_equal(step_num, num_steps)
    return mtf.logical_not(mtf.logical_or(overflow, mtf.reduce_all(
        has_eos(ids))))

  def body(step_num, ids, *states):
    logits, new_states = logits_fn(step_num, ids, list(states))
    vocab_dim = logits.shape.dims[-1]
    new_ids = mtf.sample_with_temperature(logits, vocab_dim, temperature)
    if forced_ids is not None:
      forced = mtf.gather(forced_ids, step_num, length_dim)
      new_ids = forced + new_ids * mtf.to_int32(mtf.equal(forced, 0))
    here = mtf.one_hot(step_num, length_dim, dtype=tf.int32)
    current = mtf.reduce_sum(ids * here, reduced_dim=length_dim)
    fill = mtf.to_int32(mtf.logical_and(mtf.equal(current, 0),
                                        mtf.logical_not(has_eos(ids))))
    ids += new_ids * fill * here
    return [step_num + 1, ids] + list(new_states)

  loop_inputs = ([mtf.constant(mesh, 0, dtype=tf.int32), initial_ids] +
                 list(initial_states or []))
  return mtf.while_loop(cond, body, loop_inputs)[1]
