"""Which tasks make up a TensorFlow cluster, and which one this process is.

A cluster is given either as a `TF_CONFIG`-style JSON spec

    {"cluster": {"worker": ["host0:2222", "host1:2222"]},
     "task": {"type": "worker", "index": 1}}

or as flags: `worker_hosts="host0:2222,host1:2222"` and `task_index=1`. Both
describe the same thing: every task's address, and this process's task. The
spec holds no TensorFlow state (runtime.py starts and connects servers).

Tasks are ordered job by job ("chief" first, then "worker", then the other
jobs in alphabetical order), and by index within a job. The first task in
that order is the chief: the process that runs the training program. Every
other task only serves its devices.
"""

import collections
import json
import os

import tensorflow as tf

from mesh_tensorflow.cluster import errors

# Defined with the package's other errors; public here, where it was first.
ClusterSpecError = errors.ClusterSpecError

_JOB_ORDER = ("chief", "worker")

Task = collections.namedtuple("Task", ("job", "index", "address"))
Task.__doc__ = """One task of a cluster: its job name, index and host:port."""
Task.name = property(lambda self: f"/job:{self.job}/task:{self.index}")


class ClusterSpec:
  """The tasks of a cluster and this process's place in it.

  Args:
    jobs: {job name: [host:port, ...]} (one address per task).
    job_name: this process's job.
    task_index: this process's index within its job.
  """

  def __init__(self, jobs, job_name, task_index):
    if not jobs:
      raise ClusterSpecError("A cluster needs at least one job with tasks.")
    self._jobs = {}
    for job, addresses in jobs.items():
      if isinstance(addresses, str):
        addresses = [addresses]
      addresses = [str(a).strip() for a in addresses]
      if not addresses:
        raise ClusterSpecError(f"Job {job!r} of the cluster has no tasks.")
      for address in addresses:
        _check_address(address, job)
      self._jobs[str(job)] = addresses
    seen = {}
    for task in self.tasks:
      if task.address in seen:
        raise ClusterSpecError(
            f"Address {task.address} is given to two tasks: "
            f"{seen[task.address]} and {task.name}.")
      seen[task.address] = task.name
    if job_name not in self._jobs:
      raise ClusterSpecError(
          f"This task's job {job_name!r} is not in the cluster (jobs: "
          f"{sorted(self._jobs)}).")
    try:
      task_index = int(task_index)
    except (TypeError, ValueError):
      raise ClusterSpecError(
          f"task_index must be an integer, got {task_index!r}.") from None
    if not 0 <= task_index < len(self._jobs[job_name]):
      raise ClusterSpecError(
          f"task_index {task_index} is out of range: job {job_name!r} has "
          f"{len(self._jobs[job_name])} task(s) "
          f"({','.join(self._jobs[job_name])}).")
    self._job_name = job_name
    self._task_index = task_index

  @classmethod
  def from_worker_hosts(cls, worker_hosts, task_index, job_name="worker"):
    """From comma-separated host:port addresses (the `--worker_hosts` flag)
    and this task's index among them (`--task_index`)."""
    if isinstance(worker_hosts, str):
      worker_hosts = [h for h in worker_hosts.split(",") if h.strip()]
    if not worker_hosts:
      raise ClusterSpecError("worker_hosts is empty: give comma-separated "
                             "host:port addresses, one per task.")
    return cls({job_name: list(worker_hosts)}, job_name, task_index)

  @classmethod
  def from_tf_config(cls, tf_config=None):
    """From a TF_CONFIG spec: a JSON string, a dict, or None for the
    `TF_CONFIG` environment variable."""
    source = "tf_config"
    if tf_config is None:
      source = "the TF_CONFIG environment variable"
      tf_config = os.environ.get("TF_CONFIG")
      if not tf_config:
        raise ClusterSpecError("TF_CONFIG is not set.")
    if isinstance(tf_config, str):
      try:
        tf_config = json.loads(tf_config)
      except json.JSONDecodeError as e:
        raise ClusterSpecError(f"{source} is not valid JSON: {e}.") from e
    if not isinstance(tf_config, dict) or not isinstance(
        tf_config.get("cluster"), dict):
      raise ClusterSpecError(
          f"{source} needs a \"cluster\" object mapping job names to "
          f"host:port lists, got {tf_config!r}.")
    task = tf_config.get("task") or {}
    jobs = tf_config["cluster"]
    default_job = "chief" if "chief" in jobs else "worker"
    return cls(jobs, task.get("type", default_job), task.get("index", 0))

  @property
  def jobs(self):
    """{job name: [host:port]} in task order."""
    return {job: list(self._jobs[job]) for job in _ordered_jobs(self._jobs)}

  @property
  def tasks(self):
    """Every Task, chief first (see the module docstring for the order)."""
    return [Task(job, i, address)
            for job in _ordered_jobs(self._jobs)
            for i, address in enumerate(self._jobs[job])]

  @property
  def job_name(self):
    return self._job_name

  @property
  def task_index(self):
    return self._task_index

  @property
  def task(self):
    """This process's Task."""
    return Task(self._job_name, self._task_index,
                self._jobs[self._job_name][self._task_index])

  @property
  def is_chief(self):
    return self.task == self.tasks[0]

  def as_tf_config(self):
    """The TF_CONFIG dict of this spec."""
    return {"cluster": self.jobs,
            "task": {"type": self._job_name, "index": self._task_index}}

  def as_cluster_def(self):
    """TensorFlow's `tf.train.ClusterSpec` of the same tasks."""
    return tf.train.ClusterSpec(self.jobs)

  def task_of_device(self, device):
    """The Task a device string like "/job:worker/replica:0/task:1/..."
    belongs to, or None."""
    parts = dict(p.split(":", 1) for p in device.split("/") if ":" in p)
    job, index = parts.get("job"), parts.get("task")
    if job not in self._jobs or index is None or not index.isdigit():
      return None
    index = int(index)
    if index >= len(self._jobs[job]):
      return None
    return Task(job, index, self._jobs[job][index])

  def __repr__(self):
    return (f"ClusterSpec({self.jobs!r}, job_name={self._job_name!r}, "
            f"task_index={self._task_index})")


def _ordered_jobs(jobs):
  first = [j for j in _JOB_ORDER if j in jobs]
  return first + sorted(j for j in jobs if j not in _JOB_ORDER)


def _check_address(address, job):
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ClusterSpecError(
        f"Address {address!r} of job {job!r} is not host:port.")


def split_address(address):
  """(host, port) of "host:port" (IPv6 hosts may be in brackets)."""
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)
