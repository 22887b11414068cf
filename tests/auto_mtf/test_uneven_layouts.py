"""auto_mtf with uneven splits (allow_uneven): allowed, chosen and priced.

A dimension whose size a mesh dimension does not divide may be split over it
only when the search is asked to (`allow_uneven=True`); the rules it returns
then allow uneven splits. The padding is priced: memory as the lowering
holds the padded slices (`MeshImpl.slice_shape`), collectives as the
lowering's counters count them, the allconcats of operations lowered with
their padded dimensions gathered (a cumsum, a reshape) included.
"""

import math
import random

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import api
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import machine
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import scheduler
from mesh_tensorflow.auto_mtf import valid_layouts
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.transformer import transformer
from tests.auto_mtf import test_cost_model
from tests.transformer import model_testing
from tests.transformer import tiny_layers

# Every processor computes at once; collectives of 10 us plus 0.1 ns per
# wire byte (as in test_time_objective).
POD = machine.machine_constants({
    "flops_per_second": 1e12, "elementwise_bytes_per_second": 1e11,
    "op_overhead_seconds": 1e-6, "concurrency": 8,
    "default_collective": {"latency_seconds": 1e-5,
                           "seconds_per_wire_byte": 1e-10}})


class _Doubling(mtf.Operation):
  """2 x, slicewise, declaring that its lowering does not handle padding:
  the Lowering gathers its padded dimensions around it (as around any
  operation without a padded lowering)."""

  handles_padding = False

  def __init__(self, x):
    super().__init__([x], name="doubling")
    self._outputs = [mtf.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [_Doubling(grad_ys[0]).outputs[0]]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(
        lambda s: s * 2.0, lowering.laid_out_tensor(self.inputs[0])))


def _mlp_step(hidden, middle=None, batch=6, d_in=8, d_out=4):
  """y = middle(relu(x @ w1)) @ w2; loss = sum(y^2); SGD on w1 and w2.

  `middle` is None, "doubling" (_Doubling), "cumsum" (along hidden) or
  "reshape" (hidden to two dimensions and back): operations that gather a
  padded hidden, or (cumsum, reshape) have a padded lowering of their own.

  Returns (graph, mesh, loss).
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  b, i, h, o = (mtf.Dimension("batch", batch), mtf.Dimension("d_in", d_in),
                mtf.Dimension("hidden", hidden),
                mtf.Dimension("d_out", d_out))
  x = mtf.import_tf_tensor(mesh, tf.ones([batch, d_in]), [b, i])
  w1 = mtf.get_variable(mesh, "w1", [i, h])
  w2 = mtf.get_variable(mesh, "w2", [h, o])
  hh = mtf.relu(mtf.einsum([x, w1], [b, h]))
  if middle == "doubling":
    hh = _Doubling(hh).outputs[0]
  elif middle == "cumsum":
    hh = mtf.cumsum(hh, h)
  elif middle == "reshape":
    h2, h3 = mtf.Dimension("h2", 10), mtf.Dimension("h3", hidden // 10)
    hh = mtf.reshape(mtf.reshape(hh, [b, h2, h3]) * 2.0, [b, h])
  y = mtf.einsum([hh, w2], [b, o])
  loss = mtf.reduce_sum(y * y)
  grads = mtf.gradients([loss], [w1, w2])
  mtf.optimize.SgdOptimizer(0.1).apply_grads(
      grads, graph.trainable_variables)
  return graph, mesh, loss


def _vocab_step(vocab=259, d_model=16, length=8):
  """Embedding lookup (one_hot einsum) and logits over a vocabulary."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  v, d, n = (mtf.Dimension("vocab", vocab), mtf.Dimension("d_model", d_model),
             mtf.Dimension("length", length))
  ids = mtf.import_tf_tensor(mesh, tf.zeros([length], tf.int32), [n])
  embedding = mtf.get_variable(mesh, "embedding", [v, d])
  x = mtf.einsum([mtf.one_hot(ids, v), embedding], [n, d])
  logits = mtf.einsum([mtf.relu(x), embedding], [n, v])
  loss = mtf.reduce_sum(logits * logits)
  grads = mtf.gradients([loss], [embedding])
  mtf.optimize.SgdOptimizer(0.1).apply_grads(grads,
                                             graph.trainable_variables)
  return graph, mesh, loss


