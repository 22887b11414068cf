"""utils: BalancedVariablePlacer, outside_all_rewrites, the summaries'
host call and topology_rank."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import global_step
from mesh_tensorflow import utils
from tests.estimator import toy_model


def test_balanced_variable_placer_spreads_bytes():
  placer = utils.BalancedVariablePlacer(["cpu:0", "cpu:1"])
  with tf.Graph().as_default():
    with tf.compat.v1.device(placer.device_function):
      big = tf.compat.v1.Variable(tf.zeros([100]), use_resource=True)
      small1 = tf.compat.v1.Variable(tf.zeros([10]), use_resource=True)
      small2 = tf.compat.v1.Variable(tf.zeros([10]), use_resource=True)
      other = tf.constant(1.0)
  devices = [v.device for v in (big, small1, small2)]
  assert devices[0] != devices[1] == devices[2]
  assert sorted(placer.usage) == [80, 400]
  assert other.device.upper().endswith("CPU:1")


def test_master_variables_follow_the_placer_in_graph_mode():
  placer = utils.BalancedVariablePlacer(["/cpu:0", "/cpu:1"])
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh", variable_placer=placer)
    a = mtf.get_variable(mesh, "a", "x:64")
    b = mtf.get_variable(mesh, "b", "x:64")
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "x:all")
    lowering = mtf.Lowering(graph, {mesh: impl})
    masters = [lowering.variables[v.operation].master for v in (a, b)]
    assert {m.device[-5:].upper() for m in masters} == {"CPU:0", "CPU:1"}


def test_outside_all_rewrites_drops_control_dependencies():
  with tf.Graph().as_default():
    first = tf.constant(1.0)
    with tf.control_dependencies([first]):
      inside = tf.constant(2.0)
      with utils.outside_all_rewrites():
        outside = tf.constant(3.0)
    assert inside.op.control_inputs == [first.op]
    assert not outside.op.control_inputs
  with utils.outside_all_rewrites():
    assert float(tf.constant(4.0)) == 4.0


def test_balanced_variable_placer_as_the_original_placed_five_variables():
  """The original's test: 400-byte variables go to the least-used device,
  starting after the device that already holds 100 bytes."""
  devices = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
  with tf.Graph().as_default():
    placer = utils.BalancedVariablePlacer(devices, [100, 0, 0, 0])
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh", placer)
    variables = [
        mtf.get_variable(mesh, f"w{i}", "hidden:10,output_feature:10")
        for i in range(5)]
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
    lowering = mtf.Lowering(graph, {mesh: impl})
    for i, var in enumerate(variables):
      master = lowering.variables[var.operation].master
      assert master.device.upper().endswith(f"CPU:{(i + 1) % 4}"), (
          master.device)
  assert placer.usage == [500, 800, 400, 400]


def test_balanced_variable_placer_other_ops_follow_the_last_variable():
  placer = utils.BalancedVariablePlacer(["cpu:0", "cpu:1"], [8, 0])
  with tf.Graph().as_default():
    first = tf.constant(1.0).op
    assert placer.device_function(var=first) == "cpu:0"  # no variable yet
    with tf.compat.v1.device(placer.device_function):
      v = tf.compat.v1.Variable(tf.zeros([4]), use_resource=True)
      after = tf.constant(2.0)
  assert v.device.upper().endswith("CPU:1")
  assert after.device.upper().endswith("CPU:1")


def _summarized_graph(mesh_impl):
  """Lowers an mtf graph with two scalar summaries; returns the lowering."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant([1.0, 2.0, 3.0, 6.0]), "a:4")
  mtf.scalar_summary("mean", mtf.reduce_mean(x))
  mtf.scalar_summary("count", mtf.cast(mtf.reduce_sum(mtf.ones_like(x)),
                                       tf.int64))
  return mtf.Lowering(graph, {mesh: mesh_impl})


def test_create_host_call_writes_the_lowered_summaries(tmp_path):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "a:all")
  step = tf.Variable(7, dtype=tf.int64, trainable=False)

  @tf.function(autograph=False)
  def train_step():
    with global_step.global_step_scope(step):
      assert utils.create_host_call(str(tmp_path)) is None
      _summarized_graph(impl)
      host_call_fn, args = utils.create_host_call(str(tmp_path))
      assert [a.shape.as_list() for a in args] == [[1], [1], [1]]
      assert [a.dtype for a in args] == [tf.int32, tf.float32, tf.int32]
      utils.remove_summaries()
      assert utils.create_host_call(str(tmp_path)) is None
    host_call_fn(*args)

  train_step()
  assert toy_model.event_scalars(str(tmp_path)) == {"mean": {7: 3.0},
                                           "count": {7: 4.0}}


def test_create_host_call_in_graph_mode(tmp_path):
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "a:all")
    _summarized_graph(impl)
    host_call_fn, args = utils.create_host_call(str(tmp_path))
    summary_ops = host_call_fn(*args)
    assert summary_ops
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(tf.compat.v1.assign(step, 3))
      writer = utils.host_call_writer(str(tmp_path))
      sess.run(writer.init())
      sess.run(summary_ops)
      sess.run(writer.flush())
  assert toy_model.event_scalars(str(tmp_path)) == {"mean": {3: 3.0},
                                           "count": {3: 4.0}}


def test_topology_rank():
  topology = tf.tpu.experimental.Topology(
      mesh_shape=[2, 2, 1, 2], device_coordinates=np.array(
          [[[0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 1],
            [0, 1, 0, 0], [0, 1, 0, 1], [1, 1, 0, 0], [1, 1, 0, 1]]],
          np.int32))
  assert utils.topology_rank(topology) == 4
  assert utils.topology_rank(topology.serialized()) == 4
  with pytest.raises(ValueError, match="not a tf.tpu.experimental.Topology"):
    utils.topology_rank("2x2")
