"""Variants of dot-product attention: hybrid and synthetic attention.

Both take the arguments of `attention.attention` (named dimensions) and are
re-exported from `mesh_tensorflow.transformer.attention`.
"""

import mesh_tensorflow as mtf
import tensorflow as tf


def hybrid_attention(q,
                     k,
                     v,
                     context,
                     memory_length_dim,
                     key_dim,
                     value_dim,
                     bias=None,
                     dropout_rate=0.0,
                     dropout_broadcast_dims=None,
                     extra_logit=None):
  """Attention mixing ordinary and doubly-normalised attention weights.

  The ordinary weights are the softmax of the logits over memory positions.
  The doubly-normalised weights first normalise the logits over the query
  positions (a log-softmax over "length", which must have the memory
  length's size: self-attention) and then take the softmax over memory
  positions, so that every memory position is attended to about equally.
  A learned scalar "doubly_coeff" (clipped to [0, 1], initially 0.5) mixes
  the two. Dimensions as in `attention.attention`.

  Args:
    q: a Tensor.
    k: a Tensor.
    v: a Tensor.
    context: the transformer.Context (for the mesh and variable dtype).
    memory_length_dim: a Dimension.
    key_dim: a Dimension.
    value_dim: a Dimension.
    bias: an optional Tensor added to the logits.
    dropout_rate: a float.
    dropout_broadcast_dims: an optional list of Dimensions.
    extra_logit: an optional scalar or Tensor.

  Returns:
    a Tensor with the shape q.shape - key_dim + value_dim.
  """
  logits = mtf.layers.us_einsum([q, k], reduced_dims=[key_dim])
  if bias is not None:
    logits += bias
  query_length_dim = mtf.Dimension("length", memory_length_dim.size)
  if query_length_dim not in logits.shape.dims:
    raise mtf.ShapeError(
        f"hybrid_attention: the logits {logits.shape} need a query length "
        f"dimension {query_length_dim} as long as {memory_length_dim}")
  doubly_coeff = mtf.get_variable(
      context.mesh, "doubly_coeff", [],
      initializer=tf.constant_initializer(0.5),
      dtype=context.variable_dtype)
  doubly_coeff = mtf.maximum(mtf.minimum(doubly_coeff, 1.), 0.)
  upper_weights = mtf.softmax(
      logits, memory_length_dim, extra_logit=extra_logit)
  lower_log_weights = mtf.log_softmax(
      logits, query_length_dim, extra_logit=extra_logit)
  doubly_weights = mtf.softmax(
      lower_log_weights, memory_length_dim, extra_logit=extra_logit)
  weights = doubly_coeff * doubly_weights + (1. - doubly_coeff) * upper_weights
  if dropout_rate != 0.0:
    weights = mtf.dropout(
        weights, keep_prob=1.0 - dropout_rate,
        noise_shape=weights.shape - (dropout_broadcast_dims or []))
  return mtf.einsum([weights, v], q.shape - key_dim + value_dim)


_SYNTHESIZE_MODES = ("random", "factorized", "dense_minus", "random_plus",
                     "random_plus_alpha", "dense_plus", "dense_plus_alpha")


