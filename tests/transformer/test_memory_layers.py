"""ProductKeyValueMemory: top-k against NumPy, layouts, training."""

import gin
import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import memory_layers
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = 16
X = np.random.RandomState(0).normal(size=[8, 4, D_MODEL]).astype(np.float32)
LOSS_WEIGHTS = np.random.RandomState(1).normal(
    size=[8, 4, D_MODEL]).astype(np.float32)


def _layer():
  return memory_layers.ProductKeyValueMemory(
      key_size=8, n_keys=5, n_heads=2, knn=3)


def _builder(layer):
  """build(mesh) for run_program: the layer on X, a weighted-sum loss."""

  def build(mesh):
    model = layer_testing.ModelStub(D_MODEL)
    context = layer_testing.make_context(mesh, model, BATCH, LENGTH)
    x = mtf_testing.import_array(mesh, X, [BATCH, LENGTH, model.model_dim])
    y = layer.call(context, x)
    w = mtf_testing.import_array(mesh, LOSS_WEIGHTS,
                                 [BATCH, LENGTH, model.model_dim])
    wrt = {"x": x}
    wrt.update({v.name: v.outputs[0]
                for v in mesh.graph.trainable_variables})
    return {"y": y}, mtf.reduce_sum(y * w), wrt

  return build


def _np_layer(got, n_keys, knn):
  """The layer in NumPy from the variables run_program fetched."""
  x = X.astype(np.float64)
  q = np.einsum("bld,dhpk->blhpk", x, got["query/kernel"]) + got["query/bias"]
  q = (q - q.mean(-1, keepdims=True)) / np.sqrt(q.var(-1, keepdims=True)
                                                + 1e-6)
  q = q * got["layer_prepostprocess/layer_norm/layer_norm_scale"] + got[
      "layer_prepostprocess/layer_norm/layer_norm_bias"]
  half = np.einsum("blhpk,hpnk->blhpn", q, got["keys"])  # [b, l, h, 2, n]
  # Brute force over all n_keys ** 2 product keys.
  full = half[..., 0, :, None] + half[..., 1, None, :]  # [b, l, h, n, n]
  full = full.reshape(full.shape[:3] + (n_keys * n_keys,))
  order = np.argsort(-full, axis=-1, kind="stable")[..., :knn]
  scores = np.take_along_axis(full, order, -1)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  read = got["values"][order]  # [b, l, h, knn, d]
  return np.einsum("blhkd,blhk->bld", read, weights), order


def test_matches_brute_force_numpy():
  got, graph = mtf_testing.run_program("all:1", "", "function",
                                       _builder(_layer()))
  names = sorted(v.name for v in graph.trainable_variables)
  assert "keys" in names and "values" in names and "query/kernel" in names
  assert got["keys"].shape == (2, 2, 5, 4)
  assert got["values"].shape == (25, D_MODEL)
  want, _ = _np_layer(got, n_keys=5, knn=3)
  np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


def test_get_indices_finds_the_best_product_keys():
  """A tiny hand-made case: the best of all 4 * 4 sums, id k1 * 4 + k2."""
  layer = memory_layers.ProductKeyValueMemory(
      key_size=2, n_keys=4, n_heads=1, knn=2)
  heads = mtf.Dimension("n_heads", 1)
  product = mtf.Dimension("product_key", 2)
  n_keys = mtf.Dimension("n_keys", 4)
  key = mtf.Dimension("key", 1)
  keys = np.array([[[[1.], [4.], [-2.], [3.]],
                    [[0.5], [-1.], [2.], [1.5]]]], np.float32)
  query = np.array([[[[1.], [1.]]], [[[-1.], [2.]]]], np.float32)
  batch = mtf.Dimension("batch", 2)

  def build(mesh):
    k = mtf_testing.import_array(mesh, keys, [heads, product, n_keys, key])
    q = mtf_testing.import_array(mesh, query, [batch, heads, product, key])
    scores, indices = layer.get_indices(k, q)
    return {"scores": scores, "indices": indices}, None, {}

  got, _ = mtf_testing.run_program("all:1", "", "function", build,
                                   fetch_variables=False)
  # Row 0: halves [1, 4, -2, 3] and [.5, -1, 2, 1.5]: best sums 4+2 (id
  # 1*4+2=6) and 4+1.5 (id 7). Row 1: [-1, -4, 2, -3] and [1, -2, 4, 3]:
  # 2+4 (id 10), 2+3 (id 11).
  np.testing.assert_allclose(got["scores"], [[[6., 5.5]], [[6., 5.]]])
  np.testing.assert_array_equal(got["indices"], [[[6, 7]], [[10, 11]]])


@pytest.mark.parametrize("mode,layouts", [
    ("function", layer_testing.LAYOUTS),
    ("graph", layer_testing.LAYOUTS[3:])])  # 2-D only: the time budget.
def test_same_under_layouts(mode, layouts):
  layer_testing.assert_same_under_layouts(_builder(_layer()), layouts=layouts,
                                          modes=(mode,))


def test_odd_key_size_rounds_the_sub_keys_down():
  """As the original: each sub-key has key_size // 2 entries."""
  layer = memory_layers.ProductKeyValueMemory(
      key_size=9, n_keys=5, n_heads=2, knn=3)
  got, _ = mtf_testing.run_program("all:1", "", "function", _builder(layer))
  assert got["keys"].shape == (2, 2, 5, 4)
  want, _ = _np_layer(got, n_keys=5, knn=3)
  np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


def test_rejects_a_key_size_without_sub_keys():
  with pytest.raises(ValueError, match="key_size"):
    memory_layers.ProductKeyValueMemory(key_size=1, n_keys=4, n_heads=1,
                                        knn=2)


def test_language_model_with_memory_trains():
  stack = transformer.make_layer_stack(
      [model_testing.tiny_layers.TinySelfAttention,
       [memory_layers.ProductKeyValueMemory,
        {"key_size": 8, "n_keys": 4, "n_heads": 2, "knn": 2}]],
      num_layers=1)
  model = transformer.Unitransformer(
      stack, d_model=model_testing.D, input_vocab_size=model_testing.V,
      output_vocab_size=model_testing.V, autoregressive=True,
      max_length=model_testing.L, vocab_divisor=model_testing.VOCAB_DIVISOR)
  losses = model_testing.train_losses(
      lambda mesh: model_testing.lm_loss(model, mesh), "batch:2",
      "batch:batch", "function", 6,
      lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.1))
  assert np.all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.3, losses


def test_gin_configures_the_original_name():
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config("""
        memory_layers.ProductKeyValueMemory.key_size = 8
        memory_layers.ProductKeyValueMemory.n_keys = 4
        memory_layers.ProductKeyValueMemory.n_heads = 2
        memory_layers.ProductKeyValueMemory.knn = 2
    """)
    try:
      layer = gin.get_configurable(
          "mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory")()
    finally:
      gin.clear_config()
  assert (layer.n_values, layer.knn) == (16, 2)
