"""mtf.pipeline against the unpipelined model, under pipelined layouts.

The model is a stack of S residual stages, h + tanh(h w1[s]) w2[s], with
the weights stacked along "stage" (tanh rather than relu: its gradients
are checked against float64 central differences, which a kink would spoil).
The reference applies the stages one after another to the whole batch in
NumPy (float64). The pipelined program must give the same outputs and the
same gradients of the input and of every weight under every layout: the
stage dimension unsplit, split over a mesh dimension of its size, and
combined with batch and model (hidden dimension) splits.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

D, H = 4, 6
BATCH = 16
# (mesh, layout, number of stages): the 1-processor reference, one stage
# per processor, stages with batch splits, and stages with batch and model
# splits.
LAYOUTS = [
    ("all:1", "", 4),
    ("all:4", "stage:all", 4),
    ("a:4;b:2", "stage:a;batch:b", 4),
    ("s:2;b:2;m:2", "stage:s;batch:b;h:m", 2),
]
_STAGES = {(mesh, layout): s for mesh, layout, s in LAYOUTS}
# As mtf_testing.layout_mode_params does: every layout eagerly, SIMD on the
# meshes of two and three dimensions (whose stage shifts run over groups of
# a mesh axis; the others lower by the same code, checked eagerly), the
# traced modes on the layout that splits the most.
_TRACED_LAYOUT = LAYOUTS[-1][:2]
LAYOUT_MODE_PARAMS = [
    pytest.param(mesh, layout, mode, id=f"{mesh}-{layout or 'none'}-{mode}")
    for mesh, layout, _ in LAYOUTS
    for mode in mtf_testing.MODES + (mtf_testing.V1_SHAPES_MODE,)
    if mode == "eager" or (mode == "simd" and ";" in mesh)
    or (mesh, layout) == _TRACED_LAYOUT]


def _weights(num_stages, seed=0):
  rng = np.random.RandomState(seed)
  w1 = rng.uniform(-0.7, 0.7, size=(num_stages, D, H)).astype(np.float32)
  w2 = rng.uniform(-0.7, 0.7, size=(num_stages, H, D)).astype(np.float32)
  return w1, w2


def _x(seed=1):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=(BATCH, D)).astype(np.float32)


def _np_stages(x, w1, w2, positions=None):
  """The unpipelined model in float64: the stages one after another."""
  h = np.asarray(x, np.float64)
  for s in range(w1.shape[0]):
    h = h + np.tanh(h @ w1[s].astype(np.float64)) @ w2[s].astype(np.float64)
    if positions is not None:
      h = h + 0.01 * positions[:, None]
  return h


def _stage_fn(w1, w2, with_positions=False):
  """One call applies every stage to its own slot of the buffer."""
  def stage_fn(xs):
    h = xs[0]
    hidden = mtf.tanh(mtf.einsum([h, w1], reduced_dims=[w1.shape.dims[1]]))
    h = h + mtf.einsum([hidden, w2], output_shape=h.shape)
    if with_positions:
      h = h + 0.01 * mtf.cast(xs[1], h.dtype)
    return [h] + list(xs[1:])
  return stage_fn


def _check_pipeline(mesh_shape, layout, mode, num_stages, num_microbatches,
                    recompute_grad=False, batch_weight_gradients=False):
  w1, w2 = _weights(num_stages)

  def build(mesh, t):
    del mesh
    stage = t["w1"].shape.dims[0]
    y = mtf.pipeline(_stage_fn(t["w1"], t["w2"]), t["x"], stage,
                     num_microbatches, recompute_grad=recompute_grad,
                     batch_weight_gradients=batch_weight_gradients)
    return {"y": y}

  mtf_testing.check_op(
      build, lambda x, w1, w2: {"y": _np_stages(x, w1, w2)},
      {"x": (_x(), ["batch", "d"]), "w1": (w1, ["stage", "d", "h"]),
       "w2": (w2, ["stage", "h", "d"])},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", LAYOUT_MODE_PARAMS)
def test_matches_the_unpipelined_model(mesh_shape, layout, mode):
  """M = 2S micro-batches: outputs and gradients of x, w1 and w2."""
  num_stages = _STAGES[(mesh_shape, layout)]
  _check_pipeline(mesh_shape, layout, mode, num_stages, 2 * num_stages)


@pytest.mark.parametrize("num_microbatches", [1, 4, 16])
def test_fewer_as_many_and_more_microbatches_than_stages(num_microbatches):
  _check_pipeline("all:4", "stage:all", "eager", 4, num_microbatches)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""),
                                               ("all:2", "batch:all")])
def test_one_stage_is_the_plain_model(mesh_shape, layout):
  _check_pipeline(mesh_shape, layout, "eager", 1, 4)


@pytest.mark.parametrize("mode", ["eager", "simd"])
def test_recompute_grad_gives_the_same_values_and_gradients(mode):
  _check_pipeline("all:4", "stage:all", mode, 4, 4, recompute_grad=True)


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    ("all:1", "", "eager"),
    ("a:4;b:2", "stage:a;batch:b", "eager"),
    ("a:4;b:2", "stage:a;batch:b", "simd"),
    ("s:2;b:2;m:2", "stage:s;batch:b;h:m", "graph")])
def test_batched_weight_gradients_give_the_same_values_and_gradients(
    mesh_shape, layout, mode):
  num_stages = _STAGES[(mesh_shape, layout)]
  _check_pipeline(mesh_shape, layout, mode, num_stages, 2 * num_stages,
                  batch_weight_gradients=True)


def _imported(mesh, num_stages):
  """(x, w1, w2) of the test model imported into `mesh`."""
  w1, w2 = _weights(num_stages)
  stage = mtf.Dimension("stage", num_stages)
  d, h = mtf.Dimension("d", D), mtf.Dimension("h", H)
  return (mtf_testing.import_array(mesh, _x(), [mtf.Dimension("batch", BATCH),
                                                d]),
          mtf_testing.import_array(mesh, w1, [stage, d, h]),
          mtf_testing.import_array(mesh, w2, [stage, h, d]))


def test_batched_weight_gradients_are_one_einsum_per_weight():
  """Each weight's gradient sums the M + S - 1 iterations' terms in one
  einsum; the input's gradient flows iteration by iteration as before."""
  num_stages, num_microbatches = 4, 8
  x, w1, w2 = _imported(mtf.Mesh(mtf.Graph(), "mesh"), num_stages)
  y = mtf.pipeline(_stage_fn(w1, w2), x, w1.shape.dims[0], num_microbatches,
                   batch_weight_gradients=True)
  grads = mtf.gradients([mtf.reduce_sum(mtf.square(y))], [w1, w2])
  for grad in grads:
    terms = [t.shape.get_dim_by_name("gradient_terms").size
             for t in grad.operation.inputs]
    assert terms == [num_microbatches + num_stages - 1] * 2, grad.operation


