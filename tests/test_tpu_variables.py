"""ReplicatedVariable: the first variable outside a TPU replicate context,
a replicated handle over every variable inside one, and each replica's own
variable in another strategy's replica context."""

import inspect

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import func_graph  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_replication  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import tpu_variables


def _eager_variables():
  return [tf.Variable([1.0 + 10 * i, 2.0 + 10 * i], name=f"w_slice_{i}")
          for i in range(4)]


def _assert_others_unchanged(variables):
  for i, v in enumerate(variables[1:], 1):
    np.testing.assert_array_equal(v.numpy(), [1.0 + 10 * i, 2.0 + 10 * i])


def test_eager_delegates_to_first_variable():
  variables = _eager_variables()
  rv = tpu_variables.ReplicatedVariable("w", variables)
  assert rv.name == "w" and rv.dtype == tf.float32 and rv.shape == [2]
  assert rv.variables == variables and rv.get() is variables[0]
  assert rv.handle is variables[0].handle
  assert rv.initializer is None
  np.testing.assert_array_equal(rv.read_value(), [1.0, 2.0])
  np.testing.assert_array_equal(rv.value(), [1.0, 2.0])
  np.testing.assert_array_equal(tf.convert_to_tensor(rv), [1.0, 2.0])
  np.testing.assert_array_equal(tf.add(rv, 1.0), [2.0, 3.0])
  np.testing.assert_array_equal(rv.assign([5.0, 6.0]), [5.0, 6.0])
  np.testing.assert_array_equal(rv.assign_add([1.0, 1.0]), [6.0, 7.0])
  np.testing.assert_array_equal(rv.assign_sub([2.0, 2.0]), [4.0, 5.0])
  rv.assign([0.0, 0.0], read_value=False)
  np.testing.assert_array_equal(variables[0].numpy(), [0.0, 0.0])
  _assert_others_unchanged(variables)
  assert "replicas=4" in repr(rv)


def test_tf_function_delegates_to_first_variable():
  variables = _eager_variables()
  rv = tpu_variables.ReplicatedVariable("w", variables)

  @tf.function
  def step(delta):
    assert tpu_variables.enclosing_tpu_context() is None
    assert rv.initializer is None
    rv.assign_add(delta)
    rv.assign_sub(delta / 2)
    return tf.add(rv, 1.0), tf.convert_to_tensor(rv), rv.read_value()

  plus_one, value, read = step(tf.constant([2.0, 4.0]))
  np.testing.assert_array_equal(plus_one, [3.0, 5.0])
  np.testing.assert_array_equal(value, [2.0, 4.0])
  np.testing.assert_array_equal(read, [2.0, 4.0])
  np.testing.assert_array_equal(variables[0].numpy(), [2.0, 4.0])
  _assert_others_unchanged(variables)


def test_mismatched_variables_rejected():
  with pytest.raises(ValueError, match="differ"):
    tpu_variables.ReplicatedVariable(
        "w", [tf.Variable([1.0]), tf.Variable([1.0, 2.0])])
  with pytest.raises(ValueError, match="at least one"):
    tpu_variables.ReplicatedVariable("w", [])


def test_replicated_var_handle_signature():
  # The original library called get_replicated_var_handle(name, vars),
  # which no longer exists; this module relies on the current signature.
  params = list(inspect.signature(
      tpu_replication.TPUReplicateContext.get_replicated_var_handle
  ).parameters)
  assert params[:5] == ["self", "name", "handle_id", "vars_", "is_mirrored"]


def _replicate_graph():
  """A tf.Graph with 4 variables and a TPUReplicateContext (not entered)."""
  graph = tf.Graph()
  with graph.as_default():
    variables = [tf.Variable([float(i), 0.0], name=f"w_slice_{i}")
                 for i in range(4)]
    pivot = tf.no_op(name="pivot")
    context = tpu_replication.TPUReplicateContext(
        name="r", num_replicas=4, pivot=pivot)
  return graph, variables, context


def _tpu_replicated(op):
  try:
    return op.get_attr("_tpu_replicate") == b"r"
  except ValueError:
    return False


def test_graph_outside_context_delegates_and_groups_initializers():
  graph, variables, _ = _replicate_graph()
  with graph.as_default():
    rv = tpu_variables.ReplicatedVariable("w", variables)
    assert rv.handle is variables[0].handle
    init = rv.initializer
    assert init.type == "NoOp"
    assert set(init.control_inputs) == {v.initializer for v in variables}
    read = tf.convert_to_tensor(rv)
    assert read.op.inputs[0] is variables[0].handle


