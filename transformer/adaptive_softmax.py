"""The adaptive softmax (https://arxiv.org/abs/1609.04309), with adaptive
input sizes per cluster (https://arxiv.org/abs/1809.10853).

The original's `mesh_tensorflow.transformer.adaptive_softmax`. The
vocabulary is cut into contiguous clusters. The first ("head") cluster's
softmax covers its own tokens plus one entry per other ("tail") cluster, so

  p(v | h) = p(v | h)                      for v in the head,
  p(v | h) = p(cluster c | h) p(v | c, h)  for v in tail cluster c.

In training the loss is computed cluster by cluster, each on the positions
whose target lies in it, so no softmax over the whole vocabulary is formed;
otherwise `hidden_to_logits` returns the log-probabilities of every token.
Use it with `Unitransformer.shared_embedding_and_softmax_weights = True`
and, to train, `Unitransformer.loss_fn = @adaptive_softmax_loss_fn`.
"""

import math

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.estimator import mode_keys
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import vocab_embeddings

_GIN_MODULE = "mesh_tensorflow.transformer.adaptive_softmax"
# Where hidden_to_logits leaves the embedding for adaptive_softmax_loss_fn
# when no Bitransformer shares it through context.shared_params.
_CACHE_KEY = "adaptive_softmax_vocab_embedding"
# Stand-in names of dimensions that must not be split while the logits of
# the clusters are sliced and concatenated, or a sequence shortened.
_WHOLE_VOCAB = "_adaptive_softmax_vocab"
_CLUSTER_LENGTH = "_adaptive_softmax_cluster_length"


class _Cluster(vocab_embeddings.Cluster):
  """The tokens [start_token_id, end_token_id) and their embedding."""

  def __init__(self, embedding, start_token_id, end_token_id,
               length_projection_factor, vocab_dim):
    """Creates a cluster.

    Args:
      embedding: a VocabEmbedding or FactorizedVocabEmbedding over
        `vocab_dim`.
      start_token_id: the first token id of the cluster.
      end_token_id: one past its last token id.
      length_projection_factor: a float in (0, 1]: in training the cluster's
        loss is computed over ceil(factor * length) positions per example
        (later tokens of the cluster beyond those are left out).
      vocab_dim: the cluster's vocabulary Dimension (named like the model's).
    """
    super().__init__(embedding, start_token_id, end_token_id)
    self._length_projection_factor = length_projection_factor
    self._vocab_dim = vocab_dim

  @property
  def end_token_id(self):
    return self._end_token_id

  @property
  def length_projection_factor(self):
    return self._length_projection_factor

  def get_cluster_mask(self, targets):
    """True where a target token belongs to the cluster."""
    return mtf.logical_and(mtf.greater_equal(targets, self._start_token_id),
                           mtf.less(targets, self._end_token_id))

  def project_to_cluster_length(self, mask, targets, hidden):
    """The cluster's targets and hidden states, packed to the front of a
    shorter "length" (ceil(factor * length) positions; zeros after)."""
    length_dim = targets.shape.get_dim_by_name("length")
    short_dim = mtf.Dimension(_CLUSTER_LENGTH, int(math.ceil(
        self._length_projection_factor * length_dim.size)))
    # Position k of the short sequence takes the k-th target in the cluster.
    rank = mtf.cumsum(mtf.cast(mask, tf.int32), length_dim) - 1
    projection = mtf.cast(mask, hidden.dtype) * mtf.one_hot(
        rank, short_dim, dtype=hidden.dtype)
    short_targets = mtf.cast(mtf.einsum(
        [projection, mtf.cast(targets, hidden.dtype)],
        reduced_dims=[length_dim]), targets.dtype)
    short_hidden = mtf.einsum([projection, hidden], reduced_dims=[length_dim])
    return (mtf.rename_dimension(short_targets, _CLUSTER_LENGTH, "length"),
            mtf.rename_dimension(short_hidden, _CLUSTER_LENGTH, "length"))

  def compute_loss(self, decoder, hidden, targets, context):
    """Cross entropy of the cluster's softmax at the nonzero targets (ids
    outside the cluster must have been zeroed), over the model's loss
    denominator."""
    logits = self._embedding.hidden_to_logits(hidden, context)
    soft_targets = mtf.one_hot(targets - self._start_token_id,
                               self._vocab_dim, dtype=context.activation_dtype)
    loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, soft_targets, self._vocab_dim, z_loss=decoder.z_loss)
    weights = mtf.layers.weights_nonzero(targets,
                                         dtype=context.activation_dtype)
    return (mtf.reduce_sum(loss * weights) /
            decoder.loss_denominator(targets, context.num_microbatches))

  def compute_log_softmax(self, hidden, context):
    """log p(token | cluster, hidden) over the cluster's vocabulary."""
    logits = self._embedding.hidden_to_logits(hidden, context)
    return mtf.log_softmax(logits, reduced_dim=self._vocab_dim)


