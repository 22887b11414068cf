"""Memory per processor of a Transformer under data-parallel sharding.

For an encoder-decoder Transformer with T5 base's sizes by default (d_model
768, d_ff 3072, 12 heads of 64, vocabulary 32128, 12 + 12 layers, relative
attention biases shared per stack, no position embeddings), prints the
bytes each processor holds at rest of

  parameters  the variables (float32)
  slots       the optimizer's slots (Adafactor, factored; Adam: m and v)
  gradients   the gradients the update consumes (after the all-reduce;
              with sharded updates, after the reduce-scatter)

under pure data parallelism (mesh "batch:N", layout "batch:batch") with
N = 8, 64 and 512 processors, for three regimes:

  plain       every processor holds everything whole
  update      mtf.shard_data_parallel(...): sharded weight updates
              (ZeRO-1/2): slots and gradients 1/N where a dimension divides
  parameters  shard_parameters=True (ZeRO-3): the parameters too

Everything is counted from the layouts: the model's variables come from the
library's own Transformer graph (built, never lowered), the shapes of slots
and sharded variables from an mtf graph with mtf.shard_data_parallel and the
real optimizer, and the bytes from `MeshImpl.slice_size` of each shape on
the mesh. A variable none of whose dimensions N divides stays whole (at
N = 512 the 32128 x 768 embedding does: neither size is a multiple of 512),
unless --uneven: then the layout allows uneven splits
(mtf.LayoutRules(..., allow_uneven=True)) and such a variable is sharded
too, padded to a multiple of N (the padding is counted).
Activations are not counted (they depend on batch and length, not on this).

Sharding needs some whole copies for a moment: at least the unreduced
local gradient of a variable before its reduce-scatter, and with sharded
parameters also its gathered value. `transient` counts these for the
largest sharded variable only (a lower bound: how many are alive at once
depends on the schedule), `peak` = total + transient.

It also prints, for each regime, N, optimizer and number of layers, the
largest d_model (a multiple of --d_model_step, with d_ff = 4 d_model and
heads of 64) whose peak (parameters + slots + gradients + transient) fits
--budget_gib per processor. One JSON line per configuration on stdout, and the same as
Markdown tables on stderr (unless --no_table).

  python benchmarks/zero_memory.py [--budget_gib 16] [--layers 12,24,48]
      [--uneven]
"""

import argparse
import functools
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

REGIMES = ("plain", "update", "parameters")
OPTIMIZERS = ("adafactor", "adam")
GIB = 1024 ** 3


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--d_model", type=int, default=768)
  p.add_argument("--d_ff", type=int, default=3072)
  p.add_argument("--num_heads", type=int, default=12)
  p.add_argument("--d_kv", type=int, default=64)
  p.add_argument("--vocab", type=int, default=32128)
  p.add_argument("--num_layers", type=int, default=12,
                 help="layers of each stack (encoder and decoder)")
  p.add_argument("--processors", default="8,64,512",
                 help="data-parallel processor counts N")
  p.add_argument("--optimizers", default=",".join(OPTIMIZERS))
  p.add_argument("--budget_gib", type=float, default=16.0,
                 help="per-processor budget for parameters, slots and "
                 "gradients")
  p.add_argument("--layers", default="12,24,48",
                 help="layer counts for the largest-model search")
  p.add_argument("--d_model_step", type=int, default=512,
                 help="d_model candidates are multiples of this (512 "
                 "keeps d_model and d_ff divisible by every N here)")
  p.add_argument("--no_search", action="store_true",
                 help="skip the largest-model search")
  p.add_argument("--no_table", action="store_true")
  p.add_argument("--uneven", action="store_true",
                 help="allow uneven splits: shard (padded) the variables "
                 "no dimension of which N divides")
  return p.parse_args(argv)


