"""One call for programs that run on every task of a cluster.

A training binary started with the same flags on every machine (only
`--task_index` differs) calls `start`: on the chief it connects and returns
the Cluster; on every other task it serves the devices and never returns.
"""

import math

import tensorflow as tf

from mesh_tensorflow.cluster import runtime
from mesh_tensorflow.cluster import spec as spec_lib


def cluster_spec_from(worker_hosts=None, task_index=0, tf_config=None):
  """The ClusterSpec of `worker_hosts` + `task_index`, else of TF_CONFIG
  (`tf_config` or the environment)."""
  if worker_hosts:
    return spec_lib.ClusterSpec.from_worker_hosts(worker_hosts, task_index)
  return spec_lib.ClusterSpec.from_tf_config(tf_config)


def cpus_per_task(num_processors, num_tasks):
  """Logical CPUs each task needs for a mesh spread evenly over the tasks
  (None when the machine has GPUs: they are the devices then)."""
  if tf.config.list_physical_devices("GPU"):
    return None
  return max(1, math.ceil(num_processors / num_tasks))


def start(worker_hosts=None, task_index=0, num_processors=None,
          num_cpus=None, startup_timeout=60.0, tf_config=None,
          serve_seconds=None):
  """Connects the chief (returns the Cluster) or serves (never returns).

  Args:
    worker_hosts: "host:port,host:port,..." (default: TF_CONFIG).
    task_index: this task's index in worker_hosts.
    num_processors: the mesh size; with no GPUs each task gets
      num_processors / num_tasks logical CPUs unless `num_cpus` says.
    num_cpus: logical CPUs per task.
    startup_timeout: seconds the chief waits for the other tasks.
    tf_config: a TF_CONFIG spec instead of the environment's.
    serve_seconds: a serving task exits after this long (default never).
  """
  cluster_spec = cluster_spec_from(worker_hosts, task_index, tf_config)
  if num_cpus is None and num_processors:
    num_cpus = cpus_per_task(num_processors, len(cluster_spec.tasks))
  if not cluster_spec.is_chief:
    runtime.serve(cluster_spec, num_cpus, serve_seconds)
  return runtime.Cluster(cluster_spec, num_cpus).connect(startup_timeout)
