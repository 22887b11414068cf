"""Gating functions of the mixture-of-experts layers (see `moe`).

A gating function looks at a group of tokens, [<batch dims>, group, d_model],
and decides which expert(s) each token goes to and in which of the expert's
`expert_capacity` slots it sits. It returns

- `dispatch_tensor`: 1.0 where a token is sent to (expert, slot), else 0.0;
- `combine_tensor`: the weight with which that slot's output comes back;
- `loss`: a scalar load-balancing loss (times experts^2, so that a perfectly
  balanced router scores 1.0), to be scaled by the layer's loss coefficient.

Both tensors have the dimensions [<batch dims>, group, experts, capacity] (in
some order). Slots are filled in token order, so a token that finds its
expert full is dropped (its output from that expert is zero).

Every function runs its internals in float32, and its randomness (the
"random" second-expert policy, input jitter, sampling, dropout) comes from
mtf's counter-based random ops, so the routing is the same under every mesh
and layout.

`importance` (optional, [<batch dims>, group]) is 1.0 for a real token, 0.0
for padding, and 0.5 for a token a hierarchical MoE routed to its
second-choice group: such tokens get at most one expert.
"""

import tensorflow as tf

import mesh_tensorflow as mtf

from absl import logging


def _hparam(hparams, name, default):
  """hparams.name, or `default` for HParams made by set_default_moe_hparams
  (which lacks the newer settings)."""
  return getattr(hparams, name, default)


def _policy(hparams, train, prefix):
  return _hparam(hparams, f"{prefix}_{'train' if train else 'eval'}", None)


def _float_mask(cond):
  return mtf.cast(cond, tf.float32)


def _divide_by_microbatches(loss, num_microbatches):
  """Each microbatch adds its own loss: divide so that the sum is the
  full-batch loss."""
  if num_microbatches and num_microbatches > 1:
    logging.info("Dividing load-balance loss by num_microbatches=%d",
                 num_microbatches)
    loss /= float(num_microbatches)
  return loss


def _router_z_loss(logits, experts_dim, num_microbatches, importance=None):
  """Mean squared log-partition of the router logits over real tokens.

  Keeps the router's logits small, which makes training more stable (ST-MoE).

  Args:
    logits: [<batch dims>, group, experts] router logits.
    experts_dim: the experts Dimension of `logits`.
    num_microbatches: the loss is divided by it (None or 1: not divided).
    importance: optional [<batch dims>, group]; only tokens of importance
      1.0 count.

  Returns:
    a scalar.
  """
  log_z = mtf.reduce_logsumexp(mtf.to_float(logits), experts_dim)
  z_loss = mtf.square(log_z)
  if importance is not None:
    real = _float_mask(mtf.equal(importance, 1.0))
    z_loss *= real
    count = mtf.reduce_sum(real)
  else:
    count = float(log_z.shape.size)
  return mtf.reduce_sum(z_loss) / (count * float(num_microbatches or 1))


def _perturb_gate_inputs(gate_inputs, policy, train, hparams,
                         allow_dropout=True):
  """Exploration noise on the router's input: "input_jitter" multiplies it
  by uniform noise in [1 - eps, 1 + eps) while training; "input_dropout"
  applies dropout (training only)."""
  if allow_dropout and policy == "input_dropout":
    return mtf.dropout(gate_inputs, is_training=train,
                       keep_prob=1.0 - _hparam(hparams, "moe_switch_dropout",
                                               0.1))
  if train and policy == "input_jitter":
    return mtf.layers.multiplicative_jitter(
        gate_inputs, _hparam(hparams, "moe_switch_jitter", 1e-2))
  return gate_inputs


def _router_logits(gate_inputs, experts_dim, outer_expert_dims,
                   variable_dtype, name):
  """The router: a bias-free dense layer to the experts (variable
  f"{name}/kernel")."""
  return mtf.layers.dense(
      gate_inputs, experts_dim, reduced_dims=gate_inputs.shape.dims[-1:],
      use_bias=False, expert_dims=outer_expert_dims,
      variable_dtype=variable_dtype, name=name)