def _lm_step():
  """model_testing's LM (one layer, Adafactor) with a vocabulary of 30, not
  rounded up: 4 and 8 do not divide it."""
  stack = transformer.make_layer_stack(
      [tiny_layers.TinySelfAttention, tiny_layers.TinyDenseRelu],
      num_layers=1)
  model = transformer.Unitransformer(
      stack, d_model=model_testing.D, input_vocab_size=model_testing.V,
      output_vocab_size=model_testing.V, autoregressive=True,
      vocab_divisor=1, name="decoder", max_length=model_testing.L)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = model_testing.lm_loss(model, mesh)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=8).apply_grads(
      grads, variables)
  return graph, mesh, loss


# ----------------------------------------------------------- the switch


def test_uneven_assignments_need_the_switch():
  with tf.Graph().as_default():
    graph, _, _ = _mlp_step(hidden=100)
  even = valid_layouts.LayoutValidator(graph, "m:8")
  uneven = valid_layouts.LayoutValidator(graph, "m:8", allow_uneven=True)
  assert not even.allow_uneven and uneven.allow_uneven
  assert not even.is_valid_assignment("hidden", "m")
  assert uneven.is_valid_assignment("hidden", "m")
  assert uneven.is_uneven_assignment("hidden", "m")
  assert not uneven.is_uneven_assignment("d_in", "m")
  # Smaller than the mesh dimension: some processors would hold only
  # padding.
  assert not uneven.is_valid_assignment("batch", "m")
  with pytest.raises(mtf.LayoutError, match="allow_uneven=True would pad"):
    even.validate_layout({"hidden": "m"})
  with pytest.raises(mtf.LayoutError, match="smallest size 6 is less than 8"):
    uneven.validate_layout({"batch": "m"})
  uneven.validate_layout({"hidden": "m"})


@pytest.mark.parametrize("build,mesh_shape,name", [
    (lambda: _mlp_step(hidden=100, d_in=6), "m:8", "hidden"),
    (lambda: _vocab_step(vocab=259, d_model=6, length=6), "m:4", "vocab"),
])
def test_the_natural_split_is_uneven_only_when_allowed(build, mesh_shape,
                                                       name):
  with tf.Graph().as_default():
    graph, _, loss = build()
  rules = api.layout(graph, mesh_shape, [loss])
  assert not rules.allow_uneven
  assert rules.mesh_dimension_for(name) is None
  uneven = api.layout(graph, mesh_shape, [loss], allow_uneven=True)
  assert uneven.allow_uneven
  assert uneven.mesh_dimension_for(name) == "m"
  choice = api.choose_layout(graph, mesh_shape, [loss], allow_uneven=True)
  assert "allow_uneven=True" in choice.describe()
  assert choice.peak_memory_bytes < api.choose_layout(
      graph, mesh_shape, [loss]).peak_memory_bytes


def test_layout_and_mesh_shape_passes_the_switch_on():
  with tf.Graph().as_default():
    graph, _, loss = _mlp_step(hidden=100, d_in=6)
  rules, mesh_shape = api.layout_and_mesh_shape(graph, 8, [loss],
                                                max_mesh_shape_dimensions=1,
                                                allow_uneven=True)
  assert mesh_shape == mtf.convert_to_shape("mesh_0:8")
  assert rules == mtf.LayoutRules([("hidden", "mesh_0")], allow_uneven=True)


def test_cost_layout_slices_are_padded():
  layout = cost_rules.CostLayout({"h": "m", "b": "n"}, {"m": 8, "n": 2},
                                 allow_uneven=True)
  dims = [("b", 6), ("h", 100), ("o", 5)]
  assert layout.slice_sizes(dims) == [3, 13, 5]
  assert layout.slice_elements(dims) == 3 * 13 * 5
  assert layout.padded_names([dims, [("h", 96)]]) == {"h"}
  whole = layout.without({"h"})
  assert whole.slice_sizes(dims) == [3, 100, 5]
  assert not whole.padded_names([dims])
  # A shard name kept whole stays whole.
  assert whole.without({"x@m"}).mesh_dim("x@m") is None
  assert whole.mesh_dim("x@m") == "m"
  # Even rules have no padding to price.
  even = cost_rules.CostLayout({"h": "m"}, {"m": 8})
  assert not even.padded_names([dims])


# --------------------------------------------------------------- memory


