"""BERT on Mesh TensorFlow: `BertConfig` and `BertModel`.

A port of Google's BERT (github.com/google-research/bert) to named
dimensions, as the original Mesh TensorFlow had it. The encoder is a stack
of `num_blocks` blocks, each a sequence of layers named by
`config.block_layers` ("attention", "feedforward", "moe"), every layer
wrapped in dropout and a residual connection:

- residual_structure="original" (Google's BERT): x = norm(x + layer(x));
- residual_structure="direct" (pre-norm): x = x + layer(norm(x)), with one
  more normalization after the last block.

Positions enter as learned embeddings ("embedding") or as a learned bias of
the attention logits per head and relative-distance bucket
("relative_attention_bias", as in T5).

Tensor dimensions: "batch", the sequence dimension of `input_ids` (and its
copy "memory_seq" for attention keys), "hidden", "num_heads",
"attention_head", "intermediate", "vocab" (padded to a multiple of 128 so
that it splits over the mesh), "experts" and "expert_hidden" (MoE). The
default layout of the binaries is
`batch:batch,vocab:model,intermediate:model,num_heads:model,experts:batch`.

Variables carry the original's names (`bert/embeddings/word_embeddings`,
`bert/encoder/block_0/attention/query/kernel`,
`bert/encoder/block_0/feedforward/dense_1/kernel`, `bert/pooler/dense/kernel`,
`cls/predictions/output_bias`, `cls/seq_relationship/kernel`, ...), so
checkpoints of the original and of this package interchange. Initial values
are seeded by those names: every mesh and layout starts from the same model.
"""

import collections
import copy
import json
import re

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import layer_helpers
from mesh_tensorflow.randomness import tf_initializers
from mesh_tensorflow.transformer import moe
# T5's relative position buckets, which BERT's relative configs use too.
from mesh_tensorflow.transformer.layers.self_attention_layers import relative_position_bucket

# Google's BERT JSON keys -> BertConfig parameters.
_GOOGLE_KEYS = {
    "hidden_size": "d_model",
    "num_hidden_layers": "num_blocks",
    "num_attention_heads": "attention_num_heads",
    "intermediate_size": "feedforward_intermediate_size",
    "hidden_act": "feedforward_intermediate_act",
    "hidden_dropout_prob": "layer_output_dropout_prob",
}

_POSITION_SIGNALS = ("embedding", "relative_attention_bias")
_RESIDUAL_STRUCTURES = ("original", "direct")
_LAYER_TYPES = ("attention", "feedforward", "moe")


