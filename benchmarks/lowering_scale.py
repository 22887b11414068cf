"""Benchmark: lowering time and first-step time as the mesh grows.

Lowers the same dense stack on meshes of 8, 16, 32 and 64 logical CPUs with
both mesh implementations, PlacementMeshImpl (one set of TF ops per
processor) and SimdMeshImpl (one traced per-processor program, called once
per device), and reports how long building, lowering, the first step and
later steps take, and how many TF ops the step has.

Model: `layers` (24) blocks of  h = relu(x @ w1[io, hidden]);
x = h @ w2[hidden, io]  on x[batch, io], loss = mean squared error against
a target[batch, io]; one step = forward + backward (mtf.gradients) + SGD
update (mtf.optimize.SgdOptimizer), float32, layout `batch:b;hidden:m`:

  devices  mesh
  8        b:2;m:4
  16       b:4;m:4
  32       b:4;m:8
  64       b:8;m:8

Batch 64, io 256, hidden 1024 for every mesh. The step is a tf.function:
for PlacementMeshImpl it builds and lowers the mtf graph, for SimdMeshImpl
it calls `mesh_impl.run(program, x, y)`, whose program builds and lowers.
The mesh implementation is made outside; the first lowering creates its
variables.

The number of logical CPUs must be fixed before TensorFlow initialises its
devices, so every (implementation, mesh size) case runs in its own
subprocess (`--child`); the parent prints each case's JSON line, then a
summary line with the targets:
  * SimdMeshImpl lowering time (lower_s) at 64 processors <= 1.3x its time
    at 8 (first_lower_s's ratio is printed too);
  * at 64 processors, the faster implementation lowers in <= 3 s (judged on
    first_lower_s, variables included) and takes its first step in <= 10 s.

Per-case fields (seconds unless _ms):
  impl_s         constructing the mesh implementation (eager, outside).
  build_s        building the mtf graph: ops, gradients, optimizer (Python).
  first_lower_s  mtf.Lowering + exporting the loss, the first time: emits
                 the TF program and creates the variables.
  variables_s    the part of first_lower_s spent creating the variables
                 (one TF variable per mtf variable and processor, allocated
                 and initialised: work that grows with the processors).
  lower_s        first_lower_s - variables_s: emitting the program.
  trace_s        step.get_concrete_function: build_s + lower_s + TF's own
                 tracing (for SIMD also the dispatcher: one call per device).
  first_step_s   the first call after tracing (TF function instantiation,
                 graph optimisation, placement, executor creation, one run).
  step_ms_median later steps.
  relower_s      lowering again with the variables already there (a fresh
                 tf.function traced after the timed steps).
  tf_ops_program ops in the traced program (SIMD: one processor's program).
  tf_ops_total   tf_ops_program plus the dispatching step's own ops (SIMD).
  tf_ops_run     ops executed per step (SIMD: dispatcher + devices x
                 program).

  python benchmarks/lowering_scale.py [--impls simd,placement]
      [--sizes 8,16,32,64] [--steps 10] [--profile_dir DIR] [--no_grappler]

The full default run takes about 5 minutes on 2 cores.
"""

import argparse
import os
import resource
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

MESHES = {8: "b:2;m:4", 16: "b:4;m:4", 32: "b:4;m:8", 64: "b:8;m:8"}
LAYOUT = "batch:b;hidden:m"
IMPLS = ("simd", "placement")

