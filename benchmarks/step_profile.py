"""Profile: where a data-parallel MLP step spends its time, op by op.

Runs the MLP stack of mlp_stack.py (same model, data and optimizers) under
TensorFlow's profiler, one implementation at a time, and sums the kernel
times the profiler records per op type and per category:

  matmul     MatMul / BatchMatMul / Einsum (forward and backward)
  reduce     AddN (summing the batch slices' gradients: the all-reduce of
             mtf's batch:all, the gradient sum of plain_split8)
  variable   reads and assignments of variables (AssignSub, Assign, Read)
  other      everything else: element-wise update math, relu and its
             gradient, the loss, slicing, copies

and `executor`: the time TF's executors spend around the kernels
(ExecutorState::Process minus the kernels it ran), i.e. per-op overhead.
Implementations: `tf` (plain TF, one device), `split8` (plain_split8),
`split8_devices` (the 8 slices each on its own logical CPU, gradients summed
on CPU:0, one update: plain TF's emulation of batch:all without replicated
weights), `split8_copies` (the same, the update computed once and its
results written to 8 copies of every weight and slot, one per device: what
batch:all does on PlacementMeshImpl, whose shared replicas compute the
update once but keep a variable per processor), `split8_replicated` (each
of the 8 devices computing the whole update on its own copy: naive data
parallelism) and
`mtf_<case>` (this project; `--cases`, default batch). One JSON line per
implementation and optimizer: per-step ms of each category, kernel count per
step, and the wall and process CPU time of the profiled steps (profiling
adds overhead: compare categories, not wall times, with mlp_stack.py).
By default TF runs one kernel at a time on one thread, so kernel times add
up to the CPU work of each kind (with TF's default threads, kernels that
run side by side on 2 cores each count their whole, stretched, duration).

  python benchmarks/step_profile.py [--optimizers sgd,adafactor] [--steps 5]
      [--timing_steps 20 --intra_op_threads 0 --inter_op_threads 0]
"""

import argparse
import collections
import glob
import os
import shutil
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position
import mlp_stack  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_optimizers  # pylint: disable=g-import-not-at-top,wrong-import-position

CATEGORIES = {
    "matmul": ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
               "Einsum", "_MklMatMul", "_FusedMatMul"),
    "reduce": ("AddN",),
    "variable": ("AssignSubVariableOp", "AssignVariableOp",
                 "AssignAddVariableOp", "ReadVariableOp", "ResourceGather"),
}
IMPLEMENTATIONS = ("tf", "split8", "split8_devices", "split8_copies",
                   "split8_replicated")


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--optimizers", default="sgd,adafactor,adam")
  p.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
  p.add_argument("--cases", default="batch",
                 help="mlp_stack.py mtf cases to profile (comma-separated)")
  p.add_argument("--steps", type=int, default=5, help="profiled steps")
  p.add_argument("--intra_op_threads", type=int, default=1,
                 help="TF intra-op threads (default 1: kernels run one "
                 "at a time, so their times add up to CPU work; 0: TF's "
                 "default)")
  p.add_argument("--inter_op_threads", type=int, default=1,
                 help="TF inter-op threads (default 1; 0: TF's default)")
  p.add_argument("--timing_steps", type=int, default=0,
                 help="also time this many steps of every implementation, "
                 "taking turns, without the profiler (one JSON line each: "
                 "median wall and CPU ms, ratios to tf)")
  p.add_argument("--no_profile", action="store_true")
  p.add_argument("--matmuls", action="store_true",
                 help="only time one layer's three matmuls (forward, input "
                 "and weight gradient) whole and as 8 slices")
  p.add_argument("--top", type=int, default=12,
                 help="op types listed per implementation")
  return p.parse_args(argv)


def category(op_type):
  for name, types in CATEGORIES.items():
    if op_type in types:
      return name
  return "other"


def xplane_module():
  try:
    from tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  return xplane_pb2


def kernel_times(logdir):
  """(ms by op type, kernels by op type, executor ms), summed over the
  trace."""
  xplane_pb2 = xplane_module()
  by_type = collections.Counter()
  count = collections.Counter()
  process_ps = 0
  for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                        recursive=True):
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
      space.ParseFromString(f.read())
    for plane in space.planes:
      for line in plane.lines:
        if not line.name.startswith("tf_"):  # TF's executor threads.
          continue
        for event in line.events:
          name = plane.event_metadata[event.metadata_id].name
          if name == "ExecutorState::Process":
            process_ps += event.duration_ps
          elif ":" in name and not name.startswith(
              ("ThreadpoolListener", "Executor")):
            by_type[name.rsplit(":", 1)[1]] += event.duration_ps / 1e9
            count[name.rsplit(":", 1)[1]] += 1
  return by_type, count, process_ps / 1e9


