"""SimdMeshImpl across processes: a chief driving two serving tasks (4 CPUs
each) trains the README's MLP with TF collective ops between the tasks, to
the same losses as PlacementMeshImpl on one process."""

import numpy as np

from tests.cluster import cluster_testing
from tests.cluster import mlp

STEPS = 5


def test_simd_across_two_serving_tasks_matches_one_process(tmp_path):
  local = mlp.train(mlp.make_estimator(tmp_path / "local"), STEPS)
  with cluster_testing.LocalCluster(3) as cluster:
    cluster.start_servers()
    rc, out, err = cluster.run_chief("tests.cluster.mlp_chief",
                                     tmp_path / "simd", STEPS, "simd")
  assert rc == 0, err[-3000:]
  on_cluster = cluster_testing.losses(out)
  assert sorted(on_cluster) == sorted(local)
  np.testing.assert_allclose([on_cluster[s] for s in sorted(local)],
                             [local[s] for s in sorted(local)], rtol=1e-5)
