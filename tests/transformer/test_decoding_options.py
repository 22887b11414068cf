"""sample_autoregressive's options (stop_at_token, never_end, bos_id,
remove_partial_sequences, max_steps) and Bitransformer.decode's lengths,
on one processor, in one program (layouts: test_transformer_model.py)."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests.transformer import layer_testing
from tests.transformer import model_testing as mt

PREFIX = 3


def _decode(model, mesh, **kwargs):
  kwargs.setdefault("stop_at_token", None)
  kwargs.setdefault("has_partial_sequences", False)
  return model.sample_autoregressive(
      mtf.zeros(mesh, [mt.BATCH, mt.LENGTH], tf.int32), **kwargs)


@pytest.fixture(scope="module")
def decoded():
  lm = mt.make_lm()
  bi = mt.make_bitransformer()

  def build(mesh):
    greedy = _decode(lm, mesh)
    # Every row decodes the same first token (all read 0 at position 0).
    first = mtf.reduce_max(mtf.gather(greedy, 0, mt.LENGTH))
    outputs = {"greedy": greedy}
    prefix = mt.import_ids(
        mesh, np.where(np.arange(mt.L) < PREFIX, mt.TARGETS, 0))
    outputs["prefix_kept"] = lm.sample_autoregressive(
        prefix, stop_at_token=None)
    outputs["prefix_removed"] = lm.sample_autoregressive(
        prefix, stop_at_token=None, remove_partial_sequences=True)
    outputs["max_steps"] = _decode(lm, mesh, max_steps=2)
    outputs["bos"] = _decode(lm, mesh, bos_id=5)
    bos_inputs = mtf.shift(outputs["bos"], 1, mt.LENGTH, wrap=False) + (
        5 * mtf.one_hot(mtf.constant(mesh, 0, dtype=tf.int32), mt.LENGTH,
                        dtype=tf.int32))
    outputs["bos_logits"], _ = lm.call_simple(
        bos_inputs, outputs["bos"], False, mode="infer")
    outputs["first"] = first
    inputs = mt.import_ids(mesh, mt.INPUTS)
    outputs["bi_short"] = bi.decode(inputs, max_decode_length=5)
    # Beam search decodes max input length * 0 + 2 tokens.
    outputs["bi_beam_two"] = bi.decode(
        inputs, beam_size=2, decode_length_multiplier=0.0,
        decode_length_constant=2)
    return outputs, None, {}
  return layer_testing.run_under("all:1", "", "function", build)


def test_partial_sequences(decoded):
  kept, removed = decoded["prefix_kept"], decoded["prefix_removed"]
  np.testing.assert_array_equal(kept[:, :PREFIX], mt.TARGETS[:, :PREFIX])
  np.testing.assert_array_equal(removed[:, :mt.L - PREFIX], kept[:, PREFIX:])
  assert (removed[:, mt.L - PREFIX:] == 0).all()


def test_max_steps(decoded):
  np.testing.assert_array_equal(decoded["max_steps"][:, :2],
                                decoded["greedy"][:, :2])
  assert (decoded["max_steps"][:, 2:] == 0).all()


def test_bos_id_is_read_at_position_0(decoded):
  np.testing.assert_array_equal(decoded["bos"],
                                decoded["bos_logits"].argmax(-1))


def test_decode_length(decoded):
  assert decoded["bi_short"].shape == (mt.B, 5)
  beam = decoded["bi_beam_two"]
  assert beam.shape == (mt.B, mt.L)
  assert (beam[:, 2:] == 0).all() and (beam[:, :1] != 0).any()


@pytest.mark.parametrize("never_end", [False, True])
def test_stop_at_token_and_never_end(decoded, never_end):
  lm = mt.make_lm()
  stop = int(decoded["first"])

  def build(mesh):
    return {"ids": _decode(lm, mesh, stop_at_token=stop,
                           never_end=never_end)}, None, {}
  ids = layer_testing.run_under("all:1", "", "function", build)["ids"]
  if never_end:
    assert (ids != stop).all()
  else:
    # Every row produced the stop token first: the loop ends at once.
    assert (ids[:, 0] == stop).all()
    assert (ids[:, 1:] == 0).all()


def test_sampling_keep_top_k_must_be_positive():
  lm = mt.make_lm()
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  with pytest.raises(ValueError, match="sampling_keep_top_k"):
    _decode(lm, mesh, sampling_keep_top_k=0)
  with pytest.raises(ValueError, match="not autoregressive"):
    mt.make_bitransformer().encoder.sample_autoregressive(
        mtf.zeros(mesh, [mt.BATCH, mt.LENGTH], tf.int32))


@pytest.mark.parametrize("setting", [{"temperature": 0.5},
                                     {"sampling_keep_top_k": 3}])
def test_beam_search_refuses_sampling_settings(setting):
  """Bitransformer.decode with beam_size > 1 names the sampling setting it
  cannot honour, instead of ignoring it."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  inputs = mtf.zeros(mesh, [mt.BATCH, mt.LENGTH], tf.int32)
  name = next(iter(setting))
  with pytest.raises(ValueError, match=f"Bitransformer.decode: .*{name}"):
    mt.make_bitransformer().decode(inputs, beam_size=2, **setting)


def test_rows_of_different_prefixes_stop_inside_a_table_of_their_length():
  """make_lm's position table has exactly mt.L rows. Rows with longer
  prefixes reach the end first and wait there while the others decode: no
  position past the table is looked up, and every produced token is still
  the argmax of a full pass over the row."""
  lm = mt.make_lm()
  prefix_lengths = np.arange(mt.B) % (mt.L - 2) + 1
  prefixes = np.where(np.arange(mt.L) < prefix_lengths[:, None],
                      mt.TARGETS, 0)
  assert (np.count_nonzero(prefixes, axis=1) == prefix_lengths).all()

  def build(mesh):
    ids = lm.sample_autoregressive(mt.import_ids(mesh, prefixes),
                                   stop_at_token=None)
    logits, _ = lm.call_simple(transformer.autoregressive_inputs(ids), ids,
                               False, mode="infer")
    return {"ids": ids, "logits": logits}, None, {}
  got = layer_testing.run_under("all:1", "", "function", build)
  ids = got["ids"]
  for row, start in enumerate(prefix_lengths):
    np.testing.assert_array_equal(ids[row, :start], prefixes[row, :start])
    np.testing.assert_array_equal(ids[row, start:],
                                  got["logits"][row, start:].argmax(-1),
                                  err_msg=f"row {row}")
