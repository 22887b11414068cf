"""SimdMeshImpl with the host back end gives PlacementMeshImpl's answers."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl

RNG = np.random.RandomState(11)
X = RNG.randn(8, 4).astype(np.float32)
INTS = RNG.randint(-50, 50, size=(8, 16)).astype(np.int32)

BATCH = mtf.Dimension("batch", 8)
IO = mtf.Dimension("io", 4)
HIDDEN = mtf.Dimension("hidden", 16)

LAYOUTS = [
    ("all:8", "batch:all"),
    ("all:8", "hidden:all"),
    ("b:2;m:4", "batch:b;hidden:m"),
    ("b:2;m:4", "hidden:b;batch:m"),
]
LAYOUT_IDS = ["data", "model", "2d", "2d_swapped"]


def _ops_program(mesh, x, ints):
  """Exercises allreduce (sum/max/min, int, bool), allconcat, alltoall,
  receive, import/export, random and a variable update."""
  xm = mtf.import_tf_tensor(mesh, x, [BATCH, IO])
  im = mtf.import_tf_tensor(mesh, ints, [BATCH, HIDDEN])
  w = mtf.get_variable(mesh, "w", [IO, HIDDEN])
  h = mtf.tanh(mtf.einsum([xm, w], [BATCH, HIDDEN]))
  loss = mtf.reduce_sum(mtf.square(h))
  (grad,) = mtf.gradients([loss], [w])
  update = mtf.assign_sub(w, grad * 0.1)
  folded = mtf.reshape(h, [mtf.Dimension("rows", 4),
                           mtf.Dimension("cols", 32)])
  return {
      "loss": loss,
      "h": h,
      "max_over_batch": mtf.reduce_max(h, reduced_dim=BATCH),
      "min_over_hidden": mtf.reduce_min(h, reduced_dim=HIDDEN),
      "int_sum": mtf.reduce_sum(im, reduced_dim=BATCH),
      "any_positive": mtf.reduce_any(mtf.greater(im, 40),
                                     reduced_dim=HIDDEN),
      "folded": folded,
      "shifted": mtf.shift(h, 1, HIDDEN, wrap=False),
      "rolled": mtf.shift(h, -3, BATCH, wrap=True),
      "noise": mtf.random_uniform(mesh, [BATCH, HIDDEN], seed=5),
      "grad": grad,
  }, update


def _run(impl, mode, steps=2):
  """Runs the ops program `steps` times; returns the list of outputs."""

  def program(x, ints):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs, _ = _ops_program(mesh, x, ints)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}

  if isinstance(impl, simd_mesh_impl.SimdMeshImpl):
    step = lambda x, ints: impl.run(program, x, ints)
  else:
    step = program
  if mode == "function":
    step = tf.function(step)
  return [tf.nest.map_structure(np.asarray, step(tf.constant(X),
                                                 tf.constant(INTS)))
          for _ in range(steps)]


def assert_same_results(got_steps, want_steps):
  """Integers equal, floats to round-off, at every step."""
  for step, (got, want) in enumerate(zip(got_steps, want_steps)):
    for name in want:
      if want[name].dtype.kind in "biu":
        np.testing.assert_array_equal(got[name], want[name],
                                      err_msg=f"{name} step {step}")
      else:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5,
                                   atol=1e-6, err_msg=f"{name} step {step}")


@pytest.mark.parametrize("mode", ["function", "eager"])
@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_simd_matches_placement(mesh_shape, layout, mode):
  simd = _run(simd_mesh_impl.SimdMeshImpl(mesh_shape, layout,
                                     collective_timeout_seconds=30), mode)
  placement = _run(
      mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout),
      "function")
  assert_same_results(simd, placement)
  # The update ran: the second step saw a different w.
  assert not np.allclose(simd[0]["h"], simd[1]["h"])
  np.testing.assert_array_equal(simd[0]["int_sum"], INTS.sum(axis=0))


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("all:2", "batch:all"), ("b:2;m:4", "batch:b;io:m")])
def test_program_is_traced_once_whatever_the_mesh(mesh_shape, layout):
  impl = simd_mesh_impl.SimdMeshImpl(mesh_shape, layout)
  traces = []

  def program(x):
    traces.append(1)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    total = mtf.reduce_sum(mtf.import_tf_tensor(mesh, x, [BATCH, IO]))
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(total)

  result = tf.function(lambda x: impl.run(program, x))(tf.constant(X))
  assert len(traces) == 1
  np.testing.assert_allclose(result, X.sum(), rtol=1e-5)


@pytest.mark.parametrize("mode", ["function", "eager"])
def test_alltoall_sends_block_k_to_member_k(mode):
  impl = simd_mesh_impl.SimdMeshImpl("a:2;b:4", "")
  full = np.arange(8 * 8, dtype=np.float32).reshape(8, 8)

  def program(x):
    laid_out = mtf.mesh_impl.LaidOutTensor([x])
    result = impl.alltoall(laid_out, 1, split_axis=1, concat_axis=0)
    return result.one_slice

  step = lambda x: impl.run(program, x)
  if mode == "function":
    step = tf.function(step)
  got = step(tf.constant(full)).numpy()
  # Processor 0 (coordinate 0 along b) gets block 0 from each of 4 members.
  np.testing.assert_array_equal(got, np.concatenate([full[:, 0:2]] * 4))


def test_lowering_outside_run_is_a_clear_error():
  impl = simd_mesh_impl.SimdMeshImpl("all:2", "batch:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.import_tf_tensor(mesh, tf.constant(X), [BATCH, IO])
  with pytest.raises(mtf.LayoutError, match="mesh_impl.run"):
    mtf.Lowering(graph, {mesh: impl})


def test_simd_checkpoint_restores_on_placement(tmp_path):
  impl = simd_mesh_impl.SimdMeshImpl("b:2;m:4", "batch:b;hidden:m")
  trained = _run(impl, "function", steps=3)
  path = tf.train.Checkpoint(model=impl).save(os.path.join(tmp_path, "c"))
  placement = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
  tf.train.Checkpoint(model=placement).restore(path)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", [IO, HIDDEN])
  value = mtf.Lowering(graph, {mesh: placement}).export_to_tf_tensor(w)
  # w after three updates: the fourth step would start from it.
  expected = mtf.checkpointing.load_variables(path, prefix="model")["w"]
  np.testing.assert_array_equal(value.numpy(), expected)
  assert not np.allclose(trained[0]["grad"], trained[2]["grad"])
