"""tf.data pipelines that feed the Transformer: packing, padding, encoding.

A Transformer reads a `tf.data.Dataset` of feature dictionaries whose values
are integer token vectors ("inputs", "targets"), with 0 meaning padding and
1 meaning end of sequence (EOS). To use every position of a fixed-length row,
several short examples can be "packed" into one row; each packed feature
`<key>` then comes with `<key>_segmentation` (1, 2, ... for the first,
second, ... example of the row, 0 on padding) and `<key>_position` (the
position of a token inside its own example), so that attention and losses
stay within one example.

Example: the two examples {"inputs": [8, 7, 1], "targets": [4, 1]} and
{"inputs": [2, 3, 4, 1], "targets": [5, 6, 1]} packed into length 10 give

    inputs               [8, 7, 1, 2, 3, 4, 1, 0, 0, 0]
    inputs_segmentation  [1, 1, 1, 2, 2, 2, 2, 0, 0, 0]
    inputs_position      [0, 1, 2, 0, 1, 2, 3, 0, 0, 0]
    targets              [4, 1, 5, 6, 1, 0, 0, 0, 0, 0]
    targets_segmentation [1, 1, 2, 2, 2, 0, 0, 0, 0, 0]
    targets_position     [0, 1, 0, 1, 2, 0, 0, 0, 0, 0]

Every function here has the original's name and parameters; the configurable
ones are registered with gin under the original's module name.
"""

import collections
import contextlib
import os
import zlib

import gin
import tensorflow as tf

_GIN_MODULE = "mesh_tensorflow.transformer.dataset"
_AUTOTUNE = tf.data.AUTOTUNE
EOS_ID = 1

# The seed of this module's shuffles during a seeded run (see
# `shuffle_seed`); None: unseeded, as in the original.
_run_seed = None


@contextlib.contextmanager
def shuffle_seed(seed):
  """Seeds the shuffles of the datasets this module makes within.

  utils.run enters it with its `seed`, so that two runs of one command read
  their data in the same order. Each shuffle draws its own seed from `seed`
  and what it shuffles (file pattern, dataset name, split), so that
  different data are not shuffled alike. With None the shuffles stay
  unseeded (TensorFlow's global seed still applies to them).

  Args:
    seed: an int, or None.

  Yields:
    None.
  """
  global _run_seed
  previous, _run_seed = _run_seed, seed
  try:
    yield
  finally:
    _run_seed = previous


def _seed(*keys):
  """The seed of one shuffle of `keys`, or None outside a seeded run."""
  if _run_seed is None:
    return None
  key = zlib.crc32("/".join(str(k) for k in keys).encode())
  return (int(_run_seed) * 1000003 + key) % (2**31 - 1)


def _feature_keys(dataset):
  spec = dataset.element_spec
  if not isinstance(spec, dict):
    raise ValueError(
        "dataset: expected a dataset of feature dictionaries, got elements "
        f"of type {spec!r}")
  return list(spec.keys())


def _length_of(length, key):
  """The length for `key` from an int or a dict from feature key to int."""
  if isinstance(length, int):
    return length
  if key not in length:
    raise ValueError(
        f"length: no length given for feature {key!r} (lengths are given "
        f"for {sorted(length)})")
  return length[key]


@gin.configurable(module=_GIN_MODULE)
def pack_or_pad(dataset, length, pack=True, feature_keys=None,
                ensure_eos=False):
  """Packs examples into rows of `length`, or pads each example to it.

  Args:
    dataset: a tf.data.Dataset of feature dictionaries.
    length: an int, or a dict from feature key to int.
    pack: whether to pack (True) or only pad (False).
    feature_keys: the features to pack or pad; defaults to all. Packing drops
      the other features, padding passes them through unchanged.
    ensure_eos: True (every feature of `feature_keys`), False (none) or a
      collection of feature keys: the features whose last token becomes
      EOS=1 unless it is padding, so that a sequence cut to `length` still
      ends in EOS.
  Returns:
    a tf.data.Dataset whose `feature_keys` features have fixed shape [length].
  """
  feature_keys = list(feature_keys or _feature_keys(dataset))
  if pack:
    dataset = pack_dataset(dataset, length=length, keys=feature_keys)
  dataset = trim_and_pad_dataset(dataset, length=length,
                                 feature_keys=feature_keys)
  if ensure_eos:
    eos_keys = feature_keys if isinstance(ensure_eos, bool) else ensure_eos
    dataset = ensure_dataset_eos(dataset, eos_keys)
  return dataset