class BertConfig:
  """Configuration of a `BertModel`."""

  def __init__(self,
               vocab_size,
               d_model=768,
               position_signal="embedding",
               max_position_embeddings=512,
               num_blocks=12,
               block_layers="attention,feedforward",
               layer_output_dropout_prob=0.1,
               residual_structure="original",
               use_bias=True,
               attention_num_heads=12,
               attention_head_size=None,
               attention_num_key_heads=None,
               attention_key_head_size=None,
               attention_num_value_heads=None,
               attention_value_head_size=None,
               attention_probs_dropout_prob=0.1,
               feedforward_intermediate_size=3072,
               feedforward_intermediate_act="gelu",
               feedforward_intermediate_dropout_prob=0.0,
               moe_num_experts=32,
               moe_intermediate_size=6144,
               type_vocab_size=16,
               initializer_range=0.02,
               moe_group_size=2048):
    """Constructs a BertConfig.

    Args:
      vocab_size: size of the `input_ids` vocabulary (the model pads it to a
        multiple of 128).
      d_model: channels of each layer's input and output ("hidden").
      position_signal: "embedding" (learned absolute positions) or
        "relative_attention_bias" (a learned bias per head and bucket of
        relative distance, added to the attention logits).
      max_position_embeddings: the longest sequence "embedding" supports.
      num_blocks: number of blocks in the encoder.
      block_layers: comma-separated layer types of one block, from
        "attention", "feedforward" and "moe" (a list is accepted too).
      layer_output_dropout_prob: dropout on each layer's output and on the
        embeddings.
      residual_structure: "original" (normalize after the residual sum) or
        "direct" (normalize the layer's input; the residual stream itself is
        never normalized until after the last block).
      use_bias: dense layers have biases and layer normalization subtracts
        the mean and adds a bias.
      attention_num_heads: attention heads.
      attention_head_size: size of each head's queries, keys and values;
        None means d_model / attention_num_heads.
      attention_num_key_heads: number of key heads (`BertModel.key_heads_dims`).
      attention_key_head_size: key size (`BertModel.key_dim`).
      attention_num_value_heads: number of value heads.
      attention_value_head_size: value size (`BertModel.value_dim`).
      attention_probs_dropout_prob: dropout on the attention probabilities.
      feedforward_intermediate_size: size of the feed-forward layer's hidden
        layer ("intermediate", a.k.a. d_ff).
      feedforward_intermediate_act: activation (name or function) of the
        feed-forward hidden layer, the MoE experts and the masked-LM
        transform.
      feedforward_intermediate_dropout_prob: dropout on the feed-forward
        hidden layer.
      moe_num_experts: experts of each "moe" layer.
      moe_intermediate_size: hidden size of each expert.
      type_vocab_size: vocabulary size of `token_type_ids`.
      initializer_range: standard deviation of the truncated normal
        initializer of all weight matrices; None or 0 selects variance
        scaling (scale 0.4, fan-in).
      moe_group_size: (beyond the original, which fixed it at 2048) the MoE
        gating routes tokens in groups of at most this many.
    """
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.position_signal = position_signal
    self.max_position_embeddings = max_position_embeddings
    self.num_blocks = num_blocks
    self.block_layers = _as_layer_list(block_layers)
    self.layer_output_dropout_prob = layer_output_dropout_prob
    self.residual_structure = residual_structure
    self.use_bias = use_bias
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.attention_num_heads = attention_num_heads
    self.attention_head_size = attention_head_size
    self.attention_num_key_heads = attention_num_key_heads
    self.attention_key_head_size = attention_key_head_size
    self.attention_num_value_heads = attention_num_value_heads
    self.attention_value_head_size = attention_value_head_size
    self.feedforward_intermediate_size = feedforward_intermediate_size
    self.feedforward_intermediate_act = feedforward_intermediate_act
    self.feedforward_intermediate_dropout_prob = (
        feedforward_intermediate_dropout_prob)
    self.moe_num_experts = moe_num_experts
    self.moe_intermediate_size = moe_intermediate_size
    self.type_vocab_size = type_vocab_size
    self.initializer_range = initializer_range
    self.moe_group_size = moe_group_size
    self.validate()

  def validate(self):
    """Raises ValueError naming a position signal, residual structure or
    layer type this BertConfig does not know."""
    if self.position_signal not in _POSITION_SIGNALS:
      raise ValueError(
          f"BertConfig: unknown position_signal {self.position_signal!r}; "
          f"expected one of {list(_POSITION_SIGNALS)}.")
    if self.residual_structure not in _RESIDUAL_STRUCTURES:
      raise ValueError(
          f"BertConfig: unknown residual_structure "
          f"{self.residual_structure!r}; expected one of "
          f"{list(_RESIDUAL_STRUCTURES)}.")
    unknown = [t for t in self.block_layers if t not in _LAYER_TYPES]
    if unknown:
      raise ValueError(
          f"BertConfig: unknown layer types {unknown} in block_layers "
          f"{self.block_layers}; expected some of {list(_LAYER_TYPES)}.")

  @classmethod
  def from_dict(cls, json_object):
    """A BertConfig from a dict of parameters.

    Google's BERT keys (hidden_size, num_hidden_layers, num_attention_heads,
    intermediate_size, hidden_act, hidden_dropout_prob) are read as the
    parameters they stand for; other keys are set as attributes by name.
    """
    config = cls(vocab_size=None)
    for key, value in json_object.items():
      setattr(config, _GOOGLE_KEYS.get(key, key), value)
    config.block_layers = _as_layer_list(config.block_layers)
    config.validate()
    return config

  @classmethod
  def from_json_file(cls, json_file):
    """A BertConfig from a JSON file (any path tf.io.gfile reads)."""
    with tf.io.gfile.GFile(json_file, "r") as reader:
      text = reader.read()
    try:
      parsed = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"BERT config file {json_file}: not valid JSON "
                       f"({e}).") from e
    return cls.from_dict(parsed)

  def to_dict(self):
    """This configuration as a dict (a deep copy)."""
    return copy.deepcopy(self.__dict__)

  def to_json_string(self):
    """This configuration as JSON text."""
    return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def _as_layer_list(block_layers):
  if isinstance(block_layers, str):
    return [t.strip() for t in block_layers.split(",") if t.strip()]
  return list(block_layers)


