"""Multi-head attention on named dimensions: the computation and its parameters.

`attention` is dot-product attention written over dimension names only: the
queries, keys and values carry whatever batch, heads and length dimensions
the caller gives them, and the named key, value and memory-length
dimensions say which are contracted and which one the softmax runs over.
`AttentionParams` holds the q, k, v (or shared kv) and o projection
variables of multi-head attention and applies them. These are names of the
original's `mesh_tensorflow.transformer.attention` module, which re-exports
them with the variants built on them (`attention_variants`,
`local_attention`, `experts_attention_params`). Its subclasses take its
parameters through `extends_params`, which writes them once.

Where this differs from the original: initial values are the original's
normal distributions, seeded by the variable's name so that every layout
starts alike; `compute_output` with keep_query_heads_dims also works with
combine_dims.
"""

import functools
import inspect

import mesh_tensorflow as mtf
from mesh_tensorflow.randomness import tf_initializers
import tensorflow as tf


def attention(q,
              k,
              v,
              memory_length_dim,
              key_dim,
              value_dim,
              bias=None,
              dropout_rate=0.0,
              dropout_broadcast_dims=None,
              extra_logit=None,
              context=None,
              float32_logits=True):
  """Dot-product attention over named dimensions (no positions involved).

  q has dimensions other_query_dims + {key_dim}; k has other_memory_dims +
  {memory_length_dim, key_dim}; v has other_memory_dims + {memory_length_dim,
  value_dim}, where other_memory_dims is a subset of other_query_dims
  (typically q: {batch, heads, length}, k and v: {batch, heads}).

  Args:
    q: a Tensor.
    k: a Tensor.
    v: a Tensor.
    memory_length_dim: the Dimension of k and v the softmax runs over.
    key_dim: the Dimension of q and k contracted into the logits.
    value_dim: the channels Dimension of v.
    bias: an optional Tensor added to the logits (e.g. -1e9 where a
      memory position must not be seen).
    dropout_rate: a float, the rate of dropout on the attention weights.
    dropout_broadcast_dims: an optional list of Dimensions over which the
      dropout mask is shared.
    extra_logit: an optional scalar or Tensor: a logit of an extra, empty
      memory position that takes part in the softmax normalisation.
    context: an optional transformer.Context; when its model has a layout
      and mesh shape, attention may be re-split over an unused mesh
      dimension (see `maybe_reshape_attention_input_for_2d_sharding`).
    float32_logits: if True, the logits and the softmax are computed in
      float32 whatever the activation dtype, which keeps bfloat16 models
      stable.

  Returns:
    a Tensor with the shape q.shape - key_dim + value_dim.
  """
  for name, t, needed in (("k", k, [memory_length_dim, key_dim]),
                          ("v", v, [memory_length_dim, value_dim]),
                          ("q", q, [key_dim])):
    for d in needed:
      if d not in t.shape.dims:
        raise mtf.ShapeError(
            f"attention: {name} {t.shape} lacks the dimension {d}")
  orig_q_shape = q.shape
  q, k, v, bias = maybe_reshape_attention_input_for_2d_sharding(
      context, q, k, v, bias, [key_dim, value_dim])
  # q's order, with a re-split dimension as its two parts in its place.
  split_q_shape = q.shape
  if float32_logits:
    q = mtf.cast(q, tf.float32)
    k = mtf.cast(k, tf.float32)
  # q, k and v in the logits' order, channels last: every product of
  # attention and of its gradient is then a batched matmul of contiguous
  # blocks (one small transpose each, instead of TF's einsum transposing
  # operands inside every product; 7% of the tiny model's step).
  logits_shape = _logits_shape(q, k, key_dim)
  q = _to_shape(q, _natural(q, logits_shape, key_dim))
  k = _to_shape(k, _natural(k, logits_shape, key_dim))
  v = _to_shape(v, _natural(v, logits_shape, value_dim))
  logits = mtf.layers.us_einsum([q, k], logits_shape)
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = mtf.cast(weights, v.dtype)
  weights = _dropout(weights, dropout_rate, dropout_broadcast_dims)
  outputs = mtf.einsum([weights, v],
                       _outputs_shape(weights, q.shape - key_dim + value_dim))
  # Back to q's order first: only then do the two parts of a re-split
  # dimension sit side by side, where a reshape merges them.
  outputs = _to_shape(outputs, split_q_shape - key_dim + value_dim)
  return _to_shape(outputs, orig_q_shape - key_dim + value_dim)


