"""Product-key memory layers (Lample et al., https://arxiv.org/abs/1907.05242).

The original's `mesh_tensorflow.transformer.memory_layers`. A memory holds
n_keys ** 2 values, addressed by pairs of sub-keys: each query is split in
two halves, each half picks its `knn` best sub-keys out of `n_keys`, and the
best `knn` of the knn ** 2 sums of the two halves' scores pick the values.
So finding the best of n_keys ** 2 keys costs 2 * n_keys comparisons.
"""

import gin

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.memory_layers"


@gin.configurable(module=_GIN_MODULE)
class ProductKeyValueMemory(transformer.TransformerLayer):
  """A memory of n_keys ** 2 values read through product keys.

  Variables (under the layer's scope): "keys" [n_heads, product_key=2,
  n_keys, key=key_size//2], "values" [n_values, d_model] and the dense
  query projection "query" (with bias). Each head reads `knn` values,
  weighted by the softmax of their scores; the heads' readings are summed.
  """

  def __init__(self,
               key_size=gin.REQUIRED,
               n_keys=gin.REQUIRED,
               n_heads=gin.REQUIRED,
               knn=gin.REQUIRED):
    """Creates a ProductKeyValueMemory layer.

    Args:
      key_size: an integer >= 2, the size of a whole (product) key; each
        sub-key has key_size // 2 entries (an odd key_size rounds down,
        as in the original).
      n_keys: an integer, the number of sub-keys of each half; the memory
        holds n_keys ** 2 values.
      n_heads: an integer, the number of independent reads.
      knn: an integer <= n_keys, how many values each head reads.

    Raises:
      ValueError: a parameter is missing or out of range.
    """
    for name, value in (("key_size", key_size), ("n_keys", n_keys),
                        ("n_heads", n_heads), ("knn", knn)):
      if value is gin.REQUIRED:
        raise ValueError(f"ProductKeyValueMemory needs {name}.")
    if key_size < 2:
      raise ValueError("ProductKeyValueMemory: key_size must be at least 2 "
                       "(it is split into two sub-keys of key_size // 2), "
                       f"got {key_size}.")
    if not 0 < knn <= n_keys:
      raise ValueError(f"ProductKeyValueMemory: knn={knn} must be in "
                       f"[1, n_keys={n_keys}].")
    self.key_size = key_size
    self.n_keys = n_keys
    self.n_values = n_keys ** 2
    self.n_heads = n_heads
    self.knn = knn

  def call(self, context, x):
    """The memory's reading for every position of x [..., d_model]."""
    n_key_dim = mtf.Dimension("n_keys", self.n_keys)
    n_value_dim = mtf.Dimension("n_values", self.n_values)
    key_dim = mtf.Dimension("key", self.key_size // 2)
    value_dim = x.shape.dims[-1]
    head_dim = mtf.Dimension("n_heads", self.n_heads)
    product_dim = mtf.Dimension("product_key", 2)
    keys = mtf.get_variable(
        context.mesh, name="keys",
        shape=mtf.Shape([head_dim, product_dim, n_key_dim, key_dim]),
        dtype=context.variable_dtype)
    values = mtf.layers.embedding_weights(
        context.mesh, vocab_dim=n_value_dim, output_dim=value_dim,
        variable_dtype=context.variable_dtype, name="values")
    query = mtf.layers.dense(
        x, [head_dim, product_dim, key_dim], reduced_dims=[value_dim],
        activation=None, use_bias=True,
        variable_dtype=context.variable_dtype, name="query")
    # Layer norm (not the paper's batch norm) keeps the query's scale
    # steady without batch statistics.
    query = mtf.layers.layer_norm(query, key_dim)
    scores, indices = self.get_indices(keys, query)  # [..., n_heads, knn]
    knn_dim = scores.shape.dims[-1]
    weights = mtf.softmax(scores, reduced_dim=knn_dim)
    read = mtf.gather(values, indices, n_value_dim)  # [..., heads, knn, d]
    return mtf.einsum([read, weights], reduced_dims=[head_dim, knn_dim])

  def get_indices(self, keys, query):
    """The best `knn` product keys of each query head: (scores, indices).

    Args:
      keys: a Tensor [n_heads, product_key, n_keys, key].
      query: a Tensor [..., n_heads, product_key, key].

    Returns:
      scores, a Tensor [..., n_heads, knn] (sorted, best first), and
      indices, an int32 Tensor of the same shape: the values' ids
      first_half_key * n_keys + second_half_key.
    """
    product_dim, n_key_dim = keys.shape.dims[1], keys.shape.dims[2]
    key_dim = keys.shape.dims[3]
    score_shape = mtf.Shape(query.shape.dims[:-1] + [n_key_dim])
    half_scores = mtf.einsum([query, keys], output_shape=score_shape,
                             reduced_dims=[key_dim])
    knn_dim = mtf.Dimension("knn", self.knn)
    half_scores, half_indices = mtf.top_k(half_scores, n_key_dim, knn_dim)
    # Every pair (i, j) of the halves' best: score s1[i] + s2[j], value id
    # k1[i] * n_keys + k2[j].
    knn2_dim = mtf.Dimension("knn2", self.knn)
    knn_square_dim = mtf.Dimension("knn_square_dim", self.knn ** 2)
    scores1, scores2 = mtf.unstack(half_scores, product_dim)
    indices1, indices2 = mtf.unstack(half_indices, product_dim)
    pair_shape = mtf.Shape(scores1.shape.dims + [knn2_dim])
    pair_scores = mtf.add(scores1, mtf.rename_dimension(scores2, "knn", "knn2"),
                          output_shape=pair_shape)
    pair_indices = mtf.add(indices1 * self.n_keys,
                           mtf.rename_dimension(indices2, "knn", "knn2"),
                           output_shape=pair_shape)
    pair_scores = mtf.replace_dimensions(
        pair_scores, [knn_dim, knn2_dim], knn_square_dim)
    pair_indices = mtf.replace_dimensions(
        pair_indices, [knn_dim, knn2_dim], knn_square_dim)
    scores, best = mtf.top_k(pair_scores, knn_square_dim, knn_dim)
    return scores, mtf.gather(pair_indices, best, knn_square_dim)
