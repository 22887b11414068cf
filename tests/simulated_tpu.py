"""TPU stand-ins for tests without a TPU.

`HostSimulatedTpuPrimitives` does the XLA TPU collectives with host
collectives among the devices of physical ids, refusing the dtypes a TPU op
would refuse. `stand_in_strategy` is a MirroredStrategy over logical CPUs:
like TPUStrategy it runs a step function once per replica and numbers the
replicas, so SimdMeshImpl's strategy path (`strategy.run`, processor
numbers from replica ids, per-core variables) runs as it would on TPU
cores. Unlike TPUStrategy it traces the function once per replica, so the
simulated collectives give the k-th collective of every replica's trace the
same instance key.
"""

import tensorflow as tf

from mesh_tensorflow.backend import simd_collectives
from mesh_tensorflow import tpu_variables

TPU_DTYPES = (tf.float32, tf.bfloat16, tf.int32)


def cpu_devices(count=8):
  return [d.name for d in tf.config.list_logical_devices("CPU")][:count]


def stand_in_strategy(num_replicas=8):
  """A MirroredStrategy with one replica per logical CPU."""
  return tf.distribute.MirroredStrategy(cpu_devices(num_replicas))


class _ReplicaAlignedHostCollectives(simd_collectives.HostCollectives):
  """Host collectives whose n-th collective in any replica's trace has the
  n-th instance key."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._counts = {}
    self._keys = []

  def _instance_key(self):
    replica = tpu_variables.current_replica_index() or 0
    n = self._counts.get(replica, 0)
    self._counts[replica] = n + 1
    while len(self._keys) <= n:
      self._keys.append(super()._instance_key())
    return self._keys[n]


class HostSimulatedTpuPrimitives:
  """The TPU primitives of a SimdMeshImpl with collectives="tpu", done on
  the devices of its physical ids (host dispatch or a stand-in strategy)."""

  def __init__(self, impl):
    l2p = tf.constant(impl.logical_to_physical, tf.int32)
    physical_devices = [None] * impl.size
    for logical, physical in enumerate(impl.logical_to_physical):
      physical_devices[physical] = impl.devices[logical]
    # One ordering token per device: the program's reads resolve to the
    # token of the device running it, as its variables do.
    token = impl.program_variable(
        "simulated_tpu_token",
        impl._token_variables())  # pylint: disable=protected-access
    self._size = impl.size
    self._host = _ReplicaAlignedHostCollectives(
        physical_devices, lambda: tf.gather(l2p, impl.pnum_tensor),
        lambda: token.handle, timeout_seconds=60)

  def _check(self, x, what):
    assert x.dtype in TPU_DTYPES, f"{what} got {x.dtype.name}"

  def cross_replica_sum(self, x, group_assignment):
    self._check(x, "cross_replica_sum")
    return self._host.all_reduce(x, group_assignment, "SUM")

  def all_to_all(self, x, concat_dimension, split_dimension, split_count,
                 group_assignment):
    self._check(x, "all_to_all")
    assert concat_dimension == 0 and split_dimension == 0
    assert split_count == len(group_assignment[0])
    return self._host.all_to_all(x, group_assignment)

  def reduce_scatter(self, x, scatter_dimension, group_assignment,
                     reduce_op):
    self._check(x, "reduce_scatter")
    assert scatter_dimension == 0
    reduction = {"Add": "SUM", "Max": "MAX", "Min": "MIN"}[reduce_op]
    return self._host.reduce_scatter(x, group_assignment, reduction)

  def collective_permute(self, x, source_target_pairs):
    self._check(x, "collective_permute")
    return self._host.permute(x, source_target_pairs,
                              [list(range(self._size))])


def install(impl):
  """Makes `impl` (collectives="tpu") run its collectives on the host."""
  impl.collectives._primitives = HostSimulatedTpuPrimitives(impl)  # pylint: disable=protected-access
  return impl
