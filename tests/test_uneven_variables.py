"""Variables split unevenly: they train as on one processor, their padding
stays zero, and checkpoints hold exactly the logical tensors, restoring
into any other layout (even or uneven)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing
from tests import training_loop

RNG = np.random.RandomState(11)
X = RNG.randn(5, 7).astype(np.float32)        # [b:5, n:7]
W0 = RNG.randn(7, 12).astype(np.float32) * 0.3  # [n:7, h:12]
B0 = RNG.randn(12).astype(np.float32) * 0.1   # [h:12]
STEPS = 3


def _uneven(pairs):
  return mtf.LayoutRules(pairs, allow_uneven=True)


# (id, mesh shape, layout): n 7 and h 12 over 8; b 5 over 2 and n 7 over 4;
# n 7 over 4 and h 12 over 8 (b whole).
LAYOUTS = [
    ("all8_n", "all:8", _uneven([("n", "all")])),
    ("all8_h", "all:8", _uneven([("h", "all")])),
    ("b2m4", "b:2;m:4", _uneven([("b", "b"), ("n", "m")])),
    ("b4m2", "b:4;m:2", _uneven([("n", "b"), ("h", "m")])),
]


def _model(mesh, optimizer):
  """loss = mean((tanh(x w) + b)^2); returns (loss, w, b, update ops)."""
  x = mtf.import_tf_tensor(mesh, tf.constant(X), "b:5;n:7")
  w = mtf.get_variable(mesh, "w", "n:7;h:12", initializer=W0)
  b = mtf.get_variable(mesh, "b", "h:12", initializer=B0)
  y = mtf.tanh(mtf.einsum([x, w], output_shape="b:5;h:12")) + b
  loss = mtf.reduce_mean(mtf.square(y))
  graph = mesh.graph
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  return loss, w, b, optimizer().apply_grads(grads, variables)


def _train(mesh_shape, layout, mode, optimizer):
  """STEPS steps; returns ([loss, w, b] per step, impl, last Lowering)."""
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  lowerings = []

  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, w, b, updates = _model(mesh, optimizer)
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowerings.append((lowering, w, b))
    return lowering, [lowering.lowered_operation(u) for u in updates], [
        lowering.export_to_tf_tensor(t) for t in (loss, w, b)]

  history = training_loop.run_steps(step, impl, mode, STEPS,
                                    fetch_after_step=True)
  return history, impl, lowerings[-1]


OPTIMIZERS = {
    "sgd": lambda: mtf.optimize.SgdOptimizer(0.5),
    "adam": lambda: mtf.optimize.AdamWeightDecayOptimizer(
        0.1, weight_decay_rate=0.01),
    "adafactor": lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.1),
}

_REFERENCE = {}


def _one_processor(mode, optimizer):
  key = (mode, optimizer)
  if key not in _REFERENCE:
    _REFERENCE[key] = _train("all:1", "", mode, OPTIMIZERS[optimizer])[0]
  return _REFERENCE[key]


def _train_params():
  params = []
  for case_id, mesh_shape, layout in LAYOUTS:
    for mode in ("eager", "simd"):
      params.append(pytest.param(mesh_shape, layout, mode, "sgd",
                                 id=f"{case_id}-{mode}-sgd"))
  params += [pytest.param("b:2;m:4", LAYOUTS[2][2], mode, "sgd",
                          id=f"b2m4-{mode}-sgd")
             for mode in ("function", "graph")]
  params += [pytest.param("b:4;m:2", LAYOUTS[3][2], "eager", optimizer,
                          id=f"b4m2-eager-{optimizer}")
             for optimizer in ("adam", "adafactor")]
  return params


@pytest.mark.parametrize("mesh_shape,layout,mode,optimizer", _train_params())
def test_padded_variables_train_as_on_one_processor(mesh_shape, layout, mode,
                                                    optimizer):
  history, impl, (lowering, w, b) = _train(mesh_shape, layout, mode,
                                           OPTIMIZERS[optimizer])
  assert impl.padded_axes(w.shape) or impl.padded_axes(b.shape)
  want = _one_processor(mode, optimizer)
  for i, (got_step, want_step) in enumerate(zip(history, want)):
    for name, got, expected in zip(("loss", "w", "b"), got_step, want_step):
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5,
                                 err_msg=f"step {i} {name}")
  if mode == "eager":
    # The slices the optimizer wrote (variables and slots) keep zero
    # padding.
    for var, laid_out in lowering.variables.items():
      shape = var.outputs[0].shape
      slices = [np.asarray(v) for v in laid_out.laid_out_tensor.tensor_list]
      mtf_testing.assert_padding_is_zero(
          slices, [impl.slice_begin(shape, p) for p in range(impl.size)],
          impl.padded_axes(shape), var.name)


def _read(impl, mode):
  """The values of w and b under `impl` (a fresh Lowering)."""
  def read():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w = mtf.get_variable(mesh, "w", "n:7;h:12", initializer=W0 * 0)
    b = mtf.get_variable(mesh, "b", "h:12", initializer=B0 * 0)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in (w, b)]

  if mode == "function":
    read = tf.function(read)
  return [np.asarray(v) for v in read()]


@pytest.mark.parametrize("target", [
    ("all:1", ""),
    ("b:2;m:4", mtf.LayoutRules([("h", "m")])),
    ("b:4;m:2", _uneven([("n", "b"), ("h", "m")])),
    ("all:8", _uneven([("h", "all")])),
], ids=["one", "even_2d", "uneven_2d", "uneven_h"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_checkpoint_holds_the_logical_tensor_and_restores_anywhere(
    tmp_path, target, mode):
  path = os.path.join(tmp_path, "ckpt")
  _, impl, _ = _train("all:8", LAYOUTS[0][2], "eager", OPTIMIZERS["sgd"])
  trained_w, trained_b = _read(impl, "eager")
  assert not np.array_equal(trained_w, W0)
  tf.train.Checkpoint(model=impl).write(path)

  loaded = mtf.storage.checkpointing.load_variables(path, prefix="model")
  assert loaded["w"].shape == (7, 12) and loaded["b"].shape == (12,)
  np.testing.assert_array_equal(loaded["w"], trained_w)
  np.testing.assert_array_equal(loaded["b"], trained_b)
  shapes = dict(tf.train.list_variables(path))
  assert shapes["model/w/.ATTRIBUTES/VARIABLE_VALUE"] == [7, 12]

  restored_impl = mtf.placement_mesh_impl.PlacementMeshImpl(*target)
  tf.train.Checkpoint(model=restored_impl).restore(path).expect_partial()
  w, b = _read(restored_impl, mode)
  np.testing.assert_array_equal(w, trained_w)
  np.testing.assert_array_equal(b, trained_b)