TARGET_SIMD_LOWER_RATIO = 1.3  # lower_s(64) / lower_s(8), SimdMeshImpl
TARGET_LOWER_S = 3.0  # at 64 processors, faster implementation
TARGET_FIRST_STEP_S = 10.0  # at 64 processors, faster implementation


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--impls", default=",".join(IMPLS),
                 help="comma-separated subset of " + ",".join(IMPLS))
  p.add_argument("--sizes", default=",".join(str(n) for n in MESHES),
                 help="comma-separated numbers of logical CPUs, from " +
                 ",".join(str(n) for n in MESHES))
  p.add_argument("--steps", type=int, default=10, help="timed steps")
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--io", type=int, default=256)
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--layers", type=int, default=24)
  p.add_argument("--lr", type=float, default=0.001)
  p.add_argument("--timeout", type=float, default=1800.0,
                 help="seconds allowed per case (subprocess)")
  p.add_argument("--profile_dir", default=None,
                 help="cProfile the trace, the first step and the re-trace "
                 "of each case; save the stats here (<impl>_<devices>_"
                 "<phase>.prof) and log the top entries (slows them)")
  p.add_argument("--no_grappler", action="store_true",
                 help="disable TF's graph optimiser (Grappler), to see its "
                 "share of the first step")
  p.add_argument("--op_counts", action="store_true",
                 help="log the op types of the traced program to stderr")
  # Internal: run one case in this process.
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--impl", default="simd", help=argparse.SUPPRESS)
  p.add_argument("--devices", type=int, default=8, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def initial_values(args):
  """Deterministic weights and data, as NumPy arrays.

  He-uniform for the ReLU layer and LeCun-uniform for the linear one keep
  the activations' scale through 24 blocks, so the loss visibly moves
  (with Glorot the gradients vanish and the loss stays put).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(1234)

  def uniform(fan_in, fan_out, gain):
    limit = np.sqrt(3.0 * gain / fan_in)
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

  weights = [(uniform(args.io, args.hidden, 2.0),
              uniform(args.hidden, args.io, 1.0))
             for _ in range(args.layers)]
  x = rng.randn(args.batch, args.io).astype(np.float32)
  y = rng.randn(args.batch, args.io).astype(np.float32)
  return weights, x, y


def make_program(mtf, mesh_impl, weights, args, timings):
  """program(tx, ty): builds and lowers one training step; returns the loss.

  Adds the seconds spent building and lowering to `timings`.
  """
  batch = mtf.Dimension("batch", args.batch)
  io = mtf.Dimension("io", args.io)
  hidden = mtf.Dimension("hidden", args.hidden)

  def program(tx, ty):
    start = time.perf_counter()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tx, [batch, io])
    target = mtf.import_tf_tensor(mesh, ty, [batch, io])
    for i, (w1, w2) in enumerate(weights):
      mw1 = mtf.get_variable(mesh, f"w1_{i}", [io, hidden], initializer=w1)
      mw2 = mtf.get_variable(mesh, f"w2_{i}", [hidden, io], initializer=w2)
      h = mtf.relu(mtf.einsum([x, mw1], [batch, hidden]))
      x = mtf.einsum([h, mw2], [batch, io])
    loss = mtf.reduce_mean(mtf.square(x - target))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    mtf.optimize.SgdOptimizer(args.lr).apply_grads(grads, variables)
    built = time.perf_counter()
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    result = lowering.export_to_tf_tensor(loss)
    done = time.perf_counter()
    timings["build_s"] = timings.get("build_s", 0.0) + built - start
    timings["lower_s"] = timings.get("lower_s", 0.0) + done - built
    return result

  return program


def make_step(tf, impl_name, mesh_impl, program):
  if impl_name == "simd":
    return tf.function(lambda tx, ty: mesh_impl.run(program, tx, ty))
  return tf.function(program)


def op_counts(graph):
  counts = {}
  for op in graph.get_operations():
    counts[op.type] = counts.get(op.type, 0) + 1
  return counts


def maybe_profiled(fn, args, name):
  if not args.profile_dir:
    return fn()
  os.makedirs(args.profile_dir, exist_ok=True)
  path = os.path.join(args.profile_dir,
                      f"{args.impl}_{args.devices}_{name}.prof")
  bench_util.log(f"[{args.impl} {args.devices}] cProfile of {name} "
                 f"-> {path}")
  return bench_util.profiled_call(fn, path)


def run_child(args):
  """Runs one (implementation, mesh size) case; prints its JSON line."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  t_start = time.perf_counter()
  bench_util.configure_logical_cpus(args.devices)
  if args.no_grappler:
    tf.config.optimizer.set_experimental_options(
        {"disable_meta_optimizer": True})
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import simd_mesh_impl  # pylint: disable=g-import-not-at-top
  tag = f"[{args.impl} {args.devices}]"
  mesh_shape = MESHES.get(args.devices)
  if mesh_shape is None:
    raise SystemExit(f"no mesh for {args.devices} devices; choose from "
                     f"{sorted(MESHES)}")
  weights, x, y = initial_values(args)
  with tf.device("/CPU:0"):
    tx, ty = tf.constant(x), tf.constant(y)

  start = time.perf_counter()
  if args.impl == "simd":
    mesh_impl = simd_mesh_impl.SimdMeshImpl(mesh_shape, LAYOUT)
  elif args.impl == "placement":
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, LAYOUT)
  else:
    raise SystemExit(f"unknown impl {args.impl!r}; choose from {IMPLS}")
  impl_s = time.perf_counter() - start

  timings = {"variables_s": 0.0}
  make_laid_out_variable = mesh_impl.make_laid_out_variable

  def timed_make_laid_out_variable(*a, **kw):
    begin = time.perf_counter()
    try:
      return make_laid_out_variable(*a, **kw)
    finally:
      timings["variables_s"] += time.perf_counter() - begin

  mesh_impl.make_laid_out_variable = timed_make_laid_out_variable
  program = make_program(mtf, mesh_impl, weights, args, timings)
  step = make_step(tf, args.impl, mesh_impl, program)

  start = time.perf_counter()
  concrete = maybe_profiled(lambda: step.get_concrete_function(tx, ty), args,
                            "trace")
  trace_s = time.perf_counter() - start
  bench_util.log(f"{tag} traced in {trace_s:.2f}s (build "
                 f"{timings['build_s']:.2f}s, lower {timings['lower_s']:.2f}s)")

  start = time.perf_counter()
  first_loss = maybe_profiled(lambda: step(tx, ty).numpy(), args,
                              "first_step")
  first_step_s = time.perf_counter() - start
  bench_util.log(f"{tag} first step {first_step_s:.2f}s")

  times, cpu_times, losses = [], [], [float(first_loss)]
  for _ in range(args.steps):
    ms, cpu_ms, value = bench_util.timed_call_cpu(step, tx, ty)
    times.append(ms)
    cpu_times.append(cpu_ms)
    losses.append(float(value))

  # Op counts. For SIMD the step's graph only dispatches: one call of the
  # program's function per device.
  outer_ops = len(concrete.graph.get_operations())
  if args.impl == "simd":
    program_graph = mesh_impl._last_program[2].graph  # pylint: disable=protected-access
    program_ops = len(program_graph.get_operations())
    total_ops = outer_ops + program_ops
    run_ops = outer_ops + args.devices * program_ops
  else:
    program_graph = concrete.graph
    program_ops = total_ops = run_ops = outer_ops
  if args.op_counts:
    counts = op_counts(program_graph)
    bench_util.log(f"{tag} program ops {program_ops}: "
                   f"{sorted(counts.items(), key=lambda kv: -kv[1])}")
    if args.impl == "simd":
      counts = op_counts(concrete.graph)
      bench_util.log(f"{tag} dispatcher ops {outer_ops}: "
                     f"{sorted(counts.items(), key=lambda kv: -kv[1])}")
  num_variables = sum(
      len(entry.slices)
      for entry in mesh_impl.variable_store.eager_entries().values())

  # Lowering again, with the variables in place: a fresh program and step.
  first_timings = dict(timings)
  timings.clear()
  timings["variables_s"] = 0.0
  program2 = make_program(mtf, mesh_impl, weights, args, timings)
  step2 = make_step(tf, args.impl, mesh_impl, program2)
  start = time.perf_counter()
  maybe_profiled(lambda: step2.get_concrete_function(tx, ty), args, "retrace")
  retrace_s = time.perf_counter() - start

  r = bench_util.rounded
  record = {
      "benchmark": "lowering_scale",
      "impl": args.impl,
      "devices": args.devices,
      "mesh": mesh_shape,
      "layout": LAYOUT,
      "batch": args.batch, "io": args.io, "hidden": args.hidden,
      "layers": args.layers, "steps": args.steps,
      "impl_s": r(impl_s),
      "build_s": r(first_timings["build_s"]),
      "first_lower_s": r(first_timings["lower_s"]),
      "variables_s": r(first_timings["variables_s"]),
      "lower_s": r(first_timings["lower_s"] - first_timings["variables_s"]),
      "trace_s": r(trace_s),
      "first_step_s": r(first_step_s),
      "step_ms_median": r(bench_util.median(times), 2),
      "step_cpu_ms_median": r(bench_util.median(cpu_times), 1),
      "relower_s": r(timings["lower_s"]),
      "retrace_s": r(retrace_s),
      "tf_ops_program": program_ops,
      "tf_ops_total": total_ops,
      "tf_ops_run": run_ops,
      "tf_variables": num_variables,
      # 24 ReLU layers barely move the loss in a few steps: 9 digits.
      "loss_first": float(f"{losses[0]:.9g}"),
      "loss_last": float(f"{losses[-1]:.9g}"),
      "max_rss_mb": r(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss /
                      1024.0, 0),
      "case_wall_s": r(time.perf_counter() - t_start, 1),
      "profiled": bool(args.profile_dir),
  }
  if args.no_grappler:
    record["grappler"] = False
  bench_util.emit(record)


