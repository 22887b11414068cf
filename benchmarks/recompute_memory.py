"""Benchmark: peak memory of a training step with and without recompute_grad.

A stack of `layers` blocks y = tanh(1.5 * tanh(x @ w)) on x[batch, width] is
trained for one SGD step, once differentiating normally (each block keeps
its input and an activation for the backward pass) and once with each block
wrapped in `mtf.recompute_grad` (only block inputs are kept; a block's
activations are recomputed when its gradient is taken). "unordered" is
recompute_grad(control_dependencies=False), to show what the orderings buy.

Figures:
- `counted_mb` (deterministic): per mode (the graph of the tf.function,
  of tf.compat.v1 graph mode, and the SIMD program of one processor) and
  variant, the bytes of the tensors alive at the peak of the lowered step's
  TensorFlow graph, run in two orders that respect every data and control
  dependency: each op as soon as its inputs exist ("asap", as a parallel
  executor may) and as late as its consumers allow ("alap", as TF's
  executor on one thread left variable gradients to the end). Ops a run
  would prune are left out; outputs that alias their input (Identity,
  Reshape, variable reads), constants and the step's arguments count
  nothing. `counted_ratio`: recompute over plain, the worse order of each.
- `allocator_ratio`: the same ratio from TF's own count, the peak of the
  CPU allocator's bytes in use while the step runs once (BFC allocator, one
  inter-op thread; a fresh process per case). Close to counted, not
  bit-exact. `tf_allocator_ratio`: plain TensorFlow (GradientTape, with and
  without tf.recompute_grad) measured the same way.
- `rss_ratio`, `tf_rss_ratio`: the growth of peak resident memory during
  the step, TF's defaults, a fresh process per case. It does not show the
  saving, not even for tf.recompute_grad: freed buffers stay with the
  process's allocator, which several executor threads share.
- `measured_mb`: the figures behind the measured ratios.

Prints one JSON line. `--counted_only` prints only the counted figures
(tests/test_recompute_memory.py uses it).

  python benchmarks/recompute_memory.py [--layers 8 --batch 1024 --width 256]
      [--mesh all:2 --layout batch:all]
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

VARIANTS = ("plain", "recompute", "unordered")
COUNTED_MODES = ("function", "graph", "simd")
# Ops whose output is (or may be) the buffer of their first input.
_ALIASING = frozenset([
    "Identity", "IdentityN", "Reshape", "ExpandDims", "Squeeze",
    "StopGradient", "PreventGradient", "Snapshot", "EnsureShape",
    "ReadVariableOp"])
# Ops whose outputs are slices of their first input along its first
# dimension, which TF hands out as views of the input's buffer when each
# slice's bytes are a multiple of Eigen's alignment (UnpackOp, SplitOp).
_SLICING_AXIS_0 = frozenset(["Unpack", "Split", "SplitV"])
_EIGEN_ALIGN_BYTES = 64
# Ops whose outputs are not the step's to allocate (arguments, constants,
# handles).
_NOT_ALLOCATED = frozenset([
    "Placeholder", "_Arg", "Const", "VarHandleOp", "HostConst"])


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--layers", type=int, default=8)
  p.add_argument("--batch", type=int, default=1024)
  p.add_argument("--width", type=int, default=256)
  p.add_argument("--mesh", default="all:1",
                 help="mesh shape for the counted figures, e.g. all:2")
  p.add_argument("--layout", default="",
                 help="layout rules for the counted figures, e.g. batch:all")
  p.add_argument("--counted_only", action="store_true")
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _mtf():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  return mtf


def build_step(args, variant, impl):
  """fn(x) building and lowering one training step onto `impl`; returns
  the loss (a tf.Tensor) with the variable updates as its dependencies."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  mtf = _mtf()
  batch = mtf.Dimension("batch", args.batch)
  width = mtf.Dimension("width", args.width)
  hidden = mtf.Dimension("hidden", args.width)

  def step(x):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    h = mtf.import_tf_tensor(mesh, x, [batch, width])
    for i in range(args.layers):
      w = mtf.get_variable(mesh, f"w{i}", [width, hidden],
                           initializer=tf.keras.initializers.Orthogonal(
                               seed=i))

      def block(v, w=w):
        u = mtf.tanh(mtf.einsum([v, w], [batch, hidden]))
        u = mtf.tanh(u * 1.5)
        return mtf.rename_dimension(u, "hidden", "width")

      if variant == "plain":
        h = block(h)
      else:
        h = mtf.recompute_grad(block, [h],
                               control_dependencies=variant == "recompute")
    loss = mtf.reduce_mean(mtf.square(h))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = [mtf.assign_sub(v, g * 0.1) for v, g in zip(variables, grads)]
    lowering, ops = bench_util.lower_step(mtf, graph, mesh, impl, updates)
    if tf.executing_eagerly():
      return lowering.export_to_tf_tensor(loss)
    return bench_util.loss_after_updates(tf, lowering, loss, ops)

  return step


