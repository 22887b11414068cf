"""Benchmark: the run planner under a budget that rules out the plain plans.

Issue 49's feasibility check. For each model of --models (the dense stack,
the tiny Transformer LM and encoder-decoder) on --num_processors logical
CPUs:

1. the predicted peak bytes per processor (plan_pricing.price) of plain
   data parallelism (the batch split over a 1-D mesh of every processor)
   and of plain model parallelism (the model's dimensions split, the batch
   not: the smallest peak of the layouts `plain_layouts` lists), both
   without ZeRO, recompute or stages;
2. a budget below both: --fraction of the smaller;
3. mtf.auto_mtf.plan under that budget;
4. the pick: whether it is one of the plain plans, its predicted peak and
   its counted peak (benchmarks/plan.py's counted_bytes, the method of
   benchmarks/recompute_memory.py: the buffers alive at each processor's
   peak of the lowered step, run as soon and as late as possible), and
   whether each is within the budget (the plain plans' peaks are counted
   too, to show whether the budget rules them out as counted);
5. its losses over --steps training steps against the plain model's on
   one processor (`loss_rel_diff`, the largest relative difference).

One JSON line per model. Where no plan fits, the line carries the
planner's paragraph. --smallest_peak also plans with a budget nothing fits,
to record the smallest peak the planner reaches (the budget must be above
it).

  python benchmarks/plan_feasibility.py [--models dense,lm,bi]
      [--num_processors 8] [--fraction 0.8] [--machine FILE]
"""

import argparse
import os
import re
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

MODELS = ("dense", "lm", "bi")
# The tiny Transformers' gin bindings (float32 and SGD: the losses of any
# layout agree with one processor's to round-off).
TRANSFORMER_PARAMS = (
    "d_model = 32", "d_ff = 128", "num_heads = 8", "d_kv = 4",
    "num_layers = 2", "dropout_rate = 0.0",
    "utils.get_variable_dtype.activation_dtype = 'float32'",
    "utils.get_variable_dtype.master_dtype = 'float32'",
    "utils.get_variable_dtype.slice_dtype = 'float32'",
    "utils.run.optimizer = @optimize.SgdOptimizer",
    "utils.run.learning_rate_schedule = 0.1")
TRANSFORMER_FILES = {"lm": "models/lm_base.gin", "bi": "models/bi_base.gin"}


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default=",".join(MODELS))
  p.add_argument("--num_processors", type=int, default=8)
  p.add_argument("--fraction", type=float, default=0.8,
                 help="the budget: this fraction of the smaller plain peak")
  p.add_argument("--steps", type=int, default=3,
                 help="training steps whose losses are compared")
  p.add_argument("--machine", default=None,
                 help="machine constants (a JSON file or text); default: "
                 "this machine's, measured once and cached")
  p.add_argument("--smallest_peak", action="store_true",
                 help="also plan with a budget nothing fits, to record the "
                 "smallest peak the planner reaches")
  p.add_argument("--no_count", action="store_true",
                 help="skip the counted memory")
  return p.parse_args(argv)


def _mtf():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  return mtf


# ----------------------------------------------------------------- models


def make_model(name, layers=2, batch=256, io=64, hidden=128,
               optimizer="adam"):
  """The PlanModel called `name`: "dense" (a dense stack whose plain plans
  do not fit the budget: Adam's slots make data parallelism's peak big, and
  its batch model parallelism's), "lm" or "bi" (tiny Transformers, trained
  on random tokens)."""
  if name == "dense":
    from mesh_tensorflow.auto_mtf import dense_stack_model  # pylint: disable=g-import-not-at-top
    return dense_stack_model.DenseStackModel(
        num_layers=layers, batch=batch, io=io, hidden=hidden,
        optimizer=optimizer, seed=0)
  if name in TRANSFORMER_FILES:
    from tests import this_checkout  # pylint: disable=g-import-not-at-top
    this_checkout.import_transformer()
    from mesh_tensorflow.transformer import plan_gin  # pylint: disable=g-import-not-at-top
    model = plan_gin.from_gin([TRANSFORMER_FILES[name]],
                              list(TRANSFORMER_PARAMS), batch_size=16,
                              sequence_length=16, vocab_size=64)
    # Zeros are all padding (every loss 0): random tokens instead.
    model.feature_values = lambda: _tokens(model.feature_shapes, 64)
    return model
  raise ValueError(f"Unknown model {name!r}; known: {', '.join(MODELS)}.")


