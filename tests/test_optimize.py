"""Optimizers: three training steps against a NumPy version of each rule.

The model is a weight w[io=8, hidden=16] and a bias b[hidden=16] with the
loss 0.5 * sum((w * x + b - y)^2). Each optimizer runs in a tf.function on
one processor and on a 2-D mesh that shards w, b and every slot
("hidden:cols;io:rows"); two of them also eagerly and in tf.compat.v1 graph
mode. The mesh implementation is made once, outside the tf.function: it owns
the variables, which persist across the function's calls. The training loop
owns TF's global step and increments it after each step, as the original's
did; the optimizers only read it.
"""

import math
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import global_step
from mesh_tensorflow import optimize
from tests import training_loop

IO, HIDDEN = 8, 16
STEPS = 3
MESHES = [("1proc", "all:1", ""),
          ("2d", "rows:2;cols:4", "hidden:cols;io:rows")]


def _random(seed, shape):
  return np.random.RandomState(seed).uniform(-1.0, 1.0, size=shape).astype(
      np.float32)


W0 = _random(0, (IO, HIDDEN))
B0 = _random(1, (HIDDEN,))
X = _random(2, (IO,))
Y = _random(3, (IO, HIDDEN))


def _np_grads(params):
  err = params["w"] * X[:, None] + params["b"][None, :] - Y
  return {"w": err * X[:, None], "b": err.sum(axis=0)}


def _rms(x):
  return np.sqrt(np.mean(np.square(x)))


# ------------------------------------------------- NumPy update rules


def _np_sgd(lr):
  def update(params, grads, slots, step):
    del slots, step
    for k in params:
      params[k] = params[k] - lr * grads[k]
  return update


def _np_momentum(lr, momentum):
  def update(params, grads, slots, step):
    del step
    for k in params:
      v = momentum * slots.get(k + "_momentum_v", 0.0) - lr * grads[k]
      slots[k + "_momentum_v"] = v
      params[k] = params[k] + v
  return update


def _np_adam(lr, weight_decay_rate, beta_1, beta_2, epsilon, excluded):
  def update(params, grads, slots, step):
    del step
    for k in params:
      m = beta_1 * slots.get(k + "/adam_m", 0.0) + (1 - beta_1) * grads[k]
      v = (beta_2 * slots.get(k + "/adam_v", 0.0) +
           (1 - beta_2) * grads[k] ** 2)
      slots[k + "/adam_m"], slots[k + "/adam_v"] = m, v
      u = m / (np.sqrt(v) + epsilon)
      if k not in excluded:
        u = u + weight_decay_rate * params[k]
      params[k] = params[k] - lr * u
  return update


def _np_adafactor(lr_fn, decay_fn, scaled=("w", "b"), factored=(), beta1=0.0,
                  clipping_threshold=1.0, epsilon1=1e-30, epsilon2=1e-3):
  """`factored`: names of parameters whose second moment is factored (for
  w the largest dimension is hidden (axis 1), then io (axis 0))."""
  def update(params, grads, slots, step):
    lr, decay = lr_fn(step), decay_fn(step)
    for k in params:
      g, p = grads[k], params[k]
      scale = max(_rms(p), epsilon2) * lr if k in scaled else lr
      g2 = g ** 2 + epsilon1
      if k in factored:
        vr = decay * slots.get(k + "_slot_vr", 0.0) + (1 - decay) * g2.mean(1)
        vc = decay * slots.get(k + "_slot_vc", 0.0) + (1 - decay) * g2.mean(0)
        slots[k + "_slot_vr"], slots[k + "_slot_vc"] = vr, vc
        x = g / np.sqrt(vr / vr.mean())[:, None] / np.sqrt(vc)[None, :]
      else:
        v = decay * slots.get(k + "_slot_v", 0.0) + (1 - decay) * g2
        slots[k + "_slot_v"] = v
        x = g / np.sqrt(v)
      if clipping_threshold is not None:
        x = x / max(_rms(x) / clipping_threshold, 1.0)
      sub = x * scale
      if beta1:
        sub = beta1 * slots.get(k + "_slot_m", 0.0) + (1 - beta1) * sub
        slots[k + "_slot_m"] = sub
      params[k] = p - sub
  return update


