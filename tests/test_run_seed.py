"""The run's seed: another seed, another start; one seed, every layout alike.

Initial values and dropout masks are functions of variable and operation
names (layout-invariant randomness); `run_seed` mixes a run's seed into
them. Unseeded TF and Keras initializers given to `mtf.get_variable` are
seeded by the variable's name, so they too start alike on every layout.
"""

import zlib

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.randomness import run_seed
from mesh_tensorflow.randomness import tf_initializers
from tests import mtf_testing

LAYOUTS = [("all:1", "", "eager"),
           ("b:2;m:4", "batch:b;e:m;v:b", "eager"),
           ("b:2;m:4", "batch:b;e:m;v:b", "simd")]


def model(mesh):
  """Variables of three kinds of initializer and a dropout mask."""
  x = mtf.ones(mesh, "batch:8,d:4")
  y = mtf.layers.dense(x, mtf.Dimension("e", 4), use_bias=False,
                       name="dense")  # Truncated normal by its name.
  mtf.get_variable(mesh, "w", "d:4,e:4")  # Glorot by its name.
  mtf.layers.embedding_weights(mesh, mtf.Dimension("v", 8),
                               mtf.Dimension("e", 4), tf.float32)
  return {"mask": mtf.dropout(mtf.ones(mesh, "batch:8,e:4"), rate=0.5),
          "y": y}, None, {}


def _run(seed, mesh_shape="all:1", layout="", mode="eager", build=model):
  with run_seed.seed_scope(seed):
    values, _ = mtf_testing.run_program(mesh_shape, layout, mode, build)
  return values


def test_another_seed_gives_other_initial_values_and_dropout_masks():
  unseeded, first, second = _run(None), _run(1), _run(2)
  assert sorted(first) == ["dense/kernel", "embedding", "mask", "w", "y"]
  for name in ["dense/kernel", "embedding", "mask", "w"]:
    assert not np.array_equal(first[name], second[name]), name
    assert not np.array_equal(first[name], unseeded[name]), name
  np.testing.assert_array_equal(_run(1)["w"], first["w"])


def test_no_seed_keeps_the_name_seeded_values():
  # The seed of a name without a run seed is its CRC-32, as before.
  crc = zlib.crc32(b"a/w") & 0x7FFFFFFF
  with run_seed.seed_scope(None):
    assert tf_initializers.seed_of_name("a/w") == crc
  with run_seed.seed_scope(7):
    assert tf_initializers.seed_of_name("a/w") != crc
  assert run_seed.get_seed() is None


@pytest.mark.parametrize("mesh_shape,layout,mode", LAYOUTS[1:])
def test_a_seed_gives_the_same_values_under_every_layout(mesh_shape, layout,
                                                        mode):
  want = _run(5)
  got = _run(5, mesh_shape, layout, mode)
  assert sorted(got) == sorted(want)
  for name in ["dense/kernel", "embedding", "mask", "w"]:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  np.testing.assert_allclose(got["y"], want["y"], atol=1e-6)  # Round-off.


def _unseeded_tf_initializers(mesh):
  """Variables with TF's and Keras's initializers made without a seed, as
  model code makes them (a new object per graph)."""
  outputs = {}
  for name, initializer in [
      ("v2_normal", tf.random_normal_initializer(stddev=2.0)),
      ("v2_uniform", tf.random_uniform_initializer(-1.0, 1.0)),
      ("v1_truncated", tf.compat.v1.truncated_normal_initializer()),
      ("v1_glorot_normal", tf.compat.v1.glorot_normal_initializer()),
      ("keras_glorot", tf.keras.initializers.GlorotUniform()),
      ("keras_orthogonal", tf.keras.initializers.Orthogonal()),
  ]:
    outputs[name] = mtf.get_variable(mesh, name, "d:4,e:8",
                                     initializer=initializer)
  return outputs, None, {}


@pytest.mark.parametrize("mesh_shape,layout,mode", LAYOUTS[1:])
def test_unseeded_tf_initializers_start_alike_under_every_layout(
    mesh_shape, layout, mode):
  want = _run(None, build=_unseeded_tf_initializers)
  got = _run(None, mesh_shape, layout, mode, build=_unseeded_tf_initializers)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert np.std(want[name]) > 0, name
  # Their parameters are kept.
  assert 1.5 < np.std(want["v2_normal"]) < 2.5
  assert np.abs(want["v2_uniform"]).max() <= 1.0
  orthogonal = want["keras_orthogonal"]
  np.testing.assert_allclose(orthogonal @ orthogonal.T, np.eye(4), atol=1e-5)
  # Another run seed, another start.
  other = _run(3, build=_unseeded_tf_initializers)
  assert not np.array_equal(other["v2_normal"], want["v2_normal"])


def test_seeded_tf_initializers_keep_their_seed():
  def build(mesh):
    return {"w": mtf.get_variable(
        mesh, "w", "d:4,e:8",
        initializer=tf.random_normal_initializer(seed=11))}, None, {}

  want = tf.random_normal_initializer(seed=11)([4, 8]).numpy()
  np.testing.assert_array_equal(_run(None, build=build)["w"], want)
  np.testing.assert_array_equal(_run(2, build=build)["w"], want)


def test_run_seed_must_be_an_int():
  with pytest.raises(TypeError, match="run seed"):
    run_seed.set_seed("1")
  with pytest.raises(TypeError, match="run seed"):
    run_seed.set_seed(True)
  assert run_seed.get_seed() is None


def test_unseeded_tf_initializers_seed_each_layer_stacked_row_by_its_name():
  """A layer-stacked variable's rows start as the per-layer variables."""
  stage = mtf.Dimension("stage", 4)

  def initial(stacked):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    names = [f"block_{i:03d}/w" for i in range(4)]
    if stacked:
      with mtf.stack_layer_variables(
          stage, lambda name: [name.replace("block_000", f"block_{i:03d}")
                               for i in range(4)]):
        with tf.compat.v1.variable_scope("block_000"):
          w = mtf.get_variable(mesh, "w", "d:4,e:8",
                               initializer=tf.random_normal_initializer())
      rows = mtf.unstack(w, stage)
      impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:4", "stage:all")
    else:
      rows = []
      for name in names:
        rows.append(mtf.get_variable(
            mesh, name, "d:4,e:8",
            initializer=tf.random_normal_initializer()))
      impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(r).numpy() for r in rows]

  want, got = initial(False), initial(True)
  for i in range(4):
    np.testing.assert_array_equal(got[i], want[i], err_msg=str(i))
  assert not np.array_equal(want[0], want[1])