def synthetic_attention(q,
                        k,
                        v,
                        memory_length_dim,
                        key_dim,
                        value_dim,
                        bias=None,
                        dropout_rate=0.0,
                        dropout_broadcast_dims=None,
                        extra_logit=None,
                        synthesize=True,
                        synthesize_mode="random_plus_alpha",
                        factorized_dim=16,
                        max_length=512,
                        context=None):
  """Synthesizer attention (Tay et al., https://arxiv.org/abs/2005.00743).

  The logits come, instead of or besides the query-key dot product, from
  learned parameters:
  - "random": a learned [length, heads, memory_length] table "R" (q is the
    layer input: no query projection);
  - "factorized": R as the product of two [tmp, heads, max_length]
    tables "R1" (over query positions) and "R2" (over memory positions),
    tmp of size `factorized_dim`: a rank-`factorized_dim` R;
  - "dense_minus": a dense layer "pi" from relu(q) to memory positions;
  - "random_plus" / "dense_plus": the dot-product logits plus the random
    table / the dense logits; the "_alpha" forms mix them with a learned
    sigmoid(alpha) instead of adding.
  Tables are made for `max_length` positions and sliced to the lengths used;
  in "incremental" mode the row of the current position is gathered.

  Args:
    q: a Tensor (the layer input in "random" and "factorized" modes).
    k: a Tensor.
    v: a Tensor with a "heads" dimension.
    memory_length_dim: a Dimension.
    key_dim: a Dimension.
    value_dim: a Dimension.
    bias: an optional Tensor added to the logits.
    dropout_rate: a float.
    dropout_broadcast_dims: an optional list of Dimensions.
    extra_logit: an optional scalar or Tensor.
    synthesize: a boolean; False is ordinary dot-product attention.
    synthesize_mode: one of the modes above.
    factorized_dim: an integer (the "factorized" mode's inner size).
    max_length: an integer, the longest sequence the tables cover.
    context: the transformer.Context (mesh, variable dtype, mode, position).

  Returns:
    a Tensor: q.shape - key_dim + value_dim, or for the modes without a
    query projection q's dimensions but the last + heads + value_dim.
  """
  if synthesize and synthesize_mode not in _SYNTHESIZE_MODES:
    raise ValueError(
        f"synthetic_attention: unknown synthesize_mode {synthesize_mode!r}; "
        f"expected one of {_SYNTHESIZE_MODES}")
  num_heads = None
  if not synthesize:
    logits = mtf.einsum([q, k], reduced_dims=[key_dim])
  else:
    num_heads = v.shape.get_dim_by_name("heads")
    length_name = "length"

    def table(name, first_dim):
      shape = mtf.Shape([first_dim, mtf.Dimension("heads", num_heads.size),
                         mtf.Dimension("memory_length", max_length)])
      return mtf.get_variable(context.mesh, name, shape,
                              dtype=context.variable_dtype)

    def fit_to_lengths(r):
      r = mtf.slice(r, 0, memory_length_dim.size, memory_length_dim.name)
      if context.mode == "incremental":
        if r.shape.has_dim_name(length_name):
          r = mtf.gather(r, context.position,
                         r.shape.get_dim_by_name(length_name))
        return r
      length_dim = q.shape.get_dim_by_name(length_name)
      return mtf.slice(r, 0, length_dim.size, length_name)

    def dense_logits():
      return mtf.layers.dense(
          mtf.relu(q), [mtf.Dimension("memory_length", max_length)],
          use_bias=False, name="pi", reduced_dims=[key_dim],
          variable_dtype=context.variable_dtype)

    def mix(dot_logits, synthetic):
      if "alpha" not in synthesize_mode:
        return dot_logits + synthetic
      alpha = mtf.get_variable(
          context.mesh, "alpha", mtf.Shape([mtf.Dimension("alpha", 1)]),
          initializer=tf.zeros_initializer(), dtype=context.variable_dtype)
      alpha = mtf.sigmoid(alpha)
      return (1 - alpha) * dot_logits + alpha * synthetic

    if synthesize_mode == "random":
      logits = fit_to_lengths(
          table("R", mtf.Dimension(length_name, max_length)))
    elif synthesize_mode == "factorized":
      tmp = mtf.Dimension("tmp", factorized_dim)
      # R1 indexes query positions: its last axis is renamed "length".
      # (The original multiplied two tables of memory positions, which
      # makes every query row alike.) Variable shapes are the original's.
      r1 = mtf.rename_dimension(table("R1", tmp), "memory_length",
                                length_name)
      r = mtf.einsum(
          [r1, table("R2", tmp)],
          mtf.Shape([mtf.Dimension(length_name, max_length),
                     mtf.Dimension("heads", num_heads.size),
                     mtf.Dimension("memory_length", max_length)]))
      logits = fit_to_lengths(r)
    elif synthesize_mode == "dense_minus":
      logits = fit_to_lengths(dense_logits())
    elif synthesize_mode.startswith("random_plus"):
      logits = mix(mtf.einsum([q, k], reduced_dims=[key_dim]),
                   fit_to_lengths(
                       table("R", mtf.Dimension(length_name, max_length))))
    else:  # dense_plus, dense_plus_alpha
      logits = mix(mtf.einsum([q, k], reduced_dims=[key_dim]),
                   fit_to_lengths(dense_logits()))
  if bias is not None:
    logits += bias
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  if dropout_rate != 0.0:
    weights = mtf.dropout(
        weights, keep_prob=1.0 - dropout_rate,
        noise_shape=weights.shape - (dropout_broadcast_dims or []))
  if synthesize and "plus" not in synthesize_mode:
    if synthesize_mode == "dense_minus":
      outputs_shape = mtf.Shape(q.shape.dims[:-1] + [value_dim])
    else:
      outputs_shape = mtf.Shape(q.shape.dims[:-1] + [num_heads, value_dim])
  else:
    outputs_shape = q.shape - [key_dim] + value_dim
  return mtf.einsum([weights, v], outputs_shape)