def ensure_dataset_eos(dataset, feature_keys=None):
  """Makes the last token of each feature EOS=1 unless it is padding (0).

  Args:
    dataset: a tf.data.Dataset of feature dictionaries.
    feature_keys: the features to change; defaults to all.
  Returns:
    a tf.data.Dataset whose `feature_keys` features end in 0 or 1.
  """
  feature_keys = set(feature_keys or _feature_keys(dataset))

  def _end_in_eos(key, value):
    if key not in feature_keys:
      return value
    # The last token is clipped into [PAD, EOS]: any id above EOS becomes EOS.
    last = tf.clip_by_value(value[-1:], 0, EOS_ID)
    return tf.concat([value[:-1], last], axis=0)

  return dataset.map(
      lambda ex: {k: _end_in_eos(k, v) for k, v in ex.items()},
      num_parallel_calls=_AUTOTUNE)


def trim_and_pad_dataset(dataset, length, feature_keys=None):
  """Cuts or zero-pads the first axis of features to `length`.

  Args:
    dataset: a tf.data.Dataset of feature dictionaries.
    length: an int, or a dict from feature key to int.
    feature_keys: the features to trim and pad; defaults to all. Others pass
      through unchanged.
  Returns:
    a tf.data.Dataset whose `feature_keys` features have first dimension
    `length`.
  """
  def _trim_and_pad(key, value):
    if feature_keys and key not in feature_keys:
      return value
    key_length = _length_of(length, key)
    value = value[:key_length]
    padding = [[0, key_length - tf.shape(value)[0]]]
    padding += [[0, 0]] * (value.shape.rank - 1)
    padded = tf.pad(value, padding)
    padded.set_shape([key_length] + value.shape.as_list()[1:])
    return padded

  return dataset.map(
      lambda ex: {k: _trim_and_pad(k, v) for k, v in ex.items()},
      num_parallel_calls=_AUTOTUNE)


@gin.configurable(module=_GIN_MODULE)
def pack_dataset(dataset, length, keys=None, use_custom_ops=False):
  """Packs variable-length examples greedily into rows of fixed length.

  Every `key` feature is cut to its length, and examples are taken in order:
  an example goes into the current row when every key still fits there, and
  otherwise starts a new row. As in the original, examples are packed in
  groups of max(length) consecutive examples (one group never shares a row
  with the next), a sequence ends at its first 0 after the nonzero count
  (trailing zeros are padding), and the output features are int32, each
  `<key>` with `<key>_segmentation` and `<key>_position` (see module
  docstring). Features not in `keys` are dropped.

  Args:
    dataset: a tf.data.Dataset of feature dictionaries with 1-D features.
    length: an int, or a dict from feature key to int.
    keys: the features to pack (e.g. ["inputs", "targets"]); defaults to all.
    use_custom_ops: accepted for the original's interface and ignored: the
      original's custom packing ops came from tensor2tensor, which does not
      install on current TensorFlow; packing always uses TF ops.
  Returns:
    a tf.data.Dataset of packed rows, every feature of shape [length].
  """
  del use_custom_ops
  spec = dataset.element_spec
  all_keys = _feature_keys(dataset)
  keys = list(keys if keys is not None else all_keys)
  if not keys:
    raise ValueError("pack_dataset: no keys to pack")
  for key in keys:
    if key not in spec:
      raise ValueError(
          f"pack_dataset: key {key!r} not found in dataset; available keys "
          f"are {sorted(all_keys)}")
    if not spec[key].shape.is_compatible_with(tf.TensorShape([None])):
      raise ValueError(
          f"pack_dataset: feature {key!r} has shape {spec[key].shape}; "
          "only one-dimensional features can be packed")
  lengths = {key: _length_of(length, key) for key in keys}

  dataset = dataset.map(
      lambda ex: {k: ex[k][:lengths[k]] for k in keys},
      num_parallel_calls=_AUTOTUNE)
  # A group of max(length) examples, each at least one token long, always
  # fills at least one row.
  dataset = dataset.padded_batch(
      max(lengths.values()), padded_shapes={k: [None] for k in keys})
  dataset = dataset.map(lambda batch: _pack_batch(batch, keys, lengths),
                        num_parallel_calls=_AUTOTUNE)
  dataset = dataset.unbatch()

  out_lengths = {}
  for k in keys:
    for suffix in ("", "_segmentation", "_position"):
      out_lengths[k + suffix] = lengths[k]

  def _fix_shapes(row):
    return {k: tf.reshape(v, [out_lengths[k]]) for k, v in row.items()}

  return dataset.map(_fix_shapes)


