"""Enough local devices for a mesh: logical CPUs on a machine without GPUs.

Also the processor count of mesh_shape "auto" (processor_count).

A PlacementMeshImpl puts each processor on its own device. On a machine
without accelerators the binary splits the host CPU into as many logical
devices as the mesh has processors, before TensorFlow initializes its
devices (afterwards it cannot change them).
"""

from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow.estimator import tpu_cluster


def ensure_local_devices(num_processors, mesh_devices=None):
  """Splits the CPU into num_processors logical devices when there are no
  GPUs and no explicit mesh_devices; a no-op when enough exist.

  Raises:
    ValueError: if TensorFlow's devices are already initialized with fewer
      logical CPUs than the mesh needs (split them before any TF work, or
      list mesh_devices).
  """
  if mesh_devices and any(mesh_devices):
    return
  if tf.config.list_physical_devices("GPU"):
    return
  cpus = tf.config.list_physical_devices("CPU")
  configured = tf.config.get_logical_device_configuration(cpus[0])
  if configured and len(configured) >= num_processors:
    return
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_processors)
    logging.info("Split the CPU into %d logical devices for the mesh.",
                 num_processors)
  except RuntimeError:
    have = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(have) >= num_processors:
      return
    raise ValueError(
        f"The mesh has {num_processors} processors but TensorFlow already "
        f"started with {len(have)} CPU device(s) ({', '.join(have)}) and "
        "cannot add more. Start the "
        "program with the mesh's processor count of logical CPUs (the binary "
        "does this before TensorFlow starts), or give utils.run.mesh_devices."
        ) from None


def processor_count(mesh_devices=None, tpu_cluster_resolver=None):
  """The processors a mesh of shape "auto" gets: one per listed mesh
  device, else per core of the TPU cluster, else per local GPU, else per
  logical CPU device (one unless the CPU is already split: on a machine
  without accelerators give an explicit mesh shape or mesh_devices to use
  more).
  """
  if mesh_devices and any(mesh_devices):
    return len(mesh_devices)
  if tpu_cluster_resolver is not None:
    topology = tpu_cluster.initialize(tpu_cluster_resolver)
    return int(np.prod([int(n) for n in topology.mesh_shape]))
  gpus = tf.config.list_logical_devices("GPU")
  if gpus:
    return len(gpus)
  return len(tf.config.list_logical_devices("CPU"))
