"""Mixture-of-experts layers for the Transformer (the original's `moe`).

`MoE1D` replaces a feed-forward layer with `num_experts` of them and a
router sending each token to one or two (`transformer_moe_layer_v1`);
`MoE2D` is the hierarchical version on a grid of experts
(`transformer_moe_layer_v2`). Both append their load-balancing loss to
`context.losses`. The layer functions live in `moe_layers`, the gating
functions in `moe_gating`; this module re-exports them.

Layouts: the experts dimension is "experts"; split it over the mesh
dimension that splits the batch ("batch:batch;experts:batch"), and the
dispatch becomes an all-to-all. The number of gating groups is chosen from
`context.model.layout` and `context.model.mesh_shape`.
"""

import gin

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layers import moe_gating
from mesh_tensorflow.transformer.layers import moe_layers
from mesh_tensorflow.transformer import transformer

# pylint: disable=protected-access
# Re-exported under the original's names.
transformer_moe_layer_v1 = moe_layers.transformer_moe_layer_v1
transformer_moe_layer_v2 = moe_layers.transformer_moe_layer_v2
_split_into_groups = moe_layers._split_into_groups
_top_2_gating = moe_gating._top_2_gating
_switch_gating = moe_gating._switch_gating
_rand_1_gating = moe_gating._rand_1_gating
_switch_max_gating = moe_gating._switch_max_gating
_ntlb_gating = moe_gating._ntlb_gating
_expert_selection_gating = moe_gating._expert_selection_gating
_router_z_loss = moe_gating._router_z_loss
# pylint: enable=protected-access

_MODULE = "mesh_tensorflow.transformer.moe"


class HParams:
  """A bag of hyperparameters (stands in for tf.contrib's HParams)."""

  def __init__(self, **kwargs):
    for k, v in kwargs.items():
      setattr(self, k, v)

  def add_hparam(self, k, v):
    setattr(self, k, v)

  def __repr__(self):
    return f"HParams({vars(self)!r})"


def set_default_moe_hparams(hparams):
  """Adds the mixture-of-experts hyperparameters, with their defaults, to
  `hparams` (an HParams)."""
  hparams.moe_num_experts = 16
  hparams.moe_loss_coef = 1e-2
  hparams.add_hparam("moe_gating", "top_2")
  # Slack for unbalanced routing: experts hold capacity_factor times the
  # balanced share of a group (>= 1 makes sense).
  hparams.add_hparam("moe_capacity_factor_train", 1.25)
  hparams.add_hparam("moe_capacity_factor_eval", 2.0)
  hparams.add_hparam("moe_capacity_factor_second_level", 1.0)
  hparams.add_hparam("moe_hidden_size", 4096)
  # Tokens are gated in groups of at most this many; larger groups balance
  # better but the dispatch einsum grows with the group size.
  hparams.add_hparam("moe_group_size", 1024)
  hparams.add_hparam("moe_use_second_place_loss", 0)
  # When a token also goes to its second expert: "all", "none",
  # "threshold" (gate > threshold) or "random" (with probability
  # min(1, gate / threshold)).
  hparams.add_hparam("moe_second_policy_train", "random")
  hparams.add_hparam("moe_second_policy_eval", "random")
  hparams.add_hparam("moe_second_threshold_train", 0.2)
  hparams.add_hparam("moe_second_threshold_eval", 0.2)


def _with_length_dim(context, x):
  """x, reshaped to have a length dimension (of size 1) if it has none
  (incremental decoding), and the shape to restore afterwards."""
  if context.length_dim in x.shape.dims:
    return x, None
  shape = x.shape
  return mtf.reshape(x, mtf.Shape(
      shape.dims[:-1] + [mtf.Dimension("length", 1)] + shape.dims[-1:])), shape


def _without_length_dim(y, shape_without_length):
  """Removes the length dimension `_with_length_dim` added (the output's
  channels may differ from the input's)."""
  return mtf.reshape(y, mtf.Shape(shape_without_length.dims[:-1]
                                  + y.shape.dims[-1:]))


def _check_no_ensemble(context, layer):
  if getattr(context.model, "ensemble_dim", None):
    raise NotImplementedError(
        f"{layer}: mixture of experts does not support ensembles "
        f"(the model has ensemble_dim {context.model.ensemble_dim}).")


