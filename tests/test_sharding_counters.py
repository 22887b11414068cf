"""What data-parallel sharding saves, counted by the lowering (exactly).

For the MLP stack on 8-processor meshes, with N the size of the mesh
dimension the batch is split over:
- every optimizer slot of a shardable variable takes 1/N of the bytes per
  processor, and every other slot the same;
- the reduce-scatter and all-gather traffic equals the all-reduce traffic it
  replaces (wire bytes, per mesh dimension);
- the optimizer's own work (elements its operations produce) is 1/N;
- with sharded parameters, every shardable variable takes 1/N at rest.
"""

import pytest

import mesh_tensorflow as mtf
from tests import sharding_training

MESHES = sharding_training.MESHES
# Graphs without data-parallel statistics: the element-wise optimizers.
ELEMENTWISE = ("sgd/", "momentum/", "adam/", "multi_lr/")
# Operations of the optimizer step that are not its arithmetic: renames
# into and out of the update shape (their traffic is counted as such),
# scalar constants, imports and summaries.
_NOT_UPDATE_WORK = ("ReshapeOperation", "Constant", "ImportOperation",
                    "ScalarSummaryOperation")


_LOWERED = {}


def _lower(make_loss, make_optimizers, mesh_shape, layout, sharding,
           with_update=True):
  """sharding_training.lower_only, once per configuration."""
  key = (make_loss, make_optimizers, mesh_shape, layout, sharding,
         with_update)
  if key not in _LOWERED:
    _LOWERED[key] = sharding_training.lower_only(
        make_loss, make_optimizers, mesh_shape, layout, sharding,
        with_update=with_update)
  return _LOWERED[key]


def _n(mesh_shape):
  return mtf.convert_to_shape(mesh_shape)[0].size  # "b" comes first.


def _elementwise_optimizers():
  return [(p, o) for p, o in sharding_training.make_optimizers()
          if p in ELEMENTWISE]


def _elementwise_mlp(mesh):
  """The MLP copies of the element-wise optimizers only."""
  return _partial_mlp(mesh, ELEMENTWISE)


def _partial_mlp(mesh, prefixes):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  st = sharding_training
  x = mtf.import_tf_tensor(mesh, tf.constant(st.X), [st.BATCH, st.D_IN])
  y = mtf.import_tf_tensor(mesh, tf.constant(st.Y), [st.BATCH, st.D_OUT])
  losses = []
  for prefix in prefixes:
    with tf.compat.v1.variable_scope(prefix.rstrip("/")):
      w1 = mtf.get_variable(mesh, "w1", [st.D_IN, st.D_FF])
      w2 = mtf.get_variable(mesh, "w2", [st.D_FF, st.D_OUT])
    h = mtf.relu(mtf.einsum([x, w1], [st.BATCH, st.D_FF]))
    out = mtf.einsum([h, w2], [st.BATCH, st.D_OUT])
    losses.append(mtf.reduce_mean(mtf.square(out - y)))
  return mtf.add_n(losses)


@pytest.mark.parametrize("mesh_shape,layout", MESHES)
def test_slots_of_shardable_variables_take_one_nth(mesh_shape, layout):
  st = sharding_training
  _, plain, _ = _lower(st.mlp_loss, st.make_optimizers, mesh_shape,
                              layout, "none")
  _, sharded, decisions = _lower(
      st.mlp_loss, st.make_optimizers, mesh_shape, layout, "update")
  assert set(plain) == set(sharded)
  n = _n(mesh_shape)
  slots = [name for name in plain if name not in _trainable_names(plain)]
  assert slots
  num_sharded = 0
  for name in slots:
    if decisions[name].startswith("sharded"):
      assert sharded[name] * n == plain[name], (name, decisions[name])
      num_sharded += 1
    else:
      assert sharded[name] == plain[name], (name, decisions[name])
      assert "kept whole" in decisions[name]
  # Every slot of w1 and w2 is sharded (d_in, d_out or d_ff divide N),
  # except, where "m" splits d_ff, Adafactor's factored slot of d_ff alone.
  unsharded = sorted(s for s in slots if ("/w1" in s or "/w2" in s) and
                     not decisions[s].startswith("sharded"))
  if "d_ff:m" in layout:
    assert unsharded == ["adafactor/w1_slot_vc", "adafactor/w2_slot_vc"]
  else:
    assert not unsharded
  assert num_sharded >= 16
  for name in _trainable_names(plain):
    assert sharded[name] == plain[name]


def _trainable_names(sizes):
  return [n for n in sizes
          if n.rsplit("/", 1)[-1] in ("w1", "w2", "b1", "gain")]


def _wire_bytes_by_axes(counters):
  totals = {}
  for key, value in counters.items():
    parts = key.split("/")
    if parts[0] == "comm" and parts[-1] == "wire_bytes":
      totals[parts[2]] = totals.get(parts[2], 0) + value
  return totals


@pytest.mark.parametrize("mesh_shape,layout", MESHES)
@pytest.mark.parametrize("sharding", ["update", "parameters"])
def test_reduce_scatter_and_all_gather_move_what_all_reduce_did(
    mesh_shape, layout, sharding):
  st = sharding_training
  plain = _lower(_elementwise_mlp, _elementwise_optimizers,
                        mesh_shape, layout, "none")[0]
  sharded = _lower(_elementwise_mlp, _elementwise_optimizers,
                          mesh_shape, layout, sharding)[0]
  assert _wire_bytes_by_axes(sharded) == _wire_bytes_by_axes(plain)
  # And the gradients' all-reduces over "b" became reduce-scatters.
  assert sharded.get("comm/reduce_scatter/b/calls", 0) == 8
  assert sharded["comm/allreduce/b/calls"] < plain["comm/allreduce/b/calls"]


def _update_elements(make_loss, make_optimizers, mesh_shape, layout,
                     sharding):
  """Elements the optimizer step's arithmetic produces on all processors:
  the step's counters minus those of the forward and backward pass."""
  st = sharding_training
  step = _lower(make_loss, make_optimizers, mesh_shape, layout,
                       sharding)[0]
  no_update = _lower(make_loss, make_optimizers, mesh_shape, layout,
                            sharding, with_update=False)[0]
  total = 0
  for key, value in step.items():
    parts = key.split("/")
    if (parts[0] == "compute" and parts[-1] == "output_elements" and
        parts[1] not in _NOT_UPDATE_WORK):
      total += value - no_update.get(key, 0)
  return total


@pytest.mark.parametrize("mesh_shape,layout", MESHES)
def test_update_work_is_one_nth(mesh_shape, layout):
  plain = _update_elements(_elementwise_mlp, _elementwise_optimizers,
                           mesh_shape, layout, "none")
  sharded = _update_elements(_elementwise_mlp, _elementwise_optimizers,
                             mesh_shape, layout, "update")
  assert plain > 0
  assert sharded * _n(mesh_shape) == plain


@pytest.mark.parametrize("mesh_shape,layout", MESHES)
def test_sharded_parameters_take_one_nth_at_rest(mesh_shape, layout):
  st = sharding_training
  _, plain, _ = _lower(_elementwise_mlp, _elementwise_optimizers,
                              mesh_shape, layout, "none")
  _, sharded, _ = _lower(_elementwise_mlp, _elementwise_optimizers,
                                mesh_shape, layout, "parameters")
  n = _n(mesh_shape)
  for name in plain:  # Every variable and slot here is shardable.
    assert sharded[name] * n == plain[name], name
