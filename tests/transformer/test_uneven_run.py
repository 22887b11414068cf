"""The binary with `utils.run.allow_uneven_splits = True`.

The tiny model of `test_main` (2 heads, batch 8), with d_ff 36, on the
original's gin layout `layouts/2x2_mp.gin` ("model:8" splitting heads, d_ff
and vocab), which divides neither its heads nor d_ff: refused without the
switch, with it the run logs what is padded and what it costs, and trains
to the variables of a run on one processor (its checkpoint holds the
logical shapes).
"""

import logging

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import main as main_lib
from tests.transformer import test_main

FILES = test_main.GIN_FILES + ["layouts/2x2_mp.gin"]
# test_main's tiny model without its mesh and layout (the gin file's).
PARAMS = [p for p in test_main.TINY
          if not p.startswith(("utils.run.mesh_shape",
                               "utils.run.layout_rules",
                               "utils.run.train_steps",
                               "utils.run.iterations_per_loop",
                               "utils.run.save_checkpoints_steps"))]
PARAMS += ["d_ff = 36", "utils.run.train_steps = 2",
           "utils.run.iterations_per_loop = 2",
           "utils.run.save_checkpoints_steps = 2"]
SWITCH = "utils.run.allow_uneven_splits = True"
FLOAT32 = ["utils.get_variable_dtype.master_dtype = 'float32'",
           "utils.get_variable_dtype.slice_dtype = 'float32'"]


def _run(model_dir, *params):
  test_main.FLAGS.unparse_flags()
  argv = ["main", f"--model_dir={model_dir}", "--noprogress",
          "--verbosity=0"]
  argv += [f"--gin_file={f}" for f in FILES]
  argv += [f"--gin_param={p}" for p in PARAMS + list(params)]
  argv = test_main.FLAGS(argv)
  gin.clear_config()
  try:
    return main_lib.main(argv)
  finally:
    gin.clear_config()
    test_main.FLAGS.unparse_flags()


def test_refused_without_the_switch_which_the_error_names(tmp_path):
  with pytest.raises(mtf.IndivisibleError, match=SWITCH.split(" =")[0]):
    _run(tmp_path / "run")


def _checkpoint_values(model_dir):
  checkpoint = tf.train.latest_checkpoint(str(model_dir))
  assert checkpoint.endswith("-2"), checkpoint
  reader = tf.train.load_checkpoint(checkpoint)
  return {name: reader.get_tensor(name)
          for name, _ in tf.train.list_variables(checkpoint)}


def test_trains_like_one_processor_and_reports_the_padding(tmp_path,
                                                           caplog):
  # INFO, as the binary logs by default under app.run.
  caplog.set_level(logging.INFO)
  _run(tmp_path / "uneven", SWITCH, *FLOAT32)
  messages = [r.getMessage() for r in caplog.records]
  assert any(m.startswith("Padded dimension heads (size 2) over model:8 -> "
                          "8 (+300.0%)") for m in messages), messages[-40:]
  assert any(m.startswith("Padded dimension d_ff (size 36) over model:8 -> "
                          "40 (+11.1%)") for m in messages)
  assert any(m.startswith("Padded variable ") and "d_ff=36" in m
             for m in messages)
  assert any(m.startswith("Padding cost, memory of variables: ")
             for m in messages)
  got = _checkpoint_values(tmp_path / "uneven")
  wi = [v.shape for n, v in got.items()
        if n.endswith("DenseReluDense/wi/kernel")]
  assert wi and all(s == (16, 36) for s in wi), wi
  # The same run on one processor: the same variables (weights, slots and
  # step) after the same steps.
  _run(tmp_path / "one", "utils.run.mesh_shape = 'all:1'",
       "utils.run.layout_rules = ''", *FLOAT32)
  want = _checkpoint_values(tmp_path / "one")
  assert set(got) == set(want)
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5,
                               err_msg=name)