def _placements(sizes, keys, lengths):
  """Where each example of a group goes: its row and offsets.

  Args:
    sizes: dict from key to an int32 [group] vector of sequence lengths.
    keys: the packed keys.
    lengths: dict from key to row length.
  Returns:
    (rows, offsets, segments, row_count): rows an int32 [group] vector of
    row indices; offsets and segments dicts from key to int32 [group]
    vectors (start inside the row; segment number on that key, counting only
    examples that are non-empty on it); row_count a scalar.
  """
  group = tf.shape(sizes[keys[0]])[0]
  zero = tf.constant(0, tf.int32)

  def body(i, row, used, seen, rows, offsets, segments):
    fits = tf.constant(True)
    for k in keys:
      fits = tf.logical_and(fits, used[k] + sizes[k][i] <= lengths[k])
    # Start a new row when this example does not fit (never for the first).
    new_row = tf.logical_and(tf.logical_not(fits), i > 0)
    row = tf.where(new_row, row + 1, row)
    used = {k: tf.where(new_row, zero, used[k]) for k in keys}
    seen = {k: tf.where(new_row, zero, seen[k]) for k in keys}
    rows = rows.write(i, row)
    new_offsets, new_segments = {}, {}
    for k in keys:
      new_offsets[k] = offsets[k].write(i, used[k])
      seen[k] += tf.cast(sizes[k][i] > 0, tf.int32)
      new_segments[k] = segments[k].write(i, seen[k])
      used[k] += sizes[k][i]
    return i + 1, row, used, seen, rows, new_offsets, new_segments

  def array():
    return tf.TensorArray(tf.int32, size=group)

  state = (zero, zero, {k: zero for k in keys}, {k: zero for k in keys},
           array(), {k: array() for k in keys}, {k: array() for k in keys})
  _, row, _, _, rows, offsets, segments = tf.while_loop(
      lambda i, *_: i < group, body, state)
  return (rows.stack(), {k: v.stack() for k, v in offsets.items()},
          {k: v.stack() for k, v in segments.items()}, row + 1)


