"""Local self-attention: each position attends to the `radius` around it.

Re-exported by `transformer_layers`; gin knows it under that module.

Where this differs from the original: long sequences go through
`local_attention_1d` with the model's own split of the length dimension
(the original passed an argument local_attention_1d does not take, and
one split); `full_attention_max_length` (ours, last) sets where that starts.
"""

import gin
import mesh_tensorflow as mtf
import tensorflow as tf

from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer.layers import self_attention_layers
from mesh_tensorflow.transformer import transformer


@gin.configurable(module="mesh_tensorflow.transformer.transformer_layers")
class LocalSelfAttention(self_attention_layers.SelfAttention):
  """Multi-head local self-attention.

  A position p sees memory positions in (p - radius, p] when the model is
  fully autoregressive, else in (p - radius, p + radius]. Short sequences
  (up to `full_attention_max_length`, by default max(256, 4 * radius)) use
  full attention with that window as a mask; longer ones
  `attention.local_attention_1d`, whose blocks follow a split of the length
  dimension over the mesh (halo exchange with the neighbours). For
  decoding, the state is the keys and values of the last `radius`
  positions, in a ring buffer of dimension "window".
  """

  def __init__(self,
               radius=128,
               num_heads=8,
               num_memory_heads=0,
               key_value_size=128,
               shared_kv=False,
               dropout_rate=0.0,
               attention_kwargs=None,
               full_attention_max_length=None):
    """Records the hyperparameters.

    Args:
      radius: an integer, the window size.
      num_heads: see SelfAttention.
      num_memory_heads: see SelfAttention.
      key_value_size: see SelfAttention.
      shared_kv: see SelfAttention.
      dropout_rate: see SelfAttention.
      attention_kwargs: see SelfAttention.
      full_attention_max_length: an optional integer (ours): the longest
        length computed with masked full attention; None means the
        original's max(256, 4 * radius).
    """
    super().__init__(num_heads, num_memory_heads, key_value_size, shared_kv,
                     dropout_rate, attention_kwargs)
    self.radius = radius
    self.full_attention_max_length = full_attention_max_length

  def call(self, context, x, losses=None):
    """Applies local self-attention to x."""
    del losses
    params = self.make_params(context)
    q = params.compute_q(x)
    if self.shared_kv:
      k = v = params.compute_kv(x)
    else:
      k = params.compute_k(x)
      v = params.compute_v(x)
    full_max = self.full_attention_max_length
    if full_max is None:
      full_max = max(256, self.radius * 4)
    if context.mode == transformer.INCREMENTAL:
      o, k, v = self._incremental_attention(context, q, k, v)
    elif context.length_dim.size <= full_max:
      memory_position = self.rename_length_to_memory_length(
          self_attention_layers._position(context), context)  # pylint: disable=protected-access
      o = attention.attention(
          q, self.rename_length_to_memory_length(k, context),
          self.rename_length_to_memory_length(v, context),
          self.memory_length(context), self.kv_dim, self.kv_dim,
          self.compute_bias(context, memory_position, x,
                            params.query_heads_dims, q),
          **self.attention_kwargs_from_context(context))
    else:
      o = attention.local_attention_1d(
          q=q,
          k=k,
          v=None if self.shared_kv else v,
          length_dim=context.length_dim,
          key_dim=self.kv_dim,
          value_dim=self.kv_dim,
          fully_autoregressive=context.model.fully_autoregressive,
          length_dim_num_splits=_num_splits(context, context.length_dim),
          radius=self.radius,
          sequence_id=context.sequence_id,
          write_priority=context.write_priority,
          read_priority=context.read_priority,
          attention_kwargs=self.attention_kwargs_from_context(context))
    if context.mode == transformer.FIRST_PART:
      self._record_first_part_states(context, x, k, v)
    return params.compute_output(o, output_shape=x.shape)

  def _incremental_attention(self, context, q, k, v):
    """One decoding step: writes k and v into the ring buffer at position
    mod radius and attends over the filled slots."""
    if self.shared_kv:
      prev_k, = context.get_states(1)
      prev_v = prev_k
    else:
      prev_k, prev_v = context.get_states(2)
    window_pos = mtf.range(context.mesh, self.window_dim, tf.int32)
    current = mtf.equal(window_pos, mtf.mod(context.position, self.radius))
    k = mtf.where(current, k, prev_k, output_shape=prev_k.shape)
    if self.shared_kv:
      v = k
      context.record_new_states([k])
    else:
      v = mtf.where(current, v, prev_v, output_shape=prev_v.shape)
      context.record_new_states([k, v])
    # Slot j holds the position p' = j (mod radius) in (p - radius, p]; it
    # exists once p >= j.
    visible = mtf.greater_equal(context.position, window_pos)
    bias = attention.visibility_mask_to_attention_bias(
        visible, context.activation_dtype)
    o = attention.attention(q, k, v, self.window_dim, self.kv_dim,
                            self.kv_dim, bias,
                            **self.attention_kwargs_from_context(context))
    return o, k, v

  def _record_first_part_states(self, context, x, k, v):
    """The ring buffer after the positions before initial_position."""
    window_pos = mtf.range(context.mesh, self.window_dim, tf.int32)
    pos = mtf.range(context.mesh, context.length_dim, tf.int32)
    select_recent = mtf.cast(
        mtf.equal(mtf.mod(pos, self.radius), window_pos), x.dtype)
    select_recent *= mtf.cast(
        mtf.less(pos, context.initial_position), x.dtype)
    select_recent *= mtf.cast(
        mtf.greater_equal(pos, context.initial_position - self.radius),
        x.dtype)
    state_shape = (k.shape - [context.length_dim, self.kv_dim]
                   + [self.window_dim, self.kv_dim])
    states = [mtf.einsum([k, select_recent], output_shape=state_shape,
                         reduced_dims=[context.length_dim])]
    if not self.shared_kv:
      states.append(mtf.einsum([v, select_recent], output_shape=state_shape,
                               reduced_dims=[context.length_dim]))
    context.record_new_states(states)

  def min_relative_position(self, context):
    del context
    return 1 - self.radius

  def max_relative_position(self, context):
    return None if context.model.fully_autoregressive else self.radius

  @property
  def window_dim(self):
    return mtf.Dimension("window", self.radius)


def _num_splits(context, dim):
  """In how many parts the model's layout splits `dim` (1 if unknown)."""
  layout = getattr(context.model, "layout", None)
  mesh_shape = getattr(context.model, "mesh_shape", None)
  if not layout or not mesh_shape:
    return 1
  return mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, dim)
