"""The embedded default task: multi-digit addition written as text.

The training binary's default data needs no download: "inputs" is a sum such
as "417+86" and "targets" its result "503". A small sequence-to-sequence
model learns it to high exact-match accuracy in minutes on a CPU, so exact
match on the held-out split says whether training worked.

Held out means never trained on: a sum belongs to the validation split when
a stable hash of its text (`tf.strings.to_hash_bucket_fast`, a fingerprint
that does not change between runs or machines) falls in one tenth of its
range, and the training stream skips those sums.

The examples are made by stateless TF ops from (seed, split, example index),
so both splits are reproducible from their seed, and the pipeline is plain
tf.data (a counter, a map, an unbatch): its position can be saved with the
model (`utils.run`'s `checkpoint_input_pipeline`) and training resumes on
the examples that follow.

For `utils.run` (see gin/problems/addition.gin):
- `addition_train_dataset_fn`: encoded, EOS-terminated, packed (or padded)
  int32 examples, as `dataset.packed_parallel_tsv_dataset` gives them;
- `addition_eval_dataset_fn`: one `dataset.EvalDataset` of a fixed number of
  held-out examples, padded, with their text ("inputs_pretokenized",
  "targets_pretokenized"), scored by `exact_match` and `digit_accuracy`,
  and by exact match per number of carries;
- `addition_vocabulary`: the vocabulary (UTF-8 bytes).
"""

import functools

import gin
import tensorflow as tf

from mesh_tensorflow.estimator import host_values
from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

_GIN_MODULE = "mesh_tensorflow.transformer.embedded_task"
SPLITS = ("train", "validation")
_VALIDATION_SHARE = 10  # One sum in ten is held out.
_MAX_DIGITS = 18  # Operands and sums stay within int64.
_FEATURES = ("inputs", "targets")
_CHUNK = 256  # Examples drawn at once (vectorized), then filtered.
# Held-out sums are measured by their number of carries: 0, 1, ... and a last
# class of "at least" this many (rarer classes would take long to fill).
_MAX_CARRY_CLASS = 4


def _check_split_and_digits(split, max_digits):
  if split not in SPLITS:
    raise ValueError(f"Unknown split {split!r} of the addition task; "
                     f"expected one of {SPLITS}.")
  if not 1 <= max_digits <= _MAX_DIGITS:
    raise ValueError(f"max_digits must be in [1, {_MAX_DIGITS}], got "
                     f"{max_digits}.")


def is_held_out(inputs):
  """Whether the sums `inputs` (a tf.string tensor) are validation sums."""
  return tf.equal(tf.strings.to_hash_bucket_fast(inputs, _VALIDATION_SHARE),
                  0)


def count_carries(a, b):
  """How many columns of the written sum a + b carry (ints >= 0).

  "250+250" carries once (into the hundreds), "999+1" three times.
  """
  if a < 0 or b < 0:
    raise ValueError(f"count_carries takes non-negative ints, got {a}, {b}.")
  carries = carry = 0
  while a or b:
    carry = int(a % 10 + b % 10 + carry >= 10)
    carries += carry
    a, b = a // 10, b // 10
  return carries


def _carries_tf(a, b, max_digits):
  """count_carries of int64 vectors whose operands have <= max_digits."""
  carries = carry = tf.zeros_like(a)
  for _ in range(max_digits):
    carry = tf.cast(a % 10 + b % 10 + carry >= 10, tf.int64)
    carries += carry
    a, b = a // 10, b // 10
  return carries


def carry_classes(max_digits):
  """The carry classes of the held-out measurements: (label, low, high).

  A sum belongs to a class when low <= its carries <= high: 0, 1, ... up to
  min(max_digits, 4), the last one taking every larger count ("4+").
  """
  top = min(max_digits, _MAX_CARRY_CLASS)
  classes = [(str(k), k, k) for k in range(top)]
  if top == max_digits:
    classes.append((str(top), top, top))
  else:
    classes.append((f"{top}+", top, max_digits))
  return classes


