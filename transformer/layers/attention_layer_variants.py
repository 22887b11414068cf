"""Branched, synthesizer and transparent attention (the original's layers).

- `BranchedSelfAttention` / `BranchedEncDecAttention` (the Weighted
  Transformer, Ahmed et al. 2017): every head is a branch with its own
  output projection; each branch is scaled by a learned `kappa`, goes
  through a DenseReluDense shared by the branches, is scaled by a learned
  `alpha`, and the branches are summed.
- `Synthesizer` (Tay et al. 2020, arXiv:2005.00743): attention weights
  synthesized from learned tables ("random", "factorized"), from each query
  alone ("dense_minus"), or mixed with dot-product logits ("*_plus*"),
  through `attention.synthetic_attention`.
- `TransparentEncDecAttention` (Bapna et al. 2018): the decoder attends to a
  learned softmax-weighted mixture of the encoder's layer outputs, one
  mixture per decoder module.

All are re-exported by `transformer_layers` and registered with gin under
that module's name, as in the original.
"""

import gin

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer.layers import dense_layers
from mesh_tensorflow.transformer.layers import seeded_initializers
from mesh_tensorflow.transformer.layers import self_attention_layers

import tensorflow as tf

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"


@gin.configurable(module=_GIN_MODULE)
class BranchedSelfAttention(self_attention_layers.SelfAttention):
  """Branched self-attention (the Weighted Transformer).

  The attention output keeps its heads dimension (one branch per head, each
  projected to d_model by its own slice of "o"). Branch i is scaled by
  kappa[i], passed through `dense_layer` (a DenseReluDense, configured by
  gin like any other; its variables "wi" and "wo" are shared by the
  branches), scaled by alpha[i], and the branches are summed.

  kappa and alpha ("kappa" and "alpha", one value per head) start uniform in
  [0, 1). As in the original they carry `constraint=self._constraint`
  (non-negative, summing to 1), which optimizers that honour variable
  constraints apply after each update; mtf's optimizers, like the
  original's, do not.

  The branches' hidden layer has both "heads" and "d_ff": a layout may
  split either over a mesh dimension, not both over the same one.
  """

  def __init__(self, **kwargs):
    """Creates a BranchedSelfAttention layer.

    Args:
      **kwargs: SelfAttention's parameters, except combine_dims and
        keep_query_heads_dims (set to False and True) and num_memory_heads
        (which must be 0).
    """
    super().__init__(combine_dims=False, keep_query_heads_dims=True, **kwargs)
    if self.num_memory_heads != 0:
      raise ValueError(
          f"{type(self).__name__}: num_memory_heads is "
          f"{self.num_memory_heads}; branched attention needs 0 (one memory "
          "head per query head).")
    self.dense_layer = dense_layers.DenseReluDense()
    # None: uniform in [0, 1), seeded by the variable's name (the original's
    # tf.random_uniform_initializer(0, 1), but the same on every layout).
    self.kappa_init = None
    self.alpha_init = None

  def _constraint(self, z):
    """Keeps z non-negative and summing to 1."""
    z = mtf.relu(z)
    return z / mtf.reduce_sum(z + 10**-4)

  def _branch_weights(self, context, name, initializer, heads_dim):
    return mtf.get_variable(
        context.mesh, name, mtf.Shape([heads_dim]),
        initializer=initializer or seeded_initializers.uniform(name),
        dtype=context.variable_dtype, constraint=self._constraint)

  def layer_output_from_attention_output(self, context, attention_output,
                                         losses):
    heads_dim = mtf.Dimension("heads", self.num_heads)
    kappa = self._branch_weights(context, "kappa", self.kappa_init, heads_dim)
    alpha = self._branch_weights(context, "alpha", self.alpha_init, heads_dim)
    o = mtf.einsum([attention_output, kappa],
                   output_shape=attention_output.shape)
    o = self.dense_layer.call(context, o, losses)
    o = mtf.einsum([o, alpha], output_shape=o.shape)
    return mtf.reduce_sum(o, reduced_dim=heads_dim)


@gin.configurable(module=_GIN_MODULE)
class BranchedEncDecAttention(self_attention_layers.EncDecMixin,
                              BranchedSelfAttention):
  """Branched attention over the encoder output."""

  def call(self, context, x, losses=None):
    """Applies the layer to `x` given `context.encoder_output`."""
    return self_attention_layers.enc_dec_attention(
        self, self._get_memory_antecedent(context), context, x, losses)


