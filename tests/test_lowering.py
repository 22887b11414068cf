"""Lowering: export, lowered operations, master/slice copies, counters, log."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf


def _data_parallel_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(
      mesh, np.arange(64, dtype=np.float32).reshape(8, 8) / 64.0, "batch:8,io:8")
  w = mtf.get_variable(mesh, "w", "io:8,hidden:16",
                       initializer=tf.keras.initializers.Constant(0.5))
  loss = mtf.reduce_sum(mtf.einsum([x, w], "batch:8,hidden:16"))
  (grad,) = mtf.gradients([loss], [w])
  update = mtf.assign_sub(w, grad * 0.01)
  return graph, mesh, loss, update, w


def test_counters_count_collectives_and_compute():
  graph, mesh, loss, update, _ = _data_parallel_graph()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "batch:all")
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.lowered_operation(update)
  counters = dict(lowering.counters)
  # The weight gradient sums over the split batch dimension: one allreduce
  # of an [io, hidden] slice on each of 8 processors.
  assert counters["comm/allreduce/all/calls"] >= 1
  assert counters["comm/allreduce/all/bytes"] >= 8 * 8 * 16 * 4
  assert counters["compute/EinsumOperation/ops"] >= 2
  assert counters["compute/Variable/output_elements"] == 8 * 8 * 16
  del loss


def test_one_processor_mesh_does_not_communicate():
  graph, mesh, _, update, _ = _data_parallel_graph()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
  lowering = mtf.Lowering(graph, {mesh: impl})
  assert lowering.lowered_operation(update) is None  # eager
  assert not any(k.startswith("comm/") for k, _ in lowering.counters)


def test_log_file_has_variable_table_and_counters(tmp_path):
  graph, mesh, _, _, _ = _data_parallel_graph()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("b:2;m:4", "hidden:m")
  log_file = tmp_path / "lowering.log"
  mtf.Lowering(graph, {mesh: impl}, log_file=str(log_file))
  text = log_file.read_text()
  assert "w" in text and "[8, 16]" in text
  assert "128" in text and "32" in text  # elements, per processor
  assert "Counters:" in text and "comm/total_bytes" in text


def test_compat_mode_masters_and_slices():
  with tf.Graph().as_default():
    graph, mesh, loss, update, w = _data_parallel_graph()
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "hidden:all")
    lowering = mtf.Lowering(graph, {mesh: impl})
    train_op = lowering.lowered_operation(update)
    assert isinstance(train_op, tf.Operation)
    loss_value = lowering.export_to_tf_tensor(loss)
    master = lowering.variables[w.operation].master
    assert master.name == "w:0"
    assert master in tf.compat.v1.global_variables()
    slices = lowering.variables[w.operation].slice_variables
    assert len(slices) == 8
    assert all(s not in tf.compat.v1.global_variables() for s in slices)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      first = sess.run(loss_value)
      sess.run(train_op)
      # The master still holds the initial value until copied back.
      np.testing.assert_allclose(sess.run(master), np.full([8, 16], 0.5))
      sess.run(lowering.copy_slices_to_masters())
      updated = sess.run(master)
      assert not np.allclose(updated, 0.5)
      assert sess.run(loss_value) != first


def test_copy_ops_are_no_ops_in_eager_mode():
  graph, mesh, _, _, _ = _data_parallel_graph()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "hidden:all")
  lowering = mtf.Lowering(graph, {mesh: impl})
  assert lowering.copy_masters_to_slices() is None
  assert lowering.copy_slices_to_masters() is None


def test_tf_function_creates_variables_on_first_trace_only():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "batch:all")
  traces = []

  @tf.function
  def step(scale):
    traces.append(1)
    graph, mesh, loss, update, _ = _data_parallel_graph()
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowering.lowered_operation(update)
    return lowering.export_to_tf_tensor(loss) * scale

  losses = [float(step(tf.constant(1.0))) for _ in range(3)]
  assert losses[0] > losses[1] > losses[2]
  # A retrace (new input dtype) finds the same variables by name.
  assert float(step(tf.constant(1.0, tf.float32))) < losses[2]
  step(np.float64(1.0).astype(np.float32))
  assert len(impl.variable_store.eager_entries()) == 1


def test_lazy_allreduce_survives_reshape_and_add():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, np.ones([8, 8], np.float32), "a:8,b:8")
  y1 = mtf.reduce_sum(x, reduced_dim=mtf.Dimension("b", 8))
  y2 = mtf.reduce_sum(x * 2.0, reduced_dim=mtf.Dimension("b", 8))
  z = mtf.reshape(y1 + y2, "c:8")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "b:all")
  lowering = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(z), np.full([8], 24))
  assert dict(lowering.counters)["comm/allreduce/all/calls"] == 1


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:8", "a:all"), ("rows:2;cols:4", "a:rows;b:cols")])
def test_export_assembles_full_tensor(mesh_shape, layout):
  value = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, value, "a:8,b:16")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(x), value)
  slices = lowering.laid_out_tensor(x).tensor_list
  assert len(slices) == 8
  assert {s.device for s in slices} == {
      f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(8)}


def test_verify_slice_shapes_and_autostack_methods():
  graph, mesh, loss, _, _ = _data_parallel_graph()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "batch:all")
  lowering = mtf.Lowering(graph, {mesh: impl}, autostack=False)
  lowering.verify_slice_shapes(loss, lowering.tensors[loss])
  x = graph.operations[0].outputs[0]  # batch:8,io:8, split 8 ways
  wrong = mtf.LaidOutTensor([tf.zeros([8, 8])] * 8)
  with pytest.raises(mtf.ShapeError, match=r"\[8, 8\].*expected \[1, 8\]"):
    lowering.verify_slice_shapes(x, wrong)
  lowering.autostack()  # plans again; the graph is unchanged
  assert lowering.stack_group(graph.all_variables[0]) is None


def test_log_variable_sizes(tmp_path):
  graph, mesh, _, _, w = _data_parallel_graph()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:4", "hidden:all")
  path = tmp_path / "sizes.log"
  with tf.io.gfile.GFile(str(path), "w") as f:
    mtf.log_variable_sizes(graph.trainable_variables, "Trainable Variables",
                           verbose=True, mesh_to_impl={mesh: impl},
                           log_file=f)
    mtf.log_variable_sizes([], "Nothing", log_file=f)
    mtf.log_variable_sizes(var_list=[w.operation], tag="No impl",
                           verbose=False)
  lines = path.read_text().splitlines()
  assert lines[0].startswith("Variable w ") and "size 128" in lines[0]
  assert "slice_size 32" in lines[0] and "[8, 16]" in lines[0]
  assert lines[1] == ("Trainable Variables count: 1  Total size: 128  "
                      "Total slice_size: 32")
  assert len(lines) == 2
