"""Benchmark: the cost of an uneven split (a vocabulary of 259 on model:4).

The `tiny` Transformer LM of transformer_step.py (d_model 128, d_ff 512, 4
heads, 2 layers, Adafactor; batch 32 x length 128) trained with a vocabulary
of 256 (even: 4 slices of 64) and of 259 (uneven: 4 slices of 65, the last
with one row of padding, LayoutRules(..., allow_uneven=True)), with
`Unitransformer.vocab_divisor = 1` (by default the model itself rounds
vocabularies up to a multiple of 128, which hides the question), on

  model:4    vocab, d_ff and heads split 4 ways (PlacementMeshImpl)
  b:2;m:4    the batch split 2 ways too (8 logical CPUs)

Both vocabularies see the same batches (tokens below 256), so tokens/s per
useful token compare directly: `ratio_vs_even` is the uneven case's
tokens/s over the even one's (goal >= 0.95), the median of per-round ratios
(the two take turns step by step, so machine load hits them alike).
`padding` gives the padding's bytes (the padded tensors minus the logical
ones, each replica once): in the variables (the embedding and its
Adafactor slots) and over every other tensor of the step (an upper bound
on activations: not all are alive at once), with percentages, from
`mtf.padding_report`.

  python benchmarks/uneven.py [--steps 30]
"""

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position
import transformer_step  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_DEVICES = 8
MESHES = {"model:4": "vocab:model;d_ff:model;heads:model",
          "b:2;m:4": "batch:b;vocab:m;d_ff:m;heads:m"}
GOAL = 0.95


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  bench_util.add_timing_args(p, steps=30, warmup=3)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--length", type=int, default=128)
  p.add_argument("--meshes", default=",".join(MESHES))
  p.add_argument("--uneven_vocab", type=int, default=259)
  args = p.parse_args(argv)
  args.dropout = transformer_step.DROPOUT
  return args


def padding_record(report):
  """The padding's bytes (4 per element: every tensor of this model is
  float32 or int32) and percent, in variables and in all other tensors."""
  record = {"dimensions": {d.name: f"{d.size}->{d.padded_size}"
                           for d in report.dimensions}}
  for kind, logical, padded in (
      ("variables", report.variable_elements,
       report.padded_variable_elements),
      ("activations", report.activation_elements,
       report.padded_activation_elements)):
    record[f"{kind}_padding_bytes"] = 4 * (padded - logical)
    record[f"{kind}_padding_percent"] = bench_util.rounded(
        100.0 * (padded - logical) / max(logical, 1), 2)
  return record


def main(argv=None):
  args = parse_args(argv)
  bench_util.configure_logical_cpus(NUM_DEVICES)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  targets = tf.constant(transformer_step.random_batch(np, args))
  tokens_per_step = args.batch * args.length
  for mesh_shape in args.meshes.split(","):
    rules = MESHES[mesh_shape]
    reports = {}

    def keep_report(graph, mesh_impl, vocab):
      mesh = graph.operations[0].mesh
      reports[vocab] = mtf.padding_report(graph, {mesh: mesh_impl},
                                          verbose=False)

    steps = {}
    for vocab in (transformer_step.VOCAB, args.uneven_vocab):
      layout = mtf.LayoutRules(mtf.convert_to_layout_rules(rules).pairs,
                               allow_uneven=True)
      # vocab_divisor 1: the model must not round 259 up itself (to 384).
      steps[vocab] = transformer_step.make_mtf_step(
          tf, mtf, args, mesh_shape, layout, vocab=vocab,
          gin_params=["Unitransformer.vocab_divisor = 1"],
          on_lowering=lambda g, impl, v=vocab: keep_report(g, impl, v))
    fns = {v: (lambda s=steps[v]: float(s(targets))) for v in steps}
    times = bench_util.interleaved_times(fns, args.steps, args.warmup)
    even = times[transformer_step.VOCAB]["times_ms"]
    uneven = times[args.uneven_vocab]["times_ms"]
    even_tps = tokens_per_step / (bench_util.median(even) / 1e3)
    uneven_tps = tokens_per_step / (bench_util.median(uneven) / 1e3)
    # Time per step even / uneven = tokens/s uneven / even.
    ratio = bench_util.paired_ratio(even, uneven)
    report = reports[args.uneven_vocab]
    bench_util.emit({
        "benchmark": "uneven", "mesh": mesh_shape, "layout": rules,
        "vocab_even": transformer_step.VOCAB,
        "vocab_uneven": args.uneven_vocab,
        "tokens_per_second_even": bench_util.rounded(even_tps, 1),
        "tokens_per_second_uneven": bench_util.rounded(uneven_tps, 1),
        "ratio_vs_even": bench_util.rounded(ratio),
        "goal": GOAL, "meets_goal": ratio >= GOAL,
        "padding": padding_record(report),
        "steps": args.steps})


if __name__ == "__main__":
  main()
