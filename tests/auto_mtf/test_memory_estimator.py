"""memory_estimator.MemoryEstimator: the original's cases."""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import memory_estimator


def _estimator():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "lowering_context_mesh")
  a, b, c = mtf.Dimension("a", 3), mtf.Dimension("b", 4), mtf.Dimension("c", 5)
  x = mtf.Constant(mesh, 0, mtf.Shape([a, b]), tf.int32, "X").outputs[0]
  y = mtf.Constant(mesh, 0, mtf.Shape([b, c]), tf.int32, "Y").outputs[0]
  z = mtf.EinsumOperation([x, y], mtf.Shape([a, c]), name="Z").outputs[0]
  return memory_estimator.MemoryEstimator(
      graph, mtf.Shape([("m1", 4), ("m2", 3)]), [z])


def test_layout_validator():
  validator = _estimator().get_layout_validator()
  assert validator.splittable_mtf_dimension_names == {"a", "b", "c"}
  assert not validator.is_valid_assignment("a", "m1")
  assert validator.is_valid_assignment("a", "m2")


def test_graph_interface_marks_outputs_final():
  estimator = _estimator()
  graph = estimator.get_graph_interface()
  assert graph is estimator.get_graph_interface()
  assert list(graph.get_all_operation_names()) == ["X", "Y", "Z"]
  assert graph.get_tensor_shape("X:0") == tf.TensorShape([3, 4])
  assert graph.get_tensor_shape("Z:0") == tf.TensorShape([3, 5])
  assert not graph.is_tensor_final("Y:0")
  assert graph.is_tensor_final("Z:0")


def test_variables_stay_in_memory():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", "a:4,b:4")
  y = mtf.reduce_sum(w * 2.0)
  interface = memory_estimator.MemoryEstimator(
      graph, "x:2", [y]).get_graph_interface()
  assert interface.is_tensor_final(w.operation.outputs[0].name)
