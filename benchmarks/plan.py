"""Benchmark: run plans (mesh, layout, ZeRO level, structure) and measure them.

Issue 49's check of the run planner against measurement. For each model of
--models, a list of plans (`plan_cases`: a hand-made set spanning the mesh
shapes, ZeRO levels, pipeline stages S and micro-batches M, and recompute;
with --plans planner, those of `plan_enumeration.enumerate_plans`: the
planner's finalists and plans differing in every choice, with their
predictions) is built through the model's `PlanModel.build`, lowered on 8
logical CPUs (PlacementMeshImpl) and

- timed: every plan's step is traced and warmed up, then the plans take
  turns, one step each per round, for --rounds rounds (a slow spell of this
  shared machine slows them all alike); the figure is the median;
  `repeat_tau` is the measurement's own reproducibility, Kendall's tau of
  the even and the odd rounds' medians over the plans (the ceiling of any
  prediction's);
- counted: the peak bytes of the lowered step per processor, by the method
  of benchmarks/recompute_memory.py (the buffers alive at the peak of the
  step's TF graph run as soon as possible and as late as possible), each
  processor's device apart (replicas not shared), the largest over the
  processors; split into parameters and optimizer slots (the variables'
  slices on that device) and, at the peak, activations (buffers of ops the
  loss depends on, gathered ZeRO-3 parameters among them) and gradients
  (the rest: gradients, the update's temporaries and recomputed
  activations), as the planner's PeakMemory splits them;
- checked: the losses of the first --check_steps steps against the plain
  model's on one processor (`loss_rel_diff`, the largest relative
  difference).

The one-processor run is timed in the same rounds ("reference": true) but
left out of the ranking. One JSON line per plan, then one per model with
the ranking figures (and, where plans carry predictions, the pick's
measured time over the best and the rank correlation of predicted and
measured times, and the worst memory error: predicted peak over counted
peak, in either order, `memory_ratio` and `memory_ratio_alap` per plan).
The pick is the plan of least predicted time: the planner's (the
enumeration holds its finalists).

Models: "dense" (DenseStackModel, --layers, --batch, --io, --hidden) and
the tiny Transformer (models/tiny.gin, --tiny_batch sequences of
--tiny_length, a vocabulary of --tiny_vocab), encoder-decoder "bi" and
language model "lm".
A new model is a PlanModel in `make_model`; a planner's plans come in
through `planner_cases`.

  python benchmarks/plan.py [--models dense,bi,lm] [--plans hand|planner]
      [--rounds 10] [--quick] [--no_count] [--machine FILE]
"""

import argparse
import dataclasses
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_DEVICES = 8
MODELS = ("dense", "bi", "lm")
TINY_GIN = {"bi": "models/bi_base.gin", "lm": "models/lm_base.gin"}


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default=",".join(MODELS))
  p.add_argument("--plans", default="hand", choices=("hand", "planner"),
                 help="hand-made plans, or the planner's enumeration")
  p.add_argument("--max_plans", type=int, default=32,
                 help="with --plans planner: the most plans run")
  p.add_argument("--rounds", type=int, default=10,
                 help="timed rounds (one step of every plan each)")
  p.add_argument("--warmup", type=int, default=2,
                 help="untimed steps of each plan first (tracing)")
  p.add_argument("--build_budget", type=float, default=None,
                 help="seconds for tracing the plans' steps; plans not "
                 "built by then are logged and left out (time-boxes the "
                 "tiny Transformers, whose pipelined steps trace slowly)")
  p.add_argument("--check_steps", type=int, default=3,
                 help="steps whose loss is compared with one processor's")
  p.add_argument("--layers", type=int, default=8)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--io", type=int, default=256)
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--optimizer", default="adafactor")
  p.add_argument("--tiny_batch", type=int, default=32,
                 help="sequences per batch of the tiny Transformers")
  p.add_argument("--tiny_length", type=int, default=16)
  p.add_argument("--tiny_vocab", type=int, default=64)
  p.add_argument("--machine", default=None,
                 help="machine constants (file, JSON or shipped name) the "
                 "planner prices with; default: this machine's, measured")
  p.add_argument("--quick", action="store_true",
                 help="a small model, few plans and rounds (a smoke run)")
  p.add_argument("--no_count", action="store_true",
                 help="skip the counted memory")
  args = p.parse_args(argv)
  if args.quick:
    args.layers, args.batch, args.io, args.hidden = 4, 16, 32, 64
    args.rounds, args.warmup, args.check_steps = 4, 1, 2
  return args


