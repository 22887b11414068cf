"""Data-parallel sharding: which dimension is split, shard dimension layouts,
views, sharded parameters and the errors.

Training results are compared in test_sharded_training.py; the lowering's
counters (bytes, slots, work) in test_sharding_counters.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.strategies import data_parallel_sharding as dps
from tests import mtf_testing
from tests import sharding_training

D_MODEL = mtf.Dimension("d_model", 16)
D_FF = mtf.Dimension("d_ff", 64)
HEADS = mtf.Dimension("heads", 4)
ODD = mtf.Dimension("odd", 3)


def _sharding(mesh_shape="b:4;m:2", layout="batch:b;d_ff:m", **kwargs):
  return mtf.DataParallelSharding(mesh_shape, layout, **kwargs)


def _names(shape):
  return [d.name for d in shape.dims]


def test_the_largest_unsplit_divisible_dimension_is_split():
  sharding = _sharding(layout="batch:b")
  assert _names(sharding.update_shape([D_MODEL, D_FF])) == [
      "d_model", "d_ff@b"]
  # d_ff is split over m: d_model is the one left.
  sharding = _sharding()
  assert _names(sharding.update_shape([D_MODEL, D_FF])) == [
      "d_model@b", "d_ff"]
  # Sizes are kept, and ties go to the first dimension.
  shape = sharding.update_shape([mtf.Dimension("x", 8),
                                 mtf.Dimension("y", 8)])
  assert _names(shape) == ["x@b", "y"]
  assert shape.to_integer_list == [8, 8]


def test_update_shape_is_idempotent_and_deterministic():
  sharding = _sharding()
  once = sharding.update_shape([D_MODEL, D_FF, HEADS])
  assert sharding.update_shape(once) == once
  assert _sharding().update_shape([D_MODEL, D_FF, HEADS]) == once


def test_kept_whole_with_the_reason_recorded():
  sharding = _sharding()
  assert sharding.plan_variable("bias", [ODD]) == mtf.Shape([ODD])
  assert "no unsplit dimension whose size b (size 4) divides" in (
      sharding.decisions["bias"])
  # Split over the data-parallel dimension by its own layout already.
  experts = mtf.Dimension("experts", 4)
  sharding = _sharding(layout="batch:b;experts:b")
  assert sharding.plan_variable("w", [experts, D_MODEL]) == mtf.Shape(
      [experts, D_MODEL])
  assert "splits it over b already" in sharding.decisions["w"]
  sharding.plan_variable("v", [D_MODEL])
  assert sharding.decisions["v"] == "sharded: d_model@b over b"


def test_every_data_parallel_mesh_dimension_gets_its_own_dimension():
  sharding = _sharding("a:2;b:4", "outer_batch:a;batch:b")
  assert [d.name for d in sharding.data_mesh_dims] == ["a", "b"]
  shape = sharding.update_shape([D_MODEL, D_FF])
  assert _names(shape) == ["d_model@b", "d_ff@a"]
  # Explicit data-parallel dimensions.
  sharding = _sharding("a:2;b:4", "batch:b", data_mesh_dims=["a"])
  assert _names(sharding.update_shape([D_MODEL, D_FF])) == [
      "d_model", "d_ff@a"]
  with pytest.raises(mtf.LayoutError, match="'c' is not a dimension"):
    _sharding(data_mesh_dims=["c"])


def test_shard_dimensions_are_split_over_their_mesh_dimension():
  rules = mtf.convert_to_layout_rules("batch:b")
  mesh = mtf.convert_to_shape("b:4;m:2")
  assert rules.tensor_layout(mtf.Shape([mtf.Dimension("d_ff@m", 8)]),
                             mesh) == mtf.TensorLayout([1])
  # A rule naming the shard dimension wins; an unknown mesh dimension is
  # ignored, as for any rule.
  rules = mtf.convert_to_layout_rules([("d_ff@m", "b")])
  assert rules.tensor_dimension_to_mesh_axis(
      mtf.Dimension("d_ff@m", 8), mesh) == 0
  assert rules.tensor_dimension_to_mesh_axis(
      mtf.Dimension("d_ff@z", 8), mesh) is None
  assert mtf.shard_dimension_name("d_ff", "b") == "d_ff@b"
  assert mtf.shape.split_shard_dimension_name("d_ff@b") == ("d_ff", "b")
  assert mtf.shape.split_shard_dimension_name("d_ff") == ("d_ff", None)


def test_base_shape_undoes_the_renaming():
  sharding = _sharding()
  assert dps.base_shape(sharding.update_shape([D_MODEL, D_FF])) == (
      mtf.Shape([D_MODEL, D_FF]))


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_sharded_parameter_is_stored_in_shards_and_gathered_where_used(mode):
  mesh_shape, layout = "b:4;m:2", "batch:b;d_ff:m"
  init = np.arange(D_MODEL.size * D_FF.size, dtype=np.float32).reshape(
      D_MODEL.size, D_FF.size)
  info = {}

  def build(mesh):
    mtf.shard_data_parallel(mesh, mesh_shape, layout, shard_parameters=True)
    w = mtf.get_variable(mesh, "w", [D_MODEL, D_FF], initializer=init)
    again = mtf.get_variable(mesh, "w", [D_MODEL, D_FF])
    info["var"] = mesh.graph.trainable_variables[0]
    info["value"], info["again"] = w, again
    return {"w": w, "twice": w + again}, None, {}

  got, _ = mtf_testing.run_program(mesh_shape, layout, mode, build,
                                   fetch_variables=False)
  np.testing.assert_array_equal(got["w"], init)
  np.testing.assert_array_equal(got["twice"], 2 * init)
  var = info["var"]
  assert _names(var.shape) == ["d_model@b", "d_ff"]
  assert info["value"].shape == mtf.Shape([D_MODEL, D_FF])
  assert info["again"].shape == mtf.Shape([D_MODEL, D_FF])
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  assert impl.slice_shape(var.shape) == [4, 32]


def test_sharded_parameter_reuse_with_another_shape_fails():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.shard_data_parallel(mesh, "b:4", "batch:b", shard_parameters=True)
  mtf.get_variable(mesh, "w", [D_MODEL, D_FF])
  with pytest.raises(mtf.ShapeError, match="cannot be reused"):
    mtf.get_variable(mesh, "w", [D_FF, D_MODEL])


def test_sharded_parameters_must_come_before_variables():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.get_variable(mesh, "w", [D_MODEL])
  with pytest.raises(ValueError, match="before variables are created"):
    mtf.shard_data_parallel(mesh, "b:4", "batch:b", shard_parameters=True)
  # Sharded updates may be asked for at any time before apply_grads.
  assert mtf.shard_data_parallel(mesh, "b:4", "batch:b").shard_weight_update


def test_no_sharding_asked_sets_none():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  assert mtf.shard_data_parallel(mesh, "b:4", "batch:b",
                                 shard_weight_update=False) is None
  assert dps.sharding_of(mesh) is None
  assert not mesh.extensions


def test_lowering_on_another_mesh_shape_names_both():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.shard_data_parallel(mesh, "b:4", "batch:b")
  mtf.get_variable(mesh, "w", [D_MODEL])
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("b:8", "batch:b")
  with pytest.raises(mtf.LayoutError, match=r"b=4.*lowered on Shape\[b=8\]"):
    mtf.Lowering(graph, {mesh: impl})


def test_variable_view_assigns_the_renamed_value_back():
  init = np.arange(D_MODEL.size, dtype=np.float32)
  mesh_shape, layout = "b:4", "batch:b"

  def build(mesh):
    w = mtf.get_variable(mesh, "w", [D_MODEL], initializer=init)
    view = mtf.VariableView(w.operation, [mtf.Dimension("d_model@b", 16)])
    assert view.name == "w" and view.mesh is mesh
    update = mtf.assign(view, view.value * 2.0)
    read = mtf.read_variable(w, dependencies=[update])
    return {"after": read}, None, {}

  got, _ = mtf_testing.run_program(mesh_shape, layout, "function", build,
                                   fetch_variables=False)
  np.testing.assert_array_equal(got["after"], 2 * init)


def test_variable_view_needs_the_same_sizes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", [D_MODEL, D_FF])
  with pytest.raises(mtf.ShapeError, match="same dimension sizes"):
    mtf.VariableView(w.operation, [D_FF, D_MODEL])


def test_assign_still_refuses_a_computed_value():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", [D_MODEL])
  with pytest.raises(ValueError, match="not the value of a variable"):
    mtf.assign(w * 2.0, w)
  # A reshape of a computed value is no variable either.
  renamed = mtf.rename_dimension(w * 2.0, "d_model", "x")
  with pytest.raises(ValueError, match="not the value of a variable"):
    mtf.assign(renamed, renamed)


def test_default_data_mesh_dims_are_those_of_batch_dimensions():
  assert dps.default_data_mesh_dims(
      "rows:2;cols:4", "batch:rows;d_ff:cols") == ["rows"]
  assert dps.default_data_mesh_dims("a:2;b:2", "outer_batch:a;batch:b") == [
      "a", "b"]
  assert dps.default_data_mesh_dims("m:8", "d_ff:m") == []



def _gathers_of_sharded_mlp(recompute):
  """allconcat calls over "b" of a 2-layer MLP with sharded parameters,
  each layer's weights created inside its (maybe recomputed) block."""
  batch = mtf.Dimension("batch", 8)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.shard_data_parallel(mesh, "b:4", "batch:b", shard_parameters=True)
  x = mtf.ones(mesh, [batch, D_MODEL])

  def block(h, name):
    w = mtf.get_variable(mesh, name, [D_MODEL, D_FF])
    h = mtf.tanh(mtf.einsum([h, w], [batch, D_FF]))
    return mtf.reduce_sum(h, output_shape=[batch]) * mtf.ones(
        mesh, [batch, D_MODEL])

  h = x
  for name in ("w0", "w1"):
    if recompute:
      h = mtf.recompute_grad(lambda t, n=name: block(t, n), [h])
    else:
      h = block(h, name)
  loss = mtf.reduce_sum(h)
  variables = graph.trainable_variables
  mtf.gradients([loss], [v.outputs[0] for v in variables])
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("b:4", "batch:b")
  counters = dict(mtf.Lowering(graph, {mesh: impl}).counters)
  return counters.get("comm/allconcat/b/calls", 0)


