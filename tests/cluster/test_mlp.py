"""The README's MLP trained across a 2-task cluster (4 CPUs each) matches
one process on 8 logical CPUs, step by step (also with sharded
parameters), and checkpoints move both ways between the two. The serving task reads its cluster from TF_CONFIG."""

import shutil

import numpy as np

from tests.cluster import cluster_testing
from tests.cluster import mlp

STEPS = 10  # a checkpoint every 5 steps


def _assert_same_variables(a, b):
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_cluster_matches_one_process_and_checkpoints_move_both_ways(
    tmp_path):
  # One process, 8 logical CPUs: STEPS steps, then STEPS more.
  local_dir = tmp_path / "local"
  local = mlp.train(mlp.make_estimator(local_dir), STEPS)
  halfway_dir = tmp_path / "local_halfway"
  shutil.copytree(local_dir, halfway_dir)
  local.update(mlp.train(mlp.make_estimator(local_dir), 2 * STEPS))
  assert sorted(local) == list(range(1, 2 * STEPS + 1))

  cluster_dir = tmp_path / "cluster"
  with cluster_testing.LocalCluster(2) as cluster:
    cluster.start_server(1, tf_config=True)
    # From scratch on the cluster: the same losses.
    rc, out, err = cluster.run_chief("tests.cluster.mlp_chief", cluster_dir,
                                     STEPS)
    assert rc == 0, err[-3000:]
    on_cluster = cluster_testing.losses(out)
    assert sorted(on_cluster) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([on_cluster[s] for s in range(1, STEPS + 1)],
                               [local[s] for s in range(1, STEPS + 1)],
                               rtol=1e-5)
    # Sharded parameters (and so sharded updates) across the cluster: the
    # same losses.
    rc, out, err = cluster.run_chief("tests.cluster.mlp_chief",
                                     tmp_path / "sharded", STEPS,
                                     "placement", "parameters")
    assert rc == 0, err[-3000:]
    sharded = cluster_testing.losses(out)
    np.testing.assert_allclose([sharded[s] for s in range(1, STEPS + 1)],
                               [local[s] for s in range(1, STEPS + 1)],
                               rtol=1e-5)
    # The cluster resumes from the one-process checkpoint of step STEPS.
    rc, out, err = cluster.run_chief("tests.cluster.mlp_chief", halfway_dir,
                                     2 * STEPS)
    assert rc == 0, err[-3000:]
    resumed = cluster_testing.losses(out)
    assert sorted(resumed) == list(range(STEPS + 1, 2 * STEPS + 1))
    np.testing.assert_allclose(
        [resumed[s] for s in sorted(resumed)],
        [local[s] for s in sorted(resumed)], rtol=1e-5)
    _assert_same_variables(mlp.variables(halfway_dir),
                           mlp.variables(local_dir))

  # The cluster's checkpoint holds what one process holds at that step...
  _assert_same_variables(mlp.variables(cluster_dir),
                         mlp.variables(local_dir, STEPS))
  # ... and one process resumes from it to the same end.
  resumed = mlp.train(mlp.make_estimator(cluster_dir), 2 * STEPS)
  np.testing.assert_allclose([resumed[s] for s in sorted(resumed)],
                             [local[s] for s in sorted(resumed)], rtol=1e-5)
  _assert_same_variables(mlp.variables(cluster_dir), mlp.variables(local_dir))