def _topological(ops, predecessors):
  """`ops` in a topological order (control inputs may be added to an op
  after it is made, so creation order is not always one)."""
  successors = {op: [] for op in ops}
  waiting = {}
  for op in ops:
    waiting[op] = len(predecessors[op])
    for p in predecessors[op]:
      successors[p].append(op)
  order = [op for op in ops if not waiting[op]]
  for op in order:  # Grows while iterating.
    for s in successors[op]:
      waiting[s] -= 1
      if not waiting[s]:
        order.append(s)
  if len(order) != len(ops):
    raise ValueError("The graph has a cycle (a loop?).")
  return order, successors


def _schedule_levels(ops, predecessors):
  """(asap, alap) level of each op: longest path from a source, and from
  the end counted backwards."""
  order, successors = _topological(ops, predecessors)
  depth = {}
  for op in order:
    depth[op] = 1 + max((depth[p] for p in predecessors[op]), default=-1)
  height = {}
  for op in reversed(order):
    height[op] = 1 + max((height[s] for s in successors[op]), default=-1)
  top = max(height.values(), default=0)
  return depth, {op: top - height[op] for op in ops}


def _needed(tf_graph, outputs, control_outputs):
  """The ops a run of `outputs` executes (TF prunes the others), in
  creation order."""
  needed = set()
  stack = [t.op for t in outputs] + list(control_outputs)
  while stack:
    op = stack.pop()
    if op.name not in needed:
      needed.add(op.name)
      stack.extend(t.op for t in op.inputs)
      stack.extend(op.control_inputs)
  return [op for op in tf_graph.get_operations() if op.name in needed]


def peak_live_bytes(tf_graph, outputs, control_outputs=()):
  """{"asap": bytes, "alap": bytes} alive at the peak of each schedule.

  Args:
    tf_graph: a tf.Graph (or FuncGraph) with no loops.
    outputs: tf.Tensors that stay alive to the end (the step's results).
    control_outputs: ops that run too (a FuncGraph's stateful ops).
  """
  profile = live_bytes_profile(tf_graph, outputs, control_outputs)
  return {schedule: groups[None]["peak"] if groups else 0
          for schedule, groups in profile.items()}


def device_index(op):
  """The device number of `op` (its tf.device's index, 0 for "/cpu:0"),
  or None where it has no device: a group_of for live_bytes_profile."""
  if not op.device:
    return None
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  index = tf.DeviceSpec.from_string(op.device).device_index
  return 0 if index is None else index