def _pack_batch(batch, keys, lengths):
  """Packs one padded group of examples into [rows, length] features."""
  tokens = {k: tf.cast(batch[k], tf.int32) for k in keys}
  # A sequence's length is its count of nonzero tokens (as the original).
  sizes = {k: tf.reduce_sum(tf.cast(tf.not_equal(t, 0), tf.int32), axis=1)
           for k, t in tokens.items()}
  rows, offsets, segments, row_count = _placements(sizes, keys, lengths)
  packed = {}
  for k in keys:
    width = tf.shape(tokens[k])[1]
    position = tf.broadcast_to(tf.range(width)[tf.newaxis, :],
                               tf.shape(tokens[k]))
    keep = position < sizes[k][:, tf.newaxis]
    where = tf.cast(tf.where(keep), tf.int32)
    example, pos = where[:, 0], where[:, 1]
    index = tf.stack([tf.gather(rows, example),
                      tf.gather(offsets[k], example) + pos], axis=1)
    shape = tf.stack([row_count, lengths[k]])
    values = tf.gather_nd(tokens[k], where)
    packed[k] = tf.scatter_nd(index, values, shape)
    packed[k + "_position"] = tf.scatter_nd(index, pos, shape)
    segment = tf.gather(segments[k], example)
    # A zero token inside a sequence counts as padding, as in the original.
    segment *= tf.cast(tf.not_equal(values, 0), tf.int32)
    packed[k + "_segmentation"] = tf.scatter_nd(index, segment, shape)
  return packed


def pad_dataset_with_zeroed_out_examples(ds):
  """Follows `ds` with endless all-zero copies of its examples.

  Lets a finite eval set fill whole batches; the zero examples carry no
  tokens, so they weigh nothing in weighted metrics.

  Args:
    ds: a tf.data.Dataset of feature dictionaries.
  Returns:
    an infinite tf.data.Dataset.
  """
  def _zeroed(ex):
    return {k: tf.zeros_like(v) for k, v in ex.items()}
  return ds.concatenate(ds.map(_zeroed).repeat())


def supervised_to_dict(dataset, text2self):
  """Turns (inputs, targets) pairs into feature dictionaries.

  Args:
    dataset: a tf.data.Dataset of (inputs, targets) pairs.
    text2self: a boolean; if true keep only {"targets"}, else
      {"inputs", "targets"}.
  Returns:
    a tf.data.Dataset of dictionaries.
  """
  def _to_dict(inputs, targets):
    if text2self:
      return {"targets": targets}
    return {"inputs": inputs, "targets": targets}
  return dataset.map(_to_dict, num_parallel_calls=_AUTOTUNE)


def encode_dataset(dataset, vocabulary):
  """Encodes every (string) feature to token ids with `vocabulary.encode_tf`.

  Args:
    dataset: a tf.data.Dataset of dictionaries of strings.
    vocabulary: a Vocabulary (anything with `encode_tf`).
  Returns:
    a tf.data.Dataset of dictionaries of integer vectors.
  """
  def _encode(features):
    return {k: vocabulary.encode_tf(v) for k, v in features.items()}
  return dataset.map(_encode, num_parallel_calls=_AUTOTUNE)


def encode_all_features(dataset, vocabulary):
  """Encodes the string features and appends EOS=1; drops the others.

  Args:
    dataset: a tf.data.Dataset of dictionaries.
    vocabulary: a Vocabulary (anything with `encode_tf`).
  Returns:
    a tf.data.Dataset of dictionaries of int64 vectors ending in EOS.
  """
  def _encode(features):
    encoded = {}
    for k, v in features.items():
      if v.dtype == tf.string:
        ids = tf.cast(vocabulary.encode_tf(v), tf.int64)
        encoded[k] = tf.concat([ids, [EOS_ID]], 0)
    return encoded
  return dataset.map(_encode, num_parallel_calls=_AUTOTUNE)


def _glob(pattern):
  files = tf.io.gfile.glob(pattern)
  if not files:
    raise ValueError(f"glob: no files match {pattern!r}")
  return sorted(files)


@gin.configurable(module=_GIN_MODULE)
def sample_from_text_line_datasets(glob_weight_list,
                                   shuffle_buffer_size=100000,
                                   prefetch=1000):
  """Endless lines sampled from several sets of text files by weight.

  Args:
    glob_weight_list: a list of (file glob, weight) pairs.
    shuffle_buffer_size: the shuffle buffer of each set.
    prefetch: how many lines each set reads ahead.
  Returns:
    an infinite tf.data.Dataset of string lines.
  """
  if not glob_weight_list:
    raise ValueError("sample_from_text_line_datasets: glob_weight_list is "
                     "empty")
  globs, weights = zip(*glob_weight_list)
  datasets = [
      tf.data.TextLineDataset(_glob(g)).repeat().shuffle(
          shuffle_buffer_size, seed=_seed("lines", g, i)).prefetch(prefetch)
      for i, g in enumerate(globs)]
  return tf.data.Dataset.sample_from_datasets(
      datasets, weights=[float(w) for w in weights],
      seed=_seed("sample", *globs))