def _logits_shape(q, k, key_dim):
  """The logits' dimensions: those q and k share, then q's own (the query
  length), then k's own (the memory length).

  With both lengths innermost, the q.k and weights.v contractions are plain
  batched matrix products of the logits: TF's einsum then transposes only
  the small q, k and v, never the logits or their gradients (the order of
  q = [batch, length, heads, d_kv] would make it transpose all three).
  """
  shared = [d for d in q.shape.dims if d in k.shape.dims and d != key_dim]
  q_own = [d for d in q.shape.dims if d not in k.shape.dims]
  k_own = [d for d in k.shape.dims if d not in q.shape.dims]
  return mtf.Shape(shared + q_own + k_own)


def _natural(x, logits_shape, channel_dim):
  """x's dimensions in the logits' order, its channel dimension last."""
  first = [d for d in logits_shape.dims if d in x.shape.dims]
  rest = [d for d in x.shape.dims if d not in first and d != channel_dim]
  return mtf.Shape(first + rest + [channel_dim])


def _outputs_shape(weights, shape):
  """`shape` reordered to follow the weights' dimensions (value last)."""
  first = [d for d in weights.shape.dims if d in shape.dims]
  return mtf.Shape(first + [d for d in shape.dims if d not in first])


def _to_shape(x, shape):
  """x as `shape`: a transpose when only the order differs."""
  if x.shape == shape:
    return x
  if set(x.shape.dims) == set(shape.dims):
    return mtf.transpose(x, shape)
  return mtf.reshape(x, shape)


def _dropout(weights, dropout_rate, dropout_broadcast_dims):
  """Dropout on attention weights, its mask shared over the broadcast dims."""
  if dropout_rate == 0.0:
    return weights
  return mtf.dropout(
      weights, keep_prob=1.0 - dropout_rate,
      noise_shape=weights.shape - (dropout_broadcast_dims or []))


