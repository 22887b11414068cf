"""Benchmark: one training step on a 2-process cluster against one process.

The README's MLP (h = relu(x @ w1[io, hidden]), out = h @ w2[hidden, io],
mean squared error, SGD) on the mesh b:2;m:4 with the layout
batch:b;hidden:m, run two ways from the same process and the same initial
weights, taking turns step by step:

  one_process  8 logical CPUs of this process
  cluster      4 logical CPUs of this process (task 0, the chief) and 4 of
               a second process (task 1, a `python -m mesh_tensorflow.cluster`
               server on a loopback port): the batch halves live in different
               processes, and the hidden dimension is split inside each one

It prints one JSON line: the median step times, their ratio, and how far
the two runs' losses drift apart (to show the same math is measured).

  python benchmarks/cluster_step.py [--steps 30] [--batch 512] ...
"""

import argparse
import os
import socket
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path.insert(0, _HERE)
sys.path.insert(1, _ROOT)

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

MESH_SHAPE = "b:2;m:4"
LAYOUT = "batch:b;hidden:m"


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  bench_util.add_timing_args(p, steps=30, warmup=3)
  p.add_argument("--batch", type=int, default=512)
  p.add_argument("--io", type=int, default=256)
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--lr", type=float, default=0.01)
  return p.parse_args(argv)


def _free_ports(n):
  sockets = [socket.socket() for _ in range(n)]
  try:
    for s in sockets:
      s.bind(("localhost", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _trainer(mtf, tf, mesh_impl, args, inputs, targets):
  """A zero-argument function running one SGD step; returns the loss."""
  batch = mtf.Dimension("batch", args.batch)
  io = mtf.Dimension("io", args.io)
  hidden = mtf.Dimension("hidden", args.hidden)

  @tf.function
  def step(x, y):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    mx = mtf.import_tf_tensor(mesh, x, [batch, io])
    my = mtf.import_tf_tensor(mesh, y, [batch, io])
    w1 = mtf.get_variable(mesh, "w1", [io, hidden])
    w2 = mtf.get_variable(mesh, "w2", [hidden, io])
    h = mtf.relu(mtf.einsum([mx, w1], [batch, hidden]))
    out = mtf.einsum([h, w2], [batch, io])
    loss = mtf.reduce_mean(mtf.square(out - my))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = [mtf.assign_sub(v, g * args.lr)
               for v, g in zip(variables, grads)]
    lowering, _ = bench_util.lower_step(mtf, graph, mesh, mesh_impl, updates)
    return lowering.export_to_tf_tensor(loss)

  return lambda: step(inputs, targets)


def main(argv=None):
  args = parse_args(argv)
  hosts = [f"localhost:{p}" for p in _free_ports(2)]
  env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  server = subprocess.Popen(
      [sys.executable, "-m", "mesh_tensorflow.cluster",
       f"--worker_hosts={','.join(hosts)}", "--task_index=1", "--num_cpus=4",
       "--serve_seconds=1800"], cwd=_ROOT, env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
    # 8 CPUs on the chief: all 8 for one_process, the first 4 for cluster.
    cluster = mtf.cluster.connect(",".join(hosts), task_index=0, num_cpus=8)
    local = cluster.task_devices(cluster.tasks[0])[:8]
    impls = {
        "one_process": mtf.placement_mesh_impl.PlacementMeshImpl(
            MESH_SHAPE, LAYOUT, devices=local),
        "cluster": cluster.placement_mesh_impl(MESH_SHAPE, LAYOUT),
    }
    bench_util.log("cluster devices:", impls["cluster"].devices)
    rng = np.random.RandomState(0)
    inputs = rng.randn(args.batch, args.io).astype(np.float32)
    targets = np.tanh(inputs @ rng.randn(args.io, args.io).astype(
        np.float32) / np.sqrt(args.io)).astype(np.float32)
    fns = {name: _trainer(mtf, tf, impl, args, inputs, targets)
           for name, impl in impls.items()}
    with cluster.failures():
      timings = bench_util.interleaved_times(fns, args.steps, args.warmup)
  finally:
    server.kill()
    server.wait()
  one = bench_util.median(timings["one_process"]["times_ms"])
  two = bench_util.median(timings["cluster"]["times_ms"])
  drift = max(abs(float(a) - float(b)) / max(abs(float(b)), 1e-12) for a, b in
              zip(timings["cluster"]["results"],
                  timings["one_process"]["results"]))
  bench_util.emit({
      "benchmark": "cluster_step",
      "mesh": MESH_SHAPE, "layout": LAYOUT,
      "batch": args.batch, "io": args.io, "hidden": args.hidden,
      "steps": args.steps,
      "one_process_ms": bench_util.rounded(one, 2),
      "two_process_ms": bench_util.rounded(two, 2),
      "ratio": bench_util.rounded(bench_util.paired_ratio(
          timings["cluster"]["times_ms"], timings["one_process"]["times_ms"])),
      "max_rel_loss_drift": float(f"{drift:.2e}"),
  })


if __name__ == "__main__":
  main()