def test_recompute_blocks_gather_sharded_parameters_again():
  # Each weight is gathered for the forward pass; a recomputed block
  # gathers it again in the backward pass instead of keeping it.
  assert _gathers_of_sharded_mlp(recompute=False) == 2
  assert _gathers_of_sharded_mlp(recompute=True) == 4


def test_uneven_splits_shard_what_no_size_divides():
  """With uneven splits, a variable that no data-parallel mesh dimension
  divides is sharded anyway (padded), over the dimension that leaves the
  smallest shard; a divisible dimension is still preferred."""
  uneven = mtf.convert_to_layout_rules("batch:b;d_ff:m").with_uneven()
  sharding = _sharding(layout=uneven)
  assert _names(sharding.plan_variable("bias", [ODD])) == ["odd@b"]
  assert sharding.decisions["bias"] == "sharded: odd@b over b (padded 3 -> 4)"
  assert _names(sharding.update_shape([ODD, D_MODEL])) == [
      "odd", "d_model@b"]
  # Over b:4, 6 leaves shards of 2 of 6, 5 shards of 2 of 5.
  x, y = mtf.Dimension("x", 5), mtf.Dimension("y", 6)
  assert _names(sharding.update_shape([x, y])) == ["x", "y@b"]
  # A dimension of 1 would be a whole copy: kept whole, as without.
  one = mtf.Dimension("one", 1)
  assert sharding.plan_variable("s", [one]) == mtf.Shape([one])
  assert "no unsplit dimension whose size b" in sharding.decisions["s"]
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("b:4;m:2", uneven)
  assert impl.slice_shape(sharding.update_shape([ODD])) == [1]


