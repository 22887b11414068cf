"""Benchmark: how good is the layout the search picks, measured.

For each model (an MLP stack, the `tiny` Transformer LM, a tiny
Bitransformer and the tiny LM with mixture-of-experts layers) and mesh
([8], [2,4], [4,2], [2,2,2] on 8 logical CPUs, PlacementMeshImpl), it
enumerates every valid layout of the training step's graph (names split
over mesh dimensions, sizes divisible, no two names of one
tensor on one mesh dimension; a random sample of --max_layouts when there are more, fixed
seed, always including the picks and the shipped layouts), measures each
one's median step time (timed in interleaved rounds, see measure_all), and
prints one JSON line per model and mesh:

  time_pick_vs_best      measured time of the time-objective pick over the
                         best measured time (goal <= 1.10)
  memory_pick_vs_best    the same for the memory objective (the original's)
  gin_vs_best            the same for the layouts of layouts/*.gin that
                         apply to the mesh
  kendall_tau            rank agreement of predicted and measured times
                         over the measured layouts (goal >= 0.7)
  kendall_tau_repeat     the same between the medians of the even and the
                         odd rounds: how reproducible the measured ranking
                         itself is on this machine (no prediction can agree
                         with the measurement better than it agrees with
                         itself)
  memory_ratio           predicted peak bytes per processor over the counted
                         ones, for the time pick: the bytes alive at the
                         peak of the lowered step's TF graph run in the
                         order TF's executor runs it (every op as soon as
                         its inputs are ready; see
                         recompute_memory.peak_live_bytes) per processor,
                         plus its variables' slices (goal within 15%)
  memory_ratio_alap      the same with every op as late as its consumers
                         allow (a bound the other way: neither order is the
                         peak-minimizing one the prediction assumes)
  search_seconds         the time objective's search (calibration
                         excluded; goal <= 5 s for the Transformer)

The machine's constants come from auto_mtf.machine.load_or_calibrate
(measured once per mesh and cached). Slow: every layout is lowered, traced
and run; use --models, --meshes and --max_layouts to cut it down.

  python benchmarks/auto_layout.py [--models mlp,lm,bitransformer,moe]
      [--meshes 8,2x4,4x2,2x2x2] [--max_layouts 200] [--steps 10]
"""

import argparse
import json
import os
import random
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_DEVICES = 8
MODELS = ("mlp", "lm", "bitransformer", "moe")
MESHES = {"8": "all:8", "2x4": "batch:2;model:4", "4x2": "batch:4;model:2",
          "2x2x2": "outer:2;batch:2;model:2"}
GOALS = {"time_pick_vs_best": 1.10, "kendall_tau": 0.7,
         "memory_ratio_within": 0.15, "search_seconds_transformer": 5.0}
VOCAB = 256
MOE_GIN = [
    "transformer.make_layer_stack.layers = ["
    "@mesh_tensorflow.transformer.transformer_layers.SelfAttention, "
    "@mesh_tensorflow.transformer.moe.MoE1D]",
    "MoE1D.num_experts = 8", "MoE1D.hidden_size = 256",
    "MoE1D.group_size = 64"]


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default=",".join(MODELS))
  p.add_argument("--meshes", default=",".join(MESHES))
  p.add_argument("--max_layouts", type=int, default=200,
                 help="measured layouts per model and mesh (a sample)")
  p.add_argument("--steps", type=int, default=10,
                 help="timed steps of each layout (interleaved rounds)")
  p.add_argument("--chunk", type=int, default=25,
                 help="layouts traced and timed together")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--length", type=int, default=64)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--details", default="",
                 help="also append one JSON line per measured layout "
                      "(times and prediction) to this file")
  return p.parse_args(argv)


# ----------------------------------------------------------------- models


