"""Starting, joining and using a TensorFlow cluster of several processes.

Every task runs a TensorFlow gRPC server (`tf.distribute.Server`). The chief
(see spec.py) runs the training program: `Cluster.connect` starts the
chief's own server in-process (`tf.config.experimental_connect_to_cluster`),
after checking that every other task answers, and from then on the devices
of every task ("/job:worker/replica:0/task:1/device:CPU:0") are placement
targets of this process. The other tasks only serve (`serve`, or
`python -m mesh_tensorflow.cluster ...`) until they are killed.

Facts of TensorFlow 2.21 this module works around:
- `experimental_connect_to_cluster` returns at once even when a task is not
  listening; the first op that needs that task (even listing devices) then
  waits forever. So `connect` first opens a TCP connection to every task,
  retrying until `startup_timeout`, and names the first address that never
  answered.
- A task that dies (its process killed, its connection closed) makes the
  chief's next step fail at once with `UnavailableError`; `failures()`
  turns that into a ClusterError naming the task and its address. A task
  frozen with its socket open (SIGSTOP) is not detected by TensorFlow: the
  step waits, and `operation_timeout_in_ms` does not apply to remote eager
  ops; `failures()` runs a watchdog (watchdog.py) for that.
- Logical CPUs of a serving task come from `ConfigProto(device_count=...)`
  given to its server; those of the chief from
  `tf.config.set_logical_device_configuration`, which must run before
  TensorFlow's runtime starts.
- Collective ops (SimdMeshImpl's) between tasks need a collective group
  leader named in every server's config
  (`experimental.collective_group_leader`) and in the chief's
  (`configure_collective_ops` before connecting); then they work between
  the serving tasks, whose devices the chief drives remotely. Collectives
  that include the chief's own (in-process server's) devices do not: they
  fail with "unknown device" or time out waiting for the other workers. So
  `simd_mesh_impl` runs on the serving tasks only, the first of which leads
  the groups, and the chief is the client.
- Every task's server, the chief's too, listens on every network interface,
  whatever host its address names, and runs any graph sent to it without
  authentication; no option binds it to one address. Each task warns at
  start-up when its socket is reachable beyond loopback (exposure.py).
"""

import contextlib
import os
import re
import socket
import sys
import time

from absl import logging
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.cluster import errors
from mesh_tensorflow.cluster import exposure
from mesh_tensorflow.cluster import spec as spec_lib
from mesh_tensorflow.cluster import watchdog as watchdog_lib

# Defined with the package's other errors; public here, where it was first.
ClusterError = errors.ClusterError

_TASK_IN_MESSAGE = re.compile(r"/job:([\w-]+)/replica:\d+/task:(\d+)")
# Errors by which TF reports a task it cannot talk to any more.
_TASK_FAILURES = (tf.errors.UnavailableError, tf.errors.AbortedError,
                  tf.errors.DeadlineExceededError, tf.errors.CancelledError)


def collective_leader(cluster_spec):
  """The task that leads collective groups: the first serving task (the
  chief when it is alone)."""
  tasks = cluster_spec.tasks
  task = tasks[1] if len(tasks) > 1 else tasks[0]
  return f"/job:{task.job}/replica:0/task:{task.index}"


def server_config(num_cpus=None, leader=None):
  """The ConfigProto of a serving task: `num_cpus` logical CPUs (None: TF's
  default, one) and the collective group leader `leader`."""
  config = tf.compat.v1.ConfigProto()
  if num_cpus:
    config.device_count["CPU"] = int(num_cpus)
  if leader:
    config.experimental.collective_group_leader = leader
  return config


def start_server(cluster_spec, num_cpus=None):
  """Starts this task's `tf.distribute.Server` (for tasks that only serve).

  It listens on every interface whatever the task's host (TensorFlow cannot
  bind it to one address); a warning says so when it is reachable beyond
  loopback (see exposure.py).
  """
  server = tf.distribute.Server(
      cluster_spec.as_cluster_def(), job_name=cluster_spec.job_name,
      task_index=cluster_spec.task_index,
      config=server_config(num_cpus, collective_leader(cluster_spec)),
      start=True)
  exposure.warn_if_exposed(cluster_spec.task)
  return server


def serve(cluster_spec, num_cpus=None, serve_seconds=None):
  """Serves this task's devices until killed, or for `serve_seconds`.

  Then the process exits (os._exit: a running server does not shut down
  cleanly in TF 2.21).
  """
  start_server(cluster_spec, num_cpus)
  task = cluster_spec.task
  print(f"Serving {task.name} at {task.address}"
        f"{f' with {num_cpus} CPUs' if num_cpus else ''}", flush=True)
  if serve_seconds is None:
    while True:
      time.sleep(3600)
  time.sleep(float(serve_seconds))
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)  # pylint: disable=protected-access


