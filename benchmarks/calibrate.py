"""Measures this machine's constants for the layout search; one JSON line.

Runs `mesh_tensorflow.auto_mtf.machine.calibrate` on a mesh of logical CPUs
(split before TensorFlow starts) and prints the constants it measured
(FLOP rate, element-wise byte rate, op overhead, concurrency, and latency
and seconds per wire byte per collective kind and mesh dimension) with the
calibration's own wall time. With --cache it goes through
`load_or_calibrate` instead (the cache in $MTF_AUTO_MTF_CACHE_DIR or
~/.cache/mesh_tensorflow/auto_mtf), so a second run measures nothing.

  python benchmarks/calibrate.py [--mesh 2,4] [--mesh_impl placement]
      [--devices 8] [--quick] [--cache] [--refresh] [--compare_mesh]

One calibration measures the devices for every mesh shape of them (each
collective per group size); --compare_mesh also measures the collectives on
the mesh itself and prints, per link, the derived figure over the measured
one (latency and seconds per wire byte for 1 MiB slices), which checks the
derivation on this machine.

--mesh takes sizes ("2,4": dimensions mesh_0, mesh_1) or a spec
("b:2;m:4"). The default run (mesh 2,4, placement) takes about 30 s on
2 cores.
"""

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.dirname(_HERE))

import bench_util  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--mesh", default="2,4",
                 help="mesh sizes (2,4) or an mtf shape spec (b:2;m:4)")
  p.add_argument("--mesh_impl", default="placement",
                 choices=("placement", "simd"))
  p.add_argument("--devices", type=int, default=8,
                 help="logical CPU devices to split the CPU into")
  p.add_argument("--quick", action="store_true",
                 help="fewer sizes and runs (a few seconds)")
  p.add_argument("--cache", action="store_true",
                 help="use (and fill) the on-disk cache")
  p.add_argument("--refresh", action="store_true",
                 help="with --cache: measure again")
  p.add_argument("--compare_mesh", action="store_true",
                 help="also measure the collectives on the mesh itself")
  return p.parse_args(argv)


def mesh_arg(text):
  """[2, 4] from "2,4"; a spec string unchanged."""
  parts = [s for s in text.replace(";", ",").split(",") if s]
  if all(s.strip().isdigit() for s in parts):
    return [int(s) for s in parts]
  return text


def main(argv=None):
  args = parse_args(argv)
  bench_util.configure_logical_cpus(args.devices)
  # Imported after the logical CPUs are set, before TF's runtime starts.
  from mesh_tensorflow.auto_mtf import machine  # pylint: disable=g-import-not-at-top
  mesh = mesh_arg(args.mesh)
  start = time.perf_counter()
  if args.cache:
    constants = machine.load_or_calibrate(mesh, mesh_impl=args.mesh_impl,
                                          refresh=args.refresh)
  else:
    constants = machine.calibrate(mesh, mesh_impl=args.mesh_impl,
                                  quick=args.quick)
  wall = time.perf_counter() - start
  comparison = None
  if args.compare_mesh:
    comparison = _compare_with_the_mesh(machine, constants, mesh, args)
  bench_util.emit({
      "benchmark": "calibrate",
      "mesh": machine.mesh_spec(mesh),
      "mesh_impl": args.mesh_impl,
      "quick": args.quick,
      "cached": args.cache,
      "wall_seconds": round(wall, 3),
      "constants": constants.to_dict(),
      "derived_over_measured_on_mesh": comparison,
  })


def _compare_with_the_mesh(machine, constants, mesh, args):
  """{kind/dims: derived seconds of a 1 MiB-slice call over the measured
  ones, and the mesh measurement's wall time}."""
  start = time.perf_counter()
  measured = machine.measure_mesh_collectives(
      mesh, mesh_impl=args.mesh_impl, quick=args.quick)
  ratios = {}
  for kind, dims, link in measured:
    derived = constants.link(kind, dims)
    wire = 1 << 20
    ratios[f"{kind}/{','.join(dims)}"] = round(
        derived.seconds(wire) / max(link.seconds(wire), 1e-12), 3)
  return {"ratios": ratios,
          "mesh_measurement_seconds": round(time.perf_counter() - start, 3)}


if __name__ == "__main__":
  main()