class Model:
  """Builds one training step's mtf graph: loss, gradients, updates."""

  def __init__(self, name, args):
    self.name = name
    self.args = args
    self._transformer = None

  def features(self, tf):
    """The step's input TF tensors (fixed random data)."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    rng = np.random.RandomState(0)
    a = self.args
    if self.name == "mlp":
      return {"x": tf.constant(rng.randn(a.batch * 4, 256).astype("float32"))}
    tokens = rng.randint(2, VOCAB, size=(a.batch, a.length)).astype("int32")
    features = {"targets": tf.constant(tokens)}
    if self.name == "bitransformer":
      features["inputs"] = tf.constant(tokens[:, ::-1].copy())
    return features

  def build(self, mtf, graph, mesh, features):
    """(loss, update operations) of one step in `graph` on `mesh`."""
    if self.name == "mlp":
      loss = self._mlp_loss(mtf, mesh, features["x"])
    else:
      loss = self._transformer_loss(mtf, mesh, features)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = mtf.optimize.AdafactorOptimizer(
        learning_rate=0.01).apply_grads(grads, variables)
    return loss, updates

  def _mlp_loss(self, mtf, mesh, x):
    batch = mtf.Dimension("batch", x.shape[0])
    io = mtf.Dimension("io", 256)
    hidden = mtf.Dimension("hidden", 1024)
    h = mtf.import_tf_tensor(mesh, x, mtf.Shape([batch, io]))
    for i in range(4):
      w1 = mtf.get_variable(mesh, f"w1_{i}", mtf.Shape([io, hidden]))
      w2 = mtf.get_variable(mesh, f"w2_{i}", mtf.Shape([hidden, io]))
      h = mtf.einsum([mtf.relu(mtf.einsum([h, w1], mtf.Shape(
          [batch, hidden]))), w2], mtf.Shape([batch, io]))
    return mtf.reduce_mean(mtf.square(h))

  def _transformer_loss(self, mtf, mesh, features):
    model, variable_dtype = self._transformer_model()
    from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
    a = self.args
    shape = mtf.Shape([mtf.Dimension("batch", a.batch),
                       mtf.Dimension("length", a.length)])
    targets = mtf.import_tf_tensor(mesh, features["targets"], shape)
    if self.name == "bitransformer":
      inputs = mtf.import_tf_tensor(mesh, features["inputs"], shape)
    else:
      inputs = transformer.autoregressive_inputs(targets)
    _, loss = model.call_simple(inputs=inputs, targets=targets,
                                compute_loss=True, mode="train",
                                variable_dtype=variable_dtype)
    return loss

  def _transformer_model(self):
    """The gin-built model (models/tiny.gin on defaults.gin), built once."""
    if self._transformer is None:
      import gin  # pylint: disable=g-import-not-at-top
      from mesh_tensorflow.transformer import moe  # pylint: disable=g-import-not-at-top,unused-import
      from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
      from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
      gin_dir = os.path.join(os.path.dirname(transformer.__file__), "gin")
      gin.clear_config()
      unknown = ["utils.run", "utils.serialize_num_microbatches"]
      files = ["defaults.gin"]
      if self.name == "bitransformer":
        files.append("models/bi_base.gin")
      files.append("models/tiny.gin")
      for name in files:
        gin.parse_config_file(os.path.join(gin_dir, name),
                              skip_unknown=unknown)
      gin.parse_config(
          ["utils.get_variable_dtype.activation_dtype = 'float32'",
           "dropout_rate = 0.0"] + (MOE_GIN if self.name == "moe" else []),
          skip_unknown=unknown)
      model_type = "bitransformer" if self.name == "bitransformer" else "lm"
      self._transformer = (utils.build_model(
          model_type, input_vocab_size=VOCAB, output_vocab_size=VOCAB,
          layout_rules="", mesh_shape=""), utils.get_variable_dtype())
    return self._transformer


# ------------------------------------------------------- search and layouts


def search_graph(tf, mtf, model):
  """The step's mtf graph built in a scratch TF graph, and its loss."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    loss, _ = model.build(mtf, graph, mesh, model.features(tf))
  return graph, loss


def gin_layouts(mesh_spec):
  """{name: rules} of the shipped layouts/*.gin that fit this mesh's
  dimension names (their mesh dimensions renamed onto ours by role)."""
  names = [d.split(":")[0] for d in mesh_spec.split(";")]
  layouts = {"single": ""}
  if names == ["all"]:
    layouts["dp"] = "batch:all;experts:all"
    layouts["mp"] = "d_ff:all;heads:all;vocab:all"
  if "batch" in names and "model" in names:
    layouts["dp_mp"] = ("batch:batch;d_ff:model;heads:model;vocab:model;"
                        "experts:batch")
  return layouts


def sample_layouts(all_layouts, must, cap, seed):
  """At most `cap` layouts: those in `must`, then a seeded sample."""
  chosen = list(dict.fromkeys(must))
  rest = [l for l in all_layouts if l not in set(chosen)]
  random.Random(seed).shuffle(rest)
  return chosen + rest[:max(cap - len(chosen), 0)]


def restrict(optimizer, rules):
  """`rules` without names the graph lacks, cannot split, or cannot split
  over that mesh dimension (a gin layout names more than a model has, and
  the tiny models' 4 heads do not split 8 ways)."""
  mtf = _mtf()
  validator = optimizer._layout_validator  # pylint: disable=protected-access
  return ";".join(f"{d}:{m}" for d, m in mtf.convert_to_layout_rules(rules)
                  if validator.is_valid_assignment(d, m))


# ------------------------------------------------------------- measuring


