"""Benchmark: what autostack saves in TF variables, ops and build time.

A stack of `layers` blocks (dense with bias, layer norm) trained with Adam,
on 8 logical CPUs, lowered with `Lowering(autostack=False)` and
`autostack=True`. For each: number of TF variables, ops in the traced
tf.function graph, time to trace (build + lower + create variables), first
call, and the median step time (the two variants interleaved step by step).
Prints one JSON line.

  python benchmarks/autostack.py [--layers 24 --mesh all:8 --layout ...]
"""

import argparse
import json
import statistics
import time

import bench_util


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--layers", type=int, default=24)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--width", type=int, default=128)
  p.add_argument("--mesh", default="all:8")
  p.add_argument("--layout", default="batch:all")
  p.add_argument("--steps", type=int, default=20)
  return p.parse_args(argv)


def make_step(mtf, tf, args, autostack, data):
  """A tf.function training step, and the impl owning its variables."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(args.mesh, args.layout)
  batch = mtf.Dimension("batch", args.batch)
  io = mtf.Dimension("io", args.width)

  @tf.function
  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, data, [batch, io])
    h = x
    for i in range(args.layers):
      with tf.compat.v1.variable_scope(f"block{i}"):
        y = mtf.layers.dense(h, io, reduced_dims=[io], activation=mtf.relu,
                             name="dense")
        h = mtf.layers.layer_norm(h + y, io, name="norm")
    loss = mtf.reduce_mean(mtf.square(h - x))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    mtf.optimize.AdamWeightDecayOptimizer(1e-3).apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl}, autostack=autostack)
    return lowering.export_to_tf_tensor(loss)

  return impl, step


def count_tf_variables(impl):
  seen = set()
  for entry in impl.variable_store.eager_entries().values():
    holder = getattr(entry, "stack", entry)
    for v in getattr(holder, "slices", [entry]):
      seen.add(id(v))
  return len(seen)


def main():
  args = parse_args()
  bench_util.configure_logical_cpus(8)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  data = tf.constant(np.random.RandomState(0).randn(
      args.batch, args.width).astype(np.float32))
  result = {"benchmark": "autostack", "mesh": args.mesh,
            "layout": args.layout, "layers": args.layers}
  steps = {}
  for name, autostack in (("plain", False), ("autostack", True)):
    impl, step = make_step(mtf, tf, args, autostack, data)
    start = time.perf_counter()
    concrete = step.get_concrete_function()
    trace_s = time.perf_counter() - start
    first_ms, loss = bench_util.timed_call(step)
    result[name] = {
        "tf_variables": count_tf_variables(impl),
        "graph_ops": len(concrete.graph.get_operations()),
        "trace_s": round(trace_s, 3),
        "first_call_ms": round(first_ms, 1),
        "first_loss": float(loss),
    }
    steps[name] = step
    bench_util.log(name, result[name])
  times = bench_util.interleaved_times(steps, args.steps)
  for name in steps:
    result[name]["step_ms_median"] = round(
        statistics.median(times[name]["times_ms"]), 2)
  plain, stacked = result["plain"], result["autostack"]
  result["ratios"] = {
      "tf_variables": round(stacked["tf_variables"] / plain["tf_variables"],
                            3),
      "graph_ops": round(stacked["graph_ops"] / plain["graph_ops"], 3),
      "trace": round(stacked["trace_s"] / plain["trace_s"], 3),
      "step": round(stacked["step_ms_median"] / plain["step_ms_median"], 3),
  }
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
