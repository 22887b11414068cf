"""Sharded weight updates and sharded parameters train to the same numbers.

An MLP stack is trained 20 steps by every optimizer of mtf.optimize at once
(each on its own copy of the weights), with and without data-parallel
sharding, under 8-processor meshes and both mesh implementations; every
weight and every optimizer slot must agree with unsharded training. The
tiny Transformer LM is checked the same way with Adafactor and Adam.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import sharding_training
from tests.transformer import model_testing

STEPS = 20
BATCH = mtf.Dimension("batch", 16)
D_IN = mtf.Dimension("d_in", 8)
D_FF = mtf.Dimension("d_ff", 32)
D_OUT = mtf.Dimension("d_out", 16)
# Odd-sized: no data-parallel mesh dimension divides it (kept whole).
GAIN = mtf.Dimension("gain", 3)

_RNG = np.random.RandomState(0)
X = _RNG.randn(BATCH.size, D_IN.size).astype(np.float32)
Y = _RNG.randn(BATCH.size, D_OUT.size).astype(np.float32)

MESHES = [
    pytest.param("b:8", "batch:b", id="batch8"),
    pytest.param("b:2;m:4", "batch:b;d_ff:m", id="b2m4"),
    pytest.param("b:4;m:2", "batch:b;d_ff:m", id="b4m2"),
]


def make_optimizers():
  """One optimizer per copy of the MLP, covering every kind and option."""
  opt = mtf.optimize
  return [
      ("sgd/", opt.SgdOptimizer(0.1)),
      ("momentum/", opt.MomentumOptimizer(0.05, 0.9)),
      ("adam/", opt.AdamWeightDecayOptimizer(
          0.01, weight_decay_rate=0.01, exclude_from_weight_decay=["b1"])),
      # Factored slots, parameter scale and clipping (global RMS), the
      # default learning-rate and decay schedules of the global step.
      ("adafactor/", opt.AdafactorOptimizer(min_dim_size_to_factor=8)),
      # Unfactored slots and momentum.
      ("adafactor_m/", opt.AdafactorOptimizer(
          factored=False, beta1=0.9, learning_rate=0.01,
          multiply_by_parameter_scale=False)),
      # A learning-rate schedule variant.
      ("multi_lr/", opt.AdamWithMultiLRSchedule(
          variable_search=["w2"], alt_lr_schedules=[[0.5, 0.01]],
          learning_rate=0.01)),
  ]


def mlp_loss(mesh):
  """The sum of the losses of one two-layer MLP per optimizer."""
  x = mtf.import_tf_tensor(mesh, tf.constant(X), [BATCH, D_IN])
  y = mtf.import_tf_tensor(mesh, tf.constant(Y), [BATCH, D_OUT])
  losses = []
  for prefix, _ in make_optimizers():
    with tf.compat.v1.variable_scope(prefix.rstrip("/")):
      w1 = mtf.get_variable(mesh, "w1", [D_IN, D_FF])
      b1 = mtf.get_variable(mesh, "b1", [D_FF],
                            initializer=tf.zeros_initializer())
      w2 = mtf.get_variable(mesh, "w2", [D_FF, D_OUT])
      gain = mtf.get_variable(mesh, "gain", [GAIN],
                              initializer=tf.ones_initializer())
    h = mtf.relu(mtf.einsum([x, w1], [BATCH, D_FF]) + b1)
    out = mtf.einsum([h, w2], [BATCH, D_OUT]) * mtf.reduce_mean(gain)
    losses.append(mtf.reduce_mean(mtf.square(out - y)))
  return mtf.add_n(losses)


_REFERENCE = {}


def _reference(mesh_shape, layout, impl_mode):
  key = (mesh_shape, layout, impl_mode)
  if key not in _REFERENCE:
    _REFERENCE[key] = sharding_training.train_variables(
        mlp_loss, make_optimizers, mesh_shape, layout, impl_mode, "none",
        STEPS)[0]
  return _REFERENCE[key]


def _mlp_cases():
  """Every mesh with both shardings on placement; on SIMD, sharded
  updates on every mesh and sharded parameters on one (the lowering is the
  same; the SIMD collectives are what differs)."""
  for mesh in MESHES:
    for sharding in ("update", "parameters"):
      yield pytest.param(*mesh.values, "function", sharding,
                         id=f"{mesh.id}-placement-{sharding}")
    yield pytest.param(*mesh.values, "simd", "update",
                       id=f"{mesh.id}-simd-update")
  yield pytest.param("b:2;m:4", "batch:b;d_ff:m", "simd", "parameters",
                     id="b2m4-simd-parameters")


@pytest.mark.parametrize("mesh_shape,layout,impl_mode,sharding",
                         list(_mlp_cases()))
def test_mlp_trains_to_the_same_weights_and_slots(mesh_shape, layout,
                                                  impl_mode, sharding):
  want = _reference(mesh_shape, layout, impl_mode)
  got, counters, slice_shapes = sharding_training.train_variables(
      mlp_loss, make_optimizers, mesh_shape, layout, impl_mode, sharding,
      STEPS)
  sharding_training.assert_same_values(
      got, want, f"{sharding} on {mesh_shape} ({layout}), {impl_mode}")
  # The check compares training, not two no-ops: slots start at zero.
  assert np.abs(got["adam/w1/adam_m"]).max() > 1e-4
  # And the sharding took effect: a slot of w1 is stored in shards over
  # the batch's mesh dimension "b".
  n = int(mesh_shape.split(";")[0].split(":")[1])  # The size of "b".
  unsharded = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout).slice_size(mtf.Shape([D_IN, D_FF]))
  assert np.prod(slice_shapes["adam/w1/adam_m"]) * n == unsharded


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("sharding", ["update", "parameters"])
def test_mlp_in_eager_and_graph_mode(mode, sharding):
  mesh_shape, layout = "b:4;m:2", "batch:b;d_ff:m"
  want = sharding_training.train_variables(
      mlp_loss, make_optimizers, mesh_shape, layout, mode, "none", 3)[0]
  got = sharding_training.train_variables(
      mlp_loss, make_optimizers, mesh_shape, layout, mode, sharding, 3)[0]
  sharding_training.assert_same_values(got, want, f"{sharding} in {mode}")


def _lm_optimizers():
  """Adafactor for one LM, Adam for the other (a larger epsilon keeps
  Adam's g / sqrt(v) from magnifying the round-off of near-zero gradient
  elements over 20 steps)."""
  opt = mtf.optimize
  return [("adafactor_lm/", opt.AdafactorOptimizer(min_dim_size_to_factor=8)),
          ("adam_lm/", opt.AdamWeightDecayOptimizer(0.005, epsilon=1e-3))]


def _lm_loss(mesh):
  return mtf.add_n([
      model_testing.lm_loss(model_testing.make_lm(name=prefix.rstrip("/")),
                            mesh)
      for prefix, _ in _lm_optimizers()])


_LM_2D = "batch:batch;d_ff:model;heads:model;vocab:model"


@pytest.mark.parametrize("mesh_shape,layout,sharding", [
    pytest.param("batch:8", "batch:batch", "update", id="batch8-update"),
    pytest.param("batch:2;model:4", _LM_2D, "update", id="b2m4-update"),
    pytest.param("batch:2;model:4", _LM_2D, "parameters",
                 id="b2m4-parameters"),
])
def test_tiny_transformer_trains_to_the_same_variables(mesh_shape, layout,
                                                       sharding):
  key = ("lm", mesh_shape, layout)
  if key not in _REFERENCE:
    _REFERENCE[key] = sharding_training.train_variables(
        _lm_loss, _lm_optimizers, mesh_shape, layout, "function", "none",
        STEPS)[0]
  got = sharding_training.train_variables(
      _lm_loss, _lm_optimizers, mesh_shape, layout, "function", sharding,
      STEPS)[0]
  sharding_training.assert_same_values(
      got, _REFERENCE[key], f"LM, {sharding} on {mesh_shape}")
