"""The mixture-of-experts layer functions behind `moe.MoE1D` and `moe.MoE2D`.

`transformer_moe_layer_v1` is the one-level layer (GShard / Switch style):

    inputs  [outer_batch, batch, length, d_model]    batch split over the mesh
    reshape [outer_batch, groups, group, d_model]    "groups" is named like
                                                     batch, so it splits alike
    gating  dispatch / combine [.., groups, group, experts_unsplit, capacity]
    einsum  [outer_batch, experts_unsplit, groups, capacity, d_model]
    reshape [outer_batch, experts, batch_unsplit, capacity, d_model]
            -- the split moves from the groups to the experts: all-to-all
    experts dense_product / dense with expert_dims=[experts]
    reshape back (all-to-all), combine einsum, reshape to the input's shape.

Each processor routes its own groups (the gating is local); the only
communication is the two all-to-alls (four with the backward pass) and the
all-reduce of the router's gradient. The number of groups is peeked from the
layout so that it divides by the mesh dimension splitting the batch.
"""

from absl import logging

import mesh_tensorflow as mtf

from mesh_tensorflow.transformer.layers import moe_gating

# pylint: disable=protected-access


def _split_into_groups(n, max_group_size, mesh_dim_size, allow_uneven=False):
  """Factors n = num_groups * group_size for the gating.

  The number of groups is the smallest one, from n // max_group_size up,
  that divides n and is a multiple of `mesh_dim_size` (so that the groups
  split evenly over the mesh dimension splitting the batch). As in the
  original, a group can come out larger than `max_group_size` when that
  does not divide n (n=48, max 10, mesh 4: 4 groups of 12).

  Args:
    n: the number of tokens (an int).
    max_group_size: an int.
    mesh_dim_size: an int.
    allow_uneven: the layout allows uneven splits: when mesh_dim_size does
      not divide n, the groups need not be a multiple of it (they are split
      padded, as the batch was).

  Returns:
    (num_groups, group_size).

  Raises:
    ValueError: n is not a multiple of mesh_dim_size (and uneven splits are
      not allowed).
  """
  if n % mesh_dim_size:
    if not allow_uneven:
      raise ValueError(
          f"mixture of experts: the {n} tokens per expert replica do not "
          f"divide into groups over the {mesh_dim_size} processors of the "
          "mesh dimension splitting the batch; use a batch whose size times "
          "length is a multiple of it, or allow uneven splits.")
    mesh_dim_size = 1
  num_groups = max(1, n // max_group_size)
  while num_groups % mesh_dim_size or n % num_groups:
    num_groups += 1
  group_size = n // num_groups
  logging.info("_split_into_groups(n=%d, max_group_size=%d, "
               "mesh_dim_size=%d) = (num_groups=%d, group_size=%d)",
               n, max_group_size, mesh_dim_size, num_groups, group_size)
  return num_groups, group_size


def _groups_over_mesh(n, max_group_size, layout, mesh_shape, batch_dim):
  """_split_into_groups of n tokens over the mesh dimension that splits
  `batch_dim` under `layout`."""
  return _split_into_groups(
      n, max_group_size,
      mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, batch_dim),
      allow_uneven=mtf.convert_to_layout_rules(layout).allow_uneven)


def _expert_capacity(group_size, num_experts, capacity_factor,
                     min_expert_capacity):
  """Slots per expert and group: group_size * factor / experts, at most the
  group size, at least `min_expert_capacity`."""
  capacity = min(group_size, int((group_size * capacity_factor) / num_experts))
  return max(capacity, min_expert_capacity)


_GATINGS = {
    "top_2": moe_gating._top_2_gating,
    "switch": moe_gating._switch_gating,
    "rand_1": moe_gating._rand_1_gating,
    "switch_max": moe_gating._switch_max_gating,
    "ntlb": moe_gating._ntlb_gating,
}


