"""auto_mtf.layout and layout_and_mesh_shape: the original's cases, and
importing without OR-tools."""

import os
import pathlib
import subprocess
import sys

import pytest

import mesh_tensorflow as mtf
import mesh_tensorflow.auto_mtf
from mesh_tensorflow.auto_mtf import api

ROOT = str(pathlib.Path(__file__).resolve().parents[2])

A = mtf.Dimension("a", 10)
B = mtf.Dimension("b", 5)
C = mtf.Dimension("c", 20)


def _einsum_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = mtf.zeros(mesh, "a:10,b:5")
  y = mtf.zeros(mesh, "b:5,c:20")
  return graph, mtf.einsum([x, y], "a:10,c:20")


def test_layout():
  graph, z = _einsum_graph()
  mesh_shape = mtf.convert_to_shape("m1:4,m2:2")
  rules = mtf.auto_mtf.layout(graph, mesh_shape, [z])
  assert rules.tensor_dimension_to_mesh_axis(A, mesh_shape) == 1
  assert rules.tensor_dimension_to_mesh_axis(B, mesh_shape) is None
  assert rules.tensor_dimension_to_mesh_axis(C, mesh_shape) == 0


def test_layout_and_mesh_shape():
  graph, z = _einsum_graph()
  rules, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [z])
  assert rules.tensor_dimension_to_mesh_axis(A, mesh_shape) == 1
  assert rules.tensor_dimension_to_mesh_axis(B, mesh_shape) is None
  assert rules.tensor_dimension_to_mesh_axis(C, mesh_shape) == 0
  assert list(mesh_shape.dims) == [mtf.Dimension("mesh_0", 4),
                                   mtf.Dimension("mesh_1", 2)]
  rules, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [z], 1)
  for dim in (A, B, C):  # neither 10 nor 20 divides by 8
    assert rules.tensor_dimension_to_mesh_axis(dim, mesh_shape) is None
  assert list(mesh_shape.dims) == [mtf.Dimension("mesh_0", 8)]


def _shapes(*args):
  return sorted(api._mesh_shape_iterator(*args))


def test_mesh_shape_iterator():
  assert _shapes(1) == [[1]]
  assert _shapes(2) == [[2]]
  assert _shapes(4) == sorted([[4], [2, 2]])
  assert _shapes(8) == sorted([[8], [4, 2], [2, 2, 2]])
  assert _shapes(512) == sorted([
      [512], [256, 2], [128, 4], [128, 2, 2], [64, 8], [64, 4, 2],
      [64, 2, 2, 2], [32, 16], [32, 8, 2], [32, 4, 4], [32, 4, 2, 2],
      [32, 2, 2, 2, 2], [16, 16, 2], [16, 8, 4], [16, 8, 2, 2],
      [16, 4, 4, 2], [16, 4, 2, 2, 2], [16, 2, 2, 2, 2, 2], [8, 8, 8],
      [8, 8, 4, 2], [8, 8, 2, 2, 2], [8, 4, 4, 4], [8, 4, 4, 2, 2],
      [8, 4, 2, 2, 2, 2], [8, 2, 2, 2, 2, 2, 2], [4, 4, 4, 4, 2],
      [4, 4, 4, 2, 2, 2], [4, 4, 2, 2, 2, 2, 2], [4, 2, 2, 2, 2, 2, 2, 2],
      [2, 2, 2, 2, 2, 2, 2, 2, 2]])
  assert _shapes(512, 1) == [[512]]
  assert _shapes(512, 2) == sorted([[512], [256, 2], [128, 4], [64, 8],
                                    [32, 16]])


def test_mesh_shape_iterator_beyond_powers_of_two():
  assert _shapes(12) == sorted([[12], [6, 2], [4, 3], [3, 2, 2]])
  with pytest.raises(ValueError, match="num_machines.*0"):
    _shapes(0)


def test_choose_layout_reports_its_prediction():
  graph, z = _einsum_graph()
  choice = api.choose_layout(graph, "m1:4;m2:2", [z])
  assert choice.layout_rules.to_string == "a:m2;c:m1"
  # x a:10,b:5 -> 5x5; y b:5,c:20 -> 5x5; z -> 5x5; float32 and all live.
  assert choice.peak_memory_bytes == 3 * 25 * 4
  assert choice.predicted_step_seconds is None
  assert "layout_rules='a:m2;c:m1'" in choice.describe()


def test_importing_without_ortools_works_and_the_search_names_the_extra():
  script = (
      "import sys\n"
      "sys.modules['ortools'] = None\n"  # makes `import ortools` fail
      "import mesh_tensorflow as mtf\n"
      "import mesh_tensorflow.auto_mtf\n"
      "g = mtf.Graph(); m = mtf.Mesh(g, 'm'); mtf.zeros(m, 'a:4')\n"
      "try:\n"
      "  mtf.auto_mtf.layout(g, 'x:2')\n"
      "except ImportError as e:\n"
      "  print('ERROR', e)\n")
  result = subprocess.run(
      [sys.executable, "-c", script], capture_output=True, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
      cwd=ROOT, timeout=300, check=True)
  assert "ERROR the layout search needs OR-tools" in result.stdout
  assert 'mesh-tensorflow-tf2[auto_mtf]' in result.stdout
