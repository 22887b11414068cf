"""Google's BERT forward pass in float64 NumPy: the reference of the tests.

Weights are named and shaped as in google-research/bert's checkpoints
(`bert/encoder/layer_0/attention/self/query/kernel` [hidden, hidden], ...),
so the same function checks `BertModel` (through `from_mtf`, which renames
this package's variables) and the conversion of Google's checkpoints.
Configs are dicts with Google's JSON keys (tests/bert/generated_data.py).
Only Google's architecture is covered (the "original" residual structure,
biases and mean-subtracting layer norm), with learned positions or, given
a "bert/encoder/relative_attention_bias" [heads, 32], this package's
relative attention bias instead.
"""

import numpy as np


def gelu(x):
  """The tanh approximation of GELU (Google's BERT and mtf.gelu)."""
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) *
                                  (x + 0.044715 * x ** 3)))


_ACTIVATIONS = {"gelu": gelu, "relu": lambda x: np.maximum(x, 0.0),
                "tanh": np.tanh}


def layer_norm(x, gamma, beta, epsilon):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def softmax(x, axis=-1):
  x = x - x.max(axis, keepdims=True)
  e = np.exp(x)
  return e / e.sum(axis, keepdims=True)


def relative_position_bucket(relative_position, num_buckets=32,
                             max_distance=128):
  """T5's bidirectional bucket of relative position (memory - query)."""
  n = -relative_position
  num_buckets //= 2
  ret = (n < 0).astype(np.int32) * num_buckets
  n = np.abs(n)
  max_exact = num_buckets // 2
  large = max_exact + (np.log(np.maximum(n, 1) / max_exact)
                       / np.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(np.int32)
  large = np.minimum(large, num_buckets - 1)
  return ret + np.where(n < max_exact, n, large)


def _dense(w, prefix, x):
  return x @ w[prefix + "/kernel"] + w[prefix + "/bias"]


def _ln(w, prefix, x, epsilon):
  return layer_norm(x, w[prefix + "/LayerNorm/gamma"],
                    w[prefix + "/LayerNorm/beta"], epsilon)


def forward(w, config, input_ids, input_mask=None, token_type_ids=None,
            epsilon=1e-12):
  """Encoder and pooler: {"sequence_output", "pooled_output",
  "all_encoder_layers"} (float64)."""
  w = {k: np.asarray(v, np.float64) for k, v in w.items()}
  batch, seq = input_ids.shape
  hidden = config["hidden_size"]
  heads = config["num_attention_heads"]
  head_size = hidden // heads
  act = _ACTIVATIONS[config["hidden_act"]]
  if input_mask is None:
    input_mask = np.ones_like(input_ids)
  if token_type_ids is None:
    token_type_ids = np.zeros_like(input_ids)
  x = (w["bert/embeddings/word_embeddings"][input_ids]
       + w["bert/embeddings/token_type_embeddings"][token_type_ids])
  if "bert/embeddings/position_embeddings" in w:
    x += w["bert/embeddings/position_embeddings"][:seq][None]
  x = _ln(w, "bert/embeddings", x, epsilon)
  bias = (1.0 - input_mask[:, None, None, :].astype(np.float64)) * -10000.0
  if "bert/encoder/relative_attention_bias" in w:
    # [heads, query, key]: the bias of bucket(key - query).
    buckets = relative_position_bucket(
        np.arange(seq)[None, :] - np.arange(seq)[:, None])
    bias = bias + w["bert/encoder/relative_attention_bias"][:, buckets]
  layers = []
  for i in range(config["num_hidden_layers"]):
    p = f"bert/encoder/layer_{i}"

    def heads_of(t):
      return t.reshape(batch, seq, heads, head_size).transpose(0, 2, 1, 3)

    q = heads_of(_dense(w, p + "/attention/self/query", x))
    k = heads_of(_dense(w, p + "/attention/self/key", x))
    v = heads_of(_dense(w, p + "/attention/self/value", x))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_size) + bias
    context = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(
        batch, seq, hidden)
    attention = _dense(w, p + "/attention/output/dense", context)
    x = _ln(w, p + "/attention/output", attention + x, epsilon)
    intermediate = act(_dense(w, p + "/intermediate/dense", x))
    x = _ln(w, p + "/output", _dense(w, p + "/output/dense", intermediate) + x,
            epsilon)
    layers.append(x)
  pooled = np.tanh(_dense(w, "bert/pooler/dense", x[:, 0]))
  return {"sequence_output": x, "pooled_output": pooled,
          "all_encoder_layers": layers}