class _TruncatedNormal(mtf.layers.DenseInitializer):
  """tf.compat.v1.truncated_normal_initializer(stddev), seeded by the name
  of the variable it initializes, so every layout draws the same values."""

  def __init__(self, stddev):
    self.stddev = stddev

  def __call__(self, reduced_dims, new_dims):
    del reduced_dims, new_dims
    return self.for_variable("kernel")

  def for_variable(self, name):
    """The initializer of variable `name` in the current variable scope."""
    return tf_initializers.seeded("truncated_normal_initializer",
                                  tf_initializers.name_seed(name),
                                  stddev=self.stddev)


class BertModel:
  """BERT ("Bidirectional Encoder Representations from Transformers").

  Builds the encoder and the pooler on construction; the pretraining heads
  come from `get_masked_lm_output` and `get_next_sentence_output`.
  """

  def __init__(self,
               config,
               is_training,
               input_ids,
               input_mask=None,
               token_type_ids=None,
               scope=None,
               mesh_shape="",
               layout=""):
    """Builds the model.

    Args:
      config: a BertConfig.
      is_training: False turns every dropout off.
      input_ids: int32 mtf Tensor [batch, seq].
      input_mask: optional int32 mtf Tensor [batch, seq]: 1 for tokens,
        0 for padding (never attended to).
      token_type_ids: optional int32 mtf Tensor [batch, seq].
      scope: variable scope (default "bert").
      mesh_shape: the mesh shape the graph will be lowered on (the MoE
        layers choose their gating groups from it).
      layout: the layout rules, likewise.
    """
    self.config = copy.deepcopy(config)
    del config
    if not is_training:
      self.config.layer_output_dropout_prob = 0.0
      self.config.attention_probs_dropout_prob = 0.0
      self.config.feedforward_intermediate_dropout_prob = 0.0
    self._is_training = bool(is_training)
    input_shape = input_ids.shape
    if input_shape.ndims != 2:
      raise ValueError(f"BertModel: input_ids must have two dimensions "
                       f"[batch, seq], got {input_shape}.")
    self._seq_dim = input_shape.dims[1]
    self._memory_seq_dim = mtf.Dimension("memory_seq", self.seq_dim.size)
    self._extra_losses = []
    mesh = input_ids.mesh
    if token_type_ids is None:
      token_type_ids = mtf.zeros(mesh, input_shape, dtype=tf.int32)

    with layer_helpers.variable_scope(mesh, scope, "bert"):
      with tf.compat.v1.variable_scope("embeddings"):
        self._build_embeddings(input_ids, token_type_ids)
      with tf.compat.v1.variable_scope("encoder"):
        self._build_encoder(input_mask, mesh_shape, layout)
      self.sequence_output = self.all_encoder_layers[-1] if (
          self.all_encoder_layers) else self.embedding_output
      if self.config.residual_structure == "direct":
        self.sequence_output = self.normalize(self.sequence_output)
      with tf.compat.v1.variable_scope("pooler"):
        # The hidden state of the first token ([CLS]) stands for the
        # sequence in classification tasks.
        first_token_tensor = mtf.gather(self.sequence_output, 0, self.seq_dim)
        self.pooled_output = mtf.layers.dense(
            first_token_tensor,
            reduced_dims=[self.model_dim],
            new_dims=[self.model_dim],
            activation=mtf.tanh,
            kernel_initializer=self.dense_initializer,
            use_bias=self.config.use_bias)

  def _build_embeddings(self, input_ids, token_type_ids):
    """Word + token type (+ position) embeddings, normalized, dropped out."""
    mesh = input_ids.mesh
    self.embedding_table = mtf.get_variable(
        mesh, "word_embeddings", mtf.Shape([self.vocab_dim, self.model_dim]),
        initializer=self._embedding_initializer_for("word_embeddings"))
    self.word_embedding_output = mtf.gather(
        self.embedding_table, input_ids, self.vocab_dim)
    token_type_table = mtf.get_variable(
        mesh, "token_type_embeddings",
        mtf.Shape([self.token_type_vocab_dim, self.model_dim]),
        initializer=self._embedding_initializer_for("token_type_embeddings"))
    output = self.word_embedding_output + mtf.gather(
        token_type_table, token_type_ids, self.token_type_vocab_dim)
    if self.config.position_signal == "embedding":
      if self.seq_dim.size > self.max_position_embeddings_dim.size:
        raise ValueError(
            f"BertModel: sequence length {self.seq_dim.size} exceeds "
            f"max_position_embeddings={self.max_position_embeddings_dim.size}"
            " of the config.")
      full_position_table = mtf.get_variable(
          mesh, "position_embeddings",
          mtf.Shape([self.max_position_embeddings_dim, self.model_dim]),
          initializer=self._embedding_initializer_for("position_embeddings"))
      position_table = mtf.rename_dimension(
          mtf.slice(full_position_table, 0, self.seq_dim.size,
                    self.max_position_embeddings_dim.name),
          self.max_position_embeddings_dim.name, self.seq_dim.name)
      output += position_table
    output = self.normalize(output)
    self.embedding_output = self._dropout(
        output, self.config.layer_output_dropout_prob)

  def _attention_bias(self, mesh, input_mask):
    """The bias added to attention logits: -10000 on padding, plus the
    relative position bias; None if neither applies."""
    biases = []
    if input_mask is not None:
      # [batch, memory_seq]
      memory_mask = mtf.replace_dimensions(input_mask, self.seq_dim,
                                           self.memory_seq_dim)
      biases.append((1.0 - mtf.to_float(memory_mask)) * -10000.0)
    if self.config.position_signal == "relative_attention_bias":
      buckets_dim = mtf.Dimension("buckets", 32)
      rp_bucket = relative_position_bucket(
          mtf.range(mesh, self.memory_seq_dim, tf.int32)
          - mtf.range(mesh, self.seq_dim, tf.int32),
          num_buckets=buckets_dim.size)
      bias_var = mtf.get_variable(
          mesh, "relative_attention_bias", [self.num_heads_dim, buckets_dim],
          initializer=tf.zeros_initializer())
      biases.append(mtf.gather(bias_var, rp_bucket, buckets_dim))
    return mtf.add_n(biases) if biases else None

  def _build_encoder(self, input_mask, mesh_shape, layout):
    """The blocks of layers; sets self.all_encoder_layers."""
    mesh = self.embedding_output.mesh
    attention_bias = self._attention_bias(mesh, input_mask)
    prev_layer_output = self.embedding_output
    self.all_encoder_layers = []
    for block_num in range(self.config.num_blocks):
      with tf.compat.v1.variable_scope("block_%d" % block_num):
        for layer_idx, layer_type in enumerate(self.config.block_layers):
          # The second attention layer of a block is "attention_1", ...
          count = self.config.block_layers[:layer_idx].count(layer_type)
          layer_name = f"{layer_type}_{count}" if count else layer_type
          with tf.compat.v1.variable_scope(layer_name):
            x = prev_layer_output
            if self.config.residual_structure == "direct":
              x = self.normalize(x)
            if layer_type == "attention":
              x = self.self_attention(x, attention_bias)
            elif layer_type == "feedforward":
              x = self.feedforward(x)
            else:
              x = self.moe(x, layout, mesh_shape, input_mask,
                           self._is_training)
            x = self._dropout(x, self.config.layer_output_dropout_prob)
            layer_output = prev_layer_output + x
            if self.config.residual_structure == "original":
              layer_output = self.normalize(layer_output)
            prev_layer_output = layer_output
      self.all_encoder_layers.append(prev_layer_output)

  def _dropout(self, x, prob):
    """Dropout with probability `prob` when training (layout-invariant:
    mtf's dropout masks come from counter-based random numbers)."""
    if not self._is_training or not prob:
      return x
    return mtf.dropout(x, is_training=True, keep_prob=1.0 - prob)

  def self_attention(self, x, attention_bias):
    """Multi-head self-attention with its output projection.

    Args:
      x: [batch, seq, hidden], the layer's input.
      attention_bias: None, or a float Tensor broadcastable to
        [batch, num_heads, seq, memory_seq], added to the logits (e.g. to
        mask out padding).

    Returns:
      a Tensor with the shape of x.

    The original applied the attention dropout only when its probability
    was 0 (a bug: never); here it applies when training with a probability
    above 0, as the parameter promises.
    """
    head_dims = [self.num_heads_dim, self.size_per_head_dim]
    memory = mtf.replace_dimensions(x, self.seq_dim, self.memory_seq_dim)

    def project(inputs, name):
      return mtf.layers.dense(
          inputs, reduced_dims=[self.model_dim], new_dims=head_dims,
          kernel_initializer=self.dense_initializer, name=name,
          use_bias=self.config.use_bias)

    queries = project(x, "query")
    keys = project(memory, "key")
    values = project(memory, "value")
    attention_scores = mtf.einsum([queries, keys],
                                  reduced_dims=[self.size_per_head_dim])
    attention_scores *= self.size_per_head_dim.size ** -0.5
    if attention_bias is not None:
      attention_scores += attention_bias
    attention_probs = mtf.softmax(attention_scores, self.memory_seq_dim)
    # Drops whole attended-to tokens, as in the Transformer paper.
    attention_probs = self._dropout(attention_probs,
                                    self.config.attention_probs_dropout_prob)
    output = mtf.einsum([attention_probs, values],
                        reduced_dims=[self.memory_seq_dim])
    output = mtf.layers.dense(
        output, reduced_dims=head_dims, new_dims=[self.model_dim],
        kernel_initializer=self.dense_initializer, name="output",
        use_bias=self.config.use_bias)
    return mtf.transpose(output, x.shape)

  def feedforward(self, x):
    """Dense -> activation (-> dropout) -> dense, back to the shape of x.

    The original ignored feedforward_intermediate_dropout_prob; here the
    hidden layer is dropped out with it when training.
    """
    intermediate = mtf.layers.dense(
        x, reduced_dims=[self.model_dim],
        new_dims=[self.feedforward_intermediate_dim],
        activation=get_activation(self.config.feedforward_intermediate_act),
        kernel_initializer=self.dense_initializer,
        name="dense_1", use_bias=self.config.use_bias)
    intermediate = self._dropout(
        intermediate, self.config.feedforward_intermediate_dropout_prob)
    return mtf.layers.dense(
        intermediate, reduced_dims=[self.feedforward_intermediate_dim],
        new_dims=[self.model_dim],
        kernel_initializer=self.dense_initializer,
        name="dense_2", use_bias=self.config.use_bias)

  def moe(self, x, layout, mesh_shape, input_mask, is_training):
    """A mixture-of-experts layer (the Transformer's
    `moe.transformer_moe_layer_v1`, top-2 gating).

    Its load-balancing loss joins `get_extra_loss()`.

    Args:
      x: the layer's input [batch, seq, hidden].
      layout: the layout rules (the gating groups split like the batch).
      mesh_shape: the mesh shape.
      input_mask: None or [batch, seq] (padding goes to no expert).
      is_training: a bool.

    Returns:
      a Tensor with the shape of x.
    """
    hparams = moe.HParams(
        moe_gating="top_2",
        moe_num_experts=self.config.moe_num_experts,
        moe_loss_coef=1e-3,
        moe_hidden_size=self.config.moe_intermediate_size,
        moe_group_size=getattr(self.config, "moe_group_size", 2048),
        moe_capacity_factor_train=1.25,
        moe_capacity_factor_eval=8.0,
        moe_use_second_place_loss=False,
        moe_second_policy_train="random",
        moe_second_policy_eval="random",
        moe_second_threshold_train=0.2,
        moe_second_threshold_eval=0.2)
    nonpadding = (mtf.cast(input_mask, tf.float32)
                  if input_mask is not None else None)
    layer_output, loss = moe.transformer_moe_layer_v1(
        inputs=x,
        output_dim=self.model_dim,
        hparams=hparams,
        train=is_training,
        variable_dtype=mtf.VariableDType(tf.float32, tf.float32, x.dtype),
        layout=layout,
        mesh_shape=mesh_shape,
        nonpadding=nonpadding,
        activation=get_activation(self.config.feedforward_intermediate_act))
    self._extra_losses.append(loss)
    return layer_output

  def get_masked_lm_output(self, positions, label_ids, label_weights):
    """Loss and logits of the masked language model.

    Args:
      positions: int32 [batch, num_predictions]: the masked positions.
      label_ids: int32 [batch, num_predictions]: the original tokens.
      label_weights: float [batch, num_predictions]: 1.0 for a real
        prediction, 0.0 for padding.

    Returns:
      (loss, per_example_loss [batch, num_predictions],
       logits [batch, num_predictions, vocab]); the loss is the
      label-weighted mean of the per-example cross-entropy, which includes
      a z-loss of 1e-4 * log(Z)^2.
    """
    input_tensor = mtf.gather(self.get_sequence_output(), positions,
                              self.seq_dim)
    output_weights = self.get_embedding_table()
    with tf.compat.v1.variable_scope("cls/predictions"):
      # One more non-linear transform, used only in pretraining.
      with tf.compat.v1.variable_scope("transform"):
        input_tensor = mtf.layers.dense(
            input_tensor,
            reduced_dims=[self.model_dim],
            new_dims=[self.model_dim],
            activation=get_activation(self.config.feedforward_intermediate_act),
            kernel_initializer=self.dense_initializer,
            use_bias=self.config.use_bias)
        input_tensor = self.normalize(input_tensor)
      # The output weights are the word embeddings; the bias is the head's.
      output_bias = mtf.get_variable(
          input_tensor.mesh, name="output_bias", shape=[self.vocab_dim],
          initializer=tf.zeros_initializer())
      logits = mtf.einsum([input_tensor, output_weights],
                          reduced_dims=[self.model_dim]) + output_bias
      per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
          logits, label_ids, self.vocab_dim, z_loss=1e-4)
      numerator = mtf.reduce_sum(label_weights * per_example_loss)
      denominator = mtf.reduce_sum(label_weights) + mtf.constant(
          input_tensor.mesh, 1e-5, dtype=tf.float32)
      loss = numerator / denominator
    return loss, per_example_loss, logits

  def get_next_sentence_output(self, labels):
    """Loss and logits of next-sentence prediction.

    Args:
      labels: int32 [batch]: 0 for "is the next sentence", 1 for "random".

    Returns:
      (mean loss, per_example_loss [batch], logits [batch, class]); the
      cross-entropy includes a z-loss of 1e-4 * log(Z)^2.
    """
    class_dim = mtf.Dimension("class", 2)
    logits = mtf.layers.dense(
        self.get_pooled_output(),
        reduced_dims=[self.model_dim],
        new_dims=[class_dim],
        kernel_initializer=self.dense_initializer,
        name="cls/seq_relationship",
        use_bias=self.config.use_bias)
    per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, labels, class_dim, z_loss=1e-4)
    loss = mtf.reduce_mean(per_example_loss)
    return loss, per_example_loss, logits

  def get_pooled_output(self):
    """[batch, hidden]: tanh(dense(first token's final hidden state))."""
    return self.pooled_output

  def get_sequence_output(self):
    """[batch, seq, hidden]: the encoder's final hidden states."""
    return self.sequence_output

  def get_all_encoder_layers(self):
    """The output of each block, a list of [batch, seq, hidden]."""
    return self.all_encoder_layers

  def get_word_embedding_output(self):
    """[batch, seq, hidden]: the word embeddings alone (before token type
    and position embeddings are added)."""
    return self.word_embedding_output

  def get_embedding_output(self):
    """[batch, seq, hidden]: the encoder's input (summed embeddings,
    normalized, dropped out)."""
    return self.embedding_output

  def normalize(self, x):
    """Layer normalization over hidden (mean subtracted and bias added only
    with config.use_bias)."""
    return layer_norm(x, self.model_dim,
                      subtract_mean=self.config.use_bias,
                      use_bias=self.config.use_bias)

  def get_embedding_table(self):
    """[vocab, hidden]: the word embeddings (also the masked-LM weights)."""
    return self.embedding_table

  def get_extra_loss(self):
    """The MoE layers' load-balancing losses summed (0 without MoE)."""
    return mtf.add_n(self._extra_losses)

  @property
  def vocab_dim(self):
    # Padded to a multiple of 128 so that it splits over the mesh; the
    # padding ids are never inputs or labels.
    n = self.config.vocab_size
    return mtf.Dimension("vocab", n + (-n % 128))

  @property
  def model_dim(self):
    return mtf.Dimension("hidden", self.config.d_model)

  @property
  def token_type_vocab_dim(self):
    return mtf.Dimension("token_type_vocab", self.config.type_vocab_size)

  @property
  def feedforward_intermediate_dim(self):
    return mtf.Dimension("intermediate",
                         self.config.feedforward_intermediate_size)

  @property
  def num_heads_dim(self):
    return mtf.Dimension("num_heads", self.config.attention_num_heads)

  @property
  def softmax_heads_dims(self):
    return self.num_heads_dim

  @property
  def max_position_embeddings_dim(self):
    return mtf.Dimension("max_position_embeddings",
                         self.config.max_position_embeddings)

  @property
  def seq_dim(self):
    return self._seq_dim

  @property
  def memory_seq_dim(self):
    return self._memory_seq_dim

  @property
  def dense_initializer(self):
    """Truncated normal (stddev initializer_range) if that is set, else
    variance scaling (scale 0.4); either is seeded by the variable name."""
    if self.config.initializer_range:
      return _TruncatedNormal(self.config.initializer_range)
    return mtf.layers.VarianceScalingInitializer(scale=0.4)

  @property
  def embedding_initializer(self):
    """The initializer of the embedding tables: the dense initializer, with
    variance scaling taken as for a [hidden -> vocab] classifier (the word
    embeddings are also the masked-LM output weights)."""
    initializer = self.dense_initializer
    if isinstance(initializer, _TruncatedNormal):
      return initializer
    return initializer(reduced_dims=[self.model_dim],
                       new_dims=[self.vocab_dim])

  def _embedding_initializer_for(self, name):
    """embedding_initializer, seeded by the name of variable `name`."""
    initializer = self.dense_initializer
    if isinstance(initializer, _TruncatedNormal):
      return initializer.for_variable(name)
    return initializer([self.model_dim], [self.vocab_dim],
                       default_seed=tf_initializers.name_seed(name))

  @property
  def size_per_head_dim(self):
    """Size of each head's queries, keys and values ("attention_head")."""
    if self.config.attention_head_size:
      size = self.config.attention_head_size
    else:
      if self.model_dim.size % self.num_heads_dim.size:
        raise ValueError(
            f"The hidden size ({self.model_dim.size}) is not a multiple of "
            f"the number of attention heads ({self.num_heads_dim.size}).")
      size = self.model_dim.size // self.num_heads_dim.size
    return mtf.Dimension("attention_head", size)

  @property
  def key_dim(self):
    if self.config.attention_key_head_size is None:
      raise ValueError("The key head size is not defined "
                       "(config.attention_key_head_size).")
    return mtf.Dimension("d_k", self.config.attention_key_head_size)

  @property
  def key_heads_dims(self):
    if self.config.attention_num_key_heads is None:
      raise ValueError("The number of key heads is not defined "
                       "(config.attention_num_key_heads).")
    return mtf.Dimension("key_heads", self.config.attention_num_key_heads)

  @property
  def value_dim(self):
    if self.config.attention_value_head_size is None:
      raise ValueError("The value head size is not defined "
                       "(config.attention_value_head_size).")
    return mtf.Dimension("d_v", self.config.attention_value_head_size)

  @property
  def value_heads_dims(self):
    if self.config.attention_num_value_heads is None:
      raise ValueError("The number of value heads is not defined "
                       "(config.attention_num_value_heads).")
    return mtf.Dimension("value_heads", self.config.attention_num_value_heads)