class AttentionParams(object):
  """The projection variables of (multi-head) attention, and their use.

  Variables (under the caller's variable scope): "q" [query_input_dim ->
  query_heads_dims + key_dim], "k" and "v" (or one shared "kv") [
  memory_input_dim -> memory_heads_dims + key/value_dim] and "o"
  [query_heads_dims + value_dim -> output_dim]. With `combine_dims` the
  heads and key/value dimensions are stored as one dimension named after the
  first of them (e.g. "heads" of size heads * d_kv), so that the einsums are
  plain matrix products; a split of "heads" over the mesh still applies.
  """

  def __init__(self,
               mesh,
               query_input_dim,
               memory_input_dim,
               output_dim,
               key_dim,
               value_dim,
               query_heads_dims,
               memory_heads_dims,
               variable_dtype,
               shared_kv=False,
               no_query=False,
               combine_dims=True,
               ensemble_dim=None,
               keep_query_heads_dims=False,
               fold_scaling_into_initializer=True,
               make_attention_vars=True):
    """Creates the variables (see the class docstring).

    Args:
      mesh: a Mesh.
      query_input_dim: a Dimension (channels of the query antecedent).
      memory_input_dim: a Dimension (channels of the memory antecedent).
      output_dim: a Dimension (channels of the output).
      key_dim: a Dimension (channels of queries and keys).
      value_dim: a Dimension (channels of values).
      query_heads_dims: a list of Dimensions (or None): the heads of q.
      memory_heads_dims: a list of Dimensions (or None): the heads of k and
        v; fewer than the query's heads is multi-query attention.
      variable_dtype: a mtf.VariableDType.
      shared_kv: a boolean: keys and values are one projection "kv".
      no_query: a boolean: make no "q" variable (synthesizer variants).
      combine_dims: a boolean: store heads and key/value channels as one
        combined dimension (see the class docstring).
      ensemble_dim: an optional Dimension prepended to every variable.
      keep_query_heads_dims: a boolean: `compute_output` keeps the query
        heads dimensions instead of summing over them.
      fold_scaling_into_initializer: a boolean: the 1/sqrt(key size) scaling
        of the logits is in the initial scale of "q" (True) or applied to q
        at every call (False).
      make_attention_vars: a boolean: make the q, k, v (kv) variables; only
        ExpertsAttentionParams, which computes them with a mixture of
        experts, sets it to False. "o" is always made.
    """
    if shared_kv and key_dim != value_dim:
      raise ValueError(
          f"AttentionParams: shared_kv requires key_dim == value_dim, got "
          f"{key_dim} and {value_dim}")
    self.mesh = mesh
    self.query_input_dim = query_input_dim
    self.memory_input_dim = memory_input_dim
    self.output_dim = output_dim
    self.key_dim = key_dim
    self.value_dim = value_dim
    self.query_heads_dims = list(query_heads_dims or [])
    self.memory_heads_dims = list(memory_heads_dims or [])
    self.variable_dtype = variable_dtype
    self.shared_kv = shared_kv
    self.no_query = no_query
    self.combine_dims = combine_dims
    self.keep_query_heads_dims = keep_query_heads_dims
    self.fold_scaling_into_initializer = fold_scaling_into_initializer
    self.make_attention_vars = make_attention_vars
    if combine_dims:
      self.q_shape = [query_input_dim, _combined_dim(self.q_dims)]
      self.k_shape = [memory_input_dim, _combined_dim(self.k_dims)]
      self.v_shape = [memory_input_dim, _combined_dim(self.v_dims)]
      self.o_shape = [_combined_dim(self.o_dims), output_dim]
    else:
      self.q_shape = [query_input_dim] + self.q_dims
      self.k_shape = [memory_input_dim] + self.k_dims
      self.v_shape = [memory_input_dim] + self.v_dims
      self.o_shape = self.o_dims + [output_dim]
    if ensemble_dim:
      self.q_shape = [ensemble_dim] + self.q_shape
      self.k_shape = [ensemble_dim] + self.k_shape
      self.v_shape = [ensemble_dim] + self.v_shape
      self.o_shape = [ensemble_dim] + self.o_shape
    self.init_weights()

  def init_weights(self):
    """Creates the variables q, k and v (or kv), and o.

    Initial scales keep activations near unit RMS: normal with stddev
    query_input_dim^-0.5 for q (times key_dim^-0.5 when the logits scaling
    is folded in), memory_input_dim^-0.5 for k, v and kv, and
    (query heads x value size)^-0.5 for o; all 1.0 under the unit-scaling
    convention, where the einsums do the scaling.
    """
    if mtf.layers.unit_scaling_convention():
      q_stddev = kv_stddev = o_stddev = 1.0
    else:
      q_stddev = self.query_input_dim.size ** -0.5
      if self.fold_scaling_into_initializer:
        q_stddev *= self.key_dim.size ** -0.5
      kv_stddev = self.memory_input_dim.size ** -0.5
      o_stddev = mtf.Shape(
          self.query_heads_dims + [self.value_dim]).size ** -0.5
    def make(name, shape, stddev):
      return mtf.get_variable(
          self.mesh, name, shape,
          initializer=_seeded_normal_initializer(name, stddev),
          dtype=self.variable_dtype)
    if self.make_attention_vars:
      if not self.no_query:
        self.wq = make("q", self.q_shape, q_stddev)
      if self.shared_kv:
        self.wkv = make("kv", self.k_shape, kv_stddev)
      else:
        self.wk = make("k", self.k_shape, kv_stddev)
        self.wv = make("v", self.v_shape, kv_stddev)
    self.wo = make("o", self.o_shape, o_stddev)

  def _project(self, antecedent, weights, input_dim, dims):
    ret = mtf.layers.us_einsum([antecedent, weights], reduced_dims=[input_dim])
    if self.combine_dims:
      ret = mtf.replace_dimensions(ret, ret.shape.dims[-1], dims)
    return ret

  def compute_q(self, query_antecedent):
    """The queries: query_heads_dims + {key_dim} + the antecedent's other
    dimensions, from an antecedent with query_input_dim."""
    ret = self._project(query_antecedent, self.wq, self.query_input_dim,
                        self.q_dims)
    if not self.fold_scaling_into_initializer:
      ret *= self.key_dim.size ** -0.5
    return ret

  def compute_kv(self, memory_antecedent):
    """The shared keys and values (shared_kv only): memory_heads_dims +
    {key_dim} + the antecedent's other dimensions."""
    if not self.shared_kv:
      raise ValueError("AttentionParams.compute_kv needs shared_kv=True")
    return self._project(memory_antecedent, self.wkv, self.memory_input_dim,
                         self.k_dims)

  def compute_k(self, memory_antecedent):
    """The keys: memory_heads_dims + {key_dim} + the antecedent's other
    dimensions (not with shared_kv)."""
    if self.shared_kv:
      raise ValueError("AttentionParams.compute_k cannot be called with "
                       "shared_kv=True: use compute_kv")
    return self._project(memory_antecedent, self.wk, self.memory_input_dim,
                         self.k_dims)

  def compute_v(self, memory_antecedent):
    """The values: memory_heads_dims + {value_dim} + the antecedent's other
    dimensions (not with shared_kv)."""
    if self.shared_kv:
      raise ValueError("AttentionParams.compute_v cannot be called with "
                       "shared_kv=True: use compute_kv")
    return self._project(memory_antecedent, self.wv, self.memory_input_dim,
                         self.v_dims)

  def compute_output(self, o, output_shape=None):
    """Projects the attention output o (query_heads_dims + {value_dim} +
    other dims) to {output_dim} + other dims (keeping the query heads
    dimensions with keep_query_heads_dims)."""
    if self.keep_query_heads_dims:
      # Only the value channels are summed over; a combined "o" variable is
      # viewed with its heads and value dimensions apart.
      wo = self.wo
      if self.combine_dims:
        wo = mtf.replace_dimensions(wo, wo.shape.dims[-2], self.o_dims)
      return mtf.layers.us_einsum(
          [o, wo], output_shape=output_shape, reduced_dims=[self.value_dim])
    if self.combine_dims:
      o = mtf.transpose(o, o.shape - self.o_dims + self.o_dims)
      o = mtf.replace_dimensions(o, self.o_dims, self.wo.shape.dims[-2])
      reduced_dims = [self.wo.shape.dims[-2]]
    else:
      reduced_dims = self.o_dims
    return mtf.layers.us_einsum(
        [o, self.wo], output_shape=output_shape, reduced_dims=reduced_dims)

  @property
  def q_dims(self):
    return self.query_heads_dims + [self.key_dim]

  @property
  def k_dims(self):
    return self.memory_heads_dims + [self.key_dim]

  @property
  def v_dims(self):
    return self.memory_heads_dims + [self.value_dim]

  @property
  def o_dims(self):
    return self.query_heads_dims + [self.value_dim]