def _tf_einsums(mesh_shape, layout, num_stages, num_microbatches,
                batch_weight_gradients=False):
  """The Einsum ops of the TF graph of the pipeline and its gradients (of
  the input and both weights) lowered on PlacementMeshImpl."""
  tf_graph = tf.Graph()
  with tf_graph.as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x, w1, w2 = _imported(mesh, num_stages)
    y = mtf.pipeline(_stage_fn(w1, w2), x, w1.shape.dims[0],
                     num_microbatches,
                     batch_weight_gradients=batch_weight_gradients)
    grads = mtf.gradients([mtf.reduce_sum(mtf.square(y))], [x, w1, w2])
    impl = mtf_testing.make_impl("graph", mesh_shape, layout)
    lowering = mtf.Lowering(graph, {mesh: impl})
    for g in grads:
      lowering.export_to_tf_tensor(g)
  return sum(op.type == "Einsum" for op in tf_graph.get_operations())


@pytest.mark.parametrize("batched", [False, True])
def test_idle_stages_skip_their_work_on_placement(batched):
  """A stage call is 2 einsums, its gradient 4 (of the input and of the
  weight of each): with one stage per processor, only the S * M busy
  slots compute them (an idle slot's values are discarded or exactly
  zero), of S * (M + S - 1); batched, each processor computes its weight
  gradients once. One processor holding every stage computes every slot,
  one einsum per iteration for all stages."""
  num_stages, m = 4, 4
  iterations = m + num_stages - 1
  if batched:
    expected = 4 * num_stages * m + 2 * num_stages
  else:
    expected = 6 * num_stages * m
  assert _tf_einsums("all:4", "stage:all", num_stages, m, batched) == expected
  assert _tf_einsums("all:1", "", num_stages, m) == 6 * iterations


