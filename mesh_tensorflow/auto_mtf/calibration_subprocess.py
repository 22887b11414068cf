"""Calibration in a fresh Python process, for programs that cannot run it.

`machine.calibrate` times programs eagerly. A program in tf.compat.v1
graph mode (one that called tf.compat.v1.disable_v2_behavior(), or the
Transformer binary in a TF1-style program) cannot run them, so
`machine.load_or_calibrate` runs the calibration command (module
`calibration`) in a child process instead, with this process's logical
CPU count and devices: the child measures what this process's mesh would
run on, and fills the same cache.

This module only starts the child; it imports nothing of the package, so
that `machine` can use it and `calibration` can use `machine`.
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile

COMMAND_MODULE = "mesh_tensorflow.auto_mtf.calibration"
# A full calibration takes about a minute on 2 cores: far more means hung
# collectives, not a slow machine.
TIMEOUT_SECONDS = 3600.0
# The folder holding the package `mesh_tensorflow` this process imported:
# the child imports the same one.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class CalibrationError(RuntimeError):
  """Measuring the machine's constants failed, or cannot run here.

  Attributes:
    reason: what failed (one line).
    command: a shell command that measures the constants and caches them.
  """

  def __init__(self, reason, command):
    self.reason = " ".join(str(reason).split()).rstrip(".")
    self.command = command
    super().__init__(
        f"auto_mtf: the time objective needs this machine's constants, and "
        f"measuring them failed: {self.reason}. To fix it, run `{command}` (it "
        "measures them once and caches them), or use objective='memory', or "
        "give the machine's constants (machine=..., see "
        "auto_mtf.machine.machine_constants).")


def command_args(mesh_spec, mesh_impl, logical_cpus, cache_dir, quick=False,
                 refresh=False, devices=None):
  """The calibration command's arguments (after `python -m module`)."""
  args = ["--mesh_shape", mesh_spec, "--mesh_impl", mesh_impl,
          "--logical_cpus", str(logical_cpus),
          "--cache_dir", os.path.abspath(cache_dir)]
  if devices is not None:
    args += ["--devices", ",".join(devices)]
  if quick:
    args.append("--quick")
  if refresh:
    args.append("--refresh")
  return args


def shell_command(args):
  """The command line a user runs to measure and cache the constants."""
  words = ["python", "-m", COMMAND_MODULE] + list(args)
  return " ".join(shlex.quote(w) for w in words)


def run(args, devices, expected_keys, timeout=None):
  """Runs the calibration command in a child process.

  Args:
    args: command_args(...).
    devices: this process's devices, one per processor.
    expected_keys: the cache keys (machine.cache_key) a measurement of this
      process's devices may have; the child's must be one of them.
    timeout: seconds before giving up (default TIMEOUT_SECONDS).

  Returns:
    the measured MachineConstants as a dict (the child cached them).

  Raises:
    CalibrationError: the devices are other tasks' (a child cannot reach
      them), or the child failed, hung, could not start or measured other
      devices; the reason is the child's own error line, never its
      traceback.
  """
  command = shell_command(args)
  remote = [d for d in devices if _job(d) not in (None, "localhost")]
  if remote:
    raise CalibrationError(
        f"devices of other tasks ({remote[0]}, ...) cannot be measured from "
        "a program in tf.compat.v1 graph mode; measure them from a program "
        "with TensorFlow's v2 behaviour on (machine.load_or_calibrate with "
        "these devices)", command)
  timeout = TIMEOUT_SECONDS if timeout is None else timeout
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
  with tempfile.TemporaryDirectory(prefix="mtf_calibration_") as directory:
    output = os.path.join(directory, "result.json")
    try:
      # Run from the package's folder: `-m` puts the working directory
      # first on sys.path, where another checkout could hide this one.
      result = subprocess.run(
          [sys.executable, "-m", COMMAND_MODULE] + list(args) +
          ["--output", output], cwd=_PACKAGE_ROOT, env=env,
          capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
      raise CalibrationError(
          f"the calibration process did not finish within {timeout:g} s",
          command) from None
    except OSError as e:
      raise CalibrationError(
          f"could not start the calibration process ({e})", command) from None
    if result.returncode != 0:
      raise CalibrationError(
          f"the calibration process ({sys.executable} -m {COMMAND_MODULE}) "
          f"exited with status {result.returncode}: "
          f"{error_line(result.stderr)}", command)
    try:
      with open(output) as f:
        measured = json.load(f)
      key, constants = measured["key"], measured["constants"]
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise CalibrationError(
          f"the calibration process wrote no result ({e})", command) from None
  if key not in expected_keys:
    raise CalibrationError(
        f"the calibration process measured another machine than this "
        f"process's ({key} instead of {expected_keys[-1]})", command)
  return constants


def _job(device):
  """The job named in a device string, or None."""
  for part in device.split("/"):
    if part.startswith("job:"):
      return part[len("job:"):]
  return None


def error_line(stderr):
  """The child's own error line ("error: ..."), else the last line of its
  output (a traceback's last line is its exception)."""
  lines = [l.strip() for l in (stderr or "").splitlines() if l.strip()]
  for line in reversed(lines):
    if line.startswith("error: "):
      return line[len("error: "):]
  return lines[-1] if lines else "no output"