@gin.configurable(module=_GIN_MODULE)
class AdaptiveSoftmaxVocabEmbedding:
  """A vocabulary embedding computing an adaptive softmax.

  Each cluster has its own embedding: a `transformer.VocabEmbedding`
  (variable f"{name}_{i}") when its embedding size is d_model, else a
  `vocab_embeddings.FactorizedVocabEmbedding` of that inner size. The head
  cluster's vocabulary has one extra entry per tail cluster. Label
  smoothing and loss_on_targets_only do not apply to its training loss
  (as in the original).
  """

  def __init__(self,
               mesh,
               vocab_dim,
               output_dim,
               variable_dtype,
               name,
               ensemble_dim,
               clusters=gin.REQUIRED):
    """Creates the clusters' embeddings.

    Args:
      mesh: a mtf.Mesh.
      vocab_dim: the vocabulary Dimension.
      output_dim: the model Dimension (d_model).
      variable_dtype: a mtf.VariableDType.
      name: the base name of the variables.
      ensemble_dim: an optional ensemble Dimension.
      clusters: a list of dicts, the first one the head cluster, each with
        "token_count" (the cluster's number of tokens, taken in order from
        id 0), optionally "embedding_size" (default d_model) and
        "length_projection_factor" (in (0, 1], default 1; see _Cluster).

    Raises:
      ValueError: the token counts do not sum to the vocabulary size, or a
        length_projection_factor is out of (0, 1].
    """
    if clusters is gin.REQUIRED or not clusters:
      raise ValueError("AdaptiveSoftmaxVocabEmbedding needs clusters.")
    self._mesh = mesh
    self._variable_dtype = variable_dtype
    self._name = name
    self._ensemble_dim = ensemble_dim
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._num_clusters = len(clusters)
    token_counts = [cluster["token_count"] for cluster in clusters]
    if sum(token_counts) != vocab_dim.size:
      raise ValueError(
          f"AdaptiveSoftmaxVocabEmbedding {name!r}: the cluster token counts "
          f"{token_counts} sum to {sum(token_counts)}, not to the vocabulary "
          f"size {vocab_dim}.")
    self._tail_clusters = []
    start_token_id = 0
    for i, spec in enumerate(clusters):
      cluster = self._create_cluster(spec, i, start_token_id)
      if i == 0:
        self._head_cluster = cluster
      else:
        self._tail_clusters.append(cluster)
      start_token_id += spec["token_count"]

  def _create_cluster(self, spec, index, start_token_id):
    """The _Cluster of one entry of `clusters`."""
    token_count = spec["token_count"]
    embedding_size = spec.get("embedding_size", self._output_dim.size)
    factor = spec.get("length_projection_factor", 1)
    if not 0 < factor <= 1:
      raise ValueError(
          f"AdaptiveSoftmaxVocabEmbedding {self._name!r}: cluster {index} "
          f"has length_projection_factor {factor}; it must be in (0, 1].")
    size = token_count + (self._num_clusters - 1 if index == 0 else 0)
    vocab_dim = mtf.Dimension(self._vocab_dim.name, size)
    name = f"{self._name}_{index}"
    if embedding_size == self._output_dim.size:
      embedding = transformer.VocabEmbedding(
          mesh=self._mesh, vocab_dim=vocab_dim, output_dim=self._output_dim,
          variable_dtype=self._variable_dtype, name=name,
          ensemble_dim=self._ensemble_dim)
    else:
      embedding = vocab_embeddings.FactorizedVocabEmbedding(
          mesh=self._mesh, vocab_dim=vocab_dim, output_dim=self._output_dim,
          variable_dtype=self._variable_dtype, name=name,
          ensemble_dim=self._ensemble_dim,
          inner_dimension_size=embedding_size)
    return _Cluster(embedding, start_token_id, start_token_id + token_count,
                    factor, vocab_dim)

  def ids_to_embedding(self, ids, context):
    """The sum of the clusters' embeddings (each zero outside its ids)."""
    return mtf.add_n([cluster.ids_to_embedding(ids, context)
                      for cluster in [self._head_cluster] +
                      self._tail_clusters])

  def hidden_to_logits(self, hidden, context):
    """Log-probabilities over the vocabulary; in training `hidden` itself.

    Training never forms the full softmax: `adaptive_softmax_loss_fn`
    computes the loss from the hidden states this returns then.

    Args:
      hidden: the last layer's output [..., d_model].
      context: a transformer.Context.

    Returns:
      `hidden` in training, else a Tensor [..., vocab] of log p(v | hidden).
    """
    if context.mode == mode_keys.ModeKeys.TRAIN:
      context.cache[_CACHE_KEY] = self
      return hidden
    return self._hidden_to_logits(hidden, context)

  def _hidden_to_logits(self, hidden, context):
    """log p(v | hidden) for every token v (see the module docstring)."""
    head_size = self._head_cluster.end_token_id
    head = self._whole(self._head_cluster.compute_log_softmax(hidden,
                                                              context))
    parts = [mtf.slice(head, 0, head_size, _WHOLE_VOCAB)]
    for i, cluster in enumerate(self._tail_clusters):
      cluster_log_prob = mtf.reduce_sum(
          mtf.slice(head, head_size + i, 1, _WHOLE_VOCAB),
          reduced_dim=mtf.Dimension(_WHOLE_VOCAB, 1))
      parts.append(cluster_log_prob + self._whole(
          cluster.compute_log_softmax(hidden, context)))
    logits = mtf.concat(parts, _WHOLE_VOCAB)
    return mtf.rename_dimension(logits, _WHOLE_VOCAB, self._vocab_dim.name)

  def _whole(self, x):
    """x with its vocabulary dimension renamed to an unsplit stand-in, so
    that it can be sliced and concatenated under any layout."""
    return mtf.rename_dimension(x, self._vocab_dim.name, _WHOLE_VOCAB)

  def compute_loss(self, decoder, hidden, targets, context):
    """The training loss, cluster by cluster (no full softmax).

    Each tail cluster's loss covers the positions whose target is in it;
    the head cluster's covers all positions, a tail target counting as its
    cluster's entry of the head vocabulary.

    Args:
      decoder: the Unitransformer (z_loss and loss_denominator).
      hidden: the last layer's output [..., length, d_model].
      targets: int32 target ids [..., length].
      context: a transformer.Context.

    Returns:
      a scalar Tensor.
    """
    losses = []
    tail_targets = []
    for i, cluster in enumerate(self._tail_clusters):
      mask = cluster.get_cluster_mask(targets)
      tail_targets.append(
          (self._head_cluster.end_token_id + i) * mtf.cast(mask, targets.dtype))
      if cluster.length_projection_factor == 1:
        cluster_targets = mtf.where(mask, targets, 0)
        cluster_hidden = mtf.where(mask, hidden, 0.0)
      else:
        cluster_targets, cluster_hidden = cluster.project_to_cluster_length(
            mask, targets, hidden)
      losses.append(cluster.compute_loss(decoder, cluster_hidden,
                                         cluster_targets, context))
    if tail_targets:
      tail_node = mtf.add_n(tail_targets)
      head_targets = mtf.where(mtf.not_equal(tail_node, 0), tail_node,
                               targets)
    else:
      head_targets = targets
    losses.append(self._head_cluster.compute_loss(decoder, hidden,
                                                  head_targets, context))
    return mtf.add_n(losses)


