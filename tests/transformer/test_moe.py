"""Tests of transformer/moe.py: gating against NumPy, MoE1D under layouts."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import moe
from tests import mtf_testing
from tests.transformer import layer_testing

D_MODEL = 16
GROUPS, GROUP = 8, 8  # [outer_batch=1, batch=8, group=8, d_model]
EXPERTS = 4

# Gating runs locally on each processor's groups: one processor, and the
# groups ("batch") split 8 ways.
GATING_LAYOUTS = (("1proc", "all:1", ""), ("dp", "batch:8", "batch:batch"))


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _gating_inputs(seed=0):
  rng = np.random.RandomState(seed)
  x = rng.randn(1, GROUPS, GROUP, D_MODEL).astype(np.float32)
  # Some padding: the last tokens of a few groups.
  importance = np.ones((1, GROUPS, GROUP), np.float32)
  importance[0, 1, 6:] = 0.0
  importance[0, 5, 3:] = 0.0
  return x, importance


def _dims():
  return [mtf.Dimension("outer_batch", 1), mtf.Dimension("batch", GROUPS),
          mtf.Dimension("group", GROUP), mtf.Dimension("d_model", D_MODEL)]


def np_top_2_gating(x, w, importance, capacity, policy, threshold,
                    use_second=None):
  """NumPy top-2 gating, token by token: (combine [..., S, E, C], loss).

  `use_second` ([..., S] of 0/1), if given, replaces the policy's choice
  of which tokens also go to their second expert (for "random").
  """
  gates = _softmax(x.astype(np.float64) @ w)
  num_experts = w.shape[-1]
  full = (importance == 1.0).astype(np.float64)
  idx1 = gates.argmax(-1)
  mask1 = np.eye(num_experts)[idx1] * full[..., None]
  g1 = gates.max(-1) * full
  without_1 = gates * (1 - mask1)
  idx2 = without_1.argmax(-1)
  g2 = without_1.max(-1)
  mask2 = np.eye(num_experts)[idx2] * (importance > 0)[..., None]
  denom = g1 + g2 + 1e-9
  g1, g2 = g1 / denom, g2 / denom
  density = mask1.mean(-2)
  proxy = (gates * full[..., None]).mean(-2)
  loss = (density * proxy).mean() * num_experts ** 2
  use2 = {"all": np.ones_like(g2), "none": np.zeros_like(g2),
          "threshold": (g2 > threshold).astype(np.float64),
          "random": use_second}[policy]
  mask2 = mask2 * use2[..., None]
  combine = np.zeros(x.shape[:-1] + (num_experts, capacity))
  for o in range(x.shape[0]):
    for g in range(x.shape[1]):
      count = np.zeros(num_experts, int)
      for s in range(x.shape[2]):
        if mask1[o, g, s].any():
          e = idx1[o, g, s]
          if count[e] < capacity:
            combine[o, g, s, e, count[e]] += g1[o, g, s]
          count[e] += 1
      count = np.minimum(count, capacity)
      for s in range(x.shape[2]):
        if mask2[o, g, s].any():
          e = idx2[o, g, s]
          if count[e] < capacity:
            combine[o, g, s, e, count[e]] += g2[o, g, s]
          count[e] += 1
  return combine, loss, g2


def np_switch_gating(x, w, importance, capacity):
  """NumPy Switch (argmax) gating: (combine, loss)."""
  gates = _softmax(x.astype(np.float64) @ w)
  num_experts = w.shape[-1]
  full = (importance == 1.0).astype(np.float64)
  idx = gates.argmax(-1)
  onehot = np.eye(num_experts)[idx]
  # The density counts every token (as the original did), the proxy only
  # real ones.
  loss = (onehot.mean(-2) * (gates * full[..., None]).mean(-2)).mean() * (
      num_experts ** 2)
  gate = gates.max(-1) * full
  combine = np.zeros(x.shape[:-1] + (num_experts, capacity))
  for o in range(x.shape[0]):
    for g in range(x.shape[1]):
      count = np.zeros(num_experts, int)
      for s in range(x.shape[2]):
        if full[o, g, s]:
          e = idx[o, g, s]
          if count[e] < capacity:
            combine[o, g, s, e, count[e]] = gate[o, g, s]
          count[e] += 1
  return combine, loss


def _run_gating(mesh_shape, layout, gating, hparams, capacity, train=True):
  x, importance = _gating_inputs()
  experts_dim = mtf.Dimension("expert_unsplit", EXPERTS)
  capacity_dim = mtf.Dimension("expert_capacity", capacity)

  def build(mesh):
    dims = _dims()
    xt = mtf_testing.import_array(mesh, x, dims)
    imp = mtf_testing.import_array(mesh, importance, dims[:-1])
    dispatch, combine, loss = gating(
        inputs=xt, outer_expert_dims=None, experts_dim=experts_dim,
        expert_capacity_dim=capacity_dim, hparams=hparams, train=train,
        variable_dtype=mtf.VariableDType(), importance=imp)
    order = dims[:-1] + [experts_dim, capacity_dim]
    return {"dispatch": mtf.transpose(dispatch, order),
            "combine": mtf.transpose(combine, order), "loss": loss}, None, {}

  values = layer_testing.run_under(mesh_shape, layout, "function", build)
  kernel = [v for k, v in values.items() if k.endswith("/kernel")]
  assert len(kernel) == 1, sorted(values)
  return x, importance, kernel[0], values


def _top_2_hparams(policy, threshold=0.3):
  return moe.HParams(
      moe_use_second_place_loss=False, moe_second_policy_train=policy,
      moe_second_policy_eval=policy, moe_second_threshold_train=threshold,
      moe_second_threshold_eval=threshold)


@pytest.mark.parametrize("policy,mesh_shape,layout", [
    ("all", "all:1", ""), ("none", "all:1", ""), ("threshold", "all:1", ""),
    ("all", "batch:8", "batch:batch")])
def test_top_2_gating_matches_numpy(policy, mesh_shape, layout):
  capacity = 2  # 8 tokens, 4 experts: some are dropped.
  x, importance, w, got = _run_gating(
      mesh_shape, layout, moe._top_2_gating, _top_2_hparams(policy),
      capacity)
  want, want_loss, _ = np_top_2_gating(x, w, importance, capacity, policy,
                                       0.3)
  np.testing.assert_allclose(got["combine"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got["dispatch"], (want != 0).astype(
      np.float32))
  np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5)
  # The case exercises what it should: padding goes nowhere, some tokens
  # are dropped at capacity, and the policy changes second choices.
  routed = (want != 0).sum((-2, -1))
  assert routed[importance == 0].max() == 0
  assert (want != 0).sum((-3, -1)).max() <= capacity
  if policy == "all":
    assert (routed[importance == 1] < 2).any()  # drops at capacity
  if policy == "none":
    assert routed.max() == 1


def test_top_2_random_policy_matches_numpy():
  """"random" sends a token to its second expert with probability
  min(1, gate_2 / threshold): always when gate_2 >= threshold, sometimes
  below; otherwise routing is that of the other policies, and the draw is
  the same under every layout."""
  capacity = GROUP  # Nothing dropped: the dispatch shows every choice.
  threshold = 0.4
  runs = [_run_gating(mesh_shape, layout, moe._top_2_gating,
                      _top_2_hparams("random", threshold), capacity)
          for _, mesh_shape, layout in GATING_LAYOUTS]
  x, importance, w, got = runs[0]
  for _, _, _, other in runs[1:]:
    np.testing.assert_array_equal(other["dispatch"], got["dispatch"])
    for key in ("combine", "loss"):
      np.testing.assert_allclose(other[key], got[key], rtol=1e-6,
                                 err_msg=key)
  routed = got["dispatch"].sum((-2, -1))
  use_second = (routed == 2).astype(np.float64)
  want, want_loss, gate_2 = np_top_2_gating(
      x, w, importance, capacity, "random", threshold, use_second)
  np.testing.assert_allclose(got["combine"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5)
  real = importance == 1
  assert (use_second[real & (gate_2 >= threshold)] == 1).all()
  below = real & (gate_2 < threshold)
  # Some of those below the threshold are kept, some not (a fair draw).
  assert 0 < use_second[below].sum() < below.sum()
  # Tiny threshold: always (as "all"); huge: never (as "none").
  for threshold, policy in ((1e-9, "all"), (1e9, "none")):
    _, _, _, got = _run_gating("all:1", "", moe._top_2_gating,
                               _top_2_hparams("random", threshold), 2)
    want, _, _ = np_top_2_gating(x, w, importance, 2, policy, threshold)
    np.testing.assert_allclose(got["combine"], want, rtol=1e-5, atol=1e-6)


def test_top_2_gating_eval_uses_the_eval_policy():
  hparams = _top_2_hparams("all")
  hparams.moe_second_policy_eval = "none"
  x, importance, w, got = _run_gating("all:1", "", moe._top_2_gating,
                                      hparams, 2, train=False)
  want, want_loss, _ = np_top_2_gating(x, w, importance, 2, "none", 0.3)
  np.testing.assert_allclose(got["combine"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5)


# transformer_moe_layer_v1 against NumPy: grouping, capacity from the train
# or eval factor, gating, the experts and the combination.

def np_moe_layer_v1(x, nonpadding, gate_w, wi, wo, group_size, capacity,
                    gating, policy):
  """NumPy transformer_moe_layer_v1 (relu experts): (y, balance loss)."""
  batch, length, d_model = x.shape
  num_groups = batch * length // group_size
  xg = x.reshape(1, num_groups, group_size, d_model)
  imp = nonpadding.reshape(1, num_groups, group_size)
  if gating == "top_2":
    combine, loss, _ = np_top_2_gating(xg, gate_w, imp, capacity, policy, 0.2)
  else:
    combine, loss = np_switch_gating(xg, gate_w, imp, capacity)
  weight = combine.sum(-1)  # [1, G, S, E]: each token's weight per expert
  expert_out = np.stack([np.maximum(xg @ wi[e], 0.0) @ wo[e]
                         for e in range(wi.shape[0])], -2)  # [1,G,S,E,M]
  y = (weight[..., None] * expert_out).sum(-2)
  return y.reshape(batch, length, -1), loss, combine


@pytest.mark.parametrize("gating,policy", [
    ("top_2", "all"), ("top_2", "threshold"), ("switch", None)])
def test_moe_layer_v1_matches_numpy(gating, policy):
  """32 tokens in groups of 16 for 4 experts: capacity 4 in training
  (factor 1.0) and 8 in eval (factor 2.0); tokens past capacity are
  dropped. The same variables serve both modes."""
  batch, length, d_model, hidden, experts = 4, 8, 8, 6, 4
  rng = np.random.RandomState(3)
  # A shared component makes the router favour some experts: drops.
  x = (rng.randn(batch, length, d_model)
       + 0.7 * rng.randn(d_model)).astype(np.float32)
  nonpadding = np.ones((batch, length), np.float32)
  nonpadding[3, 5:] = 0.0
  hparams = moe.HParams(
      moe_gating=gating, moe_num_experts=experts, moe_loss_coef=1e-2,
      moe_hidden_size=hidden, moe_group_size=16,
      moe_capacity_factor_train=1.0, moe_capacity_factor_eval=2.0,
      moe_min_expert_capacity=1, moe_use_second_place_loss=False,
      moe_second_policy_train=policy, moe_second_policy_eval=policy,
      moe_second_threshold_train=0.2, moe_second_threshold_eval=0.2,
      moe_switch_policy_train="argmax", moe_switch_policy_eval="argmax")

  def build(mesh):
    dims = [mtf.Dimension("batch", batch), mtf.Dimension("length", length),
            mtf.Dimension("d_model", d_model)]
    xt = mtf_testing.import_array(mesh, x, dims)
    pad = mtf_testing.import_array(mesh, nonpadding, dims[:-1])
    outputs = {}
    for mode, train in (("train", True), ("eval", False)):
      with tf.compat.v1.variable_scope("moe", reuse=tf.compat.v1.AUTO_REUSE):
        y, loss = moe.transformer_moe_layer_v1(
            xt, dims[-1], hparams, train, mtf.VariableDType(),
            nonpadding=pad)
      outputs.update({f"{mode}_y": y, f"{mode}_loss": loss})
    return outputs, None, {}

  got = layer_testing.run_under("all:1", "", "function", build)
  gate_w = got[f"moe/{gating}_gating/kernel"]
  wi, wo = got["moe/wi/kernel"], got["moe/wo/kernel"]
  assert gate_w.shape == (d_model, experts)
  assert wi.shape == (experts, d_model, hidden), wi.shape
  assert wo.shape == (experts, hidden, d_model), wo.shape
  dropped = {}
  for mode, capacity in (("train", 4), ("eval", 8)):
    want, want_loss, combine = np_moe_layer_v1(
        x, nonpadding, gate_w, wi, wo, 16, capacity, gating, policy)
    np.testing.assert_allclose(got[f"{mode}_y"], want, rtol=1e-4, atol=1e-5,
                               err_msg=mode)
    np.testing.assert_allclose(got[f"{mode}_loss"], 1e-2 * want_loss,
                               rtol=1e-5, err_msg=mode)
    np.testing.assert_array_equal(got[f"{mode}_y"][3, 5:], 0.0)
    assert (combine != 0).sum((-3, -1)).max() == capacity  # some expert full
    routed = (combine != 0).sum((-2, -1)).reshape(batch, length)
    dropped[mode] = ((routed == 0) & (nonpadding == 1)).sum()
  # The case drops real tokens at capacity, more in training.
  assert dropped["train"] > dropped["eval"], dropped


@pytest.mark.parametrize("case_id,mesh_shape,layout", GATING_LAYOUTS)
def test_switch_gating_matches_numpy(case_id, mesh_shape, layout):
  del case_id
  capacity = 2
  hparams = moe.HParams(moe_switch_policy_train="argmax",
                        moe_switch_policy_eval="argmax")
  x, importance, w, got = _run_gating(mesh_shape, layout, moe._switch_gating,
                                      hparams, capacity)
  want, want_loss = np_switch_gating(x, w, importance, capacity)
  np.testing.assert_allclose(got["combine"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got["dispatch"], (want != 0).astype(
      np.float32))
  np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5)
  assert ((want != 0).sum((-2, -1))[importance == 1] == 0).any()  # drops


def test_rand_1_gating_is_switch_under_its_older_names():
  """moe_gating="rand_1" (the original's first name of Switch) routes as
  Switch, reading the moe_rand_1_* policy, with a "rand_1_gating" router."""
  capacity = 2
  hparams = moe.HParams(moe_rand_1_policy_train="argmax",
                        moe_switch_policy_train="no such policy")
  x, importance, w, got = _run_gating("all:1", "", moe._rand_1_gating,
                                      hparams, capacity)
  want, want_loss = np_switch_gating(x, w, importance, capacity)
  np.testing.assert_allclose(got["combine"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5)
  assert any("rand_1_gating/kernel" in k for k in got), sorted(got)
  # Without rand_1 settings, the switch ones are used.
  _, _, _, again = _run_gating(
      "all:1", "", moe._rand_1_gating,
      moe.HParams(moe_switch_policy_train="argmax"), capacity)
  np.testing.assert_allclose(again["combine"], want, rtol=1e-5, atol=1e-6)


def test_split_into_groups():
  assert moe._split_into_groups(64, 8, 1) == (8, 8)
  assert moe._split_into_groups(64, 8, 8) == (8, 8)
  assert moe._split_into_groups(64, 64, 8) == (8, 8)
  assert moe._split_into_groups(48, 10, 4) == (4, 12)
  assert moe._split_into_groups(48, 10, 8) == (8, 6)
  with pytest.raises(ValueError, match="mesh dimension"):
    moe._split_into_groups(12, 4, 8)


def test_set_default_moe_hparams():
  hparams = moe.HParams()
  moe.set_default_moe_hparams(hparams)
  assert hparams.moe_num_experts == 16
  assert hparams.moe_gating == "top_2"
  assert hparams.moe_second_policy_train == "random"


def test_unknown_policy_and_gating_are_errors():
  with pytest.raises(ValueError, match="second-expert policy 'sometimes'"):
    _run_gating("all:1", "", moe._top_2_gating, _top_2_hparams("sometimes"),
                2)
  with pytest.raises(ValueError, match="moe_gating='top_3'"):
    _run_moe1d("all:1", "", "function", moe_gating="top_3")


# MoE1D: the same answer under every layout.

BATCH, LENGTH = 8, 8
MOE_LAYOUTS = (
    ("experts_on_batch", "batch:8", "batch:batch;experts:batch"),
    ("experts_on_model", "model:8", "experts:model;d_ff:model;heads:model"),
    ("2d", "batch:2;model:4",
     "batch:batch;experts:batch;expert_hidden:model;d_ff:model"),
    # Data parallel, every processor holding every expert.
    ("dp", "batch:8", "batch:batch"),
    # 2-D with the experts over "model", and with d_model split over
    # "model" for the all-to-all over "batch" (the original's
    # d_model_split).
    ("2d_experts_on_model", "batch:2;model:4",
     "batch:batch;experts:model;d_ff:model"),
    ("2d_d_model_split", "batch:2;model:4",
     "batch:batch;experts:batch;d_model_split:model;expert_hidden:model"),
)


def _moe1d_build(mesh_shape, layout, moe_gating="top_2", **kwargs):
  """build(mesh) for run_under: MoE1D on a padded batch, in train mode."""
  rng = np.random.RandomState(1)
  x = rng.randn(BATCH, LENGTH, D_MODEL).astype(np.float32)
  cotangent = rng.randn(BATCH, LENGTH, D_MODEL).astype(np.float32)
  sequence_id = np.ones((BATCH, LENGTH), np.int32)
  sequence_id[2, 5:] = 0
  sequence_id[7, 2:] = 0
  params = dict(num_experts=8, hidden_size=16, group_size=8,
                capacity_factor_train=2.0, min_expert_capacity=1,
                moe_gating=moe_gating)
  params.update(kwargs)

  def build(mesh):
    batch = mtf.Dimension("batch", BATCH)
    length = mtf.Dimension("length", LENGTH)
    d_model = mtf.Dimension("d_model", D_MODEL)
    xt = mtf_testing.import_array(mesh, x, [batch, length, d_model])
    model = layer_testing.ModelStub(D_MODEL)
    model.layout, model.mesh_shape = layout, mesh_shape
    context = layer_testing.make_context(
        mesh, model, batch, length, sequence_id=mtf_testing.import_array(
            mesh, sequence_id, [batch, length]))
    with tf.compat.v1.variable_scope("moe"):
      y = moe.MoE1D(**params).call(context, xt)
    (aux,) = context.losses
    cot = mtf_testing.import_array(mesh, cotangent, [batch, length, d_model])
    loss = mtf.reduce_sum(y * cot) + aux
    return {"y": y, "aux": aux}, loss, {"x": xt}

  return build


def _run_moe1d(mesh_shape, layout, mode, **kwargs):
  return layer_testing.run_under(mesh_shape, layout, mode,
                                 _moe1d_build(mesh_shape, layout, **kwargs))


@pytest.fixture(scope="module")
def moe1d_reference():
  return _run_moe1d("all:1", "", "function")


# Every layout in tf.function; graph mode on the 2-D layout and SIMD on a
# 1-D one (the lowering is the same Python code in every mode: see
# CONTRIBUTING's op tests).
@pytest.mark.parametrize("case_id,mesh_shape,layout,mode", [
    case + ("function",) for case in MOE_LAYOUTS] + [
        MOE_LAYOUTS[2] + ("graph",), MOE_LAYOUTS[0] + ("simd",)])
def test_moe1d_same_under_layouts(moe1d_reference, case_id, mesh_shape,
                                  layout, mode):
  got = _run_moe1d(mesh_shape, layout, mode)
  assert set(got) == set(moe1d_reference)
  for key, want in moe1d_reference.items():
    np.testing.assert_allclose(
        got[key], want, rtol=1e-5, atol=1e-5,
        err_msg=f"{key} differs under {case_id} ({layout!r}) in {mode}")


def test_moe1d_reference_is_meaningful(moe1d_reference):
  assert sorted(k for k in moe1d_reference if k.startswith("moe/")) == [
      "moe/top_2_gating/kernel", "moe/wi/kernel", "moe/wo/kernel"]
  y = moe1d_reference["y"]
  assert np.abs(y).max() > 0
  # Padding goes to no expert: its output is zero.
  np.testing.assert_array_equal(y[7, 2:], 0.0)
  assert np.abs(moe1d_reference["d_x"]).max() > 0
  assert 0 < moe1d_reference["aux"] < 1e-2 * 8


def _other_gatings_build(mesh_shape, layout):
  """build(mesh): the other gatings, each an MoE1D on the same input."""
  builds = {g: _moe1d_build(mesh_shape, layout, moe_gating=g, z_loss=1e-3,
                           ntlb_top_k=2)
            for g in OTHER_GATINGS}

  def build(mesh):
    outputs, loss, wrt = {}, None, None
    for gating, one in builds.items():
      with tf.compat.v1.variable_scope(gating):
        out, l, w = one(mesh)
      outputs.update({f"{gating}_{k}": v for k, v in out.items()})
      loss = l if loss is None else loss + l
      wrt = wrt or {}
      wrt.update({f"{gating}_{k}": v for k, v in w.items()})
    return outputs, loss, wrt

  return build


OTHER_GATINGS = ("switch", "switch_max", "ntlb", "expert_selection")


def test_other_gatings_same_under_layouts():
  want = layer_testing.run_under(
      "all:1", "", "function", _other_gatings_build("all:1", ""))
  _, mesh_shape, layout = MOE_LAYOUTS[2]
  got = layer_testing.run_under(mesh_shape, layout, "function",
                                _other_gatings_build(mesh_shape, layout))
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5,
                               err_msg=key)
  for gating in OTHER_GATINGS:
    assert np.abs(want[f"{gating}_y"]).max() > 0, gating
    assert f"{gating}/moe/{gating}_gating/kernel" in want


def _lowering_counters(mesh_shape, layout):
  """The collectives of one MoE1D forward and backward pass."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs, loss, wrt = _moe1d_build(mesh_shape, layout)(mesh)
    grads = mtf.gradients([loss], list(wrt.values()))
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
    lowering = mtf.Lowering(graph, {mesh: impl})
    for t in list(outputs.values()) + grads:
      lowering.export_to_tf_tensor(t)
    return dict(lowering.counters)


# The dispatched tensor [experts=8, groups=8, capacity=2, d_model=16] in
# float32: an all-to-all that carries it once (no replication) moves this.
DISPATCHED_BYTES = 8 * 8 * 2 * D_MODEL * 4


@pytest.mark.parametrize("mesh_shape,layout,experts_axis,split_d_model", [
    ("batch:8", "batch:batch;experts:batch", "batch", False),
    # The experts over a mesh dimension called "model" (which then also
    # splits the tokens).
    ("model:8", "batch:model;experts:model", "model", False),
    # 2-D: experts over "batch"; d_model is split over "model" for the move
    # (the original's d_model_split), so each all-to-all carries a quarter
    # of every vector and d_model is gathered back over "model" after it.
    ("batch:2;model:4",
     "batch:batch;experts:batch;d_model_split:model;expert_hidden:model",
     "batch", True),
])
def test_experts_split_dispatch_is_all_to_all(mesh_shape, layout,
                                              experts_axis, split_d_model):
  counters = _lowering_counters(mesh_shape, layout)
  # Dispatch and combine, forward and backward.
  assert counters.get(f"comm/alltoall/{experts_axis}/calls", 0) == 4, (
      counters)
  assert counters[f"comm/alltoall/{experts_axis}/bytes"] == (
      4 * DISPATCHED_BYTES), counters
  assert not [k for k in counters
              if k.startswith(f"comm/allconcat/{experts_axis}/")], counters
  if not split_d_model:
    assert not [k for k in counters if k.startswith("comm/allconcat")], (
        counters)


def test_experts_over_model_with_replicated_tokens_dispatch_locally():
  """When the tokens are not split over the experts' mesh dimension there
  is nothing to exchange: each processor slices its experts' inputs, and
  only the experts' outputs are gathered (forward) and the gradients of
  their inputs (backward)."""
  counters = _lowering_counters("model:8",
                                "experts:model;d_ff:model;heads:model")
  assert not [k for k in counters if k.startswith("comm/alltoall")], (
      counters)
  assert counters.get("comm/allconcat/model/calls") == 2, counters
  assert counters["comm/allconcat/model/bytes"] == 2 * DISPATCHED_BYTES, (
      counters)


def test_gin_binds_moe1d_under_the_original_names():
  import gin  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config("""
        import mesh_tensorflow.transformer.moe
        MoE1D.num_experts = 4
        mesh_tensorflow.transformer.moe.MoE1D.hidden_size = 32
        layers = [@moe.MoE1D]
    """)
    try:
      layer = gin.query_parameter("%layers")[0].scoped_configurable_fn()
    finally:
      gin.clear_config()
  assert isinstance(layer, moe.MoE1D)
  assert layer._hparams.moe_num_experts == 4
  assert layer._hparams.moe_hidden_size == 32


# MoE2D: a [expert_x=2, expert_y=4] grid on [outer_batch=4, batch=2, ...]
# inputs; "expert_x" splits like the batch and "expert_y" like the outer
# batch. A group size of 4 gives the same group counts on one processor as
# on the mesh.
MOE2D_LAYOUT = ("batch:2;model:4",
                "batch:batch;expert_x:batch;outer_batch:model;"
                "expert_y:model")


def _moe2d_build(mesh_shape, layout):
  rng = np.random.RandomState(2)
  x = rng.randn(4, 2, LENGTH, D_MODEL).astype(np.float32)

  def build(mesh):
    outer = mtf.Dimension("outer_batch", 4)
    batch = mtf.Dimension("batch", 2)
    length = mtf.Dimension("length", LENGTH)
    d_model = mtf.Dimension("d_model", D_MODEL)
    xt = mtf_testing.import_array(mesh, x, [outer, batch, length, d_model])
    model = layer_testing.ModelStub(D_MODEL)
    model.layout, model.mesh_shape = layout, mesh_shape
    context = layer_testing.make_context(mesh, model, batch, length)
    with tf.compat.v1.variable_scope("moe2d"):
      y = moe.MoE2D(expert_x=2, expert_y=4, hidden_size=16,
                    group_size=4).call(context, xt)
    (aux,) = context.losses
    return {"y": y, "aux": aux}, mtf.reduce_sum(y * y) + aux, {"x": xt}

  return build


MOE2D_LAYOUTS = (
    ("dp", "batch:2", "batch:batch;expert_x:batch"),
    ("mp", "model:4", "outer_batch:model;expert_y:model"),
    ("2d", MOE2D_LAYOUT[0], MOE2D_LAYOUT[1]),
)


@pytest.fixture(scope="module")
def moe2d_reference():
  return layer_testing.run_under("all:1", "", "function",
                                 _moe2d_build("all:1", ""))


@pytest.mark.parametrize("case_id,mesh_shape,layout,mode", [
    case + ("function",) for case in MOE2D_LAYOUTS] + [
        MOE2D_LAYOUTS[2] + ("graph",)])
def test_moe2d_same_under_layouts(moe2d_reference, case_id, mesh_shape,
                                  layout, mode):
  want = moe2d_reference
  got = layer_testing.run_under(mesh_shape, layout, mode,
                                _moe2d_build(mesh_shape, layout))
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5,
                               err_msg=f"{key} {case_id} {mode}")
  assert np.abs(want["y"]).max() > 0
  assert sorted(k for k in want if k.startswith("moe2d/")) == [
      "moe2d/inner_gating/kernel", "moe2d/outer_gating/kernel",
      "moe2d/wi/kernel", "moe2d/wo/kernel"]


