"""NumpyConverter round trips, eagerly and in graph mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import test_utils


def test_constant_round_trip():
  converter = test_utils.NumpyConverter()
  x = np.arange(6).reshape(2, 3)
  t = converter.convert_np_array_to_mtf_tensor(x)
  assert t.shape.dimension_names == ["dim0", "dim1"]
  np.testing.assert_array_equal(converter.convert_mtf_tensor_to_np_array(t),
                                x)


@pytest.mark.parametrize("graph_mode", [False, True])
def test_with_a_trainable_variable(graph_mode):
  def run():
    converter = test_utils.NumpyConverter()
    x = converter.convert_np_array_to_mtf_tensor(
        np.ones([2, 3], np.float32), dim_names=["a", "b"], dtype=tf.float32)
    w = mtf.get_variable(converter.mesh, "w", "b:3",
                         initializer=np.array([1., 2., 3.], np.float32))
    return converter.convert_mtf_tensor_to_np_array(
        mtf.reduce_sum(x * w, reduced_dim=mtf.Dimension("b", 3)))

  if graph_mode:
    with tf.Graph().as_default():
      result = run()
  else:
    result = run()
  np.testing.assert_allclose(result, [6., 6.])


def test_to_tf_tensor():
  converter = test_utils.NumpyConverter()
  t = converter.convert_np_array_to_mtf_tensor([[1, 2]], dtype=tf.int32)
  lowering, tf_tensor = converter.convert_mtf_tensor_to_tf_tensor(t)
  assert isinstance(lowering, mtf.Lowering)
  np.testing.assert_array_equal(tf_tensor, [[1, 2]])


def test_session_is_the_graphs_in_graph_mode_and_none_eagerly():
  assert test_utils.NumpyConverter().session is None
  with tf.Graph().as_default() as graph:
    converter = test_utils.NumpyConverter()
    session = converter.session
    assert isinstance(session, tf.compat.v1.Session)
    assert session.graph is graph and converter.session is session
    t = converter.convert_np_array_to_mtf_tensor(np.array([1, 2, 3]))
    np.testing.assert_array_equal(
        converter.convert_mtf_tensor_to_np_array(x_mtf=t * 2), [2, 4, 6])
    _, tf_tensor = converter.convert_mtf_tensor_to_tf_tensor(t + 1)
    np.testing.assert_array_equal(converter.session.run(tf_tensor),
                                  [2, 3, 4])