def model_variables(tf, mtf, d_model, d_ff, num_heads, d_kv, vocab,
                    num_layers):
  """(name, mtf.Shape) of every trainable variable of the Transformer.

  Built by the library (utils.build_model, "bitransformer") in an mtf graph
  that is never lowered, so no TF variable is created.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
  gin_dir = os.path.join(os.path.dirname(transformer.__file__), "gin")
  gin.clear_config()
  unknown = ["utils.run", "utils.serialize_num_microbatches"]
  gin.parse_config_file(os.path.join(gin_dir, "defaults.gin"),
                        skip_unknown=unknown)
  gin.parse_config([
      f"d_model = {d_model}", f"d_ff = {d_ff}", f"num_heads = {num_heads}",
      f"d_kv = {d_kv}", f"num_layers = {num_layers}",
      # As T5: relative position biases, one table per stack; no learned
      # positions.
      "SelfAttention.relative_attention_type = 'bias_shared'",
      "SelfAttention.relative_attention_num_buckets = 32",
      "Unitransformer.positional_embedding = False",
      "dropout_rate = 0.0"], skip_unknown=unknown)
  model = utils.build_model("bitransformer", input_vocab_size=vocab,
                            output_vocab_size=vocab)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", 1)
  length = mtf.Dimension("length", 4)
  tokens = mtf.ones(mesh, mtf.Shape([batch, length]), dtype=tf.int32)
  model.call_simple(inputs=tokens, targets=tokens, compute_loss=True,
                    mode="train",
                    variable_dtype=mtf.VariableDType(tf.float32))
  gin.clear_config()
  return [(v.name, v.shape) for v in graph.trainable_variables]


def mtf_optimizer(mtf, name):
  if name == "adafactor":
    return mtf.optimize.AdafactorOptimizer()
  if name == "adam":
    return mtf.optimize.AdamWeightDecayOptimizer(learning_rate=1e-4)
  raise ValueError(f"unknown optimizer {name!r}; choose from {OPTIMIZERS}")


@functools.lru_cache(maxsize=None)
def variable_bytes(shape_key, n, regime, optimizer, uneven=False):
  """Per-processor (parameter, slot, gradient) bytes of one variable.

  Counted from the layouts (see the module docstring): the variable, under
  mtf.shard_data_parallel for the sharded regimes, updated by the real
  optimizer in an mtf graph; every variable's and slot's `slice_size` on a
  "batch:N" mesh, and the gradient's in the shape the update consumes
  (the sharding's update shape when updates are sharded).

  Args:
    shape_key: ((dimension name, size), ...) of the variable.
    n: the number of data-parallel processors.
    regime: "plain", "update" or "parameters".
    optimizer: "adafactor" or "adam".
    uneven: whether the layout allows uneven (padded) splits.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  mesh_shape = f"batch:{n}"
  layout = mtf.LayoutRules([("batch", "batch")], allow_uneven=uneven)
  mesh_impl = mtf.mesh_impl.MeshImpl(mesh_shape, layout)
  shape = mtf.Shape([mtf.Dimension(name, size) for name, size in shape_key])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  sharding = None
  if regime != "plain":
    sharding = mtf.shard_data_parallel(
        mesh, mesh_shape, layout, shard_parameters=(regime == "parameters"))
  mtf.get_variable(mesh, "w", shape, initializer=tf.zeros_initializer())
  var = graph.trainable_variables[0]
  # Any tensor of the variable's (stored) shape stands for its gradient.
  mtf_optimizer(mtf, optimizer).apply_grads([var.outputs[0]], [var])
  four = 4  # float32 parameters, slots and gradients.
  params = sum(mesh_impl.slice_size(v.shape) for v in graph.trainable_variables)
  slots = sum(mesh_impl.slice_size(v.shape) for v in graph.all_variables
              if not v.trainable)
  grad_shape = sharding.update_shape(shape) if sharding else shape
  grads = mesh_impl.slice_size(grad_shape)
  return params * four, slots * four, grads * four


# Whole float32 copies of one variable that sharding still needs for a
# moment, per regime: the unreduced local gradient before its
# reduce-scatter; with sharded parameters also the gathered weight.
TRANSIENT_COPIES = {"plain": 0, "update": 1, "parameters": 2}


def model_bytes(variables, n, regime, optimizer, uneven=False):
  """Per-processor bytes {"parameters", "slots", "gradients", "total",
  "transient", "peak"}: at rest, then the least a step needs on top
  (TRANSIENT_COPIES of the largest variable sharding splits), then both."""
  totals = [0, 0, 0]
  largest = 0
  for _, shape in variables:
    key = tuple((d.name, d.size) for d in shape.dims)
    per_variable = variable_bytes(key, n, regime, optimizer, uneven)
    for i, b in enumerate(per_variable):
      totals[i] += b
    if per_variable[2] < 4 * shape.size:  # Its gradient is sharded.
      largest = max(largest, 4 * shape.size)
  transient = TRANSIENT_COPIES[regime] * largest
  return {"parameters": totals[0], "slots": totals[1],
          "gradients": totals[2], "total": sum(totals),
          "transient": transient, "peak": sum(totals) + transient}


def gib(x):
  return round(x / GIB, 3)


def largest_d_model(tf, mtf, args, num_layers, n, regime, optimizer,
                    variables_of):
  """The largest d_model (a multiple of d_model_step) that fits the budget,
  with d_ff = 4 d_model and heads of 64; None if the smallest does not."""
  step = args.d_model_step
  budget = args.budget_gib * GIB

  def fits(k):
    variables = variables_of(k * step, num_layers)
    return model_bytes(variables, n, regime, optimizer,
                       args.uneven)["peak"] <= budget

  if not fits(1):
    return None
  lo, hi = 1, 2
  while fits(hi):
    lo, hi = hi, hi * 2
  while hi - lo > 1:  # fits(lo), not fits(hi)
    mid = (lo + hi) // 2
    if fits(mid):
      lo = mid
    else:
      hi = mid
  return lo * step


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  if not hasattr(mtf, "shard_data_parallel"):
    raise SystemExit("zero_memory.py needs mtf.shard_data_parallel "
                     "(issue 26).")
  processors = [int(x) for x in args.processors.split(",")]
  optimizers = [o for o in args.optimizers.split(",") if o]

  @functools.lru_cache(maxsize=None)
  def variables_of(d_model, num_layers, d_ff=None, num_heads=None):
    return tuple(model_variables(
        tf, mtf, d_model, d_ff or 4 * d_model,
        num_heads or d_model // args.d_kv, args.d_kv, args.vocab,
        num_layers))

  variables = variables_of(args.d_model, args.num_layers, args.d_ff,
                           args.num_heads)
  count = sum(s.size for _, s in variables)
  bench_util.log(f"model: {len(variables)} variables, {count:,} parameters")
  rows = []
  for optimizer in optimizers:
    for n in processors:
      for regime in REGIMES:
        b = model_bytes(variables, n, regime, optimizer, args.uneven)
        record = {
            "benchmark": "zero_memory", "model": "t5_base_like",
            "d_model": args.d_model, "d_ff": args.d_ff,
            "num_heads": args.num_heads, "d_kv": args.d_kv,
            "vocab": args.vocab, "num_layers": args.num_layers,
            "parameters": count, "optimizer": optimizer, "processors": n,
            "sharding": regime, "uneven": args.uneven,
            **{f"{k}_bytes": v for k, v in b.items()},
            **{f"{k}_gib": gib(v) for k, v in b.items()},
        }
        bench_util.emit(record)
        rows.append(record)
  search = []
  if not args.no_search:
    for optimizer in optimizers:
      for num_layers in [int(x) for x in args.layers.split(",")]:
        for n in processors:
          for regime in REGIMES:
            d = largest_d_model(tf, mtf, args, num_layers, n, regime,
                                optimizer, variables_of)
            params = (sum(s.size for _, s in variables_of(d, num_layers))
                      if d else None)
            record = {
                "benchmark": "zero_memory", "search": "largest_d_model",
                "budget_gib": args.budget_gib, "optimizer": optimizer,
                "num_layers": num_layers, "processors": n,
                "sharding": regime, "uneven": args.uneven, "d_model": d,
                "d_ff": d and 4 * d, "num_heads": d and d // args.d_kv,
                "parameters": params}
            bench_util.emit(record)
            search.append(record)
  if not args.no_table:
    print_tables(rows, search, args)


def print_tables(rows, search, args):
  """Markdown tables on stderr (stdout keeps only the JSON lines)."""
  print = bench_util.log  # pylint: disable=redefined-builtin
  print()
  print(f"Per-processor GiB (parameters + slots + gradients = total; "
        "transient: whole copies of the largest sharded variable a step "
        "needs at least; peak = total + transient), "
        f"{args.num_layers}+{args.num_layers} layers, d_model "
        f"{args.d_model}, {rows[0]['parameters']:,} parameters"
        f"{', uneven splits (padded)' if args.uneven else ''}:")
  print()
  print("| optimizer | N | sharding | parameters | slots | gradients "
        "| total | transient | peak |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['optimizer']} | {r['processors']} | {r['sharding']} | "
          f"{r['parameters_gib']} | {r['slots_gib']} | "
          f"{r['gradients_gib']} | {r['total_gib']} | "
          f"{r['transient_gib']} | {r['peak_gib']} |")
  if search:
    print()
    print(f"Largest d_model (multiple of {args.d_model_step}, d_ff = 4 "
          f"d_model) whose peak fits {args.budget_gib} GiB per processor "
          "(parameters in billions):")
    print()
    regimes = " | ".join(REGIMES)
    print(f"| optimizer | layers | N | {regimes} |")
    print("|---|---|---|" + "---|" * len(REGIMES))
    by_key = {}
    for r in search:
      by_key.setdefault((r["optimizer"], r["num_layers"], r["processors"]),
                        []).append(r)
    for (optimizer, layers, n), rs in by_key.items():
      cells = " | ".join(
          "-" if r["d_model"] is None else
          f"{r['d_model']} ({r['parameters'] / 1e9:.2f}B)" for r in rs)
      print(f"| {optimizer} | {layers} | {n} | {cells} |")


if __name__ == "__main__":
  main()