def test_batched_weight_gradients_and_recompute_exclude_each_other():
  x, w1, _ = _imported(mtf.Mesh(mtf.Graph(), "mesh"), 2)
  with pytest.raises(ValueError, match="recompute_grad"):
    mtf.pipeline(lambda xs: xs, x, w1.shape.dims[0], 2, recompute_grad=True,
                 batch_weight_gradients=True)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""),
                                               ("all:4", "stage:all")])
def test_bubbles_never_leak_inf_or_nan(mesh_shape, layout):
  """A stage that makes -inf of zeros (and NaN gradients there): the bubble
  slots hold zeros, so the outputs and all gradients stay finite."""
  num_stages = 4
  w1, w2 = _weights(num_stages)

  def build(mesh, t):
    del mesh
    stage = t["w1"].shape.dims[0]
    plain = _stage_fn(t["w1"], t["w2"])

    def stage_fn(xs):
      h = plain(xs)[0]
      norm = mtf.reduce_sum(mtf.square(xs[0]), reduced_dim=xs[0].shape[-1])
      return [h + 0.01 * mtf.log(norm)]

    return {"y": mtf.pipeline(stage_fn, t["x"], stage, 2)}

  def np_fn(x, w1, w2):
    h = np.asarray(x, np.float64)
    for s in range(num_stages):
      log_norm = np.log(np.sum(h * h, axis=1, keepdims=True))
      h = h + np.tanh(h @ w1[s]) @ w2[s] + 0.01 * log_norm
    return {"y": h}

  mtf_testing.check_op(
      build, np_fn,
      {"x": (_x(), ["batch", "d"]), "w1": (w1, ["stage", "d", "h"]),
       "w2": (w2, ["stage", "h", "d"])},
      mesh_shape, layout, "eager")


@pytest.mark.parametrize("mesh_shape,layout,mode,recompute", [
    ("all:1", "", "eager", False),
    ("a:4;b:2", "stage:a;batch:b", "eager", False),
    ("a:4;b:2", "stage:a;batch:b", "simd", False),
    ("a:4;b:2", "stage:a;batch:b", "eager", True)])
def test_extra_int_input_travels_with_its_microbatch(mesh_shape, layout,
                                                     mode, recompute):
  """Each stage adds its micro-batch's positions; they come back in order
  (also through recompute_grad, which gets an int input)."""
  num_stages = 4
  w1, w2 = _weights(num_stages)
  positions = np.arange(BATCH, dtype=np.int32) * 7 % 11

  def build(mesh, t):
    del mesh
    stage = t["w1"].shape.dims[0]
    y, pos = mtf.pipeline(_stage_fn(t["w1"], t["w2"], with_positions=True),
                          [t["x"], t["pos"]], stage, 4,
                          recompute_grad=recompute)
    return {"y": y, "pos": pos}

  def np_fn(x, w1, w2, pos):
    return {"y": _np_stages(x, w1, w2, positions=pos), "pos": pos}

  mtf_testing.check_op(
      build, np_fn,
      {"x": (_x(), ["batch", "d"]), "w1": (w1, ["stage", "d", "h"]),
       "w2": (w2, ["stage", "h", "d"]), "pos": (positions, ["batch"])},
      mesh_shape, layout, mode)