@pytest.mark.parametrize("mesh_shape,rules", [
    ("m:8", "hidden:m"), ("b:4;m:2", "batch:b;hidden:m"),
    ("b:4;m:2", "batch:b;d_in:m"), ("m:3;n:4", "hidden:m;batch:n"),
])
def test_predicted_memory_is_the_padded_slices(mesh_shape, rules):
  with tf.Graph().as_default():
    graph, _, loss = _mlp_step(hidden=100, batch=6, d_in=7, d_out=5)
  rules = mtf.convert_to_layout_rules(rules).with_uneven()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules)
  estimator = memory_estimator.MemoryEstimator(graph, mesh_shape, [loss],
                                               allow_uneven=True)
  interface = estimator.get_graph_interface()
  sizes = {d.name: d.size for d in mtf.convert_to_shape(mesh_shape)}
  assignment = {name: rules.mesh_dimension_for(name)
                for name in ("batch", "d_in", "hidden", "d_out")
                if rules.mesh_dimension_for(name) is not None}
  padded = 0
  for op in graph.operations:
    for t in op.outputs:
      want = math.prod(impl.slice_shape(t.shape)) * t.dtype.size
      assert interface.get_tensor_slice_size(t.name, assignment,
                                             sizes) == want, t.name
      padded += bool(impl.padded_axes(t.shape))
  assert padded
  # The peak is the largest sum of padded slices the schedule holds.
  optimizer = layout_optimizer.LayoutOptimizer(estimator)
  slice_bytes = {t.name: math.prod(impl.slice_shape(t.shape)) * t.dtype.size
                 for op in graph.operations for t in op.outputs}
  contents = interface.compute_memory_contents_under_schedule(
      scheduler.minimize_peak_memory(interface, "LIST"))
  assert optimizer.evaluate_peak_memory(rules) == max(
      sum(slice_bytes[t] for t in step) for step in contents)


def test_the_memory_program_prices_padding_per_dimension():
  # One [p:9, q:12] output on 8 processors: the elements divided by 8
  # would rate both splits 14 per processor; padded, splitting p holds
  # 2 x 12 = 24 and splitting q 9 x 2 = 18.
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    p, q = mtf.Dimension("p", 9), mtf.Dimension("q", 12)
    out = mtf.get_variable(mesh, "w", [p, q]) * 2.0
  estimator = memory_estimator.MemoryEstimator(graph, "m:8", [out],
                                               allow_uneven=True)
  optimizer = layout_optimizer.LayoutOptimizer(estimator)
  assert optimizer.solve() == "q:m"
  assert optimizer.evaluate_peak_memory("q:m") == 2 * 9 * 2 * 4
  assert optimizer.evaluate_peak_memory("p:m") == 2 * 2 * 12 * 4


# ----------------------------------------------------------- collectives


def _lowered(build, mesh_shape, rules, impl_name):
  """(graph, the lowering's counters) of build() under uneven rules."""
  if impl_name == "placement":
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules)
    with tf.Graph().as_default():
      graph, mesh, _ = build()
      counters = dict(mtf.Lowering(graph, {mesh: impl}).counters)
    return graph, counters
  impl = mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, rules)
  out = {}

  def program():
    graph, mesh, _ = build()
    out["graph"] = graph
    out["counters"] = dict(mtf.Lowering(graph, {mesh: impl}).counters)

  impl.trace_program(program)
  return out["graph"], out["counters"]


_COLLECTIVE_CASES = [
    ("mlp", None, "m:8", "hidden:m", "placement"),
    ("mlp", None, "b:2;m:4", "batch:b;hidden:m", "simd"),
    ("mlp", "doubling", "m:8", "hidden:m", "placement"),
    ("mlp", "doubling", "b:2;m:4", "batch:b;hidden:m", "simd"),
    ("mlp", "cumsum", "m:8", "hidden:m", "placement"),
    ("mlp", "cumsum", "m:4;b:2", "hidden:m;d_in:b", "simd"),
    ("mlp", "reshape", "m:8", "hidden:m", "placement"),
    ("mlp", "reshape", "b:2;m:4", "batch:b;hidden:m", "placement"),
    ("vocab", None, "m:4", "vocab:m", "placement"),
    ("vocab", None, "b:2;m:4", "length:b;vocab:m", "simd"),
    ("vocab", None, "m:4;b:3", "vocab:m;d_model:b", "placement"),
    ("lm", None, "b:2;m:4", "vocab:m;d_ff:b;heads:m", "placement"),
]


def _builder(model, middle):
  if model == "vocab":
    return _vocab_step
  if model == "lm":
    return _lm_step
  return lambda: _mlp_step(hidden=90, middle=middle)


@pytest.mark.parametrize(
    "model,middle,mesh_shape,rules,impl_name", _COLLECTIVE_CASES,
    ids=["-".join(str(c).replace(";", "_").replace(":", "") for c in case)
         for case in _COLLECTIVE_CASES])
def test_predicted_collectives_equal_the_lowerings_counters(
    model, middle, mesh_shape, rules, impl_name):
  rules = mtf.convert_to_layout_rules(rules).with_uneven()
  graph, counters = _lowered(_builder(model, middle), mesh_shape, rules,
                             impl_name)
  want = cost_model.counted_collectives(counters)
  got = cost_model.graph_cost(graph, mesh_shape, rules).collectives
  assert got == want
  if middle == "doubling":
    # It (and its gradient) is lowered with hidden gathered: an allconcat
    # over m of padded slices each.
    assert got[("allconcat", "m")]["calls"] == 2


