"""The chief of a cluster test: trains the README's MLP across the cluster.

Usage: python -m tests.cluster.mlp_chief WORKER_HOSTS MODEL_DIR MAX_STEPS
           [MESH_IMPL [SHARDING]]
MESH_IMPL is "placement" (default: every task's devices, the chief's
included) or "simd" (SimdMeshImpl on the serving tasks' devices); SHARDING
is "none" (default), "update" or "parameters" (data-parallel sharding). Prints
"step N loss L" per step; exits 3 with the ClusterError's message on
stderr when a task cannot be reached or fails, and 1 (the watchdog's exit)
when a task stops answering.
"""

import sys

from mesh_tensorflow import cluster as cluster_lib
from tests.cluster import cluster_testing
from tests.cluster import mlp

# A frozen task is noticed after 3 unanswered checks (each waits 5 s).
WATCHDOG = dict(interval=1.0, timeout=5.0, misses=3)


def main(worker_hosts, model_dir, max_steps, mesh_impl="placement",
         sharding="none"):
  simd = mesh_impl == "simd"
  try:
    cluster = cluster_lib.connect(
        worker_hosts, task_index=0,
        num_cpus=None if simd else cluster_testing.CPUS_PER_TASK,
        startup_timeout=cluster_testing.STARTUP_TIMEOUT)
    est = mlp.make_estimator(model_dir, mesh_impl=mesh_impl,
                             devices=cluster.devices(8, include_chief=not simd),
                             sharding=sharding)
    with cluster.failures(**WATCHDOG):
      mlp.train(est, max_steps, echo=True)
  except cluster_lib.ClusterError as e:
    print(f"ClusterError: {e}", file=sys.stderr, flush=True)
    sys.exit(3)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
