"""reduce_scatter between tasks: the rename of a pending sum, lowered onto
SimdMeshImpl over two serving tasks (TF collective ops between processes),
gives NumPy's value with one reduce_scatter and no allreduce.
PlacementMeshImpl's reduce_scatter moves tensors between devices as its
other collectives do (tests.cluster.reduce_scatter_chief runs it too)."""

import json

import numpy as np

from tests.cluster import cluster_testing
from tests.cluster import reduce_scatter_chief


def test_simd_reduce_scatter_across_tasks():
  with cluster_testing.LocalCluster(3) as cluster:
    cluster.start_servers()
    rc, out, err = cluster.run_chief("tests.cluster.reduce_scatter_chief",
                                     "simd")
  assert rc == 0, err[-3000:]
  result = json.loads(out.strip().splitlines()[-1])
  x, y = reduce_scatter_chief.inputs()
  np.testing.assert_allclose(result["value"], x.T @ y, rtol=1e-5,
                             atol=1e-6)
  assert result["calls"]["comm/reduce_scatter/b/calls"] == 1
  assert result["calls"]["comm/allconcat/b/calls"] == 1
  assert not [k for k in result["calls"] if "allreduce" in k], result
