r"""Measures this machine's constants for auto_mtf's time objective.

    python -m mesh_tensorflow.auto_mtf.calibration --mesh_shape 'b:2;m:4' \
        [--mesh_impl placement] [--logical_cpus 8] [--quick] [--refresh] \
        [--cache_dir DIR]

Splits the CPU into --logical_cpus logical devices (as the Transformer
binary does for a mesh on a machine without GPUs), measures the constants
of the mesh (`machine.load_or_calibrate`, about a minute on 2 cores) and
caches them where the layout search looks ($MTF_AUTO_MTF_CACHE_DIR, else
~/.cache/mesh_tensorflow/auto_mtf), so that the search finds them. A
program in tf.compat.v1 graph mode, which cannot time programs itself, runs
this command in a child process (module calibration_subprocess). Errors end
with one line "error: ..." on stderr and exit status 1.
"""

import argparse
import json
import sys

import tensorflow as tf

from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow.auto_mtf import machine


def parse_args(argv):
  p = argparse.ArgumentParser(
      prog="python -m mesh_tensorflow.auto_mtf.calibration",
      description=__doc__.split("\n")[0])
  p.add_argument("--mesh_shape", required=True,
                 help="the mesh: a spec (b:2;m:4) or sizes (2,4)")
  p.add_argument("--mesh_impl", default="placement",
                 choices=machine.MESH_IMPLS)
  p.add_argument("--logical_cpus", type=int, default=None,
                 help="logical CPU devices to split the CPU into (default: "
                 "the mesh's processor count when there is no GPU)")
  p.add_argument("--devices", default=None,
                 help="comma-separated devices, one per processor (default: "
                 "the mesh implementation's)")
  p.add_argument("--cache_dir", default=None,
                 help="where the constants are cached (default: "
                 f"${machine.CACHE_DIR_ENV} or "
                 "~/.cache/mesh_tensorflow/auto_mtf)")
  p.add_argument("--quick", action="store_true",
                 help="fewer sizes and runs (seconds; rougher figures)")
  p.add_argument("--refresh", action="store_true",
                 help="measure again even if cached")
  p.add_argument("--output", default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def mesh_shape_arg(text):
  """[2, 4] from "2,4"; a spec string unchanged."""
  parts = [s for s in text.replace(";", ",").split(",") if s.strip()]
  if parts and all(s.strip().isdigit() for s in parts):
    return [int(s) for s in parts]
  return text


def split_cpu(num_devices):
  """Splits the CPU into num_devices logical devices (before TensorFlow's
  runtime starts; called from Python, main accepts a runtime that has
  them already).

  Raises:
    ValueError: the runtime started with another number of logical CPUs.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  except RuntimeError:
    have = len(tf.config.list_logical_devices("CPU"))
    if have != num_devices:
      raise ValueError(
          f"TensorFlow already started with {have} logical CPU(s), not the "
          f"{num_devices} asked for; run the command in a fresh process."
          ) from None


def check_devices(devices):
  """Raises ValueError naming a device this process does not have."""
  have = {tf.DeviceSpec.from_string(d.name).replace(job=None, replica=None,
                                                    task=None).to_string()
          for d in tf.config.list_logical_devices()}
  for device in devices:
    spec = tf.DeviceSpec.from_string(device)
    local = spec.replace(job=None, replica=None, task=None).to_string()
    if spec.job not in (None, "localhost") or local not in have:
      raise ValueError(
          f"device {device!r} is not a device of the calibration process "
          f"(it has {sorted(have)}); give --logical_cpus or --devices to "
          "match the program's devices.")


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    mesh_shape = machine.mesh_shape_of(mesh_shape_arg(args.mesh_shape))
    logical_cpus = args.logical_cpus
    if logical_cpus is None and not tf.config.list_physical_devices("GPU"):
      logical_cpus = mesh_shape.size
    if logical_cpus:
      split_cpu(logical_cpus)
    devices = args.devices.split(",") if args.devices else None
    if devices is not None:
      check_devices(devices)
    if not tf.executing_eagerly():
      raise RuntimeError("the calibration command runs programs eagerly, "
                         "but TensorFlow's v2 behaviour is off in it.")
    if devices is None:
      devices = placement_mesh_impl.default_devices(mesh_shape.size)
    cached = None if args.refresh else machine.load_cached(
        mesh_shape, devices, args.mesh_impl, args.cache_dir, args.quick)
    if cached is None:
      constants = machine.load_or_calibrate(
          mesh_shape, devices=devices, mesh_impl=args.mesh_impl,
          cache_dir=args.cache_dir, refresh=True, quick=args.quick)
      key = machine.cache_key(mesh_shape, devices, args.mesh_impl,
                              args.quick)
    else:
      constants, key = cached
    path = machine.cache_path(mesh_shape, devices, args.mesh_impl,
                              args.cache_dir, key.get("quick", False))
  except Exception as e:  # pylint: disable=broad-except
    # One line: a parent process quotes it in its own error, whose fix
    # (this command) a CalibrationError's message would repeat.
    text = e.reason if isinstance(e, machine.CalibrationError) else (
        f"{type(e).__name__}: {e}")
    sys.stderr.write(f"error: {' '.join(text.split())}\n")
    return 1
  if args.output:
    with open(args.output, "w") as f:
      json.dump({"key": key, "constants": constants.to_dict()}, f)
  print(f"auto_mtf: machine constants of mesh {machine.mesh_spec(mesh_shape)}"
        f" ({args.mesh_impl} on {key['devices']}, {constants.source}) "
        f"cached in {path}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
