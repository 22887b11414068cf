"""scheduler.minimize_peak_memory: the original's cases, plus the fix for
final inputs."""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import graph_interface
from mesh_tensorflow.auto_mtf import scheduler


def _constant(mesh, shape, name):
  return mtf.Constant(mesh, 0, shape=mtf.convert_to_shape(shape),
                      dtype=tf.int32, name=name).outputs[0]


@pytest.mark.parametrize("algorithm", ["NAIVE", "LIST"])
def test_schedule_is_topological(algorithm):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = _constant(mesh, "a:3,b:4", "X")
  y = _constant(mesh, "b:4,c:5", "Y")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z1")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z2")
  interface = graph_interface.GraphInterface(graph)
  interface.set_tensor_final("Z1:0")
  interface.set_tensor_final("Z2:0")
  schedule = list(scheduler.minimize_peak_memory(interface, algorithm))
  assert sorted(schedule[:2]) == [0, 1]
  assert sorted(schedule[2:]) == [2, 3]


def test_list_runs_what_frees_the_most_first():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = _constant(mesh, "a:3,b:4", "X")
  y = _constant(mesh, "b:4,c:5", "Y")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,b:4,c:5"), name="Z")
  w = mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"),
                          name="W").outputs[0]
  mtf.BroadcastOperation(w, mtf.convert_to_shape("a:3,b:4,c:5"), name="V")
  interface = graph_interface.GraphInterface(graph)
  interface.set_tensor_final("Z:0")
  interface.set_tensor_final("V:0")
  # Bytes freed: X -48, Y -80; then Z -240, W -60; after W: Z -112 (it now
  # frees X and Y), V -180. So X, Y, W, Z, V.
  assert scheduler.minimize_peak_memory(interface, "LIST") == [0, 1, 3, 2, 4]


def _single_use_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  _constant(mesh, "a:4", "X")
  y = _constant(mesh, "b:3", "Y")
  mtf.BroadcastOperation(y, mtf.convert_to_shape("b:3,c:2"), name="Z")
  return graph


def test_list_with_a_single_use_tensor():
  interface = graph_interface.GraphInterface(_single_use_graph())
  interface.set_tensor_final("X:0")
  interface.set_tensor_final("Z:0")
  # X frees -16, Y -12: Y first; then Z -24+12 = -12 beats X's -16.
  assert scheduler.minimize_peak_memory(interface, "LIST") == [1, 2, 0]


def test_list_with_a_tensor_nobody_reads():
  interface = graph_interface.GraphInterface(_single_use_graph())
  # X is read by nobody and not final: it costs nothing, so it goes first.
  assert scheduler.minimize_peak_memory(interface, "LIST") == [0, 1, 2]


def test_a_final_input_is_never_credited_as_freed():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = _constant(mesh, "a:64", "X")  # 256 bytes, final, read by P and Q
  mtf.BroadcastOperation(x, mtf.convert_to_shape("a:64,e:1"), name="P")
  mtf.BroadcastOperation(x, mtf.convert_to_shape("a:64,b:2"), name="Q")
  s = _constant(mesh, "c:4", "S")
  mtf.BroadcastOperation(s, mtf.convert_to_shape("c:4,d:25"), name="D")
  interface = graph_interface.GraphInterface(graph)
  for name in ("X:0", "Q:0", "D:0"):
    interface.set_tensor_final(name)
  # Bytes freed: S -16 first, then X -256 beats D -384; P (output unread)
  # 0; then D -384 beats Q -512: X stays in memory (final), so Q frees
  # nothing. The original, checking P's output instead of X for
  # finality, credited Q with X's 256 bytes once P ran and put Q first.
  assert scheduler.minimize_peak_memory(interface, "LIST") == [3, 0, 1, 4, 2]


def test_unknown_algorithm():
  interface = graph_interface.GraphInterface(_single_use_graph())
  with pytest.raises(NotImplementedError, match="'FAST'.*NAIVE, LIST"):
    scheduler.minimize_peak_memory(interface, "FAST")
