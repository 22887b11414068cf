"""The estimator reads checkpoints of the original library, and warm-starts.

A TF1 name-based checkpoint (`tf.compat.v1.train.Saver`, keys = mtf names,
bfloat16 masters, Adafactor slots, global_step 1234) is written by the test
(original_checkpoint.py); the estimator predicts from it what NumPy
computes, resumes training at its step, and warm-starts from it through
RunConfig(init_checkpoint=...), under one processor and a 2-D mesh whose
layout splits the variables (where Adafactor's same-shaped variables are
autostacked).
"""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow import estimator
from mesh_tensorflow.backend import placement_variables
from tests.estimator import original_checkpoint as orig

MESHES = {"one": ("all:1", "", "placement"),
          "2d": ("b:2;m:4", orig.LAYOUT_2D, "placement"),
          "2d_simd": ("b:2;m:4", orig.LAYOUT_2D, "simd")}
STEPS = 2


def make(model_dir, mesh="one", sharding="none", **config_kwargs):
  """(Estimator of the original-format model, list of its mesh impls)."""
  mesh_shape, layout, mesh_impl = MESHES[mesh]
  config = estimator.RunConfig(model_dir=str(model_dir),
                               mesh_shape=mesh_shape, layout=layout,
                               mesh_impl=mesh_impl,
                               save_checkpoints_steps=100, **config_kwargs)
  impls = []
  return estimator.Estimator(orig.model_fn, config=config,
                             params={"impls": impls,
                                     "sharding": sharding}), impls


def original(directory):
  return orig.write(os.path.join(str(directory), "model.ckpt"))


def values(est):
  return {name: est.get_variable_value(name)
          for name in est.get_variable_names()}


@pytest.mark.parametrize("mesh", list(MESHES))
def test_predict_from_original_checkpoint_equals_numpy(tmp_path, mesh,
                                                       caplog):
  path = original(tmp_path / "original")
  est, _ = make(tmp_path / "model", mesh)
  with caplog.at_level(logging.WARNING):
    out = [p["y"] for p in est.predict(orig.predict_input_fn,
                                       checkpoint_path=path)]
  np.testing.assert_allclose(np.stack(out), orig.numpy_predictions(),
                             rtol=1e-6, atol=1e-6)
  # The one variable of the model the checkpoint lacks, in one warning.
  warnings = [r.getMessage() for r in caplog.records
              if "keep their initial values" in r.getMessage()]
  assert len(warnings) == 1 and orig.SCALE in warnings[0], warnings
  assert orig.Q not in warnings[0]


