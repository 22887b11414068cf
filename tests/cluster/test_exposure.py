"""A task says when it is reachable beyond loopback, as its socket shows.

The sockets are read from the kernel (/proc/net/tcp, /proc/net/tcp6); the
tests only listen on loopback and send no traffic anywhere.
"""

import ipaddress
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

from mesh_tensorflow.cluster import exposure
from tests.cluster import cluster_testing

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"),
                                reason="reads Linux's /proc/net/tcp")

_STARTUP_SECONDS = 120


def _proc_hex(address):
  """`address` as /proc/net/tcp* prints it (words in native byte order)."""
  packed = ipaddress.ip_address(address).packed
  return "".join(f"{struct.unpack('=I', packed[i:i + 4])[0]:08X}"
                 for i in range(0, len(packed), 4))


@pytest.mark.parametrize("address,loopback", [
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
    ("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("::ffff:10.1.2.3", False)])
def test_decodes_proc_addresses(address, loopback):
  decoded = exposure.decode_address(_proc_hex(address))
  assert decoded == ipaddress.ip_address(address)
  assert exposure.is_loopback(decoded) == loopback


def test_finds_this_process_loopback_listener():
  """A real socket of this process, on IPv4 and (where there is one) IPv6
  loopback, is found on its port and only there."""
  families = [(socket.AF_INET, "127.0.0.1")]
  if socket.has_ipv6 and os.path.exists("/proc/net/tcp6"):
    families.append((socket.AF_INET6, "::1"))
  for family, host in families:
    with socket.socket(family) as s:
      try:
        s.bind((host, 0))
      except OSError:
        continue  # No such loopback address here.
      s.listen()
      port = s.getsockname()[1]
      found = exposure.listening_addresses(port)
      assert found == [ipaddress.ip_address(host)]
      assert exposure.exposure_warning("t", port, found) is None
  assert exposure.listening_addresses(port) == []


def _read_until_serving(process, deadline):
  """The serving task's stdout up to its "Serving" line (read unbuffered,
  so that no line waits in a buffer), or None if it ended or timed out."""
  text = b""
  fd = process.stdout.fileno()
  while b"Serving" not in text:
    left = deadline - time.monotonic()
    ready, _, _ = select.select([fd], [], [], max(0.0, left))
    chunk = os.read(fd, 4096) if ready else b""
    if not chunk:
      return None
    text += chunk
  return text.decode()


def test_serving_task_warns_iff_reachable_beyond_loopback():
  """`python -m mesh_tensorflow.cluster --worker_hosts=localhost:P` warns
  at start-up, naming the port and the missing authentication, exactly
  when its listening socket is not on loopback."""
  port = cluster_testing.free_ports(1)[0]
  command = [sys.executable, "-m", "mesh_tensorflow.cluster",
             f"--worker_hosts=localhost:{port}", "--task_index=0",
             f"--serve_seconds={_STARTUP_SECONDS}"]
  env = dict(os.environ, PYTHONPATH=cluster_testing.REPO,
             TF_CPP_MIN_LOG_LEVEL="3")
  with tempfile.TemporaryFile("w+") as err:
    process = subprocess.Popen(command, cwd=cluster_testing.REPO, env=env,
                               stdout=subprocess.PIPE, stderr=err)
    try:
      served = _read_until_serving(
          process, time.monotonic() + _STARTUP_SECONDS)
      addresses = exposure.listening_addresses(port, pid=process.pid)
    finally:
      process.kill()
      process.wait(timeout=30)
      process.stdout.close()
    err.seek(0)
    stderr = err.read()
  assert served, f"the task never said it was serving:\n{stderr[-3000:]}"
  assert addresses, f"task {process.pid} does not listen on port {port}"
  exposed = [a for a in addresses if not exposure.is_loopback(a)]
  warned = "no authentication" in stderr
  assert warned == bool(exposed), (
      f"listening on {addresses}, but the warning is "
      f"{'given' if warned else 'missing'}:\n{stderr[-3000:]}")
  if warned:
    assert f"port {port}" in stderr, stderr
