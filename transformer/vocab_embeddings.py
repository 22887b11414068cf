"""Ways to go from token ids to hidden states and from states to logits.

Each class has the interface of `transformer.VocabEmbedding`: it is built
with (mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim, ...),
creates its variables then, and offers `ids_to_embedding(ids, context)` and
`hidden_to_logits(hidden, context)`. A Unitransformer picks one through
`transformer.get_vocab_embedding_cls` (gin), as in the original.

Random initial values are seeded by each variable's scoped name, so every
layout starts from the same values (the original draws them unseeded).
"""


import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.randomness import tf_initializers
from mesh_tensorflow.transformer.layers import dense_layers
from mesh_tensorflow.transformer import transformer

_GIN_MODULE = "mesh_tensorflow.transformer.vocab_embeddings"


def _normal_initializer(name, stddev=1.0):
  """The original's tf.random_normal_initializer(stddev), seeded by the
  scoped name variable `name` will get (see mtf.randomness.tf_initializers)."""
  return tf_initializers.seeded("random_normal_initializer",
                                tf_initializers.name_seed(name), stream=3,
                                stddev=stddev)


def _leading_dims(ensemble_dim):
  """ensemble_dim (None, a Dimension or a list of them) as a list."""
  if ensemble_dim is None:
    return []
  if isinstance(ensemble_dim, mtf.Dimension):
    return [ensemble_dim]
  return list(ensemble_dim)


def _concat_along(xs, dim_name):
  """mtf.concat(xs, dim_name), also when a layout splits `dim_name`.

  mtf.concat cannot lower along a split dimension (nor could the
  original's), and the vocabulary is often split: concatenate along an
  unsplit stand-in name instead. Under a layout that splits `dim_name`
  the inputs are gathered (one all-gather of the logits) and the result
  split again locally; otherwise the renames cost nothing.
  """
  stand_in = f"_{dim_name}_whole"
  whole = mtf.concat([mtf.rename_dimension(x, dim_name, stand_in)
                      for x in xs], stand_in)
  return mtf.rename_dimension(whole, stand_in, dim_name)


def _variable(mesh, name, dims, variable_dtype, stddev=1.0, zeros=False):
  """An mtf variable of `dims`, N(0, stddev^2) (or zeros) initialised."""
  initializer = (tf.zeros_initializer() if zeros
                 else _normal_initializer(name, stddev))
  return mtf.get_variable(mesh, name, mtf.Shape(dims), dtype=variable_dtype,
                          initializer=initializer)


@gin.configurable(module=_GIN_MODULE)
class FactorizedVocabEmbedding:
  """A low-rank embedding table: [vocab, inner] x [inner, d_model] (ALBERT,
  https://arxiv.org/abs/1909.11942). Variables f"{name}1" and f"{name}2",
  both N(0, inner ** -0.5)."""

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name,
               ensemble_dim, inner_dimension_size=gin.REQUIRED):
    """Creates the two factors.

    Args:
      mesh: an mtf.Mesh.
      vocab_dim: the vocabulary Dimension.
      output_dim: the model Dimension.
      variable_dtype: an mtf.VariableDType.
      name: the base name of the variables.
      ensemble_dim: an optional Dimension (ensembles of models).
      inner_dimension_size: the size of the inner dimension "inner_vocab".
    """
    if inner_dimension_size is gin.REQUIRED:
      raise ValueError("FactorizedVocabEmbedding needs inner_dimension_size.")
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._inner_dim = mtf.Dimension("inner_vocab", inner_dimension_size)
    lead = _leading_dims(ensemble_dim)
    stddev = inner_dimension_size ** -0.25
    self._factor1 = _variable(mesh, f"{name}1",
                              lead + [vocab_dim, self._inner_dim],
                              variable_dtype, stddev)
    self._factor2 = _variable(mesh, f"{name}2",
                              lead + [self._inner_dim, output_dim],
                              variable_dtype, stddev)

  def ids_to_embedding(self, ids, context):
    del context
    inner = mtf.gather(self._factor1, ids, self._vocab_dim)
    return mtf.einsum([inner, self._factor2], reduced_dims=[self._inner_dim])

  def hidden_to_logits(self, hidden, context):
    del context
    hidden *= self._output_dim.size ** -0.5
    inner = mtf.einsum([hidden, self._factor2],
                       reduced_dims=[self._output_dim])
    return mtf.einsum([inner, self._factor1], reduced_dims=[self._inner_dim])