def extends_params(omit=(), defaults=None):
  """Gives a subclass's __init__ AttentionParams' parameters, then its own.

  The original's subclasses (ExpertsAttentionParams, AttentionParamsFixup)
  repeat AttentionParams' long parameter list, and programs pass those
  arguments by position or by name. Here the list is written once, in
  AttentionParams.__init__: the decorated `__init__(self, base, <own>)`
  takes AttentionParams' parameters (less `omit`, with the `defaults`
  changed) and then its own, in that order, as its signature says, and
  receives in `base` a dict of the former, defaults filled in, to hand on
  with `super().__init__(**base)`. Its own `**kwargs`, if any, collects the
  other keyword arguments.

  Args:
    omit: names of AttentionParams' parameters the subclass does not take
      (or takes only through its **kwargs).
    defaults: a dict, parameter name -> the subclass's default.

  Returns:
    a decorator of `__init__`.
  """
  defaults = defaults or {}
  base = [p.replace(default=defaults.get(p.name, p.default))
          for p in inspect.signature(AttentionParams).parameters.values()
          if p.name not in omit]

  def decorate(init):
    self_param, _, *own = inspect.signature(init).parameters.values()
    signature = inspect.Signature([self_param] + base + own)
    var_keyword = [p.name for p in own if p.kind == p.VAR_KEYWORD]

    @functools.wraps(init)
    def wrapper(*args, **kwargs):
      bound = signature.bind(*args, **kwargs)
      bound.apply_defaults()
      arguments = dict(bound.arguments)
      base_arguments = {p.name: arguments.pop(p.name) for p in base}
      extra = arguments.pop(var_keyword[0]) if var_keyword else {}
      return init(base=base_arguments, **arguments, **extra)

    wrapper.__signature__ = signature
    return wrapper

  return decorate