def summary(records, sizes):
  """The targets, from the case records (missing cases give None)."""
  by = {(rec["impl"], rec["devices"]): rec for rec in records
        if "lower_s" in rec}
  out = {"benchmark": "lowering_scale", "case": "summary"}
  simd_lo, simd_hi = by.get(("simd", min(sizes))), by.get(("simd", 64))
  lower_ratio = relower_ratio = first_lower_ratio = None
  if simd_lo and simd_hi and min(sizes) == 8:
    lower_ratio = bench_util.ratio(simd_hi["lower_s"], simd_lo["lower_s"])
    first_lower_ratio = bench_util.ratio(simd_hi["first_lower_s"],
                                         simd_lo["first_lower_s"])
    relower_ratio = bench_util.ratio(simd_hi["relower_s"],
                                     simd_lo["relower_s"])
  out["simd_lower_ratio_64_to_8"] = bench_util.rounded(lower_ratio)
  out["simd_first_lower_ratio_64_to_8"] = bench_util.rounded(
      first_lower_ratio)
  out["simd_relower_ratio_64_to_8"] = bench_util.rounded(relower_ratio)
  out["target_simd_lower_ratio"] = TARGET_SIMD_LOWER_RATIO
  out["meets_simd_lower_ratio"] = (
      None if lower_ratio is None else lower_ratio <= TARGET_SIMD_LOWER_RATIO)
  at64 = [by[(impl, 64)] for impl in IMPLS if (impl, 64) in by]
  for impl in IMPLS:
    rec = by.get((impl, 64))
    out[f"{impl}_64_first_lower_s"] = rec["first_lower_s"] if rec else None
    out[f"{impl}_64_first_step_s"] = rec["first_step_s"] if rec else None
    out[f"{impl}_64_meets_both"] = None if rec is None else (
        rec["first_lower_s"] <= TARGET_LOWER_S and
        rec["first_step_s"] <= TARGET_FIRST_STEP_S)
  if at64:
    # Faster: less time from the start of tracing to the first result.
    fastest = min(at64, key=lambda rec: rec["trace_s"] + rec["first_step_s"])
    out["faster_impl_64"] = fastest["impl"]
    out["faster_64_first_lower_s"] = fastest["first_lower_s"]
    out["faster_64_first_step_s"] = fastest["first_step_s"]
    out["meets_lower_s"] = fastest["first_lower_s"] <= TARGET_LOWER_S
    out["meets_first_step_s"] = (fastest["first_step_s"] <=
                                 TARGET_FIRST_STEP_S)
  else:
    out["faster_impl_64"] = None
    out["meets_lower_s"] = out["meets_first_step_s"] = None
  out["target_lower_s"] = TARGET_LOWER_S
  out["target_first_step_s"] = TARGET_FIRST_STEP_S
  return out