def _per_param(**updates):
  """An update applying `updates[k]` to parameter k (e.g. each with its own
  learning rate)."""
  def update(params, grads, slots, step):
    for k, param_update in updates.items():
      one = {k: params[k]}
      param_update(one, grads, slots, step)
      params[k] = one[k]
  return update


def _default_lr(step):
  return min(1.0 / math.sqrt(step + 1.0), 0.01)


def _pow_decay(step):
  return 1.0 - (step + 1.0) ** -0.8


def _adam_decay(beta2):
  return lambda step: beta2 * (1 - beta2 ** step) / (1 - beta2 ** (step + 1))


def _np_train(update):
  """Parameters and slots (float64) after each of STEPS steps."""
  params = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
  slots = {}
  history = []
  for step in range(STEPS):
    update(params, _np_grads(params), slots, step)
    history.append({**params, **slots})
  return history


# name -> (optimizer factory, NumPy update)
CASES = {
    "sgd": (lambda: optimize.SgdOptimizer(0.1), _np_sgd(0.1)),
    "momentum": (lambda: optimize.MomentumOptimizer(0.1, 0.9),
                 _np_momentum(0.1, 0.9)),
    "adam": (lambda: optimize.AdamWeightDecayOptimizer(
        0.01, weight_decay_rate=0.1, exclude_from_weight_decay=["b"]),
             _np_adam(0.01, 0.1, 0.9, 0.999, 1e-6, excluded=("b",))),
    "adafactor_default": (optimize.AdafactorOptimizer,
                          _np_adafactor(_default_lr, _pow_decay)),
    "adafactor_factored": (
        lambda: optimize.AdafactorOptimizer(
            learning_rate=0.05, beta1=0.5, clipping_threshold=2.0,
            decay_rate=optimize.adafactor_decay_rate_adam(0.99),
            min_dim_size_to_factor=8),
        _np_adafactor(lambda step: 0.05, _adam_decay(0.99), factored=("w",),
                      beta1=0.5, clipping_threshold=2.0)),
    "adafactor_unscaled": (
        lambda: optimize.AdafactorOptimizer(
            multiply_by_parameter_scale=False, decay_rate=0.9,
            clipping_threshold=None),
        _np_adafactor(lambda step: 0.05 * _default_lr(step),
                      lambda step: 0.9, scaled=(), clipping_threshold=None)),
    "adafactor_excluded": (
        lambda: optimize.AdafactorOptimizer(
            learning_rate=tf.constant(0.02), decay_rate=0.5,
            exclude_from_parameter_scale=["b"]),
        _np_adafactor(lambda step: 0.02, lambda step: 0.5, scaled=("w",))),
    # b follows 0.5 * (step + 1) / train_steps, w the optimizer's rate.
    "adam_multi_lr": (
        lambda: optimize.AdamWithMultiLRSchedule(
            ["^b$", "b"],
            [[0.5, lambda step, total: (tf.cast(step, tf.float32) + 1.0) /
              total], None],
            learning_rate=0.01, weight_decay_rate=0.1,
            exclude_from_weight_decay=["b"], train_steps=10),
        _per_param(
            w=_np_adam(0.01, 0.1, 0.9, 0.999, 1e-6, excluded=()),
            b=lambda params, grads, slots, step: _np_adam(
                0.5 * (step + 1) / 10, 0.1, 0.9, 0.999, 1e-6,
                excluded=("b",))(params, grads, slots, step))),
    "adafactor_multi_lr": (
        lambda: optimize.AdafactorWithMultiLRSchedule(
            ["w"], [[0.1]], learning_rate=0.05, decay_rate=0.5,
            train_steps=100),
        _per_param(
            w=_np_adafactor(lambda step: 0.1, lambda step: 0.5),
            b=_np_adafactor(lambda step: 0.05, lambda step: 0.5))),
}


