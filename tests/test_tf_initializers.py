"""TF's initializers called on the full shape, seeded by the variable name."""

from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.randomness import tf_initializers


def test_tf_own_initializers_are_deterministic():
  # TF1's seeded initializers are not, in eager mode; their twins are.
  for name, kwargs in [("random_normal_initializer", {"stddev": 2.0}),
                       ("truncated_normal_initializer", {"stddev": 0.5}),
                       ("random_uniform_initializer",
                        {"minval": -1.0, "maxval": 1.0}),
                       ("glorot_uniform_initializer", {})]:
    first = tf_initializers.seeded(name, 7, **kwargs)([4, 5]).numpy()
    again = tf_initializers.seeded(name, 7, **kwargs)([4, 5]).numpy()
    other = tf_initializers.seeded(name, 8, **kwargs)([4, 5]).numpy()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other), name
  normal = tf_initializers.seeded("random_normal_initializer", 3,
                                  stddev=2.0)([4000]).numpy()
  assert 1.9 < normal.std() < 2.1


def test_tf1_defaults():
  # TF1's defaults: stddev 1, uniform in [0, 1).
  normal = tf_initializers.seeded("random_normal_initializer", 3)([4000])
  assert 0.95 < normal.numpy().std() < 1.05
  truncated = tf_initializers.seeded("truncated_normal_initializer", 3)(
      [4000]).numpy()
  assert 0.8 < truncated.std() < 0.9 and truncated.max() <= 2.0
  uniform = tf_initializers.seeded("random_uniform_initializer", 3)(
      [4000]).numpy()
  assert uniform.min() >= 0.0 and 0.95 < uniform.max() < 1.0


def test_integer_dtype_is_cast():
  value = tf_initializers.seeded("random_uniform_initializer", 1,
                                 minval=0.0, maxval=10.0)([6], tf.int32)
  assert value.dtype == tf.int32


def test_unknown_name():
  with pytest.raises(ValueError, match="ones_initializer"):
    tf_initializers.seeded("ones_initializer", 1)


def _lowered_value(make_variable, mesh_shape, layout):
  """The value of the tensor make_variable(mesh) returns, lowered eagerly."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  v = make_variable(mesh)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return lowering.export_to_tf_tensor(v).numpy()


def test_a_replaced_tf1_name_is_called_on_the_full_shape():
  # The original's tests replace TF's initializers to fix initial values.
  full = np.arange(32, dtype=np.float32).reshape(4, 8)
  calls = []

  def factory(**kwargs):
    calls.append(kwargs)
    return lambda shape, dtype=None, **unused: tf.constant(full, dtype)

  def make(mesh):
    return mtf.get_variable(mesh, "w", "a:4,b:8")

  with mock.patch.object(tf.compat.v1, "glorot_uniform_initializer",
                         factory):
    got = _lowered_value(make, "all:4", "b:all")
  np.testing.assert_array_equal(got, full)
  assert calls == [{}]  # As the original called it: no arguments.


def test_get_variable_chooses_its_default_when_called():
  # As the original: a replacement active while the graph is built applies,
  # even if the graph is lowered after it is undone.
  full = np.ones([2, 3], np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mock.patch.object(
      tf.compat.v1, "glorot_uniform_initializer",
      lambda: lambda shape, dtype=None, **_: tf.constant(full)):
    v = mtf.get_variable(mesh, "w", "a:2,b:3")
  lowering = mtf.Lowering(graph, {mesh: mtf.placement_mesh_impl.
                                  PlacementMeshImpl("all:1", "")})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(v), full)


def test_layers_use_the_seeded_tf_names():
  full = np.full([2, 3], 0.25, np.float32)
  with mock.patch.object(tf.compat.v1, "truncated_normal_initializer") as m:
    m.return_value = lambda shape, dtype=None, **unused: tf.constant(
        full, dtype)

    def make(mesh):
      x = mtf.zeros(mesh, "batch:4,d:2")
      mtf.layers.dense(x, mtf.Dimension("e", 3), use_bias=False,
                       name="dense")
      return mesh.graph.trainable_variables[0].outputs[0]

    got = _lowered_value(make, "all:1", "")
  np.testing.assert_array_equal(got, full)
  assert m.call_args.kwargs["stddev"] == pytest.approx(2 ** -0.5)
  assert "seed" not in m.call_args.kwargs


@pytest.mark.parametrize("mesh_shape,layout", [("all:4", "a:all"),
                                               ("r:2;c:2", "a:r;b:c")])
def test_default_initial_value_is_layout_independent(mesh_shape, layout):
  def make(mesh):
    return mtf.get_variable(mesh, "scope/w", "a:4,b:8")

  want = _lowered_value(make, "all:1", "")
  got = _lowered_value(make, mesh_shape, layout)
  np.testing.assert_array_equal(got, want)
  limit = (6.0 / 12) ** 0.5
  assert np.all(np.abs(want) <= limit) and want.std() > 0
