"""Benchmark: pipeline parallelism (mtf.pipeline, PipelinedLayerStack).

A decoder-only Transformer LM (--blocks blocks of a self-attention and a
feed-forward layer, d_model 128, d_ff 512 (--d_model, --d_ff), 4 heads of 32, byte vocabulary,
batch 64 x length 64, Adafactor, dropout off) trains on 8 logical CPUs,
PlacementMeshImpl, unpipelined and pipelined:

  dp8            LayerStack, mesh batch:8 (data parallelism)
  dp2_mp4        LayerStack, mesh batch:2;model:4 (d_ff, heads, vocab on
                 model)
  s<S>_m<M>[_recompute|_batched]
                 PipelinedLayerStack of S stages and M micro-batches on
                 mesh stage:S;batch:8/S (rules stage:stage;batch:batch),
                 with GPipe's recomputation, or with batched weight
                 gradients (one einsum per weight over all micro-batches),
                 or neither

One JSON line per case, all from one run:

  tokens_per_second       batch x length over the median step time; steps
                          are timed in interleaved rounds (one step of each
                          case per round), so the shared machine's slow
                          spells slow them all alike
  vs_unpipelined          the median over rounds of the best unpipelined
                          case's step time over this case's (goal with
                          M = 4S: >= 0.8)
  cpu_vs_unpipelined      the median over rounds of this case's CPU time
                          (all threads) over the best unpipelined case's:
                          more work, or more waiting
  bubble_counted          1 - busy/total stage slots of the lowered
                          program's iterations (the lowering's
                          pipeline/* counters)
  bubble_expected         GPipe's (S-1)/(M+S-1)
  stack_weight_fraction   the bytes of the layer stack's weights each
                          processor holds over the whole stack's (goal:
                          at most 1/S + 5%)
  activation_mb           bytes alive at the peak of the lowered step's TF
                          graph, run as TF's executor runs it (every op as
                          soon as its inputs are ready), per processor, in
                          MB, variables excluded (see
                          recompute_memory.peak_live_bytes)
  max_loss_difference     the largest difference of the first steps'
                          losses from dp8's (the same model: pipelining
                          changes no answer)

  python benchmarks/pipeline.py [--steps 10] [--blocks 8]
      [--cases dp8,dp2_mp4,s2_m8,s4_m16,s4_m16_recompute,s4_m16_batched,
       s4_m4,s8_m32]
"""

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_DEVICES = 8
VOCAB = 256
D_MODEL, D_FF, HEADS, D_KV = 128, 512, 4, 32
MODEL_RULES = "d_ff:model;heads:model;vocab:model"
UNPIPELINED = {
    "dp8": ("batch:8", "batch:batch"),
    "dp2_mp4": ("batch:2;model:4", "batch:batch;" + MODEL_RULES),
}
CASES = ("dp8", "dp2_mp4", "s2_m8", "s4_m16", "s4_m16_recompute",
         "s4_m16_batched", "s4_m4", "s8_m32")


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--cases", default=",".join(CASES))
  p.add_argument("--steps", type=int, default=10,
                 help="timed rounds (one step of every case per round)")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--blocks", type=int, default=8,
                 help="blocks of self-attention and feed-forward (stage "
                 "counts divide it)")
  p.add_argument("--d_model", type=int, default=D_MODEL)
  p.add_argument("--d_ff", type=int, default=D_FF)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--length", type=int, default=64)
  return p.parse_args(argv)


def _mtf():
  bench_util.configure_logical_cpus(NUM_DEVICES)
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  return mtf


def parse_case(name):
  """(mesh, layout, stages, micro-batches, recompute, batched weight
  gradients) of a case name."""
  if name in UNPIPELINED:
    return UNPIPELINED[name] + (1, 1, False, False)
  parts = name.split("_")
  stages, micro = int(parts[0][1:]), int(parts[1][1:])
  mesh = f"stage:{stages}"
  layout = "stage:stage"
  if NUM_DEVICES // stages > 1:
    mesh += f";batch:{NUM_DEVICES // stages}"
    layout += ";batch:batch"
  return mesh, layout, stages, micro, "recompute" in parts, "batched" in parts


def make_model(args, stages, micro, recompute, batched):
  """The LM with a LayerStack, or a PipelinedLayerStack of `stages`."""
  from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import transformer_layers  # pylint: disable=g-import-not-at-top
  stack = transformer.make_layer_stack(
      [[transformer_layers.SelfAttention,
        {"num_heads": HEADS, "key_value_size": D_KV}],
       [transformer_layers.DenseReluDense, {"hidden_size": args.d_ff}]],
      num_layers=args.blocks)
  if stages > 1:
    stack = transformer.PipelinedLayerStack(
        stack.layers, num_stages=stages, num_microbatches=micro,
        recompute_grads=recompute, batch_weight_gradients=batched)
  return transformer.Unitransformer(
      stack, d_model=args.d_model, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, max_length=args.length,
      name="decoder")


def build_step(mtf, tf, model, args, tokens):
  """(loss, update operations) of one training step."""
  from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  shape = mtf.Shape([mtf.Dimension("batch", args.batch),
                     mtf.Dimension("length", args.length)])
  targets = mtf.import_tf_tensor(mesh, tokens, shape)
  _, loss = model.call_simple(
      inputs=transformer.autoregressive_inputs(targets), targets=targets,
      compute_loss=True, mode="train",
      variable_dtype=mtf.VariableDType(tf.float32, tf.float32, tf.float32))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = mtf.optimize.AdafactorOptimizer(
      learning_rate=0.01).apply_grads(grads, variables)
  return graph, mesh, loss, updates