def _make_chunk(chunk, seed_key, max_digits):
  """The sums of the chunk-th block of _CHUNK examples, from stateless draws.

  The digit count of each operand is drawn first (1 to max_digits, so short
  and long sums are equally common), then the operand among the numbers of
  that many digits (no leading zeros; 0 counts as a one-digit number).
  "carries" is each sum's count_carries.
  """
  draws = tf.random.stateless_uniform(
      [_CHUNK, 4], seed=tf.stack([seed_key, chunk]), minval=None,
      maxval=None, dtype=tf.int64, alg="philox")  # The same on any device.
  digits = 1 + tf.math.floormod(draws[:, :2], max_digits)
  high = tf.pow(tf.constant(10, tf.int64), digits)
  low = tf.where(digits > 1, high // 10, tf.zeros_like(high))
  operands = low + tf.math.floormod(draws[:, 2:], high - low)
  a, b = operands[:, 0], operands[:, 1]
  return {"inputs": tf.strings.join([tf.strings.as_string(a), "+",
                                     tf.strings.as_string(b)]),
          "targets": tf.strings.as_string(a + b),
          "carries": _carries_tf(a, b, max_digits)}


def _sum_chunks(split, max_digits, seed, carries=None, with_carries=False):
  """Endless blocks of sums of `split`: dicts of 1-D tf.string tensors.

  carries: None (every sum), or (low, high): only sums with that many
  carries (from the same stream: a subsequence of the split).
  with_carries: also give each sum's number of carries ("carries", int64).
  """
  _check_split_and_digits(split, max_digits)
  # One stream of draws per (seed, split).
  seed_key = tf.constant(seed * len(SPLITS) + SPLITS.index(split), tf.int64)
  held_out = split == "validation"

  def sums_of_split(chunk):
    sums = _make_chunk(chunk, seed_key, max_digits)
    keep = tf.equal(is_held_out(sums["inputs"]), held_out)
    if carries is not None:
      keep &= (sums["carries"] >= carries[0]) & (sums["carries"] <= carries[1])
    keys = _FEATURES + ("carries",) if with_carries else _FEATURES
    return {k: tf.boolean_mask(sums[k], keep) for k in keys}

  return tf.data.Dataset.counter(dtype=tf.int64).map(
      sums_of_split, num_parallel_calls=tf.data.AUTOTUNE)


def _carry_stratified_sums(split, max_digits, seed, class_sizes):
  """The first sums of `split` of each carry class, class after class.

  One pass over the split's stream, stopped as soon as every class has its
  share (the rarest class sets the length: with 3 digits about 50,000 sums
  for 125 held-out sums that carry three times).

  Args:
    split, max_digits, seed: as addition_dataset.
    class_sizes: a list of ((low, high) carries, number of sums).
  Returns:
    {"inputs": [...], "targets": [...]} lists of str.
  """
  buckets = [[] for _ in class_sizes]
  stream = host_values.numpy_iterator(
      _sum_chunks(split, max_digits, seed, with_carries=True))
  while any(len(b) < n for b, (_, n) in zip(buckets, class_sizes)):
    chunk = next(stream)
    for inputs, targets, carries in zip(chunk["inputs"], chunk["targets"],
                                        chunk["carries"]):
      for bucket, ((low, high), n) in zip(buckets, class_sizes):
        if low <= carries <= high and len(bucket) < n:
          bucket.append((inputs.decode("ascii"), targets.decode("ascii")))
  sums = [pair for bucket in buckets for pair in bucket]
  return {"inputs": [x for x, _ in sums], "targets": [y for _, y in sums]}


@gin.configurable(module=_GIN_MODULE)
def addition_dataset(split="train", max_digits=3, seed=0,
                     num_examples=None, carries=None):
  """A tf.data.Dataset of {"inputs", "targets"} strings of the task.

  Args:
    split: "train" or "validation" (sums never seen in training).
    max_digits: the longest operand, 1 to 18.
    seed: an int; the same seed gives the same examples.
    num_examples: stop after this many (default: endless).
    carries: None (every sum), or an int: only the sums of the split that
      carry that many times (count_carries).
  Returns:
    a tf.data.Dataset of dicts of scalar tf.string.
  Raises:
    ValueError: for an unknown split or max_digits out of range.
  """
  if carries is not None:
    carries = (carries, carries)
  ds = _sum_chunks(split, max_digits, seed, carries).unbatch()
  if num_examples is not None:
    ds = ds.take(num_examples)
  return ds


def addition_examples(split, max_digits=3, seed=0, carries=None):
  """Yields the (inputs, targets) strings of `addition_dataset`, forever."""
  for ex in host_values.numpy_iterator(
      addition_dataset(split, max_digits, seed, carries=carries)):
    yield ex["inputs"].decode("ascii"), ex["targets"].decode("ascii")


@gin.configurable(module=_GIN_MODULE)
def addition_vocabulary():
  """The task's vocabulary for `utils.run.vocabulary`: UTF-8 bytes."""
  return vocabulary_lib.ByteVocabulary()


def _vocabularies(vocabulary):
  """{"inputs": ..., "targets": ...} from one vocabulary or a pair."""
  if isinstance(vocabulary, tuple):
    return dict(zip(_FEATURES, vocabulary))
  return {k: vocabulary for k in _FEATURES}


def _lengths(sequence_length):
  if isinstance(sequence_length, int):
    return {k: sequence_length for k in _FEATURES}
  missing = [k for k in _FEATURES if k not in sequence_length]
  if missing:
    raise ValueError(f"addition task: sequence_length {sequence_length!r} "
                     f"gives no length for {missing}.")
  return {k: sequence_length[k] for k in _FEATURES}


def _check_lengths(fn_name, sequence_length, vocabulary, max_digits):
  """Refuses lengths that would cut the longest sums (byte vocabularies).

  With other vocabularies the token count of a sum is not known in advance,
  and no check is made.
  """
  longest = {"inputs": "9" * max_digits + "+" + "9" * max_digits,
             "targets": str(2 * (10**max_digits - 1))}
  lengths = _lengths(sequence_length)
  for key, vocab in _vocabularies(vocabulary).items():
    if not isinstance(vocab, vocabulary_lib.ByteVocabulary):
      continue
    needed = len(vocab.encode(longest[key])) + 1  # EOS.
    if lengths[key] < needed:
      raise ValueError(
          f"{fn_name}: sequence_length[{key!r}] = {lengths[key]} is too "
          f"short for max_digits={max_digits}: {longest[key]!r} takes "
          f"{needed} tokens with EOS.")


def _encode_batch(vocabulary, texts):
  """1-D strings to a [n, None] int32 RaggedTensor of ids.

  A vocabulary whose encode_tf takes a batch (ByteVocabulary,
  SentencePieceVocabulary) encodes it at once; any other one string by
  string.
  """
  ids = vocabulary.encode_tf(texts)
  if not isinstance(ids, tf.RaggedTensor):
    ids = tf.map_fn(
        lambda t: tf.cast(vocabulary.encode_tf(t), tf.int32), texts,
        fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))
  return tf.cast(ids, tf.int32)