@gin.configurable(module=_GIN_MODULE)
def make_text_line_dataset(glob=gin.REQUIRED):
  """Endless shuffled lines of the files matching `glob`."""
  return sample_from_text_line_datasets([(glob, 1.0)])


@gin.configurable(module=_GIN_MODULE)
def simple_text_line_dataset(glob=gin.REQUIRED, shuffle_buffer_size=100000):
  """The lines of the files matching `glob`, once, shuffled."""
  return tf.data.TextLineDataset(_glob(glob)).shuffle(
      shuffle_buffer_size, seed=_seed("lines", glob))


@gin.configurable(module=_GIN_MODULE)
def packed_parallel_tsv_dataset(dataset=gin.REQUIRED,
                                dataset_split=gin.REQUIRED,
                                batch_size=None,
                                sequence_length=gin.REQUIRED,
                                vocabulary=gin.REQUIRED,
                                append_eos=True,
                                eos_id=1,
                                max_encoded_len=0):
  """Encodes and packs a dataset of "inputs<TAB>targets" lines.

  Args:
    dataset: a tf.data.Dataset of string lines, one example per line.
    dataset_split: ignored (the caller picks the files).
    batch_size: ignored (batching happens later).
    sequence_length: an int, or a dict from feature key to int.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    append_eos: whether to end each sequence with `eos_id`.
    eos_id: the EOS id to append.
    max_encoded_len: when positive, drop examples with a sequence longer than
      this (after encoding).
  Returns:
    a packed tf.data.Dataset (see `pack_or_pad`).
  """
  del batch_size, dataset_split
  if isinstance(vocabulary, tuple):
    inputs_vocabulary, targets_vocabulary = vocabulary
  else:
    inputs_vocabulary = targets_vocabulary = vocabulary

  def _parse(line):
    fields = tf.io.decode_csv(line, record_defaults=["", ""],
                              field_delim="\t", use_quote_delim=False)
    return {"inputs": fields[0], "targets": fields[1]}

  def _encode(features):
    encoded = {
        "inputs": inputs_vocabulary.encode_tf(features["inputs"]),
        "targets": targets_vocabulary.encode_tf(features["targets"])}
    if append_eos:
      encoded = {k: tf.concat([tf.cast(v, tf.int64), [eos_id]], 0)
                 for k, v in encoded.items()}
    return encoded

  dataset = dataset.map(_parse).map(_encode, num_parallel_calls=_AUTOTUNE)
  if max_encoded_len:
    dataset = dataset.filter(lambda ex: tf.reduce_all(
        [tf.size(v) <= max_encoded_len for v in ex.values()]))
  return pack_or_pad(dataset, sequence_length)


def pretokenized_tfrecord_dataset(filenames,
                                  text2self,
                                  eos_included,
                                  repeat,
                                  batch_size,
                                  sequence_length,
                                  vocab_shift=0):
  """Reads tensor2tensor-style TFRecord files of token-id tf.Examples.

  Each record is a tf.train.Example with an int64 list feature "targets"
  (and "inputs" unless text2self); other features are ignored.

  Args:
    filenames: a list of file names.
    text2self: a boolean; if true read only "targets".
    eos_included: whether the sequences already end in EOS=1; if not, it
      is appended.
    repeat: whether to repeat the files forever.
    batch_size: ignored (batching happens later).
    sequence_length: an int, or a dict from feature key to int.
    vocab_shift: an int added to every stored id (not to an appended EOS).
  Returns:
    a packed tf.data.Dataset (see `pack_or_pad`).
  """
  del batch_size
  dataset = tf.data.TFRecordDataset(filenames, buffer_size=64 * 1024 * 1024)
  if repeat:
    dataset = dataset.repeat()
  keys = ["targets"] if text2self else ["inputs", "targets"]
  spec = {k: tf.io.VarLenFeature(tf.int64) for k in keys}

  def _decode(record):
    parsed = tf.io.parse_single_example(record, spec)
    decoded = {}
    for k in keys:
      ids = tf.sparse.to_dense(parsed[k]) + vocab_shift
      if not eos_included:
        ids = tf.concat([ids, [EOS_ID]], 0)
      decoded[k] = ids
    return decoded

  dataset = dataset.map(_decode, num_parallel_calls=_AUTOTUNE)
  return pack_or_pad(dataset, sequence_length)


