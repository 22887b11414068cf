"""Shared helpers for the benchmarks: devices, timing, JSON output.

Every benchmark prints one JSON line per case to stdout and logs to stderr
only, so `make bench > results.jsonl` collects nothing but results.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def log(*args):
  print(*args, file=sys.stderr, flush=True)


def configure_logical_cpus(n):
  """Splits the first physical CPU into `n` logical devices.

  Must run before anything else initialises TensorFlow's devices.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * n)
  return [d.name for d in tf.config.list_logical_devices("CPU")]


def status_mb(field):
  """A memory figure of this process from /proc/self/status, in MB
  (e.g. "VmRSS", or "VmHWM" for the peak; Linux)."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) / 1024.0
  raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss():
  """Makes VmHWM (peak RSS) start again from the current RSS (Linux)."""
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")


def add_timing_args(parser, steps, warmup):
  """Adds --steps (timed steps) and --warmup (untimed ones first)."""
  parser.add_argument("--steps", type=int, default=steps, help="timed steps")
  parser.add_argument("--warmup", type=int, default=warmup,
                      help="untimed steps first (the first one traces)")


def new_mesh(mtf, name, mesh_shape, layout, sharding):
  """(graph, mesh): a new mtf Graph and its Mesh `name`.

  `sharding` (None, "update" or "parameters") asks for data-parallel
  sharding of the weight updates, or of the parameters too.
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, name)
  if sharding:
    mtf.shard_data_parallel(mesh, mesh_shape, layout,
                            shard_parameters=(sharding == "parameters"))
  return graph, mesh


def lower_step(mtf, graph, mesh, mesh_impl, updates):
  """Lowers a training step's mtf graph onto `mesh_impl`.

  Returns (lowering, the TF operations of `updates`: those that lowered to
  one).
  """
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  ops = [lowering.lowered_operation(u) for u in updates]
  return lowering, [o for o in ops if o is not None]


def loss_after_updates(tf, lowering, loss, update_ops):
  """The TF value of mtf `loss`, read once all of `update_ops` ran."""
  with tf.control_dependencies(update_ops):
    return tf.identity(lowering.export_to_tf_tensor(loss))


def counted_step(tf, mtf, step_var, program):
  """A tf.function (no autograph) running one training step.

  It runs program() -> TF loss under the global step `step_var`, then
  increments the step, and returns the loss.
  """

  @tf.function(autograph=False)
  def step():
    with mtf.global_step.global_step_scope(step_var):
      loss = program()
    with tf.control_dependencies([loss]):
      step_var.assign_add(1)
    return tf.identity(loss)

  return step


def timed_call(fn, *args):
  """Runs fn(*args), waits for its result; returns (ms, result)."""
  ms, _, value = timed_call_cpu(fn, *args)
  return ms, value


def timed_call_cpu(fn, *args):
  """Like timed_call, also the process CPU time (all threads) in ms.

  CPU time counts work rather than latency: on a loaded machine it shows
  whether a slower step did more work or waited longer.
  """
  start, start_cpu = time.perf_counter(), time.process_time()
  result = fn(*args)
  value = result.numpy() if hasattr(result, "numpy") else result
  return ((time.perf_counter() - start) * 1000.0,
          (time.process_time() - start_cpu) * 1000.0, value)


def interleaved_times(fns, steps, warmup=2):
  """Times `steps` calls of each zero-argument fn in `fns` (a dict).

  The implementations take turns step by step, so load changes on a noisy
  machine hit all of them alike and their ratios stay meaningful. Returns
  {name: {"times_ms": [...], "cpu_ms": [...], "results": [...]}} with the
  warm-up calls' results included (first) but not their times.
  """
  out = {name: {"times_ms": [], "cpu_ms": [], "results": []} for name in fns}
  names = list(fns)
  for i in range(warmup + steps):
    # Rotate who goes first, so no implementation always follows another.
    for name in names[i % len(names):] + names[:i % len(names)]:
      fn = fns[name]
      ms, cpu_ms, value = timed_call_cpu(fn)
      out[name]["results"].append(value)
      if i >= warmup:
        out[name]["times_ms"].append(ms)
        out[name]["cpu_ms"].append(cpu_ms)
  return out


def paired_ratio(a_times, b_times):
  """Median of per-round ratios a[i] / b[i] (steps taken side by side).

  Less sensitive than a ratio of medians to load that changes during a run.
  """
  ratios = [a / b for a, b in zip(a_times, b_times) if b]
  return median(ratios)


def median(xs):
  return statistics.median(xs) if xs else None


def ratio(a, b):
  if a is None or b is None or b == 0:
    return None
  return a / b


def emit(record):
  """Prints one result line (JSON) to stdout."""
  print(json.dumps(record, sort_keys=False), flush=True)


def rounded(x, digits=3):
  return None if x is None else round(float(x), digits)


def run_json_child(cmd, timeout=None):
  """Runs `cmd` (a list) with stderr passed through; returns its JSON lines.

  Returns (records, error): the dicts the child printed to stdout, one a
  line, and None, or a short error string if it failed or timed out.
  """
  import subprocess  # pylint: disable=g-import-not-at-top
  try:
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None,
                          text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired as e:
    out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout
    return _json_lines(out or ""), f"timed out after {timeout}s"
  error = None if done.returncode == 0 else f"exit code {done.returncode}"
  return _json_lines(done.stdout), error


def _json_lines(text):
  records = []
  for line in text.splitlines():
    line = line.strip()
    if line.startswith("{"):
      try:
        records.append(json.loads(line))
      except ValueError:
        pass
  return records


def profiled_call(fn, path=None, top=25, sort="cumulative"):
  """Runs fn() under cProfile; logs the top entries; returns fn()'s value.

  Saves the raw stats to `path` (for pstats / snakeviz) when given.
  """
  import cProfile  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import pstats  # pylint: disable=g-import-not-at-top
  profile = cProfile.Profile()
  result = profile.runcall(fn)
  if path:
    profile.dump_stats(path)
  text = io.StringIO()
  pstats.Stats(profile, stream=text).sort_stats(sort).print_stats(top)
  log(text.getvalue())
  return result