def _seeded_normal_initializer(name, stddev):
  """The original's tf.random_normal_initializer(stddev), seeded by the
  variable's scoped name (like the default initializer of
  `mtf.get_variable`), so that every layout and every trace starts from the
  same values (see mtf.randomness.tf_initializers)."""
  return tf_initializers.seeded("random_normal_initializer",
                                tf_initializers.name_seed(name), stream=2,
                                stddev=stddev)


def _combined_dim(dims):
  """One Dimension standing for `dims`: the first one's name, their size."""
  return mtf.Dimension(dims[0].name, mtf.Shape(dims).size)


def attention_params_simple(
    mesh, io_dim, kv_dim, heads_dim, variable_dtype):
  """AttentionParams for the common case: one channels dimension for inputs
  and outputs, one heads dimension for queries and memory alike.

  Args:
    mesh: a Mesh.
    io_dim: a Dimension (channels of inputs and outputs).
    kv_dim: a Dimension (channels of keys and values).
    heads_dim: a Dimension (the attention heads).
    variable_dtype: a mtf.VariableDType.

  Returns:
    an AttentionParams.
  """
  return AttentionParams(
      mesh,
      query_input_dim=io_dim,
      memory_input_dim=io_dim,
      output_dim=io_dim,
      key_dim=kv_dim,
      value_dim=kv_dim,
      query_heads_dims=[heads_dim],
      memory_heads_dims=[heads_dim],
      variable_dtype=variable_dtype)


def visibility_mask_to_attention_bias(visible, dtype):
  """An attention bias from a boolean mask: 0 where visible, -1e9 elsewhere.

  Args:
    visible: a boolean Tensor.
    dtype: a dtype.

  Returns:
    a Tensor of `dtype` shaped like `visible`.
  """
  return mtf.cast(mtf.logical_not(visible), dtype) * -1e9


def maybe_reshape_attention_input_for_2d_sharding(
    context, q, k, v, bias, unsplittable_dims):
  """Re-splits attention's inputs over a mesh dimension they leave unused.

  Under 2-D model parallelism d_model is split over one mesh dimension and
  heads (and d_ff, vocab) over another; q, k and v no longer have d_model,
  so the attention inside would be computed identically on every processor
  along the first mesh dimension. This carves a new dimension out of the
  low part of a dimension that q, k and v share (batch or heads), named
  like a tensor dimension the layout puts on the unused mesh dimension, so
  that the attention is split over it too. Nothing changes when the
  context's model has no layout and mesh shape, when every mesh dimension
  is already used, or when no shared dimension divides.

  Args:
    context: a transformer.Context or None.
    q: a Tensor.
    k: a Tensor.
    v: a Tensor.
    bias: a Tensor or None.
    unsplittable_dims: Dimensions not to re-split (the key and value
      channels).

  Returns:
    (q, k, v, bias), reshaped or as given.
  """
  original_inputs = q, k, v, bias
  model = getattr(context, "model", None) if context else None
  layout = getattr(model, "layout", None)
  mesh_shape = getattr(model, "mesh_shape", None)
  if not layout or not mesh_shape:
    return original_inputs
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout)
  used = [False] * mesh_shape.ndims
  for x in original_inputs:
    if x is None:
      continue
    for mesh_axis in layout_rules.tensor_layout(
        x.shape, mesh_shape).tensor_axis_to_mesh_axis:
      if mesh_axis is not None:
        used[mesh_axis] = True
  if all(used):
    return original_inputs
  mesh_dim = mesh_shape.dims[used.index(False)]
  names = layout_rules.mesh_dimension_name_to_tensor_dimension_names(
      mesh_dim.name)
  if not names:
    return original_inputs
  new_name = names[0]
  if any(new_name in x.shape.dimension_names
         for x in original_inputs if x is not None):
    return original_inputs
  resplit = None
  for d in q.shape.dims:
    if d in k.shape.dims and d in v.shape.dims and d not in unsplittable_dims:
      num_splits = mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, d)
      if d.size % (num_splits * mesh_dim.size) == 0:
        resplit = d
        break
  if resplit is None:
    return original_inputs
  high = mtf.Dimension(resplit.name, num_splits)
  low = mtf.Dimension(new_name, resplit.size // num_splits)
  def reshape(x):
    if x is not None and resplit in x.shape.dims:
      return mtf.replace_dimensions(x, resplit, [high, low])
    return x
  return reshape(q), reshape(k), reshape(v), reshape(bias)