def make_step(tf, mtf, model, mesh_spec, layout, counters=None):
  """A tf.function running one training step under `layout`."""
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_spec, layout, [f"/cpu:{i}" for i in range(NUM_DEVICES)])
  features = model.features(tf)
  step_var = tf.Variable(0, dtype=tf.int64, name="global_step")

  def program():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    loss, updates = model.build(mtf, graph, mesh, features)
    lowering, ops = bench_util.lower_step(mtf, graph, mesh, mesh_impl,
                                          updates)
    if counters is not None:
      counters.update(lowering=lowering)
    return bench_util.loss_after_updates(tf, lowering, loss, ops)

  return bench_util.counted_step(tf, mtf, step_var, program)


def _warm_step(tf, mtf, model, mesh_spec, layout, args):
  """The traced, warmed-up step of `layout`, or None if it fails to lower."""
  try:
    step = make_step(tf, mtf, model, mesh_spec, layout)
    for _ in range(args.warmup):
      step().numpy()
  except Exception as e:  # pylint: disable=broad-except
    bench_util.log(f"{model.name} {mesh_spec} {layout!r}: {e!r:.200}")
    return None
  return step


def measure_all(tf, mtf, model, mesh_spec, layouts, anchor, args):
  """{layout: [step seconds]}: `args.steps` interleaved rounds per chunk.

  The machine's speed drifts (it is shared), so layouts are not timed one
  after the other: a chunk of `args.chunk` layouts is traced, then timed in
  rounds, one step of each layout per round, so that a slow spell slows
  them all alike. Every chunk also times `anchor`; a chunk's times are
  scaled by the anchor's median over all chunks divided by its median in
  that chunk, which puts chunks measured at different speeds on one scale.
  Layouts that fail to lower are left out.
  """
  import gc  # pylint: disable=g-import-not-at-top
  others = [l for l in layouts if l != anchor]
  size = max(args.chunk - 1, 1)
  chunks = [[anchor] + others[i:i + size]
            for i in range(0, max(len(others), 1), size)]
  raw, anchor_medians = [], []
  for chunk in chunks:
    steps = {}
    for layout in chunk:
      step = _warm_step(tf, mtf, model, mesh_spec, layout, args)
      if step is not None:
        steps[layout] = step
    if anchor not in steps:
      raise RuntimeError(f"{model.name} on {mesh_spec}: the anchor layout "
                         f"{anchor!r} does not run")
    times = {layout: [] for layout in steps}
    for _ in range(args.steps):
      for layout, step in steps.items():
        start = time.perf_counter()
        step().numpy()
        times[layout].append(time.perf_counter() - start)
    raw.append(times)
    anchor_medians.append(bench_util.median(times[anchor]))
    del steps
    gc.collect()
  overall = bench_util.median(anchor_medians)
  measured = {}
  for times, chunk_anchor in zip(raw, anchor_medians):
    scale = overall / chunk_anchor
    for layout, seconds in times.items():
      measured.setdefault(layout, []).extend(t * scale for t in seconds)
  return measured


def counted_peak_bytes(tf, mtf, model, mesh_spec, layout):
  """{"asap": bytes, "alap": bytes} per processor alive at the lowered
  step's peak in either order, plus the per-processor bytes of its
  variables."""
  import recompute_memory  # pylint: disable=g-import-not-at-top
  # Every processor holds its own copy of what it keeps (no shared
  # replicas), as the prediction counts per processor.
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_spec, layout, [f"/cpu:{i}" for i in range(NUM_DEVICES)],
      share_replicas=False)
  tf_graph = tf.Graph()
  with tf_graph.as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    loss, updates = model.build(mtf, graph, mesh, model.features(tf))
    lowering, ops = bench_util.lower_step(mtf, graph, mesh, mesh_impl,
                                          updates)
    out = lowering.export_to_tf_tensor(loss)
    peak = recompute_memory.peak_live_bytes(tf_graph, [out], ops)
    variable_bytes = sum(
        mesh_impl.slice_size(v.shape) * v.outputs[0].dtype.size
        for v in graph.all_variables)
  return {order: peak[order] / mesh_impl.size + variable_bytes
          for order in ("asap", "alap")}


def kendall_tau(xs, ys):
  """Kendall's tau-b of two equally long sequences."""
  concordant = discordant = ties_x = ties_y = 0
  n = len(xs)
  for i in range(n):
    for j in range(i + 1, n):
      dx = (xs[i] > xs[j]) - (xs[i] < xs[j])
      dy = (ys[i] > ys[j]) - (ys[i] < ys[j])
      if dx == 0 and dy == 0:
        continue
      if dx == 0:
        ties_x += 1
      elif dy == 0:
        ties_y += 1
      elif dx == dy:
        concordant += 1
      else:
        discordant += 1
  denominator = ((concordant + discordant + ties_x) *
                 (concordant + discordant + ties_y)) ** 0.5
  return (concordant - discordant) / denominator if denominator else None


