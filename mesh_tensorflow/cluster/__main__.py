"""Serves one task of a cluster: `python -m mesh_tensorflow.cluster ...`.

    python -m mesh_tensorflow.cluster --worker_hosts=host0:2222,host1:2222 \\
        --task_index=1 [--num_cpus=4] [--serve_seconds=3600]

Without --worker_hosts the cluster comes from the TF_CONFIG environment
variable. The task serves its devices to the chief until it is killed (or
for --serve_seconds).

The task listens on every network interface, whatever host its address
names (TensorFlow 2.21 cannot bind its gRPC server to one address), and
runs any graph sent to it without authentication: it warns at start-up
when the port is reachable beyond loopback. Private networks only (see
README.md, "Security").
"""

import argparse
import os

from mesh_tensorflow.cluster import runtime
from mesh_tensorflow.cluster import spec

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _parser():
  parser = argparse.ArgumentParser(
      prog="python -m mesh_tensorflow.cluster",
      description="Serve one task of a TensorFlow cluster. Private "
      "networks only: the task listens on every interface and runs any "
      "graph sent to it, unauthenticated (README.md, Security).")
  parser.add_argument("--worker_hosts", default="",
                      help="comma-separated host:port of every task "
                      "(default: TF_CONFIG)")
  parser.add_argument("--task_index", type=int, default=0,
                      help="this task's index in --worker_hosts")
  parser.add_argument("--num_cpus", type=int, default=None,
                      help="logical CPU devices of this task")
  parser.add_argument("--serve_seconds", type=float, default=None,
                      help="exit after this many seconds (default: never)")
  return parser


def main(argv=None):
  parser = _parser()
  args = parser.parse_args(argv)
  try:
    if args.worker_hosts:
      cluster_spec = spec.ClusterSpec.from_worker_hosts(args.worker_hosts,
                                                        args.task_index)
    else:
      cluster_spec = spec.ClusterSpec.from_tf_config()
  except spec.ClusterSpecError as e:
    parser.error(str(e))  # exits with status 2
  runtime.serve(cluster_spec, args.num_cpus, args.serve_seconds)


if __name__ == "__main__":
  main()
