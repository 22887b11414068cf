"""Self- and encoder-decoder attention with mixture-of-experts projections.

Re-exported by `transformer_layers` (and registered with gin there under
the original's names). See `experts_attention_params` for the computation.
"""

import gin

from mesh_tensorflow.transformer import moe
from mesh_tensorflow.transformer.layers import experts_attention_params
from mesh_tensorflow.transformer.layers import self_attention_layers

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"


@gin.configurable(module=_GIN_MODULE)
class ExpertsSelfAttention(self_attention_layers.SelfAttention):
  """Self-attention whose projections are computed by a mixture of experts.

  Takes SelfAttention's arguments (**kwargs; shared_kv defaults to True,
  which the experts need) and the MoE's:

  Args:
    num_experts, loss_coef, group_size, capacity_factor_train,
      capacity_factor_eval, moe_gating, min_expert_capacity,
      switch_policy_train, switch_policy_eval, switch_dropout,
      switch_temperature, switch_jitter, hidden_size: as for moe.MoE1D.
    switch_top_k: MoE1D's ntlb_top_k (for moe_gating "ntlb").
    use_experts_attention: the experts compute queries and keys together
      (expert computation "qkv"); False: only the queries ("q").
    activation: the experts' activation.
    z_loss: the router z-loss coefficient, or None.
    expert_computation: "qkv", "q" or "kv"; overrides
      use_experts_attention.
    **kwargs: SelfAttention's arguments.
  """

  def __init__(self,
               num_experts=16,
               loss_coef=1e-2,
               group_size=1024,
               capacity_factor_train=1.25,
               capacity_factor_eval=2.0,
               moe_gating="switch",
               min_expert_capacity=4,
               switch_policy_train="input_jitter",
               switch_policy_eval="input_jitter",
               switch_dropout=0.0,
               switch_temperature=1.0,
               switch_jitter=1e-2,
               switch_top_k=4,
               hidden_size=3072,
               use_experts_attention=True,
               activation="relu",
               z_loss=None,
               expert_computation=None,
               **kwargs):
    kwargs.setdefault("shared_kv", True)
    super().__init__(**kwargs)
    if expert_computation is None:
      expert_computation = "qkv" if use_experts_attention else "q"
    self.expert_computation = expert_computation
    self._hparams = moe.HParams(
        moe_gating=moe_gating, num_experts=num_experts, loss_coef=loss_coef,
        group_size=group_size, min_expert_capacity=min_expert_capacity,
        capacity_factor_train=capacity_factor_train,
        capacity_factor_eval=capacity_factor_eval,
        switch_policy_train=switch_policy_train,
        switch_policy_eval=switch_policy_eval, switch_dropout=switch_dropout,
        switch_temperature=switch_temperature, switch_jitter=switch_jitter,
        ntlb_top_k=switch_top_k, hidden_size=hidden_size,
        activation=activation, z_loss=z_loss)

  def make_params(self, context):
    """The layer's ExpertsAttentionParams (heads as in SelfAttention)."""
    # pylint: disable=protected-access
    return self_attention_layers._attention_params(
        experts_attention_params.ExpertsAttentionParams, type(self).__name__,
        context, self.kv_dim, self.num_heads, self.num_memory_heads,
        shared_kv=self.shared_kv,
        no_query=False,
        combine_dims=self.combine_dims,
        keep_query_heads_dims=self.keep_query_heads_dims,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer,
        context=context,
        experts_hparams=self._hparams,
        expert_computation=self.expert_computation)


@gin.configurable(module=_GIN_MODULE)
class ExpertsEncDecAttention(self_attention_layers.EncDecMixin,
                             ExpertsSelfAttention):
  """Attention over the encoder output with mixture-of-experts projections.

  Keys and values must come from the encoder output, so the expert
  computation defaults to "q" (experts compute the queries, a "kv"
  variable the keys and values) or may be "kv"; "qkv" (keys from the
  decoder's input, as the original computed them) is refused.
  """

  def __init__(self, relative_attention_type=None, **kwargs):
    kwargs.setdefault("expert_computation", "q")
    super().__init__(relative_attention_type=relative_attention_type,
                     **kwargs)

  def call(self, context, x, losses=None):
    """Attends from x to the encoder output."""
    return self_attention_layers.enc_dec_attention(
        self, self._get_memory_antecedent(context), context, x, losses,
        attention_fn=self.attention_fn)
