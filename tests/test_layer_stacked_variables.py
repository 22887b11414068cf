"""Layer-stacked variables (mtf.stack_layer_variables): one variable with a
leading stack dimension that layout rules may split, whose rows start,
checkpoint and restore exactly as the per-layer variables they replace."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.estimator import checkpoints
from mesh_tensorflow.strategies import layer_stacking
from tests import layer_stacked_models as models
from tests import mtf_testing

UNSPLIT = ("all:1", "")
STAGE_4 = ("all:4", "stage:all")
STAGE_2_2D = ("p:2;b:2;m:2", "stage:p;batch:b;h:m")


def _save(mode, mesh_shape, layout, stacked, directory):
  """Builds the variables, assigns v * 2 + 1 to each, and checkpoints:
  tf.train.Checkpoint (eager, function, simd) or a compat Saver (graph).

  Returns (values read after the assignment by member name, the
  checkpoint's values by name, the checkpoint path).
  """
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  graphs = []

  def build_and_lower():
    graph = mtf.Graph()
    graphs.append(graph)
    mesh = mtf.Mesh(graph, "mesh")
    models.layers(mesh, stacked)
    variables = graph.trainable_variables
    assigns = [mtf.assign(v, v.outputs[0] * 2.0 + 1.0) for v in variables]
    reads = {v.name: mtf.read_variable(v, dependencies=assigns)
             for v in variables}
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, {k: lowering.export_to_tf_tensor(t)
                      for k, t in reads.items()}

  path = os.path.join(directory, f"{mode}_{stacked}_ckpt")
  if mode == "graph":
    with tf.Graph().as_default():
      lowering, values = build_and_lower()
      saver = tf.compat.v1.train.Saver()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        values = sess.run(values)
        sess.run(lowering.copy_slices_to_masters())
        saver.save(sess, path)
    prefix = None
  else:
    values = mtf_testing.run_in_mode(mode, build_and_lower, impl)
    path = tf.train.Checkpoint(model=impl).write(path)
    prefix = "model"
  return (models.rows_by_member(values, graphs[-1]),
          mtf.storage.checkpointing.load_variables(path, prefix=prefix), path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The per-layer model on one processor, eagerly."""
  return _save("eager", *UNSPLIT, False, tmp_path_factory.mktemp("ref"))


def _assert_same(got, expected):
  assert sorted(got) == sorted(expected)
  for name in expected:
    np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_initial_rows_equal_per_layer_variables():
  """Default (name-seeded Glorot), seeded, plain and zeros initializers."""
  def initial(mesh_shape, layout, stacked):
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    models.layers(mesh, stacked)
    lowering = mtf.Lowering(graph, {mesh: impl})
    values = {v.name: lowering.export_to_tf_tensor(v.outputs[0]).numpy()
              for v in graph.all_variables}
    return graph, models.rows_by_member(values, graph)

  _, expected = initial(*UNSPLIT, False)
  graph, got = initial(*STAGE_4, True)
  _assert_same(got, expected)
  assert sorted(got) == models.MEMBERS
  # The rows differ from each other (re-seeded per member).
  assert not np.array_equal(got["block_000/dense/kernel"],
                            got["block_001/dense/kernel"])
  assert not np.array_equal(got["block_000/dense/out"],
                            got["block_002/dense/out"])
  # The plain initializer saw the row's shape ([8]: 1/8), not the stack's.
  np.testing.assert_array_equal(got["block_003/scale"], np.full(8, 0.125))
  kernel = graph.name_to_variable["stacked_stage/block_000/dense/kernel"]
  assert kernel.shape == mtf.Shape([models.STAGE, models.D, models.H])
  assert kernel.member_names == [f"block_{i:03d}/dense/kernel"
                                 for i in range(4)]


@pytest.mark.parametrize("mode,mesh", [
    ("eager", UNSPLIT), ("eager", STAGE_4), ("eager", STAGE_2_2D),
    ("function", STAGE_2_2D), ("graph", STAGE_4), ("graph", STAGE_2_2D),
    ("graph", UNSPLIT), ("simd", STAGE_4), ("simd", STAGE_2_2D)])
def test_checkpoint_keys_and_values_are_the_per_layer_ones(
    tmp_path, reference, mode, mesh):
  values, saved, _ = _save(mode, *mesh, True, tmp_path)
  ref_values, ref_saved, _ = reference
  _assert_same(values, ref_values)
  assert sorted(saved) == models.MEMBERS
  _assert_same(saved, ref_saved)


def _restore_tf2(mode, mesh_shape, layout, stacked, path):
  """Restores (deferred: before the variables exist) and reads them."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  tf.train.Checkpoint(model=impl).restore(path).expect_partial()
  graphs = []

  def read():
    graph = mtf.Graph()
    graphs.append(graph)
    mesh = mtf.Mesh(graph, "mesh")
    models.layers(mesh, stacked)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return {v.name: lowering.export_to_tf_tensor(v.outputs[0])
            for v in graph.all_variables}

  if mode == "function":
    read = tf.function(read)
  values = tf.nest.map_structure(np.asarray, read())
  return models.rows_by_member(values, graphs[-1])


@pytest.mark.parametrize("mode,mesh", [
    ("eager", UNSPLIT), ("function", STAGE_4), ("eager", STAGE_2_2D)])
def test_per_layer_checkpoint_restores_into_stacked_variables(
    reference, mode, mesh):
  ref_values, _, path = reference
  _assert_same(_restore_tf2(mode, *mesh, True, path), ref_values)


def test_stacked_checkpoint_restores_into_per_layer_variables(tmp_path):
  values, _, path = _save("eager", *STAGE_2_2D, True, tmp_path)
  restored = _restore_tf2("eager", "b:2;m:4", "batch:b;h:m", False, path)
  _assert_same(restored, values)


def test_compat_saver_round_trip_between_per_layer_and_stacked(tmp_path):
  """A Saver checkpoint of per-layer masters restores into stacked
  variables in graph mode (per-member masters), and back by name."""
  ref_values, _, ref_path = _save("graph", *UNSPLIT, False, tmp_path)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(*STAGE_2_2D)
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    models.layers(mesh, True)
    lowering = mtf.Lowering(graph, {mesh: impl})
    reads = {v.name: lowering.export_to_tf_tensor(v.outputs[0])
             for v in graph.all_variables}
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, ref_path)
      sess.run(lowering.copy_masters_to_slices())
      got = models.rows_by_member(sess.run(reads), graph)
      kernel = graph.name_to_variable["stacked_stage/block_000/dense/kernel"]
      master = sess.run(kernel.get_master())
  _assert_same(got, ref_values)
  np.testing.assert_array_equal(master[3], ref_values["block_003/dense/kernel"])
  # The Saver checkpoint of stacked variables -> per-layer variables of
  # another layout, by name.
  values, _, path = _save("graph", *STAGE_2_2D, True, tmp_path)
  per_layer = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "h:all")
  _read_eager(per_layer, False)
  restore = mtf.storage.checkpointing.restore_into(per_layer, path)
  assert sorted(restore.restored) == models.MEMBERS
  _assert_same(_read_eager(per_layer, False), values)


def _read_eager(impl, stacked):
  """The variables' current values by member name (created if new)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  models.layers(mesh, stacked)
  lowering = mtf.Lowering(graph, {mesh: impl})
  values = {v.name: lowering.export_to_tf_tensor(v.outputs[0]).numpy()
            for v in graph.all_variables}
  return models.rows_by_member(values, graph)


def test_name_based_save_and_restore_into_stacked_variables(tmp_path,
                                                            reference):
  """save_specs (the estimator's name-based writer) and restore_into
  (ValueRestore) see one entry per member, holding its row."""
  ref_values, _, ref_path = reference
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(*STAGE_4)
  _read_eager(impl, True)
  specs = mtf.storage.checkpointing.save_specs(impl)
  assert sorted(specs) == models.MEMBERS
  # Row 1 of a variable split 4 ways over "stage" is held whole by
  # processor 1 alone: one block, unsliced.
  assert list(specs["block_001/dense/kernel"]) == [""]
  restore = mtf.storage.checkpointing.restore_into(impl, ref_path)
  assert sorted(restore.restored) == models.MEMBERS
  assert not restore.missing
  _assert_same(_read_eager(impl, True), ref_values)


@pytest.mark.parametrize("mesh,slice_shape", [
    (STAGE_4, [1, 8, 16]), (STAGE_2_2D, [2, 8, 8]), (UNSPLIT, [4, 8, 16])])
def test_each_processor_stores_its_share_of_the_stack(mesh, slice_shape):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(*mesh)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  models.layers(mesh, True)
  lowering = mtf.Lowering(graph, {mesh: impl})
  kernel = graph.name_to_variable["stacked_stage/block_000/dense/kernel"]
  slices = lowering.variables[kernel].slice_variables
  assert len(slices) == impl.size
  assert all(s.shape.as_list() == slice_shape for s in slices)


def test_member_names_are_taken():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  models.layers(mesh, True)
  with pytest.raises(mtf.ShapeError, match="block_002/bias.*row 2"):
    with tf.compat.v1.variable_scope("block_002"):
      mtf.get_variable(mesh, "bias", [models.D])
  # Reuse inside the context returns the stacked variable.
  with mtf.stack_layer_variables(models.STAGE, models.members):
    with tf.compat.v1.variable_scope("block_000"):
      again = mtf.get_variable(mesh, "bias", [models.D])
  assert again.shape == mtf.Shape([models.STAGE, models.D])
  assert len(graph.all_variables) == 4


def test_member_count_must_match_the_stack_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.stack_layer_variables(models.STAGE, lambda name: [name]):
    with pytest.raises(mtf.ShapeError, match="1 member names.*'stage'.*4"):
      mtf.get_variable(mesh, "w", [models.D])


def test_autostack_leaves_layer_stacked_variables_alone():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  models.layers(mesh, True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(*STAGE_4)
  lowering = mtf.Lowering(graph, {mesh: impl}, autostack=True)
  # scale and bias ([stage, d] each) would otherwise share a stack.
  assert all(lowering.stack_group(v) is None for v in graph.all_variables)


def test_estimator_checkpoints_are_per_layer_both_ways(tmp_path, reference):
  """The estimator's Checkpointer writes name-based checkpoints from
  save_specs: stacked rows (split over "p" and "m") under per-layer keys,
  which restore into per-layer variables."""
  ref_values, _, ref_path = reference
  model_dir = os.path.join(tmp_path, "model")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(*STAGE_2_2D)
  _read_eager(impl, True)
  mtf.storage.checkpointing.restore_into(impl, ref_path)
  step = tf.Variable(7, dtype=tf.int64)
  path = checkpoints.Checkpointer(model_dir, impl, step).save(7)
  saved = mtf.storage.checkpointing.load_variables(path)
  assert sorted(saved) == sorted(models.MEMBERS + ["global_step"])
  _assert_same({k: v for k, v in saved.items() if k != "global_step"},
               ref_values)
  per_layer = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "d:all")
  restored_step = tf.Variable(0, dtype=tf.int64)
  checkpoints.Checkpointer(model_dir, per_layer, restored_step).restore()
  _assert_same(_read_eager(per_layer, False), ref_values)
  assert int(restored_step.numpy()) == 7


def test_mtf_layers_start_as_their_per_layer_selves():
  """mtf.layers.dense (kernel seeded from its scope), layer_norm and
  embedding_weights inside the context."""
  stage = mtf.Dimension("stage", 3)
  d = mtf.Dimension("d", 4)
  h = mtf.Dimension("h", 6)

  def build(mesh):
    x = mtf.zeros(mesh, [models.BATCH, d])
    mtf.layers.dense(x, h, name="dense")
    mtf.layers.layer_norm(x, d)
    mtf.layers.embedding_weights(mesh, h, d, tf.float32, name="emb")

  def initial(stacked):
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(*UNSPLIT)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    if stacked:
      def names(full_name):
        return [full_name.replace("layer_000", f"layer_{i:03d}")
                for i in range(3)]
      with mtf.stack_layer_variables(stage, names):
        with tf.compat.v1.variable_scope("decoder/layer_000"):
          build(mesh)
    else:
      for i in range(3):
        with tf.compat.v1.variable_scope(f"decoder/layer_{i:03d}"):
          build(mesh)
    lowering = mtf.Lowering(graph, {mesh: impl})
    values = {v.name: lowering.export_to_tf_tensor(v.outputs[0]).numpy()
              for v in graph.all_variables}
    return models.rows_by_member(values, graph)

  expected = initial(False)
  assert "decoder/layer_002/dense/kernel" in expected
  _assert_same(initial(True), expected)


def test_each_row_is_written_in_blocks_by_its_holders():
  """Stage split over "p" (2 rows per processor), h over "m": a row is
  saved as the two halves its holders keep, no full copy anywhere."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(*STAGE_2_2D)
  _read_eager(impl, True)
  node = impl._lookup_dependency("block_003")  # pylint: disable=protected-access
  kernel = node.child("dense").child("kernel")
  blocks = dict(kernel.blocks())
  assert sorted(blocks) == ["8 16 0,8:0,8", "8 16 0,8:8,8"]
  # Rows 2-3 live on p = 1: processors 4-7 (p is the first mesh dimension).
  assert sorted(p for pnums in blocks.values() for p in pnums) == [4, 5, 6, 7]
  assert kernel.read_block(4).shape.as_list() == [8, 8]


def _rows(mesh, first_row_only=False):
  """Every layer's variables, one row at a time (row=i), as a list of
  dicts; with `first_row_only`, layer 1's row is asked for first, so the
  stacked variables are created under row=1."""
  order = [1, 0, 2, 3] if first_row_only else range(models.LAYERS)
  rows = {}
  for i in order:
    with mtf.stack_layer_variables(models.STAGE, models.members, row=i):
      with tf.compat.v1.variable_scope("block_000"):
        rows[i] = models.layer_variables(mesh)
  return [rows[i] for i in range(models.LAYERS)]


@pytest.mark.parametrize("mode,mesh", [
    ("eager", UNSPLIT), ("eager", STAGE_4), ("function", STAGE_2_2D),
    ("graph", STAGE_4), ("simd", STAGE_4)])
def test_a_row_is_its_layers_variable_from_the_same_stacked_one(mode, mesh):
  """Under row=i get_variable returns layer i's variable (of the layer's
  shape) read from the stacked variable, which it creates or reuses: the
  graph holds the stacked variables only, their members as without row."""
  impl = mtf_testing.make_impl(mode, *mesh)
  graphs = []

  def build_and_lower():
    graph = mtf.Graph()
    graphs.append(graph)
    mesh_ = mtf.Mesh(graph, "mesh")
    rows = _rows(mesh_, first_row_only=True)
    stacked = models.layers(mesh_, True)
    lowering = mtf.Lowering(graph, {mesh_: impl})
    return lowering, {
        f"{kind}/{i}": [lowering.export_to_tf_tensor(layer[kind])
                        for layer in (rows[i], stacked[i])]
        for i in range(models.LAYERS) for kind in rows[i]}

  values = mtf_testing.run_in_mode(mode, build_and_lower, impl)
  graph = graphs[-1]
  assert len(graph.all_variables) == len(models.VARIABLES)
  assert all(v.member_names is not None for v in graph.all_variables)
  for name, (row, expected) in values.items():
    np.testing.assert_array_equal(row, expected, err_msg=name)


def test_row_values_equal_the_per_layer_model():
  """The rows start as the per-layer variables do (same names, same
  values), and a stage-split row is the full layer's value."""
  def build(mesh_shape, layout, use_rows):
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    layers = _rows(mesh) if use_rows else models.layers(mesh, False)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return {f"block_{i:03d}/{k}": lowering.export_to_tf_tensor(v).numpy()
            for i, layer in enumerate(layers) for k, v in layer.items()}

  expected = build(*UNSPLIT, False)
  _assert_same(build(*STAGE_4, True), expected)
  _assert_same(build(*STAGE_2_2D, True), expected)


def test_a_row_outside_the_stack_is_named():
  with pytest.raises(ValueError, match=r"row=4 .*'stage'.*\[0, 4\)"):
    with mtf.stack_layer_variables(models.STAGE, models.members, row=4):
      pass


def test_a_reused_stacked_variable_makes_no_row_initializers(monkeypatch):
  """A pipeline looks its stacked variables up once per iteration: only
  the variable's first creation may derive its rows' initializers (and
  only when it initialises), not every lookup."""
  calls = []
  real = layer_stacking._row_initializer  # pylint: disable=protected-access
  monkeypatch.setattr(layer_stacking, "_row_initializer",
                      lambda *a: calls.append(a) or real(*a))
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  for _ in range(3):
    with mtf.stack_layer_variables(models.STAGE, models.members):
      with tf.compat.v1.variable_scope("block_000"):
        mtf.get_variable(mesh, "bias", [models.D])
  assert not calls