def live_bytes_profile(tf_graph, outputs, control_outputs=(), group_of=None,
                       category_of=None):
  """The peak live bytes of each group of buffers, in either schedule.

  Counted as in `peak_live_bytes` (which is the one-group case), with each
  buffer counted in the group and category of the op that allocates it:
  e.g. per device (group_of=device_index, the peak of one processor's
  memory while the whole step runs in that order), split by what the
  buffers hold.

  Args:
    tf_graph, outputs, control_outputs: as in `peak_live_bytes`.
    group_of: fn(tf op) -> hashable group (default: None, one group).
    category_of: fn(tf op) -> category name (default: "live").

  Returns:
    {"asap" | "alap": {group: {"peak": bytes, "at_peak": {category:
    bytes alive at that group's peak}}}}, groups with no buffers left out.
  """
  group_of = group_of or (lambda op: None)
  category_of = category_of or (lambda op: "live")
  ops = _needed(tf_graph, outputs, control_outputs)
  index = {op.name: i for i, op in enumerate(ops)}
  predecessors = {
      op.name: sorted({t.op.name for t in op.inputs} |
                      {c.name for c in op.control_inputs}, key=index.get)
      for op in ops}
  buffer_of, size, owner = {}, {}, {}  # By tensor name.
  for op in ops:
    for t in op.outputs:
      source = _aliased_input(op)
      if source is not None:
        buffer_of[t.name] = buffer_of[source.name]
        continue
      buffer_of[t.name] = t.name
      owner[t.name] = (group_of(op), category_of(op))
      allocated = (op.type not in _NOT_ALLOCATED and
                   t.dtype.name not in ("resource", "variant"))
      if allocated and not t.shape.is_fully_defined():
        raise ValueError(f"{t.name} has no static shape: {t.shape}")
      size[t.name] = (t.shape.num_elements() * t.dtype.size
                      if allocated else 0)
  users = {}
  for op in ops:
    for t in op.inputs:
      users.setdefault(buffer_of[t.name], set()).add(op.name)
  kept = {buffer_of[t.name] for t in outputs}
  names = [op.name for op in ops]
  groups = {g for g, _ in owner.values()}
  result = {}
  for schedule, level in zip(("asap", "alap"),
                             _schedule_levels(names, predecessors)):
    pending = {b: set(u) for b, u in users.items()}
    remaining = dict(size)
    live = {g: {} for g in groups}
    total = dict.fromkeys(groups, 0)
    peak = {g: {"peak": 0, "at_peak": {}} for g in groups}
    for op in sorted(ops, key=lambda o, level=level: (level[o.name],
                                                       index[o.name])):
      touched = set()
      for t in op.outputs:
        if buffer_of[t.name] == t.name and remaining[t.name]:
          group, category = owner[t.name]
          live[group][category] = (live[group].get(category, 0) +
                                   remaining[t.name])
          total[group] += remaining[t.name]
          touched.add(group)
      for group in touched:
        if total[group] > peak[group]["peak"]:
          peak[group] = {"peak": total[group],
                         "at_peak": dict(live[group])}
      for b in {buffer_of[t.name] for t in op.inputs}:
        pending[b].discard(op.name)
        if not pending[b] and b not in kept and remaining[b]:
          group, category = owner[b]
          live[group][category] -= remaining[b]
          total[group] -= remaining[b]
          remaining[b] = 0
    result[schedule] = {g: p for g, p in peak.items() if p["peak"]}
  return result


def _aliased_input(op):
  """The input whose buffer `op`'s outputs share, or None."""
  if not op.inputs:
    return None
  if op.type in _ALIASING:
    return op.inputs[0]
  if op.type not in _SLICING_AXIS_0:
    return None
  x = op.inputs[1 if op.type == "Split" else 0]
  if op.type == "Unpack":
    axis = op.get_attr("axis")
  else:
    axis_input = op.inputs[0 if op.type == "Split" else 2]
    axis = tf_constant_value(axis_input)
    if axis is None:
      return None
  shape = x.shape
  if not shape.is_fully_defined() or axis not in (0, -shape.rank):
    return None
  inner = x.dtype.size
  for d in shape.as_list()[1:]:
    inner *= d
  return x if inner % _EIGEN_ALIGN_BYTES == 0 else None


def tf_constant_value(t):
  """The value of a constant tf.Tensor, else None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  value = tf.get_static_value(t)
  return None if value is None else int(value)


def counted(args, variant, mode):
  """The counted peaks of one variant's step in one mode, in MB."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  mtf = _mtf()
  spec = tf.TensorSpec([args.batch, args.width], tf.float32)
  if mode == "graph":
    with tf.Graph().as_default() as graph:
      impl = mtf.placement_mesh_impl.PlacementMeshImpl(args.mesh, args.layout)
      x = tf.compat.v1.placeholder(tf.float32, spec.shape)
      loss = build_step(args, variant, impl)(x)
      peaks = peak_live_bytes(graph, [loss])
  elif mode == "function":
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(args.mesh, args.layout)
    concrete = tf.function(build_step(args, variant, impl),
                           autograph=False).get_concrete_function(spec)
    peaks = peak_live_bytes(concrete.graph, concrete.graph.outputs,
                            concrete.graph.control_outputs)
  elif mode == "simd":
    impl = mtf.simd_mesh_impl.SimdMeshImpl(args.mesh, args.layout)
    concrete = impl.trace_program(build_step(args, variant, impl), spec)
    peaks = peak_live_bytes(concrete.graph, concrete.graph.outputs,
                            concrete.graph.control_outputs)
  else:
    raise ValueError(f"Unknown mode {mode!r}.")
  return {k: v / 2**20 for k, v in peaks.items()}


def all_counted(args):
  """{mode: {variant: {"asap": MB, "alap": MB}}}."""
  return {mode: {variant: counted(args, variant, mode)
                 for variant in VARIANTS} for mode in COUNTED_MODES}