def _balance_loss(mask, gates, group_size_dim, experts_dim):
  """experts^2 * mean(fraction of tokens sent to each expert * its mean gate
  probability): 1.0 when the router is balanced, up to `experts` when one
  expert takes everything."""
  density = mtf.reduce_mean(mask, reduced_dim=group_size_dim)
  density_proxy = mtf.reduce_mean(gates, reduced_dim=group_size_dim)
  return (mtf.reduce_mean(density * density_proxy)
          * float(experts_dim.size * experts_dim.size))


def _add_z_loss(loss, gate_logits, experts_dim, hparams, train,
                num_microbatches, importance, name):
  z_coef = _hparam(hparams, "moe_z_loss", None)
  if not train or z_coef is None:
    return loss
  z_loss = _router_z_loss(gate_logits, experts_dim, num_microbatches,
                          importance)
  mtf.scalar_summary(name + "/z_loss", z_loss)
  return loss + z_coef * z_loss


def _summarize(name, raw_gates, experts_dim, loss, masks):
  """Training summaries: router entropy, the auxiliary loss and, for each
  (prefix, mask [.., experts]) in `masks`, each expert's share of tokens."""
  entropy = mtf.reduce_sum(-raw_gates * mtf.log(raw_gates + 1e-9),
                           reduced_dim=experts_dim)
  mtf.scalar_summary(name + "/entropy", mtf.reduce_mean(entropy))
  mtf.scalar_summary("aux_loss", mtf.reduce_mean(loss))
  for prefix, mask in masks:
    per_expert = mtf.reduce_sum(mask, output_shape=[experts_dim])
    fraction = per_expert / (mtf.reduce_sum(per_expert) + 1e-9)
    for i, part in enumerate(mtf.split(fraction, experts_dim,
                                       experts_dim.size)):
      mtf.scalar_summary(f"{prefix}experts/{i}", mtf.reduce_mean(part))


def _finish(combine_tensor, loss, dtype, dispatch_from=None):
  """Casts to the activation dtype; dispatch is where combine (or
  `dispatch_from`) is nonzero."""
  combine_tensor = mtf.cast(combine_tensor, dtype)
  source = combine_tensor if dispatch_from is None else dispatch_from
  dispatch_tensor = mtf.cast(mtf.not_equal(source, 0.0), dtype)
  return dispatch_tensor, combine_tensor, mtf.cast(loss, dtype)


def _slot_one_hot(position, expert_capacity_dim):
  return mtf.one_hot(mtf.to_int32(position), expert_capacity_dim,
                     dtype=tf.float32)


