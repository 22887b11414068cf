"""Tests of random_uniform, random_normal and dropout."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.randomness import stateless_random
from tests import mtf_testing

A, B = 8, 24  # Slices of 24 elements: not a multiple of a SIMD packet.
SHAPE = f"a:{A},b:{B}"
KEEP_PROB = 0.75


def _x(seed=0):
  return np.random.RandomState(seed).uniform(1.0, 2.0, (A, B)).astype(
      np.float32)


def _lower(graph, mesh, impl, outputs):
  lowering = mtf.Lowering(graph, {mesh: impl})
  exported = {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}
  slices = {k: lowering.laid_out_tensor(v).tensor_list
            for k, v in outputs.items()}
  begins = {k: [impl.slice_begin(v.shape, p) for p in range(impl.size)]
            for k, v in outputs.items()}
  return lowering, exported, slices, begins


def _program(impl, begins):
  """Random tensors, a dropout and its gradient on `impl`."""

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(_x()), SHAPE, name="x")
    dy = mtf.import_tf_tensor(mesh, tf.constant(_x(1)), SHAPE, name="dy")
    outputs = {
        "uniform": mtf.random_uniform(mesh, SHAPE, minval=-1.0, maxval=2.0,
                                      seed=7),
        "normal": mtf.random_normal(mesh, SHAPE, mean=1.0, stddev=3.0),
        "int": mtf.random_uniform(mesh, SHAPE, minval=0, maxval=1000,
                                  dtype=tf.int32, seed=tf.constant(3)),
        "dropout": mtf.dropout(x, keep_prob=KEEP_PROB),
        "row_dropout": mtf.dropout(x, rate=0.5, noise_shape=f"a:{A}"),
    }
    (outputs["grad"],) = mtf.gradients(
        [mtf.reduce_sum(outputs["dropout"] * dy)], [x])
    lowering, exported, slices, slice_begins = _lower(
        graph, mesh, impl, outputs)
    begins.update(slice_begins)
    return lowering, {"outputs": exported, "slices": slices}

  return build_and_lower


_REFERENCE = {}


def _reference():
  """The one-processor eager result that every layout must reproduce."""
  if not _REFERENCE:
    impl = mtf_testing.make_impl("eager", "all:1", "")
    _REFERENCE.update(mtf_testing.run_in_mode(
        "eager", _program(impl, {}))["outputs"])
  return _REFERENCE


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "b"]))
def test_same_full_tensor_under_every_layout_and_mode(mesh_shape, layout,
                                                      mode):
  begins = {}
  # Made outside the tf.function: it owns the random step counter variable.
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  program = _program(impl, begins)
  if mode == "simd":
    per_processor = mtf_testing.run_in_mode(mode, program, impl,
                                            each_processor=True)
    result = per_processor[0]
    result["slices"] = {k: [r["slices"][k][0] for r in per_processor]
                        for k in result["slices"]}
  else:
    result = mtf_testing.run_in_mode(mode, program)
  where = f"[mesh {mesh_shape!r}, layout {layout!r}, mode {mode}]"
  for k, want in _reference().items():
    np.testing.assert_array_equal(result["outputs"][k], want,
                                  err_msg=f"{where} {k}")
    mtf_testing.assert_replicas_agree(result["slices"][k], begins[k],
                                      f"{where} {k}")
    slices = result["slices"][k]
    if k in ("uniform", "normal", "int") and len(
        {tuple(b) for b in begins[k]}) > 1:
      assert not np.array_equal(slices[0], slices[-1]), (
          f"{where} {k}: different blocks are equal")


def test_values_are_the_generator_on_the_full_tensor():
  got = _reference()
  np.testing.assert_array_equal(
      got["uniform"], stateless_random.uniform(7, [A, B], [A, B], [0, 0],
                                               minval=-1.0, maxval=2.0))
  np.testing.assert_array_equal(
      got["int"], stateless_random.uniform(3, [A, B], [A, B], [0, 0],
                                           dtype=tf.int32, minval=0,
                                           maxval=1000))
  assert got["uniform"].min() >= -1 and got["uniform"].max() < 2
  assert got["int"].dtype == np.int32


def test_dropout_values_and_gradient_share_one_mask():
  got = _reference()
  x, dy = _x(), _x(1)
  kept = got["dropout"] != 0
  assert 0.5 < kept.mean() < 0.95
  np.testing.assert_allclose(got["dropout"][kept], x[kept] / KEEP_PROB,
                             rtol=1e-6)
  np.testing.assert_allclose(got["grad"], np.where(kept, dy / KEEP_PROB, 0.0),
                             rtol=1e-6)
  # noise_shape [a]: whole rows are kept (scaled by 2) or dropped.
  rows = got["row_dropout"]
  kept_rows = rows[:, 0] != 0
  np.testing.assert_allclose(rows[kept_rows], 2 * x[kept_rows], rtol=1e-6)
  assert np.all(rows[~kept_rows] == 0)


def _eager_values(build_fn, mesh_shape="all:1", layout=""):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = build_fn(mesh)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  _, exported, _, _ = _lower(graph, mesh, impl, outputs)
  return {k: np.asarray(v) for k, v in exported.items()}


def test_default_seeds_come_from_op_names():
  def build(mesh):
    return {"first": mtf.random_normal(mesh, SHAPE),
            "second": mtf.random_normal(mesh, SHAPE),
            "named": mtf.random_normal(mesh, SHAPE, name="noise")}
  once, again = _eager_values(build), _eager_values(build)
  for k in once:
    np.testing.assert_array_equal(once[k], again[k])
  assert not np.array_equal(once["first"], once["second"])
  assert not np.array_equal(once["first"], once["named"])


def test_explicit_seeds_repeat_and_tensor_seeds_match_ints():
  def build(mesh):
    return {"a": mtf.random_uniform(mesh, SHAPE, seed=5),
            "b": mtf.random_uniform(mesh, SHAPE, seed=5),
            "tensor": mtf.random_uniform(mesh, SHAPE,
                                         seed=tf.constant(5, tf.int64)),
            "other": mtf.random_uniform(mesh, SHAPE, seed=6)}
  got = _eager_values(build, "rows:2;cols:4", "a:rows;b:cols")
  np.testing.assert_array_equal(got["a"], got["b"])
  np.testing.assert_array_equal(got["a"], got["tensor"])
  assert not np.array_equal(got["a"], got["other"])


def test_statistics_of_a_split_tensor():
  shape = "a:128,b:128"

  def build(mesh):
    return {"uniform": mtf.random_uniform(mesh, shape, minval=-2.0,
                                          maxval=4.0),
            "normal": mtf.random_normal(mesh, shape, mean=1.0, stddev=3.0),
            "mask": mtf.dropout(mtf.ones(mesh, shape), rate=0.3)}
  got = _eager_values(build, "rows:2;cols:4", "a:rows;b:cols")
  u, z, mask = got["uniform"], got["normal"], got["mask"]
  # 16384 samples: standard errors 0.014 (u mean), 0.023 (z mean).
  assert abs(u.mean() - 1.0) < 0.06 and abs(u.var() - 3.0) < 0.1
  assert abs(z.mean() - 1.0) < 0.1 and abs(z.std() - 3.0) < 0.08
  assert abs((mask != 0).mean() - 0.7) < 0.02
  np.testing.assert_allclose(mask.mean(), 1.0, atol=0.03)


def test_dropout_identities():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.ones(mesh, SHAPE)
  assert mtf.dropout(x, is_training=False, rate=0.5) is x
  assert mtf.dropout(x, keep_prob=1.0) is x
  assert mtf.dropout(x, rate=0.0) is x


def test_integer_dropout_masks_without_scaling():
  def build(mesh):
    return {"y": mtf.dropout(mtf.ones(mesh, SHAPE, dtype=tf.int32),
                             keep_prob=0.5)}
  y = _eager_values(build)["y"]
  assert y.dtype == np.int32 and set(np.unique(y)) == {0, 1}


def test_errors_name_the_problem():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.ones(mesh, SHAPE)
  with pytest.raises(ValueError, match="exactly one of keep_prob and rate"):
    mtf.dropout(x)
  with pytest.raises(ValueError, match="exactly one of keep_prob and rate"):
    mtf.dropout(x, keep_prob=0.5, rate=0.5)
  with pytest.raises(ValueError, match="keep_prob must be in"):
    mtf.dropout(x, keep_prob=0.0)
  with pytest.raises(ValueError, match="rate must be in"):
    mtf.dropout(x, rate=1.0)
  with pytest.raises(mtf.ShapeError, match="'c'"):
    mtf.dropout(x, rate=0.5, noise_shape="a:8,c:3")
  with pytest.raises(TypeError, match="does not support dtype int32"):
    mtf.random_normal(mesh, SHAPE, dtype=tf.int32)
  with pytest.raises(TypeError, match="int minval and maxval"):
    mtf.random_uniform(mesh, SHAPE, maxval=2.5, dtype=tf.int32)
  with pytest.raises(TypeError, match="seed must be"):
    mtf.random_uniform(mesh, SHAPE, seed=1.5)
  with pytest.raises(TypeError, match="int minval and maxval"):
    mtf.random_uniform(mesh, SHAPE, dtype=tf.int32)  # maxval is required
  with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['mean'\]"):
    mtf.random_uniform(mesh, SHAPE, mean=1.0)
  with pytest.raises(ValueError, match="'random_poisson_v2'"):
    mtf.RandomOperation(mesh, SHAPE, tf.random.poisson, lam=1.0)


def test_random_operation_takes_a_tf_random_function():
  """RandomOperation(mesh, shape, tf_fn, **kwargs), as in the original; the
  values are the layout-invariant generator's (see test_stateless_random)."""
  def build(mesh):
    op = mtf.RandomOperation(mesh, SHAPE, tf.random.truncated_normal,
                             stddev=2.0, seed=9, name="noise")
    assert op.distribution == "truncated_normal" and op.seed == 9
    assert op.tf_fn is tf.random.truncated_normal
    compat = mtf.RandomOperation(mesh, SHAPE, tf.compat.v1.random_uniform,
                                 minval=2, maxval=5, dtype=tf.int64, seed=9)
    return {"t": op.outputs[0], "i": compat.outputs[0]}
  got = _eager_values(build, "rows:2;cols:4", "a:rows;b:cols")
  one = _eager_values(build)
  for k in got:
    np.testing.assert_array_equal(got[k], one[k])
  assert np.abs(got["t"]).max() <= 4.0
  assert got["i"].dtype == np.int64 and set(np.unique(got["i"])) <= {2, 3, 4}


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_each_execution_draws_new_values_reproducibly(mode):
  """The mesh implementation's step count changes the values every step."""
  def run_twice():
    impl = mtf_testing.make_impl(mode, "all:8", "a:all")

    def build_and_lower():
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      u = mtf.random_uniform(mesh, SHAPE)
      lowering = mtf.Lowering(graph, {mesh: impl})
      return lowering, lowering.export_to_tf_tensor(u)

    if mode == "eager":
      return [mtf_testing.run_in_mode(mode, build_and_lower)
              for _ in range(2)]
    if mode == "function":
      fn = tf.function(lambda: build_and_lower()[1])
      return [np.asarray(fn()) for _ in range(2)]
    if mode == "simd":
      fn = tf.function(lambda: impl.run(lambda: build_and_lower()[1]))
      return [np.asarray(fn()) for _ in range(2)]
    with tf.Graph().as_default():
      _, value = build_and_lower()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return [sess.run(value) for _ in range(2)]

  first, second = run_twice()
  assert not np.array_equal(first, second)
  again_first, again_second = run_twice()
  np.testing.assert_array_equal(first, again_first)
  np.testing.assert_array_equal(second, again_second)