# ------------------------------------------------------------------ plans


@dataclasses.dataclass
class Case:
  """One plan to run: a model's structure under a mesh, layout and ZeRO.

  `predicted` holds the planner's figures (empty for hand-made plans):
  "seconds", "seconds_split", "peak_bytes", "bytes_split".
  """
  model_name: str
  model: object  # A plan_space.PlanModel.
  structure: object  # A plan_space.Structure.
  mesh_shape: str
  layout_rules: str
  zero: str = "none"
  predicted: dict = dataclasses.field(default_factory=dict)
  reference: bool = False
  kind: str = ""  # How the planner made the layout (plan_enumeration).

  @property
  def label(self):
    return (f"{self.model_name} {self.mesh_shape} [{self.layout_rules}] "
            f"zero={self.zero} {self.structure.describe()}")


def make_model(name, args):
  """The PlanModel called `name`."""
  if name == "dense":
    from mesh_tensorflow.auto_mtf import dense_stack_model  # pylint: disable=g-import-not-at-top
    return dense_stack_model.DenseStackModel(
        num_layers=args.layers, batch=args.batch, io=args.io,
        hidden=args.hidden, optimizer=args.optimizer, seed=0)
  if name in TINY_GIN:
    from mesh_tensorflow.transformer import plan_gin  # pylint: disable=g-import-not-at-top
    return plan_gin.from_gin(
        [TINY_GIN[name], "models/tiny.gin"], ["dropout_rate = 0.0"],
        batch_size=args.tiny_batch, sequence_length=args.tiny_length,
        vocab_size=args.tiny_vocab)
  raise ValueError(f"Unknown model {name!r}; known: {', '.join(MODELS)}.")


