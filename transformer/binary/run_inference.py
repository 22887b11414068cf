"""Decoding with a trained Transformer: from a file, a dataset or a server.

`decode` runs the estimator's predictions and turns them into text;
`decode_from_file` / `infer_model` read a file of inputs (one per line) and
write "<output_filename>-<step>" for each checkpoint; `decode_from_dataset`
decodes an EvalDataset's examples; `export_model` writes a SavedModel whose
"serving_default" signature takes `inputs` (strings) and returns `outputs`
(strings). Gin names are the original's (`utils.*`).
"""

import os

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow.estimator import export
from mesh_tensorflow.estimator import host_values
from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer.binary import run_checkpoints
from mesh_tensorflow.transformer.binary import run_features
from mesh_tensorflow.transformer.binary import run_settings

_GIN_MODULE = "mesh_tensorflow.transformer.utils"


def get_inputs_from_file(input_filename, ignore_comments=False):
  """The lines of a text file, without line ends or a final empty line;
  lines starting with "#" dropped if ignore_comments."""
  if not tf.io.gfile.exists(input_filename):
    raise ValueError(f"Input file {input_filename!r} does not exist.")
  with tf.io.gfile.GFile(input_filename) as f:
    inputs = [line.rstrip("\r\n") for line in f]
  if inputs and not inputs[-1]:
    inputs.pop()
  if ignore_comments:
    inputs = [line for line in inputs if not line.startswith("#")]
  return inputs


def write_lines_to_file(lines, filename):
  """Writes one line per item, replacing the file atomically.

  As the original's: a newline inside an item is written as a space, so
  the file keeps one line per item (a decode, a score's text).
  """
  directory = os.path.dirname(filename)
  if directory:
    tf.io.gfile.makedirs(directory)
  temp = f"{filename}.tmp-{os.getpid()}"
  with tf.io.gfile.GFile(temp, "w") as f:
    for line in lines:
      f.write(str(line).replace("\n", " ") + "\n")
  tf.io.gfile.rename(temp, filename, overwrite=True)


def _fit(ids, length):
  """ids truncated or zero-padded to `length`."""
  ids = list(ids)[:length]
  return ids + [0] * (length - len(ids))


def _pad_to_batches(rows, batch_size):
  """rows plus copies of the first, to a multiple of batch_size, as int32."""
  rows = rows + [rows[0]] * (-len(rows) % batch_size)
  return np.array(rows, dtype=np.int32)


def encode_inputs(inputs, vocabulary, model_type, batch_size,
                  sequence_length, eos_id=1, unscored_prefix=None):
  """Encodes strings for decoding or scoring, padded to whole batches.

  Args:
    inputs: a list of strings.
    vocabulary: a Vocabulary or an (inputs, targets) pair (inputs used).
    model_type: for "lm" the inputs are a prefix to continue, so not
      EOS-terminated; other models get EOS at the end.
    batch_size: the result has a multiple of this many rows (the first row
      repeated).
    sequence_length: the length of each row (truncated or zero-padded).
    eos_id: the EOS id (0: none).
    unscored_prefix: optional list of strings, one per input, encoded in
      front of it with negated ids (scoring leaves them unscored).

  Returns:
    an int32 array [rows, sequence_length].
  """
  if not inputs:
    raise ValueError("encode_inputs: no inputs.")
  vocab = run_settings.inputs_vocabulary(vocabulary)
  rows = []
  for i, line in enumerate(inputs):
    ids = list(vocab.encode(line.strip()))
    if unscored_prefix:
      ids = [-i for i in vocab.encode(unscored_prefix[i].strip())] + ids
    if model_type != "lm" and eos_id:
      ids.append(eos_id)
    rows.append(_fit(ids, sequence_length))
  return _pad_to_batches(rows, batch_size)


def encode_delimited_lm(inputs, targets, vocabulary, batch_size,
                        sequence_length, eos_id=1, include_final_eos=True):
  """Encodes (input, target) pairs as [input, EOS, target(, EOS)] rows for
  scoring a "delimited_lm" model, padded to whole batches."""
  if not inputs:
    raise ValueError("encode_delimited_lm: no inputs.")
  rows = []
  for inp, tgt in zip(inputs, targets):
    ids = list(run_settings.inputs_vocabulary(vocabulary).encode(inp.strip()))
    ids.append(eos_id)
    ids += list(run_settings.targets_vocabulary(vocabulary).encode(
        tgt.strip()))
    if include_final_eos:
      ids.append(eos_id)
    rows.append(_fit(ids, sequence_length))
  return _pad_to_batches(rows, batch_size)