@gin.configurable(module=_GIN_MODULE)
def adaptive_softmax_loss_fn(decoder, context, logits, targets,
                             output_vocab_dim):
  """A Unitransformer loss_fn for an AdaptiveSoftmaxVocabEmbedding.

  Given hidden states (`logits` without `output_vocab_dim`, as
  `AdaptiveSoftmaxVocabEmbedding.hidden_to_logits` returns them in
  training), the shared embedding computes the adaptive loss, in any mode
  as in the original. Given log-probabilities over the vocabulary (what
  the embedding returns outside training), the loss is their mean cross
  entropy (the original took them for hidden states too, which failed).

  Args:
    decoder: a Unitransformer.
    context: a transformer.Context.
    logits: hidden states [..., d_model] or log-probabilities
      [..., output_vocab_dim].
    targets: int32 target ids.
    output_vocab_dim: the vocabulary Dimension; may be None with hidden
      states.

  Returns:
    a scalar Tensor.

  Raises:
    ValueError: hidden states, but no AdaptiveSoftmaxVocabEmbedding made
      them.
  """
  if output_vocab_dim is not None and output_vocab_dim in logits.shape.dims:
    soft_targets = mtf.one_hot(targets, output_vocab_dim,
                               dtype=context.activation_dtype)
    loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, soft_targets, output_vocab_dim)
    weights = mtf.layers.weights_nonzero(targets,
                                         dtype=context.activation_dtype)
    return (mtf.reduce_sum(loss * weights) /
            decoder.loss_denominator(targets, context.num_microbatches))
  vocab_embedding = context.shared_params.get("embedding")
  if not isinstance(vocab_embedding, AdaptiveSoftmaxVocabEmbedding):
    vocab_embedding = context.cache.get(_CACHE_KEY)
  if vocab_embedding is None:
    raise ValueError(
        "adaptive_softmax_loss_fn: the model's logits did not come from an "
        "AdaptiveSoftmaxVocabEmbedding; set get_vocab_embedding_cls.cls to "
        "it and Unitransformer.shared_embedding_and_softmax_weights = True.")
  return vocab_embedding.compute_loss(decoder, hidden=logits, targets=targets,
                                      context=context)
