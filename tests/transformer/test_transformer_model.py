"""Unitransformer and Bitransformer under every layout: losses, gradients,
incremental decoding, beam search and training.

On one processor, a program per model fetches the loss, every gradient
and variable, the ids decoded incrementally (sampling at temperature 0,
and beam search) and the logits of a full forward pass over the decoded
ids: each decoded token must be the argmax of the full pass on its prefix,
which holds only if the cached keys and values of incremental decoding are
right. Under each layout the loss, gradients, variables and decoded ids
must equal the one-processor answer (a layout may change round-off, never
the answer). Layouts cost lowering time (8 processors), so each model runs
under a few layout/mode pairs that together cover them all.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests.transformer import layer_testing
from tests.transformer import model_testing as mt

ONE, DP, MP, TWO_D = layer_testing.LAYOUTS
EOS = 1


def _gradients_of_all_variables(mesh, loss):
  wrt = {v.name: v.outputs[0] for v in mesh.graph.trainable_variables}
  return loss, wrt


def _lm_program(mesh, everything=True):
  """Loss and greedy decoding of the LM; with `everything` also the
  continuation of given prefixes, beam search and the full passes over the
  decoded ids (checked on one processor)."""
  model = mt.make_lm(num_layers=2 if everything else 1)
  loss, wrt = _gradients_of_all_variables(mesh, mt.lm_loss(model, mesh))
  zeros = mtf.zeros(mesh, [mt.BATCH, mt.LENGTH], tf.int32)
  greedy = model.sample_autoregressive(
      zeros, stop_at_token=None, has_partial_sequences=False)
  outputs = {"loss": loss, "greedy": greedy}
  if everything:
    # Continue given prefixes (their states come from the first-part pass).
    prefix = mt.import_ids(mesh,
                           np.where(np.arange(mt.L) < 3, mt.TARGETS, 0))
    outputs["continued"] = model.sample_autoregressive(
        prefix, stop_at_token=None)
    beam_dim = mtf.Dimension("beam", 1)
    outputs["beam"] = model.beam_search(
        mtf.zeros(mesh, [mt.BATCH, beam_dim, mt.LENGTH], tf.int32),
        mtf.constant(mesh, mt.L, dtype=tf.int32))
    for name in ("greedy", "continued"):
      ids = outputs[name]
      outputs[name + "_logits"], _ = model.call_simple(
          transformer.autoregressive_inputs(ids), ids, False, mode="infer")
  return outputs, loss, wrt


def _lm_layout_program(mesh):
  return _lm_program(mesh, everything=False)


def _bi_program(mesh, everything=True):
  """Loss and decoding of the encoder-decoder model; with `everything`
  also beam search and the full pass over the decoded ids."""
  model = mt.make_bitransformer()
  loss, wrt = _gradients_of_all_variables(mesh, mt.bi_loss(model, mesh))
  inputs = mt.import_ids(mesh, mt.INPUTS)
  decoded = model.decode(inputs)
  outputs = {"loss": loss, "decoded": decoded}
  if everything:
    outputs["beam"] = model.decode(inputs, beam_size=2,
                                   max_decode_length=mt.L)
    outputs["decoded_logits"], _ = model.call_simple(
        inputs, decoded, False, mode="infer",
        decoder_sequence_id=mtf.ones(mesh, decoded.shape, tf.int32))
  return outputs, loss, wrt


def _bi_layout_program(mesh):
  return _bi_program(mesh, everything=False)


def _first_eos_or_end(ids):
  """Per row, how many leading positions were decoded for sure: up to and
  including the first EOS (the loop stops once every row has one)."""
  ends = []
  for row in ids:
    hits = np.flatnonzero(row == EOS)
    ends.append(hits[0] + 1 if hits.size else len(row))
  return ends


def _assert_tokens_are_argmax(ids, logits, ends=None, start=0):
  ends = ends or [ids.shape[1]] * ids.shape[0]
  for row, end in enumerate(ends):
    np.testing.assert_array_equal(
        ids[row, start:end], logits[row, start:end].argmax(-1),
        err_msg=f"row {row}")


@pytest.fixture(scope="module")
def lm_reference():
  return layer_testing.run_under(ONE[1], ONE[2], "function", _lm_program)


@pytest.fixture(scope="module")
def bi_reference():
  return layer_testing.run_under(ONE[1], ONE[2], "function", _bi_program)


def test_lm_decoding_matches_the_full_forward_pass(lm_reference):
  got = lm_reference
  _assert_tokens_are_argmax(got["greedy"], got["greedy_logits"])
  np.testing.assert_array_equal(got["continued"][:, :3], mt.TARGETS[:, :3])
  _assert_tokens_are_argmax(got["continued"], got["continued_logits"],
                            start=3)
  # Decoded tokens are not all the same (the test would be weak).
  assert len(np.unique(got["greedy"])) > 3


def test_lm_beam_search_of_one_beam_is_greedy(lm_reference):
  got = lm_reference
  assert got["beam"].shape == (mt.B, mt.L)
  for row, end in enumerate(_first_eos_or_end(got["greedy"])):
    np.testing.assert_array_equal(got["beam"][row, :end],
                                  got["greedy"][row, :end])


def test_bitransformer_decoding_matches_the_full_forward_pass(bi_reference):
  got = bi_reference
  _assert_tokens_are_argmax(got["decoded"], got["decoded_logits"],
                            _first_eos_or_end(got["decoded"]))
  assert got["beam"].shape == (mt.B, mt.L)


@functools.lru_cache(maxsize=None)
def _one_processor(program):
  return layer_testing.run_under(ONE[1], ONE[2], "function", program)


def _assert_like_one_processor(program, case, mode):
  reference = _one_processor(program)
  case_id, mesh_shape, layout = case
  got = layer_testing.run_under(mesh_shape, layout, mode, program)
  assert set(got) == set(reference)
  for key, want in reference.items():
    np.testing.assert_allclose(
        got[key], want, rtol=1e-5, atol=1e-5,
        err_msg=f"{key} differs under {case_id} ({layout!r}) in {mode}")


@pytest.mark.parametrize("program,case,mode", [
    (_lm_layout_program, DP, "function"),
    (_lm_layout_program, MP, "graph"),
    (_lm_layout_program, TWO_D, "simd"),
    (_bi_layout_program, TWO_D, "function"),
], ids=["lm-dp-function", "lm-mp-graph", "lm-2d-simd", "bi-2d-function"])
def test_loss_gradients_and_decoding_under_layouts(program, case, mode):
  _assert_like_one_processor(program, case, mode)


def test_gradients_reach_every_variable(lm_reference, bi_reference):
  for got in (lm_reference, bi_reference):
    grads = [k for k in got if k.startswith("d_")]
    assert len(grads) > 10
    assert all(np.abs(got[k]).sum() > 0 for k in grads), [
        k for k in grads if not np.abs(got[k]).sum()]


def test_variable_names(bi_reference):
  names = set(bi_reference)
  assert {"shared/embedding", "shared/positional_embedding",
          "decoder/logits/kernel", "decoder/rms_norm/scale",
          "encoder/rms_norm/scale",
          "encoder/block_000/layer_000/TinySelfAttention/q",
          "decoder/block_000/layer_001/TinyEncDecAttention/o",
          "decoder/block_000/layer_002/rms_norm/scale"} <= names
  assert not any(n.startswith(("encoder/embedding", "decoder/embedding"))
                 for n in names)
  assert bi_reference["shared/embedding"].shape == (32, mt.D)


def _sgd():
  return mtf.optimize.SgdOptimizer(0.5)


@pytest.mark.parametrize("loss_fn,make_model,cases", [
    (mt.lm_loss, mt.make_lm, [(MP, "function"), (TWO_D, "simd")]),
    (mt.bi_loss, mt.make_bitransformer, [(DP, "graph")]),
], ids=["lm", "bitransformer"])
def test_training_is_the_same_under_layouts(loss_fn, make_model, cases):
  def make_loss(mesh):
    return loss_fn(make_model(), mesh)
  want = mt.train_losses(make_loss, ONE[1], ONE[2], "function", 3, _sgd)
  assert want[-1] < want[0]
  for (case_id, mesh_shape, layout), mode in cases:
    got = mt.train_losses(make_loss, mesh_shape, layout, mode, 3, _sgd)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                               err_msg=f"{case_id} in {mode}")


def _prefix_entropy(targets):
  """The loss no LM can beat on `targets`: rows whose prefixes agree read
  the same inputs, so their next tokens are only predictable by
  frequency."""
  total = 0.0
  for p in range(targets.shape[1]):
    groups = {}
    for row in targets:
      if row[p]:
        groups.setdefault(tuple(row[:p]), []).append(row[p])
    for tokens in groups.values():
      _, counts = np.unique(tokens, return_counts=True)
      total += (counts * -np.log(counts / counts.sum())).sum()
  return total / targets.size


@pytest.mark.parametrize("loss_fn,make_model,floor", [
    (mt.lm_loss, lambda: mt.make_lm(z_loss=0.0),
     _prefix_entropy(mt.TARGETS)),
    (mt.bi_loss, mt.make_bitransformer, 0.0),
], ids=["lm", "bitransformer"])
def test_overfits_a_tiny_batch(loss_fn, make_model, floor):
  losses = mt.train_losses(
      lambda mesh: loss_fn(make_model(), mesh), ONE[1], ONE[2], "function",
      120, lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.03))
  assert losses[-1] < floor + 0.05, losses[::10]


def _packed_past_the_table(mesh):
  """A Unitransformer whose table has L/2 positions, fed packed positions
  that reach past it: the rows it adds, and its table."""
  model = mt.make_lm(max_length=mt.L // 2)
  positions = np.tile(np.concatenate(
      [np.arange(2), np.arange(mt.L - 2)]), (mt.B, 1)).astype(np.int32)
  context = layer_testing.make_context(
      mesh, model, mt.BATCH, mt.LENGTH, position=mt.import_ids(mesh, positions),
      position_is_default=False)
  with tf.compat.v1.variable_scope(model.name):
    rows = model._position_embedding(context, mesh, None)
  rows = mtf.transpose(rows, [mt.BATCH, mt.LENGTH, model.model_dim])
  return {"rows": rows, "positions": context.position}, None, {}


@pytest.mark.parametrize("case", [ONE, TWO_D], ids=lambda c: c[0])
def test_packed_positions_past_the_table_get_zero_rows(case):
  """Packed examples longer than max_length: positions past the table add
  zeros (a plain gather fails on CPU), the same under every layout."""
  got = layer_testing.run_under(case[1], case[2], "function",
                                _packed_past_the_table)
  table = [v for k, v in got.items() if k.endswith("positional_embedding")]
  assert len(table) == 1, sorted(got)
  positions = got["positions"]
  assert positions.max() >= mt.L // 2
  want = np.where((positions < mt.L // 2)[..., None],
                  table[0][np.minimum(positions, mt.L // 2 - 1)], 0.0)
  np.testing.assert_allclose(got["rows"], want, rtol=1e-6)
  assert np.abs(got["rows"]).max() > 0
