"""The tiny Transformer trains the same under layouts that split unevenly.

With `LayoutRules(..., allow_uneven=True)` a dimension its mesh dimension
does not divide is padded (see `mesh_tensorflow/backend/padding.py`). A
decoder-only language model of the tiny layers (`tiny_layers`) with sizes
no layout of these tests divides -- a vocabulary of 259, 6 heads, a batch
of 30 and an MoE1D of 6 experts -- must give the one-processor losses step
for step under each of them (a layout may change round-off, never the
answer).
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import moe
from mesh_tensorflow.transformer import transformer
from tests.transformer import model_testing as mt
from tests.transformer import tiny_layers

B, L, V, D, HEADS, EXPERTS = 30, 8, 259, 16, 6, 6
BATCH = mtf.Dimension("batch", B)
STEPS = 3


def _targets():
  """Random ids in [2, V), each row padded (0) after a random length."""
  rng = np.random.RandomState(0)
  ids = rng.randint(2, V, size=(B, L)).astype(np.int32)
  for row, n in enumerate(rng.randint(4, L + 1, size=B)):
    ids[row, n:] = 0
  return ids


TARGETS = _targets()


def _moe_layer():
  # 30 x 8 tokens in groups of 30: 8 groups under every layout here (a
  # multiple of the mesh dimension splitting the batch), so the gating
  # routes the same tokens together whatever the layout.
  return moe.MoE1D(num_experts=EXPERTS, hidden_size=8, group_size=30,
                   capacity_factor_train=2.0, min_expert_capacity=1)


def _make_loss(with_moe, mesh_shape="all:1", layout="", length=L):
  """make_loss(mesh) for model_testing.train_losses: the LM's loss on
  TARGETS (their first `length` positions). MoE1D reads the layout and mesh
  shape from the model."""
  def make_loss(mesh):
    ffn = _moe_layer if with_moe else tiny_layers.TinyDenseRelu
    stack = transformer.make_layer_stack(
        [lambda: tiny_layers.TinySelfAttention(num_heads=HEADS), ffn],
        num_layers=1)
    model = transformer.Unitransformer(
        stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
        autoregressive=True, max_length=L, vocab_divisor=1, name="decoder",
        layout=layout, mesh_shape=mesh_shape)
    targets = mtf.import_tf_tensor(
        mesh, tf.constant(TARGETS[:, :length]),
        [BATCH, mtf.Dimension("length", length)])
    _, loss = model.call_simple(
        transformer.autoregressive_inputs(targets), targets, True)
    return loss
  return make_loss


def _sgd():
  return mtf.optimize.SgdOptimizer(0.5)


def _one_processor_losses(with_moe):
  losses = mt.train_losses(_make_loss(with_moe), "all:1", "", "function",
                           STEPS, _sgd)
  assert losses[-1] < losses[0], losses
  return losses


@pytest.fixture(scope="module")
def dense_reference():
  return _one_processor_losses(False)


@pytest.fixture(scope="module")
def moe_reference():
  return _one_processor_losses(True)


# (id, mesh shape, rules, mode, {dimension: padded size}): each case pads
# what it says, checked against the mesh implementation.
CASES = [
    ("vocab_and_heads", "model:4", "vocab:model;heads:model", "function",
     {"vocab": 260, "heads": 8}),
    ("batch", "batch:8", "batch:batch", "function", {"batch": 32}),
    ("2d", "batch:4;model:2", "batch:batch;vocab:model;d_ff:model", "simd",
     {"batch": 32, "vocab": 260}),
    ("2d_graph", "batch:2;model:4", "batch:batch;vocab:model;heads:model",
     "graph", {"vocab": 260, "heads": 8}),
]
MOE_CASES = [
    ("experts", "model:4", "experts:model;vocab:model;heads:model",
     "function", {"experts": 8, "vocab": 260, "heads": 8}),
    ("experts_2d", "batch:2;model:4",
     "batch:batch;experts:model;vocab:model;heads:model", "simd",
     {"experts": 8, "vocab": 260, "heads": 8}),
    ("experts_and_batch", "batch:8", "batch:batch;experts:batch", "function",
     {"experts": 8, "batch": 32}),
]


def _padded_sizes(mesh_shape, layout, sizes):
  """{name: padded size} of each dimension of `sizes` ({name: size}) under
  the layout, as the mesh implementation pads it."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  result = {}
  for name, size in sizes.items():
    for axis in impl.padded_axes([mtf.Dimension(name, size)]):
      result[name] = axis.slice_size * axis.pieces
  return result


def _assert_trains_like(want, with_moe, case):
  case_id, mesh_shape, rules, mode, padded = case
  layout = mtf.convert_to_layout_rules(rules).with_uneven()
  sizes = {"batch": B, "vocab": V, "heads": HEADS, "experts": EXPERTS}
  assert _padded_sizes(mesh_shape, layout, sizes) == padded, case_id
  got = mt.train_losses(_make_loss(with_moe, mesh_shape, layout), mesh_shape,
                        layout, mode, STEPS, _sgd)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                             err_msg=f"{case_id} ({rules}) in {mode}")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_training_matches_one_processor(dense_reference, case):
  _assert_trains_like(dense_reference, False, case)


@pytest.mark.parametrize("case", MOE_CASES, ids=[c[0] for c in MOE_CASES])
def test_moe_training_matches_one_processor(moe_reference, case):
  _assert_trains_like(moe_reference, True, case)


def test_these_layouts_are_refused_without_the_switch():
  """Without allow_uneven the same model and layout raise IndivisibleError
  naming the switch (so the cases above do exercise padding)."""
  with pytest.raises(mtf.IndivisibleError, match="allow_uneven"):
    mt.train_losses(_make_loss(False, "model:4", "vocab:model"), "model:4",
                    "vocab:model", "function", 1, _sgd)


def test_moe_groups_need_not_divide_over_the_mesh():
  """30 x 7 = 210 tokens over batch:8: with uneven splits the gating's groups
  need not be a multiple of 8 (7 groups of 30 under both layouts, split
  padded to 8 over batch:8); without them the grouping refuses."""
  want = mt.train_losses(_make_loss(True, length=7), "all:1", "", "function",
                         STEPS, _sgd)
  rules = mtf.convert_to_layout_rules("batch:batch;experts:batch")
  got = mt.train_losses(_make_loss(True, "batch:8", rules.with_uneven(), 7),
                        "batch:8", rules.with_uneven(), "function", STEPS,
                        _sgd)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert moe._split_into_groups(210, 30, 8, allow_uneven=True) == (7, 30)
  with pytest.raises(ValueError, match="210 tokens .* 8 processors"):
    moe._split_into_groups(210, 30, 8)