def _encoded(split, max_digits, seed, vocabulary, pad_to=None,
             keep_text=False, sums=None):
  """Endless encoded sums: int32 "inputs" and "targets" ending in EOS.

  Encoding runs on blocks of sums (much faster than one by one).

  Args:
    split, max_digits, seed: as addition_dataset.
    vocabulary: a Vocabulary, or an (inputs, targets) pair.
    pad_to: None (variable lengths) or a dict of lengths to pad to.
    keep_text: whether to keep the sums as "<key>_pretokenized" strings.
    sums: None (the split's stream), or {"inputs", "targets"} lists of
      str to encode instead.
  Returns:
    a tf.data.Dataset of single examples.
  """
  vocabularies = _vocabularies(vocabulary)

  def encode(sums):
    encoded = {}
    for k in _FEATURES:
      ids = _encode_batch(vocabularies[k], sums[k])
      eos = tf.fill([ids.nrows(), 1], vocabulary_lib.EOS_ID)
      ids = tf.concat([ids, eos], axis=1)
      if pad_to is not None:
        ids = ids.to_tensor(shape=[None, pad_to[k]])
      encoded[k] = ids
      if keep_text:
        encoded[k + "_pretokenized"] = sums[k]
    return encoded

  if sums is None:
    chunks = _sum_chunks(split, max_digits, seed)
  else:
    chunks = tf.data.Dataset.from_tensor_slices(
        {k: tf.constant(sums[k], tf.string) for k in _FEATURES}).batch(
            _CHUNK)
  return chunks.map(encode, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


@gin.configurable(module=_GIN_MODULE)
def addition_train_dataset_fn(sequence_length, vocabulary,
                              dataset_split="train", max_digits=3, seed=0,
                              pack=True):
  """The training examples, for `utils.run.train_dataset_fn`.

  Args:
    sequence_length: an int, or a dict with "inputs" and "targets" lengths.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    dataset_split: "train" or "validation".
    max_digits: the longest operand.
    seed: an int, the seed of the example stream.
    pack: whether to pack several examples into a row (True) or pad each.
  Returns:
    an endless tf.data.Dataset of int32 {"inputs", "targets"} of fixed
    lengths, ending in EOS=1, with "<key>_segmentation" and "<key>_position"
    when packed.
  Raises:
    ValueError: if a sequence length cannot hold the longest sums.
  """
  _check_split_and_digits(dataset_split, max_digits)
  _check_lengths("addition_train_dataset_fn", sequence_length, vocabulary,
                 max_digits)
  lengths = _lengths(sequence_length)
  if not pack:
    return _encoded(dataset_split, max_digits, seed, vocabulary,
                    pad_to=lengths)
  return dataset.pack_or_pad(
      _encoded(dataset_split, max_digits, seed, vocabulary), lengths,
      pack=True, feature_keys=list(_FEATURES))


def addition_postprocess(output, example=None, is_target=False):
  """Decoded text (or a target) to what the metrics compare: stripped."""
  del example, is_target
  return output.strip()


@gin.configurable(module=_GIN_MODULE)
def addition_eval_dataset_fn(sequence_length, vocabulary,
                             dataset_split="validation",
                             num_eval_examples=500, max_digits=3, seed=0,
                             split=None, by_carries=True):
  """The evaluation task, for `utils.run.eval_dataset_fn`.

  Random sums rarely carry far (with 3 digits, fewer than 3% carry three
  times), so a model can score well on them and still fail "250+250". With
  `by_carries` the examples are drawn in equal shares from each carry class
  (carry_classes: 0, 1, 2, ... carries), in that order, and the metrics
  include the exact match of each class.

  Args:
    sequence_length: an int, or a dict with "inputs" and "targets" lengths.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    dataset_split: "validation" (held-out sums) or "train"; `utils.run`
      passes its own `dataset_split` here.
    num_eval_examples: how many examples; the same ones on every call.
    max_digits: the longest operand.
    seed: an int, the seed of the example stream.
    split: when given, the split to evaluate whatever `dataset_split` says
      (gin/problems/addition.gin sets "validation", so that eval measures
      held-out sums even though `utils.run.dataset_split` is "train").
    by_carries: draw the examples in equal shares per carry class (the
      first classes get one more when the count does not divide) and report
      "exact_match_carries_<class>"; else take the split's first sums.
  Returns:
    a list of one dataset.EvalDataset named "addition" whose dataset_fn
    gives `num_eval_examples` unpacked examples: int32 "inputs" and
    "targets" padded to their lengths (ending in EOS=1), and the strings
    "inputs_pretokenized" and "targets_pretokenized"; metrics exact_match,
    digit_accuracy and, by_carries, exact_match_by_carries.
  Raises:
    ValueError: if a sequence length cannot hold the longest sums.
  """
  dataset_split = split or dataset_split
  _check_split_and_digits(dataset_split, max_digits)
  _check_lengths("addition_eval_dataset_fn", sequence_length, vocabulary,
                 max_digits)
  lengths = _lengths(sequence_length)
  metric_fns = [exact_match, digit_accuracy]

  if by_carries:
    classes = carry_classes(max_digits)
    share, extra = divmod(num_eval_examples, len(classes))
    sizes = [share + (i < extra) for i in range(len(classes))]

    drawn = []  # The sums, drawn once on the first call.

    def dataset_fn():
      if not drawn:
        drawn.append(_carry_stratified_sums(
            dataset_split, max_digits, seed,
            [((low, high), size)
             for (_, low, high), size in zip(classes, sizes)]))
      return _encoded(dataset_split, max_digits, seed, vocabulary,
                      pad_to=lengths, keep_text=True, sums=drawn[0])

    metric_fns.append(functools.partial(
        exact_match_by_carries,
        class_sizes=[(label, size) for (label, _, _), size
                     in zip(classes, sizes)]))
  else:

    def dataset_fn():
      return _encoded(dataset_split, max_digits, seed, vocabulary,
                      pad_to=lengths, keep_text=True).take(num_eval_examples)

  return [dataset.EvalDataset(
      name="addition", dataset_fn=dataset_fn,
      postprocess_fn=addition_postprocess, metric_fns=metric_fns)]


def _check_pairs(name, targets, predictions):
  targets, predictions = list(targets), list(predictions)
  if len(targets) != len(predictions):
    raise ValueError(f"{name}: {len(targets)} targets but "
                     f"{len(predictions)} predictions.")
  return targets, predictions


def exact_match(targets, predictions):
  """The share of predictions equal to their target, as {"exact_match"}."""
  targets, predictions = _check_pairs("exact_match", targets, predictions)
  if not targets:
    return {"exact_match": 0.0}
  hits = sum(t == p for t, p in zip(targets, predictions))
  return {"exact_match": hits / len(targets)}


def exact_match_by_carries(targets, predictions, class_sizes):
  """Exact match of each carry class, as {"exact_match_carries_<label>"}.

  Args:
    targets, predictions: lists of strings, ordered by carry class.
    class_sizes: [(label, number of examples)] of the classes, in order
      (as addition_eval_dataset_fn draws them).
  Returns:
    a dict of floats; a class without examples is left out.
  Raises:
    ValueError: if the counts do not add up to the number of targets.
  """
  targets, predictions = _check_pairs("exact_match_by_carries", targets,
                                      predictions)
  total = sum(size for _, size in class_sizes)
  if total != len(targets):
    raise ValueError(f"exact_match_by_carries: the carry classes hold {total} "
                     f"examples, but there are {len(targets)} targets.")
  results, start = {}, 0
  for label, size in class_sizes:
    if size:
      results[f"exact_match_carries_{label}"] = exact_match(
          targets[start:start + size],
          predictions[start:start + size])["exact_match"]
    start += size
  return results


def digit_accuracy(targets, predictions):
  """The share of target digits predicted right, as {"digit_accuracy"}.

  Digits are compared by place value (aligned from the right); a prediction
  longer than its target loses the extra places, so each pair counts
  max(len(target), len(prediction)) places.
  """
  targets, predictions = _check_pairs("digit_accuracy", targets,
                                      predictions)
  hits = places = 0
  for t, p in zip(targets, predictions):
    width = max(len(t), len(p))
    hits += sum(a == b for a, b in zip(t.rjust(width), p.rjust(width))
                if a != " ")
    places += width
  return {"digit_accuracy": hits / places if places else 0.0}