def test_moe1d_without_length_dim_in_eval():
  """Incremental decoding calls the layer on [batch, d_model]: the result is
  that of a length-1 sequence."""
  x = np.random.RandomState(4).randn(BATCH, D_MODEL).astype(np.float32)

  def build(mesh):
    batch = mtf.Dimension("batch", BATCH)
    length = mtf.Dimension("length", 1)
    d_model = mtf.Dimension("d_model", D_MODEL)
    model = layer_testing.ModelStub(D_MODEL)
    outputs = {}
    for name, dims in (("step", [batch, d_model]),
                       ("seq", [batch, length, d_model])):
      context = layer_testing.make_context(mesh, model, batch, length,
                                           mode="eval")
      with tf.compat.v1.variable_scope("moe", reuse=tf.compat.v1.AUTO_REUSE):
        outputs[name] = moe.MoE1D(
            num_experts=4, hidden_size=8, group_size=8,
            second_policy_eval="all").call(
                context, mtf_testing.import_array(
                    mesh, x.reshape([d.size for d in dims]), dims))
    return outputs, None, {}

  got = layer_testing.run_under("all:1", "", "function", build)
  assert got["step"].shape == (BATCH, D_MODEL)
  np.testing.assert_allclose(got["step"], got["seq"][:, 0], rtol=1e-6)
  assert np.abs(got["step"]).max() > 0