def _top_2_gating(inputs, outer_expert_dims, experts_dim, expert_capacity_dim,
                  hparams, train, variable_dtype, importance=None,
                  name="top_2_gating", num_microbatches=None):
  """Top-2 gating (GShard): each token goes to its best expert and maybe to
  its second best.

  Gates of the two are renormalised to sum to one. First choices fill the
  experts' slots first (in token order), second choices take what is left.
  Whether a second choice is used at all depends on the policy
  (`moe_second_policy_train` / `_eval`): "all", "none", "threshold" (its
  renormalised gate exceeds `moe_second_threshold_*`) or "random" (with
  probability min(1, gate / threshold)).

  Args:
    inputs: [<batch dims>, group, d_model].
    outer_expert_dims: None, or the expert dims of an outer level (a router
      per outer expert).
    experts_dim: the Dimension of experts (not split: every processor
      routes its own groups).
    expert_capacity_dim: the Dimension of slots per expert and group.
    hparams: an HParams (moe_use_second_place_loss, the policies and
      thresholds, moe_z_loss).
    train: a bool.
    variable_dtype: an mtf.VariableDType.
    importance: optional [<batch dims>, group] (see the module docstring).
    name: the router's variable scope.
    num_microbatches: the loss is divided by it.

  Returns:
    dispatch_tensor, combine_tensor ([<batch dims>, group, experts,
    capacity]) and the balancing loss.

  Raises:
    ValueError: an unknown second-expert policy.
  """
  group_size_dim = inputs.shape.dims[-2]
  if train:
    policy = hparams.moe_second_policy_train
    threshold = hparams.moe_second_threshold_train
  else:
    policy = hparams.moe_second_policy_eval
    threshold = hparams.moe_second_threshold_eval
  if policy not in ("all", "none", "threshold", "random"):
    raise ValueError(f"{name}: unknown second-expert policy {policy!r}; "
                     "expected 'all', 'none', 'threshold' or 'random'.")
  gate_logits = _router_logits(mtf.to_float(inputs), experts_dim,
                               outer_expert_dims, variable_dtype, name)
  raw_gates = mtf.softmax(gate_logits, experts_dim)
  capacity = float(expert_capacity_dim.size)

  gate_1, index_1 = mtf.top_1(raw_gates, experts_dim)
  mask_1 = mtf.one_hot(index_1, experts_dim, dtype=tf.float32)
  density_1_proxy = raw_gates
  if importance is not None:
    # Only full-importance tokens get a first choice.
    full = _float_mask(mtf.equal(importance, 1.0))
    mask_1 *= full
    gate_1 *= full
    density_1_proxy *= full
  gates_without_top_1 = raw_gates * (1.0 - mask_1)
  gate_2, index_2 = mtf.top_1(gates_without_top_1, experts_dim)
  mask_2 = mtf.one_hot(index_2, experts_dim, dtype=tf.float32)
  if importance is not None:
    mask_2 *= _float_mask(mtf.greater(importance, 0.0))
  denom = gate_1 + gate_2 + 1e-9
  gate_1 /= denom
  gate_2 /= denom

  loss = _balance_loss(mask_1, density_1_proxy, group_size_dim, experts_dim)
  if _hparam(hparams, "moe_use_second_place_loss", False):
    # The same balance for second choices, with the gates renormalised
    # after removing the first choice as the continuous proxy.
    normalized = gates_without_top_1 / (
        mtf.reduce_sum(gates_without_top_1, reduced_dim=experts_dim) + 1e-9)
    loss += 0.5 * _balance_loss(mask_2, normalized, group_size_dim,
                                experts_dim)
  loss = _divide_by_microbatches(loss, num_microbatches)
  loss = _add_z_loss(loss, gate_logits, experts_dim, hparams, train,
                     num_microbatches, importance, name)

  if policy == "none":
    mask_2 = mtf.zeros_like(mask_2)
  elif policy == "threshold":
    mask_2 *= _float_mask(mtf.greater(gate_2, threshold))
  elif policy == "random":
    uniform = mtf.random_uniform(gate_2.mesh, gate_2.shape,
                                 name=name + "_second_expert")
    mask_2 *= _float_mask(mtf.less(uniform, gate_2 / max(threshold, 1e-9)))

  # Slot of each first choice: how many earlier tokens of the group chose
  # the same expert; those beyond capacity are dropped.
  position_1 = mtf.cumsum(mask_1, group_size_dim, exclusive=True) * mask_1
  mask_1 *= _float_mask(mtf.less(position_1, capacity))
  count_1 = mtf.reduce_sum(mask_1, reduced_dim=group_size_dim)
  kept_1 = mtf.reduce_sum(mask_1, reduced_dim=experts_dim)
  position_1 = mtf.reduce_sum(position_1, reduced_dim=experts_dim)
  gate_1 *= kept_1
  # Second choices queue behind all first choices of their expert.
  position_2 = (mtf.cumsum(mask_2, group_size_dim, exclusive=True)
                + count_1) * mask_2
  mask_2 *= _float_mask(mtf.less(position_2, capacity))
  kept_2 = mtf.reduce_sum(mask_2, reduced_dim=experts_dim)
  gate_2 *= kept_2
  position_2 = mtf.reduce_sum(position_2, reduced_dim=experts_dim)

  if train:
    # (The original also logged each expert's share of first and of second
    # choices; one set of per-expert summaries keeps the graph smaller.)
    _summarize(name, raw_gates, experts_dim, loss, [("all_", mask_1 + mask_2)])

  combine_tensor = (
      gate_1 * mtf.one_hot(index_1, experts_dim, dtype=tf.float32)
      * _slot_one_hot(position_1, expert_capacity_dim)
      + gate_2 * mtf.one_hot(index_2, experts_dim, dtype=tf.float32)
      * _slot_one_hot(position_2, expert_capacity_dim))
  return _finish(combine_tensor, loss, inputs.dtype)