def get_activation(activation_string):
  """The mtf function named by `activation_string` ("gelu", "relu",
  "tanh"); None for None, "" or "linear"; a non-string is returned as is.

  Raises:
    ValueError: an unknown name.
  """
  if not isinstance(activation_string, str):
    return activation_string
  if not activation_string:
    return None
  act = activation_string.lower()
  if act == "linear":
    return None
  activations = {"gelu": mtf.gelu, "relu": mtf.relu, "tanh": mtf.tanh}
  if act not in activations:
    raise ValueError(f"Unsupported activation: {act!r}; expected one of "
                     f"{sorted(activations) + ['linear']}.")
  return activations[act]


def get_assignment_map_from_checkpoint(tvars, init_checkpoint):
  """The variables of `tvars` that `init_checkpoint` holds, by name.

  Optimizer slots ("adam_", "slot_") and the global step are left out.

  Args:
    tvars: variables (anything with a `.name`, ":0" suffixes ignored).
    init_checkpoint: a checkpoint prefix or directory.

  Returns:
    (assignment_map {checkpoint name: variable name},
     initialized_variable_names {name: 1 and name + ":0": 1}).
  """
  name_to_variable = collections.OrderedDict()
  for var in tvars:
    name = var.name
    m = re.match("^(.*):\\d+$", name)
    if m is not None:
      name = m.group(1)
    if "global_step" in name or "adam_" in name or "slot_" in name:
      continue
    name_to_variable[name] = var
  logging.info("init_checkpoint: %s", init_checkpoint)
  assignment_map = collections.OrderedDict()
  initialized_variable_names = {}
  for name, _ in tf.train.list_variables(init_checkpoint):
    if name not in name_to_variable:
      continue
    assignment_map[name] = name
    initialized_variable_names[name] = 1
    initialized_variable_names[name + ":0"] = 1
  return assignment_map, initialized_variable_names


