"""Tests of mesh_tensorflow.transformer.dataset against NumPy references."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow.transformer as transformer_package
from mesh_tensorflow.transformer import dataset


def _from_examples(examples):
  """A dataset of dicts of int64 vectors with variable lengths."""
  keys = list(examples[0])

  def gen():
    for ex in examples:
      yield {k: np.array(ex[k], np.int64) for k in keys}

  return tf.data.Dataset.from_generator(
      gen, output_signature={
          k: tf.TensorSpec([None], tf.int64) for k in keys})


def _rows(ds):
  return [{k: np.asarray(v) for k, v in row.items()}
          for row in ds.as_numpy_iterator()]


def _reference_pack(examples, keys, lengths):
  """Greedy packing in groups of max(length) examples, in plain Python."""
  group_size = max(lengths.values())
  rows = []
  for start in range(0, len(examples), group_size):
    group = examples[start:start + group_size]
    current = None
    for ex in group:
      seqs = {}
      for k in keys:
        seq = list(ex[k])[:lengths[k]]
        seqs[k] = seq[:sum(1 for t in seq if t != 0)]
      if current is None or any(
          len(current[k]) + len(seqs[k]) > lengths[k] for k in keys):
        current = {k: [] for k in keys}
        current.update({k + "_position": [] for k in keys})
        current.update({k + "_segmentation": [] for k in keys})
        current["_segments"] = {k: 0 for k in keys}
        rows.append(current)
      for k in keys:
        if seqs[k]:
          current["_segments"][k] += 1
        current[k] += seqs[k]
        current[k + "_position"] += list(range(len(seqs[k])))
        current[k + "_segmentation"] += [
            current["_segments"][k] if t else 0 for t in seqs[k]]
  out = []
  for row in rows:
    del row["_segments"]
    padded = {}
    for k, v in row.items():
      n = lengths[k.split("_")[0]]
      padded[k] = np.array(v + [0] * (n - len(v)), np.int32)
    out.append(padded)
  return out


def _random_examples(rng, count, keys, max_len):
  """Random token lists, some empty, some with a 0 inside or at the end."""
  examples = []
  for _ in range(count):
    ex = {}
    for k in keys:
      seq = rng.integers(1, 50, size=rng.integers(0, max_len + 1))
      seq[rng.random(seq.shape) < 0.1] = 0
      ex[k] = seq.tolist()
    examples.append(ex)
  return examples


def _assert_rows_equal(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert sorted(g) == sorted(w)
    for k in w:
      np.testing.assert_array_equal(g[k], w[k], err_msg=k)
      assert g[k].dtype == np.int32, k


def test_pack_dataset_docstring_example():
  ds = _from_examples([{"inputs": [8, 7, 1, 0], "targets": [4, 1, 0]},
                       {"inputs": [2, 3, 4, 1], "targets": [5, 6, 1]}])
  rows = _rows(dataset.pack_dataset(ds, 10))
  assert len(rows) == 1
  row = rows[0]
  np.testing.assert_array_equal(row["inputs"], [8, 7, 1, 2, 3, 4, 1, 0, 0, 0])
  np.testing.assert_array_equal(row["inputs_segmentation"],
                                [1, 1, 1, 2, 2, 2, 2, 0, 0, 0])
  np.testing.assert_array_equal(row["inputs_position"],
                                [0, 1, 2, 0, 1, 2, 3, 0, 0, 0])
  np.testing.assert_array_equal(row["targets"], [4, 1, 5, 6, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(row["targets_segmentation"],
                                [1, 1, 2, 2, 2, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(row["targets_position"],
                                [0, 1, 0, 1, 2, 0, 0, 0, 0, 0])


def _assert_literal_rows(rows, want):
  """`rows` equal `want`, a list of {feature: literal list} per row."""
  assert len(rows) == len(want)
  for i, (got, expected) in enumerate(zip(rows, want)):
    assert sorted(got) == sorted(expected), i
    for k, v in expected.items():
      np.testing.assert_array_equal(got[k], v, err_msg=f"row {i} {k}")
      assert got[k].dtype == np.int32, k


def test_pack_dataset_overflow_into_next_row_by_hand():
  # Length 5: the first two examples fill a row exactly on both keys;
  # the third one would overflow it and starts the second row.
  ds = _from_examples([{"inputs": [3, 4, 1], "targets": [5, 1]},
                       {"inputs": [6, 1], "targets": [7, 8, 1]},
                       {"inputs": [9, 1], "targets": [2, 1]}])
  _assert_literal_rows(_rows(dataset.pack_dataset(ds, 5)), [
      {"inputs": [3, 4, 1, 6, 1],
       "inputs_segmentation": [1, 1, 1, 2, 2],
       "inputs_position": [0, 1, 2, 0, 1],
       "targets": [5, 1, 7, 8, 1],
       "targets_segmentation": [1, 1, 2, 2, 2],
       "targets_position": [0, 1, 0, 1, 2]},
      {"inputs": [9, 1, 0, 0, 0],
       "inputs_segmentation": [1, 1, 0, 0, 0],
       "inputs_position": [0, 1, 0, 0, 0],
       "targets": [2, 1, 0, 0, 0],
       "targets_segmentation": [1, 1, 0, 0, 0],
       "targets_position": [0, 1, 0, 0, 0]},
  ])


def test_pack_dataset_per_key_lengths_by_hand():
  # inputs 4, targets 6. The second example's targets would fit, but its
  # inputs overflow the first row, so the whole example moves on; the third
  # one's inputs are cut to 4 tokens (losing their EOS) and fill a row;
  # trailing zeros of an example are padding, not tokens.
  ds = _from_examples([{"inputs": [2, 3, 1], "targets": [4, 1]},
                       {"inputs": [5, 1, 0, 0], "targets": [6, 1]},
                       {"inputs": [7, 8, 9, 10, 11, 1], "targets": [12, 1]}])
  packed = dataset.pack_dataset(ds, {"inputs": 4, "targets": 6})
  _assert_literal_rows(_rows(packed), [
      {"inputs": [2, 3, 1, 0],
       "inputs_segmentation": [1, 1, 1, 0],
       "inputs_position": [0, 1, 2, 0],
       "targets": [4, 1, 0, 0, 0, 0],
       "targets_segmentation": [1, 1, 0, 0, 0, 0],
       "targets_position": [0, 1, 0, 0, 0, 0]},
      {"inputs": [5, 1, 0, 0],
       "inputs_segmentation": [1, 1, 0, 0],
       "inputs_position": [0, 1, 0, 0],
       "targets": [6, 1, 0, 0, 0, 0],
       "targets_segmentation": [1, 1, 0, 0, 0, 0],
       "targets_position": [0, 1, 0, 0, 0, 0]},
      {"inputs": [7, 8, 9, 10],
       "inputs_segmentation": [1, 1, 1, 1],
       "inputs_position": [0, 1, 2, 3],
       "targets": [12, 1, 0, 0, 0, 0],
       "targets_segmentation": [1, 1, 0, 0, 0, 0],
       "targets_position": [0, 1, 0, 0, 0, 0]},
  ])


def test_pack_dataset_groups_of_max_length_examples_by_hand():
  # Length 3 packs groups of 3 examples: [6, 6] overflows the first row,
  # and [7] starts a new row although it would fit after [6, 6], because
  # it belongs to the next group (as in the original).
  ds = _from_examples([{"targets": [4]}, {"targets": [5]},
                       {"targets": [6, 6]}, {"targets": [7]}])
  _assert_literal_rows(_rows(dataset.pack_dataset(ds, 3)), [
      {"targets": [4, 5, 0], "targets_segmentation": [1, 2, 0],
       "targets_position": [0, 0, 0]},
      {"targets": [6, 6, 0], "targets_segmentation": [1, 1, 0],
       "targets_position": [0, 1, 0]},
      {"targets": [7, 0, 0], "targets_segmentation": [1, 0, 0],
       "targets_position": [0, 0, 0]},
  ])


@pytest.mark.parametrize("length,keys,max_len,count", [
    (5, ("inputs", "targets"), 7, 23),
    (8, ("targets",), 6, 30),
    ({"inputs": 6, "targets": 4}, ("inputs", "targets"), 5, 25),
    (3, ("inputs", "targets"), 2, 11),
])
def test_pack_dataset_matches_reference(length, keys, max_len, count):
  rng = np.random.default_rng(len(keys) * 100 + count)
  examples = _random_examples(rng, count, keys, max_len)
  lengths = {k: length if isinstance(length, int) else length[k]
             for k in keys}
  got = _rows(dataset.pack_dataset(_from_examples(examples), length,
                                   keys=list(keys)))
  want = _reference_pack(examples, keys, lengths)
  assert len(want) > count // max(lengths.values())  # several rows a group
  _assert_rows_equal(got, want)


def test_pack_dataset_keeps_only_keys_and_static_shapes():
  ds = _from_examples([{"inputs": [3, 1], "targets": [2, 1], "x": [5]}] * 3)
  packed = dataset.pack_dataset(ds, 6, keys=["targets"])
  assert set(packed.element_spec) == {
      "targets", "targets_segmentation", "targets_position"}
  for spec in packed.element_spec.values():
    assert spec.shape == tf.TensorShape([6])
  rows = _rows(packed)
  np.testing.assert_array_equal(rows[0]["targets"], [2, 1, 2, 1, 2, 1])
  np.testing.assert_array_equal(rows[0]["targets_segmentation"],
                                [1, 1, 2, 2, 3, 3])


def test_pack_dataset_inside_graph_and_function():
  examples = [{"targets": [1, 2, 3]}, {"targets": [4]}]

  @tf.function
  def first_row():
    return next(iter(dataset.pack_dataset(_from_examples(examples), 5)))

  np.testing.assert_array_equal(first_row()["targets"], [1, 2, 3, 4, 0])
  with tf.Graph().as_default():
    ds = dataset.pack_dataset(_from_examples(examples), 5)
    row = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    with tf.compat.v1.Session() as sess:
      got = sess.run(row)
  np.testing.assert_array_equal(got["targets_position"], [0, 1, 2, 0, 0])


def test_pack_dataset_bad_keys():
  ds = _from_examples([{"targets": [1]}])
  with pytest.raises(ValueError, match="'inputs' not found"):
    dataset.pack_dataset(ds, 4, keys=["inputs"])
  ds2 = tf.data.Dataset.from_tensors({"targets": tf.zeros([2, 2], tf.int32)})
  with pytest.raises(ValueError, match="one-dimensional"):
    dataset.pack_dataset(ds2, 4)


def test_trim_and_pad_dataset():
  ds = _from_examples([{"inputs": [1, 2, 3, 4, 5], "targets": [7]}])
  row = _rows(dataset.trim_and_pad_dataset(ds, 3))[0]
  np.testing.assert_array_equal(row["inputs"], [1, 2, 3])
  np.testing.assert_array_equal(row["targets"], [7, 0, 0])
  row = _rows(dataset.trim_and_pad_dataset(
      ds, {"inputs": 6}, feature_keys=["inputs"]))[0]
  np.testing.assert_array_equal(row["inputs"], [1, 2, 3, 4, 5, 0])
  np.testing.assert_array_equal(row["targets"], [7])


def test_trim_and_pad_keeps_trailing_dimensions():
  ds = tf.data.Dataset.from_tensors({"x": tf.ones([2, 3], tf.int32)})
  padded = dataset.trim_and_pad_dataset(ds, 4)
  assert padded.element_spec["x"].shape == tf.TensorShape([4, 3])
  np.testing.assert_array_equal(_rows(padded)[0]["x"].sum(axis=1),
                                [3, 3, 0, 0])


def test_ensure_dataset_eos():
  ds = _from_examples([{"a": [5, 6, 7], "b": [5, 0], "c": [9]}])
  row = _rows(dataset.ensure_dataset_eos(ds, feature_keys=["a", "b"]))[0]
  np.testing.assert_array_equal(row["a"], [5, 6, 1])
  np.testing.assert_array_equal(row["b"], [5, 0])
  np.testing.assert_array_equal(row["c"], [9])
  every = _rows(dataset.ensure_dataset_eos(ds))[0]
  np.testing.assert_array_equal(every["c"], [1])


def test_pack_or_pad_ensure_eos_on_some_keys():
  examples = [{"inputs": [3, 4, 5], "targets": [6, 7, 8]}]
  both = _rows(dataset.pack_or_pad(_from_examples(examples), 2, pack=False,
                                   ensure_eos=True))[0]
  np.testing.assert_array_equal(both["inputs"], [3, 1])
  np.testing.assert_array_equal(both["targets"], [6, 1])
  some = _rows(dataset.pack_or_pad(_from_examples(examples), 2, pack=False,
                                   ensure_eos=["targets"]))[0]
  np.testing.assert_array_equal(some["inputs"], [3, 4])
  np.testing.assert_array_equal(some["targets"], [6, 1])
  packed = _rows(dataset.pack_or_pad(_from_examples(examples), 2,
                                     ensure_eos={"inputs"}))[0]
  np.testing.assert_array_equal(packed["inputs"], [3, 1])
  np.testing.assert_array_equal(packed["targets"], [6, 7])
  np.testing.assert_array_equal(packed["inputs_segmentation"], [1, 1])


def test_pack_or_pad():
  examples = [{"inputs": [3, 4, 5], "targets": [6, 7]},
              {"inputs": [8], "targets": [9, 9, 9]}]
  padded = _rows(dataset.pack_or_pad(_from_examples(examples), 4,
                                     pack=False, ensure_eos=True))
  np.testing.assert_array_equal(padded[0]["inputs"], [3, 4, 5, 0])
  np.testing.assert_array_equal(padded[1]["targets"], [9, 9, 9, 0])
  packed = _rows(dataset.pack_or_pad(_from_examples(examples),
                                     {"inputs": 4, "targets": 5}))
  assert len(packed) == 1
  np.testing.assert_array_equal(packed[0]["inputs"], [3, 4, 5, 8])
  np.testing.assert_array_equal(packed[0]["targets"], [6, 7, 9, 9, 9])
  np.testing.assert_array_equal(packed[0]["targets_segmentation"],
                                [1, 1, 2, 2, 2])
  short = _rows(dataset.pack_or_pad(_from_examples(examples), 3,
                                    ensure_eos=True))
  np.testing.assert_array_equal(short[0]["inputs"], [3, 4, 1])


def test_pad_dataset_with_zeroed_out_examples():
  ds = _from_examples([{"targets": [4, 5]}, {"targets": [6]}])
  rows = list(dataset.pad_dataset_with_zeroed_out_examples(ds).take(5)
              .as_numpy_iterator())
  assert [r["targets"].tolist() for r in rows] == [
      [4, 5], [6], [0, 0], [0], [0, 0]]


def test_supervised_to_dict():
  ds = tf.data.Dataset.from_tensors((tf.constant([1]), tf.constant([2])))
  assert set(dataset.supervised_to_dict(ds, False).element_spec) == {
      "inputs", "targets"}
  only = _rows(dataset.supervised_to_dict(ds, True))[0]
  assert list(only) == ["targets"]
  assert only["targets"].tolist() == [2]


class _CharVocabulary:
  """A stub vocabulary: each byte b becomes b + 2."""

  def encode_tf(self, s):
    return tf.strings.unicode_decode(s, "UTF-8") + 2


def test_encode_dataset_and_encode_all_features():
  ds = tf.data.Dataset.from_tensors(
      {"inputs": tf.constant("ab"), "targets": tf.constant("c"),
       "id": tf.constant(7)})
  encoded = _rows(dataset.encode_dataset(ds.map(
      lambda ex: {"inputs": ex["inputs"]}), _CharVocabulary()))[0]
  assert encoded["inputs"].tolist() == [99, 100]
  every = _rows(dataset.encode_all_features(ds, _CharVocabulary()))[0]
  assert sorted(every) == ["inputs", "targets"]
  assert every["inputs"].tolist() == [99, 100, 1]
  assert every["targets"].dtype == np.int64
  assert every["targets"].tolist() == [101, 1]


def test_text_line_datasets(tmp_path):
  (tmp_path / "a1.txt").write_text("a\nb\n")
  (tmp_path / "a2.txt").write_text("c\n")
  (tmp_path / "z.txt").write_text("z\n")
  lines = dataset.simple_text_line_dataset(str(tmp_path / "a*.txt"), 10)
  assert sorted(lines.as_numpy_iterator()) == [b"a", b"b", b"c"]
  mixed = dataset.sample_from_text_line_datasets(
      [(str(tmp_path / "a*.txt"), 1.0), (str(tmp_path / "z.txt"), 0.0)],
      shuffle_buffer_size=10, prefetch=2)
  assert set(mixed.take(30).as_numpy_iterator()) == {b"a", b"b", b"c"}
  # The default shuffle buffer (100000 lines) would take seconds to fill.
  with gin.unlock_config():
    gin.clear_config()
    gin.bind_parameter("mesh_tensorflow.transformer.dataset."
                       "sample_from_text_line_datasets.shuffle_buffer_size", 4)
  try:
    one = dataset.make_text_line_dataset(str(tmp_path / "z.txt"))
    assert list(one.take(3).as_numpy_iterator()) == [b"z"] * 3
  finally:
    gin.clear_config()
  with pytest.raises(ValueError, match="no files match"):
    dataset.simple_text_line_dataset(str(tmp_path / "none*"), 10)


def test_gin_names():
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config("""
        import mesh_tensorflow.transformer.dataset
        mesh_tensorflow.transformer.dataset.pack_or_pad.pack = False
        dataset.simple_text_line_dataset.shuffle_buffer_size = 3
    """, skip_unknown=False)
  try:
    ds = _from_examples([{"targets": [1, 2]}])
    row = _rows(dataset.pack_or_pad(ds, 3))[0]
    assert sorted(row) == ["targets"]
  finally:
    gin.clear_config()


def test_packed_parallel_tsv_dataset():
  lines = tf.data.Dataset.from_tensor_slices(["ab\tc", "d\tef", "ghij\tk"])
  packed = _rows(dataset.packed_parallel_tsv_dataset(
      lines, "train", sequence_length=6, vocabulary=_CharVocabulary()))
  assert len(packed) == 2
  a, b, c, d, e, f = (ord(ch) + 2 for ch in "abcdef")
  np.testing.assert_array_equal(packed[0]["inputs"], [a, b, 1, d, 1, 0])
  np.testing.assert_array_equal(packed[0]["targets"], [c, 1, e, f, 1, 0])
  np.testing.assert_array_equal(packed[0]["inputs_segmentation"],
                                [1, 1, 1, 2, 2, 0])
  # max_encoded_len drops "ghij" (5 ids with EOS); a pair of vocabularies.
  kept = _rows(dataset.packed_parallel_tsv_dataset(
      lines, "train", sequence_length=8,
      vocabulary=(_CharVocabulary(), _CharVocabulary()), append_eos=False,
      max_encoded_len=3))
  assert len(kept) == 1
  np.testing.assert_array_equal(kept[0]["targets"][:3], [c, e, f])


def _write_tfrecord(path, examples):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for ex in examples:
      feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
                 for k, v in ex.items()}
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=feature)).SerializeToString())


def test_pretokenized_tfrecord_and_t2t_datasets(tmp_path):
  _write_tfrecord(tmp_path / "prob-dev-00000",
                  [{"inputs": [5, 6], "targets": [7], "other": [9]},
                   {"inputs": [8], "targets": [4, 4]}])
  rows = _rows(dataset.pretokenized_tfrecord_dataset(
      [str(tmp_path / "prob-dev-00000")], text2self=False,
      eos_included=False, repeat=False, batch_size=None, sequence_length=5,
      vocab_shift=10))
  assert len(rows) == 1
  np.testing.assert_array_equal(rows[0]["inputs"], [15, 16, 1, 18, 1])
  np.testing.assert_array_equal(rows[0]["targets"], [17, 1, 14, 14, 1])
  lm = _rows(dataset.pretokenized_t2t_dataset(
      "prob", text2self=True, data_dir=str(tmp_path), dataset_split="dev",
      sequence_length=4))
  assert sorted(lm[0]) == [
      "targets", "targets_position", "targets_segmentation"]
  np.testing.assert_array_equal(lm[0]["targets"], [7, 4, 4, 0])
  with pytest.raises(ValueError, match="no files match"):
    dataset.pretokenized_t2t_dataset("nothing", data_dir=str(tmp_path),
                                     sequence_length=4)


def test_text_line_shuffles_follow_the_run_seed(tmp_path):
  """Within shuffle_seed(seed) (utils.run's seed) the text-line datasets
  give one order each time they are made; without, a new order each time,
  as in the original."""
  (tmp_path / "lines.txt").write_text("".join(f"{i}\n" for i in range(40)))
  glob = str(tmp_path / "*.txt")

  def orders():
    simple = dataset.simple_text_line_dataset(glob, 100)
    endless = dataset.sample_from_text_line_datasets(
        [(glob, 1.0)], shuffle_buffer_size=100, prefetch=2)
    return (tuple(simple.as_numpy_iterator()),
            tuple(endless.take(80).as_numpy_iterator()))

  with dataset.shuffle_seed(1):
    first, again = orders(), orders()
  with dataset.shuffle_seed(2):
    other = orders()
  unseeded = {orders() for _ in range(2)}
  assert first == again
  assert first != other
  assert len(unseeded) == 2
  assert sorted(first[0]) == sorted(f"{i}".encode() for i in range(40))


def test_tfds_shuffles_follow_the_run_seed(tmp_path):
  """A seeded run's TFDS training data: its files are shuffled with a
  seed too (tfds.ReadConfig), the same each time; unseeded otherwise."""
  def load():
    return dataset.pretokenized_tfds_dataset(
        _TRANSLATION, text2self=True, tfds_data_dir=str(tmp_path),
        dataset_split="train", sequence_length=3)

  with _MockTfds([{"az": [4, 5], "en": [6]}]) as mock:
    with dataset.shuffle_seed(7):
      load()
      load()
    load()
  seeds = [c["shuffle_seed"] for c in mock.calls]
  assert seeds[0] is not None and seeds[0] == seeds[1]
  assert seeds[2] is None


def test_eval_dataset_fields():
  assert dataset.EvalDataset._fields == (
      "name", "dataset_fn", "postprocess_fn", "metric_fns")


class _MockTfds:
  """tfds.load through tfds.testing.mock_data, on examples given here.

  Nothing is read or downloaded: the builder's code supplies the dataset's
  metadata (supervised keys) and `examples` its records. Records the split
  and file shuffling each load asked for.
  """

  def __init__(self, examples):
    self.examples = examples
    self.calls = []

  def __enter__(self):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    def as_dataset_fn(builder, split=None, shuffle_files=None,
                      read_config=None, **unused):
      self.calls.append(dict(
          name=builder.name, split=split, shuffle_files=shuffle_files,
          shuffle_seed=getattr(read_config, "shuffle_seed", None)))
      first = self.examples[0]
      if isinstance(next(iter(first.values())), str):
        return tf.data.Dataset.from_tensor_slices(
            {k: [ex[k] for ex in self.examples] for k in first})
      return tf.data.Dataset.from_generator(
          lambda: iter(self.examples),
          output_signature={k: tf.TensorSpec([None], tf.int64)
                            for k in first})

    self._mock = tfds.testing.mock_data(as_dataset_fn=as_dataset_fn)
    self._mock.__enter__()
    return self

  def __exit__(self, *exc):
    return self._mock.__exit__(*exc)


# A TFDS translation dataset: its supervised keys are ("az", "en").
_TRANSLATION = "ted_hrlr_translate/az_to_en"


def test_pretokenized_tfds_dataset(tmp_path):
  with _MockTfds([{"az": [4, 5], "en": [6]},
                  {"az": [7], "en": [8, 9]}]) as mock:
    rows = _rows(dataset.pretokenized_tfds_dataset(
        _TRANSLATION, text2self=False, tfds_data_dir=str(tmp_path),
        dataset_split="validation", sequence_length=5))
    # The ids move up by one (the encoders have no EOS id) and end in EOS;
    # both examples are packed into one row.
    assert len(rows) == 1
    np.testing.assert_array_equal(rows[0]["inputs"], [5, 6, 1, 8, 1])
    np.testing.assert_array_equal(rows[0]["inputs_segmentation"],
                                  [1, 1, 1, 2, 2])
    np.testing.assert_array_equal(rows[0]["targets"], [7, 1, 9, 10, 1])
    np.testing.assert_array_equal(rows[0]["targets_position"],
                                  [0, 1, 0, 1, 2])
    lm = _rows(dataset.pretokenized_tfds_dataset(
        _TRANSLATION, text2self=True, tfds_data_dir=str(tmp_path),
        dataset_split="validation", sequence_length=3))
    assert sorted(lm[0]) == [
        "targets", "targets_position", "targets_segmentation"]
    np.testing.assert_array_equal(lm[0]["targets"], [7, 1, 0])
    # The train split is shuffled (files and examples) and endless.
    train = dataset.pretokenized_tfds_dataset(
        _TRANSLATION, text2self=True, tfds_data_dir=str(tmp_path),
        dataset_split="train", sequence_length=3)
    assert len(list(train.take(7).as_numpy_iterator())) == 7
  assert [(c["split"], c["shuffle_files"]) for c in mock.calls] == [
      ("validation", False), ("validation", False), ("train", True)]


def test_untokenized_tfds_dataset(tmp_path):
  a, b, c, d = (ord(ch) + 2 for ch in "abcd")
  with _MockTfds([{"az": "ab", "en": "c"}, {"az": "d", "en": "dd"}]):
    rows = _rows(dataset.untokenized_tfds_dataset(
        _TRANSLATION, text2self=False, tfds_data_dir=str(tmp_path),
        dataset_split="validation", sequence_length=4,
        vocabulary=_CharVocabulary(), pack=False))
    assert sorted(rows[0]) == ["inputs", "targets"]
    np.testing.assert_array_equal(rows[0]["inputs"], [a, b, 1, 0])
    np.testing.assert_array_equal(rows[0]["targets"], [c, 1, 0, 0])
    np.testing.assert_array_equal(rows[1]["targets"], [d, d, 1, 0])
    packed = _rows(dataset.untokenized_tfds_dataset(
        _TRANSLATION, text2self=False, tfds_data_dir=str(tmp_path),
        dataset_split="validation", sequence_length=5,
        vocabulary=_CharVocabulary(), pack=True))
    np.testing.assert_array_equal(packed[0]["inputs"], [a, b, 1, d, 1])
    np.testing.assert_array_equal(packed[0]["targets"], [c, 1, d, d, 1])
  # text2self trains a language model on the dataset's text: lm1b's
  # "text" (its supervised target key) becomes "targets".
  with _MockTfds([{"text": "ab"}]):
    lm = _rows(dataset.untokenized_tfds_dataset(
        "lm1b", text2self=True, tfds_data_dir=str(tmp_path),
        dataset_split="test", sequence_length=4,
        vocabulary=_CharVocabulary(), pack=False))
  assert sorted(lm[0]) == ["targets"]
  np.testing.assert_array_equal(lm[0]["targets"], [a, b, 1, 0])
  # A dataset that has "targets" keeps its features, as in the original.
  with _MockTfds([{"targets": "ab", "inputs": "c"}]):
    lm = _rows(dataset.untokenized_tfds_dataset(
        "lm1b", text2self=True, tfds_data_dir=str(tmp_path),
        dataset_split="test", sequence_length=4,
        vocabulary=_CharVocabulary(), pack=False))
  assert sorted(lm[0]) == ["inputs", "targets"]
  np.testing.assert_array_equal(lm[0]["targets"], [a, b, 1, 0])


def test_package_exports_dataset():
  assert transformer_package.dataset is dataset
