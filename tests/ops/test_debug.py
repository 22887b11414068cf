"""Print and scalar_summary in every execution mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_print_prints_full_values(mode, capfd):
  impl = mtf_testing.make_impl(mode, "all:8", "a:all")

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, np.arange(8, dtype=np.float32), "a:8")
    y = mtf.Print(x * 2.0, [x], "x is", summarize=-1)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, lowering.export_to_tf_tensor(y)

  result = mtf_testing.run_in_mode(mode, build_and_lower, impl)
  np.testing.assert_array_equal(result, np.arange(8) * 2.0)
  err = capfd.readouterr().err
  assert "x is [0 1 2 3 4 5 6 7]" in err


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_scalar_summary_returns_tensor_and_is_collected(mode):
  summaries = {}
  impl = mtf_testing.make_impl(mode, "all:8", "a:all")

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, np.ones([8, 4], np.float32), "a:8,b:4")
    total = mtf.reduce_sum(x)
    same = mtf.scalar_summary("total", total)
    assert isinstance(same, mtf.Tensor)
    lowering = mtf.Lowering(graph, {mesh: impl})
    summaries.update(lowering.scalar_summaries)
    return lowering, [lowering.export_to_tf_tensor(same),
                      lowering.scalar_summaries["total"]]

  value, summary = mtf_testing.run_in_mode(mode, build_and_lower, impl)
  assert float(value) == 32.0 and float(summary) == 32.0
  assert list(summaries) == ["total"]


def test_scalar_summary_writes_with_a_default_writer(tmp_path):
  writer = tf.summary.create_file_writer(str(tmp_path))
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.scalar_summary("loss", mtf.constant(mesh, 3.5, mtf.Shape([])))
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
  with writer.as_default(step=7):
    mtf.Lowering(graph, {mesh: impl})
  writer.flush()
  (event_file,) = tmp_path.iterdir()
  values = [(e.step, v.tag, tf.make_ndarray(v.tensor))
            for e in tf.compat.v1.train.summary_iterator(str(event_file))
            for v in e.summary.value]
  assert values == [(7, "loss", np.float32(3.5))]
  del x
