"""Benchmark: peak host memory of saving and restoring a checkpoint.

`--variables` model-parallel variables of [rows, cols] float32 are split
over 8 logical CPUs (layout "cols:all") and checkpointed with
`tf.train.Checkpoint(model=mesh_impl)`; for comparison, plain TF variables
of the same sizes on one device are checkpointed the same way in the same
process. Each case runs in a fresh process; the figure is the growth of the
peak resident set (VmHWM, reset just before the operation) during the save
or the restore, in MB and as a fraction of the model size. Prints one JSON
line.

  python benchmarks/checkpoint_memory.py [--variables 8 --rows 4096 --cols 2048]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CASES = ("mtf_save", "mtf_restore", "tf_save", "tf_restore")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--variables", type=int, default=8)
  p.add_argument("--rows", type=int, default=4096)
  p.add_argument("--cols", type=int, default=2048)
  p.add_argument("--child", choices=CASES, default=None,
                 help=argparse.SUPPRESS)
  p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def run_child(args):
  """Creates the variables, then measures one save or restore."""
  sys.path.insert(0, os.path.dirname(__file__))
  import bench_util  # pylint: disable=g-import-not-at-top
  bench_util.configure_logical_cpus(8)
  import gc  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  shape = [args.rows, args.cols]
  path = os.path.join(args.dir, args.child.split("_")[0] + "_ckpt")
  if args.child.startswith("mtf"):
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "cols:all")
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    for i in range(args.variables):
      mtf.get_variable(mesh, f"w{i}", [("rows", shape[0]),
                                        ("cols", shape[1])],
                       initializer=tf.random_normal_initializer(seed=i))
    mtf.Lowering(graph, {mesh: impl})
    checkpoint = tf.train.Checkpoint(model=impl)
  else:
    with tf.device("/cpu:0"):
      variables = [tf.Variable(tf.random.normal(shape, seed=i))
                   for i in range(args.variables)]
    checkpoint = tf.train.Checkpoint(model=variables)
  if args.child.endswith("restore"):
    path = checkpoint.save(path)
  gc.collect()
  before = bench_util.status_mb("VmRSS")
  bench_util.reset_peak_rss()
  if args.child.endswith("save"):
    checkpoint.save(path)
  else:
    checkpoint.restore(path).assert_consumed()
  peak = bench_util.status_mb("VmHWM")
  print(json.dumps({"peak_growth_mb": peak - before}))


def main():
  args = parse_args()
  if args.child:
    run_child(args)
    return
  model_mb = args.variables * args.rows * args.cols * 4 / 2**20
  result = {"benchmark": "checkpoint_memory", "mesh": "all:8",
            "layout": "cols:all", "model_mb": model_mb}
  with tempfile.TemporaryDirectory() as tmp:
    for case in CASES:
      out = subprocess.run(
          [sys.executable, __file__, "--child", case, "--dir", tmp,
           "--variables", str(args.variables), "--rows", str(args.rows),
           "--cols", str(args.cols)],
          check=True, capture_output=True, text=True).stdout
      growth = json.loads(out.strip().splitlines()[-1])["peak_growth_mb"]
      result[case] = {"peak_growth_mb": round(growth, 1),
                      "fraction_of_model": round(growth / model_mb, 3)}
      print(case, result[case], file=sys.stderr, flush=True)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
