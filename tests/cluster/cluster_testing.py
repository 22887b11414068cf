"""Local clusters for tests: server processes on free loopback ports.

Every process gets a lifetime limit (servers exit by themselves after
SERVE_SECONDS; chiefs are killed at their timeout) and `LocalCluster`
kills whatever is still running when the test ends.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CPUS_PER_TASK = 4
STARTUP_TIMEOUT = 60.0
SERVE_SECONDS = 240
CHIEF_TIMEOUT = 180


def free_ports(n):
  """`n` distinct loopback ports that were free just now."""
  sockets = []
  try:
    for _ in range(n):
      s = socket.socket()
      s.bind(("localhost", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _env():
  return dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")


class LocalCluster:
  """A cluster of `num_tasks` tasks on loopback; task 0 is the chief.

  Use as a context manager: on exit every process it started is killed.
  """

  def __init__(self, num_tasks=2):
    self.hosts = [f"localhost:{p}" for p in free_ports(num_tasks)]
    self.worker_hosts = ",".join(self.hosts)
    self._processes = []
    self.servers = {}
    self._outputs = {}
    self._log_dir = tempfile.mkdtemp(prefix="mtf_cluster_")

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.close()

  def start_server(self, task_index, tf_config=False):
    """Starts task `task_index` serving (exits by itself later); with
    `tf_config` the cluster is given through TF_CONFIG, not flags."""
    command = [sys.executable, "-m", "mesh_tensorflow.cluster",
               f"--num_cpus={CPUS_PER_TASK}",
               f"--serve_seconds={SERVE_SECONDS}"]
    env = _env()
    if tf_config:
      env["TF_CONFIG"] = json.dumps({
          "cluster": {"worker": self.hosts},
          "task": {"type": "worker", "index": task_index}})
    else:
      command += [f"--worker_hosts={self.worker_hosts}",
                  f"--task_index={task_index}"]
    process = subprocess.Popen(command, cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    self._processes.append(process)
    self.servers[task_index] = process
    return process

  def start_servers(self):
    for task_index in range(1, len(self.hosts)):
      self.start_server(task_index)

  def start_chief(self, module, *args):
    """Starts `python -m module WORKER_HOSTS *args`."""
    return self.start_process([sys.executable, "-m", module,
                               self.worker_hosts] + [str(a) for a in args])

  def start_process(self, command):
    """Starts `command` (killed on close); its output goes to temporary
    files (a pipe could fill up and block it)."""
    paths = tuple(os.path.join(self._log_dir, f"{len(self._processes)}.{k}")
                  for k in ("out", "err"))
    with open(paths[0], "w") as out, open(paths[1], "w") as err:
      process = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=out,
                                 stderr=err)
    self._processes.append(process)
    self._outputs[process] = paths
    return process

  def wait(self, process, timeout=CHIEF_TIMEOUT):
    """Waits for a chief to end: (returncode, stdout, stderr). Kills it
    and fails if it runs longer than `timeout` seconds."""
    try:
      process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
      out, err = self.output(process)
      raise AssertionError(f"chief {process.args} did not finish in "
                           f"{timeout} s:\n{out[-2000:]}\n{err[-3000:]}"
                           ) from None
    return (process.returncode,) + self.output(process)

  def output(self, process):
    """(stdout, stderr) a chief has written so far."""
    texts = []
    for path in self._outputs[process]:
      with open(path) as f:
        texts.append(f.read())
    return tuple(texts)

  def run_chief(self, module, *args, timeout=CHIEF_TIMEOUT):
    """Runs a chief to its end: (returncode, stdout, stderr)."""
    return self.wait(self.start_chief(module, *args), timeout)

  def kill(self, process):
    if process.poll() is None:
      process.kill()
    process.wait(timeout=30)

  def close(self):
    for process in self._processes:
      if process.poll() is None:
        process.kill()
    for process in self._processes:
      try:
        process.wait(timeout=30)
      except subprocess.TimeoutExpired:
        pass
    shutil.rmtree(self._log_dir, ignore_errors=True)


def losses(stdout):
  """{step: loss} from a chief's "step N loss L" lines."""
  return {int(s): float(l) for s, l in
          re.findall(r"^step (\d+) loss (\S+)$", stdout, re.M)}
