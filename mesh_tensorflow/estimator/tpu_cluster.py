"""Connecting an estimator to Cloud TPU cores: the TPUStrategy of a mesh.

A mesh of N processors runs on a TPU slice of N cores, one replica per
core. The strategy's device assignment puts replica p on physical processor
p as `mtf.backend.tpu_topology` numbers them (`topology_coordinates`), so the
`logical_to_physical` map of `auto_logical_to_physical_tpu` means what it
says whatever order TensorFlow would choose by default. The TPU system is
initialized once per cluster and process: initializing it again would wipe
the variables already on the cores.
"""

import threading

import numpy as np
import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow.backend import tpu_topology

_LOCK = threading.Lock()
_TOPOLOGIES = {}  # cluster master -> topology


def _cluster_key(cluster):
  master = getattr(cluster, "master", None)
  return master() if callable(master) else id(cluster)


def initialize(cluster):
  """Connects to `cluster` and initializes its TPU system (once); returns
  the topology."""
  key = _cluster_key(cluster)
  with _LOCK:
    if key not in _TOPOLOGIES:
      tf.config.experimental_connect_to_cluster(cluster)
      _TOPOLOGIES[key] = tf.tpu.experimental.initialize_tpu_system(cluster)
    return _TOPOLOGIES[key]


def connect(cluster, mesh_shape):
  """(TPUStrategy, logical_to_physical) for `mesh_shape` on `cluster`.

  Args:
    cluster: a tf.distribute.cluster_resolver.TPUClusterResolver.
    mesh_shape: an mtf.Shape with one processor per TPU core.

  Raises:
    mtf.LayoutError: if the mesh and the TPU slice differ in size.
  """
  topology = initialize(cluster)
  physical_shape = [int(n) for n in topology.mesh_shape]
  num_cores = int(np.prod(physical_shape))
  if mesh_shape.size != num_cores:
    raise errors.LayoutError(
        f"Mesh {mesh_shape.to_string} has {mesh_shape.size} processors but "
        f"the TPU slice has {num_cores} cores (topology {physical_shape}): "
        "use a mesh with one processor per core.")
  coordinates = np.array(tpu_topology.topology_coordinates(physical_shape),
                         np.int32).reshape([num_cores, 1, 4])
  device_assignment = tf.tpu.experimental.DeviceAssignment(
      topology, coordinates)
  strategy = tf.distribute.TPUStrategy(
      cluster, experimental_device_assignment=device_assignment)
  logical_to_physical = tpu_topology.auto_logical_to_physical_tpu(
      mesh_shape.to_integer_list, physical_shape)
  return strategy, logical_to_physical