def _variable_model(recompute_grad, num_microbatches=4):
  """A pipeline whose stage_fn creates its stacked variables."""
  stage = mtf.Dimension("stage", 4)
  d, h = mtf.Dimension("d", D), mtf.Dimension("h", H)

  def build(mesh):
    x = mtf_testing.import_array(mesh, _x(), [mtf.Dimension("batch", BATCH),
                                              d])

    def stage_fn(xs):
      w1 = mtf.get_variable(mesh, "w1", [stage, d, h])
      w2 = mtf.get_variable(mesh, "w2", [stage, h, d])
      return _stage_fn(w1, w2)(xs)

    y = mtf.pipeline(stage_fn, [x], stage, num_microbatches,
                     recompute_grad=recompute_grad)[0]
    loss = mtf.reduce_sum(mtf.square(y))
    graph = mesh.graph
    wrt = {v.name: v.outputs[0] for v in graph.trainable_variables}
    wrt["x"] = x
    return {"y": y}, loss, wrt
  return build


@pytest.mark.parametrize("mode", ["eager", "function", "simd"])
def test_stacked_variables_are_created_once_and_trained_alike(mode):
  """stage_fn's variables are made by its first call and reused; with and
  without recompute the loss gradients agree, and match NumPy."""
  results = {}
  for recompute in (False, True):
    values, graph = mtf_testing.run_program(
        "all:4", "stage:all", mode, _variable_model(recompute))
    assert [v.name for v in graph.trainable_variables] == ["w1", "w2"]
    results[recompute] = values
  for key in results[False]:
    np.testing.assert_allclose(results[True][key], results[False][key],
                               rtol=1e-6, atol=1e-6, err_msg=key)
  values = results[False]
  want = _np_stages(_x(), values["w1"], values["w2"])
  np.testing.assert_allclose(values["y"], want, rtol=1e-5, atol=1e-5)
  eps = 1e-6
  x64 = _x().astype(np.float64)
  # d(sum y^2)/dx along one direction, by central differences.
  direction = np.random.RandomState(3).uniform(-1, 1, size=x64.shape)
  loss = lambda x: np.sum(_np_stages(x, values["w1"], values["w2"]) ** 2)
  numeric = (loss(x64 + eps * direction) - loss(x64 - eps * direction)) / (
      2 * eps)
  np.testing.assert_allclose(np.sum(values["d_x"] * direction), numeric,
                             rtol=1e-4)


def _lowered(mesh_shape, layout, num_stages, num_microbatches,
             mode="eager"):
  """(lowering counters, graph, w1's slices) of the pipelined model with its
  gradients."""
  w1, w2 = _weights(num_stages)
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  kept = {}

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf_testing.import_array(
        mesh, _x(), [mtf.Dimension("batch", BATCH), mtf.Dimension("d", D)])
    stage = mtf.Dimension("stage", num_stages)
    d, h = mtf.Dimension("d", D), mtf.Dimension("h", H)
    tw1 = mtf_testing.import_array(mesh, w1, [stage, d, h])
    tw2 = mtf_testing.import_array(mesh, w2, [stage, h, d])
    y = mtf.pipeline(_stage_fn(tw1, tw2), x, stage, num_microbatches)
    grads = mtf.gradients([mtf.reduce_sum(y)], [x, tw1, tw2])
    lowering = mtf.Lowering(graph, {mesh: impl})
    # The outputs and x's gradient are pending sums until exported; they
    # are replicated, so exporting them gathers nothing (the weights'
    # gradients, split along "stage", would be gathered on SIMD).
    exported = [lowering.export_to_tf_tensor(t) for t in (y, grads[0])]
    kept.update(counters=dict(lowering.counters), graph=graph,
                w1_slices=lowering.laid_out_tensor(tw1).tensor_list)
    return lowering, exported

  mtf_testing.run_in_mode(mode, build_and_lower, impl)
  return kept["counters"], kept["graph"], kept["w1_slices"]


@pytest.mark.parametrize("num_stages,num_microbatches", [(4, 1), (4, 16),
                                                         (1, 4)])
