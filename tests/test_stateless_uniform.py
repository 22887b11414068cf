"""Tests of float32 uniform slices of TensorFlow's stateless Philox stream:
every way of computing a slice gives the bits of TF's fused kernel."""

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.randomness import stateless_random
from mesh_tensorflow.randomness import stateless_uniform

FULL = [6, 10, 7]  # 420 elements: runs start at every offset modulo 4.


def _tf_kernel(seed, shape):
  key = tf.constant([np.uint64(seed & 0xFFFFFFFFFFFFFFFF)], tf.uint64)
  return np.asarray(tf.raw_ops.StatelessRandomUniformV2(
      shape=shape, key=key, counter=tf.constant([0, 0], tf.uint64), alg=1,
      dtype=tf.float32))


@pytest.fixture(params=["whole", "split"])
def path(request, monkeypatch):
  """"whole": slices of the whole tensor; "split": the full tensor counts as
  large, so slices are runs of the kernel or per-element Philox words."""
  if request.param == "split":
    monkeypatch.setattr(stateless_uniform, "WHOLE_TENSOR_ELEMENTS", 0)
  return request.param


@pytest.mark.parametrize("seed", [0, 5, 2**40 + 3, -7])
def test_full_tensor_is_tensorflows_stream(seed, path):
  del path
  got = stateless_random.uniform(seed, FULL, FULL, [0, 0, 0])
  np.testing.assert_array_equal(np.asarray(got), _tf_kernel(seed, FULL))


@pytest.mark.parametrize("slice_shape", [
    [1, 10, 7],  # one run (rows)
    [1, 1, 7],  # one run inside a row, starting anywhere modulo 4
    [3, 10, 7],  # one run of several rows
    [6, 5, 7],  # not a run: Philox words
    [2, 10, 1],
])
def test_slices_are_blocks_with_static_and_dynamic_begins(slice_shape, path):
  del path
  full = _tf_kernel(3, FULL) * 4.0 - 1.0
  starts = [range(0, f, s) for f, s in zip(FULL, slice_shape)]

  @tf.function(input_signature=[tf.TensorSpec([3], tf.int32)])
  def dynamic(begin):  # offsets as tensors, as in an SPMD program
    return stateless_random.uniform(3, FULL, slice_shape,
                                    [begin[0], begin[1], begin[2]],
                                    minval=-1.0, maxval=3.0)

  for a in starts[0]:
    for b in starts[1]:
      for c in list(starts[2])[:3]:
        expected = full[a:a + slice_shape[0], b:b + slice_shape[1],
                        c:c + slice_shape[2]]
        static = stateless_random.uniform(3, FULL, slice_shape, [a, b, c],
                                          minval=-1.0, maxval=3.0)
        np.testing.assert_allclose(np.asarray(static), expected, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(dynamic(tf.constant([a, b, c]))),
                                   expected, rtol=1e-6)


def test_paths_are_chosen_by_size_and_shape():
  small, large = [4, 4], [1024, 1024]
  assert stateless_uniform.is_fused(small, [2, 1])
  assert stateless_uniform.is_fused(large, [256, 1024])
  assert stateless_uniform.is_fused([1, 1024, 1024], [1, 4, 1024])
  assert not stateless_uniform.is_fused(large, [1024, 256])


def test_fused_slices_are_few_ops():
  """A dropout-sized mask is a handful of ops, not Philox's ~60."""
  def count_ops(dtype):
    graph = tf.Graph()
    with graph.as_default():
      stateless_random.uniform(1, [32, 4, 128], [16, 1, 128], [16, 2, 0],
                               dtype=dtype)
    return len(graph.get_operations())

  assert count_ops(tf.float32) * 3 < count_ops(tf.float64)


def test_bad_seed_and_begin():
  with pytest.raises(TypeError, match="seed"):
    stateless_random.uniform(tf.constant(1.5), [2], [2], [0])
  with pytest.raises(ValueError, match="one entry per tensor axis"):
    stateless_random.uniform(1, [2, 2], [2], [0])
