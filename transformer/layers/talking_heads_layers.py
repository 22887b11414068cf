"""Talking-heads and general-bilinear attention (the original's layers).

Talking-heads attention (Shazeer et al. 2020, arXiv:2003.02436) adds learned
linear projections across the heads to the attention logits (before the
softmax) and to the attention weights (after it). General-bilinear attention
is multi-head attention whose keys and values are the memory itself (d_kv =
d_model), so that only the query and output projections remain.

Both are re-exported by `transformer_layers` and registered with gin under
that module's name, as in the original.
"""

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layers import seeded_initializers
from mesh_tensorflow.transformer.layers import self_attention_layers

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"
_DYNAMIC_PROJECTIONS = ("x2l", "m2l", "x2w", "m2w")


def _dropout_weights(context, weights, rate):
  """Attention dropout, broadcast over the query length (as the original)."""
  if not context.train or not rate:
    return weights
  return mtf.dropout(weights, is_training=True, rate=rate,
                     noise_shape=weights.shape - [context.length_dim])


def _update_incremental_state(context, old, new, memory_length):
  """`old` with its `memory_length` slot at context.position set to `new`."""
  one_hot = mtf.one_hot(context.position, memory_length,
                        dtype=context.activation_dtype)
  return old * (1.0 - one_hot) + new * one_hot


def _only_memory_length(m):
  """The "memory_length" dimension of an encoder output."""
  dims = [d for d in m.shape.dims if d.name == "memory_length"]
  if len(dims) != 1:
    raise mtf.ShapeError(
        f"encoder-decoder attention: the encoder output {m.shape} must have "
        "exactly one 'memory_length' dimension.")
  return dims[0]


def _check_memory_input_dim(layer, context, m):
  if m.shape.dims[-1] != context.model.model_dim:
    raise NotImplementedError(
        f"{type(layer).__name__}: the encoder output's last dimension "
        f"{m.shape.dims[-1]} must be the decoder's model dimension "
        f"{context.model.model_dim} (different model dimensions in encoder "
        "and decoder are not supported, as in the original).")