@gin.configurable(module=_GIN_MODULE)
def clean_decodes(ids, eos_id=1, pad_id=0, length_axis=-1):
  """ids with everything after the first EOS replaced by pad_id.

  `ids` is a Tensor or anything tf.convert_to_tensor takes (a nested list
  of ints, a NumPy array).
  """
  ids = tf.convert_to_tensor(ids)
  after_eos = tf.cumsum(tf.cast(tf.equal(ids, eos_id), tf.int32),
                        exclusive=True, axis=length_axis)
  return tf.where(tf.equal(after_eos, 0), ids, tf.cast(pad_id, ids.dtype))


def as_text(value):
  """A text feature or decode (bytes or str) as str."""
  if isinstance(value, (bytes, np.bytes_)):
    return value.decode("utf-8", errors="replace")
  return str(value)


def postprocess_text(eval_dataset, text, example, is_target=False):
  """`text` through the EvalDataset's postprocess_fn (if any), called as
  the original called it: postprocess_fn(text, example=, is_target=)."""
  if eval_dataset.postprocess_fn is None:
    return text
  try:
    return eval_dataset.postprocess_fn(text, example=example,
                                       is_target=is_target)
  except TypeError:  # A postprocess_fn(text) of one argument.
    return eval_dataset.postprocess_fn(text)


def maybe_add_pretokenized_features(examples, vocabulary):
  """Gives each example "inputs_pretokenized" / "targets_pretokenized".

  As in the original: an example with "inputs" (or "targets") ids but no
  such text gets the ids decoded by that feature's vocabulary, which
  approximates the text (logged once per feature). Other features and
  existing text are left alone.

  Args:
    examples: a list of dicts feature -> NumPy array; changed in place.
    vocabulary: a Vocabulary or an (inputs, targets) pair of them.

  Returns:
    `examples`.
  """
  vocabularies = {"inputs": run_settings.inputs_vocabulary(vocabulary),
                  "targets": run_settings.targets_vocabulary(vocabulary)}
  approximated = set()
  for example in examples:
    for feature, vocab in vocabularies.items():
      text_feature = feature + "_pretokenized"
      if feature not in example or text_feature in example:
        continue
      example[text_feature] = vocab.decode(
          np.asarray(example[feature]).tolist())
      if feature not in approximated:
        approximated.add(feature)
        logging.warning("Feature %r is approximated by decoding the "
                        "tokenized feature %r.", text_feature, feature)
  return examples


def _to_text(value, vocab):
  """A prediction as text: strings decoded, ids through the vocabulary."""
  if isinstance(value, (bytes, np.bytes_)):
    return value.decode("utf-8", errors="replace")
  if isinstance(value, str):
    return value
  return vocab.decode([int(x) for x in value])


@gin.configurable(module=_GIN_MODULE)
def decode(estimator, input_fn, vocabulary, checkpoint_path=None):
  """The estimator's decodes of input_fn's examples, as strings.

  Args:
    estimator: an Estimator of utils.get_estimator.
    input_fn: params -> tf.data.Dataset of batches of {"inputs": ids}.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    checkpoint_path: optional; default the latest checkpoint.

  Returns:
    a list of strings, one per example (padding examples included).
  """
  decodes = []
  results = estimator.predict(input_fn, checkpoint_path=checkpoint_path)
  for i, result in enumerate(results):
    text_in = _to_text(result["inputs"],
                       run_settings.inputs_vocabulary(vocabulary))
    text_out = _to_text(result["outputs"],
                        run_settings.targets_vocabulary(vocabulary))
    decodes.append(text_out)
    if i & (i - 1) == 0:  # Log the 0th, 1st, 2nd, 4th, 8th...
      logging.info("decoded %d: %s", i, text_in)
      logging.info("            -> %s", text_out)
  return decodes


@gin.configurable(module=_GIN_MODULE)
def compute_log_likelihoods(estimator, input_fn, checkpoint_path=None):
  """The log-likelihood of each example (an estimator scoring in predict
  mode), as floats."""
  results = estimator.predict(input_fn, checkpoint_path=checkpoint_path)
  return [float(r["scores"] if isinstance(r, dict) else r) for r in results]


