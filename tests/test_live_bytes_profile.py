"""recompute_memory.live_bytes_profile: the counted peak per device.

benchmarks/plan.py counts each processor's peak bytes with it (the buffers
of one device alive at that device's peak while the whole step runs in
order), split by category. Two chains on two devices, hand-counted.
"""

import pathlib
import sys

import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent /
                       "benchmarks"))
import recompute_memory  # pylint: disable=g-import-not-at-top,wrong-import-position


def _two_chains():
  """x[256] -> y on cpu:0, u[512] -> w on cpu:1, their sums off-device."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.device("/cpu:0"):
      x = tf.random.uniform([256], name="fwd_x")
      y = tf.multiply(x, 2.0, name="fwd_y")
    with tf.device("/cpu:1"):
      u = tf.random.uniform([512], name="bwd_u")
      w = tf.multiply(u, 3.0, name="bwd_w")
    out = tf.add(tf.reduce_sum(y), tf.reduce_sum(w), name="out")
  return graph, out


def test_peak_per_device_and_category():
  graph, out = _two_chains()
  profile = recompute_memory.live_bytes_profile(
      graph, [out], group_of=recompute_memory.device_index,
      category_of=lambda op: op.name.split("_")[0])
  for schedule in ("asap", "alap"):
    groups = profile[schedule]
    # Each input is alive with its product: 2 x 1 KB, 2 x 2 KB.
    assert groups[0] == {"peak": 2048, "at_peak": {"fwd": 2048}}
    assert groups[1] == {"peak": 4096, "at_peak": {"bwd": 4096}}
    # The three float32 scalars, the output kept to the end.
    assert groups[None]["peak"] == 12


def test_one_group_is_the_whole_graph():
  """Both schedules make x, u, then y (x is freed), then w: the peak is
  x + u + y, then u + y + w = 1 + 2 + 2 KB."""
  graph, out = _two_chains()
  assert recompute_memory.peak_live_bytes(graph, [out]) == {
      "asap": 5120, "alap": 5120}