@gin.configurable(module=_GIN_MODULE)
class Synthesizer(self_attention_layers.SelfAttention):
  """Multi-head Synthesizer attention (arXiv:2005.00743).

  `synthesize_mode` picks how the attention logits are made (see
  `attention.synthetic_attention`):
    "random": a learned table R[length, heads, memory_length], the same for
      every example; no queries or keys ("kv" projects the values).
    "factorized": R from two learned factors "R1", "R2".
    "dense_minus": logits from a dense layer ("pi") on relu(queries); the
      memory is projected once ("kv") for the values.
    "random_plus", "dense_plus": dot-product logits plus the synthetic ones.
    "random_plus_alpha", "dense_plus_alpha": a learned mix,
      sigmoid(alpha) * synthetic + (1 - sigmoid(alpha)) * dot-product.
  The tables and the dense layer cover 512 positions by default
  (`attention_kwargs={"max_length": n}` sets another length); sequences may
  be at most that long.
  """

  def __init__(self,
               num_heads=8,
               num_memory_heads=0,
               key_value_size=128,
               shared_kv=False,
               dropout_rate=0.0,
               attention_kwargs=None,
               relative_attention_type=None,
               relative_attention_num_buckets=32,
               attention_func=None,
               combine_dims=True,
               keep_query_heads_dims=False,
               synthesize_mode="random_plus_alpha",
               fold_scaling_into_initializer=True,
               **kwargs):
    """Creates a Synthesizer layer.

    Args:
      num_heads: an integer.
      num_memory_heads: an optional integer.
      key_value_size: an integer.
      shared_kv: a boolean (overridden by `synthesize_mode`, see below).
      dropout_rate: a float.
      attention_kwargs: a dictionary of kwargs for
        attention.synthetic_attention.
      relative_attention_type: None, "bias", "bias_shared" or "contextual".
      relative_attention_num_buckets: an integer.
      attention_func: unused (as in the original).
      combine_dims: a boolean (the variables are made with the default).
      keep_query_heads_dims: a boolean.
      synthesize_mode: a string, see the class docstring.
      fold_scaling_into_initializer: a boolean.
      **kwargs: further SelfAttention parameters.
    """
    super().__init__(
        num_heads=num_heads, num_memory_heads=num_memory_heads,
        key_value_size=key_value_size, shared_kv=shared_kv,
        dropout_rate=dropout_rate, attention_kwargs=attention_kwargs,
        relative_attention_type=relative_attention_type,
        relative_attention_num_buckets=relative_attention_num_buckets,
        combine_dims=combine_dims,
        keep_query_heads_dims=keep_query_heads_dims,
        fold_scaling_into_initializer=fold_scaling_into_initializer,
        **kwargs)
    # Unused, so any value is kept (SelfAttention accepts None or "hybrid").
    self.attention_func = attention_func
    self.synthesize_mode = synthesize_mode
    # Mixed modes keep queries, keys and values; "minus" modes keep the
    # queries and share one projection for keys and values; the purely
    # synthetic ones need neither queries nor keys.
    if "plus" in synthesize_mode:
      self.shared_kv = False
      self.no_query = False
    elif "minus" in synthesize_mode:
      self.shared_kv = True
      self.no_query = False
    else:
      self.shared_kv = True
      self.no_query = True

  def make_params(self, context):
    return self_attention_layers.attention_params(
        context=context,
        kv_dim=self.kv_dim,
        num_heads=self.num_heads,
        num_memory_heads=self.num_memory_heads,
        shared_kv=self.shared_kv,
        no_query=self.no_query,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer)

  def call(self, context, x, losses=None):
    """Applies the layer to `x` ([batch, length, d_model])."""
    params = self.make_params(context)
    memory_length = self.memory_length(context)
    if context.mode == "incremental":
      m = x
    else:
      m = mtf.replace_dimensions(x, context.length_dim, memory_length)
    if self.shared_kv:
      k = v = params.compute_kv(m)
    else:
      k = params.compute_k(m)
      v = params.compute_v(m)
    # Purely synthetic modes read no queries: x stands in for them (only its
    # dimensions are used).
    q = x if self.no_query else params.compute_q(x)
    if context.mode == "incremental":
      one_hot = mtf.one_hot(context.position, memory_length,
                            dtype=context.activation_dtype)
      old_k, old_v = context.get_states(2)
      k = old_k * (1.0 - one_hot) + k * one_hot
      v = old_v * (1.0 - one_hot) + v * one_hot
      memory_position = mtf.range(context.mesh, memory_length, tf.int32)
    else:
      memory_position = self.rename_length_to_memory_length(
          context.get_position(), context)
    if context.mode in ("incremental", "first_part"):
      context.record_new_states([k, v])
    o = attention.synthetic_attention(
        q, k, v, memory_length, self.kv_dim, self.kv_dim,
        self.compute_bias(context, memory_position, x,
                          params.query_heads_dims, q),
        synthesize=True, synthesize_mode=self.synthesize_mode,
        context=context, **self.attention_kwargs_from_context(context))
    attention_output = params.compute_output(
        o, output_shape=self.expected_attention_output_shape(x, params))
    return self.layer_output_from_attention_output(context, attention_output,
                                                   losses)


