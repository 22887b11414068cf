"""The binary with sharded weight updates and sharded parameters.

A run trains 3 steps without sharding; its checkpoint is then continued to
step 6 twice: once with `utils.run.shard_parameters = True` (which implies
sharded updates) on another mesh, once without sharding. Both must reach
the same variables (slots included); the sharded run's checkpoint has the
unsharded names and shapes, so an unsharded run restores it; the switches
are in the operative config.
"""

import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests.transformer import test_main

FLOAT32 = ["utils.get_variable_dtype.master_dtype = 'float32'",
           "utils.get_variable_dtype.slice_dtype = 'float32'"]
FIRST = ["utils.run.train_steps = 3"] + FLOAT32
THEN = ["utils.run.train_steps = 6"] + FLOAT32
SHARDED_MESH = ["utils.run.mesh_shape = 'batch:4;model:2'",
                "utils.run.shard_parameters = True"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_result):
  """{"sharded": model dir, "plain": model dir}, trained once per pytest
  run whichever worker asks first (the tests only read them)."""
  def train():
    first = tmp_path_factory.mktemp("first")
    test_main.run_main(first, *FIRST)
    sharded = tmp_path_factory.mktemp("sharded")
    plain = tmp_path_factory.mktemp("plain")
    for directory in (sharded, plain):
      shutil.rmtree(directory)
      shutil.copytree(first, directory)
    for directory, extra in ((sharded, SHARDED_MESH), (plain, [])):
      info = directory / "model_info.txt"
      test_main.run_main(directory, *THEN, *extra,
                         f"tpu_estimator_model_fn.model_info_file = '{info}'")
    return {"sharded": str(sharded), "plain": str(plain)}

  return {k: pathlib.Path(v)
          for k, v in shared_result("transformer_sharded_run", train).items()}


def _slice_sizes(directory):
  """{variable name or "<tag> total": elements per processor}, from the
  lowering's log of the training graph."""
  sizes = {}
  for line in (directory / "model_info.txt").read_text().splitlines():
    words = line.split()
    if words and words[0] == "Variable" and "slice_size" in words:
      sizes[words[1]] = int(words[words.index("slice_size") + 1])
    elif "Total slice_size:" in line:
      sizes[line.split(" count:")[0] + " total"] = int(words[-1])
  return sizes


def test_sharded_run_continues_an_unsharded_one_to_the_same_variables(runs):
  got = mtf.storage.checkpointing.load_variables(str(runs["sharded"]))
  want = mtf.storage.checkpointing.load_variables(str(runs["plain"]))
  assert int(got["global_step"]) == int(want["global_step"]) == 6
  assert set(got) == set(want)
  for name, value in want.items():
    value = np.asarray(value)
    scale = float(np.max(np.abs(value))) if value.size else 0.0
    np.testing.assert_allclose(np.asarray(got[name]), value, rtol=1e-5,
                               atol=1e-5 * scale, err_msg=name)
  # Training moved the slots: the comparison is not of two no-ops.
  slot = "decoder/block_000/layer_000/SelfAttention/k_slot_v"
  assert np.abs(np.asarray(want[slot])).max() > 0


def test_sharded_checkpoint_has_whole_variables_and_slots(runs):
  def listing(directory):
    reader = tf.train.load_checkpoint(str(directory))
    return reader.get_variable_to_shape_map()
  assert listing(runs["sharded"]) == listing(runs["plain"])


def test_sharded_run_stores_parameters_and_slots_in_shards(runs):
  sharded, plain = _slice_sizes(runs["sharded"]), _slice_sizes(runs["plain"])
  assert set(sharded) == set(plain) and plain
  # The plain run is on batch:2;model:2, the sharded one on batch:4;model:2:
  # a variable replicated over "batch" is stored in quarters there.
  k = "decoder/block_000/layer_000/SelfAttention/k"
  assert sharded[k] * 4 == plain[k]
  # Every variable and slot of this model is (the model dimension splits
  # some of them in both runs, the same way).
  assert sharded["Trainable Variables total"] * 4 == (
      plain["Trainable Variables total"])
  assert sharded["All Variables total"] * 4 == plain["All Variables total"]


def test_switches_are_in_the_operative_config(runs):
  config = (runs["sharded"] / "operative_config.gin").read_text()
  assert "run.shard_parameters = True" in config
  assert "run.shard_weight_update = False" in config