def hand_cases(name, model, quick=False):
  """Plans made by hand for a dense stack on 8 processors: every mesh
  shape of the issue, the ZeRO levels, S and M, and recompute."""
  from mesh_tensorflow.auto_mtf import plan_space  # pylint: disable=g-import-not-at-top
  if name != "dense":
    raise ValueError(f"no hand-made plans for model {name!r}; use "
                     "--plans planner.")
  s = plan_space.Structure
  layers = model.num_layers
  dp, mp2d = "batch:all", "batch:b;hidden:m"
  plans = [
      (s(), "all:8", dp, "none"),
      (s(), "all:8", dp, "weight_update"),
      (s(), "all:8", dp, "parameters"),
      (s(), "all:8", "hidden:all", "none"),
      (s(), "b:2;m:4", mp2d, "none"),
      (s(recompute_layers=layers // 2), "b:2;m:4", mp2d, "weight_update"),
      (s(recompute_layers=layers), "all:8", dp, "none"),
      (s(2, 8, 0), "stage:2;b:4", "stage:stage;batch:b", "none"),
      (s(2, 4, 0), "stage:2;b:4", "stage:stage;batch:b", "weight_update"),
      (s(4, 4, 0), "stage:4;b:2", "stage:stage;batch:b", "none"),
      (s(4, 16, 0), "stage:4;b:2", "stage:stage;batch:b", "parameters"),
      (s(4, 8, layers), "stage:4;b:2", "stage:stage;batch:b", "none"),
  ]
  if quick:
    plans = [plans[i] for i in (0, 2, 4, 5, 8, 11)]
  allowed = set(model.structures(NUM_DEVICES))
  return [Case(name, model, st, mesh, rules, zero)
          for st, mesh, rules, zero in plans if st in allowed]


def planner_cases(name, model, args, num_processors=NUM_DEVICES):
  """The planner's plans for `model`, with their predictions: at most
  --max_plans of plan_enumeration.enumerate_plans (its finalists, the
  pick among them, and plans differing in every choice)."""
  from mesh_tensorflow.auto_mtf import plan_enumeration  # pylint: disable=g-import-not-at-top
  plans = plan_enumeration.enumerate_plans(
      model, num_processors, machine=args.machine, max_plans=args.max_plans)
  return [Case(name, model, p.structure, _text(p.mesh_shape),
               _text(p.layout_rules), p.zero, predicted=_prediction(p),
               kind=p.kind)
          for p in plans]


def _text(x):
  """A mesh shape or layout rules (mtf objects or strings) as the string
  PlacementMeshImpl takes, e.g. "b:2;m:4" and "batch:b;hidden:m"."""
  if isinstance(x, str):
    return x
  mtf = _mtf()
  if isinstance(x, mtf.Shape):
    return ";".join(f"{d.name}:{d.size}" for d in x.dims)
  return ";".join(f"{t}:{m}" for t, m in mtf.convert_to_layout_rules(x))


def _value(x):
  """A figure that may be a property or a method."""
  return x() if callable(x) else x


def _prediction(plan):
  """The predicted figures of a planner.Plan (or Alternative): "seconds",
  "peak_bytes" and, where given, "seconds_split" and "bytes_split"."""
  out = {}
  step_time = getattr(plan, "step_time", None)
  if step_time is not None:
    out["seconds"] = float(_value(step_time.total))
    out["seconds_split"] = {k: float(getattr(step_time, k)) for k in
                            ("compute", "collectives", "bubble")}
  elif getattr(plan, "step_seconds", None) is not None:
    out["seconds"] = float(plan.step_seconds)
  memory = getattr(plan, "memory", None)
  if memory is not None:
    out["peak_bytes"] = int(_value(memory.total))
    out["bytes_split"] = dict(memory.as_dict())
  elif getattr(plan, "peak_bytes", None) is not None:
    out["peak_bytes"] = int(plan.peak_bytes)
  return out


def plan_cases(name, model, args):
  """The plans of `model` to run: hand-made or the planner's."""
  if args.plans == "planner":
    return planner_cases(name, model, args)
  return hand_cases(name, model, quick=args.quick)


def reference_case(name, model):
  """The plain model on one processor (losses compared against)."""
  from mesh_tensorflow.auto_mtf import plan_space  # pylint: disable=g-import-not-at-top
  return Case(name, model, plan_space.Structure(), "all:1", "", "none",
              reference=True)


# --------------------------------------------------------------- building


def _mtf():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  return mtf


def lower_case(mtf, case, mesh_impl):
  """Builds `case`'s step and lowers it onto `mesh_impl`; returns
  (lowering, mtf graph, mtf loss, the TF ops of its variable updates)."""
  graph, outputs = case.model.build(case.structure, case.zero,
                                    case.mesh_shape, case.layout_rules)
  loss = outputs[0]
  updates = [op for op in graph.operations if isinstance(op, mtf.Assign)]
  lowering, ops = bench_util.lower_step(mtf, graph, loss.mesh, mesh_impl,
                                        updates)
  return lowering, graph, loss, ops


def make_step(tf, mtf, case):
  """A tf.function running one training step of `case`."""
  devices = [f"/cpu:{i}" for i in range(NUM_DEVICES)]
  size = mtf.convert_to_shape(case.mesh_shape).size
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      case.mesh_shape, case.layout_rules, devices[:size])
  step_var = tf.Variable(0, dtype=tf.int64, name="global_step")

  def program():
    lowering, _, loss, ops = lower_case(mtf, case, mesh_impl)
    return bench_util.loss_after_updates(tf, lowering, loss, ops)

  return bench_util.counted_step(tf, mtf, step_var, program)


# -------------------------------------------------------------- counting


def counted_bytes(tf, mtf, case):
  """Counted peak bytes per processor of `case`'s lowered step.

  Returns {"asap": {...}, "alap": {...}}, each {"peak": the largest
  processor's total; "parameters", "optimizer_slots": its variables'
  slices (the same on every processor); "activations" (buffers of ops the
  loss depends on), "gradients" (the others: gradients and the update's
  temporaries): its buffers alive at its peak; "unplaced": the peak of
  the ops on no device}.
  """
  import recompute_memory  # pylint: disable=g-import-not-at-top
  size = mtf.convert_to_shape(case.mesh_shape).size
  # Each processor keeps and computes its own copies (no shared replicas),
  # as a prediction per processor counts.
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      case.mesh_shape, case.layout_rules,
      [f"/cpu:{i}" for i in range(size)], share_replicas=False)
  tf_graph = tf.Graph()
  with tf_graph.as_default():
    tf.compat.v1.train.get_or_create_global_step()
    lowering, graph, loss, ops = lower_case(mtf, case, mesh_impl)
    out = lowering.export_to_tf_tensor(loss)
    forward = _ancestors(out.op)
    profile = recompute_memory.live_bytes_profile(
        tf_graph, [out], ops, group_of=recompute_memory.device_index,
        category_of=lambda op: ("activations" if op.name in forward else
                                "gradients"))
    # On each processor: its slice variables, in their slice dtype.
    held = {"parameters": 0, "optimizer_slots": 0}
    for var in graph.all_variables:
      held["parameters" if var.trainable else "optimizer_slots"] += (
          mesh_impl.slice_size(var.shape) * var.slice_dtype.size)
  result = {}
  for schedule, groups in profile.items():
    best = None
    for device in range(size):
      live = groups.get(device, {"peak": 0, "at_peak": {}})
      figures = {"peak": live["peak"] + sum(held.values()), **held,
                 "activations": live["at_peak"].get("activations", 0),
                 "gradients": live["at_peak"].get("gradients", 0)}
      if best is None or figures["peak"] > best["peak"]:
        best = figures
    best["unplaced"] = groups.get(None, {"peak": 0})["peak"]
    result[schedule] = best
  return result


