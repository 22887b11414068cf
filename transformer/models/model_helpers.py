"""Embeddings, ensemble reductions and input helpers of the Transformer models.

Names of the original's `mesh_tensorflow.transformer.transformer` module
(re-exported from it; gin registers them under it): `VocabEmbedding` and
`get_vocab_embedding_cls` (the token embedding and tied softmax),
`sinusoid_positional_embedding_weights`, the `reduce_ensemble_logits*`
functions, and `autoregressive_inputs`, `shift_targets`,
`delimited_lm_inputs_mask` (decoder inputs made from targets).
"""

import math

import gin
import mesh_tensorflow as mtf
import tensorflow as tf

_MODULE = "mesh_tensorflow.transformer.transformer"


def round_up_to_multiple(n, divisor):
  """The least multiple of `divisor` that is >= n."""
  return n + -n % divisor


@gin.configurable(module=_MODULE)
class VocabEmbedding:
  """Token ids to d_model vectors, and (tied softmax) vectors to logits.

  The variable is `mtf.layers.embedding_weights` [<ensemble>, vocab,
  d_model] under `name`. `hidden_to_logits` multiplies by its transpose,
  with the hidden state scaled by d_model^-0.5 (so that logits start small
  with the embedding's N(0, 1) initialization); with
  `scale_variable_like_classifier_weights` the variable starts at
  N(0, 1/d_model) instead and the embedding lookup is scaled by
  d_model^0.5, which gives the same products at initialization.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name,
               ensemble_dim, scale_variable_like_classifier_weights=False):
    """Creates the embedding variable.

    Args:
      mesh: a mtf.Mesh.
      vocab_dim: a mtf.Dimension (named "vocab").
      output_dim: a mtf.Dimension (d_model).
      variable_dtype: a mtf.VariableDType.
      name: the variable's name.
      ensemble_dim: an optional mtf.Dimension.
      scale_variable_like_classifier_weights: a boolean (see the class).
    """
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._scale_variable_like_classifier_weights = (
        scale_variable_like_classifier_weights)
    initializer = None
    if scale_variable_like_classifier_weights:
      initializer = tf.random_normal_initializer(
          stddev=output_dim.size ** -0.5)
    self._embedding_weights = mtf.layers.embedding_weights(
        mesh=mesh, vocab_dim=vocab_dim, output_dim=output_dim,
        variable_dtype=variable_dtype, name=name, ensemble_dim=ensemble_dim,
        initializer=initializer)

  def ids_to_embedding(self, ids, context):
    """The embedding of int32 `ids`: shape ids.shape + [d_model]."""
    del context
    ret = mtf.gather(self._embedding_weights, ids, self._vocab_dim)
    if self._scale_variable_like_classifier_weights:
      ret *= self._output_dim.size ** 0.5
    return ret

  def hidden_to_logits(self, hidden, context):
    """Logits over the vocabulary from hidden states [..., d_model]."""
    del context
    if not self._scale_variable_like_classifier_weights:
      hidden *= self._output_dim.size ** -0.5
    return mtf.einsum([hidden, self._embedding_weights],
                      reduced_dims=[self._output_dim])


@gin.configurable(module=_MODULE)
def get_vocab_embedding_cls(cls=VocabEmbedding):
  """The vocabulary embedding class the models use (a gin hook to swap it
  for one of `vocab_embeddings`)."""
  return cls


def sinusoid_positional_embedding_weights(mesh,
                                          max_length_dim,
                                          model_dim,
                                          dtype,
                                          min_timescale=1.0,
                                          max_timescale=1.0e4):
  """The fixed sinusoid position signal of "Attention Is All You Need".

  Row p is [sin(p * r_0), ..., sin(p * r_{k-1}), cos(p * r_0), ...,
  cos(p * r_{k-1})] with k = d_model / 2 and r_i = 1 / (min_timescale *
  (max_timescale / min_timescale)^(i / (k - 1))): sines then cosines, as
  tensor2tensor's get_timing_signal_1d (not interleaved as in the paper).

  Args:
    mesh: a mtf.Mesh.
    max_length_dim: a mtf.Dimension (positions).
    model_dim: a mtf.Dimension of even size.
    dtype: a tf.DType of the result.
    min_timescale: a float.
    max_timescale: a float.

  Returns:
    a Tensor [max_length_dim, model_dim].

  Raises:
    ValueError: model_dim has an odd size.
  """
  if model_dim.size % 2:
    raise ValueError("sinusoid_positional_embedding_weights: model_dim "
                     f"{model_dim} must have an even size.")
  num_timescales = model_dim.size // 2
  timescale_dim = mtf.Dimension(model_dim.name, num_timescales)
  log_timescale_increment = (
      math.log(float(max_timescale) / float(min_timescale)) /
      max(float(num_timescales) - 1, 1))
  inv_timescales = min_timescale * mtf.exp(
      mtf.range(mesh, timescale_dim, dtype=tf.float32) *
      -log_timescale_increment)
  position = mtf.range(mesh, max_length_dim, dtype=tf.float32)
  scaled_time = mtf.einsum([position, inv_timescales],
                           output_shape=[max_length_dim, timescale_dim])
  embeddings = mtf.concat([mtf.sin(scaled_time), mtf.cos(scaled_time)],
                          model_dim.name)
  return mtf.cast(embeddings, dtype)


@gin.configurable(module=_MODULE)
def reduce_ensemble_logits_select(logits, ensemble_dim, vocab_dim, model_id=0):
  """The logits of ensemble member `model_id` (modulo the ensemble size)."""
  del vocab_dim
  return mtf.gather(logits, model_id % ensemble_dim.size, ensemble_dim)


@gin.configurable(module=_MODULE)
def reduce_ensemble_logits_mean_prob(logits, ensemble_dim, vocab_dim):
  """Log of the members' mean probability (the arithmetic mixture)."""
  probs = mtf.softmax(logits, reduced_dim=vocab_dim)
  probs = mtf.reduce_mean(probs, reduced_dim=ensemble_dim)
  return mtf.log(mtf.maximum(probs, 1e-20))


