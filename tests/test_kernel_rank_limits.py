"""No kernel with a rank limit reaches TensorFlow unguarded.

tools/kernel_rank_audit.py runs every family of TF ops the lowerings emit at
ranks 6 to 8, eagerly and in a tf.function, with gradients, in a subprocess
per TF_ENABLE_ONEDNN_OPTS setting (1 and 0); here it must find nothing. The
other tests check the guards of slice_utils themselves, in this process's
setting, including graph mode with sizes unknown until run time.
"""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.backend import slice_utils

ROOT = pathlib.Path(__file__).resolve().parent.parent
AUDIT = ROOT / "tools" / "kernel_rank_audit.py"


def test_audit_finds_no_kernel_failing_at_ranks_6_to_8():
  """Both oneDNN settings, ranks 6, 7 and 8 (about 30 s of CPU time)."""
  result = subprocess.run(
      [sys.executable, str(AUDIT), "--ranks=6,7,8", "--onednn=both",
       "--no-bare"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, timeout=600, check=False)
  lines = result.stdout.splitlines()
  assert result.returncode == 0, result.stdout
  # Each setting really took effect in its subprocess.
  assert any(line.startswith("onednn=1: oneDNN kernels on") for line in
             lines), result.stdout
  assert any(line.startswith("onednn=0: oneDNN kernels off") for line in
             lines), result.stdout
  for setting in ("1", "0"):
    families = [line.split()[1] for line in lines
                if line.startswith(f"onednn={setting} ")]
    assert "softmax" in families and "mtf_programs" in families, lines
    assert len(families) >= 13, lines


def _softmax(x, axis):
  e = np.exp(x - np.max(x, axis=axis, keepdims=True))
  return e / np.sum(e, axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_softmax_merges_axes_at_rank_7(axis):
  x = np.random.RandomState(0).uniform(-2, 2, [2, 3, 2, 3, 2, 3, 2])
  y = slice_utils.softmax(tf.constant(x, tf.float32), axis)
  np.testing.assert_allclose(y.numpy(), _softmax(x, axis), rtol=1e-5,
                             atol=1e-6)


def test_softmax_keeps_rank_5_as_it_is():
  """No reshape at or under the kernel's limit."""
  graph = tf.Graph()
  with graph.as_default():
    slice_utils.softmax(tf.zeros([2] * 5), 2)
  types = {op.type for op in graph.get_operations()}
  assert "Softmax" in types and "Reshape" not in types, types


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_softmax_with_sizes_unknown_until_run_time(axis):
  """tf.compat.v1 graph mode, a placeholder with unknown sizes."""
  x = np.random.RandomState(1).uniform(-2, 2, [2, 3, 2, 3, 2, 3, 2])
  with tf.Graph().as_default():
    p = tf.compat.v1.placeholder(tf.float32, [None, 3, None, 3, 2, None, 2])
    y = slice_utils.softmax(p, axis)
    with tf.compat.v1.Session() as session:
      got = session.run(y, {p: x})
  np.testing.assert_allclose(got, _softmax(x, axis), rtol=1e-5, atol=1e-6)


def test_broadcast_groups_counts_as_bcast_does():
  assert slice_utils.broadcast_groups([[2, 1, 2, 1, 2, 1],
                                       [1, 2, 1, 2, 1, 2]]) == 6
  # Axes of size 1 everywhere vanish; alike neighbours merge.
  assert slice_utils.broadcast_groups([[2, 1, 1, 2, 2, 1],
                                       [1, 1, 2, 1, 1, 2]]) == 4
  # Shorter shapes align on the right.
  assert slice_utils.broadcast_groups([[2, 3, 4], [4]]) == 2
  # An unknown size counts as not broadcast.
  assert slice_utils.broadcast_groups([[None, 1, 2], [3, 4, 2]]) == 3


def test_broadcastable_tiles_only_beyond_five_groups():
  a = tf.ones([2, 1, 2, 1, 2])
  b = tf.ones([1, 3, 1, 3, 1])
  assert slice_utils.broadcastable([a, b]) == [a, b]
  a = tf.reshape(tf.range(8.0), [2, 1, 2, 1, 2, 1])
  b = tf.reshape(tf.range(27.0), [1, 3, 1, 3, 1, 3])
  tiled = slice_utils.broadcastable([a, b])
  assert slice_utils.broadcast_groups(
      [t.shape.as_list() for t in tiled]) <= slice_utils.MAX_BROADCAST_GROUPS
  np.testing.assert_array_equal((tiled[0] + tiled[1]).numpy(),
                                a.numpy() + b.numpy())
  np.testing.assert_array_equal(
      slice_utils.broadcast_to(a, [2, 3, 2, 3, 2, 3]).numpy(),
      np.broadcast_to(a.numpy(), [2, 3, 2, 3, 2, 3]))