def _switch_select(gate_logits, raw_gates, experts_dim, policy, hparams,
                   name):
  """The one expert of each token: the argmax, or a sample ("sample")."""
  if policy in ("argmax", "input_dropout", "input_jitter"):
    return mtf.top_1(raw_gates, experts_dim)
  if policy == "sample":
    index = mtf.sample_with_temperature(
        gate_logits, experts_dim,
        temperature=_hparam(hparams, "moe_switch_temperature", 1.0))
    return mtf.gather(raw_gates, index, experts_dim), index
  raise ValueError(f"{name}: unknown Switch gating policy {policy!r}; "
                   "expected 'argmax', 'sample', 'input_dropout' or "
                   "'input_jitter'.")


def _switch_balance_loss(raw_gates, gate_logits, mask, gate, experts_dim,
                         group_size_dim, hparams, train, importance, name,
                         num_microbatches):
  """The Switch balance loss (with the z-loss): (mask, gate, loss).

  `mask` and `gate` come back zero for tokens of importance below 1.0. The
  loss counts every token in the density (as the original did) and only
  real tokens in its proxy; over a "k" dimension in `mask`, it is averaged.
  """
  density = mtf.reduce_mean(mask, reduced_dim=group_size_dim)
  proxy_gates = raw_gates
  if importance is not None:
    full = _float_mask(mtf.equal(importance, 1.0))
    mask *= full
    gate *= full
    proxy_gates *= full
  density_proxy = mtf.reduce_mean(proxy_gates, reduced_dim=group_size_dim)
  loss = (mtf.reduce_mean(density * density_proxy)
          * float(experts_dim.size * experts_dim.size))
  loss = _divide_by_microbatches(loss, num_microbatches)
  loss = _add_z_loss(loss, gate_logits, experts_dim, hparams, train,
                     num_microbatches, importance, name)
  if train:
    _summarize(name, raw_gates, experts_dim, loss, [("", mask)])
  return mask, gate, loss


def _switch_router(inputs, outer_expert_dims, experts_dim, hparams, train,
                   variable_dtype, importance, name, num_microbatches):
  """Shared by the Switch variants: (raw_gates, gate, index, mask, loss).

  `mask` ([.., group, experts]) and `gate` are zero for tokens of
  importance below 1.0 (see `_switch_balance_loss`).
  """
  policy = _policy(hparams, train, "moe_switch_policy")
  gate_inputs = _perturb_gate_inputs(mtf.to_float(inputs), policy, train,
                                     hparams)
  gate_logits = _router_logits(gate_inputs, experts_dim, outer_expert_dims,
                               variable_dtype, name)
  raw_gates = mtf.softmax(gate_logits, reduced_dim=experts_dim)
  gate, index = _switch_select(gate_logits, raw_gates, experts_dim, policy,
                               hparams, name)
  mask = mtf.one_hot(index, experts_dim, dtype=tf.float32)
  mask, gate, loss = _switch_balance_loss(
      raw_gates, gate_logits, mask, gate, experts_dim, inputs.shape.dims[-2],
      hparams, train, importance, name, num_microbatches)
  return raw_gates, gate, index, mask, loss


def _switch_gating(inputs, outer_expert_dims, experts_dim,
                   expert_capacity_dim, hparams, train, variable_dtype,
                   importance=None, name="switch_gating",
                   num_microbatches=None):
  """Switch Transformer top-1 gating.

  Each token goes to one expert (the argmax of the router, or a sample
  under policy "sample"), weighted by its gate probability; tokens past an
  expert's capacity are dropped. Policies (`moe_switch_policy_train` /
  `_eval`): "argmax", "sample" (temperature `moe_switch_temperature`),
  "input_jitter" (multiplicative noise `moe_switch_jitter` on the router
  input while training), "input_dropout" (dropout `moe_switch_dropout`).
  Arguments and results as for `_top_2_gating`.
  """
  _, gate, index, mask, loss = _switch_router(
      inputs, outer_expert_dims, experts_dim, hparams, train, variable_dtype,
      importance, name, num_microbatches)
  group_size_dim = inputs.shape.dims[-2]
  position = mtf.cumsum(mask, group_size_dim, exclusive=True) * mask
  mask *= _float_mask(mtf.less(position, float(expert_capacity_dim.size)))
  kept = mtf.reduce_sum(mask, reduced_dim=experts_dim)
  if train and importance is not None:
    mtf.scalar_summary("fraction_routed", mtf.reduce_sum(kept) / (
        mtf.reduce_sum(mtf.to_float(importance)) + 1e-9))
  combine_tensor = (
      gate * kept * mtf.one_hot(index, experts_dim, dtype=tf.float32)
      * _slot_one_hot(mtf.reduce_sum(position, reduced_dim=experts_dim),
                      expert_capacity_dim))
  return _finish(combine_tensor, loss, inputs.dtype)