@gin.configurable(module=_GIN_MODULE)
def pretokenized_t2t_dataset(dataset_name=gin.REQUIRED,
                             text2self=False,
                             data_dir=gin.REQUIRED,
                             dataset_split="train",
                             batch_size=None,
                             sequence_length=gin.REQUIRED,
                             vocabulary=None,
                             eos_included=True,
                             vocab_shift=0):
  """Reads the tensor2tensor data files `<data_dir>/<name>-<split>-*`.

  Args:
    dataset_name: the tensor2tensor problem's file prefix.
    text2self: a boolean; if true read only "targets".
    data_dir: the folder of the files.
    dataset_split: "train" (repeated and shuffled) or "dev".
    batch_size: ignored (batching happens later).
    sequence_length: an int, or a dict from feature key to int.
    vocabulary: ignored (the files hold token ids).
    eos_included: whether the stored sequences already end in EOS=1.
    vocab_shift: an int added to every stored id.
  Returns:
    a packed tf.data.Dataset.
  """
  del vocabulary
  pattern = os.path.join(data_dir, dataset_name + "-" + dataset_split + "-*")
  filenames = tf.io.gfile.glob(pattern)
  if not filenames:
    raise ValueError(f"pretokenized_t2t_dataset: no files match {pattern!r}")
  dataset = pretokenized_tfrecord_dataset(
      filenames=sorted(filenames), text2self=text2self,
      eos_included=eos_included, repeat=dataset_split == "train",
      batch_size=batch_size, sequence_length=sequence_length,
      vocab_shift=vocab_shift)
  if dataset_split == "train":
    dataset = dataset.shuffle(1000, seed=_seed(dataset_name, dataset_split))
  return dataset


def _tfds_load(**kwargs):
  """tfds.load, imported on first use; its file shuffling (shuffle_files)
  seeded in a seeded run."""
  # Late import of tensorflow-datasets (seconds to import): only TFDS
  # datasets need it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  seed = _seed(kwargs["name"], kwargs["split"], "files")
  if seed is not None:
    kwargs["read_config"] = tfds.ReadConfig(shuffle_seed=seed)
  return tfds.load(**kwargs)


def _language_model_features(dataset, info, dataset_name):
  """A text2self TFDS dataset's examples with their text as "targets".

  Examples that have a "targets" feature pass unchanged, as in the
  original. Others (lm1b's {"text"}, ...) would reach the model with no
  targets: their text is the supervised target key of the dataset, or its
  only string feature.
  """
  spec = dataset.element_spec
  if "targets" in spec:
    return dataset
  keys = info.supervised_keys
  if keys and isinstance(keys[1], str) and keys[1] in spec:
    key = keys[1]
  else:
    texts = [k for k, v in spec.items() if v.dtype == tf.string]
    if len(texts) != 1:
      raise ValueError(
          f"untokenized_tfds_dataset: {dataset_name} has no 'targets' "
          f"feature and no one text feature to train a language model on "
          f"(features: {sorted(spec)}). Give a dataset function that "
          f"returns {{'targets': text}} examples.")
    key = texts[0]
  return dataset.map(lambda ex: {"targets": ex[key]},
                     num_parallel_calls=_AUTOTUNE)


