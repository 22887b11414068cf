#!/usr/bin/env bash
# Runs the original Mesh TensorFlow's own test files against this checkout.
#
# Usage: tools/run_original_tests.sh [--list-failures] SOURCE_TREE [NAME...]
#
# SOURCE_TREE is a checkout of tensorflow/mesh (the original). Its
# non-experimental *_test.py files (mesh_tensorflow/, mesh_tensorflow/
# transformer/, and mesh_tensorflow/auto_mtf/ when this package has
# mesh_tensorflow.auto_mtf) are copied to a scratch folder, removed at exit,
# and each runs as a script, as the original ran them: its
# `if __name__ == "__main__":` block (tf.disable_v2_behavior(), tf.test.main())
# applies. This checkout's mesh_tensorflow, and its transformer/ folder as
# mesh_tensorflow.transformer, are the ones imported, whatever is installed.
# NAME... keeps only the test files whose path contains one of the NAMEs.
#
# Prints passed/failed/errors/skipped per file, then totals, ending with a
# line "N passed, N failed" (errors counted as failed). --list-failures also
# names each failing test with the first line of its error, marking those
# listed, with their reason, in ORIGINAL_TESTS_EXPECTED_TO_FAIL
# (tests/original_api_departures.py). The exit status
# is 0 unless the runner itself breaks: this is a report, not a gate.
#
# PYTHON overrides the interpreter (default: this repository's
# .venv/bin/python); TIMEOUT the seconds allowed per file (default 1800).
set -u -o pipefail

usage() {
  echo "usage: $0 [--list-failures] SOURCE_TREE [NAME...]" >&2
  exit 2
}

list_failures=0
args=()
for arg in "$@"; do
  case "$arg" in
    --list-failures|-v|--verbose) list_failures=1 ;;
    -h|--help) usage ;;
    -*) echo "unknown option: $arg" >&2; usage ;;
    *) args+=("$arg") ;;
  esac
done
[ "${#args[@]}" -ge 1 ] || usage
source_tree="${args[0]}"
filters=("${args[@]:1}")

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
timeout_seconds="${TIMEOUT:-1800}"
if [ ! -x "$python" ] && ! command -v "$python" >/dev/null; then
  echo "no Python at $python (set PYTHON=/path/to/python)" >&2
  exit 2
fi
if [ ! -d "$source_tree/mesh_tensorflow" ]; then
  echo "$source_tree is not a checkout of tensorflow/mesh" \
       "(no mesh_tensorflow/ folder)" >&2
  exit 2
