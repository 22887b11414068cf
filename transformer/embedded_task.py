"""The embedded default task: multi-digit addition written as text.

The training binary's default data needs no download: "inputs" is a sum such
as "417+86" and "targets" its result "503". A small sequence-to-sequence
model learns it to high exact-match accuracy in minutes on a CPU, so exact
match on the held-out split says whether training worked.

Held out means never trained on: a pair (a, b) belongs to the validation
split when a stable hash of it falls in one tenth of its range, and the
training stream skips those pairs. Both splits are reproducible from their
seed.
"""

import zlib

import gin
import numpy as np
import tensorflow as tf

SPLITS = ("train", "validation")
_VALIDATION_SHARE = 10  # One pair in ten is held out.


def _is_held_out(a, b):
  return zlib.crc32(f"{a}+{b}".encode("ascii")) % _VALIDATION_SHARE == 0


def addition_examples(split, max_digits=3, seed=0):
  """Yields (inputs, targets) strings of `split`, forever.

  Operands have 1 to `max_digits` digits (the number of digits is drawn
  first, so short and long sums are equally common).
  """
  if split not in SPLITS:
    raise ValueError(f"Unknown split {split!r} of the addition task; "
                     f"expected one of {SPLITS}.")
  if max_digits < 1:
    raise ValueError(f"max_digits must be >= 1, got {max_digits}.")
  rng = np.random.RandomState([seed, SPLITS.index(split)])
  held_out = split == "validation"
  while True:
    a, b = (int(rng.randint(10**(d - 1) if d > 1 else 0, 10**d))
            for d in rng.randint(1, max_digits + 1, size=2))
    if _is_held_out(a, b) == held_out:
      yield f"{a}+{b}", str(a + b)


@gin.configurable(module="mesh_tensorflow.transformer.embedded_task")
def addition_dataset(split="train", max_digits=3, seed=0,
                     num_examples=None):
  """A tf.data.Dataset of {"inputs", "targets"} strings of the task.

  Args:
    split: "train" or "validation" (pairs never seen in training).
    max_digits: the longest operand.
    seed: the split's seed; the same seed gives the same examples.
    num_examples: stop after this many (default: endless).
  """
  def generate():
    for count, (inputs, targets) in enumerate(
        addition_examples(split, max_digits, seed)):
      if num_examples is not None and count >= num_examples:
        return
      yield {"inputs": inputs, "targets": targets}

  return tf.data.Dataset.from_generator(generate, output_signature={
      "inputs": tf.TensorSpec([], tf.string),
      "targets": tf.TensorSpec([], tf.string)})


def exact_match(targets, predictions):
  """The share of predictions equal to their target, as {"exact_match"}."""
  targets, predictions = list(targets), list(predictions)
  if len(targets) != len(predictions):
    raise ValueError(f"exact_match: {len(targets)} targets but "
                     f"{len(predictions)} predictions.")
  if not targets:
    return {"exact_match": 0.0}
  hits = sum(t == p for t, p in zip(targets, predictions))
  return {"exact_match": hits / len(targets)}