class Cluster:
  """The embedding of the contiguous ids [start_token_id, end_token_id).

  A cluster of `AdaptiveVocabEmbedding`, and the base of the adaptive
  softmax's clusters.
  """

  def __init__(self, embedding, start_token_id, end_token_id):
    self._embedding = embedding
    self._start_token_id = start_token_id
    self._end_token_id = end_token_id

  def ids_to_embedding(self, ids, context):
    """The embeddings of ids in the cluster, zero for the others."""
    local = ids - self._start_token_id
    inside = mtf.logical_and(
        mtf.greater_equal(local, 0),
        mtf.less(local, self._end_token_id - self._start_token_id))
    # Look up a valid id everywhere, then zero the ids of other clusters.
    local = mtf.where(inside, local, mtf.zeros_like(local))
    embedding = self._embedding.ids_to_embedding(local, context)
    return embedding * mtf.cast(inside, embedding.dtype)

  def hidden_to_logits(self, hidden, context):
    """The logits of the cluster's tokens (its own vocab dimension)."""
    return self._embedding.hidden_to_logits(hidden, context)


@gin.configurable(module=_GIN_MODULE)
class AdaptiveVocabEmbedding:
  """Clusters of contiguous token ids, each with its own embedding size
  (adaptive input representations, https://arxiv.org/abs/1809.10853), and
  a plain softmax over the whole vocabulary.

  A cluster whose embedding size is the model's is a
  `transformer.VocabEmbedding` named f"{name}_{i}"; the others are
  `FactorizedVocabEmbedding`s of that inner size.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name,
               ensemble_dim, clusters=gin.REQUIRED):
    """Creates one embedding per cluster.

    Args:
      mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim: as
        for FactorizedVocabEmbedding.
      clusters: a list of dicts {"token_count": n, "embedding_size": e}, in
        id order; the counts must sum to the vocabulary size.

    Raises:
      ValueError: the token counts do not sum to vocab_dim's size.
    """
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    counts = [cluster["token_count"] for cluster in clusters]
    if sum(counts) != vocab_dim.size:
      raise ValueError(
          f"AdaptiveVocabEmbedding: the cluster token counts {counts} do not "
          f"sum to the vocabulary size {vocab_dim.size}.")
    self._clusters = []
    start = 0
    for i, cluster in enumerate(clusters):
      count = cluster["token_count"]
      size = cluster["embedding_size"]
      cluster_vocab_dim = mtf.Dimension(vocab_dim.name, count)
      kwargs = dict(mesh=mesh, vocab_dim=cluster_vocab_dim,
                    output_dim=output_dim, variable_dtype=variable_dtype,
                    name=f"{name}_{i}", ensemble_dim=ensemble_dim)
      if size == output_dim.size:
        embedding = transformer.VocabEmbedding(**kwargs)
      else:
        embedding = FactorizedVocabEmbedding(inner_dimension_size=size,
                                             **kwargs)
      self._clusters.append(Cluster(embedding, start, start + count))
      start += count

  def ids_to_embedding(self, ids, context):
    # Each cluster embeds its own ids and gives zeros elsewhere.
    return mtf.add_n([cluster.ids_to_embedding(ids, context)
                      for cluster in self._clusters])

  def hidden_to_logits(self, hidden, context):
    # The clusters' logits, in id order, make the whole vocabulary's.
    return _concat_along([cluster.hidden_to_logits(hidden, context)
                          for cluster in self._clusters],
                         self._vocab_dim.name)


class _ContextMixture:
  """What MixtureOfSoftmaxes and Mixtape share: a plain table
  f"{name}_embedding_weights" for the ids, and logits of per-component
  context vectors tanh(hidden . f"{name}_context_weights"[c]) . table."""

  def _create_table(self, mesh, vocab_dim, output_dim, variable_dtype, name,
                    lead):
    """Sets the dimensions and creates the embedding table."""
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._copy_output_dim = mtf.Dimension(f"_{output_dim.name}_copy",
                                          output_dim.size)
    self._embedding_weights = _variable(
        mesh, f"{name}_embedding_weights", lead + [vocab_dim, output_dim],
        variable_dtype)

  def _create_context_weights(self, mesh, name, lead, components_dim,
                              variable_dtype):
    """Creates f"{name}_context_weights": [components, d_model, d_model]."""
    self._context_weights = _variable(
        mesh, f"{name}_context_weights",
        lead + [components_dim, self._copy_output_dim, self._output_dim],
        variable_dtype)

  def ids_to_embedding(self, ids, context):
    del context
    return mtf.gather(self._embedding_weights, ids, self._vocab_dim)

  def _component_logits(self, hidden, bias=None):
    """[..., components, vocab] logits of (scaled) hidden states; `bias`
    is added to the context vectors before the tanh."""
    contexts = mtf.einsum(
        [mtf.rename_dimension(hidden, self._output_dim.name,
                              self._copy_output_dim.name),
         self._context_weights], reduced_dims=[self._copy_output_dim])
    if bias is not None:
      contexts += bias
    return mtf.einsum([mtf.tanh(contexts), self._embedding_weights],
                      reduced_dims=[self._output_dim])


@gin.configurable(module=_GIN_MODULE)
class MixtureOfSoftmaxes(_ContextMixture):
  """Token probabilities as a weighted mixture of several softmaxes, which
  lifts the softmax's rank bottleneck (https://arxiv.org/abs/1711.03953).

  The embedding of ids is a plain table f"{name}_embedding_weights"; the
  logits are log(sum_c prior_c softmax_c) with
  prior = softmax(hidden . f"{name}_mixture_weights") and
  softmax_c over tanh(hidden . f"{name}_context_weights"[c]) . table.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name,
               ensemble_dim, num_softmaxes=gin.REQUIRED):
    """Creates the variables.

    Args:
      mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim: as
        for FactorizedVocabEmbedding.
      num_softmaxes: the number of mixture components.
    """
    if num_softmaxes is gin.REQUIRED:
      raise ValueError("MixtureOfSoftmaxes needs num_softmaxes.")
    self._components_dim = mtf.Dimension("softmax_components", num_softmaxes)
    lead = _leading_dims(ensemble_dim)
    self._create_table(mesh, vocab_dim, output_dim, variable_dtype, name, lead)
    self._mixture_weights = _variable(
        mesh, f"{name}_mixture_weights",
        lead + [self._components_dim, output_dim], variable_dtype)
    self._create_context_weights(mesh, name, lead, self._components_dim,
                                 variable_dtype)

  def hidden_to_logits(self, hidden, context):
    """Log-probabilities of the mixture (a softmax of them gives the
    mixture back). In low precision, use float32 activations."""
    del context
    hidden *= self._output_dim.size ** -0.5
    prior_logits = mtf.einsum([hidden, self._mixture_weights],
                              reduced_dims=[self._output_dim])
    component_logits = self._component_logits(hidden)
    log_prior = mtf.log_softmax(prior_logits,
                                reduced_dim=self._components_dim)
    log_components = mtf.log_softmax(component_logits,
                                     reduced_dim=self._vocab_dim)
    return mtf.reduce_logsumexp(log_prior + log_components,
                                reduced_dim=self._components_dim)