@gin.configurable(module=_GIN_MODULE)
class TalkingHeadsSelfAttention(self_attention_layers.SelfAttention):
  """Talking-heads self-attention.

  Three lists of "heads" dimensions say where the projections are:
  `key_heads_dims` index the queries, keys and their dot products,
  `softmax_heads_dims` the logits and their softmax, `value_heads_dims` the
  weights and values. Between two lists that differ, a learned projection
  sums out the dimensions only the first has and creates those only the
  second has; dimensions in both are shared (not mixed). With three equal
  lists this is plain multi-head attention.

  To split the layer over a mesh, put one dimension (say ("heads", 8)) in all
  three lists and lay it out over the mesh: projections never mix it, so no
  communication is needed.

  `dynamic_projections` (any of "x2l", "m2l", "x2w", "m2w") add projections
  computed from the query antecedent x or the memory antecedent m, to the
  logits ("l") or the weights ("w"): the projection matrix at each position
  is the static one plus a dense function of x (or m) there.

  Variables: "q", "k", "v", "y" (dense kernels), "logits", "weights" (the
  projections, when the lists differ) and "<logits|weights>_dynamic_<i>".
  """

  def __init__(self,  # pylint: disable=super-init-not-called
               key_heads_dims=(("heads", 12),),
               softmax_heads_dims=(("heads", 12),),
               value_heads_dims=(("heads", 12),),
               key_size=64,
               value_size=64,
               dropout_rate=0.0,
               relative_attention_type=None,
               relative_attention_num_buckets=32,
               dynamic_projections=None,
               dynamic_projections_init_scale=1e-2):
    """Creates a TalkingHeadsSelfAttention layer.

    Args:
      key_heads_dims: a list of mtf.Dimension or (name, size) pairs.
      softmax_heads_dims: a list of mtf.Dimension or (name, size) pairs.
      value_heads_dims: a list of mtf.Dimension or (name, size) pairs.
      key_size: an integer, the size of queries and keys per head ("d_k").
      value_size: an integer, the size of values per head ("d_v").
      dropout_rate: a float, dropout on the attention weights in training.
      relative_attention_type: None, "bias" or "bias_shared" (see
        SelfAttention).
      relative_attention_num_buckets: an integer.
      dynamic_projections: an optional subset of ["x2l", "m2l", "x2w",
        "m2w"].
      dynamic_projections_init_scale: a float, the variance scale of the
        dynamic projections' initializers (large values hinder learning).
    """
    self.key_heads_dims = [mtf.convert_to_dimension(d) for d in key_heads_dims]
    self.softmax_heads_dims = [
        mtf.convert_to_dimension(d) for d in softmax_heads_dims]
    self.value_heads_dims = [
        mtf.convert_to_dimension(d) for d in value_heads_dims]
    self.key_dim = mtf.Dimension("d_k", key_size)
    self.value_dim = mtf.Dimension("d_v", value_size)
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.dynamic_projections = list(dynamic_projections or [])
    for name in self.dynamic_projections:
      if name not in _DYNAMIC_PROJECTIONS:
        raise ValueError(
            f"TalkingHeadsSelfAttention: unknown dynamic projection {name!r}; "
            f"expected some of {list(_DYNAMIC_PROJECTIONS)}.")
    self.dynamic_projections_init_scale = dynamic_projections_init_scale

  def _dense(self, context, x, reduced_dims, new_dims, name,
             kernel_initializer=None, extra_expert_dims=()):
    return mtf.layers.dense(
        x, reduced_dims=reduced_dims, new_dims=new_dims,
        use_bias=False, activation=None,
        variable_dtype=context.variable_dtype, name=name,
        expert_dims=context.model.ensemble_dims + list(extra_expert_dims),
        kernel_initializer=kernel_initializer)

  def compute_q(self, context, x):
    # The initializer's variance is divided by d_k: this takes the place of
    # scaling the logits by rsqrt(d_k).
    init_scale = 1.0
    if not mtf.layers.unit_scaling_convention():
      init_scale /= self.key_dim.size
    return self._dense(
        context, x, [context.model.model_dim],
        self.key_heads_dims + [self.key_dim], "q",
        kernel_initializer=mtf.layers.VarianceScalingInitializer(init_scale))

  def compute_k(self, context, x):
    return self._dense(context, x, [context.model.model_dim],
                       self.key_heads_dims + [self.key_dim], "k")

  def compute_v(self, context, x):
    return self._dense(context, x, [context.model.model_dim],
                       self.value_heads_dims + [self.value_dim], "v")

  def compute_y(self, context, u):
    return self._dense(context, u, self.value_heads_dims + [self.value_dim],
                       [context.model.model_dim], "y")

  def call(self, context, x, losses=None):
    """Applies the layer to `x` ([batch, length, d_model])."""
    memory_length = self.memory_length(context)
    q = self.compute_q(context, x)
    if context.mode == "incremental":
      m = x
    else:
      m = mtf.replace_dimensions(x, context.length_dim, memory_length)
    k = self.compute_k(context, m)
    v = self.compute_v(context, m)
    if context.mode == "incremental":
      old_k, old_v = context.get_states(2)
      k = _update_incremental_state(context, old_k, k, memory_length)
      v = _update_incremental_state(context, old_v, v, memory_length)
      memory_position = mtf.range(context.mesh, memory_length, tf.int32)
    else:
      memory_position = self.rename_length_to_memory_length(
          context.get_position(), context)
    if context.mode in ("incremental", "first_part"):
      context.record_new_states([k, v])
    bias = self.compute_bias(context, memory_position, x,
                             self.softmax_heads_dims, q)
    return self.attention_internal(context, x, m, q, k, v, memory_length, bias)

  def attention_internal(self, context, x, m, q, k, v, memory_length, bias):
    """Attention from queries, keys and values, with the projections."""
    def sources(logits_or_weights):
      return ([x] if "x2" + logits_or_weights in self.dynamic_projections
              else []) + ([m] if "m2" + logits_or_weights in
                          self.dynamic_projections else [])

    p = mtf.layers.us_einsum([q, k], reduced_dims=[self.key_dim])
    logits = self.talking_heads(
        context, p, "logits", self.key_heads_dims, self.softmax_heads_dims,
        dynamic_projections_from=sources("l"))
    if bias is not None:
      logits += bias
    h = mtf.softmax(logits, memory_length)
    weights = self.talking_heads(
        context, h, "weights", self.softmax_heads_dims, self.value_heads_dims,
        dynamic_projections_from=sources("w"))
    weights = _dropout_weights(context, weights, self.dropout_rate)
    u = mtf.einsum([weights, v], reduced_dims=[memory_length])
    return self.compute_y(context, u)

  def talking_heads(self, context, inp, name, input_heads_dims,
                    output_heads_dims, dynamic_projections_from=None):
    """Projects `inp` from `input_heads_dims` to `output_heads_dims`.

    Args:
      context: a Context.
      inp: a Tensor with the input heads dimensions.
      name: the variable scope ("logits" or "weights").
      input_heads_dims: a list of Dimension.
      output_heads_dims: a list of Dimension.
      dynamic_projections_from: Tensors (x, m) from which dynamic
        projections are computed; none for a static projection only.

    Returns:
      a Tensor with `output_heads_dims` in place of `input_heads_dims`
      (`inp` itself when the two lists are the same).
    """
    shared_dims = [d for d in input_heads_dims if d in output_heads_dims]
    reduced_dims = [d for d in input_heads_dims if d not in output_heads_dims]
    new_dims = [d for d in output_heads_dims if d not in input_heads_dims]
    if not (reduced_dims or new_dims):
      return inp
    if not dynamic_projections_from:
      return self._dense(context, inp, reduced_dims, new_dims, name,
                         extra_expert_dims=shared_dims)
    with tf.compat.v1.variable_scope(name):
      # The static projection, made by hand rather than by dense() so that
      # it can be added to the first dynamic projection.
      static_shape = (context.model.ensemble_dims + shared_dims +
                      reduced_dims + new_dims)
      static_p = mtf.get_variable(
          inp.mesh, "kernel", static_shape,
          initializer=mtf.layers.VarianceScalingInitializer()(
              reduced_dims, new_dims,
              default_seed=seeded_initializers.name_seed("kernel")),
          dtype=context.variable_dtype)
      ps = []
      for i, source in enumerate(dynamic_projections_from):
        init_scale = self.dynamic_projections_init_scale
        if not mtf.layers.unit_scaling_convention():
          init_scale /= mtf.Shape(reduced_dims).size
        ps.append(self._dense(
            context, source, [context.model.model_dim],
            shared_dims + reduced_dims + new_dims, f"{name}_dynamic_{i}",
            kernel_initializer=mtf.layers.VarianceScalingInitializer(
                init_scale)))
      # Adding all projections first would make one tensor with both the
      # query and the memory length: apply them one by one instead.
      ps[0] += static_p
      return mtf.add_n([
          mtf.layers.us_einsum([inp, p], reduced_dims=reduced_dims)
          for p in ps])


