"""The binary's checkpoints carry the original's names, so the rest of the
ecosystem reads them: every variable by its mtf name (optimizer slots
included), in its master dtype, and the int64 "global_step", the keys a
TF1 `tf.compat.v1.train.Saver` of the same model writes; TensorFlow alone
reads them back (no mesh_tensorflow import), and any mesh restores them.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests.transformer import test_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STEPS = 2
SHORT = [f"utils.run.train_steps = {STEPS}",
         "utils.run.iterations_per_loop = 2",
         "utils.run.save_checkpoints_steps = 2"]

# Reads a checkpoint with TensorFlow alone, as converters do.
_READER = """
import json, sys
import numpy as np
import tensorflow as tf
path, out = sys.argv[1], sys.argv[2]
values = {name: tf.train.load_variable(path, name)
          for name, _ in tf.train.list_variables(path)}
assert not any(m.startswith("mesh_tensorflow") for m in sys.modules), (
    sorted(m for m in sys.modules if m.startswith("mesh_tensorflow")))
np.savez(out, **{name.replace("/", "|"): np.asarray(v, np.float64)
                 for name, v in values.items()})
with open(out + ".json", "w") as f:
  json.dump({name: [list(v.shape), str(v.dtype)]
             for name, v in values.items()}, f)
"""


def _run(*args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600,
                          check=False)
  assert result.returncode == 0, result.stderr[-5000:]


def _listing(path):
  """{name: (shape, dtype name)} of a checkpoint."""
  reader = tf.train.load_checkpoint(path)
  dtypes = reader.get_variable_to_dtype_map()
  return {name: (list(shape), dtypes[name].name)
          for name, shape in reader.get_variable_to_shape_map().items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("run")
  test_main.run_main(model_dir, *SHORT)
  return model_dir


def test_files_are_a_standard_name_based_checkpoint(trained):
  path = tf.train.latest_checkpoint(str(trained))
  assert path.endswith(f"model.ckpt-{STEPS}")
  assert os.path.exists(path + ".index")
  assert os.path.exists(path + ".data-00000-of-00001")
  listing = _listing(path)
  assert listing["global_step"] == ([], "int64")
  assert int(tf.train.load_variable(path, "global_step")) == STEPS
  assert not any(".ATTRIBUTES" in name or name.startswith("_CHECKPOINTABLE")
                 for name in listing)
  # Master dtypes (bfloat16 by default, as T5's) and the Adafactor slots
  # under the original's names.
  k = "decoder/block_000/layer_000/SelfAttention/k"
  assert listing[k] == ([16, 16], "bfloat16")
  assert listing[k + "_slot_v"] == ([16, 16], "float32")
  assert listing["shared/embedding"][1] == "bfloat16"


def test_tensorflow_alone_reads_every_variable_by_name(trained, tmp_path):
  out = str(tmp_path / "values.npz")
  _run("-c", _READER, str(trained), out)
  with open(out + ".json") as f:
    read = json.load(f)
  assert {n: (s, d) for n, (s, d) in read.items()} == _listing(str(trained))
  values = np.load(out)
  ours = mtf.storage.checkpointing.load_variables(str(trained))
  assert set(ours) == set(read)
  for name, value in ours.items():
    np.testing.assert_array_equal(
        values[name.replace("/", "|")], np.asarray(value, np.float64),
        err_msg=name)


def test_names_are_those_of_a_tf1_saver_of_the_same_model(trained, tmp_path):
  saver_prefix = str(tmp_path / "saver")
  _run("-m", "tests.transformer.saver_names_worker",
       str(tmp_path / "graph_run"), saver_prefix,
       "utils.run.train_steps = 1")
  assert _listing(saver_prefix) == _listing(str(trained))


def test_any_mesh_restores_them(trained):
  scores = {}
  for mesh, layout in [
      ("batch:2;model:2", "batch:batch,d_ff:model,heads:model,vocab:model"),
      ("model:2", "d_ff:model,heads:model,vocab:model"),
      ("all:1", "")]:
    scores[mesh], _ = test_main.run_main(
        trained, "utils.run.mode = 'score_from_strings'",
        "score_from_strings.inputs = ['1+2', '30+4']",
        "score_from_strings.targets = ['3', '34']",
        f"utils.run.mesh_shape = '{mesh}'",
        f"utils.run.layout_rules = '{layout}'")
  first = scores.pop("batch:2;model:2")
  for mesh, value in scores.items():
    np.testing.assert_allclose(value, first, rtol=1e-5, err_msg=mesh)
