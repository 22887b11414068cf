"""TransformerPlanModel: the binary's models in each planned structure.

Tiny encoder-decoder and LM (2 blocks) planned from gin files, as for a
machine this one is not: each structure's training graph builds (mtf
graph only), pipelined graphs carry the "stage" dimension, each stack
recomputes the layers its structure says, the settings are gin, and
nothing the planner binds stays in the caller's gin configuration (a
locked one, as the binary's).
"""

import gin
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.strategies import data_parallel_sharding
from mesh_tensorflow.transformer import plan_gin
from mesh_tensorflow.transformer import plan_model
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer.binary import gin_state

Structure = plan_space.Structure
TINY = ["d_model = 8", "d_ff = 8", "num_heads = 2", "d_kv = 4",
        "num_layers = 2", "dropout_rate = 0.0",
        # Fewer operations per variable than Adafactor: quicker builds.
        "utils.run.optimizer = @optimize.SgdOptimizer",
        "utils.run.learning_rate_schedule = 0.1"]
BATCH = 2


def _model(gin_file):
  return plan_gin.from_gin(
      [gin_file], TINY, batch_size=BATCH, sequence_length=4, vocab_size=16)


@pytest.fixture(scope="module")
def bi():
  return _model("models/bi_base.gin")


@pytest.fixture(scope="module")
def lm():
  return _model("models/lm_base.gin")


def _build(model, structure, **kwargs):
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    graph, outputs = model.build(structure, **kwargs)
  assert len(outputs) == 1 and outputs[0].shape.ndims == 0
  return graph, outputs


def _recomputed(graph):
  """{stack scope: number of recompute operations in it}."""
  counts = {}
  for op in graph.operations:
    grad_fn = getattr(op, "_grad_fn", None)
    if (isinstance(op, mtf.CustomGradientOperation) and
        grad_fn.__qualname__.startswith("recompute_grad.")):
      scope = op.name.split("/")[0]
      counts[scope] = counts.get(scope, 0) + 1
  return counts


def _stage_sizes(graph):
  return {d.size for op in graph.operations for t in op.outputs
          for d in t.shape.dims if d.name == "stage"}


def test_structures(bi, lm):
  # Encoder 4 layers (2 blocks of 2), decoder 6 (2 blocks of 3).
  assert bi.stack_layers == {"encoder": 4, "decoder": 6}
  plain = [Structure(recompute_layers=k) for k in (0, 3, 6)]
  pipelined = [Structure(2, 2, 0), Structure(2, 2, 6)]
  assert bi.structures(2) == plain + pipelined
  # 4 stages would split a block; one processor: no stages.
  assert bi.structures(4) == plain + pipelined
  assert bi.structures(1) == plain
  assert lm.stack_layers == {"": 4}
  assert lm.structures(8) == [Structure(recompute_layers=k)
                              for k in (0, 2, 4)] + [
                                  Structure(2, 2, 0), Structure(2, 2, 4)]


@pytest.mark.parametrize("structure", [
    Structure(), Structure(recompute_layers=3),
    Structure(recompute_layers=6), Structure(2, 2, 0), Structure(2, 2, 6)],
                         ids=lambda s: s.describe())
def test_each_bitransformer_structure_builds(bi, structure):
  graph, _ = _build(bi, structure)
  k = structure.recompute_layers
  if structure.pipelined:
    assert _stage_sizes(graph) == {structure.stages}
    # Each of the M + S - 1 pipeline iterations of a stack, or none.
    iterations = structure.micro_batches + structure.stages - 1
    want = {"encoder": iterations, "decoder": iterations} if k else {}
  else:
    assert not _stage_sizes(graph)
    want = {s: min(k, n) for s, n in bi.stack_layers.items() if k}
  assert _recomputed(graph) == want


@pytest.mark.parametrize("structure", [
    Structure(), Structure(recompute_layers=2),
    Structure(recompute_layers=4), Structure(2, 2, 0), Structure(2, 2, 4)],
                         ids=lambda s: s.describe())
def test_each_lm_structure_builds(lm, structure):
  graph, _ = _build(lm, structure)
  assert _stage_sizes(graph) == ({2} if structure.pipelined else set())
  # The LM's variables (and operations) are under "transformer/".
  k = structure.recompute_layers
  want = 3 if structure.pipelined else k
  assert _recomputed(graph) == ({"transformer": want} if k else {})


def test_settings_are_gin_the_binary_runs(bi):
  for structure in bi.structures(2):
    settings = bi.settings(structure)
    lines = [f"{k} = {v}" for k, v in settings.items()]
    state = gin_state.GinState.parse(
        [utils.find_gin_file(f, [utils.gin_dir()])
         for f in ("defaults.gin", "models/bi_base.gin")], TINY + lines)
    for key, value in settings.items():
      if not value.startswith("@"):
        assert repr(state.query(key)) == value, key
  assert bi.settings(Structure(recompute_layers=3)) == {
      "encoder/transformer.LayerStack.recompute_grads": "[0, 1, 2]",
      "decoder/transformer.LayerStack.recompute_grads": "[0, 1, 2]"}
  assert bi.settings(Structure(2, 2, 0))[
      "decoder/transformer.PipelinedLayerStack.num_stages"] == "2"


def test_gin_bindings_do_not_leak(lm):
  """The caller's locked configuration (as the binary's) is as it was:
  same bindings, still locked, nothing new in its operative config."""
  gin.clear_config()
  try:
    gin.parse_config(["utils.run.batch_size = 7"])
    gin.finalize()
    before = (gin.config_str(), gin.operative_config_str())
    model = _model("models/lm_base.gin")
    _build(model, Structure(2, 2, 4))
    _build(lm, Structure(recompute_layers=2))
    assert (gin.config_str(), gin.operative_config_str()) == before
    assert gin.config_is_locked()
    with pytest.raises(ValueError, match="no bound parameters"):
      gin.query_parameter("transformer.PipelinedLayerStack.num_stages")
  finally:
    gin.clear_config()


def test_zero_shards_the_mesh_before_the_model(lm):
  _, outputs = _build(lm, Structure(), zero="parameters",
                      mesh_shape="batch:2", layout_rules="batch:batch")
  sharding = data_parallel_sharding.sharding_of(outputs[0].mesh)
  assert sharding.shard_parameters and sharding.shard_weight_update
  with pytest.raises(ValueError, match="give mesh_shape and layout_rules"):
    _build(lm, Structure(), zero="weight_update")


@pytest.mark.parametrize("structure,match", [
    (Structure(2, 4, 0), r"4 micro-batches do not divide the batch of 2"),
    (Structure(2, 2, 3), r"all its layers or none"),
    (Structure(recompute_layers=7), r"recomputes 7 layers"),
    (Structure(4, 4, 0),
     r"4 stages do not divide the encoder stack's 4 layers"),
])
def test_structures_the_model_cannot_run(bi, structure, match):
  with pytest.raises(ValueError, match=match):
    bi.settings(structure)
