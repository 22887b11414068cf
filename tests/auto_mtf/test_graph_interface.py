"""graph_interface.GraphInterface over a tf.Graph and an mtf.Graph: the
original's cases (names, shapes, sizes, memory contents, cost graph)."""

import pytest
import tensorflow as tf
from tensorflow.core.framework import cost_graph_pb2
from tensorflow.core.framework import tensor_shape_pb2
from tensorflow.core.framework import types_pb2

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import graph_interface


def _expected_cost_graph(sizes=True, devices=True):
  """X[3,4], Y[4,5] int32 and Z1, Z2 = X @ Y, Z1 final."""
  graph = cost_graph_pb2.CostGraphDef()
  specs = [("X", [3, 4], []), ("Y", [4, 5], []),
           ("Z1", [3, 5], [0, 1]), ("Z2", [3, 5], [0, 1])]
  for i, (name, shape, inputs) in enumerate(specs):
    node = graph.node.add(name=name, id=i)
    if devices:
      node.device = "/device:CPU:0"
    for producer in inputs:
      node.input_info.add(preceding_node=producer, preceding_port=0)
    info = node.output_info.add(alias_input_port=-1, dtype=types_pb2.DT_INT32)
    if sizes:
      info.size = 4 * shape[0] * shape[1]
      info.shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
          dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in shape]))
    if name == "Z1":
      node.is_final = True
  return graph.SerializeToString()


def _check_common(graph):
  assert list(graph.get_all_operation_names()) == ["X", "Y", "Z1", "Z2"]
  assert list(graph.get_operation_input_names("X")) == []
  assert list(graph.get_operation_input_names("Z1")) == ["X:0", "Y:0"]
  assert list(graph.get_operation_input_names("Z2")) == ["X:0", "Y:0"]
  for name in ("X", "Y", "Z1", "Z2"):
    assert list(graph.get_operation_output_names(name)) == [name + ":0"]
    assert graph.get_tensor_dtype(name + ":0") == tf.int32
    assert graph.is_tensor_on_canonical_device(name + ":0")
  assert list(graph.get_all_tensor_names()) == ["X:0", "Y:0", "Z1:0", "Z2:0"]
  assert graph.get_tensor_shape("X:0") == tf.TensorShape([3, 4])
  assert graph.get_tensor_shape("Y:0") == tf.TensorShape([4, 5])
  assert graph.get_tensor_shape("Z2:0") == tf.TensorShape([3, 5])
  assert [graph.get_tensor_num_entries(n + ":0")
          for n in ("X", "Y", "Z1", "Z2")] == [12, 20, 15, 15]
  assert graph.get_tensor_size("Y:0") == 80
  graph.set_tensor_final("Z1:0")
  assert graph.compute_memory_contents_under_schedule([0, 1, 2, 3]) == [
      {"X:0"}, {"X:0", "Y:0"}, {"X:0", "Y:0", "Z1:0"},
      {"X:0", "Y:0", "Z1:0", "Z2:0"}]
  assert graph.compute_memory_contents_under_schedule([0, 1, 3, 2]) == [
      {"X:0"}, {"X:0", "Y:0"}, {"X:0", "Y:0", "Z2:0"},
      {"X:0", "Y:0", "Z1:0"}]
  for schedule in ([0, 1, 2, 3], [0, 1, 3, 2], [1, 0, 3, 2]):
    # The changes replay to the contents.
    replayed, in_memory = [], set()
    for added, freed in graph.compute_memory_deltas_under_schedule(schedule):
      in_memory.difference_update(freed)
      in_memory.update(added)
      replayed.append(set(in_memory))
    assert replayed == graph.compute_memory_contents_under_schedule(schedule)


def test_tensorflow_graph():
  tf_graph = tf.Graph()
  with tf_graph.as_default(), tf.device("/device:CPU:0"):
    x = tf.zeros([3, 4], dtype=tf.int32, name="X")
    y = tf.zeros([4, 5], dtype=tf.int32, name="Y")
    tf.matmul(x, y, name="Z1")
    tf.matmul(x, y, name="Z2")
  graph = graph_interface.GraphInterface(tf_graph,
                                         canonical_device="/device:CPU:0")
  _check_common(graph)
  assert graph.get_operation_mtf_dimension_names("Z1") == set()
  assert graph.get_tensor_mtf_dimension_names("X:0") == []
  assert graph.get_tensor_device("X:0") == "/device:CPU:0"
  assert graph.compute_cost_graph().SerializeToString() == (
      _expected_cost_graph())
  assert graph.compute_cost_graph(
      devices=["/device:CPU:0"]).SerializeToString() == _expected_cost_graph()
  assert graph.compute_cost_graph(devices=[]).SerializeToString() == (
      _expected_cost_graph(sizes=False))


def test_mesh_tensorflow_graph():
  mtf_graph = mtf.Graph()
  mesh = mtf.Mesh(mtf_graph, "my_mesh")
  x = mtf.Constant(mesh, 0, shape=mtf.convert_to_shape("a:3,b:4"),
                   dtype=tf.int32, name="X").outputs[0]
  y = mtf.Constant(mesh, 0, shape=mtf.convert_to_shape("b:4,c:5"),
                   dtype=tf.int32, name="Y").outputs[0]
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z1")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z2")
  graph = graph_interface.GraphInterface(mtf_graph)
  _check_common(graph)
  assert graph.get_operation_mtf_dimension_names("X") == {"a", "b"}
  assert graph.get_operation_mtf_dimension_names("Z1") == {"a", "b", "c"}
  assert graph.get_tensor_mtf_dimension_names("Z1:0") == ["a", "c"]
  assert graph.get_tensor_device("X:0") is None
  assert graph.get_operation_device("X") is None
  # Per processor, as the original counts: ceil(entries / mesh size).
  assert graph.get_tensor_num_entries("X:0", {"a": "m"}, {"m": 2}) == 6
  assert graph.get_tensor_num_entries("X:0", {"a": "m"}, {"m": 5}) == 3
  assert graph.get_tensor_size("Y:0", {"c": "m"}, {"m": 5}) == 16
  expected = _expected_cost_graph(devices=False)
  assert graph.compute_cost_graph().SerializeToString() == expected
  assert graph.compute_cost_graph(devices=[]).SerializeToString() == expected


def test_not_a_graph():
  with pytest.raises(TypeError, match="tf.Graph or an mtf.Graph, got str"):
    graph_interface.GraphInterface("hello")


def test_unknown_names_are_named():
  graph = graph_interface.GraphInterface(mtf.Graph())
  with pytest.raises(KeyError, match="no operation 'W'"):
    list(graph.get_operation_input_names("W"))
  with pytest.raises(KeyError, match="no tensor 'W:0'"):
    graph.set_tensor_final("W:0")