def _cross_entropy(logits, labels, z_loss):
  """Per-example cross-entropy plus z_loss * logsumexp^2 (as mtf's)."""
  top = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  picked = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
  return log_z - picked + z_loss * log_z ** 2


def masked_lm(w, config, sequence_output, positions, label_ids,
              label_weights, epsilon=1e-12, z_loss=1e-4):
  """(loss, per_example_loss, logits) of the masked-LM head; the logits
  cover the rows of word_embeddings and output_bias given."""
  w = {k: np.asarray(v, np.float64) for k, v in w.items()}
  act = _ACTIVATIONS[config["hidden_act"]]
  x = np.take_along_axis(sequence_output, positions[..., None], 1)
  x = act(_dense(w, "cls/predictions/transform/dense", x))
  x = _ln(w, "cls/predictions/transform", x, epsilon)
  logits = (x @ w["bert/embeddings/word_embeddings"].T
            + w["cls/predictions/output_bias"])
  per_example = _cross_entropy(logits, label_ids, z_loss)
  loss = (label_weights * per_example).sum() / (label_weights.sum() + 1e-5)
  return loss, per_example, logits


def next_sentence(w, pooled_output, labels, z_loss=1e-4):
  """(loss, per_example_loss, logits) of next-sentence prediction."""
  logits = (pooled_output @ np.asarray(
      w["cls/seq_relationship/output_weights"], np.float64).T
            + w["cls/seq_relationship/output_bias"])
  per_example = _cross_entropy(logits, labels, z_loss)
  return per_example.mean(), per_example, logits


def google_shapes(config):
  """{Google name: shape} of a BERT with this config."""
  h = config["hidden_size"]
  i = config["intermediate_size"]
  shapes = {
      "bert/embeddings/word_embeddings": (config["vocab_size"], h),
      "bert/embeddings/token_type_embeddings": (config["type_vocab_size"], h),
      "bert/embeddings/position_embeddings": (
          config["max_position_embeddings"], h),
      "bert/embeddings/LayerNorm/gamma": (h,),
      "bert/embeddings/LayerNorm/beta": (h,),
      "bert/pooler/dense/kernel": (h, h),
      "bert/pooler/dense/bias": (h,),
      "cls/predictions/transform/dense/kernel": (h, h),
      "cls/predictions/transform/dense/bias": (h,),
      "cls/predictions/transform/LayerNorm/gamma": (h,),
      "cls/predictions/transform/LayerNorm/beta": (h,),
      "cls/predictions/output_bias": (config["vocab_size"],),
      "cls/seq_relationship/output_weights": (2, h),
      "cls/seq_relationship/output_bias": (2,),
  }
  for n in range(config["num_hidden_layers"]):
    p = f"bert/encoder/layer_{n}"
    for dense, (fan_in, fan_out) in (
        ("attention/self/query", (h, h)), ("attention/self/key", (h, h)),
        ("attention/self/value", (h, h)), ("attention/output/dense", (h, h)),
        ("intermediate/dense", (h, i)), ("output/dense", (i, h))):
      shapes[f"{p}/{dense}/kernel"] = (fan_in, fan_out)
      shapes[f"{p}/{dense}/bias"] = (fan_out,)
    for norm in ("attention/output", "output"):
      shapes[f"{p}/{norm}/LayerNorm/gamma"] = (h,)
      shapes[f"{p}/{norm}/LayerNorm/beta"] = (h,)
  return shapes