def _impl(mtf, mesh_spec, layout, **kwargs):
  return mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_spec, layout, [f"/cpu:{i}" for i in range(NUM_DEVICES)], **kwargs)


def make_step(mtf, tf, name, args, tokens):
  """A tf.function running one training step of case `name`."""
  mesh_spec, layout, stages, micro, recompute, batched = parse_case(name)
  model = make_model(args, stages, micro, recompute, batched)
  impl = _impl(mtf, mesh_spec, layout)
  step_var = tf.Variable(0, dtype=tf.int64, name="global_step")

  def program():
    graph, mesh, loss, updates = build_step(mtf, tf, model, args, tokens)
    lowering, ops = bench_util.lower_step(mtf, graph, mesh, impl, updates)
    return bench_util.loss_after_updates(tf, lowering, loss, ops)

  return bench_util.counted_step(tf, mtf, step_var, program)


def static_figures(mtf, tf, name, args, tokens):
  """Counted figures of one case's lowered step (no run)."""
  import recompute_memory  # pylint: disable=g-import-not-at-top
  mesh_spec, layout, stages, micro, recompute, batched = parse_case(name)
  model = make_model(args, stages, micro, recompute, batched)
  # Every processor holds its own copy of what it keeps.
  impl = _impl(mtf, mesh_spec, layout, share_replicas=False)
  tf_graph = tf.Graph()
  with tf_graph.as_default():
    graph, mesh, loss, updates = build_step(
        mtf, tf, model, args, tf.constant(tokens.numpy()))
    lowering, ops = bench_util.lower_step(mtf, graph, mesh, impl, updates)
    out = lowering.export_to_tf_tensor(loss)
    peak = recompute_memory.peak_live_bytes(tf_graph, [out], ops)
    counters = dict(lowering.counters)
  stack = [v for v in graph.trainable_variables
           if "block_" in v.name or v.member_names]
  full = sum(v.size for v in stack)
  held = sum(impl.slice_size(v.shape) for v in stack)
  slots = counters.get("pipeline/stage_slots", 0)
  figures = {
      "mesh": mesh_spec, "layout": layout, "stages": stages,
      "microbatches": micro if stages > 1 else None,
      "recompute": recompute, "batch_weight_gradients": batched,
      "stack_weight_fraction": bench_util.rounded(held / full, 4),
      "activation_mb": bench_util.rounded(peak["asap"] / impl.size / 2**20),
  }
  if stages > 1:
    figures.update(
        iterations=counters.get("pipeline/iterations"),
        bubble_counted=bench_util.rounded(
            1 - counters.get("pipeline/busy_slots", 0) / slots, 4),
        bubble_expected=bench_util.rounded(
            mtf.strategies.pipelining.bubble_fraction(stages, micro), 4),
        stack_weight_goal=bench_util.rounded(1.05 / stages, 4))
  return figures


def main(argv):
  args = parse_args(argv)
  mtf = _mtf()
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  names = args.cases.split(",")
  rng = np.random.RandomState(0)
  tokens = tf.constant(rng.randint(2, VOCAB, size=(args.batch, args.length))
                       .astype("int32"))
  figures = {name: static_figures(mtf, tf, name, args, tokens)
             for name in names}
  steps, first_seconds = {}, {}
  for name in names:
    start = time.perf_counter()
    steps[name] = make_step(mtf, tf, name, args, tokens)
    first = float(steps[name]().numpy())
    first_seconds[name] = time.perf_counter() - start
    figures[name]["first_loss"] = first
    bench_util.log(f"{name}: first step {first_seconds[name]:.1f} s, "
                   f"loss {first:.5f}")
  timed = bench_util.interleaved_times(steps, args.steps, args.warmup)
  medians = {n: bench_util.median(timed[n]["times_ms"]) for n in names}
  baselines = [n for n in names if n in UNPIPELINED]
  best = min(baselines, key=medians.get) if baselines else None
  reference = figures.get("dp8", {}).get("first_loss")
  for name in names:
    ms = medians[name]
    record = {"benchmark": "pipeline", "case": name, **figures[name],
              "blocks": args.blocks, "d_model": args.d_model,
              "d_ff": args.d_ff, "batch": args.batch,
              "length": args.length, "steps": args.steps,
              "median_step_ms": bench_util.rounded(ms, 1),
              "tokens_per_second": bench_util.rounded(
                  args.batch * args.length / (ms / 1000.0), 0),
              "first_step_seconds": bench_util.rounded(first_seconds[name], 1),
              "best_unpipelined": best}
    if best is not None:
      record["vs_unpipelined"] = bench_util.rounded(bench_util.paired_ratio(
          timed[best]["times_ms"], timed[name]["times_ms"]))
      # Whether the difference is work (CPU seconds of all threads) or
      # waiting (the cores idle part of the step).
      record["cpu_vs_unpipelined"] = bench_util.rounded(
          bench_util.paired_ratio(timed[name]["cpu_ms"],
                                  timed[best]["cpu_ms"]))
    if reference is not None:
      record["max_loss_difference"] = bench_util.rounded(
          abs(figures[name]["first_loss"] - reference), 6)
    del record["first_loss"]
    bench_util.emit(record)


if __name__ == "__main__":
  main(sys.argv[1:])