def profile(tf, fn, steps):
  """Profiles `steps` calls of fn (after one unprofiled call)."""
  fn()
  logdir = tempfile.mkdtemp(prefix="step_profile_")
  try:
    start, start_cpu = time.perf_counter(), time.process_time()
    tf.profiler.experimental.start(logdir)
    for _ in range(steps):
      fn()
    tf.profiler.experimental.stop()
    wall = (time.perf_counter() - start) * 1000.0 / steps
    cpu = (time.process_time() - start_cpu) * 1000.0 / steps
    by_type, count, process_ms = kernel_times(logdir)
  finally:
    shutil.rmtree(logdir, ignore_errors=True)
  return by_type, count, process_ms, wall, cpu


def split8_on_devices(tf, weights, x, y, args, optimizer_name, replicated,
                      copies_only=False):
  """plain_split8 with slice i on /CPU:i; the sum and the update on CPU:0,
  or (replicated) the summed gradient updating 8 copies, one per device;
  with copies_only, copy 0 is updated and the others assigned its values."""
  devices = [f"/CPU:{i}" for i in range(mlp_stack.SPLITS)]
  names = mlp_stack.var_names(args.layers)
  copies = []
  for device in devices[:mlp_stack.SPLITS if replicated else 1]:
    with tf.device(device):
      variables = []
      for w1, w2 in weights:
        variables += [tf.Variable(w1), tf.Variable(w2)]
      step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
      optimizer = tf_optimizers.make_optimizer(
          tf, optimizer_name, variables, names, sgd_lr=args.lr)
    copies.append((device, variables, step_var, optimizer))
  with tf.device("/CPU:0"):
    tx, ty = tf.constant(x), tf.constant(y)

  @tf.function
  def step(x, y):
    xs, ys = tf.split(x, mlp_stack.SPLITS), tf.split(y, mlp_stack.SPLITS)
    losses, per_slice = [], []
    for i, device in enumerate(devices):
      # Every slice reads the first copy (as batch:all's shared replicas).
      variables = copies[0][1]
      with tf.device(device):
        with tf.GradientTape() as tape:
          losses.append(mlp_stack.forward_loss(
              tf, variables, xs[i], ys[i], 1.0 / mlp_stack.SPLITS))
        per_slice.append(tape.gradient(losses[-1], variables))
    with tf.device("/CPU:0"):
      loss = tf.add_n(losses)
      grads = [tf.add_n(list(gs)) for gs in zip(*per_slice)]
    for device, _, step_var, optimizer in copies[:1 if copies_only else None]:
      with tf.device(device):
        optimizer.apply(grads, step_var.read_value())
        step_var.assign_add(1)
    if copies_only:
      first = copies[0][1] + [copies[0][3].slots[k]
                              for k in sorted(copies[0][3].slots)]
      values = [v.read_value() for v in first]
      for device, variables, _, optimizer in copies[1:]:
        targets = variables + [optimizer.slots[k]
                               for k in sorted(optimizer.slots)]
        with tf.device(device):
          for target, value in zip(targets, values):
            target.assign(value)
    return loss

  return lambda: step(tx, ty)


def emit(name, optimizer_name, result, top, steps):
  by_type, count, process_ms, wall, cpu = result
  per_step = {k: v / steps for k, v in by_type.items()}
  categories = collections.Counter()
  for op_type, ms in per_step.items():
    categories[category(op_type)] += ms
  kernels = sum(per_step.values())
  r = bench_util.rounded
  bench_util.emit({
      "benchmark": "step_profile", "implementation": name,
      "optimizer": optimizer_name,
      "wall_ms_per_step": r(wall, 1), "cpu_ms_per_step": r(cpu, 1),
      "kernel_ms_per_step": r(kernels, 1),
      "executor_overhead_ms_per_step": r(process_ms / steps - kernels, 1),
      "kernels_per_step": r(sum(count.values()) / steps, 1),
      **{f"{c}_ms": r(categories.get(c, 0.0), 1)
         for c in ("matmul", "reduce", "variable", "other")},
      "top_op_types_ms": {k: r(v, 2) for k, v in sorted(
          per_step.items(), key=lambda kv: -kv[1])[:top]},
      "top_op_types_kernels_per_step": {
          k: r(count[k] / steps, 1) for k, _ in sorted(
              per_step.items(), key=lambda kv: -kv[1])[:top]},
  })