def _gate(hparams, inputs, experts_dim, group_size_dim, expert_capacity_dim,
          train, variable_dtype, importance, num_microbatches):
  """Runs the gating named by hparams.moe_gating."""
  gating = getattr(hparams, "moe_gating", "top_2")
  kwargs = dict(inputs=inputs, outer_expert_dims=None,
                experts_dim=experts_dim,
                expert_capacity_dim=expert_capacity_dim, hparams=hparams,
                train=train, variable_dtype=variable_dtype,
                importance=importance, num_microbatches=num_microbatches)
  if gating == "expert_selection":
    return moe_gating._expert_selection_gating(
        group_size_dim=group_size_dim, name="expert_selection_gating",
        **kwargs)
  if gating not in _GATINGS:
    raise ValueError(
        f"mixture of experts: unknown hparams.moe_gating={gating!r}; "
        f"expected one of {sorted(_GATINGS) + ['expert_selection']}.")
  return _GATINGS[gating](**kwargs)


def transformer_moe_layer_v1(inputs, output_dim, hparams, train,
                             variable_dtype, layout=None, mesh_shape=None,
                             nonpadding=None, activation=mtf.relu,
                             num_microbatches=None):
  """A one-level mixture of experts (https://arxiv.org/abs/1701.06538).

  Each token goes to 0-2 experts (depending on the gating), each a
  two-layer feed-forward network [d_model -> moe_hidden_size -> output_dim].
  Tokens are gated in groups of at most `moe_group_size`; every group sends
  at most `capacity` tokens to each expert, capacity =
  group * capacity_factor / experts (see `_expert_capacity`).

  Args:
    inputs: [<batch dims>, length, d_model]; the first batch dim may be
      "outer_batch" (expert replicas).
    output_dim: the output's last Dimension (d_model for a Transformer).
    hparams: an HParams (see `moe.set_default_moe_hparams`, `moe.MoE1D`).
    train: a bool.
    variable_dtype: an mtf.VariableDType.
    layout: the layout rules the graph will be lowered with (anything
      mtf.convert_to_layout_rules takes), to choose the number of groups.
    mesh_shape: the mesh shape, likewise.
    nonpadding: optional [<batch dims>, length] of 1.0 / 0.0 (or the int 1);
      padding goes to no expert.
    activation: the experts' hidden activation: a function, a name, or a
      list of them for a gated unit (see mtf.layers.dense_product).
    num_microbatches: the loss is divided by it.

  Returns:
    (output [<batch dims>, length, output_dim], loss): loss is the gating's
    balance loss times hparams.moe_loss_coef. With
    hparams.moe_use_experts_attention, output is a list of two tensors (the
    query and key projections of `ExpertsSelfAttention`).

  Raises:
    ValueError: an unknown gating.
  """
  experts_dim = mtf.Dimension("experts", hparams.moe_num_experts)
  hidden_dim = mtf.Dimension("expert_hidden", hparams.moe_hidden_size)
  batch_and_length_dims = inputs.shape.dims[:-1]
  input_dim = inputs.shape.dims[-1]
  # An "outer_batch" leading dimension holds replicas of the experts; the
  # groups are cut from the rest and named like the batch, which splits them
  # over the mesh as the batch was.
  if inputs.shape.dims[0].name == "outer_batch":
    outer_batch_dim, orig_batch_dim = inputs.shape.dims[:2]
  else:
    outer_batch_dim = mtf.Dimension("outer_batch", 1)
    orig_batch_dim = inputs.shape.dims[0]
  n = mtf.list_product(d.size for d in batch_and_length_dims)
  n //= outer_batch_dim.size
  num_groups, group_size = _groups_over_mesh(
      n, hparams.moe_group_size, layout, mesh_shape, orig_batch_dim)
  group_size_dim = mtf.Dimension("group", group_size)
  num_groups_dim = mtf.Dimension(orig_batch_dim.name, num_groups)
  moe_input_dims = [outer_batch_dim, num_groups_dim, group_size_dim,
                    input_dim]
  inputs = mtf.reshape(inputs, moe_input_dims)

  capacity_factor = (hparams.moe_capacity_factor_train if train
                     else hparams.moe_capacity_factor_eval)
  expert_capacity = _expert_capacity(
      group_size, experts_dim.size, capacity_factor,
      getattr(hparams, "moe_min_expert_capacity", 4))
  logging.info("expert_capacity: %d", expert_capacity)
  expert_capacity_dim = mtf.Dimension("expert_capacity", expert_capacity)
  experts_dim_unsplit = mtf.Dimension("expert_unsplit", experts_dim.size)
  batch_dim_unsplit = mtf.Dimension("batch_unsplit", num_groups)
  if nonpadding is not None:
    nonpadding = mtf.zeros(inputs.mesh, batch_and_length_dims,
                           dtype=inputs.dtype) + nonpadding
    nonpadding = mtf.reshape(nonpadding, moe_input_dims[:-1])

  dispatch_tensor, combine_tensor, loss = _gate(
      hparams, inputs, experts_dim_unsplit, group_size_dim,
      expert_capacity_dim, train, variable_dtype, nonpadding,
      num_microbatches)

  expert_inputs = mtf.einsum(
      [inputs, dispatch_tensor],
      mtf.Shape([outer_batch_dim, experts_dim_unsplit, num_groups_dim,
                 expert_capacity_dim, input_dim]))
  # First leave d_model unsplit (under model parallelism a local slice),
  # then move the split from the groups to the experts (an all-to-all), so
  # that the all-to-all carries whole d_model vectors.
  d_model_split_dim = mtf.Dimension("d_model_split", input_dim.size)
  expert_inputs = mtf.reshape(
      expert_inputs,
      mtf.Shape([outer_batch_dim, experts_dim, batch_dim_unsplit,
                 expert_capacity_dim, d_model_split_dim]))
  expert_inputs = mtf.reshape(
      expert_inputs,
      mtf.Shape([outer_batch_dim, experts_dim, batch_dim_unsplit,
                 expert_capacity_dim, input_dim]))

  h = mtf.layers.dense_product(
      expert_inputs, reduced_dims=expert_inputs.shape.dims[-1:],
      new_dims=[hidden_dim], expert_dims=[experts_dim],
      activation_functions=activation, use_bias=False,
      variable_dtype=variable_dtype, name="wi")
  dropout_rate = getattr(hparams, "moe_dropout_rate", 0.0)
  if dropout_rate != 0.0:
    h = mtf.dropout(h, is_training=train, keep_prob=1.0 - dropout_rate)

  def expert_output(hidden, layer_name):
    """The experts' output layer, moved back to the groups and combined."""
    out = mtf.layers.dense(
        hidden, output_dim, expert_dims=[experts_dim], use_bias=False,
        reduced_dims=hidden.shape.dims[-1:], variable_dtype=variable_dtype,
        name=layer_name)
    split_dim = mtf.Dimension("d_model_split", out.shape.dims[-1].size)
    out = mtf.reshape(out, mtf.Shape([
        outer_batch_dim, experts_dim_unsplit, num_groups_dim,
        expert_capacity_dim, split_dim]))
    out = mtf.reshape(out, mtf.Shape([
        outer_batch_dim, experts_dim_unsplit, num_groups_dim,
        expert_capacity_dim, output_dim]))
    out = mtf.einsum([out, combine_tensor],
                     mtf.Shape(moe_input_dims[:-1] + [output_dim]))
    return mtf.reshape(out, batch_and_length_dims + [output_dim])

  loss *= hparams.moe_loss_coef
  if getattr(hparams, "moe_use_experts_attention", False):
    # Queries and keys share the experts' hidden layer.
    return [expert_output(h, "q_wo"), expert_output(h, "k_wo")], loss
  return expert_output(h, "wo"), loss