def _mtf():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  return mtf


def run_case(tf, mtf, model, mesh_key, args):
  """One JSON line: model `model` on mesh `mesh_key`."""
  from mesh_tensorflow.auto_mtf import layout_optimizer  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import machine as machine_lib  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import memory_estimator  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.auto_mtf import valid_layouts  # pylint: disable=g-import-not-at-top
  mesh_spec = MESHES[mesh_key]
  constants = machine_lib.load_or_calibrate(mesh_spec)
  graph, loss = search_graph(tf, mtf, model)
  estimator = memory_estimator.MemoryEstimator(graph, mesh_spec, [loss])
  start = time.perf_counter()
  timed = layout_optimizer.LayoutOptimizer(estimator, objective="time",
                                           machine=constants)
  time_pick = timed.solve()
  search_seconds = time.perf_counter() - start
  memory_pick = layout_optimizer.LayoutOptimizer(estimator).solve()
  gins = {name: restrict(timed, rules)
          for name, rules in gin_layouts(mesh_spec).items()}
  everything = list(valid_layouts.enumerate_layouts(
      estimator.get_layout_validator(),
      timed.constraint_sets))
  layouts = sample_layouts(everything, [time_pick, memory_pick,
                                        *gins.values()],
                           args.max_layouts, args.seed)
  samples = measure_all(tf, mtf, model, mesh_spec, layouts, time_pick, args)
  measured = {l: bench_util.median(t) for l, t in samples.items()}
  # The measurement's own reproducibility: the rank agreement of the even
  # and the odd rounds' medians, the ceiling of any prediction's tau.
  halves = [[bench_util.median(samples[l][k::2]) for l in samples]
            for k in (0, 1)]
  best_layout = min(measured, key=measured.get)
  best = measured[best_layout]
  predicted = {l: timed.evaluate_step_seconds(l) for l in measured}
  order = sorted(measured, key=measured.get)
  for l in order:
    bench_util.log(f"  {model.name} {mesh_spec} {l!r}: measured "
                   f"{measured[l] * 1e3:.1f} ms, predicted "
                   f"{predicted[l] * 1e3:.1f} ms")
  if args.details:
    with open(args.details, "a") as f:
      for l in order:
        f.write(json.dumps({
            "model": model.name, "mesh": mesh_spec, "layout": l,
            "predicted_seconds": predicted[l], "seconds": samples[l]}) + "\n")
  predicted_peak = timed.evaluate_peak_memory(time_pick)
  counted_peak = counted_peak_bytes(tf, mtf, model, mesh_spec, time_pick)
  record = {
      "model": model.name, "mesh": mesh_spec,
      "valid_layouts": len(everything), "measured_layouts": len(measured),
      "time_pick": time_pick, "memory_pick": memory_pick,
      "best_measured": best_layout,
      "time_pick_vs_best": bench_util.rounded(
          bench_util.ratio(measured.get(time_pick), best)),
      "memory_pick_vs_best": bench_util.rounded(
          bench_util.ratio(measured.get(memory_pick), best)),
      "gin_vs_best": {name: bench_util.rounded(bench_util.ratio(
          measured.get(rules), best)) for name, rules in gins.items()},
      "kendall_tau": bench_util.rounded(kendall_tau(
          [predicted[l] for l in order], [measured[l] for l in order])),
      "kendall_tau_repeat": bench_util.rounded(kendall_tau(*halves)),
      "predicted_ms_time_pick": bench_util.rounded(
          predicted[time_pick] * 1e3 if time_pick in predicted else None),
      "measured_ms_time_pick": bench_util.rounded(
          measured[time_pick] * 1e3 if time_pick in measured else None),
      "measured_ms_best": bench_util.rounded(best * 1e3),
      "memory_ratio": bench_util.rounded(
          predicted_peak / counted_peak["asap"]),
      "memory_ratio_alap": bench_util.rounded(
          predicted_peak / counted_peak["alap"]),
      "search_seconds": bench_util.rounded(search_seconds, 2),
  }
  bench_util.emit(record)
  return record


def main(argv):
  args = parse_args(argv)
  bench_util.configure_logical_cpus(NUM_DEVICES)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  mtf = _mtf()
  for name in args.models.split(","):
    model = Model(name, args)
    for mesh_key in args.meshes.split(","):
      run_case(tf, mtf, model, mesh_key, args)


if __name__ == "__main__":
  main(sys.argv[1:])
