"""Benchmark: the planner's predicted peak bytes against the counted peak.

Issue 49 item 4's memory check. For each model of --models (the dense
stack, the tiny Transformer encoder-decoder "bi" and language model "lm"),
a set of plans spanning the mesh shapes, layouts, ZeRO levels, pipeline
stages and micro-batches and recompute (`plan_enumeration.enumerate_plans`
where it exists and --plans enumerate is given, else a hand-made list) is

- predicted: `plan_pricing.peak_memory` of the plan's graph (built with its
  sharding), the planner's figure;
- counted: the step lowered on 8 logical CPUs (PlacementMeshImpl, no
  replicas shared), the buffers alive at each processor's peak of the TF
  graph by the method of benchmarks/recompute_memory.py
  (`live_bytes_profile`, asap and alap orders), plus the variables'
  slices on that processor, the largest processor's; each buffer is put in
  the part (plan_pricing.MEMORY_PARTS) of the mtf operation whose name
  scope made it, so that the parts compare one to one.

Nothing is timed. One JSON line per plan (predicted, counted, ratio =
predicted / counted, by part), then one per model and one overall with the
worst error |ratio - 1|.

  python benchmarks/plan_memory.py [--models dense,bi,lm] [--quick]
"""

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_DEVICES = 8
MODELS = ("dense", "bi", "lm")
ORDERS = ("asap", "alap")


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default=",".join(MODELS))
  p.add_argument("--plans", default="hand", choices=("hand", "enumerate"))
  p.add_argument("--max_plans", type=int, default=40)
  p.add_argument("--layers", type=int, default=8)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--io", type=int, default=256)
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--optimizer", default="adafactor")
  p.add_argument("--tiny_batch", type=int, default=32,
                 help="sequences per batch of the tiny Transformers")
  p.add_argument("--tiny_length", type=int, default=16)
  p.add_argument("--tiny_vocab", type=int, default=64)
  p.add_argument("--only", default=None,
                 help="run only the plans whose label contains this")
  p.add_argument("--quick", action="store_true",
                 help="a small dense stack (a smoke run)")
  args = p.parse_args(argv)
  if args.quick:
    args.layers, args.batch, args.io, args.hidden = 4, 16, 32, 64
  return args


def _mtf():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  return mtf


# ------------------------------------------------------------------ models


def make_model(name, args):
  """The PlanModel called `name`."""
  if name == "dense":
    import plan  # pylint: disable=g-import-not-at-top
    return plan.make_model("dense", args)
  if name in ("bi", "lm"):
    from mesh_tensorflow.transformer import plan_gin  # pylint: disable=g-import-not-at-top
    gin_file = {"bi": "models/bi_base.gin", "lm": "models/lm_base.gin"}[name]
    return plan_gin.from_gin(
        [gin_file, "models/tiny.gin"], ["dropout_rate = 0.0"],
        batch_size=args.tiny_batch, sequence_length=args.tiny_length,
        vocab_size=args.tiny_vocab)
  raise ValueError(f"Unknown model {name!r}; known: {', '.join(MODELS)}.")