def random_google_weights(config, seed=0):
  """Random float32 weights in Google's names (gammas near 1)."""
  rng = np.random.RandomState(seed)
  weights = {}
  for name, shape in sorted(google_shapes(config).items()):
    scale = 0.1 if name.endswith(("bias", "beta")) else 0.3
    value = rng.normal(0.0, scale, shape)
    if name.endswith("gamma"):
      value += 1.0
    weights[name] = value.astype(np.float32)
  return weights


def from_mtf(mtf_weights, config):
  """BertModel's variables (this package's names and shapes, vocab padded)
  renamed and reshaped into Google's names; the vocabulary padding is
  kept (so the masked-LM softmax covers what the model's does)."""
  h = config["hidden_size"]
  m = mtf_weights
  g = {
      "bert/embeddings/word_embeddings": m["bert/embeddings/word_embeddings"],
      "bert/embeddings/token_type_embeddings":
          m["bert/embeddings/token_type_embeddings"],
      "bert/embeddings/LayerNorm/gamma": m["bert/embeddings/layer_norm/scale"],
      "bert/embeddings/LayerNorm/beta": m["bert/embeddings/layer_norm/bias"],
      "bert/pooler/dense/kernel": m["bert/pooler/dense/kernel"],
      "bert/pooler/dense/bias": m["bert/pooler/dense_1/bias"],
      "cls/predictions/transform/dense/kernel":
          m["cls/predictions/transform/dense/kernel"],
      "cls/predictions/transform/dense/bias":
          m["cls/predictions/transform/dense_1/bias"],
      "cls/predictions/transform/LayerNorm/gamma":
          m["cls/predictions/transform/layer_norm/scale"],
      "cls/predictions/transform/LayerNorm/beta":
          m["cls/predictions/transform/layer_norm/bias"],
      "cls/predictions/output_bias": m["cls/predictions/output_bias"],
      "cls/seq_relationship/output_weights":
          np.transpose(m["cls/seq_relationship/kernel"]),
      "cls/seq_relationship/output_bias": m["cls/seq_relationship/bias"],
  }
  for name in ("bert/embeddings/position_embeddings",
               "bert/encoder/relative_attention_bias"):
    if name in m:
      g[name] = m[name]
  for n in range(config["num_hidden_layers"]):
    src, dst = f"bert/encoder/block_{n}", f"bert/encoder/layer_{n}"
    for part in ("query", "key", "value"):
      g[f"{dst}/attention/self/{part}/kernel"] = np.reshape(
          m[f"{src}/attention/{part}/kernel"], (h, h))
      g[f"{dst}/attention/self/{part}/bias"] = np.reshape(
          m[f"{src}/attention/{part}/bias"], (h,))
    g[f"{dst}/attention/output/dense/kernel"] = np.reshape(
        m[f"{src}/attention/output/kernel"], (h, h))
    g[f"{dst}/attention/output/dense/bias"] = m[f"{src}/attention/output/bias"]
    g[f"{dst}/attention/output/LayerNorm/gamma"] = m[
        f"{src}/attention/layer_norm/scale"]
    g[f"{dst}/attention/output/LayerNorm/beta"] = m[
        f"{src}/attention/layer_norm/bias"]
    g[f"{dst}/intermediate/dense/kernel"] = m[
        f"{src}/feedforward/dense_1/kernel"]
    g[f"{dst}/intermediate/dense/bias"] = m[f"{src}/feedforward/dense_1/bias"]
    g[f"{dst}/output/dense/kernel"] = m[f"{src}/feedforward/dense_2/kernel"]
    g[f"{dst}/output/dense/bias"] = m[f"{src}/feedforward/dense_2/bias"]
    g[f"{dst}/output/LayerNorm/gamma"] = m[
        f"{src}/feedforward/layer_norm/scale"]
    g[f"{dst}/output/LayerNorm/beta"] = m[f"{src}/feedforward/layer_norm/bias"]
  return g
