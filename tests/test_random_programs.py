"""Property test: random mtf programs under random meshes and layouts.

Each program (element-wise ops, broadcasting, einsum, reductions, concat /
split / slice / pad / shift, renames, reshapes, gathers, and while-loop,
recompute and custom-gradient bodies, with gradients when there is no loop)
either gives the one-processor answer or raises an mtf error that names a
dimension: never a wrong answer, never a raw TensorFlow error. Seeded, so
every run checks the same cases; `benchmarks/random_programs.py` runs many
more.
"""

import collections

import pytest

from tests import random_programs

CHUNKS = 8
PER_CHUNK = 20


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_agree_with_one_processor(chunk):
  outcomes = collections.Counter()
  failures = []
  for case in random_programs.cases(PER_CHUNK, first_seed=chunk * PER_CHUNK):
    try:
      outcomes[random_programs.check(*case)] += 1
    except AssertionError as e:
      failures.append(str(e))
  assert not failures, "\n\n".join(failures)
  # The generator must mostly make valid programs that lower and run, or
  # the property says little.
  assert outcomes["invalid"] <= PER_CHUNK // 4, outcomes
  assert outcomes["agree"] >= PER_CHUNK // 4, outcomes
