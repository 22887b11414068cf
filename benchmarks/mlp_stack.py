"""Benchmark: a stack of dense MLP blocks trained on 8 logical CPUs.

Model: `layers` blocks of  h = relu(x @ w1[io, hidden]);  x = h @ w2[hidden, io]
on x[batch, io], loss = mean squared error against a target[batch, io], one
step = forward + backward + optimizer update of every weight, float32.

Cases (mesh, layout), each run with every optimizer of --optimizers: SGD,
Adafactor (mtf.optimize's defaults) and AdamWeightDecay (lr 1e-4, weight
decay 0.01):
  one       all:1    (no rules)          1-processor overhead
  batch     all:8    batch:all           data parallel
  batch_shard_weight_update, batch_shard_parameters
            all:8    batch:all           the same after
                     mtf.shard_data_parallel (sharded updates; ZeRO-3)
  hidden    all:8    hidden:all          model parallel
  2d        b:2;m:4  batch:b;hidden:m    2-D parallel
  plain_split8       plain TF only: the batch as 8 slices of batch/8, each
                     differentiated apart on one device, gradients summed
                     (no communication): the floor of decomposing the batch

Each case runs, in one process and taking turns step by step, Mesh TensorFlow
(PlacementMeshImpl), plain TensorFlow doing the same math on one device
(/CPU:0; benchmarks/tf_optimizers.py restates mtf's optimizers), plain_split8
(in the batch cases) and tf.experimental.dtensor with the same layout, all
from the same initial weights and data. It prints one JSON line per case and
optimizer with the median step times, their ratios to plain TF (and to
plain_split8), the targets, the collectives' calls and bytes of one step,
and how far the mtf and DTensor losses, weights and slots drift from plain
TF's (to show the same math is measured; Adafactor amplifies round-off, see
docs/performance.md).

  python benchmarks/mlp_stack.py [--cases batch,hidden] [--optimizers sgd]
      [--steps 20] ...
"""

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_optimizers  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_DEVICES = 8
SPLITS = 8  # plain_split8: batch slices computed apart on one device.

# name: (mesh shape, layout rules, DTensor mesh dims, DTensor axis of batch,
#        DTensor axis of hidden, target ratio to plain TF, sharding)
# sharding: None, "update" (mtf.shard_data_parallel: sharded weight update,
# ZeRO-1/2) or "parameters" (shard_parameters=True, ZeRO-3).
CASES = {
    "one": ("all:1", "", [("all", 1)], None, None, 1.05, None),
    "batch": ("all:8", "batch:all", [("all", 8)], "all", None, 1.5, None),
    "batch_shard_weight_update": ("all:8", "batch:all", [("all", 8)], "all",
                                  None, 1.2, "update"),
    "batch_shard_parameters": ("all:8", "batch:all", [("all", 8)], "all",
                               None, 1.3, "parameters"),
    "hidden": ("all:8", "hidden:all", [("all", 8)], None, "all", 1.3, None),
    "2d": ("b:2;m:4", "batch:b;hidden:m", [("b", 2), ("m", 4)], "b", "m",
           1.35, None),
    # Plain TF only: the same step as 8 batch slices on one device.
    "plain_split8": (None, None, None, None, None, None, None),
}
# Cases that also time plain_split8 in the same run (mtf_vs_split8).
SPLIT8_CASES = ("batch", "batch_shard_weight_update", "batch_shard_parameters")
# Issue 26's targets against plain_split8.
SPLIT8_TARGETS = {"batch_shard_weight_update": 1.05}


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--cases", default=",".join(CASES),
                 help="comma-separated subset of " + ",".join(CASES))
  p.add_argument("--optimizers", default=",".join(tf_optimizers.OPTIMIZERS),
                 help="comma-separated subset of " +
                 ",".join(tf_optimizers.OPTIMIZERS))
  bench_util.add_timing_args(p, steps=30, warmup=3)
  p.add_argument("--batch", type=int, default=512)
  p.add_argument("--io", type=int, default=256)
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
  p.add_argument("--no_dtensor", action="store_true",
                 help="skip the DTensor comparison")
  p.add_argument("--no_split8", action="store_true",
                 help="do not time plain_split8 next to the batch cases")
  p.add_argument("--intra_op_threads", type=int, default=0,
                 help="tf.config.threading intra-op threads (0: TF default)")
  p.add_argument("--inter_op_threads", type=int, default=0,
                 help="tf.config.threading inter-op threads (0: TF default)")
  p.add_argument("--op_counts", action="store_true",
                 help="log the op types of each traced step to stderr")
  return p.parse_args(argv)


