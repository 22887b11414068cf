"""The chief of a cluster test: the reduce-scatter of a pending sum.

Usage: python -m tests.cluster.reduce_scatter_chief WORKER_HOSTS MESH_IMPL
MESH_IMPL is "placement" (every task's devices) or "simd" (the serving
tasks' devices). Lowers g = einsum(x, y) summing a batch split over "b:8"
and renames a dimension of g to one split over "b" (a reduce_scatter), and
back (an allconcat); prints the JSON of the renamed-back value and the
lowering's reduce_scatter and allreduce calls.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import cluster as cluster_lib
from tests.cluster import cluster_testing

LAYOUT = "batch:b;d_ff_zero:b"


def inputs():
  rng = np.random.RandomState(0)
  return (rng.uniform(-1, 1, [8, 4]).astype(np.float32),
          rng.uniform(-1, 1, [8, 16]).astype(np.float32))


def main(worker_hosts, mesh_impl):
  simd = mesh_impl == "simd"
  cluster = cluster_lib.connect(
      worker_hosts, task_index=0,
      num_cpus=None if simd else cluster_testing.CPUS_PER_TASK,
      startup_timeout=cluster_testing.STARTUP_TIMEOUT)
  if simd:
    impl = cluster.simd_mesh_impl("b:8", LAYOUT,
                                  collective_timeout_seconds=60)
  else:
    impl = cluster.placement_mesh_impl("b:8", LAYOUT)
  x, y = inputs()
  counters = {}

  def program():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    mx = mtf.import_tf_tensor(mesh, tf.constant(x), "batch:8,d_model:4")
    my = mtf.import_tf_tensor(mesh, tf.constant(y), "batch:8,d_ff:16")
    g = mtf.einsum([mx, my], output_shape="d_model:4,d_ff:16")
    h = mtf.rename_dimension(g, "d_ff", "d_ff_zero")
    back = mtf.rename_dimension(h, "d_ff_zero", "d_ff")
    lowering = mtf.Lowering(graph, {mesh: impl})
    value = lowering.export_to_tf_tensor(back)
    counters.update(lowering.counters)
    return value

  value = tf.function(lambda: impl.run(program))()
  print(json.dumps({
      "value": np.asarray(value).tolist(),
      "calls": {k: v for k, v in counters.items()
                if k.startswith("comm/") and k.endswith("/calls")}}),
        flush=True)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