@gin.configurable(module=_MODULE)
class MoE1D(transformer.TransformerLayer):
  """A mixture-of-experts feed-forward layer (one level of experts).

  Args (the gating ones apply to the gating chosen by `moe_gating`):
    num_experts: the number of experts.
    loss_coef: the balance loss is multiplied by this.
    hidden_size: each expert's hidden size.
    group_size: tokens are gated in groups of at most this many.
    capacity_factor_train, capacity_factor_eval: each expert takes at most
      group_size * factor / num_experts tokens of a group.
    use_second_place_loss: top_2: also balance the second choices.
    second_policy_train, second_policy_eval: top_2: "all", "none",
      "threshold" or "random" (when to use the second expert).
    second_threshold_train, second_threshold_eval: top_2: the threshold.
    dropout_rate: dropout on the experts' hidden layer.
    activation: the experts' activation, or a list (gated units).
    moe_gating: "top_2", "switch", "switch_max", "ntlb",
      "expert_selection", or "rand_1" (the older name of "switch").
    min_expert_capacity: capacity is at least this.
    switch_policy_train, switch_policy_eval: switch gatings: "argmax",
      "sample", "input_dropout" or "input_jitter".
    switch_dropout: dropout rate of "input_dropout".
    switch_temperature: temperature of "sample".
    switch_jitter: noise amplitude of "input_jitter".
    ntlb_top_k: ntlb: how many choices a token has.
    output_dim: the output Dimension; default d_model.
    use_experts_attention: return [queries, keys] (ExpertsSelfAttention).
    z_loss: coefficient of the router z-loss, or None.
  """

  def __init__(self,
               num_experts=16,
               loss_coef=1e-2,
               hidden_size=4096,
               group_size=1024,
               capacity_factor_train=1.25,
               capacity_factor_eval=2.0,
               use_second_place_loss=False,
               second_policy_train="random",
               second_policy_eval="random",
               second_threshold_train=0.2,
               second_threshold_eval=0.2,
               dropout_rate=0.0,
               activation="relu",
               moe_gating="top_2",
               min_expert_capacity=4,
               switch_policy_train="input_jitter",
               switch_policy_eval="input_jitter",
               switch_dropout=0.1,
               switch_temperature=1.0,
               switch_jitter=1e-2,
               ntlb_top_k=4,
               output_dim=None,
               use_experts_attention=False,
               z_loss=None):
    self._hparams = HParams(
        moe_gating=moe_gating,
        moe_num_experts=num_experts,
        moe_loss_coef=loss_coef,
        moe_hidden_size=hidden_size,
        moe_group_size=group_size,
        moe_min_expert_capacity=min_expert_capacity,
        moe_capacity_factor_train=capacity_factor_train,
        moe_capacity_factor_eval=capacity_factor_eval,
        moe_use_second_place_loss=use_second_place_loss,
        moe_second_policy_train=second_policy_train,
        moe_second_policy_eval=second_policy_eval,
        moe_second_threshold_train=second_threshold_train,
        moe_second_threshold_eval=second_threshold_eval,
        moe_dropout_rate=dropout_rate,
        moe_switch_policy_train=switch_policy_train,
        moe_switch_policy_eval=switch_policy_eval,
        moe_switch_dropout=switch_dropout,
        moe_switch_temperature=switch_temperature,
        moe_switch_jitter=switch_jitter,
        moe_output_dim=output_dim,
        moe_ntlb_top_k=ntlb_top_k,
        moe_use_experts_attention=use_experts_attention,
        moe_z_loss=z_loss)
    self._activation = activation

  def call(self, context, x, losses=None):
    """Applies the experts to `x` [<batch dims>, length, d_model]."""
    _check_no_ensemble(context, "MoE1D")
    x, shape_without_length = _with_length_dim(context, x)
    output_dim = self._hparams.moe_output_dim or context.model.model_dim
    y, loss = transformer_moe_layer_v1(
        x, output_dim, self._hparams, context.train, context.variable_dtype,
        layout=getattr(context.model, "layout", None),
        mesh_shape=getattr(context.model, "mesh_shape", None),
        nonpadding=context.nonpadding, activation=self._activation,
        num_microbatches=context.num_microbatches)
    if context.losses is not None:
      context.losses.append(loss)
    if shape_without_length is not None:
      if isinstance(y, list):
        y = [_without_length_dim(t, shape_without_length) for t in y]
      else:
        y = _without_length_dim(y, shape_without_length)
    return y


class MoE2D(transformer.TransformerLayer):
  """A hierarchical mixture of experts on an [expert_x, expert_y] grid.

  Tokens are routed (top-2) to groups of experts along x, then within each
  group to experts along y (`transformer_moe_layer_v2`). Arguments as for
  MoE1D, plus capacity_factor_second_level for the inner routing.
  """

  def __init__(self,
               expert_x=8,
               expert_y=8,
               loss_coef=1e-2,
               hidden_size=4096,
               group_size=1024,
               capacity_factor_train=1.25,
               capacity_factor_eval=2.0,
               capacity_factor_second_level=1.0,
               use_second_place_loss=False,
               second_policy_train="random",
               second_policy_eval="random",
               second_threshold_train=0.2,
               second_threshold_eval=0.2):
    self._hparams = HParams(
        moe_gating="top_2",
        moe_num_experts=[expert_x, expert_y],
        moe_loss_coef=loss_coef,
        moe_hidden_size=hidden_size,
        moe_group_size=group_size,
        moe_capacity_factor_train=capacity_factor_train,
        moe_capacity_factor_eval=capacity_factor_eval,
        moe_capacity_factor_second_level=capacity_factor_second_level,
        moe_use_second_place_loss=use_second_place_loss,
        moe_second_policy_train=second_policy_train,
        moe_second_policy_eval=second_policy_eval,
        moe_second_threshold_train=second_threshold_train,
        moe_second_threshold_eval=second_threshold_eval)

  def call(self, context, x, losses=None):
    """Applies the experts to `x` [<batch dims>, length, d_model]."""
    _check_no_ensemble(context, "MoE2D")
    x, shape_without_length = _with_length_dim(context, x)
    y, loss = transformer_moe_layer_v2(
        x, context.model.model_dim, self._hparams, context.train,
        context.variable_dtype,
        layout=getattr(context.model, "layout", None),
        mesh_shape=getattr(context.model, "mesh_shape", None),
        nonpadding=context.nonpadding,
        num_microbatches=context.num_microbatches)
    if context.losses is not None:
      context.losses.append(loss)
    if shape_without_length is not None:
      y = _without_length_dim(y, shape_without_length)
    return y