def test_a_padded_dimension_is_gathered_around_operations_without_padding():
  with tf.Graph().as_default():
    graph, _, _ = _mlp_step(hidden=100, middle="doubling")
  doubling = [op for op in graph.operations
              if isinstance(op, _Doubling)][0]  # The forward one.
  relu = doubling.inputs[0].operation
  sizes = {"m": 8}
  gathered = cost_model.operation_cost(doubling, {"hidden": "m"}, sizes,
                                       allow_uneven=True)
  # Its [batch:6, hidden:100] input: padded slices of 13, concatenated.
  (allconcat,) = gathered.collectives
  assert allconcat.kind == "allconcat"
  assert allconcat.slice_bytes == 6 * 13 * 4
  assert allconcat.wire_bytes == 8 * 7 * 6 * 13 * 4
  # Then it runs on the whole [6, 100] on every processor; its output is
  # split again (padded) and its padding zeroed.
  whole = cost_model.operation_cost(doubling, {}, sizes)
  assert gathered.elementwise_bytes > whole.elementwise_bytes
  assert gathered.num_ops > whole.num_ops
  # relu handles padding: it reads and writes its padded slices, without
  # communicating (and, unless it keeps padding zero, zeroes it after).
  native = cost_model.operation_cost(relu, {"hidden": "m"}, sizes,
                                     allow_uneven=True)
  assert relu.handles_padding_of({"hidden"})
  assert not native.collectives
  passes = 1 if relu.padding_stays_zero else 2
  assert native.elementwise_bytes == passes * 2 * 6 * 13 * 4
  assert native.num_ops == passes


@pytest.mark.parametrize("mesh_shape", ["m:8", "b:2;m:3"])
def test_graph_cost_is_the_sum_of_operation_costs(mesh_shape):
  """As the search sees it: each operation priced alone from the names
  `cost_dimension_names` lists, under random uneven assignments."""
  with tf.Graph().as_default():
    graph, _, _ = _mlp_step(hidden=100, middle="cumsum", d_in=7)
  sizes = {d.name: d.size for d in mtf.convert_to_shape(mesh_shape)}
  rng = random.Random(0)
  names = ["batch", "d_in", "hidden", "d_out"]
  for _ in range(4):
    pairs = []
    free = list(sizes)
    for name in names:
      m = rng.choice(free + [None])
      if m is not None:
        pairs.append((name, m))
        free.remove(m)
    rules = mtf.LayoutRules(pairs, allow_uneven=True)
    total = cost_model.OperationCost.zero()
    for op in cost_model.all_operations(graph):
      assignment = {n: rules.mesh_dimension_for(n)
                    for n in cost_model.cost_dimension_names(op)
                    if rules.mesh_dimension_for(n) in sizes}
      total += cost_model.operation_cost(op, assignment, sizes,
                                         allow_uneven=True)
    assert total == cost_model.graph_cost(graph, sizes, rules).total, pairs


def test_operations_sharing_a_cost_signature_cost_alike():
  """The search prices one operation per signature (step_cost): under
  uneven assignments too, where gathering depends on the operation's
  class (random assignments, seeded)."""
  with tf.Graph().as_default():
    graph, _, _ = _lm_step()
  test_cost_model.assert_signature_groups_cost_alike(
      graph, {"m": 4, "n": 8}, allow_uneven=True)


# ------------------------------------------------------------------ time


def test_the_time_objective_prices_the_padding():
  # Two 16 MiB weights, 8 rows (test_time_objective's model-parallel case)
  # with a hidden size of 4100: split unevenly when allowed.
  with tf.Graph().as_default():
    graph, _, loss = _mlp_step(hidden=4100, batch=8, d_in=1024, d_out=1024)
  choice = api.choose_layout(graph, "x:8", [loss], objective="time",
                             machine=POD, allow_uneven=True)
  assert choice.layout_rules == mtf.LayoutRules([("hidden", "x")],
                                                allow_uneven=True)
  seconds, _ = cost_model.predict_step_seconds(graph, "x:8",
                                               choice.layout_rules, POD)
  assert choice.predicted_step_seconds == pytest.approx(seconds, rel=1e-9)
  even = api.choose_layout(graph, "x:8", [loss], objective="time",
                           machine=POD)
  assert even.layout_rules.mesh_dimension_for("hidden") is None
  assert choice.predicted_step_seconds < even.predicted_step_seconds