def initial_values(args):
  """Deterministic Glorot-uniform weights and data, as NumPy arrays."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(1234)

  def glorot(fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

  weights = []
  for _ in range(args.layers):
    weights.append((glorot(args.io, args.hidden), glorot(args.hidden, args.io)))
  x = rng.randn(args.batch, args.io).astype(np.float32)
  y = rng.randn(args.batch, args.io).astype(np.float32)
  return weights, x, y


def var_names(layers):
  """The mtf names of the weights, in `graph.trainable_variables` order."""
  return [f"{kind}_{i}" for i in range(layers) for kind in ("w1", "w2")]


def forward_loss(tf, variables, x, y, scale=1.0):
  h = x
  for i in range(0, len(variables), 2):
    h = tf.matmul(tf.nn.relu(tf.matmul(h, variables[i])), variables[i + 1])
  return tf.reduce_mean(tf.square(h - y)) * scale


def make_tf_step(tf, variables, optimizer, step_var, splits=1):
  """One optimizer step on flat `variables` [w1_0, w2_0, w1_1, ...].

  Plain TF on one device and DTensor share this code: DTensor dispatches on
  the layouts of its inputs and variables. With `splits` > 1 (plain_split8)
  the batch is cut into that many slices, each differentiated on its own,
  and their gradients summed: the decomposition data parallelism makes,
  without communication.
  """

  @tf.function
  def step(x, y):
    if splits == 1:
      with tf.GradientTape() as tape:
        loss = forward_loss(tf, variables, x, y)
      grads = tape.gradient(loss, variables)
    else:
      losses, per_slice = [], []
      for xs, ys in zip(tf.split(x, splits), tf.split(y, splits)):
        with tf.GradientTape() as tape:
          losses.append(forward_loss(tf, variables, xs, ys, 1.0 / splits))
        per_slice.append(tape.gradient(losses[-1], variables))
      loss = tf.add_n(losses)
      grads = [tf.add_n(list(gs)) for gs in zip(*per_slice)]
    optimizer.apply(grads, step_var.read_value())
    step_var.assign_add(1)
    return loss

  return step


def run_plain_tf(tf, weights, x, y, args, optimizer_name, splits=1):
  prefix = "tf" if splits == 1 else f"tf_split{splits}"
  with tf.device("/CPU:0"):
    variables = []
    for i, (w1, w2) in enumerate(weights):
      variables.append(tf.Variable(w1, name=f"{prefix}_w1_{i}"))
      variables.append(tf.Variable(w2, name=f"{prefix}_w2_{i}"))
    tx, ty = tf.constant(x), tf.constant(y)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
    optimizer = tf_optimizers.make_optimizer(
        tf, optimizer_name, variables, var_names(args.layers),
        sgd_lr=args.lr)
  step = make_tf_step(tf, variables, optimizer, step_var, splits)
  state = dict(zip(var_names(args.layers), variables))
  state.update(optimizer.slots)
  return (lambda: step(tx, ty)), step, (tx, ty), state


def sharding_available(mtf):
  return hasattr(mtf, "shard_data_parallel")


def run_mtf(tf, mtf, case, weights, x, y, args, optimizer_name,
            counters=None):
  mesh_shape, layout = CASES[case][:2]
  sharding = CASES[case][6]
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  batch = mtf.Dimension("batch", args.batch)
  io = mtf.Dimension("io", args.io)
  hidden = mtf.Dimension("hidden", args.hidden)
  shapes = {}
  for i in range(args.layers):
    shapes[f"w1_{i}"] = mtf.Shape([io, hidden])
    shapes[f"w2_{i}"] = mtf.Shape([hidden, io])
  stored_shapes = {}
  step_var = tf.Variable(0, dtype=tf.int64, trainable=False,
                         name="mtf_global_step")
  optimizer = tf_optimizers.mtf_optimizer(mtf, optimizer_name, args.lr)

  @tf.function
  def step(tx, ty):
    with mtf.global_step.global_step_scope(step_var):
      graph, mesh = bench_util.new_mesh(mtf, "mesh", mesh_shape, layout,
                                        sharding)
      h = mtf.import_tf_tensor(mesh, tx, [batch, io])
      target = mtf.import_tf_tensor(mesh, ty, [batch, io])
      for i, (w1, w2) in enumerate(weights):
        mw1 = mtf.get_variable(mesh, f"w1_{i}", shapes[f"w1_{i}"],
                               initializer=w1)
        mw2 = mtf.get_variable(mesh, f"w2_{i}", shapes[f"w2_{i}"],
                               initializer=w2)
        h = mtf.relu(mtf.einsum([h, mw1], [batch, hidden]))
        h = mtf.einsum([h, mw2], [batch, io])
      loss = mtf.reduce_mean(mtf.square(h - target))
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      updates = optimizer.apply_grads(grads, variables)
      for v in graph.all_variables:
        # As stored: a sharded parameter's shape names its shard dimension.
        stored_shapes[v.name] = v.shape
      lowering, ops = bench_util.lower_step(mtf, graph, mesh, mesh_impl,
                                            updates)
      if counters is not None:
        counters.clear()
        counters.update(lowering.counters)
      loss = bench_util.loss_after_updates(tf, lowering, loss, ops)
    step_var.assign_add(1)
    return loss

  with tf.device("/CPU:0"):
    tx, ty = tf.constant(x), tf.constant(y)

  def final_state():
    """Every variable and slot, whole, by mtf name (None if unreadable)."""
    out = {}
    for name, entry in mesh_impl.variable_store.eager_entries().items():
      if name not in stored_shapes or not hasattr(entry, "slices"):
        continue
      try:
        full = mesh_impl.combine_slices(
            [v.value() for v in entry.slices], stored_shapes[name],
            device="/CPU:0")
        out[name] = full.numpy()
      except Exception as e:  # pylint: disable=broad-except
        bench_util.log(f"[{case}] cannot read {name}: {e}")
    return out

  return (lambda: step(tx, ty)), step, (tx, ty), final_state


def run_dtensor(tf, case, weights, x, y, args, optimizer_name):
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  dims, batch_axis, hidden_axis = CASES[case][2:5]
  n = 1
  for _, size in dims:
    n *= size
  mesh = dtensor.create_mesh(dims, devices=[f"CPU:{i}" for i in range(n)])
  unsharded = dtensor.UNSHARDED
  batch_axis = batch_axis or unsharded
  hidden_axis = hidden_axis or unsharded

  def laid_out(value, layout):
    t = dtensor.copy_to_mesh(tf.constant(value),
                             dtensor.Layout.replicated(mesh, rank=len(
                                 value.shape)))
    return dtensor.relayout(t, layout)

  w1_specs = [unsharded, hidden_axis]
  w2_specs = [hidden_axis, unsharded]
  data_layout = dtensor.Layout([batch_axis, unsharded], mesh)
  variables, specs = [], {}
  for w1, w2 in weights:
    for value, var_specs in ((w1, w1_specs), (w2, w2_specs)):
      variables.append(dtensor.DVariable(
          laid_out(value, dtensor.Layout(var_specs, mesh))))
      specs[id(variables[-1])] = var_specs

  def zeros(var, keep_axes):
    import numpy as np  # pylint: disable=g-import-not-at-top
    value = np.zeros([int(var.shape[i]) for i in keep_axes], np.float32)
    layout = dtensor.Layout([specs[id(var)][i] for i in keep_axes], mesh)
    return dtensor.DVariable(laid_out(value, layout), trainable=False)

  step_var = dtensor.DVariable(dtensor.copy_to_mesh(
      tf.constant(0, tf.int64), dtensor.Layout.replicated(mesh, rank=0)))
  optimizer = tf_optimizers.make_optimizer(
      tf, optimizer_name, variables, var_names(args.layers), zeros,
      sgd_lr=args.lr)
  dx, dy = laid_out(x, data_layout), laid_out(y, data_layout)
  step = make_tf_step(tf, variables, optimizer, step_var)
  return lambda: step(dx, dy)


def op_counts(step, inputs):
  graph = step.get_concrete_function(*inputs).graph
  counts = {}
  for op in graph.get_operations():
    counts[op.type] = counts.get(op.type, 0) + 1
  return sum(counts.values()), counts


def max_diff(values, reference):
  """Largest |values - reference| over their common names (None if none)."""
  common = [n for n in reference if n in values]
  if not common:
    return None
  return max(float(abs(values[n] - reference[n].numpy()).max())
             for n in common)


def comm_record(counters):
  """Collective calls and bytes of one step by kind, from the counters."""
  record = {}
  for key, value in counters.items():
    parts = key.split("/")
    if parts[0] == "comm" and parts[-1] in ("calls", "bytes"):
      field = f"{parts[1]}_{parts[-1]}"
      record[field] = record.get(field, 0) + value
  return dict(sorted(record.items()))


def unavailable(case, optimizer_name, args, reason):
  bench_util.log(f"[{case}/{optimizer_name}] unavailable: {reason}")
  mesh_shape, layout = CASES[case][:2]
  bench_util.emit({
      "benchmark": "mlp_stack", "case": case, "optimizer": optimizer_name,
      "mesh": mesh_shape, "layout": layout, "batch": args.batch,
      "io": args.io, "hidden": args.hidden, "layers": args.layers,
      "unavailable": reason})


def run_case(tf, mtf, case, args, optimizer_name):
  if case == "plain_split8":
    return run_split8_case(tf, args, optimizer_name)
  mesh_shape, layout, _, _, _, target, sharding = CASES[case]
  if sharding and not sharding_available(mtf):
    return unavailable(case, optimizer_name, args,
                       "mtf.shard_data_parallel is not in this checkout")
  weights, x, y = initial_values(args)
  fns = {}
  t0 = time.perf_counter()
  fns["tf"], tf_step, tf_inputs, tf_state = run_plain_tf(
      tf, weights, x, y, args, optimizer_name)
  counters = {}
  fns["mtf"], mtf_step, mtf_inputs, mtf_state = run_mtf(
      tf, mtf, case, weights, x, y, args, optimizer_name, counters)
  with_split8 = case in SPLIT8_CASES and not args.no_split8
  if with_split8:
    fns["split8"], _, _, split8_state = run_plain_tf(
        tf, weights, x, y, args, optimizer_name, SPLITS)
  dtensor_error = None
  if not args.no_dtensor and not sharding:
    try:
      fns["dtensor"] = run_dtensor(tf, case, weights, x, y, args,
                                   optimizer_name)
      fns["dtensor"]()  # trace + first step now, so failures land here
    except Exception as e:  # pylint: disable=broad-except
      dtensor_error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
      bench_util.log(f"[{case}] DTensor failed: {dtensor_error}")
      fns.pop("dtensor", None)
  elif sharding:
    dtensor_error = "skipped (no sharded-update equivalent)"
  else:
    dtensor_error = "skipped (--no_dtensor)"

  # Compile times: the first call of each traces and lowers. (DTensor's first
  # step ran above, so every implementation has now taken one step.)
  compile_ms = {}
  for name in fns:
    if name != "dtensor":
      compile_ms[name], _ = bench_util.timed_call(fns[name])
  bench_util.log(f"[{case}/{optimizer_name}] set-up and first steps "
                 f"{time.perf_counter() - t0:.1f}s; timing {args.steps} steps")

  results = bench_util.interleaved_times(fns, args.steps, args.warmup)
  med = {name: bench_util.median(r["times_ms"]) for name, r in results.items()}
  cpu = {name: bench_util.median(r["cpu_ms"]) for name, r in results.items()}

  def loss_diff(name):
    if name not in results:
      return None
    return float("%.3g" % max(
        abs(float(a) - float(b)) for a, b in zip(
            results[name]["results"], results["tf"]["results"])))

  tf_losses = results["tf"]["results"]
  final_mtf = mtf_state()
  weight_names = var_names(args.layers)
  max_weight_diff = max_diff(final_mtf, {n: tf_state[n] for n in weight_names})
  max_slot_diff = max_diff(final_mtf, {n: v for n, v in tf_state.items()
                                       if n not in weight_names})

  mtf_ops, mtf_counts = op_counts(mtf_step, mtf_inputs)
  tf_ops, tf_counts = op_counts(tf_step, tf_inputs)
  if args.op_counts:
    bench_util.log(f"[{case}] mtf ops {mtf_ops}: "
                   f"{sorted(mtf_counts.items(), key=lambda kv: -kv[1])}")
    bench_util.log(f"[{case}] tf ops {tf_ops}: "
                   f"{sorted(tf_counts.items(), key=lambda kv: -kv[1])}")

  times = {name: r["times_ms"] for name, r in results.items()}
  paired = bench_util.paired_ratio(times["mtf"], times["tf"])
  paired_dt = (bench_util.paired_ratio(times["mtf"], times["dtensor"])
               if "dtensor" in times else None)
  ratio = bench_util.ratio(med["mtf"], med["tf"])
  dt_ratio = bench_util.ratio(med.get("dtensor"), med["tf"])
  mtf_vs_dt = bench_util.ratio(med["mtf"], med.get("dtensor"))
  r = bench_util.rounded
  record = {
      "benchmark": "mlp_stack",
      "case": case,
      "optimizer": optimizer_name,
      "mesh": mesh_shape,
      "layout": layout,
      "sharding": sharding,
      "batch": args.batch, "io": args.io, "hidden": args.hidden,
      "layers": args.layers, "steps": args.steps,
      "mtf_step_ms_median": r(med["mtf"], 2),
      "tf_step_ms_median": r(med["tf"], 2),
      "dtensor_step_ms_median": r(med.get("dtensor"), 2),
      "ratio_to_tf": r(ratio),
      "dtensor_ratio_to_tf": r(dt_ratio),
      "mtf_vs_dtensor": r(mtf_vs_dt),
      "ratio_to_tf_paired": r(paired),
      "mtf_vs_dtensor_paired": r(paired_dt),
      "target_ratio_to_tf": target,
      "meets_target": ratio is not None and ratio <= target,
      "meets_dtensor": None if mtf_vs_dt is None else mtf_vs_dt <= 1.0,
      "mtf_cpu_ms_median": r(cpu["mtf"], 1),
      "tf_cpu_ms_median": r(cpu["tf"], 1),
      "dtensor_cpu_ms_median": r(cpu.get("dtensor"), 1),
      "max_loss_diff": loss_diff("mtf"),
      "dtensor_max_loss_diff": loss_diff("dtensor"),
      "max_weight_diff": (None if max_weight_diff is None
                          else float(f"{max_weight_diff:.3g}")),
      "max_slot_diff": (None if max_slot_diff is None
                        else float(f"{max_slot_diff:.3g}")),
      "loss_first": r(tf_losses[0], 6), "loss_last": r(tf_losses[-1], 6),
      "mtf_compile_ms": r(compile_ms["mtf"], 1),
      "tf_compile_ms": r(compile_ms["tf"], 1),
      "mtf_graph_ops": mtf_ops, "tf_graph_ops": tf_ops,
  }
  if with_split8:
    split8_ratio = bench_util.ratio(med["mtf"], med["split8"])
    record.update({
        "split8_step_ms_median": r(med["split8"], 2),
        "split8_cpu_ms_median": r(cpu["split8"], 1),
        "split8_ratio_to_tf": r(bench_util.ratio(med["split8"], med["tf"])),
        "mtf_vs_split8": r(split8_ratio),
        "mtf_vs_split8_paired": r(bench_util.paired_ratio(
            times["mtf"], times["split8"])),
        "split8_max_loss_diff": loss_diff("split8"),
        # mtf sums the slices' gradients as plain_split8 does: closer.
        "mtf_vs_split8_max_state_diff": float("%.3g" % max_diff(
            final_mtf, split8_state)),
    })
    if case in SPLIT8_TARGETS:
      record["target_vs_split8"] = SPLIT8_TARGETS[case]
      record["meets_split8_target"] = split8_ratio <= SPLIT8_TARGETS[case]
  record.update(comm_record(counters))
  if dtensor_error:
    record["dtensor_error"] = dtensor_error
  bench_util.emit(record)
  return record


def run_split8_case(tf, args, optimizer_name):
  """plain_split8 against plain TF: the cost of decomposing the batch."""
  weights, x, y = initial_values(args)
  fns = {}
  fns["tf"], _, _, tf_state = run_plain_tf(tf, weights, x, y, args,
                                           optimizer_name)
  fns["split8"], _, _, split_state = run_plain_tf(
      tf, weights, x, y, args, optimizer_name, SPLITS)
  for fn in fns.values():
    bench_util.timed_call(fn)
  results = bench_util.interleaved_times(fns, args.steps, args.warmup)
  med = {name: bench_util.median(r["times_ms"]) for name, r in results.items()}
  cpu = {name: bench_util.median(r["cpu_ms"]) for name, r in results.items()}
  times = {name: r["times_ms"] for name, r in results.items()}
  diff = max(float(abs(split_state[n].numpy() - v.numpy()).max())
             for n, v in tf_state.items())
  r = bench_util.rounded
  bench_util.emit({
      "benchmark": "mlp_stack", "case": "plain_split8",
      "optimizer": optimizer_name, "splits": SPLITS,
      "batch": args.batch, "io": args.io, "hidden": args.hidden,
      "layers": args.layers, "steps": args.steps,
      "split8_step_ms_median": r(med["split8"], 2),
      "tf_step_ms_median": r(med["tf"], 2),
      "ratio_to_tf": r(bench_util.ratio(med["split8"], med["tf"])),
      "ratio_to_tf_paired": r(bench_util.paired_ratio(times["split8"],
                                                      times["tf"])),
      "split8_cpu_ms_median": r(cpu["split8"], 1),
      "tf_cpu_ms_median": r(cpu["tf"], 1),
      "max_loss_diff": float("%.3g" % max(
          abs(float(a) - float(b)) for a, b in zip(
              results["split8"]["results"], results["tf"]["results"]))),
      "max_state_diff": float(f"{diff:.3g}"),
  })


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  cases = [c.strip() for c in args.cases.split(",") if c.strip()]
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise SystemExit(f"unknown cases {unknown}; choose from {list(CASES)}")
  optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
  unknown = [o for o in optimizers if o not in tf_optimizers.OPTIMIZERS]
  if unknown:
    raise SystemExit(f"unknown optimizers {unknown}; choose from "
                     f"{list(tf_optimizers.OPTIMIZERS)}")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Threading must be set before the runtime starts (before listing devices).
  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  if args.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
  bench_util.configure_logical_cpus(NUM_DEVICES)
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  for case in cases:
    for optimizer_name in optimizers:
      run_case(tf, mtf, case, args, optimizer_name)


if __name__ == "__main__":
  main()
