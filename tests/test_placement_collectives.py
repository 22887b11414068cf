"""The original's ring collectives on lists of per-device tensors, vs NumPy.

`mtf.placement_mesh_impl.allreduce_ring` (and `_single_shard`),
`allconcat_ring`, `alltoall_ring`, `alltoall_pointtwise` and
`reduce_scatter_ring` (ours) take one tensor per group member and the
member's device; member i's result must be on devices[i]. Groups of 1, 2,
3, 5 and 8 members (odd sizes take the other branches of the chain and
ring arithmetic).
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

placement = mtf.placement_mesh_impl
SIZES = [1, 2, 3, 5, 8]
NP_REDUCE = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}


def _devices(n):
  cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
  return [cpus[i % len(cpus)] for i in range(n)]


def _inputs(n, shape, dtype=np.float32):
  rng = np.random.RandomState(n)
  values = [(100 * i + rng.uniform(0, 10, size=shape)).astype(dtype)
            for i in range(n)]
  tensors = []
  for value, device in zip(values, _devices(n)):
    with tf.device(device):
      tensors.append(tf.constant(value))
  return values, tensors


def _check_placed(results, devices):
  assert len(results) == len(devices)
  for result, device in zip(results, devices):
    assert (tf.DeviceSpec.from_string(result.device).device_index ==
            tf.DeviceSpec.from_string(device).device_index)


@pytest.mark.parametrize("reduction", sorted(NP_REDUCE))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fn,shape", [
    (placement.allreduce_ring_single_shard, [3, 4]),
    (placement.allreduce_ring, [3, 4]),  # Small: one chain.
    (placement.allreduce_ring, [6, 256]),  # Sharded when n divides 1536.
])
def test_allreduce(fn, shape, n, reduction):
  values, xs = _inputs(n, shape)
  devices = _devices(n)
  ys = fn(xs, devices, reduction)
  _check_placed(ys, devices)
  want = NP_REDUCE[reduction](np.stack(values), axis=0)
  first = np.asarray(ys[0])
  for i, y in enumerate(ys):
    np.testing.assert_allclose(y, want, rtol=1e-6, err_msg=f"member {i}")
    # Replicas of one value agree exactly.
    np.testing.assert_array_equal(y, first, err_msg=f"member {i}")


def test_allreduce_default_is_sum_and_works_in_a_function():
  values, xs = _inputs(4, [2, 3])
  devices = _devices(4)
  ys = tf.function(lambda: placement.allreduce_ring(xs, devices))()
  for y in ys:
    np.testing.assert_allclose(y, np.sum(values, axis=0), rtol=1e-6)


def test_allreduce_bool_and_errors():
  devices = _devices(3)
  xs = [tf.constant([True, False, False]), tf.constant([False, False, True]),
        tf.constant([False, False, True])]
  assert [list(np.asarray(y)) for y in placement.allreduce_ring(
      xs, devices, "MAX")] == [[True, False, True]] * 3
  assert [list(np.asarray(y)) for y in placement.allreduce_ring(
      xs, devices, "MIN")] == [[False, False, False]] * 3
  with pytest.raises(ValueError, match="'SUM' for dtype bool"):
    placement.allreduce_ring(xs, devices, "SUM")
  with pytest.raises(ValueError, match="'PROD'"):
    placement.allreduce_ring_single_shard(xs, devices, "PROD")
  with pytest.raises(ValueError, match="3 tensors but 2 devices"):
    placement.allreduce_ring(xs, devices[:2])


@pytest.mark.parametrize("concat_axis", [0, 1])
@pytest.mark.parametrize("n", SIZES)
def test_allconcat_ring(n, concat_axis):
  values, xs = _inputs(n, [2, 3])
  devices = _devices(n)
  ys = placement.allconcat_ring(xs, devices, concat_axis)
  _check_placed(ys, devices)
  want = np.concatenate(values, axis=concat_axis)
  for i, y in enumerate(ys):
    np.testing.assert_array_equal(y, want, err_msg=f"member {i}")


@pytest.mark.parametrize("split_axis,concat_axis", [(0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fn", [placement.alltoall_ring,
                                placement.alltoall_pointtwise])
def test_alltoall(fn, n, split_axis, concat_axis):
  shape = [2 * n, 3 * n]
  values, xs = _inputs(n, shape)
  devices = _devices(n)
  ys = fn(xs, devices, split_axis, concat_axis)
  _check_placed(ys, devices)
  for k, y in enumerate(ys):
    want = np.concatenate([np.split(v, n, axis=split_axis)[k]
                           for v in values], axis=concat_axis)
    np.testing.assert_array_equal(y, want, err_msg=f"member {k}")


@pytest.mark.parametrize("split_axis", [0, 1])
@pytest.mark.parametrize("reduction", sorted(NP_REDUCE))
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_ring(n, reduction, split_axis):
  values, tensors = _inputs(n, [2 * 15, 2 * 60] if n != 8 else [16, 8])
  devices = _devices(n)
  results = placement.reduce_scatter_ring(tensors, devices, split_axis,
                                          reduction)
  _check_placed(results, devices)
  want = np.split(NP_REDUCE[reduction](np.stack(values), axis=0), n,
                  axis=split_axis)
  for k, result in enumerate(results):
    np.testing.assert_allclose(result.numpy(), want[k], rtol=1e-6)
