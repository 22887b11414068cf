"""Attention whose projections are computed by a mixture of experts.

`ExpertsAttentionParams` (re-exported from `attention`) replaces the q and
kv projections of multi-head attention with an `moe.MoE1D` layer: with
expert computation "qkv" one MoE computes the queries and the shared keys
and values from the same antecedent (its experts' hidden layer is shared,
their output layers "q_wo" and "k_wo" are not); with "q" only the queries
come from experts (keys and values from a "kv" variable); with "kv" only the
keys and values (queries from a "q" variable). The output projection "o" is
the usual one. The MoE's balancing loss goes to `context.losses`.
"""

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layers import multihead_attention
from mesh_tensorflow.transformer import moe

# pylint: disable=protected-access
EXPERT_COMPUTATIONS = ("qkv", "q", "kv")


class ExpertsAttentionParams(multihead_attention.AttentionParams):
  """AttentionParams whose q and/or kv come from a mixture of experts.

  Requires combine_dims=True and shared_kv=True (keys and values are one
  projection), as the original did.

  Args (its signature takes AttentionParams' first, less
  make_attention_vars: see `multihead_attention.extends_params`):
    context: the transformer.Context of the call (the MoE needs it).
    experts_hparams: an moe.HParams with the MoE1D settings: moe_gating,
      num_experts, loss_coef, group_size, min_expert_capacity,
      capacity_factor_train / _eval, switch_policy_train / _eval,
      switch_dropout, switch_temperature, switch_jitter, ntlb_top_k,
      hidden_size, activation, z_loss.
    expert_computation: "qkv", "q" or "kv" (see the module docstring).
  """

  @multihead_attention.extends_params(omit=("make_attention_vars",))
  def __init__(self, base, context=None, experts_hparams=None,
               expert_computation="qkv"):
    if expert_computation not in EXPERT_COMPUTATIONS:
      raise ValueError(
          f"ExpertsAttentionParams: invalid expert_computation "
          f"{expert_computation!r}; expected one of {EXPERT_COMPUTATIONS}.")
    if not base["combine_dims"]:
      raise ValueError("ExpertsAttentionParams needs combine_dims=True.")
    if not base["shared_kv"]:
      raise ValueError("ExpertsAttentionParams needs shared_kv=True (the "
                       "experts compute one projection for keys and "
                       "values).")
    if mtf.layers.unit_scaling_convention():
      raise NotImplementedError(
          "ExpertsAttentionParams does not support the unit-scaling "
          "convention.")
    if experts_hparams is None or context is None:
      raise ValueError("ExpertsAttentionParams needs a context and "
                       "experts_hparams.")
    super().__init__(**base, make_attention_vars=False)
    self.context = context
    self.expert_computation = expert_computation
    if expert_computation == "q":
      self.wkv = mtf.get_variable(
          self.mesh, "kv", self.k_shape,
          initializer=multihead_attention._seeded_normal_initializer(
              "kv", self.memory_input_dim.size ** -0.5),
          dtype=self.variable_dtype)
    elif expert_computation == "kv":
      self.wq = mtf.get_variable(
          self.mesh, "q", self.q_shape,
          initializer=multihead_attention._seeded_normal_initializer(
              "q", self.query_input_dim.size ** -0.5),
          dtype=self.variable_dtype)
    q_size, k_size = self.q_shape[-1].size, self.k_shape[-1].size
    if expert_computation == "qkv" and q_size != k_size:
      raise ValueError(
          "ExpertsAttentionParams (expert_computation 'qkv'): the experts "
          f"compute queries ({q_size} channels) and keys ({k_size}) with one "
          "output size; use as many memory heads as query heads.")
    h = experts_hparams
    # The experts' output is the combined heads dimension; it is named
    # "d_model" inside the MoE so that a layout splitting "heads" does not
    # also split the experts' output (which is split by expert).
    self.moe_layer = moe.MoE1D(
        moe_gating=h.moe_gating, num_experts=h.num_experts,
        loss_coef=h.loss_coef, group_size=h.group_size,
        min_expert_capacity=h.min_expert_capacity,
        capacity_factor_train=h.capacity_factor_train,
        capacity_factor_eval=h.capacity_factor_eval,
        switch_policy_train=h.switch_policy_train,
        switch_policy_eval=h.switch_policy_eval,
        switch_dropout=h.switch_dropout,
        switch_temperature=h.switch_temperature,
        switch_jitter=h.switch_jitter, ntlb_top_k=h.ntlb_top_k,
        hidden_size=h.hidden_size,
        output_dim=mtf.Dimension(
            "d_model", k_size if expert_computation == "kv" else q_size),
        use_experts_attention=expert_computation == "qkv",
        activation=h.activation, z_loss=h.z_loss)
    self._q = None
    self._k = None
    self._query_antecedent = None

  def _from_experts(self, t, dims):
    """Views the experts' output (last dimension "d_model", combined heads)
    as heads + key dimensions."""
    return mtf.replace_dimensions(t, t.shape.dims[-1], dims)

  def compute_q(self, query_antecedent):
    """The queries (scaled by key_dim^-0.5); with "qkv", the keys too."""
    if self.expert_computation == "kv":
      q = mtf.layers.us_einsum([query_antecedent, self.wq],
                               reduced_dims=[self.query_input_dim])
    else:
      out = self.moe_layer.call(self.context, query_antecedent)
      if self.expert_computation == "qkv":
        q, k = out
        self._k = self._from_experts(k, self.k_dims)
        self._query_antecedent = query_antecedent
      else:
        q = out
    q *= self.key_dim.size ** -0.5
    self._q = self._from_experts(q, self.q_dims)
    return self._q

  def compute_kv(self, memory_antecedent):
    """The shared keys and values.

    With "qkv" they were computed with the queries, from the query
    antecedent; `memory_antecedent` must be that antecedent, possibly with
    its length dimension renamed (self-attention's "memory_length"), and
    the keys get its dimensions.
    """
    if self.expert_computation == "q":
      k = mtf.layers.us_einsum([memory_antecedent, self.wkv],
                               reduced_dims=[self.memory_input_dim])
      return self._from_experts(k, self.k_dims)
    if self.expert_computation == "kv":
      return self._from_experts(
          self.moe_layer.call(self.context, memory_antecedent), self.k_dims)
    if self._k is None:
      raise ValueError("ExpertsAttentionParams (expert_computation 'qkv'): "
                       "call compute_q before compute_kv.")
    query_dims = self._query_antecedent.shape.dims
    memory_dims = memory_antecedent.shape.dims
    if [d.size for d in query_dims] != [d.size for d in memory_dims]:
      raise ValueError(
          "ExpertsAttentionParams (expert_computation 'qkv') computes keys "
          "from the queries' antecedent "
          f"{self._query_antecedent.shape}, so it cannot attend to "
          f"{memory_antecedent.shape}; use expert_computation 'q' or 'kv' "
          "to attend to another sequence.")
    k = self._k
    for old, new in zip(query_dims[:-1], memory_dims[:-1]):
      if old != new:
        k = mtf.replace_dimensions(k, old, new)
    return k

  def compute_k(self, memory_antecedent):
    """The keys (the shared projection: see compute_kv)."""
    return self.compute_kv(memory_antecedent)

  def compute_v(self, memory_antecedent):
    del memory_antecedent
    raise NotImplementedError(
        "ExpertsAttentionParams uses shared_kv=True: use compute_kv.")