def _ancestors(op):
  """Names of `op` and every op it depends on (data and control)."""
  seen, stack = set(), [op]
  while stack:
    o = stack.pop()
    if o.name not in seen:
      seen.add(o.name)
      stack.extend(t.op for t in o.inputs)
      stack.extend(o.control_inputs)
  return seen


# -------------------------------------------------------------- measuring


def measure(tf, mtf, cases, args):
  """{case index: {"times": [seconds], "losses": [...]}} of the cases that
  run (interleaved rounds, bench_util.interleaved_times); failures are
  logged and left out."""
  steps = {}
  start = time.perf_counter()
  for i, case in enumerate(cases):
    if (args.build_budget is not None and
        time.perf_counter() - start > args.build_budget):
      bench_util.log(f"{case.label}: not built (--build_budget "
                     f"{args.build_budget:g} s spent)")
      continue
    try:
      step = make_step(tf, mtf, case)
      step.get_concrete_function()
      steps[i] = step
      bench_util.log(f"  built {i + 1}/{len(cases)}: {case.label}")
    except Exception as e:  # pylint: disable=broad-except
      bench_util.log(f"{case.label}: does not build: {e!r:.300}")
  warmup = max(args.warmup, args.check_steps)
  runs = bench_util.interleaved_times(
      steps, max(args.rounds, 2), warmup=warmup)
  return {i: {"times": [ms / 1e3 for ms in r["times_ms"]],
              "losses": [float(x) for x in r["results"]]}
          for i, r in runs.items()}