def transformer_cases(name, model):
  """Hand-made plans for a tiny Transformer on 8 processors."""
  import plan  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import plan_space  # pylint: disable=g-import-not-at-top
  s = plan_space.Structure
  layers = model.num_layers
  dp = "batch:all"
  mp = "d_ff:all;vocab:all"
  mp2d = "batch:b;d_ff:m;heads:m;vocab:m"
  pipe = "stage:stage;batch:b"
  pipe_mp = "stage:stage;batch:b;d_ff:m;heads:m"
  plans = [
      (s(), "all:8", dp, "none"),
      (s(), "all:8", dp, "weight_update"),
      (s(), "all:8", dp, "parameters"),
      (s(), "all:8", mp, "none"),
      (s(), "b:2;m:4", mp2d, "none"),
      (s(), "b:4;m:2", mp2d, "weight_update"),
      (s(), "b:2;m:4", mp2d, "parameters"),
      (s(recompute_layers=layers // 2), "b:2;m:4", mp2d, "none"),
      (s(recompute_layers=layers), "all:8", dp, "none"),
      (s(recompute_layers=layers), "b:4;m:2", mp2d, "parameters"),
      (s(2, 2, 0), "stage:2;b:4", pipe, "none"),
      (s(2, 4, 0), "stage:2;b:4", pipe, "weight_update"),
      (s(2, 8, 0), "stage:2;b:4", pipe, "none"),
      (s(2, 8, 0), "stage:2;b:2;m:2", pipe_mp, "parameters"),
      (s(2, 4, layers), "stage:2;b:4", pipe, "none"),
      (s(2, 8, layers), "stage:2;b:2;m:2", pipe_mp, "weight_update"),
  ]
  allowed = set(model.structures(NUM_DEVICES))
  return [plan.Case(name, model, st, mesh, rules, zero)
          for st, mesh, rules, zero in plans if st in allowed]


def cases_of(name, model, args):
  """The plans of `model` to price and count."""
  import plan  # pylint: disable=g-import-not-at-top
  if args.plans == "enumerate":
    from mesh_tensorflow.auto_mtf import plan_enumeration  # pylint: disable=g-import-not-at-top
    plans = list(plan_enumeration.enumerate_plans(model, NUM_DEVICES))
    return [plan.Case(name, model, p.structure, plan._text(p.mesh_shape),  # pylint: disable=protected-access
                      plan._text(p.layout_rules), p.zero)  # pylint: disable=protected-access
            for p in plans[:args.max_plans]]
  if name == "dense":
    return plan.hand_cases(name, model, quick=args.quick)
  return transformer_cases(name, model)


# -------------------------------------------------------------- figures


def _build(tf, case):
  tf.compat.v1.train.get_or_create_global_step()
  return case.model.build(case.structure, case.zero, case.mesh_shape,
                          case.layout_rules)


def predicted_bytes(tf, case):
  """plan_pricing.PeakMemory of `case` (its own graph, as the planner
  re-prices a finalist)."""
  from mesh_tensorflow.auto_mtf import plan_pricing  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    graph, outputs = _build(tf, case)
    _, memory = plan_pricing.price(graph, outputs, case.mesh_shape,
                                   case.layout_rules)
  return memory


def _part_by_scope(mtf_graph):
  """fn(tf op) -> the plan_pricing part of the mtf operation whose name
  scope the tf op is in (the longest matching scope), "activations" if
  none."""
  from mesh_tensorflow import lowering as lowering_lib  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import plan_pricing  # pylint: disable=g-import-not-at-top
  parts = plan_pricing._memory_parts(mtf_graph)  # pylint: disable=protected-access
  by_scope = {}
  for op in mtf_graph.operations:
    if op.outputs:
      # The part of its first output stands for the operation's buffers.
      by_scope[lowering_lib._scope_name(op.name)] = parts.part(  # pylint: disable=protected-access
          op.outputs[0].name)

  def part_of(tf_op):
    if (tf_op.type == "Cast" and tf_op.inputs and
        tf_op.inputs[0].op.type == "ReadVariableOp"):
      return "parameters"  # A variable read in its activation dtype.
    name = tf_op.name
    while True:
      found = by_scope.get(name)
      if found is not None:
        return found
      if "/" not in name:
        return "activations"
      name = name.rsplit("/", 1)[0]

  return part_of


def counted_bytes(tf, mtf, case):
  """{"asap" | "alap": {"peak": bytes, part: bytes, "device": d}} of the
  largest processor's peak of `case`'s lowered step (variables' slices
  held throughout, the other buffers alive at that processor's peak)."""
  import plan  # pylint: disable=g-import-not-at-top
  import recompute_memory  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import plan_pricing  # pylint: disable=g-import-not-at-top
  size = mtf.convert_to_shape(case.mesh_shape).size
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      case.mesh_shape, case.layout_rules,
      [f"/cpu:{i}" for i in range(size)], share_replicas=False)
  with tf.Graph().as_default() as tf_graph:
    tf.compat.v1.train.get_or_create_global_step()
    lowering, graph, loss, ops = plan.lower_case(mtf, case, mesh_impl)
    out = lowering.export_to_tf_tensor(loss)
    profile = recompute_memory.live_bytes_profile(
        tf_graph, [out], ops, group_of=recompute_memory.device_index,
        category_of=_part_by_scope(graph))
    # The slice variables, in their slice dtype, are what a processor holds
    # (a tf.function step has no master copies).
    held = {"parameters": 0, "optimizer_slots": 0}
    for var in graph.all_variables:
      held["parameters" if var.trainable else "optimizer_slots"] += (
          mesh_impl.slice_size(var.shape) * var.slice_dtype.size)
  result = {}
  for order, groups in profile.items():
    best = None
    for device in range(size):
      live = groups.get(device, {"peak": 0, "at_peak": {}})
      figures = {"peak": live["peak"] + sum(held.values()), "device": device}
      for part in plan_pricing.MEMORY_PARTS:
        figures[part] = held.get(part, 0) + live["at_peak"].get(part, 0)
      if best is None or figures["peak"] > best["peak"]:
        best = figures
    best["unplaced"] = groups.get(None, {"peak": 0})["peak"]
    result[order] = best
  return result


def run_model(tf, mtf, name, args):
  """Prices and counts every plan of model `name`; prints a JSON line per
  plan and the model's summary; returns the summary."""
  model = make_model(name, args)
  cases = cases_of(name, model, args)
  if args.only:
    cases = [c for c in cases if args.only in c.label]
  bench_util.log(f"{name}: {len(cases)} plans, {model!r}")
  worst = dict.fromkeys(ORDERS, 0.0)
  worst_plan = dict.fromkeys(ORDERS)
  for case in cases:
    record = {"model": name, "plan": case.label,
              "mesh_shape": case.mesh_shape,
              "layout_rules": case.layout_rules, "zero": case.zero,
              "stages": case.structure.stages,
              "micro_batches": case.structure.micro_batches,
              "recompute_layers": case.structure.recompute_layers}
    try:
      memory = predicted_bytes(tf, case)
      counted = counted_bytes(tf, mtf, case)
    except Exception as e:  # pylint: disable=broad-except
      bench_util.log(f"  {case.label}: failed: {e!r:.300}")
      record["error"] = repr(e)[:300]
      bench_util.emit(record)
      continue
    record["predicted"] = {"peak": memory.total, **memory.as_dict()}
    for order in ORDERS:
      record[f"counted_{order}"] = counted[order]
      ratio = memory.total / counted[order]["peak"]
      record[f"ratio_{order}"] = bench_util.rounded(ratio)
      if abs(ratio - 1) >= worst[order]:
        worst[order], worst_plan[order] = abs(ratio - 1), case.label
    bench_util.log(f"  {case.label}: predicted {memory.total}, counted "
                   f"{counted['asap']['peak']} (asap) "
                   f"{counted['alap']['peak']} (alap): "
                   f"{record['ratio_asap']} {record['ratio_alap']}")
    bench_util.emit(record)
  out = {"model": name, "summary": True, "plans": len(cases)}
  for order in ORDERS:
    out[f"worst_error_{order}"] = bench_util.rounded(worst[order])
    out[f"worst_plan_{order}"] = worst_plan[order]
  bench_util.emit(out)
  return out


def main(argv):
  args = parse_args(argv)
  bench_util.configure_logical_cpus(NUM_DEVICES)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  mtf = _mtf()
  summaries = [run_model(tf, mtf, name, args)
               for name in args.models.split(",")]
  overall = {"summary": "overall", "models": [s["model"] for s in summaries]}
  for order in ORDERS:
    overall[f"worst_error_{order}"] = max(
        (s[f"worst_error_{order}"] for s in summaries), default=None)
  bench_util.emit(overall)


if __name__ == "__main__":
  main(sys.argv[1:])