def test_inside_replicate_context_uses_replicated_handle():
  graph, variables, context = _replicate_graph()
  with graph.as_default():
    rv = tpu_variables.ReplicatedVariable("w", variables)
    context.Enter()
    try:
      assert tpu_variables.enclosing_tpu_context() is context
      handle = rv.handle
      assert rv.handle is handle  # cached by the context
      assert handle.op.type == "TPUReplicatedInput"
      assert list(handle.op.inputs) == [v.handle for v in variables]
      assert not handle.op.get_attr("is_mirrored_variable")
      assert not _tpu_replicated(handle.op)  # built outside the computation

      read = rv.read_value()
      value = rv.value()
      converted = tf.convert_to_tensor(rv)
      total = tf.add(rv, 1.0)
      for t in (read, value, converted):
        assert t.op.type == "ReadVariableOp" and t.op.inputs[0] is handle
        assert _tpu_replicated(t.op)
      assert total.op.inputs[0].op.type == "ReadVariableOp"
      assert tf.convert_to_tensor(rv, dtype=tf.float32).dtype == tf.float32
      assert rv._dense_var_to_tensor(as_ref=True) is handle  # pylint: disable=protected-access
      with pytest.raises(ValueError, match="Cannot convert"):
        rv._dense_var_to_tensor(dtype=tf.int32)  # pylint: disable=protected-access

      for method, op_type in [("assign", "AssignVariableOp"),
                              ("assign_add", "AssignAddVariableOp"),
                              ("assign_sub", "AssignSubVariableOp")]:
        after = getattr(rv, method)([1.0, 2.0])
        assert after.op.type == "ReadVariableOp"
        assert after.op.inputs[0] is handle
        (update,) = after.op.control_inputs
        assert update.type == op_type and update.inputs[0] is handle
        assert _tpu_replicated(update)
        update = getattr(rv, method)([1.0, 2.0], read_value=False)
        assert update.type == op_type
    finally:
      context.Exit()


def test_context_is_found_from_a_nested_function_graph():
  graph, variables, context = _replicate_graph()
  with graph.as_default():
    rv = tpu_variables.ReplicatedVariable("w", variables)
    context.Enter()
    try:
      inner = func_graph.FuncGraph("inner")
      with inner.as_default():
        assert tpu_variables.enclosing_tpu_context() is context
        read = rv.read_value()
      assert read.graph is inner
      replicated = [op for op in graph.get_operations()
                    if op.type == "TPUReplicatedInput"]
      assert len(replicated) == 1
    finally:
      context.Exit()


def test_replica_context_of_another_strategy_uses_the_replicas_variable():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:4]
  variables = []
  for i, device in enumerate(devices):
    with tf.device(device):
      variables.append(tf.Variable([1.0 + 10 * i, 2.0 + 10 * i]))
  rv = tpu_variables.ReplicatedVariable("w", variables)
  strategy = tf.distribute.MirroredStrategy(devices)

  @tf.function
  def step():
    def replica_fn():
      before = rv.read_value()
      rv.assign_add([100.0, 100.0], read_value=False)
      return before
    return strategy.experimental_local_results(strategy.run(replica_fn))

  before = [r.numpy() for r in step()]
  for i, value in enumerate(before):
    np.testing.assert_array_equal(value, [1.0 + 10 * i, 2.0 + 10 * i])
  for i, v in enumerate(variables):
    np.testing.assert_array_equal(v.numpy(), [101.0 + 10 * i, 102.0 + 10 * i])
  assert tpu_variables.current_replica_index() is None
  with strategy.scope():  # Cross-replica: no replica of its own.
    assert tpu_variables.current_replica_index() is None


def test_original_update_signatures_constraint_and_proto():
  variables = _eager_variables()
  rv = tpu_variables.ReplicatedVariable("w", variables)
  assert rv.constraint is None
  np.testing.assert_array_equal(
      rv.assign([5.0, 6.0], use_locking=True, name="set"), [5.0, 6.0])
  np.testing.assert_array_equal(rv.assign_add(delta=[1.0, 1.0]), [6.0, 7.0])
  np.testing.assert_array_equal(
      rv.assign_sub(delta=[2.0, 2.0], use_locking=False, name="down",
                    read_value=True), [4.0, 5.0])
  _assert_others_unchanged(variables)
  graph, graph_variables, context = _replicate_graph()
  with graph.as_default():
    rv = tpu_variables.ReplicatedVariable("w", graph_variables)
    assert rv.to_proto().variable_name == graph_variables[0].name
    context.Enter()
    try:
      update = rv.assign_add([1.0, 2.0], name="bump", read_value=False)
      assert update.type == "AssignAddVariableOp"
      assert "bump" in update.name
    finally:
      context.Exit()