class _Rand1HParams:
  """hparams seen through the older names of the Switch settings.

  "rand_1" was the original's first name of Switch gating; its settings were
  `moe_rand_1_policy_*`, `moe_rand_1_dropout`, `moe_rand_1_temperature` and
  `moe_rand_1_jitter`. Each `moe_switch_*` read falls back on the
  `moe_rand_1_*` setting when there is one.
  """

  def __init__(self, hparams):
    self._hparams = hparams

  def __getattr__(self, name):
    if name.startswith("moe_switch_"):
      older = "moe_rand_1_" + name[len("moe_switch_"):]
      if hasattr(self._hparams, older):
        return getattr(self._hparams, older)
    return getattr(self._hparams, name)


def _rand_1_gating(inputs, outer_expert_dims, experts_dim,
                   expert_capacity_dim, hparams, train, variable_dtype,
                   importance=None, name="rand_1_gating",
                   num_microbatches=None):
  """The original's older name of Switch top-1 gating (`moe_gating="rand_1"`).

  The same routing as `_switch_gating`, with the router variable named
  "rand_1_gating" and the policies read from `moe_rand_1_*` when set (else
  from `moe_switch_*`), so checkpoints and hparams of that era keep working.
  """
  return _switch_gating(inputs, outer_expert_dims, experts_dim,
                        expert_capacity_dim, _Rand1HParams(hparams), train,
                        variable_dtype, importance=importance, name=name,
                        num_microbatches=num_microbatches)


def _switch_max_gating(inputs, outer_expert_dims, experts_dim,
                       expert_capacity_dim, hparams, train, variable_dtype,
                       importance=None, name="switch_max_gating",
                       num_microbatches=None):
  """Switch gating in which a full expert keeps its most confident tokens.

  Like `_switch_gating`, but instead of filling slots in token order, each
  expert takes the `capacity` tokens with the largest gate among those that
  chose it. The tensors are [<batch dims>, experts, capacity, group].
  """
  _, gate, _, mask, loss = _switch_router(
      inputs, outer_expert_dims, experts_dim, hparams, train, variable_dtype,
      importance, name, num_microbatches)
  group_size_dim = inputs.shape.dims[-2]
  probs, token = mtf.top_k(mask * gate, reduced_dim=group_size_dim,
                           k_dim=expert_capacity_dim)
  combine_tensor = mtf.one_hot(token, group_size_dim,
                               dtype=tf.float32) * probs
  return _finish(combine_tensor, loss, inputs.dtype)


