"""Google's published BERT checkpoints as `--init_checkpoint` (beyond the
original).

google-research/bert names and shapes its variables differently from this
package: `bert/encoder/layer_0/attention/self/query/kernel` [hidden, hidden]
is our `bert/encoder/block_0/attention/query/kernel` [hidden, num_heads,
attention_head], `.../LayerNorm/gamma` is `.../layer_norm/scale`,
`cls/seq_relationship/output_weights` [2, hidden] is the transpose of our
`cls/seq_relationship/kernel` [hidden, class], and our vocabulary is padded
to a multiple of 128. `prepare_init_checkpoint` converts such a checkpoint
once into a name-based checkpoint in this package's names (the format of
mesh_tensorflow.estimator.checkpoints), which the estimator's warm start
then reads under any mesh and layout.

The padding rows of the word embeddings are zeros, and the padding entries
of `cls/predictions/output_bias` are -10000, so that padding ids take no
probability in the masked-LM softmax (its loss is Google's).

Exactness: Google's layer normalization uses epsilon 1e-12, this package's
1e-6; both subtract the mean. A converted model therefore computes
(x - mean) / sqrt(var + 1e-6) where Google computes
(x - mean) / sqrt(var + 1e-12): a relative difference of about
1e-6 / (2 var) in each normalized activation, e.g. 5e-6 for var = 0.1,
below float32 training noise for real activations but not bit-exact.
"""

import os
import re
import uuid

from absl import logging
import numpy as np
import tensorflow as tf

# Google name pieces -> ours, for the per-layer variables (layer_N/...).
_LAYER_MAP = (
    ("attention/self/query/", "attention/query/"),
    ("attention/self/key/", "attention/key/"),
    ("attention/self/value/", "attention/value/"),
    ("attention/output/dense/", "attention/output/"),
    ("attention/output/LayerNorm/", "attention/layer_norm/"),
    ("intermediate/dense/", "feedforward/dense_1/"),
    ("output/dense/", "feedforward/dense_2/"),
    ("output/LayerNorm/", "feedforward/layer_norm/"),
)
_LAYER = re.compile(r"^bert/encoder/layer_(\d+)/(.*)$")
# Keys of Google's checkpoints that are not model weights.
_SKIPPED = re.compile(r"(^global_step$)|(/adam_[mv]$)")
_MARKER = "bert/encoder/layer_0/attention/self/query/kernel"
OUTPUT_SUBDIR = "google_init"
CHECKPOINT_NAME = "model.ckpt"


def is_google_checkpoint(names):
  """Whether variable `names` are in google-research/bert's naming."""
  return _MARKER in names or "bert/embeddings/LayerNorm/gamma" in names


def _checkpoint_prefix(path):
  """`path`, or the checkpoint in directory `path`; None if none found."""
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest:
      return latest
    indexes = tf.io.gfile.glob(os.path.join(path, "*.index"))
    return indexes[0][:-len(".index")] if len(indexes) == 1 else None
  return path


def prepare_init_checkpoint(path, bert_config, output_dir):
  """The checkpoint to warm-start from, given `--init_checkpoint=path`.

  Args:
    path: a checkpoint prefix or directory.
    bert_config: the BertConfig of the model to initialize.
    output_dir: where a converted checkpoint goes
      (`<output_dir>/google_init/model.ckpt`).

  Returns:
    `path` unchanged unless it is in Google's naming; else the prefix of
    the converted checkpoint, written once (atomically) and reused.

  Raises:
    ValueError: a Google checkpoint that does not fit the config (a shape,
      a missing variable, a config value missing or not Google's
      structure); the message names the variable or the config value.
  """
  prefix = _checkpoint_prefix(path)
  if prefix is None:
    return path
  try:
    reader = tf.train.load_checkpoint(prefix)
  except (tf.errors.OpError, ValueError):
    return path  # The estimator reports an unreadable checkpoint.
  shapes = reader.get_variable_to_shape_map()
  if not is_google_checkpoint(shapes):
    return path
  out_prefix = os.path.join(output_dir, OUTPUT_SUBDIR, CHECKPOINT_NAME)
  source_file = out_prefix + ".source"
  if (tf.io.gfile.exists(out_prefix + ".index")
      and tf.io.gfile.exists(source_file)):
    with tf.io.gfile.GFile(source_file) as f:
      if f.read().strip() == prefix:
        logging.info("Using %s, converted before from %s.", out_prefix,
                     prefix)
        return out_prefix
  weights = convert(reader, bert_config)
  _write_atomically(weights, out_prefix)
  with tf.io.gfile.GFile(source_file + ".tmp", "w") as f:
    f.write(prefix + "\n")
  tf.io.gfile.rename(source_file + ".tmp", source_file, overwrite=True)
  logging.info("Converted Google's BERT checkpoint %s into %s (%d "
               "variables).", prefix, out_prefix, len(weights))
  return out_prefix