def run_child(args):
  """Runs one step of one case ("<mtf|tf>_<variant>_<allocator|rss>") and
  prints the figure in MB and the loss.

  "allocator": TF's BFC allocator for the CPU and one inter-op thread, so
  that TF counts its bytes in use and runs ops in one order. "rss": TF's
  defaults, peak resident memory growth during the step.
  """
  library, variant, measure = args.child.split("_")
  if measure == "allocator":
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "1"
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if measure == "allocator":
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
  if library == "mtf":
    impl = _mtf().placement_mesh_impl.PlacementMeshImpl("all:1", "")
    step = tf.function(build_step(args, variant, impl), autograph=False)
  else:
    step = tf.function(_tf_step(args, variant), autograph=False)
  x = tf.constant(np.random.RandomState(0).randn(
      args.batch, args.width).astype(np.float32))
  # Tracing creates the variables; the step has not run yet.
  step.get_concrete_function(x)
  if measure == "allocator":
    tf.config.experimental.reset_memory_stats("CPU:0")
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]
    loss = float(step(x))
    figure = (tf.config.experimental.get_memory_info("CPU:0")["peak"] -
              base) / 2**20
  else:
    bench_util.reset_peak_rss()
    base = bench_util.status_mb("VmRSS")
    loss = float(step(x))
    figure = bench_util.status_mb("VmHWM") - base
  print(json.dumps({"mb": figure, "loss": loss}))


def _tf_step(args, variant):
  """The same step in plain TensorFlow, optionally with tf.recompute_grad."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ws = [tf.Variable(tf.keras.initializers.Orthogonal(seed=i)(
      [args.width, args.width])) for i in range(args.layers)]

  def block_fn(w):
    return lambda v: tf.tanh(tf.tanh(v @ w) * 1.5)

  blocks = [block_fn(w) for w in ws]
  if variant == "recompute":
    blocks = [tf.recompute_grad(b) for b in blocks]

  def step(x):
    with tf.GradientTape() as tape:
      h = x
      for b in blocks:
        h = b(h)
      loss = tf.reduce_mean(tf.square(h))
    grads = tape.gradient(loss, ws)
    for w, g in zip(ws, grads):
      w.assign_sub(g * 0.1)
    return loss

  return step


def measure(name, args):
  """Runs one child process; returns its JSON result."""
  command = [sys.executable, __file__, "--child", name,
             "--layers", str(args.layers), "--batch", str(args.batch),
             "--width", str(args.width)]
  out = subprocess.run(command, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def _worst(peaks):
  return max(peaks.values())


def main(argv):
  args = parse_args(argv)
  # A device per processor (SimdMeshImpl needs one), before TF starts.
  bench_util.configure_logical_cpus(
      max(1, _mtf().convert_to_shape(args.mesh).size))
  if args.child:
    run_child(args)
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  figures = all_counted(args)
  record = {
      "benchmark": "recompute_memory",
      "layers": args.layers, "batch": args.batch, "width": args.width,
      "mesh": args.mesh, "layout": args.layout,
      "activation_mb": args.batch * args.width * 4 / 2**20,
      "counted_ratio": {
          mode: round(_worst(f["recompute"]) / _worst(f["plain"]), 3)
          for mode, f in figures.items()},
      "counted_mb": {
          mode: {v: {k: round(x, 3) for k, x in p.items()}
                 for v, p in f.items()} for mode, f in figures.items()},
  }
  if args.counted_only:
    print(json.dumps(record))
    return
  runs = {}
  for measure_name in ("allocator", "rss"):
    for library in ("mtf", "tf"):
      for variant in ("plain", "recompute"):
        name = f"{library}_{variant}_{measure_name}"
        runs[name] = measure(name, args)

  def ratio(library, measure_name):
    plain = runs[f"{library}_plain_{measure_name}"]["mb"]
    recompute = runs[f"{library}_recompute_{measure_name}"]["mb"]
    return round(recompute / plain, 3) if plain > 0 else None

  record.update({
      "allocator_ratio": ratio("mtf", "allocator"),
      "tf_allocator_ratio": ratio("tf", "allocator"),
      "rss_ratio": ratio("mtf", "rss"),
      "tf_rss_ratio": ratio("tf", "rss"),
      "measured_mb": {name: round(r["mb"], 3) for name, r in runs.items()},
      "same_loss": abs(runs["mtf_plain_allocator"]["loss"] -
                       runs["mtf_recompute_allocator"]["loss"]) < 1e-5,
  })
  print(json.dumps(record))


if __name__ == "__main__":
  main(sys.argv[1:])