def ids_input_fn(features, batch_size, repeats=1):
  """input_fn of fixed batches of the int32 arrays in `features`."""

  def input_fn(params):
    del params
    ds = tf.data.Dataset.from_tensor_slices(features)
    if repeats > 1:
      ds = ds.flat_map(lambda x: tf.data.Dataset.from_tensors(x).repeat(
          repeats))
    return ds.batch(batch_size, drop_remainder=True).prefetch(
        tf.data.AUTOTUNE)

  return input_fn


@gin.configurable(module=_GIN_MODULE)
def decode_from_file(estimator,
                     vocabulary,
                     model_type,
                     batch_size,
                     sequence_length,
                     checkpoint_path=None,
                     input_filename=gin.REQUIRED,
                     output_filename=gin.REQUIRED,
                     eos_id=1,
                     repeats=1):
  """Decodes each line of input_filename into "<output_filename>-<step>".

  Args:
    estimator: an Estimator of utils.get_estimator.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    model_type: the run's model type.
    batch_size: sequences per batch.
    sequence_length: a dict feature -> length.
    checkpoint_path: the checkpoint ("model.ckpt-<step>"); default latest.
    input_filename: a text file, one input per line.
    output_filename: the prefix of the output file.
    eos_id: the EOS id.
    repeats: decode each input this many times (e.g. for sampling).

  Returns:
    the decodes (a list of strings).
  """
  inputs = get_inputs_from_file(input_filename)
  if not inputs:
    raise ValueError(f"Input file {input_filename!r} is empty.")
  ids = encode_inputs(inputs, vocabulary, model_type, batch_size,
                      sequence_length["inputs"], eos_id=eos_id)
  checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
  if checkpoint_path is None:
    raise ValueError(f"No checkpoint in {estimator.model_dir!r} to decode "
                     "with: train first.")
  step = run_checkpoints.get_step_from_checkpoint_path(checkpoint_path)
  decodes = decode(estimator, ids_input_fn({"inputs": ids}, batch_size,
                                            repeats),
                   vocabulary, checkpoint_path=checkpoint_path)
  decodes = decodes[:len(inputs) * repeats]
  output = f"{output_filename}-{step}"
  write_lines_to_file(decodes, output)
  logging.info("Wrote %d decodes to %s", len(decodes), output)
  return decodes


@gin.configurable(module=_GIN_MODULE)
def decode_from_dataset(estimator,
                        vocabulary,
                        model_type,
                        batch_size,
                        sequence_length,
                        checkpoint_path=None,
                        infer_dataset_fn=gin.REQUIRED,
                        dataset_split="validation",
                        decode_output_dir=gin.REQUIRED):
  """Decodes the examples of infer_dataset_fn's EvalDatasets.

  As the original, for each dataset it writes the decodes as they come to
  "<decode_output_dir>/<name>_<step>_predictions", the examples' targets
  text, postprocessed as targets, to "<name>_targets" and their inputs
  text to "<name>_inputs" (text missing from an example is its ids
  decoded; see `maybe_add_pretokenized_features`). Any model type
  decodes (the original took only "lm").
  """
  del model_type
  checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
  step = run_checkpoints.get_step_from_checkpoint_path(checkpoint_path)
  datasets = infer_dataset_fn(sequence_length=sequence_length,
                              vocabulary=vocabulary,
                              dataset_split=dataset_split)
  for infer_dataset in datasets:
    infer_dataset = transformer_dataset.EvalDataset(*infer_dataset)
    examples = list(host_values.numpy_iterator(infer_dataset.dataset_fn()))

    def input_fn(params, dataset=infer_dataset):
      del params
      ds = dataset.dataset_fn().map(run_features.filter_features)
      ds = ds.batch(batch_size, drop_remainder=False)
      ds = transformer_dataset.trim_and_pad_dataset(ds, length=batch_size)
      return ds.prefetch(tf.data.AUTOTUNE)

    decodes = decode(estimator, input_fn, vocabulary, checkpoint_path)
    write_lines_to_file(decodes[:len(examples)], os.path.join(
        decode_output_dir, f"{infer_dataset.name}_{step}_predictions"))
    maybe_add_pretokenized_features(examples, vocabulary)
    if examples and "targets_pretokenized" in examples[0]:
      write_lines_to_file(
          [postprocess_text(infer_dataset,
                            as_text(ex["targets_pretokenized"]), ex,
                            is_target=True) for ex in examples],
          os.path.join(decode_output_dir, f"{infer_dataset.name}_targets"))
    if examples and "inputs_pretokenized" in examples[0]:
      write_lines_to_file(
          [as_text(ex["inputs_pretokenized"]) for ex in examples],
          os.path.join(decode_output_dir, f"{infer_dataset.name}_inputs"))