def transformer_moe_layer_v2(inputs, output_dim, hparams, train,
                             variable_dtype, layout=None, mesh_shape=None,
                             nonpadding=None, num_microbatches=None):
  """A two-level (hierarchical) mixture of experts on an [x, y] grid.

  Tokens are gated (top-2) to one of x groups of experts, moved there by an
  all-to-all, re-grouped and gated (top-2, a router per x group) to one of
  that group's y experts, moved by a second all-to-all, and back the same
  way. A token that reached its x group as a second choice gets at most one
  inner expert. Each expert is a [d_model -> moe_hidden_size -> output_dim]
  relu network with variables [expert_y, expert_x, ...].

  Dimensions: "expert_x" / "expert_y" are the split experts dims (lay them
  out over the mesh dims that split "batch" and "outer_batch"); the gating
  groups are named like the batch ("batch") and the outer batch
  ("outer_batch"), so that they split alike.

  Args:
    inputs: [outer_batch, batch, length, d_model] or [batch, length,
      d_model].
    output_dim: the output's last Dimension.
    hparams: an HParams with moe_num_experts = [x, y] (see moe.MoE2D).
    train: a bool.
    variable_dtype: an mtf.VariableDType.
    layout, mesh_shape: the layout and mesh the graph will be lowered with
      (they choose the number of groups at each level).
    nonpadding: optional [<batch dims>, length] of 1.0 / 0.0.
    num_microbatches: the loss is divided by it.

  Returns:
    (output shaped like inputs but with output_dim last, loss * moe_loss_coef).

  Raises:
    ValueError: moe_num_experts is not a pair, or the gating is not top_2.
  """
  if len(hparams.moe_num_experts) != 2:
    raise ValueError(
        "transformer_moe_layer_v2: hparams.moe_num_experts must be "
        f"[expert_x, expert_y], got {hparams.moe_num_experts!r}.")
  if getattr(hparams, "moe_gating", "top_2") != "top_2":
    raise ValueError("transformer_moe_layer_v2: unknown "
                     f"hparams.moe_gating={hparams.moe_gating!r}; only "
                     "'top_2' is supported.")
  min_capacity = getattr(hparams, "moe_min_expert_capacity", 4)
  if nonpadding is not None:
    nonpadding = mtf.zeros(inputs.mesh, inputs.shape.dims[:-1],
                           dtype=inputs.dtype) + nonpadding
  insert_outer_batch_dim = len(inputs.shape.dims) == 3
  if insert_outer_batch_dim:
    inputs = mtf.reshape(
        inputs, [mtf.Dimension("outer_batch", 1)] + inputs.shape.dims)
  a0, b1, l, m = inputs.shape.dims
  hidden_dim = mtf.Dimension("expert_hidden", hparams.moe_hidden_size)
  x1 = mtf.Dimension("expert_x", hparams.moe_num_experts[0])
  y0 = mtf.Dimension("expert_y", hparams.moe_num_experts[1])
  x = mtf.Dimension("expert_x_unsplit", hparams.moe_num_experts[0])
  y = mtf.Dimension("expert_y_unsplit", hparams.moe_num_experts[1])
  n = output_dim

  # Outer level: groups g1 (named like the batch) of s tokens.
  num_groups, group_size = _groups_over_mesh(
      b1.size * l.size, hparams.moe_group_size, layout, mesh_shape, b1)
  g1 = mtf.Dimension(b1.name, num_groups)
  g = mtf.Dimension(b1.name + "_unsplit", g1.size)
  s = mtf.Dimension("group_size_x", group_size)
  capacity_factor = (hparams.moe_capacity_factor_train if train
                     else hparams.moe_capacity_factor_eval)
  c = mtf.Dimension("expert_capacity_x", _expert_capacity(
      s.size, x.size, capacity_factor, min_capacity))

  # Inner level: what each x group received, regrouped into h0 (named like
  # the outer batch) groups of t.
  num_groups, group_size = _groups_over_mesh(
      a0.size * g.size * c.size, hparams.moe_group_size, layout, mesh_shape,
      a0)
  t = mtf.Dimension("group_size_y", group_size)
  h0 = mtf.Dimension(a0.name, num_groups)
  h = mtf.Dimension(a0.name + "_unsplit", h0.size)
  d = mtf.Dimension("expert_capacity_y", _expert_capacity(
      t.size, y.size, hparams.moe_capacity_factor_second_level,
      min_capacity))

  inputs = mtf.reshape(inputs, [a0, g1, s, m])
  if nonpadding is not None:
    nonpadding = mtf.reshape(nonpadding, [a0, g1, s])
  dispatch_x, combine_x, loss_outer = moe_gating._top_2_gating(
      inputs=inputs, outer_expert_dims=None, experts_dim=x,
      expert_capacity_dim=c, hparams=hparams, train=train,
      variable_dtype=variable_dtype, importance=nonpadding,
      name="outer_gating", num_microbatches=num_microbatches)
  expert_inputs_x = mtf.einsum([inputs, dispatch_x], [x, a0, g1, c, m])
  # Importance for the inner gating: 1.0 for a slot holding a token's first
  # choice (its renormalised gate is above one half), 0.5 for a second
  # choice, 0.0 for an empty slot.
  importance = mtf.reduce_sum(combine_x, output_shape=[x, a0, g1, c])
  importance = 0.5 * (mtf.to_float(mtf.greater(importance, 0.5))
                      + mtf.to_float(mtf.greater(importance, 0.0)))
  # All-to-all: the split moves from the groups to expert_x.
  expert_inputs_x = mtf.reshape(expert_inputs_x, mtf.Shape([x1, a0, g, c, m]))
  importance = mtf.reshape(importance, [x1, a0, g, c])
  inputs_y = mtf.reshape(expert_inputs_x, [x1, h0, t, m])
  importance = mtf.reshape(importance, [x1, h0, t])
  dispatch_y, combine_y, loss_inner = moe_gating._top_2_gating(
      inputs=inputs_y, outer_expert_dims=[x1], experts_dim=y,
      expert_capacity_dim=d, hparams=hparams, train=train,
      variable_dtype=variable_dtype, importance=importance,
      name="inner_gating", num_microbatches=num_microbatches)
  expert_inputs_y = mtf.einsum([inputs_y, dispatch_y], [y, x1, h0, d, m])
  # All-to-all: the split moves from the inner groups to expert_y.
  expert_inputs_y = mtf.reshape(expert_inputs_y,
                                mtf.Shape([y0, x1, h, d, m]))
  hidden = mtf.layers.dense(
      expert_inputs_y, hidden_dim, expert_dims=[y0, x1],
      reduced_dims=expert_inputs_y.shape.dims[-1:], activation=mtf.relu,
      use_bias=False, variable_dtype=variable_dtype, name="wi")
  expert_output = mtf.layers.dense(
      hidden, output_dim, expert_dims=[y0, x1],
      reduced_dims=hidden.shape.dims[-1:], use_bias=False,
      variable_dtype=variable_dtype, name="wo")
  # And back: all-to-all, inner combine, all-to-all, outer combine.
  expert_output = mtf.reshape(expert_output, mtf.Shape([y, x1, h0, d, n]))
  output_y = mtf.einsum([expert_output, combine_y], [x1, h0, t, n])
  output = mtf.reshape(output_y, [x1, a0, g, c, n])
  expert_output_x = mtf.reshape(output, mtf.Shape([x, a0, g1, c, n]))
  output_x = mtf.einsum([expert_output_x, combine_x], [a0, g1, s, n])
  output = mtf.reshape(output_x, [a0, b1, l, n])
  if insert_outer_batch_dim:
    output = mtf.reshape(output, [b1, l, n])
  return output, (loss_outer + loss_inner) * hparams.moe_loss_coef
