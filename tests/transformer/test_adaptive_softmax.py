"""AdaptiveSoftmaxVocabEmbedding: NumPy log-probs, loss, layouts, training."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import adaptive_softmax
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing
from tests.transformer import layer_testing
from tests.transformer import model_testing

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = 8
VOCAB = mtf.Dimension("vocab", 20)
# Head: ids 0..9 plus two cluster entries (12); tails 10..13 (d_model, 4
# ids) and 14..19 (factorized, 6 ids, half its targets dropped in training).
CLUSTERS = [{"token_count": 10},
            {"token_count": 4},
            {"token_count": 6, "embedding_size": 4}]
RNG = np.random.RandomState(0)
HIDDEN = RNG.normal(size=[8, 4, D_MODEL]).astype(np.float32)
TARGETS = RNG.randint(0, 20, size=[8, 4]).astype(np.int32)
LOSS_WEIGHTS = RNG.normal(size=[8, 4, 20]).astype(np.float32)
# Vocabulary sizes 12, 4, 6 and 20 are even: the vocabulary splits in two.
LAYOUTS = (
    layer_testing.ONE_PROCESSOR,
    ("dp", "batch:8", "batch:batch"),
    ("mp", "model:2", "vocab:model"),
    ("2d", "batch:4;model:2", "batch:batch;vocab:model"),
)


class _Decoder:
  """What the loss reads from the Unitransformer."""
  z_loss = 0.0

  def loss_denominator(self, targets, num_microbatches):
    return float(targets.shape.size * num_microbatches)


def _build(mode, clusters=CLUSTERS):
  """build(mesh): eval log-probs (weighted-sum loss), or the train loss."""

  def build(mesh):
    context = layer_testing.make_context(
        mesh, layer_testing.ModelStub(D_MODEL), BATCH, LENGTH, mode=mode)
    d_model = mtf.Dimension("d_model", D_MODEL)
    embedding = adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
        mesh, VOCAB, d_model, context.variable_dtype, "emb", None,
        clusters=clusters)
    hidden = mtf_testing.import_array(mesh, HIDDEN, [BATCH, LENGTH, d_model])
    targets = mtf_testing.import_array(mesh, TARGETS, [BATCH, LENGTH])
    out = embedding.hidden_to_logits(hidden, context)
    loss = adaptive_softmax.adaptive_softmax_loss_fn(
        _Decoder(), context, out, targets, VOCAB)
    outputs = {"loss": loss}
    objective = loss
    if mode != "train":
      outputs["log_probs"] = out
      objective = mtf.reduce_sum(out * mtf_testing.import_array(
          mesh, LOSS_WEIGHTS, [BATCH, LENGTH, VOCAB]))
    wrt = {"hidden": hidden}
    wrt.update({v.name: v.outputs[0]
                for v in mesh.graph.trainable_variables})
    return outputs, objective, wrt

  return build


def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_log_probs_match_numpy_and_sum_to_one():
  got, graph = mtf_testing.run_program("all:1", "", "function",
                                       _build("eval"))
  assert sorted(v.name for v in graph.trainable_variables) == [
      "emb_0", "emb_1", "emb_21", "emb_22"]
  h = HIDDEN.astype(np.float64) * D_MODEL ** -0.5
  head = _np_log_softmax(h @ got["emb_0"].T)  # [8, 4, 12]
  tail1 = _np_log_softmax(h @ got["emb_1"].T)
  tail2 = _np_log_softmax(h @ got["emb_22"].T @ got["emb_21"].T)
  want = np.concatenate([head[..., :10], head[..., 10:11] + tail1,
                         head[..., 11:12] + tail2], -1)
  np.testing.assert_allclose(got["log_probs"], want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.exp(got["log_probs"]).sum(-1), 1.0,
                             rtol=1e-5)
  # Evaluation's loss is the mean cross entropy of these log-probs.
  nll = -np.take_along_axis(want, TARGETS[..., None], -1)[..., 0]
  np.testing.assert_allclose(got["loss"], (nll * (TARGETS != 0)).sum() / 32,
                             rtol=1e-5)


def test_training_loss_is_the_full_softmax_cross_entropy():
  """Without length projection, the clusters' losses add up to the
  cross entropy of the full adaptive softmax."""
  clusters = [dict(c, length_projection_factor=1) for c in CLUSTERS]
  train, _ = mtf_testing.run_program("all:1", "", "function",
                                     _build("train", clusters))
  full, _ = mtf_testing.run_program("all:1", "", "function",
                                    _build("eval", clusters))
  np.testing.assert_allclose(train["loss"], full["loss"], rtol=1e-5)
  for name in ("emb_0", "emb_1", "emb_21", "emb_22"):
    np.testing.assert_allclose(train[name], full[name])


def test_length_projection_drops_the_clusters_later_tokens():
  """With factor 0.5 each row keeps the first 2 of its tokens of the last
  cluster; the rest of that cluster's loss is dropped."""
  clusters = CLUSTERS[:2] + [dict(CLUSTERS[2], length_projection_factor=0.5)]
  got, _ = mtf_testing.run_program("all:1", "", "function",
                                   _build("train", clusters))
  h = HIDDEN.astype(np.float64) * D_MODEL ** -0.5
  head = _np_log_softmax(h @ got["emb_0"].T)
  tail1 = _np_log_softmax(h @ got["emb_1"].T)
  tail2 = _np_log_softmax(h @ got["emb_22"].T @ got["emb_21"].T)
  head_targets = np.where(TARGETS >= 14, 11,
                          np.where(TARGETS >= 10, 10, TARGETS))
  loss = -np.sum(np.take_along_axis(head, head_targets[..., None], -1)[..., 0]
                 * (head_targets != 0)) / 32
  in1 = (TARGETS >= 10) & (TARGETS < 14)
  loss -= np.sum(np.take_along_axis(
      tail1, np.clip(TARGETS - 10, 0, 3)[..., None], -1)[..., 0] * in1) / 32
  kept2 = 0.0
  for b in range(8):
    positions = [p for p in range(4) if TARGETS[b, p] >= 14][:2]
    for p in positions:
      kept2 -= tail2[b, p, TARGETS[b, p] - 14]
  loss += kept2 / 16  # The projected targets have 8 * 2 positions.
  np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)


