"""The binary trains a pipelined LM to the unpipelined loss curve.

The tiny LM of 4 layers (dropout off) trains 3 steps through the binary
unpipelined, then as a PipelinedLayerStack of 4 stages on mesh stage:4
and of 2 stages on stage:2;batch:2;model:2: every step's loss agrees, and
the checkpoints hold the same variable names (the per-layer ones). The
runs are the session fixture `pipelined_lm_run` (conftest.py), which
test_pipelined_run_modes.py also restores from.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import test_auto_layout_run

STEPS = 3
LM = [p for p in test_auto_layout_run.LM
      if not p.startswith(("utils.run.train_steps", "auto_layout"))] + [
          f"utils.run.train_steps = {STEPS}", "num_layers = 4",
          # An "lm" decodes prompt and answer in one sequence of 16: its
          # position table has 16 entries (test_pipelined_run_modes.py).
          "Unitransformer.max_length = 16"]
PIPELINED = [
    "transformer.make_layer_stack.layer_stack_cls = "
    "@transformer.PipelinedLayerStack",
    "transformer.PipelinedLayerStack.num_microbatches = 4",
]
MODEL_RULES = "d_ff:model,heads:model,vocab:model"
RUNS = {
    "plain": ["utils.run.mesh_shape = 'batch:2;model:2'",
              f"utils.run.layout_rules = 'batch:batch,{MODEL_RULES}'"],
    "stage4": PIPELINED + [
        "transformer.PipelinedLayerStack.num_stages = 4",
        "utils.run.mesh_shape = 'stage:4'",
        "utils.run.layout_rules = 'stage:stage'"],
    "stage2_batch2_model2": PIPELINED + [
        "transformer.PipelinedLayerStack.num_stages = 2",
        "transformer.PipelinedLayerStack.recompute_grads = True",
        "utils.run.mesh_shape = 'stage:2;batch:2;model:2'",
        f"utils.run.layout_rules = 'stage:stage,batch:batch,{MODEL_RULES}'"],
}


def train(model_dir, name):
  """The per-step losses of run `name` of RUNS, trained in model_dir."""
  model_dir.mkdir(parents=True, exist_ok=True)
  _, losses = test_auto_layout_run._train(  # pylint: disable=protected-access
      model_dir, *LM, *RUNS[name], files=test_auto_layout_run.LM_FILES)
  return [float(loss) for loss in losses]


@pytest.fixture(scope="module")
def runs(pipelined_lm_run):
  return {name: pipelined_lm_run(name) for name in RUNS}


@pytest.mark.parametrize("name", ["stage4", "stage2_batch2_model2"])
def test_pipelined_losses_follow_the_plain_curve(runs, name):
  plain = runs["plain"]["losses"]
  assert len(plain) == STEPS and plain[-1] < plain[0]
  np.testing.assert_allclose(runs[name]["losses"], plain, rtol=1e-4,
                             atol=1e-5)


@pytest.mark.parametrize("name", ["stage4", "stage2_batch2_model2"])
def test_pipelined_checkpoint_has_the_per_layer_names(runs, name):
  def names(directory):
    return set(tf.train.load_checkpoint(str(directory))
               .get_variable_to_shape_map())
  plain = names(runs["plain"]["dir"])
  assert "transformer/block_003/layer_001/DenseReluDense/wi/kernel" in plain, (
      sorted(plain))
  assert names(runs[name]["dir"]) == plain
