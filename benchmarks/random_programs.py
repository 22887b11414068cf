"""Property run: many random mtf programs under random meshes and layouts.

The long form of tests/test_random_programs.py: every program must give the
one-processor answer or raise an mtf error that names a dimension; half of
the layouts allow uneven splits (padded dimensions). Prints one JSON line
with the outcome counts, the mtf errors sorted by cause (error class and
the operation at fault, "LayoutError:layout" for layout rules that do not
fit a tensor), and the raw errors (any other exception) apart from the wrong
answers; each wrong answer or raw error goes to stderr, with the first
error of each cause, and the exit status is non-zero if there was any.

  python benchmarks/random_programs.py [--count 2000] [--first-seed 1000]
"""

import argparse
import collections
import json
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
  p.add_argument("--progress", type=int, default=50,
                 help="log the counts so far every this many programs")
  args = p.parse_args(argv)
  bench_util.configure_logical_cpus(8)
  from tests import random_programs  # pylint: disable=g-import-not-at-top
  outcomes = collections.Counter()
  refusals = collections.Counter()
  along_split = collections.Counter()
  start = time.perf_counter()

  def summary(done):
    valid = done - outcomes["invalid"]
    # Errors of the layout rules themselves (two dimensions of one tensor on
    # one mesh dimension, a size the mesh does not divide without uneven
    # splits) are the user's, not refusals of an operation.
    refused = outcomes["error"] - refusals["LayoutError:layout"] - refusals[
        "IndivisibleError:layout"]
    return {
        "benchmark": "random_programs",
        "programs": done,
        "first_seed": args.first_seed,
        "agree": outcomes["agree"],
        # of which with dimensions split unevenly (padded)
        "agree_padded": outcomes["agree_padded"],
        "mtf_error": outcomes["error"],
        # mtf errors by class and the operation at fault
        "refusals": dict(sorted(refusals.items())),
        # operation refusals (not layout errors) per valid program
        "refusal_rate": round(refused / max(valid, 1), 4),
        "invalid_program": outcomes["invalid"],
        # programs with an operation acting along a split dimension, by type
        "along_split": dict(sorted(along_split.items())),
        # exceptions other than mtf errors naming a dimension (goal 0)
        "raw_errors": outcomes["raw_error"],
        # wrong answers (goal 0)
        "failures": outcomes["failure"],
        "seconds": round(time.perf_counter() - start, 1),
    }

  for done, case in enumerate(
      random_programs.cases(args.count, args.first_seed)):
    if done and args.progress and done % args.progress == 0:
      bench_util.log("PROGRESS " + json.dumps(summary(done)))
    along_split.update(random_programs.along_split(*case[:3]))
    try:
      outcome, error = random_programs.outcome(*case)
    except random_programs.WrongAnswer as e:
      outcomes["failure"] += 1
      bench_util.log(f"FAILURE {e}")
      continue
    except random_programs.RawError as e:
      outcomes["raw_error"] += 1
      bench_util.log(f"RAW ERROR {e}")
      continue
    outcomes[outcome] += 1
    if outcome == "error":
      cause = random_programs.error_cause(error)
      if not refusals[cause]:
        bench_util.log(f"REFUSAL {cause} (first: seed {case[0]}, mesh "
                       f"{case[1]!r}, layout {case[2]!r}): {error}")
      refusals[cause] += 1
    if outcome == "agree" and random_programs.padded_dimensions(*case[:3]):
      outcomes["agree_padded"] += 1
  bench_util.emit(summary(args.count))
  return 1 if outcomes["failure"] or outcomes["raw_error"] else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