@gin.configurable(module=_GIN_MODULE)
class TransparentEncDecAttention(self_attention_layers.EncDecAttention):
  """Transparent attention over the encoder's layer outputs.

  The encoder's output after its embedding and after each of its
  `encoder_num_modules` modules (every `layers_per_encoder_module` layers)
  are mixed, with softmax weights from a learned matrix "w"
  [encoder_module_outputs, decoder_module_inputs], into one memory per
  decoder module; the layers of decoder module j (every
  `layers_per_decoder_module` layers) attend to mixture j. The mixtures are
  computed once per call (the first layer to ask keeps them on the context).
  """

  def __init__(self,
               layers_per_encoder_module=gin.REQUIRED,
               layers_per_decoder_module=gin.REQUIRED,
               encoder_num_modules=gin.REQUIRED,
               decoder_num_modules=gin.REQUIRED,
               dropout_rate=0.0,
               **kwargs):
    """Creates a TransparentEncDecAttention layer.

    Args:
      layers_per_encoder_module: a positive integer, layers per repeated
        module of the encoder.
      layers_per_decoder_module: a positive integer, layers per repeated
        module of the decoder.
      encoder_num_modules: a positive integer, modules in the encoder.
      decoder_num_modules: a positive integer, modules in the decoder.
      dropout_rate: a float, dropout on "w" (and on the attention weights)
        in training.
      **kwargs: EncDecAttention's parameters.
    """
    super().__init__(**kwargs)
    self.layers_per_encoder_module = layers_per_encoder_module
    self.layers_per_decoder_module = layers_per_decoder_module
    self.encoder_num_modules = encoder_num_modules
    self.decoder_num_modules = decoder_num_modules
    self.dropout_rate = dropout_rate

  def _get_memory_antecedent(self, context):
    decoder_module_index = context.layer_index // self.layers_per_decoder_module
    return self._get_decoder_inputs(context)[decoder_module_index]

  def _get_decoder_inputs(self, context):
    """One memory per decoder module, mixed from the encoder's outputs.

    Kept on the context, so that layers called in other variable scopes
    reuse them instead of making another "w".

    Args:
      context: a Context with `encoder_layer_outputs`.

    Returns:
      a list of `decoder_num_modules` Tensors shaped like the encoder's
      output (with "memory_length").
    """
    if hasattr(context, "decoder_layers_per_module"):
      return context.decoder_layers_per_module
    if not context.encoder_layer_outputs:
      raise ValueError(
          "TransparentEncDecAttention needs context.encoder_layer_outputs "
          "(the encoder's output after each layer).")
    encoder_layer_outputs = [
        mtf.layers.rename_length_to_memory_length(output)
        for output in context.encoder_layer_outputs]
    per_module = self.layers_per_encoder_module
    module_outputs = ([encoder_layer_outputs[0]] +
                      encoder_layer_outputs[per_module::per_module])
    encoder_module_outputs_dim = mtf.Dimension(
        "encoder_module_outputs", self.encoder_num_modules + 1)
    decoder_module_inputs_dim = mtf.Dimension(
        "decoder_module_inputs", self.decoder_num_modules)
    if len(module_outputs) != encoder_module_outputs_dim.size:
      raise ValueError(
          f"TransparentEncDecAttention: the encoder has "
          f"{len(encoder_layer_outputs)} layer outputs, which give "
          f"{len(module_outputs)} module outputs every {per_module} layers; "
          f"encoder_num_modules={self.encoder_num_modules} needs "
          f"{encoder_module_outputs_dim.size}.")
    encoder_module_outputs = mtf.stack(module_outputs,
                                       "encoder_module_outputs")
    stddev = 1.0
    if not mtf.layers.unit_scaling_convention():
      stddev *= encoder_module_outputs_dim.size ** -0.5
    w = mtf.get_variable(
        context.mesh, "w",
        mtf.Shape([encoder_module_outputs_dim, decoder_module_inputs_dim]),
        initializer=seeded_initializers.normal("w", stddev=stddev),
        dtype=context.variable_dtype)
    if context.train and self.dropout_rate != 0.0:
      w = mtf.dropout(w, is_training=True, rate=self.dropout_rate)
    s = mtf.softmax(w, reduced_dim=encoder_module_outputs_dim)
    z = mtf.layers.us_einsum([s, encoder_module_outputs],
                             reduced_dims=[encoder_module_outputs_dim])
    pieces = mtf.split(z, split_dim=decoder_module_inputs_dim,
                       num_or_size_splits=decoder_module_inputs_dim.size)
    context.decoder_layers_per_module = [
        mtf.reshape(piece, z.shape.dims[1:]) for piece in pieces]
    return context.decoder_layers_per_module