def _uneven_optimizers():
  return [("adam/", mtf.optimize.AdamWeightDecayOptimizer(0.01)),
          ("adafactor/", mtf.optimize.AdafactorOptimizer(
              min_dim_size_to_factor=4))]


def _uneven_mlp_loss(mesh):
  """One MLP per optimizer of _uneven_optimizers, of sizes 8 does not
  divide (but the batch)."""
  rng = np.random.RandomState(0)
  batch, d_in, hidden, d_out, gain_dim = (
      mtf.Dimension(n, k) for n, k in
      (("batch", 8), ("d_in", 6), ("hidden", 5), ("d_out", 4), ("gain", 3)))
  x = mtf_testing.import_array(
      mesh, rng.randn(8, 6).astype(np.float32), [batch, d_in])
  y = mtf_testing.import_array(
      mesh, rng.randn(8, 4).astype(np.float32), [batch, d_out])
  losses = []
  for prefix, _ in _uneven_optimizers():
    with tf.compat.v1.variable_scope(prefix.rstrip("/")):
      w1 = mtf.get_variable(mesh, "w1", [d_in, hidden])
      w2 = mtf.get_variable(mesh, "w2", [hidden, d_out])
      gain = mtf.get_variable(mesh, "gain", [gain_dim],
                              initializer=tf.ones_initializer())
    h = mtf.relu(mtf.einsum([x, w1], [batch, hidden]))
    out = mtf.einsum([h, w2], [batch, d_out]) * mtf.reduce_mean(gain)
    losses.append(mtf.reduce_mean(mtf.square(out - y)))
  return mtf.add_n(losses)


@pytest.mark.parametrize("sharding", ["update", "parameters"])
def test_uneven_sharding_trains_to_the_same_values(sharding):
  """MLPs with no size 8 divides (Adam, and Adafactor whose factored
  statistics reduce over the padded shards), trained with uneven sharding
  over b:8, reach the unsharded values, weights and slots; the slots (and
  with sharded parameters the weights) are held in padded shards."""
  layout = mtf.convert_to_layout_rules("batch:b").with_uneven()
  args = (_uneven_mlp_loss, _uneven_optimizers, "b:8", layout, "function")
  want, _, _ = sharding_training.train_variables(*args, "none", 3)
  got, _, slice_shapes = sharding_training.train_variables(*args, sharding,
                                                           3)
  assert set(got) == set(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert slice_shapes["adam/gain/adam_m"] == [1]
  assert slice_shapes["adam/w1/adam_m"] == [1, 5]  # d_in 6 -> 8.
  assert slice_shapes["adam/gain"] == ([1] if sharding == "parameters"
                                       else [3])