def _check_config(config):
  """Google's BERT is the "original" structure with learned positions and
  biases; anything else cannot take its weights."""
  for key in ("vocab_size", "d_model", "num_blocks", "attention_num_heads",
              "feedforward_intermediate_size", "type_vocab_size",
              "max_position_embeddings"):
    if getattr(config, key, None) is None:
      raise ValueError(f"Google BERT checkpoint: the BERT config has no "
                       f"value for {key!r}; it is needed to convert the "
                       "checkpoint.")
  required = {"position_signal": "embedding",
              "residual_structure": "original", "use_bias": True,
              "block_layers": ["attention", "feedforward"]}
  for key, value in required.items():
    if getattr(config, key) != value:
      raise ValueError(
          f"Google BERT checkpoint: the BERT config has {key}="
          f"{getattr(config, key)!r}; Google's BERT has {key}={value!r}.")
  heads = config.attention_num_heads
  head_size = config.attention_head_size or config.d_model // heads
  if head_size * heads != config.d_model:
    raise ValueError(
        f"Google BERT checkpoint: attention_num_heads={heads} times "
        f"attention_head_size={head_size} must equal d_model="
        f"{config.d_model} (the checkpoint's heads share one [hidden, "
        "hidden] matrix).")
  return heads, head_size


def convert(reader, config):
  """{our name: float32 array} from a checkpoint reader in Google's names.

  Raises:
    ValueError: see prepare_init_checkpoint.
  """
  heads, head_size = _check_config(config)
  h = config.d_model
  vocab = config.vocab_size
  padded_vocab = vocab + (-vocab % 128)
  names = sorted(n for n in reader.get_variable_to_shape_map()
                 if not _SKIPPED.search(n))

  def load(name, shape):
    if name not in names:
      raise ValueError(f"Google BERT checkpoint: variable {name!r} is "
                       "missing.")
    value = reader.get_tensor(name)
    if tuple(value.shape) != tuple(shape):
      raise ValueError(
          f"Google BERT checkpoint: variable {name!r} has shape "
          f"{list(value.shape)}, the BERT config needs {list(shape)}.")
    return value.astype(np.float32)

  def pad_vocab(value, fill):
    pad = [(0, padded_vocab - vocab)] + [(0, 0)] * (value.ndim - 1)
    return np.pad(value, pad, constant_values=fill)

  ours = {}
  e = "bert/embeddings/"
  ours[e + "word_embeddings"] = pad_vocab(
      load(e + "word_embeddings", [vocab, h]), 0.0)
  ours[e + "token_type_embeddings"] = load(
      e + "token_type_embeddings", [config.type_vocab_size, h])
  ours[e + "position_embeddings"] = load(
      e + "position_embeddings", [config.max_position_embeddings, h])
  ours[e + "layer_norm/scale"] = load(e + "LayerNorm/gamma", [h])
  ours[e + "layer_norm/bias"] = load(e + "LayerNorm/beta", [h])

  layers = {int(m.group(1)) for m in map(_LAYER.match, names) if m}
  extra = sorted(n for n in layers if n >= config.num_blocks)
  if extra:
    raise ValueError(
        f"Google BERT checkpoint: it has encoder layer_{extra[0]}, the BERT "
        f"config has num_blocks={config.num_blocks}.")
  intermediate = config.feedforward_intermediate_size
  for n in range(config.num_blocks):
    src, dst = f"bert/encoder/layer_{n}/", f"bert/encoder/block_{n}/"
    for part in ("query", "key", "value"):
      g, o = src + f"attention/self/{part}/", dst + f"attention/{part}/"
      ours[o + "kernel"] = load(g + "kernel", [h, h]).reshape(
          h, heads, head_size)
      ours[o + "bias"] = load(g + "bias", [h]).reshape(heads, head_size)
    g, o = src + "attention/output/dense/", dst + "attention/output/"
    ours[o + "kernel"] = load(g + "kernel", [h, h]).reshape(
        heads, head_size, h)
    ours[o + "bias"] = load(g + "bias", [h])
    for g_name, o_name, shape in (
        ("intermediate/dense/kernel", "feedforward/dense_1/kernel",
         [h, intermediate]),
        ("intermediate/dense/bias", "feedforward/dense_1/bias",
         [intermediate]),
        ("output/dense/kernel", "feedforward/dense_2/kernel",
         [intermediate, h]),
        ("output/dense/bias", "feedforward/dense_2/bias", [h]),
        ("attention/output/LayerNorm/gamma", "attention/layer_norm/scale",
         [h]),
        ("attention/output/LayerNorm/beta", "attention/layer_norm/bias", [h]),
        ("output/LayerNorm/gamma", "feedforward/layer_norm/scale", [h]),
        ("output/LayerNorm/beta", "feedforward/layer_norm/bias", [h])):
      ours[dst + o_name] = load(src + g_name, shape)

  # Our dense layers without a name keep the kernel in "dense/" and the
  # bias in "dense_1/", as the original's (tf.layers keeps both in one).
  ours["bert/pooler/dense/kernel"] = load("bert/pooler/dense/kernel", [h, h])
  ours["bert/pooler/dense_1/bias"] = load("bert/pooler/dense/bias", [h])
  # The pretraining heads: in Google's releases, absent from fine-tuned
  # checkpoints (those variables then keep their initial values).
  t = "cls/predictions/transform/"
  if t + "dense/kernel" in names:
    ours[t + "dense/kernel"] = load(t + "dense/kernel", [h, h])
    ours[t + "dense_1/bias"] = load(t + "dense/bias", [h])
    ours[t + "layer_norm/scale"] = load(t + "LayerNorm/gamma", [h])
    ours[t + "layer_norm/bias"] = load(t + "LayerNorm/beta", [h])
  if "cls/predictions/output_bias" in names:
    ours["cls/predictions/output_bias"] = pad_vocab(
        load("cls/predictions/output_bias", [vocab]), -10000.0)
  s = "cls/seq_relationship/"
  if s + "output_weights" in names:
    ours[s + "kernel"] = np.transpose(load(s + "output_weights", [2, h]))
    ours[s + "bias"] = load(s + "output_bias", [2])
  return ours


def _write_atomically(weights, prefix):
  """Writes `weights` as a name-based checkpoint at `prefix`.

  The files are written under a unique temporary prefix and renamed into
  place, the index (which makes a checkpoint readable) last.
  """
  directory = os.path.dirname(prefix)
  tf.io.gfile.makedirs(directory)
  tmp_prefix = f"{prefix}.tmp-{uuid.uuid4().hex}"
  names = sorted(weights)
  with tf.Graph().as_default():
    placeholders = [tf.compat.v1.placeholder(tf.float32, weights[n].shape)
                    for n in names]
    save = tf.raw_ops.SaveV2(prefix=tmp_prefix, tensor_names=names,
                             shape_and_slices=[""] * len(names),
                             tensors=placeholders)
    with tf.compat.v1.Session() as sess:
      sess.run(save, {p: weights[n] for p, n in zip(placeholders, names)})
  written = tf.io.gfile.glob(tmp_prefix + ".*")
  index = tmp_prefix + ".index"
  for path in sorted(written, key=lambda p: p == index):
    tf.io.gfile.rename(path, prefix + path[len(tmp_prefix):], overwrite=True)