def _ntlb_gating(inputs, outer_expert_dims, experts_dim, expert_capacity_dim,
                 hparams, train, variable_dtype, importance=None,
                 name="ntlb_gating", num_microbatches=None):
  """Switch gating with "no token left behind".

  Each token ranks its top `moe_ntlb_top_k` experts. Routing runs in rounds:
  round i offers every still-unrouted token to its i-th choice, in token
  order, while that expert has free slots. A token ends up with one expert
  (weighted by that expert's gate) or, if all its choices are full, none.
  The balance loss is that of the Switch router averaged over the k
  choices. Only "input_jitter" perturbs the router input.
  """
  policy = _policy(hparams, train, "moe_switch_policy")
  gate_inputs = _perturb_gate_inputs(mtf.to_float(inputs), policy, train,
                                     hparams, allow_dropout=False)
  gate_logits = _router_logits(gate_inputs, experts_dim, outer_expert_dims,
                               variable_dtype, name)
  raw_gates = mtf.softmax(gate_logits, reduced_dim=experts_dim)
  k_dim = mtf.Dimension("k", _hparam(hparams, "moe_ntlb_top_k", 4))
  gates, indices = mtf.top_k(raw_gates, reduced_dim=experts_dim, k_dim=k_dim)
  masks = mtf.one_hot(indices, experts_dim, dtype=tf.float32)
  group_size_dim = inputs.shape.dims[-2]
  masks, gates, loss = _switch_balance_loss(
      raw_gates, gate_logits, masks, gates, experts_dim, group_size_dim,
      hparams, train, importance, name, num_microbatches)

  capacity = float(expert_capacity_dim.size)
  batch_dims = inputs.shape.dims[:-2]
  used = mtf.zeros(inputs.mesh, batch_dims + [experts_dim])
  unrouted = mtf.ones(inputs.mesh, batch_dims + [group_size_dim])
  combine_tensor = None
  for i in range(k_dim.size):
    mask_i = mtf.gather(masks, i, k_dim) * unrouted
    # 1-based slot of the token in its i-th choice's queue.
    filled = used + mtf.cumsum(mask_i, group_size_dim)
    routed = mask_i * _float_mask(mtf.less_equal(filled, capacity))
    used += mtf.reduce_sum(routed, reduced_dim=group_size_dim)
    routed_flat = mtf.reduce_sum(routed, reduced_dim=experts_dim)
    unrouted -= routed_flat
    term = (mtf.gather(gates, i, k_dim) * routed
            * _slot_one_hot(filled - 1.0, expert_capacity_dim))
    combine_tensor = term if combine_tensor is None else combine_tensor + term
  return _finish(combine_tensor, loss, inputs.dtype)


def _expert_selection_gating(inputs, outer_expert_dims, experts_dim,
                             group_size_dim, expert_capacity_dim, hparams,
                             train, variable_dtype, importance=None,
                             name="expert_selection_gating",
                             num_microbatches=None,
                             normalize_by_num_experts_routed=True):
  """Expert-choice gating: each expert picks the tokens it wants.

  The router's logits are normalised over the tokens of the group (padding
  excluded), and each expert takes its `capacity` most probable tokens, so
  a token may go to several experts or none. With
  `normalize_by_num_experts_routed` a token's weights are divided by the
  number of experts that took it. The balance loss pushes each token's
  mean probability over experts towards uniform over the group. The
  tensors are [<batch dims>, experts, capacity, group].
  """
  policy = _policy(hparams, train, "moe_switch_policy")
  gate_inputs = _perturb_gate_inputs(mtf.to_float(inputs), policy, train,
                                     hparams)
  gate_logits = _router_logits(gate_inputs, experts_dim, outer_expert_dims,
                               variable_dtype, name)
  if importance is not None:
    gate_logits += _float_mask(mtf.equal(importance, 0.0)) * -1e9
  raw_gates = mtf.softmax(gate_logits, reduced_dim=group_size_dim)
  probs, token = mtf.top_k(raw_gates, reduced_dim=group_size_dim,
                           k_dim=expert_capacity_dim)
  dispatch = mtf.one_hot(token, group_size_dim, dtype=tf.float32)
  combine_tensor = dispatch * probs
  if normalize_by_num_experts_routed:
    times_taken = mtf.reduce_sum(
        dispatch, output_shape=dispatch.shape.dims[:-3] + [group_size_dim])
    combine_tensor /= mtf.maximum(times_taken, 1.0)

  mean_prob = mtf.reduce_mean(raw_gates, reduced_dim=experts_dim)
  if importance is not None:
    mean_prob *= _float_mask(mtf.equal(importance, 1.0))
    true_group_size = mtf.reduce_sum(mtf.to_float(importance),
                                     reduced_dim=group_size_dim)
  else:
    true_group_size = float(group_size_dim.size)
  loss = mtf.reduce_mean(mean_prob * mean_prob * true_group_size) * float(
      group_size_dim.size)
  loss = _divide_by_microbatches(loss, num_microbatches)
  loss = _add_z_loss(loss, gate_logits, experts_dim, hparams, train,
                     num_microbatches, importance, name)
  if train:
    entropy = mtf.reduce_sum(-raw_gates * mtf.log(raw_gates + 1e-9),
                             reduced_dim=group_size_dim)
    mtf.scalar_summary(name + "/entropy", mtf.reduce_mean(entropy))
    mtf.scalar_summary("aux_loss", mtf.reduce_mean(loss))
  return _finish(combine_tensor, loss, inputs.dtype, dispatch_from=dispatch)
