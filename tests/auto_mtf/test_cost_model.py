"""The cost model counts what the lowering does, without lowering.

Real training graphs (an MLP stack with every optimizer, a tiny
Transformer LM with Adafactor and Adam, with and without sharded weight
updates) are lowered, not run, on both mesh implementations; the cost
model's collectives per (kind, mesh dimensions) must equal the lowering's
counters exactly, calls and wire bytes. FLOPs are checked against counts
made by hand.
"""

import math
import random
import time

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import global_step
from mesh_tensorflow.auto_mtf import cost_model
from tests import sharding_training
from tests.transformer import model_testing

def _mlp_optimizers():
  opt = mtf.optimize
  return [("sgd/", opt.SgdOptimizer(0.1)),
          ("adam/", opt.AdamWeightDecayOptimizer(0.01)),
          ("adafactor/", opt.AdafactorOptimizer(min_dim_size_to_factor=8))]


def _mlp_loss(mesh):
  """sharding_training's MLP stack, one copy per optimizer above."""
  st = sharding_training
  x = mtf.import_tf_tensor(mesh, tf.constant(st.X), [st.BATCH, st.D_IN])
  y = mtf.import_tf_tensor(mesh, tf.constant(st.Y), [st.BATCH, st.D_OUT])
  losses = []
  for prefix, _ in _mlp_optimizers():
    with tf.compat.v1.variable_scope(prefix.rstrip("/")):
      w1 = mtf.get_variable(mesh, "w1", [st.D_IN, st.D_FF])
      b1 = mtf.get_variable(mesh, "b1", [st.D_FF],
                            initializer=tf.zeros_initializer())
      w2 = mtf.get_variable(mesh, "w2", [st.D_FF, st.D_OUT])
    h = mtf.relu(mtf.einsum([x, w1], [st.BATCH, st.D_FF]) + b1)
    out = mtf.einsum([h, w2], [st.BATCH, st.D_OUT])
    losses.append(mtf.reduce_mean(mtf.square(out - y)))
  return mtf.add_n(losses)


def _lm_optimizers():
  return [("", mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=8))]


def _lm_loss(mesh):
  return model_testing.lm_loss(model_testing.make_lm(), mesh)


def _hand_loss(mesh):
  """Reshapes that all-to-all and all-concatenate, a split softmax, a
  shift across processors, a split max and control dependencies."""
  a, b, c, d = (mtf.Dimension(n, s) for n, s in
                (("a", 4), ("b", 8), ("c", 8), ("d", 4)))
  w = mtf.get_variable(mesh, "w", [a, b])
  x = mtf.reshape(w * 2.0, [c, d])  # "a:m" to "d:m": all-to-all.
  x = mtf.shift(x, 3, c, wrap=True) + mtf.shift(x, 1, c, wrap=False)
  s = mtf.softmax(x, d)
  z = mtf.reduce_max(mtf.rename_dimension(x, "d", "e"))  # all-concat.
  # depend passes a pending sum on, and waits for one without reducing it.
  q = mtf.depend(mtf.reduce_sum(x, reduced_dim=c),
                 [mtf.reduce_sum(x * 3.0, reduced_dim=c)])
  return mtf.reduce_sum(s * s) + z + mtf.reduce_sum(q)


def _ops_loss(mesh):
  """A convolution, top_k, cumsum, unstack and a halo exchange, each over
  split dims."""
  b, h, w, c, o, fh, fw, k, n, u = (
      mtf.Dimension(name, size) for name, size in (
          ("b", 4), ("h", 6), ("w", 6), ("c", 4), ("o", 8), ("fh", 3),
          ("fw", 3), ("k", 2), ("n", 8), ("u", 2)))
  x = mtf.get_variable(mesh, "x", [b, h, w, c])
  y = mtf.conv2d(x, mtf.get_variable(mesh, "f", [fh, fw, c, o]),
                 strides=[1, 1, 1, 1], padding="SAME")
  v = mtf.get_variable(mesh, "v", [b, n])
  values, _ = mtf.top_k(v, n, k)
  sums = mtf.cumsum(v, n)
  parts = mtf.unstack(mtf.get_variable(mesh, "u", [b, u]), u)
  blocks, block = mtf.Dimension("blocks", 2), mtf.Dimension("block", 4)
  halo = mtf.halo_exchange(mtf.get_variable(mesh, "z", [blocks, block, c]),
                           blocks, block, 1)
  return mtf.add_n([mtf.reduce_sum(y * y), mtf.reduce_sum(values),
                    mtf.reduce_sum(sums * sums),
                    mtf.reduce_sum(halo * halo)] +
                   [mtf.reduce_sum(p * p) for p in parts])


