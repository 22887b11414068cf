"""Runs the binaries on a table of command lines (a subprocess of a test).

Usage: python -m tests.transformer.config_errors_worker CASES RESULTS

CASES is a JSON list of [module, argv] pairs: `module` one of the binaries
(mesh_tensorflow.transformer.main, mesh_tensorflow.bert.run_pretraining,
...), argv its arguments. RESULTS gets a JSON list of [exit status,
output] pairs, one per case.

Importing TensorFlow costs seconds of CPU, so this process imports it, Mesh
TensorFlow and the Transformer package once, then runs each case in a child
forked from it, two at a time. The child imports the binary's module (which
defines that binary's flags, with its own defaults) and calls what
`python -m <module>` calls, with the case's argv; its stdout and stderr go
to one file. An exception escaping the entry point is printed as Python
prints it, exit status 1. This process starts no TensorFlow runtime (no
devices, no eager context) before it forks: a child that needs one starts
its own.
"""

import importlib
import json
import os
import sys
import tempfile
import traceback

import tensorflow as tf  # pylint: disable=unused-import

# pylint: disable=g-import-not-at-top,wrong-import-position
from tests import this_checkout

this_checkout.import_transformer()
import mesh_tensorflow  # pylint: disable=unused-import
from mesh_tensorflow.bert import run_common
from mesh_tensorflow.transformer import utils  # pylint: disable=unused-import

_PARALLEL = 2


def _entry_point(module_name):
  """What `python -m module_name` runs, as a function."""
  module = importlib.import_module(module_name)
  if hasattr(module, "console_entry_point"):
    return module.console_entry_point
  return lambda: run_common.run(module.main)


def _exit_status(code):
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def _child(module_name, argv, output):
  """Runs one case in this (forked) process; never returns."""
  status = 1
  try:
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = [module_name] + list(argv)
    try:
      _entry_point(module_name)()
      status = 0
    except SystemExit as e:
      status = _exit_status(e.code)
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(status)  # pylint: disable=protected-access


def run_cases(cases, work_dir):
  """[exit status, output] of each (module, argv) case."""
  outputs = [os.path.join(work_dir, f"case_{i}.txt")
             for i in range(len(cases))]
  statuses = [None] * len(cases)
  running = {}
  pending = list(range(len(cases)))
  while pending or running:
    while pending and len(running) < _PARALLEL:
      i = pending.pop(0)
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        _child(cases[i][0], cases[i][1], outputs[i])
      running[pid] = i
    pid, wait_status = os.wait()
    statuses[running.pop(pid)] = os.waitstatus_to_exitcode(wait_status)
  results = []
  for status, output in zip(statuses, outputs):
    with open(output, errors="replace") as f:
      results.append([status, f.read()])
  return results


def main(cases_path, results_path):
  with open(cases_path) as f:
    cases = json.load(f)
  with tempfile.TemporaryDirectory() as work_dir:
    results = run_cases(cases, work_dir)
  with open(results_path, "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
