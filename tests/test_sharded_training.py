"""Sharded weight updates and sharded parameters train to the same numbers.

An MLP stack is trained 20 steps by every optimizer of mtf.optimize at once
(each on its own copy of the weights), with and without data-parallel
sharding, under 8-processor meshes and both mesh implementations; every
weight and every optimizer slot must agree with unsharded training. The
tiny Transformer LM is checked the same way with Adafactor and Adam.

The unsharded reference of a mesh and layout is trained once per pytest
run (the `shared_result` fixture), on PlacementMeshImpl in tf.function:
the sharded runs of both mesh implementations must agree with it, so a
SIMD run is checked against the other implementation's numbers too.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import sharding_training
from tests.transformer import model_testing

STEPS = 20
MESHES = sharding_training.MESHES
make_optimizers = sharding_training.make_optimizers
mlp_loss = sharding_training.mlp_loss
D_IN, D_FF = sharding_training.D_IN, sharding_training.D_FF


def _reference(shared_result, make_loss, optimizers, mesh_shape, layout):
  """The unsharded training of `make_loss` on the mesh and layout."""
  name = getattr(make_loss, "__name__", "loss").strip("_")
  key = f"sharded_training_{name}_{mesh_shape}_{layout}".replace(";", "-")
  return shared_result(key, lambda: sharding_training.train_variables(
      make_loss, optimizers, mesh_shape, layout, "function", "none",
      STEPS)[0])


def _mlp_cases():
  """The 1-D and a 2-D mesh with both shardings on placement; on SIMD,
  both shardings on the 2-D mesh only (the lowering is the same; the SIMD
  collectives are what differs, and on b:2;m:4 they run over groups of a
  mesh axis, of which the 1-D mesh's one group of 8 is the simplest
  case). The other 2-D mesh, b:4;m:2, takes the same code path with other
  shard sizes: test_mlp_in_eager_and_graph_mode runs it with both
  shardings."""
  for mesh in MESHES:
    if mesh.id == "b4m2":
      continue
    for sharding in ("update", "parameters"):
      yield pytest.param(*mesh.values, "function", sharding,
                         id=f"{mesh.id}-placement-{sharding}")
  for sharding in ("update", "parameters"):
    yield pytest.param("b:2;m:4", "batch:b;d_ff:m", "simd", sharding,
                       id=f"b2m4-simd-{sharding}")


@pytest.mark.parametrize("mesh_shape,layout,impl_mode,sharding",
                         list(_mlp_cases()))
def test_mlp_trains_to_the_same_weights_and_slots(mesh_shape, layout,
                                                  impl_mode, sharding,
                                                  shared_result):
  want = _reference(shared_result, mlp_loss, make_optimizers, mesh_shape,
                    layout)
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


@pytest.mark.parametrize("mode,sharding", [("eager", "update"),
                                           ("graph", "parameters")])
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


# The 2-D mesh only: the MLP checks the 1-D batch mesh with every optimizer,
# and the LM's variables are sharded by the same code on either mesh.
@pytest.mark.parametrize("mesh_shape,layout,sharding", [
    pytest.param("batch:2;model:4", _LM_2D, "update", id="b2m4-update"),
    pytest.param("batch:2;model:4", _LM_2D, "parameters",
                 id="b2m4-parameters"),
])
def test_tiny_transformer_trains_to_the_same_variables(mesh_shape, layout,
                                                       sharding,
                                                       shared_result):
  want = _reference(shared_result, _lm_loss, _lm_optimizers, mesh_shape,
                    layout)
  got = sharding_training.train_variables(
      _lm_loss, _lm_optimizers, mesh_shape, layout, "function", sharding,
      STEPS)[0]
  sharding_training.assert_same_values(
      got, want, f"LM, {sharding} on {mesh_shape}")