def test_moe2d_dispatch_is_all_to_all():
  """Both levels move tokens with all-to-alls (forward pass)."""
  mesh_shape, layout = MOE2D_LAYOUT
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs, _, _ = _moe2d_build(mesh_shape, layout)(mesh)
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowering.export_to_tf_tensor(outputs["aux"])
    counters = dict(lowering.counters)
  assert counters.get("comm/alltoall/batch/calls", 0) >= 2, counters
  assert counters.get("comm/alltoall/model/calls", 0) >= 2, counters
  assert not [k for k in counters if k.startswith("comm/allconcat")], (
      counters)


def test_language_model_with_moe1d_overfits_a_tiny_batch():
  """A one-block LM whose feed-forward layer is an MoE1D learns the fixed
  batch of model_testing down to what no LM can beat (plus the balance
  loss)."""
  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import transformer
  from tests.transformer import model_testing as mt
  from tests.transformer import test_transformer_model
  from tests.transformer import tiny_layers

  def make_loss(mesh):
    moe_layer = lambda: moe.MoE1D(  # pylint: disable=g-long-lambda
        num_experts=4, hidden_size=32, group_size=64,
        capacity_factor_train=2.0, second_policy_train="all",
        min_expert_capacity=1)
    model = transformer.Unitransformer(
        transformer.make_layer_stack(
            [tiny_layers.TinySelfAttention, moe_layer], num_layers=1),
        d_model=mt.D, input_vocab_size=mt.V, output_vocab_size=mt.V,
        autoregressive=True, max_length=mt.L, z_loss=0.0,
        vocab_divisor=mt.VOCAB_DIVISOR, name="decoder", layout="",
        mesh_shape="all:1")
    return mt.lm_loss(model, mesh)

  losses = mt.train_losses(
      make_loss, "all:1", "", "function", 120,
      lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.03))
  floor = test_transformer_model._prefix_entropy(mt.TARGETS)
  assert losses[-1] < floor + 0.05, (floor, losses[::10])