def configure_local_cpus(num_cpus):
  """Splits this process's CPU into `num_cpus` logical devices (before
  TensorFlow's runtime starts; afterwards it checks there are enough)."""
  _split_cpu(num_cpus)
  _check_cpus(len(tf.config.list_logical_devices("CPU")), num_cpus)


def _split_cpu(num_cpus):
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * int(num_cpus))
  except RuntimeError:
    pass  # Already started; _check_cpus says whether that is enough.


def _check_cpus(have, num_cpus):
  if have < num_cpus:
    raise ClusterError(
        f"The chief needs {num_cpus} logical CPUs but TensorFlow's runtime "
        f"already started with {have}: call Cluster.connect (or "
        f"configure_local_cpus) before running any TensorFlow op.")


def wait_for_tasks(tasks, timeout):
  """Opens a TCP connection to each task's address, retrying until
  `timeout` seconds have passed; raises ClusterError naming the first
  address that never answered.

  A task that does not answer at once is announced (absl INFO) with the
  limit of the wait, as the estimator's wait for checkpoints is.
  """
  started = time.monotonic()
  deadline = started + timeout
  for task in tasks:
    host, port = spec_lib.split_address(task.address)
    announced = False
    while True:
      left = deadline - time.monotonic()
      try:
        with socket.create_connection((host, port),
                                      timeout=max(0.1, min(left, 2.0))):
          break
      except OSError as e:
        if not announced:
          announced = True
          logging.info(
              "Task %s at %s does not answer yet (%s). Waiting for it, "
              "%.0f s so far, stopping after %g s (startup_timeout). Start "
              "it there with `python -m mesh_tensorflow.cluster "
              "--worker_hosts=... --task_index=%d`.", task.name,
              task.address, e, time.monotonic() - started, timeout,
              task.index)
        if time.monotonic() >= deadline:
          raise ClusterError(
              f"Cannot reach task {task.name} at {task.address} (waited "
              f"{timeout:g} s: {e}). Start it there with `python -m "
              f"mesh_tensorflow.cluster --worker_hosts=... --task_index="
              f"{task.index}` (or the same TF_CONFIG), or fix the "
              f"address.", task) from None
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


