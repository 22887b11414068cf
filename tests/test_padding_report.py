"""mtf.padding_report: the padded dimensions and tensors of a graph."""

import io
import logging

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import mtf_testing

BATCH = mtf.Dimension("batch", 30)
D_MODEL = mtf.Dimension("d_model", 16)
VOCAB = mtf.Dimension("vocab", 259)


def _graph():
  """x [batch=30, d_model=16] . w [d_model, vocab=259] -> [batch, vocab]."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf_testing.import_array(mesh, np.zeros((30, 16), np.float32),
                               [BATCH, D_MODEL])
  w = mtf.get_variable(mesh, "w", [D_MODEL, VOCAB])
  y = mtf.einsum([x, w], output_shape=[BATCH, VOCAB])
  return graph, mesh, y


def _impl(rules, mesh_shape="batch:4;model:2"):
  layout = mtf.convert_to_layout_rules(rules).with_uneven()
  return mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)


def test_lists_dimensions_tensors_and_costs():
  graph, mesh, y = _graph()
  f = io.StringIO()
  report = mtf.padding_report(graph, {mesh: _impl("batch:batch;vocab:model")},
                              log_file=f)
  assert [(d.name, d.size, d.mesh_dim, d.pieces, d.padded_size)
          for d in report.dimensions] == [("batch", 30, "batch", 4, 32),
                                          ("vocab", 259, "model", 2, 260)]
  assert report.dimensions[0].percent == pytest.approx(100 * 2 / 30)
  by_name = {t.name: t for t in report.tensors}
  w = by_name["w:0"]
  assert (w.is_variable, w.dims, w.elements, w.padded_elements) == (
      True, ("vocab",), 16 * 259, 16 * 260)
  assert w.percent == pytest.approx(100 / 259)
  out = by_name[y.name]
  assert (out.is_variable, out.dims, out.elements, out.padded_elements) == (
      False, ("batch", "vocab"), 30 * 259, 32 * 260)
  # Memory: the one variable; compute: every other output (x, its import
  # and the einsum), padded or not.
  assert (report.variable_elements, report.padded_variable_elements) == (
      16 * 259, 16 * 260)
  others = [t for op in graph.operations for t in op.outputs
            if op not in graph.all_variables]
  assert report.activation_elements == sum(t.size for t in others)
  assert report.padded_activation_elements - report.activation_elements == (
      sum(t.padded_elements - t.elements for t in report.tensors
          if not t.is_variable))
  text = f.getvalue()
  assert text == "\n".join(report.lines) + "\n"
  assert "Padded dimension vocab (size 259) over model:2 -> 260 (+0.4%)" in (
      text)
  assert "Padded variable w:0 Shape[d_model=16, vocab=259] (vocab): " in text
  assert "Padding cost, memory of variables: 4144 -> 4160 elements" in text


def test_logs_its_lines(caplog):
  graph, mesh, _ = _graph()
  with caplog.at_level(logging.INFO, logger="absl"):
    report = mtf.padding_report(graph, {mesh: _impl("vocab:model")})
  assert report.lines
  for line in report.lines:
    assert line in caplog.text


def test_not_verbose_keeps_dimensions_and_totals():
  graph, mesh, _ = _graph()
  report = mtf.padding_report(graph, {mesh: _impl("vocab:model")},
                              verbose=False)
  assert len(report.tensors) > 1
  assert not any(line.startswith("Padded variable") or
                 line.startswith("Padded tensors") for line in report.lines)
  assert any(line.startswith("Padded dimension vocab") for line in
             report.lines)


@pytest.mark.parametrize("rules,uneven", [
    ("batch:batch;d_model:model", True),   # Both divide.
    ("vocab:model", False),                # Uneven splits off: no padding.
])
def test_nothing_padded_reports_nothing(rules, uneven):
  graph, mesh, _ = _graph()
  layout = mtf.convert_to_layout_rules(rules).with_uneven(uneven)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("batch:2;model:4", layout)
  f = io.StringIO()
  report = mtf.padding_report(graph, {mesh: impl}, log_file=f)
  assert (report.dimensions, report.tensors, report.lines) == ([], [], [])
  assert report.padded_variable_elements == report.variable_elements
  assert f.getvalue() == ""


def test_other_meshes_are_left_out():
  graph, mesh, _ = _graph()
  other = mtf.Mesh(graph, "other")
  mtf.get_variable(other, "v", [VOCAB])
  report = mtf.padding_report(graph, {mesh: _impl("vocab:model")})
  assert "v:0" not in {t.name for t in report.tensors}
  assert report.variable_elements == 16 * 259
