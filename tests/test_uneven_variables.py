"""Variables split unevenly: they train as on one processor, their padding
stays zero, and checkpoints hold exactly the logical tensors, restoring
into any other layout (even or uneven)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import layer_stacked_models as layer_models
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


def _read_lowered(impl):
  """tf Tensors of w and b under `impl` (a fresh Lowering)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", "n:7;h:12", initializer=W0 * 0)
  b = mtf.get_variable(mesh, "b", "h:12", initializer=B0 * 0)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t) for t in (w, b)]


def _read(impl, mode):
  """The values of w and b under PlacementMeshImpl `impl`."""
  read = lambda: _read_lowered(impl)
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


def _layers_model(mesh, optimizer):
  """Three tanh layers of [n:7, h:7] kernels (stacked by autostack)."""
  h = mtf.import_tf_tensor(mesh, tf.constant(X), "b:5;n:7")
  for i in range(3):
    init = np.roll(W0[:, :7], i, axis=1)
    w = mtf.get_variable(mesh, f"layer{i}/w", "n:7;h:7", initializer=init)
    h = mtf.rename_dimension(
        mtf.tanh(mtf.einsum([h, w], output_shape="b:5;h:7")), "h", "n")
  loss = mtf.reduce_mean(mtf.square(h))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  return loss, optimizer().apply_grads(grads, variables)


def _train_layers(mesh_shape, layout, mode, steps=3):
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  lowerings = []

  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, updates = _layers_model(mesh, OPTIMIZERS["adam"])
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowerings.append(lowering)
    return lowering, [lowering.lowered_operation(u) for u in updates], (
        lowering.export_to_tf_tensor(loss))

  losses = training_loop.run_steps(step, impl, mode, steps)
  return np.array([float(loss) for loss in losses]), impl, lowerings[-1]


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_autostacked_padded_variables_train_and_checkpoint(tmp_path, mode):
  """Same-shaped padded kernels (and their Adam slots) share stacked
  storage; they train as on one processor and save logical tensors."""
  layout = _uneven([("n", "all")])
  losses, impl, lowering = _train_layers("all:8", layout, mode)
  np.testing.assert_allclose(
      losses, _train_layers("all:1", "", "eager")[0], rtol=1e-5)
  assert any(type(v.storage).__name__ == "StackMember"
             for v in lowering.variables.values())
  path = os.path.join(tmp_path, "ckpt")
  tf.train.Checkpoint(model=impl).write(path)
  saved = mtf.storage.checkpointing.load_variables(path, prefix="model")
  assert saved["layer2/w"].shape == (7, 7)

  target = mtf.placement_mesh_impl.PlacementMeshImpl(
      "b:4;m:2", _uneven([("n", "b"), ("h", "m")]))
  tf.train.Checkpoint(model=target).restore(path).expect_partial()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _layers_model(mesh, OPTIMIZERS["adam"])
  restored = mtf.Lowering(graph, {mesh: target})
  for var in graph.all_variables:
    np.testing.assert_array_equal(
        restored.export_to_tf_tensor(var.outputs[0]).numpy(),
        saved[var.name], err_msg=var.name)