def _tokens(shapes, vocab_size, seed=0):
  """{feature: tf.constant of random ids in [1, vocab_size)}."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  return {k: tf.constant(rng.randint(1, vocab_size, size=shape)
                         .astype(np.int32))
          for k, shape in sorted(shapes.items())}


def plain_layouts(name, num_processors):
  """{"data_parallel": [(mesh, rules)], "model_parallel": [...]}: the
  plain plans of model `name` (no ZeRO, recompute or stages). Data
  parallelism splits the batch over a 1-D mesh of every processor; model
  parallelism splits model dimensions (on 1-D and 2-D meshes), not the
  batch."""
  n = num_processors
  one = f"mesh_0:{n}"
  two = [f"mesh_0:{a};mesh_1:{n // a}" for a in range(2, n) if n % a == 0]
  if name == "dense":
    model = ([(one, "hidden:mesh_0"), (one, "io:mesh_0")] +
             [(m, r) for m in two
              for r in ("io:mesh_0;hidden:mesh_1",
                        "hidden:mesh_0;io:mesh_1")])
  else:
    megatron = "d_ff:{0};heads:{0};vocab:{0}"
    model = ([(one, megatron.format("mesh_0")), (one, "d_model:mesh_0")] +
             [(m, "d_model:mesh_0;" + megatron.format("mesh_1"))
              for m in two])
  return {"data_parallel": [(one, "batch:mesh_0")], "model_parallel": model}


# ---------------------------------------------------------------- pricing


def predicted_memory(model, mesh_shape, layout_rules, zero="none",
                     structure=None):
  """The plan_pricing.PeakMemory of a plan of `model`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import plan_pricing  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import plan_space  # pylint: disable=g-import-not-at-top
  structure = structure or plan_space.Structure()
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    graph, outputs = model.build(structure, zero, mesh_shape, layout_rules)
  _, memory = plan_pricing.price(graph, outputs, mesh_shape, layout_rules)
  return memory


def smallest_plain(model, layouts):
  """(peak bytes, mesh, rules) of the plain layout with the smallest
  predicted peak (layouts that do not divide the model's sizes left
  out)."""
  mtf = _mtf()
  peaks = []
  for mesh, rules in layouts:
    try:
      peaks.append((predicted_memory(model, mesh, rules).total, mesh, rules))
    except mtf.IndivisibleError as e:
      bench_util.log(f"{mesh} [{rules}]: {e}")
  return min(peaks)


def kind(plan_or_case):
  """"data_parallel", "model_parallel", "replicated" for a plain plan (no
  ZeRO, recompute or stages), else "other"; of anything with structure,
  zero, mesh_shape and layout_rules (mtf objects or strings)."""
  import plan as plan_bench  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import plan_space  # pylint: disable=g-import-not-at-top
  mtf = _mtf()
  p = plan_or_case
  if p.structure != plan_space.Structure() or p.zero != "none":
    return "other"
  mesh = mtf.convert_to_shape(plan_bench._text(p.mesh_shape))  # pylint: disable=protected-access
  rules = dict(mtf.convert_to_layout_rules(
      plan_bench._text(p.layout_rules)))  # pylint: disable=protected-access
  split = {d.name for d in mesh.dims if d.size > 1}
  rules = {t: m for t, m in rules.items() if m in split}
  if not rules:
    return "replicated"
  if "batch" not in rules:
    return "model_parallel"
  if set(rules) == {"batch"} and split == {rules["batch"]}:
    return "data_parallel"
  return "other"


def smallest_planned_peak(model, num_processors, machine):
  """The smallest peak the planner reaches (bytes), from the paragraph of
  a plan with a budget nothing fits; None if the paragraph has none."""
  from mesh_tensorflow.auto_mtf import planner  # pylint: disable=g-import-not-at-top
  try:
    planner.plan(model, num_processors, memory_budget=1, machine=machine)
  except planner.PlanError as e:
    found = re.search(r"smallest peak any plan reaches is [^(]*\((\d+) bytes",
                      str(e))
    return int(found.group(1)) if found else None
  return None


# ---------------------------------------------------------------- running


