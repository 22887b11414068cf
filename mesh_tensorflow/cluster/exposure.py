"""Which addresses a task's gRPC server listens on, read from the kernel.

TensorFlow 2.21's gRPC server (a serving task's `tf.distribute.Server`, and
the chief's in-process one) listens on every network interface: it asks
gRPC for "0.0.0.0:PORT", which gRPC opens as one dual-stack socket on
"[::]:PORT", whatever host the task's address names. Nothing chooses the
interface: not the host in the cluster spec, not a port-only address, not
ServerDef's `port` (it overrides the port only), not its `protocol` (only
"grpc" is registered), not the ConfigProto. So this module does not try to
bind; it reads the sockets the server opened (Linux's /proc/net/tcp and
/proc/net/tcp6) to say truthfully whether the task is reachable beyond
loopback.
"""

import ipaddress
import os
import struct

from absl import logging

from mesh_tensorflow.cluster import spec as spec_lib

_PROC_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"  # The TCP state code of a listening socket in /proc/net/tcp*.


def decode_address(hex_address):
  """The IP address of a /proc/net/tcp* address field's host part.

  The kernel prints the address as 32-bit words in the machine's own byte
  order (8 hex digits for IPv4, 32 for IPv6).
  """
  words = [int(hex_address[i:i + 8], 16)
           for i in range(0, len(hex_address), 8)]
  return ipaddress.ip_address(b"".join(struct.pack("=I", w) for w in words))


def is_loopback(address):
  """Whether only this machine can reach `address` (an ipaddress address),
  including IPv4 loopback written as an IPv4-mapped IPv6 address."""
  mapped = getattr(address, "ipv4_mapped", None)
  return (mapped or address).is_loopback


def _socket_inodes(pid):
  """The inodes of the sockets process `pid` has open."""
  fd_dir = f"/proc/{pid}/fd"
  inodes = set()
  for fd in os.listdir(fd_dir):
    try:
      target = os.readlink(os.path.join(fd_dir, fd))
    except OSError:
      continue  # Closed since listdir.
    if target.startswith("socket:["):
      inodes.add(target[len("socket:["):-1])
  return inodes


def listening_addresses(port, pid=None):
  """The addresses (ipaddress objects) on which a process listens on TCP
  `port`.

  Args:
    port: the TCP port.
    pid: the process id (default: this process).

  Returns:
    A sorted list, empty if the process does not listen on `port`; None
    where /proc cannot be read (not Linux).
  """
  try:
    inodes = _socket_inodes(pid or "self")
  except OSError:
    return None
  found = set()
  for table in _PROC_TABLES:
    try:
      with open(table) as f:
        lines = f.read().splitlines()[1:]
    except OSError:
      continue  # No IPv6 on this machine, say.
    for line in lines:
      fields = line.split()
      local, state, inode = fields[1], fields[3], fields[9]
      host, _, hex_port = local.partition(":")
      if (state == _LISTEN and int(hex_port, 16) == port
          and inode in inodes):
        found.add(decode_address(host))
  return sorted(found, key=lambda a: (a.version, a))


def _describe(address, port):
  where = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
  if address.is_unspecified:
    return f"{where} (every network interface)"
  return where


def exposure_warning(task_name, port, addresses):
  """The warning for a task listening on `addresses` (from
  listening_addresses), or None when only loopback can reach it. Where
  the sockets are unknown (None, or none found) it assumes TensorFlow's
  usual every-interface socket."""
  if addresses:
    exposed = [a for a in addresses if not is_loopback(a)]
    if not exposed:
      return None
    where = ", ".join(_describe(a, port) for a in exposed)
  else:
    where = _describe(ipaddress.ip_address("::"), port)
  return (
      f"Task {task_name} listens on {where}: port {port} is reachable "
      f"beyond loopback, and TensorFlow's gRPC server runs any graph sent "
      f"to it, with no authentication (TensorFlow cannot bind it to one "
      f"address). Keep port {port} closed to everything but the cluster's "
      f"own machines: a firewall, a private network or an SSH tunnel "
      f"(README.md, \"Security\").")


def warn_if_exposed(task):
  """Logs exposure_warning for this process's task `task` (a spec.Task
  whose server has started); returns the warning, or None."""
  port = spec_lib.split_address(task.address)[1]
  message = exposure_warning(task.name, port, listening_addresses(port))
  if message:
    logging.warning(message)
  return message