fi
source_tree="$(cd "$source_tree" && pwd)"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/original_tests.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
case "$scratch" in
  "$repo"/*) echo "scratch folder $scratch is inside the repository" >&2
             exit 2 ;;
esac

# The test files, with their folders (and any test data beside them).
dirs=(mesh_tensorflow mesh_tensorflow/transformer)
if [ -d "$repo/mesh_tensorflow/auto_mtf" ] ||
   [ -f "$repo/mesh_tensorflow/auto_mtf.py" ]; then
  dirs+=(mesh_tensorflow/auto_mtf)
fi
files=()
for dir in "${dirs[@]}"; do
  [ -d "$source_tree/$dir" ] || continue
  mkdir -p "$scratch/tests/$dir"
  for data in "$source_tree/$dir"/testdata "$source_tree/$dir"/test_data; do
    [ -d "$data" ] && cp -r "$data" "$scratch/tests/$dir/"
  done
  for path in "$source_tree/$dir"/*_test.py; do
    [ -f "$path" ] || continue
    rel="$dir/$(basename "$path")"
    if [ "${#filters[@]}" -gt 0 ]; then
      keep=0
      for f in "${filters[@]}"; do
        case "$rel" in *"$f"*) keep=1 ;; esac
      done
      [ "$keep" -eq 1 ] || continue
    fi
    cp "$path" "$scratch/tests/$rel"
    files+=("$rel")
  done
done
if [ "${#files[@]}" -eq 0 ]; then
  echo "no test files found under $source_tree" >&2
  exit 2
fi

# Runs one test file as __main__ with this checkout's package imported, and
# writes each test's outcome (one JSON object a line) to the file named by
# its third argument.
cat > "$scratch/run_one.py" <<'PYTHON'
"""Runs one of the original's test files as a script; records outcomes."""
import importlib.util
import json
import os
import runpy
import sys
import traceback
import unittest
import unittest.mock

repo, test_file, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
out = open(out_path, "w", buffering=1)  # A crash keeps earlier records.


def first_line(err):
  exc_type, value, _ = err
  text = str(value).strip().splitlines()
  return exc_type.__name__ + (": " + text[0] if text else "")


def record(test, outcome, detail=""):
  out.write(json.dumps({"test": str(test.id()), "outcome": outcome,
                        "detail": detail}) + "\n")


def wrap(name, outcome, detail_of):
  original = getattr(unittest.TestResult, name)

  def patched(self, test, *rest):
    record(test, outcome, detail_of(*rest))
    return original(self, test, *rest)
  setattr(unittest.TestResult, name, patched)


wrap("addSuccess", "passed", lambda: "")
wrap("addFailure", "failed", first_line)
wrap("addError", "error", first_line)
wrap("addSkip", "skipped", lambda reason: str(reason))
wrap("addExpectedFailure", "passed", lambda err: "")
wrap("addUnexpectedSuccess", "failed", lambda: "unexpected success")
original_add_subtest = unittest.TestResult.addSubTest


def add_subtest(self, test, subtest, err):
  if err is not None:
    failed = issubclass(err[0], test.failureException)
    record(subtest, "failed" if failed else "error", first_line(err))
  return original_add_subtest(self, test, subtest, err)
unittest.TestResult.addSubTest = add_subtest

# The original's tests import the `mock` backport; unittest.mock is the same.
if importlib.util.find_spec("mock") is None:
  sys.modules["mock"] = unittest.mock

# This checkout's package, and its transformer/ folder as
# mesh_tensorflow.transformer (an editable install may point elsewhere).
sys.path.insert(0, repo)
import mesh_tensorflow  # pylint: disable=g-import-not-at-top
package_dir = os.path.realpath(os.path.dirname(mesh_tensorflow.__file__))
if package_dir != os.path.realpath(os.path.join(repo, "mesh_tensorflow")):
  sys.exit("imported mesh_tensorflow from %s, not from %s"
           % (package_dir, repo))
transformer_dir = os.path.join(repo, "transformer")
if os.path.exists(os.path.join(transformer_dir, "__init__.py")):
  name = "mesh_tensorflow.transformer"
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(transformer_dir, "__init__.py"),
      submodule_search_locations=[transformer_dir])
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  mesh_tensorflow.transformer = module
  spec.loader.exec_module(module)

sys.argv = [test_file]
sys.path.insert(0, os.path.dirname(test_file))
status = 0
try:
  runpy.run_path(test_file, run_name="__main__")
except SystemExit as e:
  status = e.code
except BaseException as e:  # pylint: disable=broad-except
  traceback.print_exc()
  out.write(json.dumps({"test": "<module>", "outcome": "error",
                        "detail": first_line(sys.exc_info())}) + "\n")
  status = 1
out.close()
sys.exit(status)
PYTHON

# Summarises the records: one line per file, totals, failures if asked.
cat > "$scratch/summary.py" <<'PYTHON'
"""Prints per-file and total counts from the records of run_one.py."""
import importlib.util
import json
import os
import re
import sys

repo, list_failures = sys.argv[1], sys.argv[2] == "1"
expected = {}
departures = os.path.join(repo, "tests", "original_api_departures.py")
if os.path.exists(departures):
  spec = importlib.util.spec_from_file_location("departures", departures)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  expected = getattr(module, "ORIGINAL_TESTS_EXPECTED_TO_FAIL", {})


def key(file_name, test_id):
  """The key file::Class.method of test id __main__.Class.method [mode]."""
  test_id = re.sub(r"^__main__\.", "", test_id)
  return file_name + "::" + re.split(r"[ (\[]", test_id, maxsplit=1)[0]


totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
unlisted = 0
for spec in sys.argv[3:]:
  name, path, status = spec.split("|")
  counts = dict.fromkeys(totals, 0)
  bad = []
  try:
    with open(path) as f:
      records = [json.loads(line) for line in f if line.strip()]
  except OSError:
    records = []
  if not records or (status not in ("0", "1") and not any(
      r["outcome"] != "passed" for r in records)):
    why = ("timed out" if status == "124" else
           "exited with status %s before reporting" % status)
    records.append({"test": "<file>", "outcome": "error", "detail": why})
  for r in records:
    counts[r["outcome"]] += 1
    if r["outcome"] in ("failed", "error"):
      bad.append(r)
  for k in totals:
    totals[k] += counts[k]
  print("%-50s %3d passed, %3d failed, %3d errors, %3d skipped"
        % (name, counts["passed"], counts["failed"], counts["error"],
           counts["skipped"]))
  for r in bad:
    listed = key(name, r["test"]) in expected
    unlisted += not listed
    if list_failures:
      print("    %s %s%s: %s" % (r["outcome"].upper(), r["test"],
                                 " (listed)" if listed else "", r["detail"]))
print("total: %d passed, %d failed, %d errors, %d skipped"
      % (totals["passed"], totals["failed"], totals["error"],
         totals["skipped"]))
print("failures and errors not listed in ORIGINAL_TESTS_EXPECTED_TO_FAIL "
      "(tests/original_api_departures.py): %d" % unlisted)
print("errors (counted as failed below): %d" % totals["error"])
print("%d passed, %d failed"
      % (totals["passed"], totals["failed"] + totals["error"]))
PYTHON

specs=()
for rel in "${files[@]}"; do
  out="$scratch/${rel//\//__}.jsonl"
  log="$scratch/${rel//\//__}.log"
  (cd "$scratch/tests/$(dirname "$rel")" &&
   TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}" \
   PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" \
   timeout "$timeout_seconds" "$python" "$scratch/run_one.py" \
     "$repo" "$scratch/tests/$rel" "$out") >"$log" 2>&1
  specs+=("$rel|$out|$?")
done
"$python" "$scratch/summary.py" "$repo" "$list_failures" "${specs[@]}" || {
  echo "the runner could not summarise the results" >&2
  exit 2
}
exit 0