@gin.configurable(module=_GIN_MODULE)
def pretokenized_tfds_dataset(dataset_name=gin.REQUIRED,
                              text2self=gin.REQUIRED,
                              tfds_data_dir=gin.REQUIRED,
                              dataset_split=gin.REQUIRED,
                              batch_size=None,
                              sequence_length=gin.REQUIRED,
                              vocabulary=None):
  """Reads a TFDS dataset whose supervised pairs are already token ids.

  The stored ids are shifted up by one (their encoders keep no id for EOS)
  and EOS=1 is appended; the "train" split is repeated and shuffled.

  Args:
    dataset_name: the TFDS name (with config and version if wanted).
    text2self: a boolean; if true keep only "targets".
    tfds_data_dir: the TFDS data directory (`tfds.load` downloads and
      prepares the dataset there when it is missing).
    dataset_split: a split name, e.g. "train" or "validation".
    batch_size: ignored (batching happens later).
    sequence_length: an int, or a dict from feature key to int.
    vocabulary: ignored.
  Returns:
    a packed tf.data.Dataset.
  """
  del batch_size, vocabulary
  dataset = _tfds_load(name=dataset_name, split=dataset_split,
                       as_supervised=True, data_dir=tfds_data_dir,
                       shuffle_files=dataset_split == "train")
  if dataset_split == "train":
    dataset = dataset.repeat().shuffle(
        1000, seed=_seed(dataset_name, dataset_split))

  def _shift_and_end(ids):
    return tf.concat([ids + 1, tf.constant([EOS_ID], ids.dtype)], 0)

  def _to_features(inputs, targets):
    if text2self:
      return {"targets": _shift_and_end(targets)}
    return {"inputs": _shift_and_end(inputs),
            "targets": _shift_and_end(targets)}

  dataset = dataset.map(_to_features, num_parallel_calls=_AUTOTUNE)
  return pack_or_pad(dataset, sequence_length)


@gin.configurable(module=_GIN_MODULE)
def untokenized_tfds_dataset(dataset_name=gin.REQUIRED,
                             text2self=gin.REQUIRED,
                             tfds_data_dir=gin.REQUIRED,
                             dataset_split=gin.REQUIRED,
                             batch_size=None,
                             sequence_length=gin.REQUIRED,
                             vocabulary=gin.REQUIRED,
                             pack=gin.REQUIRED):
  """Reads a TFDS text dataset, encodes it with `vocabulary`, packs or pads.

  Args:
    dataset_name: the TFDS name.
    text2self: a boolean; if true read the dataset's features as they are
      (language modelling), else its supervised (inputs, targets) pairs.
    tfds_data_dir: the TFDS data directory.
    dataset_split: a split name; "train" is repeated and shuffled.
    batch_size: ignored (batching happens later).
    sequence_length: an int, or a dict from feature key to int.
    vocabulary: a Vocabulary; every string feature is encoded, EOS appended.
    pack: whether to pack (True) or only pad (False).
  Returns:
    a tf.data.Dataset of packed or padded examples.
  """
  del batch_size
  dataset, info = _tfds_load(name=dataset_name, split=dataset_split,
                             as_supervised=not text2self,
                             data_dir=tfds_data_dir, with_info=True)
  if dataset_split == "train":
    dataset = dataset.repeat().shuffle(
        1000, seed=_seed(dataset_name, dataset_split))
  if text2self:
    dataset = _language_model_features(dataset, info, dataset_name)
  else:
    dataset = supervised_to_dict(dataset, text2self)
  dataset = encode_all_features(dataset, vocabulary)
  return pack_or_pad(dataset, sequence_length, pack)


# A task to evaluate: its name, a function returning its tf.data.Dataset,
# a function turning decoded strings into what the metrics compare, and a
# list of metric_fn(targets, predictions) each returning a dict of scores.
EvalDataset = collections.namedtuple(
    "EvalDataset", ["name", "dataset_fn", "postprocess_fn", "metric_fns"])