def _layer_stacked_checkpoint(impl, stacked, path):
  """Builds the layers (tests/layer_stacked_models), assigns v * 2 + 1 to
  every variable and checkpoints; returns (rows read by member name, the
  checkpoint's values)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  layer_models.layers(mesh, stacked)
  variables = graph.trainable_variables
  assigns = [mtf.assign(v, v.outputs[0] * 2.0 + 1.0) for v in variables]
  reads = {v.name: mtf.read_variable(v, dependencies=assigns)
           for v in variables}
  lowering = mtf.Lowering(graph, {mesh: impl})
  values = {k: lowering.export_to_tf_tensor(t).numpy()
            for k, t in reads.items()}
  tf.train.Checkpoint(model=impl).write(path)
  return (layer_models.rows_by_member(values, graph),
          mtf.storage.checkpointing.load_variables(path, prefix="model"))


def test_layer_stacked_variables_with_a_padded_stack_dimension(tmp_path):
  """4 layers stacked over all:8 (and, on s:2;m:3, h 16 over 3): rows and
  checkpoint entries are the per-layer variables'."""
  want_rows, want_saved = _layer_stacked_checkpoint(
      mtf.placement_mesh_impl.PlacementMeshImpl("all:1", ""), False,
      os.path.join(tmp_path, "ref"))
  for mesh_shape, layout in (
      ("all:8", _uneven([("stage", "all")])),
      ("s:2;m:3", _uneven([("stage", "s"), ("h", "m")]))):
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mesh_shape, layout, [""] * mtf.convert_to_shape(mesh_shape).size)
    rows, saved = _layer_stacked_checkpoint(
        impl, True, os.path.join(tmp_path, mesh_shape.replace(":", "_")))
    assert sorted(saved) == layer_models.MEMBERS
    for name in layer_models.MEMBERS:
      np.testing.assert_array_equal(rows[name], want_rows[name],
                                    err_msg=name)
      np.testing.assert_array_equal(saved[name], want_saved[name],
                                    err_msg=name)


def test_simd_checkpoint_of_padded_variables(tmp_path):
  """SimdMeshImpl saves the logical tensors of padded variables too, and
  restores them into another uneven layout."""
  _, impl, _ = _train("b:4;m:2", LAYOUTS[3][2], "simd", OPTIMIZERS["sgd"])
  path = os.path.join(tmp_path, "ckpt")
  tf.train.Checkpoint(model=impl).write(path)
  loaded = mtf.storage.checkpointing.load_variables(path, prefix="model")
  _, reference, _ = _train("all:1", "", "eager", OPTIMIZERS["sgd"])
  for got, want in zip((loaded["w"], loaded["b"]), _read(reference, "eager")):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  target = mtf.simd_mesh_impl.SimdMeshImpl("all:8", _uneven([("h", "all")]))
  tf.train.Checkpoint(model=target).restore(path).expect_partial()
  w, b = (np.asarray(v) for v in target.run_each(
      lambda: _read_lowered(target))[0])
  np.testing.assert_array_equal(w, loaded["w"])
  np.testing.assert_array_equal(b, loaded["b"])


def _saver_session(impl, path, save):
  """Graph mode: w (assigned 2 w + 1 before saving) through a compat
  Saver; returns the value read after saving or restoring."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w = mtf.get_variable(mesh, "w", "n:7;h:12",
                         initializer=W0 if save else W0 * 0)
    if save:
      w = mtf.read_variable(w, dependencies=[mtf.assign(w, w * 2.0 + 1.0)])
    lowering = mtf.Lowering(graph, {mesh: impl})
    value = lowering.export_to_tf_tensor(w)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      if save:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        result = sess.run(value)
        sess.run(lowering.copy_slices_to_masters())
        saver.save(sess, path)
      else:
        saver.restore(sess, path)
        sess.run(lowering.copy_masters_to_slices())
        result = sess.run(value)
  return result


def test_compat_saver_checkpoint_of_padded_variables(tmp_path):
  """The masters a compat Saver writes hold the logical tensor, and restore
  into another uneven layout."""
  path = os.path.join(tmp_path, "ckpt")
  saved = _saver_session(mtf.placement_mesh_impl.PlacementMeshImpl(
      "b:4;m:2", LAYOUTS[3][2]), path, save=True)
  np.testing.assert_allclose(saved, W0 * 2 + 1, rtol=1e-6)
  loaded = mtf.storage.checkpointing.load_variables(path)
  assert loaded["w"].shape == (7, 12)
  np.testing.assert_array_equal(loaded["w"], saved)
  restored = _saver_session(mtf.placement_mesh_impl.PlacementMeshImpl(
      "all:8", LAYOUTS[1][2]), path, save=False)
  np.testing.assert_array_equal(restored, saved)