def time_matmuls(tf, args, steps=40):
  """CPU ms of w1's forward, input- and weight-gradient matmuls, for the
  whole batch and as 8 slices (the weight gradient's partial results
  summed): the cost of decomposing the batch, kernel by kernel."""
  stack = mlp_stack.parse_args([])
  x = tf.random.normal([stack.batch, stack.io])
  w = tf.random.normal([stack.io, stack.hidden])
  dh = tf.random.normal([stack.batch, stack.hidden])
  xs, dhs = tf.split(x, mlp_stack.SPLITS), tf.split(dh, mlp_stack.SPLITS)
  fns = {
      "forward_1": lambda: [tf.matmul(x, w)],
      "forward_8": lambda: [tf.matmul(a, w) for a in xs],
      "input_grad_1": lambda: [tf.matmul(dh, w, transpose_b=True)],
      "input_grad_8": lambda: [tf.matmul(a, w, transpose_b=True)
                               for a in dhs],
      "weight_grad_1": lambda: [tf.matmul(x, dh, transpose_a=True)],
      "weight_grad_8": lambda: [tf.add_n([
          tf.matmul(a, b, transpose_a=True) for a, b in zip(xs, dhs)])],
  }
  fns = {k: tf.function(f) for k, f in fns.items()}
  timed = bench_util.interleaved_times(
      {k: (lambda f=f: [t.numpy() for t in f()]) for k, f in fns.items()},
      steps)
  cpu = {k: bench_util.median(r["cpu_ms"]) for k, r in timed.items()}
  r = bench_util.rounded
  record = {"benchmark": "step_profile", "matmuls": "w1",
            "batch": stack.batch, "io": stack.io, "hidden": stack.hidden,
            "splits": mlp_stack.SPLITS, "steps": steps,
            **{f"{k}_cpu_ms": r(v, 2) for k, v in cpu.items()}}
  for kind in ("forward", "input_grad", "weight_grad"):
    record[f"{kind}_8_vs_1"] = r(cpu[f"{kind}_8"] / cpu[f"{kind}_1"])
  total = lambda n: sum(cpu[f"{k}_{n}"] for k in (
      "forward", "input_grad", "weight_grad"))
  record["all_8_vs_1"] = r(total(8) / total(1))
  bench_util.emit(record)


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  if args.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
  bench_util.configure_logical_cpus(mlp_stack.NUM_DEVICES)
  if args.matmuls:
    return time_matmuls(tf, args)
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  stack_args = mlp_stack.parse_args([])
  weights, x, y = mlp_stack.initial_values(stack_args)
  implementations = args.implementations.split(",")
  cases = [c for c in args.cases.split(",") if c]
  for optimizer_name in args.optimizers.split(","):
    fns = {}
    if "tf" in implementations:
      fns["tf"] = mlp_stack.run_plain_tf(tf, weights, x, y, stack_args,
                                         optimizer_name)[0]
    if "split8" in implementations:
      fns["split8"] = mlp_stack.run_plain_tf(
          tf, weights, x, y, stack_args, optimizer_name, mlp_stack.SPLITS)[0]
    for name, replicated, copies_only in (
        ("split8_devices", False, False), ("split8_copies", True, True),
        ("split8_replicated", True, False)):
      if name in implementations:
        fns[name] = split8_on_devices(tf, weights, x, y, stack_args,
                                      optimizer_name, replicated,
                                      copies_only)
    for case in cases:
      if mlp_stack.CASES[case][6] and not mlp_stack.sharding_available(mtf):
        bench_util.log(f"[{case}] needs mtf.shard_data_parallel; skipped")
        continue
      fns[f"mtf_{case}"] = mlp_stack.run_mtf(
          tf, mtf, case, weights, x, y, stack_args, optimizer_name)[0]
    if args.timing_steps:
      emit_timing(fns, optimizer_name, args.timing_steps)
    if not args.no_profile:
      for name, fn in fns.items():
        emit(name, optimizer_name, profile(tf, fn, args.steps), args.top,
             args.steps)


def emit_timing(fns, optimizer_name, steps):
  """Median wall and CPU ms of each implementation, taking turns."""
  for fn in fns.values():
    fn()
  results = bench_util.interleaved_times(fns, steps, warmup=2)
  wall = {n: bench_util.median(r["times_ms"]) for n, r in results.items()}
  cpu = {n: bench_util.median(r["cpu_ms"]) for n, r in results.items()}
  r = bench_util.rounded
  for name, result in results.items():
    record = {"benchmark": "step_profile", "timing": name,
              "optimizer": optimizer_name, "steps": steps,
              "wall_ms_median": r(wall[name], 1),
              "cpu_ms_median": r(cpu[name], 1)}
    if "tf" in results:
      record["wall_ratio_to_tf_paired"] = r(bench_util.paired_ratio(
          result["times_ms"], results["tf"]["times_ms"]))
      record["cpu_ratio_to_tf_paired"] = r(bench_util.paired_ratio(
          result["cpu_ms"], results["tf"]["cpu_ms"]))
    bench_util.emit(record)


if __name__ == "__main__":
  main()
