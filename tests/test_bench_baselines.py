"""The plain-TF baselines of benchmarks/mlp_stack.py do mtf's math.

benchmarks/tf_optimizers.py restates SGD, AdamWeightDecay and Adafactor
(mesh_tensorflow/optimize.py) on tf.Variables so that plain TensorFlow does
the same update work as the Mesh TensorFlow step it is timed against. On a
one-processor mesh both run the same kernels in the same order, so after a
few steps every weight and slot must agree; plain_split8 (the batch in 8
slices, gradients summed) must train like the whole batch.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent /
                       "benchmarks"))
import mlp_stack  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_optimizers  # pylint: disable=g-import-not-at-top,wrong-import-position

STEPS = 3
# io and hidden >= 128, so that Adafactor factors the second moment.
ARGS = ["--batch", "32", "--io", "128", "--hidden", "256", "--layers", "2"]


def _states(optimizer_name, splits=None):
  args = mlp_stack.parse_args(ARGS)
  weights, x, y = mlp_stack.initial_values(args)
  tf_step, _, _, tf_state = mlp_stack.run_plain_tf(tf, weights, x, y, args,
                                                   optimizer_name)
  if splits:
    other_step, _, _, other = mlp_stack.run_plain_tf(
        tf, weights, x, y, args, optimizer_name, splits)
  else:
    other_step, _, _, final = mlp_stack.run_mtf(tf, mtf, "one", weights, x,
                                                y, args, optimizer_name)
  tf_losses, other_losses = [], []
  for _ in range(STEPS):
    tf_losses.append(float(tf_step()))
    other_losses.append(float(other_step()))
  if splits:
    other = {n: v.numpy() for n, v in other.items()}
  else:
    other = final()
  return ({n: v.numpy() for n, v in tf_state.items()}, other, tf_losses,
          other_losses)


@pytest.mark.parametrize("optimizer_name", ["sgd", "adafactor", "adam"])
def test_plain_tf_optimizer_matches_mtf(optimizer_name, monkeypatch):
  # Rates large enough that every term of Adam's update (the weight decay
  # too) moves the weights well beyond round-off; both sides read them.
  monkeypatch.setitem(tf_optimizers.ADAM, "learning_rate", 0.01)
  monkeypatch.setitem(tf_optimizers.ADAM, "weight_decay_rate", 0.5)
  tf_state, mtf_state, tf_losses, mtf_losses = _states(optimizer_name)
  expected = {"sgd": 4, "adafactor": 4 + 8, "adam": 4 + 8}[optimizer_name]
  assert sorted(tf_state) == sorted(mtf_state)
  assert len(tf_state) == expected
  np.testing.assert_allclose(mtf_losses, tf_losses, rtol=1e-5, atol=1e-5)
  # Weights compared by how far they moved, slots by value.
  initial = {}
  for i, (w1, w2) in enumerate(
      mlp_stack.initial_values(mlp_stack.parse_args(ARGS))[0]):
    initial[f"w1_{i}"], initial[f"w2_{i}"] = w1, w2
  for name, value in tf_state.items():
    start = initial.get(name, 0.0)
    moved = value - start
    np.testing.assert_allclose(mtf_state[name] - start, moved, rtol=1e-5,
                               atol=1e-7 * np.abs(moved).max(),
                               err_msg=name)
    assert np.abs(moved).max() > 0, name  # The step did something.


def test_plain_split8_trains_like_the_whole_batch():
  tf_state, split_state, tf_losses, split_losses = _states("sgd", splits=8)
  np.testing.assert_allclose(split_losses, tf_losses, rtol=1e-5, atol=1e-5)
  for name, value in tf_state.items():
    np.testing.assert_allclose(split_state[name], value, rtol=1e-5,
                               atol=1e-5, err_msg=name)