def test_iterations_and_bubble_are_counted(num_stages, num_microbatches):
  mesh_shape, layout = (("all:4", "stage:all") if num_stages == 4 else
                        ("all:1", ""))
  counters, graph, _ = _lowered(mesh_shape, layout, num_stages,
                                num_microbatches)
  (info,) = mtf.strategies.pipelining.pipeline_infos(graph)
  iterations = num_microbatches + num_stages - 1
  assert info.num_iterations == iterations
  assert info.num_stages == num_stages
  want_bubble = (num_stages - 1) / iterations
  assert info.bubble_fraction == pytest.approx(want_bubble)
  assert counters["pipeline/iterations"] == iterations
  assert counters["pipeline/stage_slots"] == num_stages * iterations
  busy = counters["pipeline/busy_slots"] / counters["pipeline/stage_slots"]
  assert 1 - busy == pytest.approx(want_bubble)


@pytest.mark.parametrize("mode", ["eager", "simd"])
def test_split_stages_hand_over_between_neighbours(mode):
  """stage:4 on "all:4": each iteration's shift is one receive from the
  neighbour (forward and backward); the outputs and the input gradient are
  collected with one all-reduce each; each processor holds 1/S of the
  stacked weights."""
  num_stages, num_microbatches = 4, 8
  counters, _, w1_slices = _lowered("all:4", "stage:all", num_stages,
                                    num_microbatches, mode)
  shifts = num_microbatches + num_stages - 2
  assert counters["comm/receive/all/calls"] == 2 * shifts
  assert counters["comm/allreduce/all/calls"] == 2
  assert not [k for k in counters
              if k.startswith("comm/") and k.endswith("/calls") and
              k not in ("comm/receive/all/calls", "comm/allreduce/all/calls")]
  for s in w1_slices:
    assert list(s.shape) == [1, D, H]


def test_microbatches_that_do_not_divide_the_batch():
  with pytest.raises(mtf.ShapeError, match=r"3 micro-batches .* 'batch' of "
                     r"size 16.*divisors of 16 \(1, 2, 4, 8, 16\)"):
    _build_only(num_microbatches=3)


def test_fewer_than_one_microbatch():
  with pytest.raises(mtf.ShapeError, match="num_microbatches is 0.*at least 1"):
    _build_only(num_microbatches=0)


def test_missing_or_empty_stage_dimension():
  with pytest.raises(mtf.ShapeError, match="stage_dim must be an "
                     "mtf.Dimension"):
    _build_only(stage=None)
  with pytest.raises(mtf.ShapeError, match="stage dimension 'stage' has size "
                     "0; it needs at least one stage"):
    _build_only(stage=mtf.Dimension("stage", 0))


def test_stage_fn_returning_the_wrong_number_or_shapes():
  with pytest.raises(mtf.ShapeError, match="returned 2 tensors for 1 inputs"):
    _build_only(stage_fn=lambda xs: [xs[0], xs[0]])
  with pytest.raises(mtf.ShapeError, match=r"output 0 has shape "
                     r"Shape\[stage=4, batch=4, d=2\], but its input has "
                     r"Shape\[stage=4, batch=4, d=4\]"):
    _build_only(stage_fn=lambda xs: [mtf.slice(xs[0], 0, 2, "d")])


def test_stage_dimension_on_a_mesh_dimension_of_another_size():
  graph, mesh = _build_only()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("s:2;b:2", "stage:s")
  with pytest.raises(mtf.LayoutError, match=r"stage dimension 'stage' \(size "
                     r"4\) is split over mesh dimension 's' of size 2.*Make "
                     r"them equal \(use 2 stages, or a mesh dimension of "
                     r"size 4\)"):
    mtf.Lowering(graph, {mesh: impl})


def _build_only(num_microbatches=4, stage="default", stage_fn=None):
  """Builds (does not lower) a pipeline; returns (graph, mesh)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  d = mtf.Dimension("d", D)
  x = mtf.zeros(mesh, [mtf.Dimension("batch", BATCH), d])
  if stage == "default":
    stage = mtf.Dimension("stage", 4)
  if stage_fn is None:
    stage_fn = lambda xs: [xs[0] * 2.0]
  mtf.pipeline(stage_fn, x, stage, num_microbatches)
  return graph, mesh
