"""Local clusters for tests: server processes on free loopback ports.

Every process gets a lifetime limit (servers exit by themselves after
SERVE_SECONDS; chiefs are killed at their timeout) and `LocalCluster`
kills whatever is still running when the test ends.
"""

import os
import re
import socket
import subprocess
import sys

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

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.close()

  def start_server(self, task_index):
    """Starts task `task_index` serving (exits by itself later)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "mesh_tensorflow.cluster",
         f"--worker_hosts={self.worker_hosts}", f"--task_index={task_index}",
         f"--num_cpus={CPUS_PER_TASK}", f"--serve_seconds={SERVE_SECONDS}"],
        cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    self._processes.append(process)
    self.servers[task_index] = process
    return process

  def start_servers(self):
    for task_index in range(1, len(self.hosts)):
      self.start_server(task_index)

  def start_chief(self, module, *args):
    """Starts `python -m module WORKER_HOSTS *args` (stdout piped)."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, self.worker_hosts] +
        [str(a) for a in args], cwd=REPO, env=_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self._processes.append(process)
    return process

  def run_chief(self, module, *args, timeout=CHIEF_TIMEOUT):
    """Runs a chief to its end: (returncode, stdout, stderr)."""
    process = self.start_chief(module, *args)
    try:
      out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      process.kill()
      out, err = process.communicate()
      raise AssertionError(f"chief {module} {args} did not finish in "
                           f"{timeout} s:\n{out[-2000:]}\n{err[-3000:]}")
    return process.returncode, out, err

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
        process.communicate(timeout=30)
      except (subprocess.TimeoutExpired, ValueError):
        pass


def losses(stdout):
  """{step: loss} from a chief's "step N loss L" lines."""
  return {int(s): float(l) for s, l in
          re.findall(r"^step (\d+) loss (\S+)$", stdout, re.M)}