@gin.configurable(module=_MODULE)
def reduce_ensemble_logits_mean_logit(logits, ensemble_dim, vocab_dim):
  """Mean of the members' logits (probabilities proportional to the
  geometric mean)."""
  del vocab_dim
  return mtf.reduce_mean(logits, reduced_dim=ensemble_dim)


@gin.configurable(module=_MODULE)
def reduce_ensemble_logits(logits, ensemble_dim, vocab_dim,
                           reduce_fn=reduce_ensemble_logits_mean_prob):
  """Logits without `ensemble_dim`, combined by `reduce_fn(logits,
  ensemble_dim, vocab_dim)` (gin-configurable, for decoding from an
  ensemble)."""
  return reduce_fn(logits, ensemble_dim, vocab_dim)


def autoregressive_inputs(targets, sequence_id=None):
  """Decoder inputs from targets: shifted right by one, 0 first.

  With `sequence_id` (packed examples) the first position of every
  example gets 0 too, instead of the previous example's last token.
  Negative target ids (tokens fed as inputs but not scored) become
  positive inputs.

  Args:
    targets: an int32 Tensor [<batch_dims>, length_dim].
    sequence_id: an optional int32 Tensor shaped like targets.

  Returns:
    an int32 Tensor shaped like targets.
  """
  length_dim = targets.shape.dims[-1]
  inputs = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  if sequence_id is not None:
    inputs *= mtf.to_int32(mtf.equal(
        sequence_id,
        mtf.shift(sequence_id, offset=1, dim=length_dim, wrap=False)))
  return mtf.abs(inputs)


@gin.configurable(module=_MODULE)
def shift_targets(targets, bos_id=0, eos_id=1):
  """Decoder inputs from targets (deprecated: see autoregressive_inputs).

  Shifts right by one; a shifted `eos_id` (the end of the previous packed
  example) becomes 0, and with a nonzero `bos_id` every 0 in front of a
  real token becomes `bos_id`.
  """
  length_dim = targets.shape.dims[-1]
  shifted = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  shifted *= mtf.to_int32(mtf.not_equal(shifted, eos_id))
  if bos_id:
    shifted += mtf.to_int32(mtf.logical_and(
        mtf.equal(shifted, 0), mtf.not_equal(targets, 0))) * bos_id
  return shifted


def delimited_lm_inputs_mask(ids, eos_id=1):
  """True on the "inputs" part of packed [inputs, EOS, targets, EOS] ids.

  For a language model trained on input/target pairs, each example is
  [<inputs>, EOS, <targets>, EOS]; the inputs are the positions before
  which an even number of EOS tokens has occurred.

  Args:
    ids: an int32 Tensor [..., length_dim].
    eos_id: an integer.

  Returns:
    a boolean Tensor shaped like ids.
  """
  length_dim = ids.shape.dims[-1]
  eos_before = mtf.cumsum(mtf.to_int32(mtf.equal(ids, eos_id)), length_dim,
                          exclusive=True)
  return mtf.equal(mtf.mod(eos_before, 2), 0)