class Cluster:
  """A TensorFlow cluster seen from its chief.

  Args:
    cluster_spec: a spec.ClusterSpec whose own task is the chief.
    num_cpus: logical CPUs of the chief (the other tasks choose theirs
      when they start serving); None keeps TensorFlow's default.
  """

  def __init__(self, cluster_spec, num_cpus=None):
    if not cluster_spec.is_chief:
      raise ClusterError(
          f"Task {cluster_spec.task.name} is not the chief "
          f"({cluster_spec.tasks[0].name}): it should serve "
          f"(mesh_tensorflow.cluster.serve) instead of connecting.")
    self._spec = cluster_spec
    self._num_cpus = num_cpus
    self._connected = False

  @property
  def spec(self):
    return self._spec

  @property
  def tasks(self):
    return self._spec.tasks

  def connect(self, startup_timeout=60.0):
    """Waits for every other task, then joins the cluster as the chief.

    Raises:
      ClusterError: a task did not answer within `startup_timeout` seconds
        (the message names its address).
    """
    # Both configure TensorFlow's runtime before it starts; nothing here
    # may start it before experimental_connect_to_cluster.
    if self._num_cpus:
      _split_cpu(self._num_cpus)
    own = self._spec.task
    wait_for_tasks([t for t in self._spec.tasks if t != own], startup_timeout)
    try:
      context.context().configure_collective_ops(
          collective_leader=collective_leader(self._spec))
    except (RuntimeError, ValueError) as e:
      logging.warning("Collective ops cannot be configured any more (%s): "
                      "SimdMeshImpl will not run across tasks. Connect "
                      "before running any TensorFlow op.", e)
    tf.config.experimental_connect_to_cluster(
        self._spec.as_cluster_def(), job_name=own.job, task_index=own.index)
    # The chief's server listens too, once the runtime starts.
    context.ensure_initialized()
    exposure.warn_if_exposed(own)
    self._connected = True
    if self._num_cpus:
      _check_cpus(len(self._devices_of(own, "CPU")), self._num_cpus)
    logging.info("Connected to cluster %s as %s", self._spec.jobs, own.name)
    return self

  def _require_connected(self):
    if not self._connected:
      raise ClusterError("Call Cluster.connect() first.")

  def task_devices(self, task):
    """The devices of one task, GPUs if it has any, else its CPUs, by
    index."""
    self._require_connected()
    return self._devices_of(task, "GPU") or self._devices_of(task, "CPU")

  @staticmethod
  def _devices_of(task, device_type):
    prefix = f"/job:{task.job}/replica:0/task:{task.index}/"
    names = [d.name for d in tf.config.list_logical_devices(device_type)
             if d.name.startswith(prefix)]
    return sorted(names, key=lambda n: int(n.rsplit(":", 1)[1]))

  def devices(self, num_processors=None, include_chief=True):
    """Device names for a mesh, in pnum order: task by task (chief first),
    within a task by index.

    Consecutive processors share a task, so the last mesh dimension (which
    varies fastest) stays inside a task where it fits: put the dimension
    with the most communication (e.g. model-parallel) last.

    Args:
      num_processors: how many to return (default: all). When it divides
        evenly over the tasks, each task gives its first
        num_processors / num_tasks devices; otherwise the first ones in
        order are used.
      include_chief: False leaves out the chief's devices (for SIMD).

    Raises:
      ClusterError: the cluster has fewer devices than `num_processors`.
    """
    tasks = self._spec.tasks if include_chief else self._spec.tasks[1:]
    if not tasks:
      raise ClusterError("The cluster has no task besides the chief.")
    per_task = [self.task_devices(t) for t in tasks]
    every = [d for names in per_task for d in names]
    if num_processors is None:
      return every
    num_tasks = len(per_task)
    if num_processors % num_tasks == 0 and all(
        len(names) >= num_processors // num_tasks for names in per_task):
      share = num_processors // num_tasks
      return [d for names in per_task for d in names[:share]]
    if len(every) < num_processors:
      counts = ", ".join(f"{t.name}: {len(n)}"
                         for t, n in zip(tasks, per_task))
      raise ClusterError(
          f"The mesh needs {num_processors} devices but the cluster has "
          f"{len(every)} ({counts}); start the tasks with more CPUs "
          f"(--num_cpus) or use a smaller mesh.")
    return every[:num_processors]

  def placement_mesh_impl(self, shape, layout, **kwargs):
    """A PlacementMeshImpl on this cluster's devices (see `devices`)."""
    size = shape_lib.convert_to_shape(shape).size
    return placement_mesh_impl.PlacementMeshImpl(
        shape, layout, devices=self.devices(size), **kwargs)

  def simd_mesh_impl(self, shape, layout, **kwargs):
    """A SimdMeshImpl (TF collective ops) on the serving tasks' devices.

    The chief's devices are left out (see the module docstring): a cluster
    of a chief and two serving tasks runs the SPMD program on the devices
    of the two. `kwargs` go to SimdMeshImpl (e.g.
    collective_timeout_seconds: how long a collective waits for a task
    that froze or died before it fails).
    """
    size = shape_lib.convert_to_shape(shape).size
    return simd_mesh_impl.SimdMeshImpl(
        shape, layout, devices=self.devices(size, include_chief=False),
        **kwargs)

  @contextlib.contextmanager
  def failures(self, watch=True, interval=10.0, timeout=10.0, misses=3,
               on_failure=None):
    """Re-raises TensorFlow's error for a task that died or disconnected as
    a ClusterError naming the task and its address.

    With `watch`, a watchdog.Watchdog also checks the other tasks every
    `interval` seconds while inside: a task that stops answering (frozen,
    which TensorFlow would wait on forever) makes `on_failure` get a
    ClusterError naming it after `misses` checks in a row; by default the
    process prints it and exits with status 1.
    """
    others = [t for t in self._spec.tasks if t != self._spec.task]
    guard = (watchdog_lib.Watchdog(others, interval, timeout, misses,
                                   on_failure) if watch
             else contextlib.nullcontext())
    try:
      with guard:
        yield
    except _TASK_FAILURES as e:
      task = self._failed_task(e.message)
      if task is None:
        raise
      raise ClusterError(
          f"Task {task.name} at {task.address} failed or is unreachable: "
          f"{e.message.splitlines()[0]} Restart it and the chief; training "
          f"resumes from the last checkpoint.", task) from e

  def _failed_task(self, message):
    own = self._spec.task
    for job, index in _TASK_IN_MESSAGE.findall(message):
      task = self._spec.task_of_device(f"/job:{job}/task:{index}")
      if task is not None and task != own:
        return task
    return None


def connect(worker_hosts=None, task_index=0, num_cpus=None,
            startup_timeout=60.0, tf_config=None):
  """Joins a cluster as its chief; returns the connected Cluster.

  Give `worker_hosts` ("host:port,host:port", this process being task
  `task_index`), or a TF_CONFIG spec in `tf_config` or the environment.
  """
  if worker_hosts:
    cluster_spec = spec_lib.ClusterSpec.from_worker_hosts(worker_hosts,
                                                          task_index)
  else:
    cluster_spec = spec_lib.ClusterSpec.from_tf_config(tf_config)
  return Cluster(cluster_spec, num_cpus).connect(startup_timeout)