def _pipe_loss(mesh):
  """A residual MLP of 4 stages through mtf.pipeline (4 micro-batches):
  shifts between stages, the feed and the collection over the stages."""
  stage, batch, d, hidden = (mtf.Dimension(n, s) for n, s in
                             (("stage", 4), ("batch", 8), ("d", 4),
                              ("hidden", 8)))
  x = mtf.get_variable(mesh, "x", [batch, d])

  def stage_fn(xs):
    w1 = mtf.get_variable(mesh, "w1", [stage, d, hidden])
    w2 = mtf.get_variable(mesh, "w2", [stage, hidden, d])
    h = mtf.relu(mtf.einsum([xs[0], w1], xs[0].shape - d + hidden))
    return [xs[0] + mtf.einsum([h, w2], xs[0].shape)]

  y = mtf.pipeline(stage_fn, x, stage, 4)
  return mtf.reduce_sum(y * y)


_MODELS = {
    "mlp": (_mlp_loss, _mlp_optimizers),
    "pipe": (_pipe_loss, lambda: [("", mtf.optimize.SgdOptimizer(0.1))]),
    "lm": (_lm_loss, _lm_optimizers),
    "hand": (_hand_loss, lambda: [("", mtf.optimize.SgdOptimizer(0.1))]),
    "ops": (_ops_loss, lambda: [("", mtf.optimize.SgdOptimizer(0.1))]),
}

_2D_LM = "batch:batch;d_ff:model;heads:model;vocab:model"
# (model, mesh shape, layout rules, sharding, on SIMD too).
_CASES = [
    ("mlp", "b:8", "batch:b", "none", True),
    ("mlp", "b:2;m:4", "batch:b;d_ff:m", "none", False),
    ("mlp", "b:2;m:2;n:2", "batch:b;d_ff:m;d_out:n", "update", True),
    ("mlp", "b:2;m:4", "batch:b;d_ff:m", "parameters", False),
    ("lm", "batch:8", "batch:batch", "none", False),
    ("lm", "batch:2;model:4", _2D_LM, "update", True),
    ("lm", "a:2;b:2;c:2", "batch:a;heads:b;d_ff:b;vocab:c", "none", False),
    # Splits that reshape, shift, gather and scatter across the mesh.
    ("lm", "a:2;b:2;c:2", "length:a;heads:b;d_kv:c", "none", True),
    ("hand", "m:4;n:2", "a:m;d:m;c:n", "none", True),
    ("ops", "m:2;q:2", "c:m;n:q;blocks:q", "none", True),
    ("ops", "m:2;q:2", "b:m;o:q", "none", False),
    ("ops", "m:2;q:2", "o:m;u:q", "none", False),
    # Split spatial dimensions: the convolution's windows (halo receives,
    # or a gather over 2) and its gradients'.
    ("ops", "m:3;q:2", "h:m;w:q", "none", False),
    # A pipeline: stages handed over between neighbours.
    ("pipe", "s:4", "stage:s", "none", True),
    ("pipe", "s:4;m:2", "stage:s;hidden:m", "none", False),
]


def _build(model, mesh_shape, layout, sharding):
  """The mtf graph of a training step (loss, gradients, updates)."""
  make_loss, make_optimizers = _MODELS[model]
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  sharding_training.shard(mesh, mesh_shape, layout, sharding)
  loss = make_loss(mesh)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  optimizers = make_optimizers()
  groups = {}
  for var, grad in zip(variables, grads):
    # pylint: disable-next=protected-access
    optimizer = sharding_training._optimizer_for(var.name, optimizers)
    group = groups.setdefault(id(optimizer), (optimizer, [], []))
    group[1].append(grad)
    group[2].append(var)
  for optimizer, group_grads, group_vars in groups.values():
    optimizer.apply_grads(group_grads, group_vars)
  return graph, mesh


def _lower_placement(case):
  model, mesh_shape, layout, sharding, _ = case
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  with tf.Graph().as_default():
    graph, mesh = _build(model, mesh_shape, layout, sharding)
    counters = dict(mtf.Lowering(graph, {mesh: impl}).counters)
  return graph, counters


def _lower_simd(case):
  """Traces (does not run) the SPMD program of one processor."""
  model, mesh_shape, layout, sharding, _ = case
  impl = mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, layout)
  out = {}

  def program():
    graph, mesh = _build(model, mesh_shape, layout, sharding)
    out["graph"] = graph
    out["counters"] = dict(mtf.Lowering(graph, {mesh: impl}).counters)

  step = tf.Variable(0, dtype=tf.int64, trainable=False)
  with global_step.global_step_scope(step):
    impl.trace_program(program)
  return out["graph"], out["counters"]


_LOWERED = {}


def _lowered(case, impl_name):
  key = (case, impl_name)
  if key not in _LOWERED:
    lower = _lower_placement if impl_name == "placement" else _lower_simd
    _LOWERED[key] = lower(case)
  return _LOWERED[key]


