"""Benchmark: training throughput of the `tiny` Transformer language model.

Model (models/tiny.gin on defaults.gin): decoder-only, d_model 128, d_ff 512,
4 heads of 32, 2 layers, byte vocabulary (256), learned positions (512),
shared embedding and softmax, RMS norms, dropout 0.1, z-loss 1e-4,
Adafactor; batch 32 x length 128 of random bytes.

Cases, one JSON line each, all from one run:
  keras      the same architecture and parameter count in Keras 3, a
             tf.function train step, one device
  mtf_1      this project, PlacementMeshImpl on a 1-processor mesh
  mtf_2x4    this project on 8 logical CPUs, mesh batch:2;model:4 with
             d_ff, heads and vocab on model (PlacementMeshImpl)
  mtf_2x4_simd  the same on SimdMeshImpl (one traced program per device,
             TF collectives)
  mtf_2x4_moe  the same LM with each feed-forward layer a mixture of
             experts (MoE1D: 8 experts of hidden 512, top-2 gating, groups
             of 64 tokens), the experts split over the batch mesh
             dimension (`experts:batch`): the dispatch is an all-to-all,
             whose calls and bytes per step come from the lowering's
             counters; compared with the dense mtf_2x4
  mtf_8      pure data parallelism: mesh batch:8, layout batch:batch
             (placement); target >= 0.9x mtf_1's tokens/s
  mtf_8_shard_update, mtf_8_shard_params, mtf_2x4_shard_update,
  mtf_2x4_shard_params
             mtf_8 and mtf_2x4 with mtf.shard_data_parallel: weight
             updates (and slots) sharded over the batch's mesh dimension,
             or the parameters too (ZeRO-3); compared with their unsharded
             case (throughput_vs_mtf_8 / _mtf_2x4)
  binary     the training binary (python -m mesh_tensorflow.transformer.main)
             on the tiny encoder-decoder of `make demo` (addition task,
             mesh batch:2;model:4, batch 64 x length 8, --binary_steps
             steps): tokens/s over the whole process, start-up included,
             next to utils.run called in this process on the same
             configuration (library_tiny: with its start-up, and steady
             after the first loop)
  original   the original Mesh TensorFlow 0.1.21 on TensorFlow 2.15 through
             its own utils.run (train mode, start-up included), run in its
             own virtual environment (benchmarks/original/make_venv.sh);
             skipped when that environment is missing. Right after it,
             mtf_1_like_original times mtf_1 the same way (build, trace and
             --original_steps steps), and the original's line gives both
             ratios: with start-up and steady state.
Keras and the mtf cases take turns step by step, so machine load hits them
alike; ratios are medians of per-round ratios. Each line gives tokens/s
(steady state, from the median step), the first step's time (start-up:
tracing, lowering, compiling) and tokens/s over all steps with start-up.

  python benchmarks/transformer_step.py [--steps 30] [--cases ...]
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
D_MODEL, D_FF, HEADS, D_KV, LAYERS, MAX_LENGTH = 128, 512, 4, 32, 2, 512
DROPOUT, Z_LOSS = 0.1, 1e-4
CASES = ("keras", "mtf_1", "mtf_2x4", "mtf_2x4_simd", "mtf_2x4_moe",
         "mtf_8", "mtf_8_shard_update", "mtf_8_shard_params",
         "mtf_2x4_shard_update", "mtf_2x4_shard_params", "original", "binary")
# Data-parallel sharding of the mtf cases (mtf.shard_data_parallel).
SHARDING = {"mtf_8_shard_update": "update", "mtf_8_shard_params": "parameters",
            "mtf_2x4_shard_update": "update",
            "mtf_2x4_shard_params": "parameters"}
# mtf_2x4_moe: MoE1D in place of every DenseReluDense of models/tiny.gin.
MOE_GIN = [
    "transformer.make_layer_stack.layers = ["
    "@mesh_tensorflow.transformer.transformer_layers.SelfAttention, "
    "@mesh_tensorflow.transformer.moe.MoE1D]",
    "MoE1D.num_experts = 8", "MoE1D.hidden_size = 512",
    "MoE1D.group_size = 64"]
# Targets from the issue: mtf_1 >= 0.9x Keras; mtf_1 >= 1.2x the original;
# mtf_2x4 >= 0.9x mtf_1 with a first step under 5 s; (issue 26) mtf_8, pure
# data parallelism, >= 0.9x mtf_1.
TARGETS = {"mtf_1_vs_keras": 0.9, "mtf_1_vs_original": 1.2,
           "mtf_2x4_vs_mtf_1": 0.9, "mtf_2x4_first_step_s": 5.0,
           "mtf_8_vs_mtf_1": 0.9}


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--cases", default=",".join(CASES))
  bench_util.add_timing_args(p, steps=30, warmup=3)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--length", type=int, default=128)
  p.add_argument("--dropout", type=float, default=DROPOUT,
                 help="dropout rate of every dropout (tiny.gin: 0.1)")
  p.add_argument("--original_steps", type=int, default=300)
  p.add_argument("--binary_steps", type=int, default=300)
  p.add_argument("--original_python", default=os.path.join(
      os.path.dirname(_HERE), ".venv-original", "bin", "python"),
                 help="python of the original's environment")
  return p.parse_args(argv)


def random_batch(np, args, seed=0):
  return np.random.RandomState(seed).randint(
      2, VOCAB, size=(args.batch, args.length)).astype(np.int32)


def make_keras_step(tf, keras, args):
  """A Keras decoder-only LM like `tiny`, and its tf.function train step."""
  layers = keras.layers

  class LearnedPositions(layers.Layer):
    """Adds a learned embedding of each position (a MAX_LENGTH table)."""

    def build(self, input_shape):
      self.table = self.add_weight(shape=(MAX_LENGTH, D_MODEL),
                                   initializer="random_normal", name="table")

    def call(self, x):
      return x + self.table[None, :keras.ops.shape(x)[1]]

  tokens = keras.Input((args.length,), dtype="int32")
  embedding = layers.Embedding(VOCAB, D_MODEL, name="embedding")

  def rms_norm():
    return layers.RMSNormalization(epsilon=1e-6)

  x = LearnedPositions()(embedding(tokens))
  x = layers.Dropout(args.dropout)(x)
  for _ in range(LAYERS):
    h = rms_norm()(x)
    h = layers.MultiHeadAttention(HEADS, D_KV, use_bias=False,
                                  dropout=args.dropout)(h, h, use_causal_mask=True)
    x = x + layers.Dropout(args.dropout)(h)
    h = rms_norm()(x)
    h = layers.Dense(D_FF, activation="relu", use_bias=False)(h)
    h = layers.Dropout(args.dropout)(h)
    h = layers.Dense(D_MODEL, use_bias=False)(h)
    x = x + layers.Dropout(args.dropout)(h)
  x = layers.Dropout(args.dropout)(rms_norm()(x))
  model = keras.Model(tokens, x)
  optimizer = keras.optimizers.Adafactor(learning_rate=0.01)

  @tf.function
  def step(inputs, targets):
    with tf.GradientTape() as tape:
      hidden = model(inputs, training=True)
      logits = tf.einsum("bld,vd->blv", hidden,
                         embedding.embeddings) * D_MODEL ** -0.5
      log_z = tf.reduce_logsumexp(logits, axis=-1)
      xent = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)
      loss = tf.reduce_mean(xent + Z_LOSS * tf.square(log_z))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  count = sum(int(tf.size(v)) for v in model.trainable_variables)
  return step, count


def make_mtf_step(tf, mtf, args, mesh_shape, layout, impl="placement",
                  gin_params=(), counters=None, sharding=None, vocab=VOCAB,
                  on_lowering=None):
  """This project's `tiny` LM (as models/tiny.gin builds it), one step.

  `gin_params` are bound after models/tiny.gin; `counters`, a dict, gets the
  lowering's counters (collective calls and bytes of one step) when traced.
  `sharding`: None, "update" (weight updates sharded over the batch's mesh
  dimension) or "parameters" (ZeRO-3), through mtf.shard_data_parallel.
  `vocab`: the vocabulary size (tokens of the batch stay below VOCAB);
  `on_lowering`: optional fn(graph, mesh_impl) called once when traced.
  """
  from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
  if impl == "simd":
    mesh_impl = mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, layout)
  else:
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  step_var = tf.Variable(0, dtype=tf.int64, name="global_step")
  batch_dim = mtf.Dimension("batch", args.batch)
  length_dim = mtf.Dimension("length", args.length)

  def build_model():
    # As the binary will: defaults.gin, then models/tiny.gin, float32
    # activations (CPU), the dropout rate; `utils.run` comes with issue 15.
    import gin  # pylint: disable=g-import-not-at-top
    from mesh_tensorflow.transformer import moe  # pylint: disable=g-import-not-at-top,unused-import
    from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
    gin_dir = os.path.join(os.path.dirname(transformer.__file__), "gin")
    gin.clear_config()
    unknown = ["utils.run", "utils.serialize_num_microbatches"]
    for name in ("defaults.gin", "models/tiny.gin"):
      gin.parse_config_file(os.path.join(gin_dir, name),
                            skip_unknown=unknown)
    gin.parse_config([
        "utils.get_variable_dtype.activation_dtype = 'float32'",
        f"dropout_rate = {args.dropout}", *gin_params], skip_unknown=unknown)
    return utils.build_model("lm", input_vocab_size=vocab,
                             output_vocab_size=vocab, layout_rules=layout,
                             mesh_shape=mesh_shape), utils.get_variable_dtype()

  model, variable_dtype = build_model()

  def program(targets):
    with mtf.global_step.global_step_scope(step_var):
      graph, mesh = bench_util.new_mesh(mtf, "my_mesh", mesh_shape, layout,
                                        sharding)
      mtf_targets = mtf.import_tf_tensor(
          mesh, targets, mtf.Shape([batch_dim, length_dim]))
      inputs = transformer.autoregressive_inputs(mtf_targets)
      _, loss = model.call_simple(
          inputs=inputs, targets=mtf_targets, compute_loss=True,
          mode="train", variable_dtype=variable_dtype)
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      updates = mtf.optimize.AdafactorOptimizer(
          learning_rate=0.01).apply_grads(grads, variables)
      lowering, ops = bench_util.lower_step(mtf, graph, mesh, mesh_impl,
                                            updates)
      if counters is not None:
        counters.clear()
        counters.update(lowering.counters)
      if on_lowering is not None:
        on_lowering(graph, mesh_impl)
      return bench_util.loss_after_updates(tf, lowering, loss, ops)

  @tf.function(autograph=False)  # No Python control flow on tensors.
  def step(targets):
    if impl == "simd":
      # One traced program, run on every device.
      loss = mesh_impl.run(program, targets)
    else:
      loss = program(targets)
    with tf.control_dependencies([loss]):
      step_var.assign_add(1)
    return tf.identity(loss)

  return step


def communication_record(counters):
  """Collective calls and bytes of one step (forward and backward), by
  kind, from the lowering's counters ("comm/<kind>/<mesh axes>/...")."""
  record = {}
  for key, value in counters.items():
    parts = key.split("/")
    if parts[0] != "comm" or parts[-1] not in ("calls", "bytes"):
      continue
    field = f"{parts[1]}_{parts[-1]}_per_step"
    record[field] = record.get(field, 0) + value
  return dict(sorted(record.items()))