@gin.configurable(module=_GIN_MODULE)
class Mixtape(_ContextMixture):
  """Mixtape logits (https://papers.nips.cc/paper/9723): four context
  vectors per position, mixed per token by gates from a sigmoid tree;
  the rare tokens share one set of gates.

  The vocabulary is taken in decreasing frequency with `extra_ids`
  sentinels at its end; the sentinels are treated as frequent: the logits
  are computed with them first and then moved to the end.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name,
               ensemble_dim, extra_ids=0, dropout_rate=0.0,
               gate_embedding_size=gin.REQUIRED,
               frequent_token_fraction=0.1, noise_std_dev=0.0):
    """Creates the variables.

    Args:
      mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim: as
        for FactorizedVocabEmbedding.
      extra_ids: the number of sentinels at the end of the vocabulary.
      dropout_rate: dropout on the component logits and gate features in
        training (shared along the length dimension).
      gate_embedding_size: the size of the gates' hidden features.
      frequent_token_fraction: the fraction of the vocabulary (the first
        ids) that gets its own gates.
      noise_std_dev: Gaussian noise added to the gate logits in training.
    """
    if gate_embedding_size is gin.REQUIRED:
      raise ValueError("Mixtape needs gate_embedding_size.")
    self._extra_ids = extra_ids
    self._dropout_rate = dropout_rate
    self._noise_std_dev = noise_std_dev
    self._mesh = mesh
    self._frequent_vocab_dim = mtf.Dimension(
        vocab_dim.name, int(frequent_token_fraction * vocab_dim.size))
    self._rare_vocab_dim = mtf.Dimension(
        vocab_dim.name, vocab_dim.size - self._frequent_vocab_dim.size)
    self._pre_gates_dim = mtf.Dimension("gates", 3)
    self._gates_dim = mtf.Dimension("gates", 4)
    self._gate_embedding_dim = mtf.Dimension("gate_embedding",
                                             gate_embedding_size)
    lead = _leading_dims(ensemble_dim)
    self._create_table(mesh, vocab_dim, output_dim, variable_dtype, name, lead)
    self._create_context_weights(mesh, name, lead, self._gates_dim,
                                 variable_dtype)
    self._context_weights_bias = _variable(
        mesh, f"{name}_context_weights_bias",
        lead + [self._gates_dim, output_dim], variable_dtype, zeros=True)
    self._prior_weights = _variable(
        mesh, f"{name}_prior_weights",
        lead + [self._pre_gates_dim, self._gate_embedding_dim, output_dim],
        variable_dtype)
    self._prior_weights_bias = _variable(
        mesh, f"{name}_prior_weights_bias",
        lead + [self._pre_gates_dim, self._gate_embedding_dim],
        variable_dtype, zeros=True)
    self._prior_vocab_vector = _variable(
        mesh, f"{name}_prior_vocab_vector",
        lead + [self._frequent_vocab_dim, self._gate_embedding_dim],
        variable_dtype)
    self._prior_gates_vector = _variable(
        mesh, f"{name}_prior_gates_vector",
        lead + [self._pre_gates_dim, output_dim], variable_dtype)
    self._prior_bias = _variable(
        mesh, f"{name}_prior_bias",
        lead + [self._frequent_vocab_dim, self._pre_gates_dim],
        variable_dtype)

  def _sigmoid_tree(self, tensor):
    """Four gate probabilities from three sigmoids (a depth-2 tree)."""
    g0, g1, g2 = mtf.split(mtf.sigmoid(tensor), self._pre_gates_dim,
                           self._pre_gates_dim.size)
    return mtf.concat([g0 * g1, g0 * (1 - g1), (1 - g0) * g2,
                       (1 - g0) * (1 - g2)], self._gates_dim.name)

  def _dropout(self, tensor, context):
    return dense_layers.length_shared_dropout(tensor, context,
                                              self._dropout_rate)

  def _rearrange_sentinels(self, logits):
    """Moves the first `extra_ids` entries (the sentinels, treated as
    frequent) to the end of the vocabulary."""
    if not self._extra_ids:
      return logits
    # Split under an unsplit stand-in name (see _concat_along).
    stand_in = mtf.Dimension(f"_{self._vocab_dim.name}_whole",
                             self._vocab_dim.size)
    sentinels, others = mtf.split(
        mtf.rename_dimension(logits, self._vocab_dim.name, stand_in.name),
        stand_in, [self._extra_ids, self._vocab_dim.size - self._extra_ids])
    return mtf.rename_dimension(
        mtf.concat([others, sentinels], stand_in.name), stand_in.name,
        self._vocab_dim.name)

  def hidden_to_logits(self, hidden, context):
    """The logits [..., vocab] of hidden states [..., d_model]."""
    hidden *= self._output_dim.size ** -0.5
    component_logits = self._component_logits(hidden,
                                              self._context_weights_bias)
    component_logits = self._dropout(component_logits, context)

    prior_tanh = mtf.tanh(
        mtf.einsum([self._prior_weights, hidden],
                   reduced_dims=[self._output_dim]) +
        self._prior_weights_bias)
    prior_tanh = self._dropout(prior_tanh, context)
    shared_logits = mtf.einsum([self._prior_gates_vector, hidden],
                               reduced_dims=[self._output_dim])
    # [..., vocab, gates:3] for the frequent and the rare tokens, in one
    # dimension order so that they concatenate.
    order = shared_logits.shape - self._pre_gates_dim
    frequent_shape = mtf.Shape(order.dims + [self._frequent_vocab_dim,
                                             self._pre_gates_dim])
    frequent_logits = mtf.einsum(
        [self._prior_vocab_vector, prior_tanh], output_shape=frequent_shape,
        reduced_dims=[self._gate_embedding_dim])
    frequent_logits += shared_logits + self._prior_bias
    rare_shape = mtf.Shape(order.dims + [self._rare_vocab_dim,
                                         self._pre_gates_dim])
    rare_logits = mtf.broadcast(shared_logits, rare_shape)
    prior_logits = _concat_along([frequent_logits, rare_logits],
                                 self._vocab_dim.name)
    if context.train and self._noise_std_dev != 0.0:
      prior_logits += mtf.random_normal(self._mesh, prior_logits.shape,
                                        stddev=self._noise_std_dev)
    proportions = self._sigmoid_tree(prior_logits)
    logits = mtf.einsum([component_logits, proportions],
                        reduced_dims=[self._gates_dim])
    return self._rearrange_sentinels(logits)
