"""Tests of mesh_tensorflow.layers.residual_layers.

A stack of reversible blocks must give the values and gradients (of the
input and of every variable) of the same stack computed plainly, under
several layouts and in the three execution modes, without its gradient
reading the activations inside the blocks.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

BATCH = mtf.Dimension("batch", 4)
LENGTH = mtf.Dimension("length", 2)
C = mtf.Dimension("c", 4)
HIDDEN = mtf.Dimension("hidden", 6)

X = np.random.RandomState(0).uniform(-1.0, 1.0, [4, 2, 4]).astype(np.float32)
COTANGENT = np.random.RandomState(1).uniform(-1.0, 1.0, [4, 2, 4])

LAYOUTS = [("all:1", ""), ("all:4", "batch:all"),
           ("rows:2;cols:2", "batch:rows;c:cols"),
           ("rows:2;cols:2", "length:rows;hidden:cols")]


def _params(layouts, modes=mtf_testing.MODES):
  return mtf_testing.mesh_layout_mode_params(layouts, modes)


def _block_fn(k):
  """A two-layer block with its own variables "f{k}/..."."""
  def f(x):
    h = mtf.layers.dense(x, HIDDEN, reduced_dims=[C], activation=mtf.tanh,
                         name=f"f{k}/wi")
    return mtf.layers.dense(h, C, reduced_dims=[HIDDEN], name=f"f{k}/wo")
  return f


def _build_stack(recompute_grads, num_blocks=3):
  def build(mesh):
    x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, C])
    x1, x1_bw, x2, x2_bw = x, None, x * 0.5, None
    for k in range(num_blocks):
      x1, x1_bw, x2, x2_bw = mtf.layers.reversible_half_residual_and_swap(
          x1, x1_bw, x2, x2_bw, _block_fn(k),
          recompute_grads=recompute_grads)
    y = (x1 + x2) * 0.5
    c = mtf_testing.import_array(mesh, COTANGENT.astype(np.float32),
                                 y.shape.dims)
    wrt = {"x": x}
    wrt.update({v.name: v.outputs[0]
                for v in mesh.graph.trainable_variables})
    return {"y": y}, mtf.reduce_sum(y * c), wrt
  return build


@pytest.mark.parametrize("mesh_shape,layout,mode", _params(LAYOUTS))
def test_reversible_stack_matches_plain_stack(mesh_shape, layout, mode):
  got, graph = mtf_testing.run_program(mesh_shape, layout, mode,
                                       _build_stack(True))
  want, _ = mtf_testing.run_program(mesh_shape, layout, mode,
                                    _build_stack(False))
  assert sorted(got) == sorted(want)
  # 3 blocks x 2 dense layers x (kernel, bias), each with a gradient.
  assert len([k for k in got if k.startswith("d_f")]) == 12
  for k in sorted(want):
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5,
                               err_msg=k)
  # The gradient never reads the activations inside the blocks: every
  # operation that reads one belongs to a block's forward computation.
  ops = [op for op in graph.operations
         if isinstance(op, mtf.layers.ReversibleHalfResidualOperation)]
  assert len(ops) == 3
  for op in graph.operations:
    if any(not t.usable for t in op.inputs):
      assert all(not t.usable for t in op.outputs), op


def test_reversible_stack_matches_numpy():
  got, _ = mtf_testing.run_program("all:1", "", "eager", _build_stack(True))

  def dense(x, name):
    return x @ got[name + "/kernel"] + got[name + "/bias"]

  x1, x2 = X.astype(np.float64), X.astype(np.float64) * 0.5
  for k in range(3):
    fx2 = dense(np.tanh(dense(x2, f"f{k}/wi")), f"f{k}/wo")
    x1, x2 = x2, x1 + fx2
  np.testing.assert_allclose(got["y"], (x1 + x2) * 0.5, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_reversible_block_without_variables_and_unused_outputs(mode):
  """Only y1 is used; f reads an imported tensor instead of a variable."""
  scale_value = np.linspace(0.5, 2.0, 4).astype(np.float32)

  def build(recompute):
    def fn(mesh):
      x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, C])
      scale = mtf_testing.import_array(mesh, scale_value, [C])
      _, _, y1, _ = mtf.layers.reversible_half_residual_and_swap(
          x, None, x, None, lambda t: mtf.sin(t) * scale,
          recompute_grads=recompute)
      return {"y": y1}, mtf.reduce_sum(y1 * y1), {"x": x, "scale": scale}
    return fn

  got, _ = mtf_testing.run_program("all:4", "batch:all", mode, build(True))
  x = X.astype(np.float64)
  y = x + np.sin(x) * scale_value
  np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      got["d_x"], 2 * y * (1 + np.cos(x) * scale_value), rtol=1e-5,
      atol=1e-5)
  np.testing.assert_allclose(
      got["d_scale"], np.sum(2 * y * np.sin(x), axis=(0, 1)), rtol=1e-4,
      atol=1e-4)


def test_reversible_block_rejects_mismatched_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, C])
  with pytest.raises(ValueError, match="shape"):
    mtf.layers.reversible_half_residual_and_swap(
        x, None, x, None, lambda t: mtf.reduce_sum(t, reduced_dim=C))


# ------------------------------------------------------ annealed dropout


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         _params([("all:1", ""), ("all:4", "batch:all")]))
def test_annealed_dropout(mesh_shape, layout, mode):
  big = np.ones([4, 2, 256], np.float32)
  wide = mtf.Dimension("c", 256)

  def build(mesh):
    x = mtf_testing.import_array(mesh, big, [BATCH, LENGTH, wide])
    # At the initial global step 0:
    before = mtf.layers.annealed_dropout(x, True, 5, 10)  # rate 1
    half = mtf.layers.annealed_dropout(x, True, -10, 10,
                                       init_rate=1.0)  # rate 0.5
    after = mtf.layers.annealed_dropout(x, True, -10, -5, init_rate=0.5)
    shared = mtf.layers.annealed_dropout(x, True, -10, 10, init_rate=1.0,
                                         noise_shape=[BATCH, wide])
    assert mtf.layers.annealed_dropout(x, False, 0, 10) is x
    named = mtf.layers.annealed_dropout(x, True, -10, 10, name="drop")
    assert named.operation.name.startswith("drop")
    loss = mtf.reduce_sum(half * 3.0)
    return ({"before": before, "half": half, "after": after,
             "shared": shared}, loss, {"x": x})

  got, _ = mtf_testing.run_program(mesh_shape, layout, mode, build)
  np.testing.assert_array_equal(got["before"], np.zeros_like(big))
  np.testing.assert_allclose(got["after"], big)
  half = got["half"]
  assert set(np.unique(half)) <= {0.0, 2.0}
  assert 0.4 < np.mean(half == 0) < 0.6
  np.testing.assert_allclose(got["d_x"], half * 3.0)
  np.testing.assert_array_equal(got["shared"][:, 0], got["shared"][:, 1])


# --------------------------------------- gradient summary for clipping


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("all:4", "batch:all"),
    ("rows:2;cols:2", "batch:rows;c:cols")])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_summary_for_clip_activation_gradient(mesh_shape, layout, mode):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)

  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, C])
    y = mtf.layers.summary_for_clip_activation_gradient(x * 2.0, "grad_rms")
    y = mtf.layers.summary_for_clip_activation_gradient(
        y, "example_grad_rms", batch_dims=[BATCH])
    c = mtf_testing.import_array(mesh, COTANGENT.astype(np.float32),
                                 y.shape.dims)
    (dx,) = mtf.gradients([mtf.reduce_sum(y * c)], [x])
    lowering = mtf.Lowering(graph, {mesh: impl})
    summaries = lowering.scalar_summaries
    return (lowering.export_to_tf_tensor(y), lowering.export_to_tf_tensor(dx),
            summaries["grad_rms"], summaries["example_grad_rms"])

  result = run() if mode == "eager" else tf.function(run)()
  y, dx, rms, example_rms = [np.asarray(v) for v in result]
  np.testing.assert_allclose(y, X * 2.0, rtol=1e-6)
  # The gradient passes through unchanged.
  np.testing.assert_allclose(dx, COTANGENT * 2.0, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(rms, np.sqrt(np.mean(np.square(COTANGENT))),
                             rtol=1e-5)
  np.testing.assert_allclose(
      example_rms,
      np.mean(np.sqrt(np.mean(np.square(COTANGENT), axis=(1, 2)))),
      rtol=1e-5)


def test_summary_for_clip_activation_gradient_rejects_unknown_batch_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, C])
  with pytest.raises(mtf.ShapeError, match="rms"):
    mtf.layers.summary_for_clip_activation_gradient(
        x, "rms", batch_dims=[mtf.Dimension("other", 4)])