def time_like_original(tf, mtf, args, tokens):
  """mtf_1 timed as the original is: building the model, tracing and
  `original_steps` steps, start-up included, and steady state after the
  first step."""
  start = time.perf_counter()
  step = make_mtf_step(tf, mtf, args, "all:1", "", "placement")
  targets = tf.constant(tokens)
  float(step(targets))
  first_done = time.perf_counter()
  for _ in range(args.original_steps - 1):
    loss = step(targets)
  float(loss)
  end = time.perf_counter()
  tokens_per_step = args.batch * args.length
  return {
      "steps": args.original_steps,
      "seconds_total": bench_util.rounded(end - start, 2),
      "tokens_per_second_with_startup": bench_util.rounded(
          args.original_steps * tokens_per_step / (end - start), 1),
      "tokens_per_second_steady": bench_util.rounded(
          (args.original_steps - 1) * tokens_per_step / (end - first_done),
          1)}


def run_original(args):
  if not os.path.exists(args.original_python):
    bench_util.log(f"no original environment at {args.original_python}; "
                   "make it with benchmarks/original/make_venv.sh")
    return None
  records, error = bench_util.run_json_child(
      [args.original_python, os.path.join(_HERE, "original", "train_tiny.py"),
       "--steps", str(args.original_steps), "--batch", str(args.batch),
       "--length", str(args.length)], timeout=1800)
  if error or not records:
    bench_util.log(f"the original failed: {error}")
    return None
  return records[-1]