def losses(model, case_fields, steps, name="model"):
  """The losses of `steps` training steps of a plan (structure, mesh,
  rules, zero) on this process's logical CPUs."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import plan as plan_bench  # pylint: disable=g-import-not-at-top
  structure, mesh, rules, zero = case_fields
  step = plan_bench.make_step(tf, _mtf(), plan_bench.Case(
      name, model, structure, mesh, rules, zero))
  return [float(step()) for _ in range(steps)]


def rel_diff(values, reference):
  return max(abs(a - b) / max(abs(b), 1e-12)
             for a, b in zip(values, reference))


def feasibility(name, model, num_processors, machine, fraction=0.8,
                steps=3, count=True, count_plain=False, smallest_peak=False):
  """The record of one model: the plain peaks, the budget, the pick and
  its figures (see the module).

  Args:
    name, model: the model's name (plain_layouts) and PlanModel.
    num_processors: N.
    machine: the planner's machine constants (None: this machine's).
    fraction: the budget, as a fraction of the smaller plain peak.
    steps: training steps compared with one processor's (0: none).
    count: count the pick's peak; count_plain: the plain plans' too.
    smallest_peak: record the smallest peak the planner reaches.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import plan as plan_bench  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import plan_space  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import planner  # pylint: disable=g-import-not-at-top
  mtf = _mtf()
  layouts = plain_layouts(name, num_processors)
  dp = smallest_plain(model, layouts["data_parallel"])
  mp = smallest_plain(model, layouts["model_parallel"])
  budget = int(fraction * min(dp[0], mp[0]))
  record = {"model": name, "num_processors": num_processors,
            "model_repr": repr(model) if name == "dense" else name,
            "data_parallel": {"peak_bytes": dp[0], "mesh_shape": dp[1],
                              "layout_rules": dp[2]},
            "model_parallel": {"peak_bytes": mp[0], "mesh_shape": mp[1],
                               "layout_rules": mp[2]},
            "budget": budget}
  if count_plain:
    for key, (_, mesh, rules) in (("data_parallel", dp),
                                  ("model_parallel", mp)):
      counted = plan_bench.counted_bytes(tf, mtf, plan_bench.Case(
          name, model, plan_space.Structure(), mesh, rules, "none"))
      record[key]["counted_peak_bytes"] = {s: counted[s]["peak"]
                                           for s in ("asap", "alap")}
  if smallest_peak:
    record["smallest_planned_peak"] = smallest_planned_peak(
        model, num_processors, machine)
  start = time.perf_counter()
  try:
    pick = planner.plan(model, num_processors, memory_budget=budget,
                        machine=machine)
  except planner.PlanError as e:
    record["error"] = str(e)
    return record
  record["plan_seconds"] = bench_util.rounded(time.perf_counter() - start, 2)
  fields = (pick.structure, plan_bench._text(pick.mesh_shape),  # pylint: disable=protected-access
            plan_bench._text(pick.layout_rules), pick.zero)  # pylint: disable=protected-access
  record["pick"] = {
      "mesh_shape": fields[1], "layout_rules": fields[2], "zero": pick.zero,
      "stages": pick.structure.stages,
      "micro_batches": pick.structure.micro_batches,
      "recompute_layers": pick.structure.recompute_layers,
      "kind": kind(pick), "predicted_step_seconds": pick.step_time.total,
      "predicted_peak_bytes": pick.memory.total,
      "predicted_bytes_split": pick.memory.as_dict()}
  record["predicted_fits"] = pick.memory.total <= budget
  record["alternatives"] = [
      {"mesh_shape": a.mesh_shape, "layout_rules": a.layout_rules,
       "zero": a.zero, "structure": a.structure.describe(),
       "step_seconds": a.step_seconds, "peak_bytes": a.peak_bytes,
       "reason": a.reason} for a in pick.alternatives]
  if count:
    counted = plan_bench.counted_bytes(
        tf, mtf, plan_bench.Case(name, model, *fields))
    record["counted_peak_bytes"] = {s: counted[s]["peak"]
                                    for s in ("asap", "alap")}
    record["counted_bytes"] = counted
    record["counted_fits"] = max(record["counted_peak_bytes"].values()) <= (
        budget)
  if steps:
    got = losses(model, fields, steps, name)
    one = losses(model, (plan_space.Structure(), "all:1", "", "none"), steps,
                 name)
    record["losses"] = got
    record["one_processor_losses"] = one
    record["loss_rel_diff"] = rel_diff(got, one)
  return record


def _machine(text):
  if text is None:
    return None
  from mesh_tensorflow.auto_mtf import machine as machine_lib  # pylint: disable=g-import-not-at-top
  if os.path.exists(text):
    with open(text) as f:
      text = f.read()
  return machine_lib.machine_constants(text)


def main(argv):
  args = parse_args(argv)
  bench_util.configure_logical_cpus(args.num_processors)
  machine = _machine(args.machine)
  for name in args.models.split(","):
    bench_util.log(f"{name}: planning on {args.num_processors} processors")
    record = feasibility(name, make_model(name), args.num_processors,
                         machine, args.fraction, args.steps,
                         count=not args.no_count,
                         count_plain=not args.no_count,
                         smallest_peak=args.smallest_peak)
    bench_util.emit(record)


if __name__ == "__main__":
  main(sys.argv[1:])