def _train(make_optimizer, mesh_shape, layout, mode):
  """Runs STEPS steps (`training_loop.run_steps`); returns (list of dicts of
  variable values after each step, dict of the slice shapes of each
  variable)."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  slice_shapes = {}

  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w = mtf.get_variable(mesh, "w", [("io", IO), ("hidden", HIDDEN)],
                         initializer=W0)
    b = mtf.get_variable(mesh, "b", [("hidden", HIDDEN)], initializer=B0)
    x = mtf.import_tf_tensor(mesh, tf.constant(X), w.shape - w.shape[1])
    y = mtf.import_tf_tensor(mesh, tf.constant(Y), w.shape)
    loss = mtf.reduce_sum(mtf.square(w * x + b - y)) * 0.5
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = make_optimizer().apply_grads(grads, variables)
    if mode == "graph":
      # Read in a Session.run of their own, after the training step's.
      reads = {v.name: v.outputs[0] for v in graph.all_variables}
    else:
      reads = {v.name: mtf.read_variable(v, dependencies=updates)
               for v in graph.all_variables}
    lowering = mtf.Lowering(graph, {mesh: impl})
    train_op = [lowering.lowered_operation(update) for update in updates]
    slice_shapes.update({
        v.name: [tuple(s.shape) for s in lowering.variables[v].slice_variables]
        for v in graph.all_variables})
    values = {k: lowering.export_to_tf_tensor(v) for k, v in reads.items()}
    return lowering, train_op, values

  history = training_loop.run_steps(step, impl, mode, STEPS,
                                    fetch_after_step=True)
  return history, slice_shapes


def _check(case, mesh_shape, layout, mode):
  make_optimizer, np_update = CASES[case]
  history, slice_shapes = _train(make_optimizer, mesh_shape, layout, mode)
  want_history = _np_train(np_update)
  for step, (got, want) in enumerate(zip(history, want_history)):
    assert sorted(got) == sorted(want)
    for name, value in want.items():
      np.testing.assert_allclose(
          got[name], value, rtol=1e-5, atol=1e-5,
          err_msg=f"{case} [{mesh_shape}, {layout}, {mode}] {name!r} after "
          f"step {step + 1}")
  # The parameters changed; the check is not comparing two no-ops.
  assert not np.allclose(history[-1]["w"], W0, atol=1e-3)
  if mesh_shape != "all:1":
    # Slots are laid out like their parameters: io over rows (2), hidden
    # over cols (4).
    expected = {"w": (4, 4), "b": (4,), "w_slot_vr": (4,),
                "w_slot_vc": (4,)}
    for name, shapes in slice_shapes.items():
      param = name.split("/")[0].split("_")[0]
      want_shape = expected.get(name, expected.get(param))
      assert set(shapes) == {want_shape}, (name, shapes)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mesh_shape,layout",
                         [pytest.param(m, l, id=i) for i, m, l in MESHES])
def test_optimizer_in_function(case, mesh_shape, layout):
  _check(case, mesh_shape, layout, "function")


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("case", ["adam", "adafactor_factored"])
def test_optimizer_in_other_modes(case, mode):
  _check(case, "rows:2;cols:4", "hidden:cols;io:rows", mode)


# ------------------------------------------------------------ the rest


def test_none_gradient_is_skipped_with_a_warning():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", "a:4")
  unused = mtf.get_variable(mesh, "unused", "a:4")
  with mock.patch.object(optimize.logging, "warning") as warning:
    updates = optimize.SgdOptimizer(0.1).apply_grads(
        [mtf.ones(mesh, "a:4"), None], [w.operation, unused.operation])
  assert len(updates) == 1 and updates[0].variables == [w.operation]
  warning.assert_called_once()
  assert "unused" in warning.call_args[0]


def test_apply_grads_checks_its_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", "a:4")
  opt = optimize.SgdOptimizer(0.1)
  with pytest.raises(ValueError, match="2 gradients for 1 variables"):
    opt.apply_grads([None, None], [w])
  with pytest.raises(mtf.ShapeError, match="'w'"):
    opt.apply_grads([mtf.ones(mesh, "a:2")], [w])
  with pytest.raises(NotImplementedError):
    optimize.Optimizer().apply_grads([mtf.ones(mesh, "a:4")], [w])


def test_factored_dims():
  opt = optimize.AdafactorOptimizer(min_dim_size_to_factor=8,
                                    stacked_dim_names=["stack"])
  shape = mtf.Shape([mtf.Dimension("stack", 100), mtf.Dimension("a", 8),
                     mtf.Dimension("b", 16), mtf.Dimension("c", 4)])
  assert [d.name for d in opt._factored_dims(shape)] == ["b", "a"]
  assert opt._factored_dims(shape - shape.dims[1]) is None
  assert optimize.AdafactorOptimizer(factored=False)._factored_dims(
      shape) is None


def test_slots_ignore_the_variable_scope():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with tf.compat.v1.variable_scope("model"):
    w = mtf.get_variable(mesh, "w", "a:4")
  with tf.compat.v1.variable_scope("optimizer"):
    optimize.AdafactorOptimizer().apply_grads([mtf.ones(mesh, "a:4")], [w])
  assert sorted(graph.name_to_variable) == ["model/w", "model/w_slot_v"]
  assert [v.name for v in graph.trainable_variables] == ["model/w"]


def test_make_optimizer():
  sgd = optimize.make_optimizer(optimize.OptimizerHParams(optimizer="SGD"),
                                0.5)
  assert isinstance(sgd, optimize.SgdOptimizer) and sgd.lr == 0.5
  hparams = optimize.OptimizerHParams(
      optimizer_adafactor_decay_type="Adam", optimizer_adafactor_beta1=0.9,
      optimizer_adafactor_factored=False)
  adafactor = optimize.make_optimizer(hparams, 0.01)
  assert isinstance(adafactor, optimize.AdafactorOptimizer)
  assert adafactor._beta1 == 0.9 and not adafactor._factored
  hparams.optimizer_adafactor_decay_type = "linear"
  with pytest.raises(ValueError, match="'linear'"):
    optimize.make_optimizer(hparams, 0.01)
  with pytest.raises(ValueError, match="'Adam'"):
    optimize.make_optimizer(optimize.OptimizerHParams(optimizer="Adam"), 0.1)


def test_schedules_match_the_formulas():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  steps = np.array([1.0, 4.0, 99.0], np.float32)
  step = mtf.import_tf_tensor(mesh, tf.constant(steps), "s:3")
  outputs = {
      "pow": optimize.adafactor_decay_rate_pow(0.5, offset=1)(step),
      "adam": optimize.adafactor_decay_rate_adam(0.9)(step),
      "lr": optimize.adafactor_learning_rate_default()(step),
      "rms": optimize.reduce_rms(step),
  }
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
  lowering = mtf.Lowering(graph, {mesh: impl})
  got = {k: lowering.export_to_tf_tensor(v).numpy() for k, v in outputs.items()}
  np.testing.assert_allclose(got["pow"], 1.0 - steps ** -0.5, rtol=1e-6)
  np.testing.assert_allclose(
      got["adam"], [_adam_decay(0.9)(s) for s in steps], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got["lr"], [_default_lr(s) for s in steps])
  np.testing.assert_allclose(got["rms"], _rms(steps), rtol=1e-6)


@pytest.mark.parametrize("make_optimizer,want", [
    (lambda: optimize.SgdOptimizer(0.25), [0.25, 0.25]),
    (lambda: optimize.AdamWeightDecayOptimizer(lambda step: step + 1.0),
     [1.0, 2.0]),
    (lambda: optimize.AdafactorOptimizer(learning_rate=0.5), [0.5, 0.5]),
])
def test_learning_rate_is_a_scalar_summary(make_optimizer, want):
  """apply_grads records "learning_rate" (a schedule's value at the step)
  for the estimator's TensorBoard summaries."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "hidden:all")
  optimizer = make_optimizer()
  step_variable = tf.Variable(0, dtype=tf.int64, trainable=False)

  @tf.function(autograph=False)
  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    hidden = mtf.Dimension("hidden", HIDDEN)
    w = mtf.get_variable(mesh, "w", [hidden])
    loss = mtf.reduce_sum(mtf.square(w))
    (grad,) = mtf.gradients([loss], [w])
    updates = optimizer.apply_grads([grad], [w.operation])
    with mtf.ops.debug.collect_scalar_summaries() as summaries:
      lowering = mtf.Lowering(graph, {mesh: impl})
      for update in updates:
        lowering.lowered_operation(update)
    step_variable.assign_add(1)
    return summaries["learning_rate"]

  with global_step.global_step_scope(step_variable):
    got = [float(step()) for _ in want]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_momentum_optimizer_properties():
  optimizer = optimize.MomentumOptimizer(0.1, momentum=0.9)
  assert optimizer.lr == 0.1 and optimizer.momentum == 0.9


def test_reduce_rms_passes_reduce_mean_arguments():
  converter = mtf.test_utils.NumpyConverter()
  x_np = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
  x = converter.convert_np_array_to_mtf_tensor(x_np, ["a", "b"], tf.float32)
  rows = optimize.reduce_rms(x, reduced_dim=x.shape.dims[1])
  np.testing.assert_allclose(converter.convert_mtf_tensor_to_np_array(rows),
                             np.sqrt([12.5, 0.0]), rtol=1e-6)
  np.testing.assert_allclose(
      converter.convert_mtf_tensor_to_np_array(optimize.reduce_rms(x)),
      _rms(x_np), rtol=1e-6)


def test_product_learning_rate():
  def warmup(step, total_train_steps):
    return min(1.0, step / (0.1 * total_train_steps))

  assert optimize.product_learning_rate(5, 100, [0.5, warmup]) == 0.25
  # With an offset, the functions see the step and total less the offset.
  assert optimize.product_learning_rate(
      7, 102, [2.0, warmup], offset=2) == 1.0
  assert optimize.product_learning_rate(3, 10, []) == 1.0
  with pytest.raises(ValueError, match="factors"):
    optimize.product_learning_rate(3, 10, None)


def test_compute_lr_for_step_reads_tfs_global_step():
  step = tf.Variable(4, dtype=tf.int64, trainable=False)
  linear = lambda s, total: tf.cast(s, tf.float32) / total
  with global_step.global_step_scope(step):
    rates = optimize.compute_lr_for_step([None, [3.0, linear]], 0.25,
                                         train_steps=8)
    assert rates[0] == 0.25
    assert float(rates[1]) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="train_steps"):
      optimize.compute_lr_for_step([[linear]], 0.25)


def test_multi_lr_schedule_picks_the_first_matching_regex():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  enc = mtf.get_variable(mesh, "encoder/w", "a:4").operation
  dec = mtf.get_variable(mesh, "decoder/w", "a:4").operation
  optimizer = optimize.AdafactorWithMultiLRSchedule(
      ["coder", "encoder"], [[0.5], [0.25]], learning_rate=0.1,
      train_steps=10)
  with global_step.global_step_scope(
      tf.Variable(0, dtype=tf.int64, trainable=False)):
    assert float(optimizer._learning_rate_for(enc)) == 0.5
    assert float(optimizer._learning_rate_for(dec)) == 0.5
    other = optimize.AdamWithMultiLRSchedule(["^x"], [[0.5]],
                                             learning_rate=0.125)
    assert other._learning_rate_for(enc) == 0.125
  with pytest.raises(ValueError, match="2 variable_search regexes but 1"):
    optimize.AdamWithMultiLRSchedule(["a", "b"], [None], learning_rate=0.1)