def child_command(args, impl, devices):
  cmd = [sys.executable, os.path.abspath(__file__), "--child",
         "--impl", impl, "--devices", str(devices),
         "--steps", str(args.steps), "--batch", str(args.batch),
         "--io", str(args.io), "--hidden", str(args.hidden),
         "--layers", str(args.layers), "--lr", str(args.lr)]
  if args.profile_dir:
    cmd += ["--profile_dir", args.profile_dir]
  if args.no_grappler:
    cmd.append("--no_grappler")
  if args.op_counts:
    cmd.append("--op_counts")
  return cmd


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.child:
    run_child(args)
    return
  impls = [i.strip() for i in args.impls.split(",") if i.strip()]
  sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
  bad = [i for i in impls if i not in IMPLS] + [
      s for s in sizes if s not in MESHES]
  if bad:
    raise SystemExit(f"unknown impls/sizes {bad}; choose from {IMPLS} and "
                     f"{sorted(MESHES)}")
  records = []
  for impl in impls:
    for devices in sizes:
      start = time.perf_counter()
      found, error = bench_util.run_json_child(
          child_command(args, impl, devices), timeout=args.timeout)
      bench_util.log(f"[{impl} {devices}] case took "
                     f"{time.perf_counter() - start:.1f}s")
      if error and not found:
        found = [{"benchmark": "lowering_scale", "impl": impl,
                  "devices": devices, "mesh": MESHES[devices],
                  "error": error}]
      for rec in found:
        bench_util.emit(rec)
        records.append(rec)
  bench_util.emit(summary(records, sizes))


if __name__ == "__main__":
  main()