def run_model(tf, mtf, name, args):
  """Runs every plan of model `name`; prints their JSON lines and the
  model's summary line; returns the records."""
  import auto_layout  # pylint: disable=g-import-not-at-top
  model = make_model(name, args)
  cases = [reference_case(name, model)] + plan_cases(name, model, args)
  bench_util.log(f"{name}: {len(cases) - 1} plans, {model!r}")
  runs = measure(tf, mtf, cases, args)
  ref_losses = runs[0]["losses"][:args.check_steps] if 0 in runs else None
  medians = {i: bench_util.median(r["times"]) for i, r in runs.items()}
  halves = {i: [bench_util.median(r["times"][k::2]) for k in (0, 1)]
            for i, r in runs.items()}
  ranked = [i for i in runs if not cases[i].reference]
  repeat_tau = auto_layout.kendall_tau([halves[i][0] for i in ranked],
                                       [halves[i][1] for i in ranked])
  records = []
  for i, case in enumerate(cases):
    record = {
        "model": name, "plan": case.label, "mesh_shape": case.mesh_shape,
        "layout_rules": case.layout_rules, "zero": case.zero,
        "stages": case.structure.stages,
        "micro_batches": case.structure.micro_batches,
        "recompute_layers": case.structure.recompute_layers,
        "reference": case.reference,
        "kind": case.kind,
        "runs": i in runs,
    }
    if i in runs:
      losses = runs[i]["losses"][:args.check_steps]
      record.update({
          "step_seconds": bench_util.rounded(medians[i], 5),
          "step_seconds_halves": [bench_util.rounded(h, 5)
                                  for h in halves[i]],
          "repeat_tau": bench_util.rounded(repeat_tau),
          "losses": [bench_util.rounded(x, 6) for x in losses],
          "loss_rel_diff": _rel_diff(losses, ref_losses),
      })
    if not args.no_count:
      try:
        counted = counted_bytes(tf, mtf, case)
        record["counted_bytes"] = counted["asap"]
        record["counted_bytes_alap"] = counted["alap"]
      except Exception as e:  # pylint: disable=broad-except
        bench_util.log(f"{case.label}: not counted: {e!r:.300}")
    if case.predicted:
      record["predicted"] = case.predicted
      # Predicted over counted, in either order (as benchmarks/auto_layout.py).
      for key, counted_key in (("memory_ratio", "counted_bytes"),
                               ("memory_ratio_alap", "counted_bytes_alap")):
        peak = record.get(counted_key, {}).get("peak")
        if peak and "peak_bytes" in case.predicted:
          record[key] = bench_util.rounded(case.predicted["peak_bytes"] / peak)
    bench_util.log(f"  {case.label}: {record.get('step_seconds')} s, peak "
                   f"{record.get('counted_bytes', {}).get('peak')} B, loss "
                   f"diff {record.get('loss_rel_diff')}")
    bench_util.emit(record)
    records.append(record)
  bench_util.emit(summary(name, cases, records, repeat_tau))
  return records


def _rel_diff(losses, reference):
  if not reference or len(losses) < len(reference):
    return None
  return max(abs(a - b) / max(abs(b), 1e-12)
             for a, b in zip(losses, reference))


def summary(name, cases, records, repeat_tau):
  """The model's ranking figures over the plans that ran."""
  import auto_layout  # pylint: disable=g-import-not-at-top
  ran = [(c, r) for c, r in zip(cases, records)
         if r["runs"] and not c.reference]
  out = {"model": name, "summary": True, "plans": len(ran),
         "repeat_tau": bench_util.rounded(repeat_tau),
         "worst_loss_rel_diff": max(
             (r["loss_rel_diff"] for _, r in ran
              if r["loss_rel_diff"] is not None), default=None)}
  if ran:
    best = min(r["step_seconds"] for _, r in ran)
    out["best_step_seconds"] = best
    reference = [r for c, r in zip(cases, records) if c.reference and r["runs"]]
    if reference:
      out["one_processor_step_seconds"] = reference[0]["step_seconds"]
  predicted = [(c, r) for c, r in ran if "seconds" in c.predicted]
  if predicted:
    pick = min(predicted, key=lambda cr: cr[0].predicted["seconds"])
    fastest = min(predicted, key=lambda cr: cr[1]["step_seconds"])
    out["pick_vs_best"] = bench_util.rounded(pick[1]["step_seconds"] / best)
    out["pick"] = pick[0].label
    out["best"] = fastest[0].label
    out["tau_predicted_measured"] = bench_util.rounded(auto_layout.kendall_tau(
        [c.predicted["seconds"] for c, _ in predicted],
        [r["step_seconds"] for _, r in predicted]))
    for key in ("memory_ratio", "memory_ratio_alap"):
      ratios = [r[key] for _, r in predicted if key in r]
      if ratios:
        out["worst_" + key.replace("ratio", "error")] = bench_util.rounded(
            max(abs(x - 1) for x in ratios))
  return out


def main(argv):
  args = parse_args(argv)
  bench_util.configure_logical_cpus(NUM_DEVICES)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  mtf = _mtf()
  for name in args.models.split(","):
    run_model(tf, mtf, name, args)


if __name__ == "__main__":
  main(sys.argv[1:])