@pytest.mark.parametrize("model_mode,mode,layouts", [
    ("train", "function", LAYOUTS),
    ("eval", "function", LAYOUTS),
    # 2-D only in graph mode: the time budget.
    ("train", "graph", LAYOUTS[3:])])
def test_same_under_layouts(model_mode, mode, layouts):
  clusters = CLUSTERS[:2] + [dict(CLUSTERS[2], length_projection_factor=0.5)]
  layer_testing.assert_same_under_layouts(
      _build(model_mode, clusters), layouts=layouts, modes=(mode,))


def test_rejects_bad_clusters():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  d_model = mtf.Dimension("d_model", D_MODEL)
  with pytest.raises(ValueError, match="sum to 19"):
    adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
        mesh, VOCAB, d_model, mtf.VariableDType(), "emb", None,
        clusters=[{"token_count": 10}, {"token_count": 9}])
  with pytest.raises(ValueError, match="length_projection_factor"):
    adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
        mesh, VOCAB, d_model, mtf.VariableDType(), "emb", None,
        clusters=[{"token_count": 10},
                  {"token_count": 10, "length_projection_factor": 1.5}])


def test_language_model_with_adaptive_softmax_trains():
  """A decoder-only model (no shared_params) trains with the loss_fn."""
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config(f"""
        import mesh_tensorflow.transformer.adaptive_softmax
        transformer.get_vocab_embedding_cls.cls = \\
            @adaptive_softmax.AdaptiveSoftmaxVocabEmbedding
        adaptive_softmax.AdaptiveSoftmaxVocabEmbedding.clusters = [
            {{"token_count": 14}}, {{"token_count": 10}},
            {{"token_count": {model_testing.V - 24},
              "embedding_size": 8, "length_projection_factor": 0.5}}]
    """)
    try:
      model = transformer.Unitransformer(
          transformer.make_layer_stack(
              [model_testing.tiny_layers.TinySelfAttention,
               model_testing.tiny_layers.TinyDenseRelu], num_layers=1),
          d_model=model_testing.D, input_vocab_size=model_testing.V,
          output_vocab_size=model_testing.V, autoregressive=True,
          max_length=model_testing.L, vocab_divisor=2,
          shared_embedding_and_softmax_weights=True,
          loss_fn=adaptive_softmax.adaptive_softmax_loss_fn)
      losses = model_testing.train_losses(
          lambda mesh: model_testing.lm_loss(model, mesh), "model:2",
          "vocab:model", "function", 6,
          lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.1))
    finally:
      gin.clear_config()
  assert np.all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.3, losses


def test_loss_fn_takes_hidden_states_in_any_mode():
  """As the original: given hidden states (no vocabulary dimension), the
  loss_fn computes the adaptive loss of the shared embedding, whatever
  the context's mode; output_vocab_dim may be None then."""
  clusters = [dict(c, length_projection_factor=1) for c in CLUSTERS]

  def build(mesh):
    context = layer_testing.make_context(
        mesh, layer_testing.ModelStub(D_MODEL), BATCH, LENGTH, mode="eval")
    d_model = mtf.Dimension("d_model", D_MODEL)
    context.shared_params["embedding"] = (
        adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
            mesh, VOCAB, d_model, context.variable_dtype, "emb", None,
            clusters=clusters))
    loss = adaptive_softmax.adaptive_softmax_loss_fn(
        _Decoder(), context,
        mtf_testing.import_array(mesh, HIDDEN, [BATCH, LENGTH, d_model]),
        mtf_testing.import_array(mesh, TARGETS, [BATCH, LENGTH]), None)
    return {"loss": loss}, None, {}

  got, _ = mtf_testing.run_program("all:1", "", "function", build)
  full, _ = mtf_testing.run_program("all:1", "", "function",
                                    _build("eval", clusters))
  np.testing.assert_allclose(got["loss"], full["loss"], rtol=1e-5)


def test_training_without_an_adaptive_embedding_is_an_error():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  context = layer_testing.make_context(
      mesh, layer_testing.ModelStub(D_MODEL), BATCH, LENGTH, mode="train")
  hidden = mtf.zeros(mesh, [BATCH, LENGTH, mtf.Dimension("d_model", 8)])
  with pytest.raises(ValueError, match="AdaptiveSoftmaxVocabEmbedding"):
    adaptive_softmax.adaptive_softmax_loss_fn(
        _Decoder(), context, hidden,
        mtf.zeros(mesh, [BATCH, LENGTH], tf.int32), VOCAB)