@gin.configurable(module=_GIN_MODULE)
def infer_model(estimator,
                vocabulary,
                sequence_length,
                batch_size,
                model_type,
                model_dir,
                eval_checkpoint_step,
                checkpoint_paths=None,
                decode_fn=decode_from_file):
  """Decodes with each checkpoint that eval_checkpoint_step names (or
  checkpoint_paths) through decode_fn (default decode_from_file, whose
  input_filename and output_filename come from gin)."""
  if checkpoint_paths is None:
    checkpoint_paths = run_checkpoints.get_checkpoint_iterator(
        eval_checkpoint_step, model_dir)
  for checkpoint_path in checkpoint_paths:
    decode_fn(estimator, vocabulary=vocabulary, model_type=model_type,
              batch_size=batch_size, sequence_length=sequence_length,
              checkpoint_path=checkpoint_path)


def export_model(estimator, export_dir, vocabulary, sequence_length,
                 model_type="bitransformer", eval_with_score=False,
                 batch_size=1, checkpoint_path=None):
  """Exports a SavedModel serving the model on one CPU.

  Its "serving_default" signature takes "inputs", a string vector of at
  most batch_size texts, and returns "outputs" (the decoded strings; or,
  when eval_with_score, "scores" of the (inputs, "targets") pairs). As
  the original's, an "lm" scoring export takes "targets" alone (the whole
  text to score). Text is encoded and decoded in the graph, so the
  vocabulary must support encode_tf/decode_tf.

  Args:
    estimator: an Estimator of utils.get_estimator.
    export_dir: the directory in which a timestamped export is made.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    sequence_length: a dict feature -> length.
    model_type: "lm" prompts are not EOS-terminated, and an "lm" scores
      "targets" alone.
    eval_with_score: export scoring instead of decoding.
    batch_size: the model's batch (requests are padded to it).
    checkpoint_path: default the latest checkpoint.

  Returns:
    the export directory (a string).
  """
  inputs_vocab = run_settings.inputs_vocabulary(vocabulary)
  targets_vocab = run_settings.targets_vocabulary(vocabulary)

  def encode(texts, vocab, length, add_eos):
    # One string at a time: the original's (and seqio's) encode_tf take a
    # scalar.
    ids = tf.map_fn(
        lambda text: tf.cast(vocab.encode_tf(text), tf.int32), texts,
        fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))
    if add_eos:
      eos = tf.fill([ids.nrows(), 1], tf.constant(1, tf.int32))
      ids = tf.concat([ids[:, :length - 1], eos], axis=1)
    dense = ids.to_tensor(default_value=0)[:, :length]
    return tf.pad(dense, [[0, batch_size - tf.shape(dense)[0]],
                          [0, length - tf.shape(dense)[1]]])

  # The texts that count the request's examples.
  first = "targets" if model_type == "lm" and eval_with_score else "inputs"

  def features_from(tensors):
    check = tf.debugging.assert_less_equal(
        tf.size(tensors[first]), batch_size,
        message=f"A request of this export holds at most batch_size="
                f"{batch_size} {first}.")
    with tf.control_dependencies([check]):
      tensors = {k: tf.identity(v) for k, v in tensors.items()}
    features = {}
    if "inputs" in tensors:
      features["inputs"] = encode(tensors["inputs"], inputs_vocab,
                                  sequence_length["inputs"],
                                  model_type != "lm")
    if "targets" in tensors:
      features["targets"] = encode(tensors["targets"], targets_vocab,
                                   sequence_length["targets"], True)
    return features

  specs = {first: tf.TensorSpec([None], tf.string)}
  if eval_with_score:
    specs["targets"] = tf.TensorSpec([None], tf.string)

  def drop_padding(predictions, tensors):
    n = tf.size(tensors[first])
    return {k: v[:n] for k, v in predictions.items()}

  def serving_input_fn():
    return export.ServingInputReceiver(features_from, specs,
                                       postprocess=drop_padding)

  path = estimator.export_saved_model(export_dir, serving_input_fn,
                                      checkpoint_path=checkpoint_path)
  return tf.compat.as_text(path)
