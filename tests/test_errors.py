"""Bad input raises a clear error naming what is at fault, before any TF op."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf


def _lower(graph, mesh, mesh_shape, layout):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  return mtf.Lowering(graph, {mesh: impl})


def test_non_divisible_split_names_dimension_and_mesh_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.relu(mtf.zeros(mesh, "batch:6,d:8"))
  with pytest.raises(mtf.IndivisibleError) as info:
    _lower(graph, mesh, "all:4", "batch:all")
  message = str(info.value)
  assert "'batch' (size 6)" in message
  assert "'all' (size 4)" in message
  assert "batch:all" in message
  assert isinstance(info.value, ValueError)


def test_two_dims_of_one_tensor_on_one_mesh_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.zeros(mesh, "a:8,b:8")
  with pytest.raises(mtf.LayoutError,
                     match="'a' and 'b'.*mesh dimension 'all'"):
    _lower(graph, mesh, "all:8", "a:all;b:all")


def test_einsum_size_mismatch_names_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:4,b:8")
  w = mtf.zeros(mesh, "b:6,c:2")
  with pytest.raises(mtf.ShapeError, match="'b' has size 8.*and 6"):
    mtf.einsum([x, w], output_shape="a:4,c:2")


def test_rule_for_a_mesh_dimension_the_mesh_lacks_is_no_error():
  # The original ignores it (T5's default rules name "ensemble"); the other
  # layout errors still name the rule at fault.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.zeros(mesh, "a:8,b:6")
  _lower(graph, mesh, "all:2", "a:all;b:rows")
  with pytest.raises(mtf.IndivisibleError, match="'b' \\(size 6\\)"):
    _lower(graph, mesh, "all:4", "b:all;a:rows")


def test_duplicate_dimension_names():
  with pytest.raises(mtf.ShapeError, match="duplicate dimension names \\['a'\\]"):
    mtf.Shape([mtf.Dimension("a", 2), mtf.Dimension("a", 2)])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:2,b:2")
  with pytest.raises(mtf.ShapeError, match="duplicate"):
    mtf.rename_dimension(x, "b", "a")


def test_mesh_without_implementation():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  other = mtf.Mesh(graph, "other")
  mtf.zeros(other, "a:2")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
  with pytest.raises(mtf.LayoutError, match="'other'"):
    mtf.Lowering(graph, {mesh: impl})


def test_import_shape_mismatch():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(mtf.ShapeError, match=r"\[2, 3\].*\[2, 4\]"):
    mtf.import_tf_tensor(mesh, np.zeros([2, 3], np.float32), "a:2,b:4")


def test_failed_lowering_leaves_no_tf_ops_behind():
  with tf.Graph().as_default() as tf_graph:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.get_variable(mesh, "w", "a:8,b:6")
    mtf.reduce_sum(mtf.relu(x))
    before = len(tf_graph.get_operations())
    with pytest.raises(mtf.IndivisibleError):
      _lower(graph, mesh, "all:4", "b:all")
    assert len(tf_graph.get_operations()) == before
    assert not tf.compat.v1.global_variables()


def test_unsplittable_dimension_split():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:8")
  mtf.slicewise(tf.identity, [x], splittable_dims=[x.shape[0]])
  with pytest.raises(mtf.LayoutError,
                     match="'b'.*mesh dimension 'all'"):
    _lower(graph, mesh, "all:8", "b:all")


def test_wrong_number_of_devices():
  with pytest.raises(mtf.LayoutError, match="needs 4 devices.*got 2"):
    mtf.placement_mesh_impl.PlacementMeshImpl("all:4", "", devices=["", ""])


def _indivisible_program():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.zeros([6]), "batch:6")
  y = mtf.reduce_sum(x)
  lowering = _lower(graph, mesh, "all:4", "batch:all")
  return lowering.export_to_tf_tensor(y)


@pytest.mark.parametrize("catch", [mtf.IndivisibleError, mtf.LayoutError,
                                   ValueError])
def test_mtf_errors_keep_their_type_through_a_user_tf_function(catch):
  # Autograph re-raises errors from a user's tf.function as their own type
  # only when the type can be rebuilt from one message string.
  with pytest.raises(catch, match="'batch' \\(size 6\\)") as info:
    tf.function(_indivisible_program)()
  assert isinstance(info.value, mtf.IndivisibleError)


def test_shape_errors_keep_their_type_through_a_user_tf_function():
  @tf.function
  def build():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    mtf.einsum([mtf.zeros(mesh, "a:4,b:8"), mtf.zeros(mesh, "b:6,c:2")],
               output_shape="a:4,c:2")
    return tf.constant(0)

  with pytest.raises(mtf.ShapeError, match="'b' has size 8"):
    build()