_DEMO_GIN = ["models/bi_base.gin", "models/tiny.gin", "problems/addition.gin",
             "layouts/2x2_dp_mp.gin", "addition_demo.gin"]


def _binary_argv(model_dir, steps):
  return ([f"--model_dir={model_dir}", "--noprogress", "--verbosity=-1"] +
          [f"--gin_file={f}" for f in _DEMO_GIN] +
          [f"--gin_param=utils.run.train_steps = {steps}",
           "--gin_param=utils.run.save_checkpoints_steps = 100000"])


def run_binary_cases(args):
  """The binary in a child process, then utils.run in this one."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  tokens = args.binary_steps * 64 * 8
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "mesh_tensorflow.transformer.main"] +
        _binary_argv(os.path.join(tmp, "binary"), args.binary_steps),
        check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    binary_s = time.perf_counter() - start

    from absl import flags  # pylint: disable=g-import-not-at-top
    import gin  # pylint: disable=g-import-not-at-top
    from mesh_tensorflow.transformer import main as main_lib  # pylint: disable=g-import-not-at-top

    class Clock:
      first = None

      def after_loop(self, step, loss):
        del loss
        if self.first is None:
          self.first = (step, time.perf_counter())

    clock = Clock()
    flags.FLAGS(["main"] + _binary_argv(os.path.join(tmp, "library"),
                                        args.binary_steps))
    gin.clear_config()
    main_lib.utils.parse_gin_defaults_and_flags()
    start = time.perf_counter()
    main_lib.utils.run(tpu_job_name=None, tpu=None, gcp_project=None,
                       tpu_zone=None, model_dir=os.path.join(tmp, "library"),
                       train_hooks=[clock])
    end = time.perf_counter()
    first_step, first_time = clock.first
  library = {
      "benchmark": "transformer_step", "case": "library_tiny",
      "steps": args.binary_steps,
      "tokens_per_second_with_startup": bench_util.rounded(
          tokens / (end - start), 1),
      "tokens_per_second_steady": bench_util.rounded(
          (args.binary_steps - first_step) * 64 * 8 / (end - first_time), 1),
      "seconds_total": bench_util.rounded(end - start, 2)}
  bench_util.emit(library)
  bench_util.emit({
      "benchmark": "transformer_step", "case": "binary",
      "steps": args.binary_steps, "seconds_total": bench_util.rounded(
          binary_s, 2),
      "tokens_per_second_with_startup": bench_util.rounded(
          tokens / binary_s, 1),
      "vs_library_with_startup": bench_util.rounded(
          tokens / binary_s / library["tokens_per_second_with_startup"])})


def main(argv=None):
  args = parse_args(argv)
  cases = args.cases.split(",")
  bench_util.configure_logical_cpus(NUM_DEVICES)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  tokens = random_batch(np, args)
  inputs = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], 1)
  tokens_per_step = args.batch * args.length
  fns, first_ms = {}, {}
  if "keras" in cases:
    keras_step, params = make_keras_step(tf, keras, args)
    bench_util.log(f"keras model: {params} parameters")
    t_in, t_out = tf.constant(inputs), tf.constant(tokens)
    fns["keras"] = lambda: keras_step(t_in, t_out)
  two_d = ("batch:2;model:4", "batch:batch;d_ff:model;heads:model;vocab:model")
  moe_2d = (two_d[0], two_d[1] + ";experts:batch;expert_hidden:model")
  data_8 = ("batch:8", "batch:batch")
  counters = {}
  for case, (mesh_shape, layout), impl, gin_params in (
      ("mtf_1", ("all:1", ""), "placement", ()),
      ("mtf_2x4", two_d, "placement", ()),
      ("mtf_2x4_simd", two_d, "simd", ()),
      ("mtf_2x4_moe", moe_2d, "placement", MOE_GIN),
      ("mtf_8", data_8, "placement", ()),
      ("mtf_8_shard_update", data_8, "placement", ()),
      ("mtf_8_shard_params", data_8, "placement", ()),
      ("mtf_2x4_shard_update", two_d, "placement", ()),
      ("mtf_2x4_shard_params", two_d, "placement", ())):
    if case not in cases:
      continue
    if case in SHARDING and not hasattr(mtf, "shard_data_parallel"):
      bench_util.log(f"[{case}] unavailable: no mtf.shard_data_parallel")
      bench_util.emit({"benchmark": "transformer_step", "case": case,
                       "unavailable": "mtf.shard_data_parallel is not in "
                                      "this checkout"})
      continue
    counters[case] = {}
    step = make_mtf_step(tf, mtf, args, mesh_shape, layout, impl,
                         gin_params, counters[case], SHARDING.get(case))
    t_targets = tf.constant(tokens)
    fns[case] = (lambda s=step, t=t_targets: s(t))
  for name, fn in fns.items():
    start = time.perf_counter()
    bench_util.timed_call(fn)
    first_ms[name] = (time.perf_counter() - start) * 1000.0
  runs = (bench_util.interleaved_times(fns, args.steps, warmup=args.warmup)
          if fns else {})
  medians = {n: bench_util.median(r["times_ms"]) for n, r in runs.items()}
  for name, r in runs.items():
    total_s = (first_ms[name] + sum(r["times_ms"])) / 1000.0
    record = {
        "benchmark": "transformer_step", "case": name,
        "tokens_per_step": tokens_per_step,
        "median_step_ms": bench_util.rounded(medians[name], 2),
        "tokens_per_second": bench_util.rounded(
            tokens_per_step / medians[name] * 1000.0, 1),
        "first_step_s": bench_util.rounded(first_ms[name] / 1000.0, 2),
        "tokens_per_second_with_startup": bench_util.rounded(
            tokens_per_step * (len(r["times_ms"]) + 1) / total_s, 1),
        "loss_first_last": [bench_util.rounded(r["results"][0], 3),
                            bench_util.rounded(r["results"][-1], 3)],
    }
    if name != "keras" and "keras" in runs:
      record["throughput_vs_keras"] = bench_util.rounded(1.0 / bench_util.paired_ratio(
          r["times_ms"], runs["keras"]["times_ms"]))
    if name.startswith("mtf_") and name != "mtf_1" and "mtf_1" in runs:
      record["throughput_vs_mtf_1"] = bench_util.rounded(1.0 / bench_util.paired_ratio(
          r["times_ms"], runs["mtf_1"]["times_ms"]))
    if name == "mtf_2x4_moe" and "mtf_2x4" in runs:
      record["throughput_vs_dense_mtf_2x4"] = bench_util.rounded(
          1.0 / bench_util.paired_ratio(r["times_ms"],
                                        runs["mtf_2x4"]["times_ms"]))
    for base in ("mtf_8", "mtf_2x4"):
      if name.startswith(base + "_shard") and base in runs:
        record[f"throughput_vs_{base}"] = bench_util.rounded(
            1.0 / bench_util.paired_ratio(r["times_ms"],
                                          runs[base]["times_ms"]))
    if name in SHARDING:
      record["sharding"] = SHARDING[name]
    if name in counters:
      record.update(communication_record(counters[name]))
    bench_util.emit(record)
  if "original" in cases:
    original = run_original(args)
    if original is not None:
      original["benchmark"] = "transformer_step"
      original["case"] = "original"
      if "mtf_1" in medians:
        # This project run the same way, right after the original.
        ours = time_like_original(tf, mtf, args, tokens)
        bench_util.emit(dict(benchmark="transformer_step",
                             case="mtf_1_like_original", **ours))
        for basis in ("with_startup", "steady"):
          original[f"mtf_1_vs_original_{basis}"] = bench_util.rounded(
              ours[f"tokens_per_second_{basis}"] /
              original[f"tokens_per_second_{basis}"])
      original["targets"] = TARGETS
      bench_util.emit(original)
  if "binary" in cases:
    run_binary_cases(args)


if __name__ == "__main__":
  main()