@gin.configurable(module=_GIN_MODULE)
class TalkingHeadsEncDecAttention(self_attention_layers.EncDecMixin,
                                  TalkingHeadsSelfAttention):
  """Talking-heads attention over the encoder output.

  See TalkingHeadsSelfAttention. In "first_part" mode it records its keys
  and values as a constant state, read back at every "incremental" step.
  """

  def call(self, context, x, losses=None):
    """Applies the layer to `x` given `context.encoder_output`."""
    m = self._get_memory_antecedent(context)
    _check_memory_input_dim(self, context, m)
    q = self.compute_q(context, x)
    if context.mode == "incremental":
      k, v, memory_length = context.get_constant_state()
    else:
      k = self.compute_k(context, m)
      v = self.compute_v(context, m)
      memory_length = _only_memory_length(m)
      if context.mode == "first_part":
        context.record_constant_state((k, v, memory_length))
    bias = self_attention_layers.enc_dec_attention_bias(
        self, context, self.softmax_heads_dims)
    return self.attention_internal(context, x, m, q, k, v, memory_length, bias)


@gin.configurable(module=_GIN_MODULE)
class GeneralBilinearSelfAttention(self_attention_layers.SelfAttention):
  """General bilinear self-attention.

  Multi-head attention with d_kv = d_model, where a projection of the keys
  would be redundant with that of the queries and a projection of the
  values with the output's: the memory serves as keys and values unchanged.
  Each head has its own [d_model, d_model] query and output matrices
  ("q" and "y").
  """

  def __init__(self,  # pylint: disable=super-init-not-called
               heads_dims=(("heads", 12),),
               dropout_rate=0.0,
               relative_attention_type=None,
               relative_attention_num_buckets=32):
    """Creates a GeneralBilinearSelfAttention layer.

    Args:
      heads_dims: a list of mtf.Dimension or (name, size) pairs.
      dropout_rate: a float, dropout on the attention weights in training.
      relative_attention_type: None, "bias" or "bias_shared".
      relative_attention_num_buckets: an integer.
    """
    self.heads_dims = [mtf.convert_to_dimension(d) for d in heads_dims]
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets

  def compute_q(self, context, x):
    # Variance divided by d_model, in place of scaling logits by its rsqrt.
    init_scale = 1.0
    if not mtf.layers.unit_scaling_convention():
      init_scale /= context.model.model_dim.size
    return mtf.layers.dense(
        x, reduced_dims=[context.model.model_dim],
        new_dims=self.heads_dims + [context.model.model_dim],
        use_bias=False, activation=None,
        variable_dtype=context.variable_dtype,
        name="q", expert_dims=context.model.ensemble_dims,
        kernel_initializer=mtf.layers.VarianceScalingInitializer(init_scale))

  def compute_y(self, context, u):
    return mtf.layers.dense(
        u, reduced_dims=self.heads_dims + [context.model.model_dim],
        new_dims=[context.model.model_dim],
        use_bias=False, activation=None,
        variable_dtype=context.variable_dtype,
        name="y", expert_dims=context.model.ensemble_dims)

  def call(self, context, x, losses=None):
    """Applies the layer to `x` ([batch, length, d_model])."""
    memory_length = self.memory_length(context)
    q = self.compute_q(context, x)
    if context.mode == "incremental":
      old_m, = context.get_states(1)
      m = _update_incremental_state(context, old_m, x, memory_length)
      memory_position = mtf.range(context.mesh, memory_length, tf.int32)
    else:
      m = mtf.replace_dimensions(x, context.length_dim, memory_length)
      memory_position = self.rename_length_to_memory_length(
          context.get_position(), context)
    if context.mode in ("incremental", "first_part"):
      context.record_new_states([m])
    bias = self.compute_bias(context, memory_position, x, self.heads_dims, q)
    return self.attention_internal(context, q, m, memory_length, bias)

  def attention_internal(self, context, q, m, memory_length, bias):
    """Attention of the queries `q` over the memory `m` (keys and values)."""
    logits = mtf.layers.us_einsum([q, m],
                                  reduced_dims=[context.model.model_dim])
    if bias is not None:
      logits += bias
    weights = mtf.softmax(logits, memory_length)
    weights = _dropout_weights(context, weights, self.dropout_rate)
    u = mtf.einsum([weights, m], reduced_dims=[memory_length])
    return self.compute_y(context, u)


@gin.configurable(module=_GIN_MODULE)
class GeneralBilinearEncDecAttention(self_attention_layers.EncDecMixin,
                                     GeneralBilinearSelfAttention):
  """General bilinear attention over the encoder output."""

  def call(self, context, x, losses=None):
    """Applies the layer to `x` given `context.encoder_output`."""
    memory_antecedent = self._get_memory_antecedent(context)
    _check_memory_input_dim(self, context, memory_antecedent)
    q = self.compute_q(context, x)
    if context.mode == "incremental":
      m, memory_length = context.get_constant_state()
    else:
      m = memory_antecedent
      memory_length = _only_memory_length(m)
      if context.mode == "first_part":
        context.record_constant_state((m, memory_length))
    bias = self_attention_layers.enc_dec_attention_bias(self, context,
                                                 self.heads_dims)
    return self.attention_internal(context, q, m, memory_length, bias)
