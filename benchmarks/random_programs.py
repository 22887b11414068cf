"""Property run: many random mtf programs under random meshes and layouts.

The long form of tests/test_random_programs.py: every program must give the
one-processor answer or raise an mtf error that names a dimension; half of
the layouts allow uneven splits (padded dimensions). Prints
one JSON line with the outcome counts; each failure goes to stderr and the
exit status is non-zero if there was any.

  python benchmarks/random_programs.py [--count 2000] [--first-seed 1000]
"""

import argparse
import collections
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--count", type=int, default=2000)
  p.add_argument("--first-seed", type=int, default=1000,
                 help="seeds below 160 are the ones make test checks")
  args = p.parse_args(argv)
  bench_util.configure_logical_cpus(8)
  from tests import random_programs  # pylint: disable=g-import-not-at-top
  outcomes = collections.Counter()
  start = time.perf_counter()
  for case in random_programs.cases(args.count, args.first_seed):
    try:
      outcome = random_programs.check(*case)
    except AssertionError as e:
      outcomes["failure"] += 1
      bench_util.log(f"FAILURE {e}")
      continue
    outcomes[outcome] += 1
    if outcome == "agree" and random_programs.padded_dimensions(*case[:3]):
      outcomes["agree_padded"] += 1
  bench_util.emit({
      "benchmark": "random_programs",
      "programs": args.count,
      "first_seed": args.first_seed,
      "agree": outcomes["agree"],
      # of which with dimensions split unevenly (padded)
      "agree_padded": outcomes["agree_padded"],
      "mtf_error": outcomes["error"],
      "invalid_program": outcomes["invalid"],
      "failures": outcomes["failure"],
      "seconds": round(time.perf_counter() - start, 1),
  })
  return 1 if outcomes["failure"] else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