def _case_id(case):
  return "-".join(c.replace(";", "_").replace(":", "") for c in case[:4])


def _lowering_cases():
  for case in _CASES:
    for impl_name in ("placement", "simd") if case[-1] else ("placement",):
      yield pytest.param(case, impl_name, id=f"{_case_id(case)}-{impl_name}")


@pytest.mark.parametrize("case,impl_name", list(_lowering_cases()))
def test_collectives_equal_the_lowerings_counters(case, impl_name):
  _, mesh_shape, layout, _, _ = case
  graph, counters = _lowered(case, impl_name)
  want = cost_model.counted_collectives(counters)
  assert want, "the layout should communicate"
  got = cost_model.graph_cost(graph, mesh_shape, layout).collectives
  assert got == want


def test_cases_cover_every_kind_of_collective():
  kinds = set()
  for case in _CASES:
    graph, _ = _lowered(case, "placement")
    kinds.update(k for k, _ in cost_model.graph_cost(
        graph, case[1], case[2]).collectives)
  assert kinds == {"allreduce", "reduce_scatter", "allconcat", "alltoall",
                   "receive"}


@pytest.mark.parametrize("case", [c for c in _CASES if c[0] == "lm"],
                         ids=[_case_id(c) for c in _CASES if c[0] == "lm"])
def test_graph_cost_is_the_sum_of_operation_costs(case):
  """Each operation costed alone, from the names `cost_dimension_names`
  lists (as the layout search sees it), adds up to the graph's cost."""
  graph, _ = _lowered(case, "placement")
  sizes = {d.name: d.size for d in mtf.convert_to_shape(case[1])}
  rules = mtf.convert_to_layout_rules(case[2])
  total = cost_model.OperationCost.zero()
  for op in graph.operations:
    names = cost_model.cost_dimension_names(op)
    own = {d.name for t in op.inputs + op.outputs for d in t.shape}
    assert own <= names
    assignment = {n: rules.mesh_dimension_for(n) for n in names
                  if rules.mesh_dimension_for(n) in sizes}
    total += cost_model.operation_cost(op, assignment, sizes)
  assert total == cost_model.graph_cost(graph, case[1], case[2]).total


def _signature_groups(graph):
  """Lists of the operations that share cost names and cost signature."""
  groups = {}
  for op in cost_model.all_operations(graph):
    key = (cost_model.cost_dimension_names(op), cost_model.cost_signature(op))
    groups.setdefault(key, []).append(op)
  return list(groups.values())


def assert_signature_groups_cost_alike(graph, sizes, **cost_kwargs):
  """Operations sharing a cost signature cost the same under random
  assignments (seeded) of their dimensions to the mesh's: the layout
  search prices one per signature. `cost_kwargs` go to operation_cost."""
  rng = random.Random(0)
  for ops in _signature_groups(graph):
    names = sorted(cost_model.cost_dimension_names(ops[0]))
    for _ in range(4 if len(ops) > 1 else 0):
      assignment = {}
      for name in names:
        m = rng.choice(list(sizes) + [None])
        if m is not None:
          assignment[name] = m
      want = cost_model.operation_cost(ops[0], assignment, sizes,
                                       **cost_kwargs)
      for op in ops[1:]:
        assert cost_model.operation_cost(
            op, assignment, sizes, **cost_kwargs) == want, (
                op.name, ops[0].name, assignment)


@pytest.mark.parametrize(
    "case", [_CASES[2], _CASES[6], _CASES[7]],
    ids=[_case_id(c) for c in (_CASES[2], _CASES[6], _CASES[7])])
def test_operations_sharing_a_cost_signature_cost_alike(case):
  """The layout search prices one operation per signature: the others must
  cost the same under any assignment (random ones here, seeded)."""
  graph, _ = _lowered(case, "placement")
  sizes = {d.name: d.size for d in mtf.convert_to_shape(case[1])}
  groups = _signature_groups(graph)
  num_operations = len(list(cost_model.all_operations(graph)))
  assert len(groups) < num_operations  # Some are shared.
  assert_signature_groups_cost_alike(graph, sizes)


def test_the_cost_signature_tells_consumers_apart():
  # Twin einsums summing over h: the one read by reduce_sum leaves its sum
  # pending (charged there), the ones read by relu are reduced at once.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  b, h, o = (mtf.Dimension(n, 8) for n in "bho")
  x = mtf.zeros(mesh, [b, h])
  w = mtf.zeros(mesh, [h, o])
  kept, reduced, twin = (mtf.einsum([x, w], [b, o]) for _ in range(3))
  mtf.reduce_sum(kept)
  mtf.relu(reduced)
  mtf.relu(twin)
  signature = lambda t: cost_model.cost_signature(t.operation)
  assert signature(reduced) == signature(twin)
  assert signature(kept) != signature(reduced)
  cost = lambda t: cost_model.operation_cost(t.operation, {"h": "m"},
                                             {"m": 2})
  assert not cost(kept).collectives
  assert cost(reduced).collectives == cost(twin).collectives != ()


