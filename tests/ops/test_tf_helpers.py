"""parallel, transpose_list_of_lists and the reduction / pooling lookups."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf


def test_parallel_calls_once_per_device_with_the_ith_arguments():
  devices = ["/cpu:0", "/cpu:1", "/cpu:2"]
  results = mtf.parallel(devices, lambda a, b=0: tf.identity(a + b),
                         [1, 2, 3], b=[10, 20, 30])
  assert [int(r) for r in results] == [11, 22, 33]
  assert [r.device.endswith(f"CPU:{i}") for i, r in enumerate(results)] == [
      True] * 3


def test_parallel_rejects_bad_arguments():
  with pytest.raises(ValueError, match="devices must be a list"):
    mtf.parallel("/cpu:0", tf.identity, [1])
  with pytest.raises(ValueError, match="one entry per device"):
    mtf.parallel(["/cpu:0", "/cpu:1"], tf.identity, [1])


def test_transpose_list_of_lists():
  assert mtf.transpose_list_of_lists([[1, 2, 3], [4, 5, 6]]) == [
      [1, 4], [2, 5], [3, 6]]
  with pytest.raises(ValueError, match="empty"):
    mtf.transpose_list_of_lists([])


def test_reduction_fns():
  a, b = tf.constant([1.0, 5.0]), tf.constant([3.0, 2.0])
  np.testing.assert_allclose(mtf.binary_reduction_fn("SUM")(a, b), [4, 7])
  np.testing.assert_allclose(mtf.binary_reduction_fn("MAX")(a, b), [3, 5])
  np.testing.assert_allclose(mtf.binary_reduction_fn("MIN")(a, b), [1, 2])
  assert float(mtf.reduction_fn("SUM")(a)) == 6.0
  assert float(mtf.reduction_fn("MAX")(a)) == 5.0
  assert float(mtf.reduction_fn("MIN")(a, 0)) == 1.0
  for fn in (mtf.binary_reduction_fn, mtf.reduction_fn):
    with pytest.raises(ValueError, match="'MEAN'"):
      fn("MEAN")


@pytest.mark.parametrize("pool_fn_string", ["AVG_2D", "MAX_2D", "AVG_3D",
                                            "MAX_3D"])
def test_pool_fn_keeps_leading_batch_dimensions(pool_fn_string):
  rank = int(pool_fn_string[-2])
  rng = np.random.default_rng(0)
  x = rng.normal(size=[2, 3] + [4] * rank + [5]).astype(np.float32)
  y = mtf.pool_fn(pool_fn_string)(tf.constant(x), 2, 2, "VALID")
  assert y.shape.as_list() == [2, 3] + [2] * rank + [5]
  windows = x.reshape([2, 3] + [2, 2] * rank + [5])
  axes = tuple(3 + 2 * i for i in range(rank))
  expected = (windows.mean(axis=axes) if pool_fn_string.startswith("AVG")
              else windows.max(axis=axes))
  np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="pool_fn_string"):
    mtf.pool_fn("SUM_2D")
