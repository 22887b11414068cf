"""The big models' gin files have their papers' parameter counts.

models/t5_11b.gin (T5-11B, about 11 billion parameters) and
models/mtf_lm_5b.gin (the Mesh-TensorFlow paper's largest language model,
4.90 billion in its authors' configuration) are parsed after defaults.gin,
as the binary does, and their models built as mtf graphs only: variables
are shapes there, nothing is lowered or allocated, so counting 11 billion
parameters takes a few seconds.
"""

import pathlib

import gin
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.transformer
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import utils

GIN_DIR = pathlib.Path(mesh_tensorflow.transformer.__file__).parent / "gin"


def _t5_11b():
  """T5-11B's parameters, summed by hand: per head d_kv 128, 128 heads."""
  d_model, d_ff, inner, vocab = 1024, 65536, 128 * 128, 32128
  attention = 4 * d_model * inner
  ffn = 2 * d_model * d_ff
  encoder_block = attention + ffn + 2 * d_model  # Two RMS-norm scales.
  decoder_block = 2 * attention + ffn + 3 * d_model
  relative_bias = 32 * 128  # Buckets x heads, one per stack.
  return (24 * encoder_block + 24 * decoder_block + 2 * d_model +
          vocab * d_model + 2 * relative_bias)


def _mtf_lm_5b():
  d_model, d_ff, inner, vocab, length = 1024, 262144, 256 * 256, 32768, 256
  block = 4 * d_model * inner + 2 * d_model * d_ff + 2 * d_model
  return 6 * block + d_model + 2 * vocab * d_model + length * d_model


# name: (model type, published parameters, exact count of these sizes).
MODELS = {
    "models/t5_11b.gin": ("bitransformer", 11.0e9, _t5_11b()),
    "models/mtf_lm_5b.gin": ("lm", 4.90e9, _mtf_lm_5b()),
}


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parameters(name):
  """(model type, the model's mtf graph: one training-mode call)."""
  for path in ("defaults.gin", name):
    gin.parse_config_file(str(GIN_DIR / path))
  model_type = gin.query_parameter("utils.run.model_type")
  vocab_size = gin.query_parameter("%vocab_size")
  model = utils.build_model(model_type, input_vocab_size=vocab_size,
                            output_vocab_size=vocab_size)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  ids = mtf.zeros(mesh, mtf.Shape([mtf.Dimension("batch", 1),
                                   mtf.Dimension("length", 4)]), tf.int32)
  inputs = ids if model_type == "bitransformer" else (
      transformer.autoregressive_inputs(ids))
  model.call_simple(inputs=inputs, targets=ids, compute_loss=True,
                    mode="train", variable_dtype=utils.get_variable_dtype())
  return model_type, graph


@pytest.mark.parametrize("name", sorted(MODELS))
def test_big_model_has_its_papers_parameter_count(name):
  model_type, published, exact = MODELS[name]
  built_type, graph = _parameters(name)
  assert built_type == model_type
  count = sum(v.shape.size for v in graph.trainable_variables)
  assert count == exact, (count, exact)
  assert abs(count - published) < 0.03 * published, (count, published)
  names = [v.name for v in graph.trainable_variables]
  if model_type == "bitransformer":
    # T5: one token embedding shared by both stacks and the softmax, no
    # position embeddings, a relative position bias per stack.
    assert [n for n in names if "embedding" in n] == ["shared/embedding"]
    assert sum("relative_attention_bias" in n for n in names) == 2, names
  else:
    # Learned positions; the softmax is not the embedding.
    assert any("positional_embedding" in n for n in names), names
    assert any(n.endswith("logits/kernel") for n in names), names