def _einsum_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  b, i, h, o = (mtf.Dimension(n, s) for n, s in
                (("b", 8), ("i", 6), ("h", 16), ("o", 4)))
  x = mtf.zeros(mesh, [b, i])
  w1 = mtf.zeros(mesh, [i, h])
  w2 = mtf.zeros(mesh, [h, o])
  h1 = mtf.einsum([x, w1], [b, h])
  y = mtf.einsum([h1, w2], [b, o])
  mtf.relu(y)  # A consumer that needs y summed (an unread sum is not).
  return graph, h1.operation, y.operation


@pytest.mark.parametrize("assignment,divisor", [
    ({}, 1), ({"b": "x"}, 2), ({"h": "y"}, 4), ({"b": "x", "h": "y"}, 8)])
def test_einsum_flops_are_counted_per_processor(assignment, divisor):
  _, first, second = _einsum_graph()
  sizes = {"x": 2, "y": 4}
  # b*i*h multiply-adds, then b*h*o; split dims divide, others replicate.
  assert cost_model.operation_cost(first, assignment, sizes).flops == (
      2 * 8 * 6 * 16 // divisor)
  assert cost_model.operation_cost(second, assignment, sizes).flops == (
      2 * 8 * 16 * 4 // divisor)


def test_matmul_chain_flops_and_the_allreduce_of_a_split_contraction():
  graph, first, second = _einsum_graph()
  sizes = {"x": 2, "y": 4}
  cost = cost_model.graph_cost(graph, sizes, "b:x;h:y")
  flops = sum(c.flops for op, c in cost.by_operation
              if op in (first, second))
  assert flops == (2 * 8 * 6 * 16 + 2 * 8 * 16 * 4) // 8
  # y[b, o] sums over h (split over "y"): one allreduce of a [4, 4] float
  # slice per processor over groups of 4, 2 groups.
  second_cost = dict(cost.by_operation)[second]
  assert second_cost.collectives == (cost_model.Collective(
      "allreduce", ("y",), 64, 2 * 2 * 3 * 64),)


def test_operation_cost_is_fast_on_the_transformer():
  graph, _ = _lowered(_CASES[5], "placement")  # The Transformer.
  sizes = {"batch": 2, "model": 4}
  assignments = [{}, {"batch": "batch"}, {"heads": "model", "d_ff": "model"},
                 {"batch": "batch", "vocab": "model"}]
  ops = graph.operations
  start = time.perf_counter()
  for assignment in assignments:
    for op in ops:
      cost_model.operation_cost(op, assignment, sizes)
  per_call = (time.perf_counter() - start) / (len(ops) * len(assignments))
  print(f"operation_cost: {per_call * 1e6:.1f} us per call over {len(ops)} "
        "operations")


class _Machine:
  """A stand-in for auto_mtf.machine.MachineConstants."""

  def compute_seconds(self, flops, elementwise_bytes, num_ops,
                      num_processors, matmul_bytes=0):
    del num_processors
    return (flops * 1e-9 + elementwise_bytes * 1e-8 + num_ops * 1e-5 +
            matmul_bytes * 3e-8)

  def collective_seconds(self, kind, mesh_dimension_names, wire_bytes):
    del kind
    return 1e-4 * len(mesh_dimension_names) + wire_bytes * 1e-7


def test_predicted_step_time_adds_compute_and_collectives():
  graph, _ = _lowered(_CASES[1], "placement")
  machine = _Machine()
  seconds, breakdown = cost_model.predict_step_seconds(
      graph, "b:2;m:4", "batch:b;d_ff:m", machine)
  total = cost_model.graph_cost(graph, "b:2;m:4", "batch:b;d_ff:m").total
  assert total.matmul_bytes > 0
  want = machine.compute_seconds(total.flops, total.elementwise_bytes,
                                 total.num_ops, 8, total.matmul_bytes) + sum(
                                     machine.collective_seconds(
                                         c.kind, c.mesh_dimension_names,
                                         c.wire_bytes)
                                     for c in total.collectives)
  assert math.isclose(seconds, want, rel_tol=1e-12)
  assert breakdown["collective_seconds"]


def test_a_pipeline_iteration_marker_costs_nothing():
  """It hands its inputs on with no TF op: no work, no bytes, no ops."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _pipe_loss(mesh)
  marker_class = mtf.strategies.pipelining.PipelineIterationOperation
  markers = [op for op in graph.operations if isinstance(op, marker_class)]
  assert len(markers) == 4 + 4 - 1
  for op in markers:
    assert cost_model.operation_cost(op, {"stage": "s"}, "s:4") == (
        cost_model.OperationCost())
