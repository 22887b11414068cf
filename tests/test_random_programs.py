"""Property test: random mtf programs under random meshes and layouts.

Each program (element-wise ops, broadcasting, einsum, reductions, concat /
split / slice / pad / shift, stack / unstack, top_k and the selections,
pooling, renames, reshapes, gathers, and while-loop, recompute and
custom-gradient bodies, with gradients when there is no loop)
either gives the one-processor answer or raises an mtf error that names a
dimension: never a wrong answer, never a raw TensorFlow error. Half of the
layouts allow uneven splits, and split dimensions the mesh does not divide
(padded). Seeded, so
every run checks the same cases; `benchmarks/random_programs.py` runs many
more. Programs reach rank 7, past the rank limits of TensorFlow's kernels
(see tools/kernel_rank_audit.py); it must pass with
TF_ENABLE_ONEDNN_OPTS at 1 and at 0.
"""

import collections

import pytest

from tests import random_programs

CHUNKS = 8
PER_CHUNK = 16
# Tensors of rank >= HIGH_RANK meet TensorFlow kernels' rank limits.
HIGH_RANK = 6


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_agree_with_one_processor(chunk):
  outcomes = collections.Counter()
  failures = []
  cases = random_programs.cases(PER_CHUNK, first_seed=chunk * PER_CHUNK)
  # The programs must keep reaching high ranks (over a third do).
  high_rank = sum(random_programs.max_rank(case[0]) >= HIGH_RANK
                  for case in cases)
  assert high_rank >= PER_CHUNK // 5, (
      f"{high_rank} of {PER_CHUNK} programs have a tensor of rank >= "
      f"{HIGH_RANK}")
  for case in cases:
    try:
      outcome = random_programs.check(*case)
    except AssertionError as e:
      failures.append(str(e))
      continue
    outcomes[outcome] += 1
    if outcome == "agree" and random_programs.padded_dimensions(*case[:3]):
      outcomes["agree_padded"] += 1
  assert not failures, "\n\n".join(failures)
  # Some of them must run with padding.
  assert outcomes["agree_padded"] >= 1, outcomes
  # The generator must mostly make valid programs that lower and run, or
  # the property says little.
  assert outcomes["invalid"] <= PER_CHUNK // 4, outcomes
  assert outcomes["agree"] >= PER_CHUNK // 4, outcomes


def test_random_layouts_split_what_the_operations_act_along():
  # Each operation that lowers along a split dimension (slice, pad, concat,
  # split, stack, unstack, top_k) meets one in the cases above: this builds
  # the programs only (each type acts along a split dimension in 4 to 15 of
  # the 128 cases).
  found = collections.Counter()
  for chunk in range(CHUNKS):
    for case in random_programs.cases(PER_CHUNK, first_seed=chunk * PER_CHUNK):
      found.update(random_programs.along_split(*case[:3]))
  assert set(found) == set(random_programs.ALONG_DIMENSIONS), found