def test_model_dir_holding_an_original_checkpoint(tmp_path):
  """get_variable_*, evaluate and export read it as the latest checkpoint."""
  original(tmp_path)
  est, _ = make(tmp_path)
  assert est.get_variable_value("global_step") == orig.STEP
  assert set(est.get_variable_names()) == set(orig.VALUES) | {"global_step"}
  np.testing.assert_array_equal(
      est.get_variable_value(orig.EMBEDDING).astype(np.float32),
      orig.VALUES[orig.EMBEDDING])
  assert est.get_variable_value(orig.EMBEDDING).dtype == (
      tf.bfloat16.as_numpy_dtype)
  result = est.evaluate(orig.input_fn, steps=1)
  assert result["global_step"] == orig.STEP
  expected_loss = np.mean((orig.numpy_predictions() - orig.LABELS) ** 2)
  np.testing.assert_allclose(result["loss"], expected_loss, rtol=1e-5)
  export_dir = est.export_saved_model(
      str(tmp_path / "export"),
      estimator.build_raw_serving_input_receiver_fn(
          {"ids": tf.constant(orig.IDS)}))
  served = tf.saved_model.load(export_dir).signatures["serving_default"](
      ids=tf.constant(orig.IDS))
  np.testing.assert_allclose(served["y"].numpy(), orig.numpy_predictions(),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mesh", ["one", "2d"])
def test_training_resumes_at_the_original_step_directly_or_warm(tmp_path,
                                                                mesh):
  """Resuming in a model_dir holding the original checkpoint and warm
  starting from it train alike, from step 1234, slots included."""
  direct_dir = tmp_path / "direct"
  original(direct_dir)
  direct, impls = make(direct_dir, mesh)
  direct.train(orig.input_fn, steps=STEPS)
  assert direct.get_variable_value("global_step") == orig.STEP + STEPS
  if mesh == "2d":  # Adafactor's [d_model] variables are stacked.
    entries = impls[-1].variable_store.eager_entries()
    assert isinstance(entries[orig.Q + "_slot_vc"],
                      placement_variables.StackMember)

  path = original(tmp_path / "original")
  warm, _ = make(tmp_path / "warm", mesh, init_checkpoint=path)
  warm.train(orig.input_fn, steps=STEPS)
  assert warm.get_variable_value("global_step") == orig.STEP + STEPS
  direct_values, warm_values = values(direct), values(warm)
  assert set(direct_values) == set(warm_values)
  for name, value in direct_values.items():
    np.testing.assert_allclose(warm_values[name], value, rtol=1e-6,
                               err_msg=name)
  # The slots were loaded: decayed by ~0.3% per step, not rebuilt from 0.
  np.testing.assert_allclose(warm_values[orig.Q + "_slot_vc"],
                             orig.VALUES[orig.Q + "_slot_vc"], rtol=0.02)

  # Once model_dir has a checkpoint, resuming wins over init_checkpoint.
  warm.train(orig.input_fn, steps=1)
  assert warm.get_variable_value("global_step") == orig.STEP + STEPS + 1


def test_2d_autostacked_run_matches_one_processor(tmp_path):
  path = original(tmp_path / "original")
  runs = {}
  for mesh in ("one", "2d"):
    est, _ = make(tmp_path / mesh, mesh, init_checkpoint=path)
    est.train(orig.input_fn, steps=STEPS)
    runs[mesh] = values(est)
  for name, value in runs["one"].items():
    np.testing.assert_allclose(runs["2d"][name], value, rtol=1e-5,
                               atol=1e-6, err_msg=name)


@pytest.mark.parametrize("sharding", ["update", "parameters"])
def test_sharded_training_resumes_from_the_original_checkpoint(tmp_path,
                                                              sharding):
  """Sharded weight updates or parameters load the original's checkpoint
  (whole slots, bfloat16 masters) and train exactly as without them; the
  checkpoint they write has the same names and shapes."""
  runs, slice_shapes = {}, {}
  for name in ("none", sharding):
    model_dir = tmp_path / name
    original(model_dir)
    est, impls = make(model_dir, "2d", sharding=name)
    est.train(orig.input_fn, steps=STEPS)
    assert est.get_variable_value("global_step") == orig.STEP + STEPS
    runs[name] = values(est)
    slice_shapes[name] = {
        k: tuple(v.slice_shape)
        for k, v in impls[-1].variable_store.eager_entries().items()}
  # q [d_model=8, d_kv=4 over m] is updated on d_model shards over b (2):
  # its slots are stored in halves, and with sharded parameters q too.
  for name in (orig.Q + "_slot_vc", "encoder/final_layer_norm/scale_slot_v",
               "shared/embedding_slot_vr"):
    assert slice_shapes["none"][name] == (8,), name
    assert slice_shapes[sharding][name] == (4,), name
  assert slice_shapes["none"][orig.Q] == (8, 1)
  assert slice_shapes[sharding][orig.Q] == (
      (4, 1) if sharding == "parameters" else (8, 1))
  assert set(runs[sharding]) == set(runs["none"])
  for name, value in runs["none"].items():
    assert runs[sharding][name].shape == value.shape, name
    np.testing.assert_allclose(runs[sharding][name], value, rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_init_variable_filter_and_warm_start_from_our_format(tmp_path):
  path = original(tmp_path / "original")
  est, _ = make(tmp_path / "model", init_checkpoint=path,
                init_variable_filter=r"^shared/")
  est.train(orig.input_fn, steps=1)
  # The step did not match the filter: not restored.
  assert est.get_variable_value("global_step") == 1
  embedding = est.get_variable_value(orig.EMBEDDING).astype(np.float32)
  np.testing.assert_allclose(embedding, orig.VALUES[orig.EMBEDDING],
                             rtol=0.05, atol=0.02)
  q = est.get_variable_value(orig.Q)
  assert not np.allclose(q, orig.VALUES[orig.Q], rtol=0.05, atol=0.02)

  # Warm-starting from a directory of our own (object-based) checkpoints
  # continues like resuming in it.
  warm, _ = make(tmp_path / "warm", init_checkpoint=str(tmp_path / "model"))
  warm.train(orig.input_fn, steps=1)
  est.train(orig.input_fn, steps=1)
  assert warm.get_variable_value("global_step") == 2
  resumed, warmed = values(est), values(warm)
  assert set(resumed) == set(warmed)
  for name, value in resumed.items():
    np.testing.assert_allclose(warmed[name], value, rtol=1e-6, err_msg=name)


def test_shape_mismatch_names_variable_shapes_and_file(tmp_path):
  wrong = dict(orig.VALUES)
  wrong[orig.Q] = np.zeros((orig.D_MODEL, 5))
  path = orig.write(str(tmp_path / "model.ckpt"), wrong)
  est, _ = make(tmp_path / "model")
  with pytest.raises(ValueError) as error:
    list(est.predict(orig.predict_input_fn, checkpoint_path=path))
  message = str(error.value)
  for part in (orig.Q, "[8, 5]", "[8, 4]", path):
    assert part in message, message


def test_unreadable_init_checkpoint_names_the_path(tmp_path):
  missing = str(tmp_path / "nowhere" / "model.ckpt-7")
  est, _ = make(tmp_path / "model", init_checkpoint=missing)
  with pytest.raises(ValueError, match="init_checkpoint.*nowhere"):
    est.train(orig.input_fn, steps=1)
  with pytest.raises(ValueError, match="init_variable_filter"):
    estimator.RunConfig(init_variable_filter="(")