def layer_norm(x, dim, epsilon=1e-6, subtract_mean=True, use_scale=True,
               use_bias=True, name=None):
  """Layer normalization over `dim`.

  y = (x - mean) / sqrt(var + epsilon) * scale + bias, where the mean is
  subtracted only with `subtract_mean` (else var is the mean square), and
  scale (ones) and bias (zeros) are the variables "<name>/scale" and
  "<name>/bias" of shape [dim].

  Args:
    x: an mtf Tensor with dimension `dim`.
    dim: an mtf Dimension.
    epsilon: a float.
    subtract_mean: a bool.
    use_scale: a bool.
    use_bias: a bool.
    name: the variable scope; default "layer_norm" (made unique in its
      scope).

  Returns:
    an mtf Tensor like x.
  """
  with layer_helpers.variable_scope(x.mesh, name, "layer_norm"):
    if subtract_mean:
      x -= mtf.reduce_mean(x, reduced_dim=dim)
    variance = mtf.reduce_mean(mtf.square(x), reduced_dim=dim)
    x *= mtf.rsqrt(variance + epsilon)
    if use_scale:
      x *= mtf.get_variable(x.mesh, "scale", mtf.Shape([dim]),
                            initializer=tf.ones_initializer(),
                            activation_dtype=x.dtype)
    if use_bias:
      x += mtf.get_variable(x.mesh, "bias", mtf.Shape([dim]),
                            initializer=tf.zeros_initializer(),
                            activation_dtype=x.dtype)
    return x
