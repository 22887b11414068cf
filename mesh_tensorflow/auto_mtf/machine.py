"""The machine's constants for the layout search's time objective.

The time objective predicts a layout's step time from what it counts per
processor (FLOPs, bytes of element-wise work, lowered ops, collectives by
kind and mesh dimension, with their wire bytes) and from a few constants of
the machine. This module holds those constants (`MachineConstants`),
measures them on this machine (`calibrate`), caches the measurement on disk
(`load_or_calibrate`, which measures in a fresh Python process when this
one is in tf.compat.v1 graph mode; `python -m
mesh_tensorflow.auto_mtf.calibration` fills the cache from a shell) and
accepts a user's own figures, e.g. a TPU pod's (`machine_constants`).
Machines you may not have ship as JSON files in SHIPPED_MACHINES_DIR
(`shipped_machine("tpu_v3_pod")`, `shipped_machine("gpu_8x_node")`), from
public figures that each file's `source` names.

Calibration times this project's own lowering: einsums and element-wise ops
under tf.function on the mesh's devices, and each collective of the mesh
implementation (PlacementMeshImpl or SimdMeshImpl) on laid-out tensors, for
every group size that divides the processor count, at a few sizes. One
measurement of the devices serves every mesh shape of them (`for_mesh`
names its links by the mesh's dimensions), so a search over mesh shapes
measures once. A collective's wire bytes come from
`collective_wire_bytes` (module mesh_impl), the formula of the lowering's
counters, so a cost model multiplying counted wire bytes by the fitted
seconds per wire byte predicts what the lowering will see.

The compute constants are fitted so that `compute_seconds` is right for the
calibrated mesh: every processor working at once, `concurrency` of them at
full speed (on one host's logical CPUs, about the number of cores left free
by intra-op parallelism; on a TPU pod, every processor).

Example of a user's figures (JSON; `collectives` and its per-kind "*"
defaults are optional, `default_collective` is used for what is missing):

  {"flops_per_second": 1.2e14, "elementwise_bytes_per_second": 6e11,
   "op_overhead_seconds": 2e-6, "concurrency": 256,
   "default_collective": {"latency_seconds": 1e-5,
                          "seconds_per_wire_byte": 1e-11},
   "collectives": {"allreduce": {"x": [8e-6, 5e-12], "x,y": [1.5e-5, 5e-12]}},
   "memory_bytes_per_processor": 17179869184}

A per-wire-byte cost is per wire byte summed over ALL processors (the
counters' convention), so it depends on how many processors send at once:
with B bytes per second leaving each of P processors, seconds_per_wire_byte
= 1 / (P B). `wire_processors` records that P (the shipped files and a
calibration set it) and `for_processors(P')` scales the costs by P / P'
for another count, as the planner does for the N it plans.
"""

import collections
import dataclasses
import hashlib
import itertools
import json
import math
import os
import platform
import statistics
import tempfile
import time
import warnings

from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.auto_mtf import calibration_subprocess

COLLECTIVE_KINDS = mesh_impl_lib.COLLECTIVE_KINDS
# The machine files shipped as package data (setup.py's package_data).
SHIPPED_MACHINES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "machines")
CalibrationError = calibration_subprocess.CalibrationError
CACHE_DIR_ENV = "MTF_AUTO_MTF_CACHE_DIR"
MESH_IMPLS = ("placement", "simd")
_ANY_DIMS = ("*",)  # The key of a collective kind's default link.
# 2: serial collectives, mtf operation overhead; 3: matmul bytes; 5: one
# measurement of the devices for every mesh shape, links by group size; 6:
# op overhead on chains that cross devices.
_CACHE_FORMAT = 6


# ------------------------------------------------------------- constants


@dataclasses.dataclass(frozen=True)
class LinkConstants:
  """The time of one collective call: latency + wire bytes x per-byte cost.

  Attributes:
    latency_seconds: fixed time of one call.
    seconds_per_wire_byte: time per wire byte, wire bytes summed over all
      processors as the lowering's counters count them.
  """
  latency_seconds: float
  seconds_per_wire_byte: float

  def __post_init__(self):
    _check_number(self.latency_seconds, "latency_seconds", positive=False)
    _check_number(self.seconds_per_wire_byte, "seconds_per_wire_byte",
                  positive=False)

  def seconds(self, wire_bytes):
    return self.latency_seconds + wire_bytes * self.seconds_per_wire_byte

  def to_dict(self):
    return {"latency_seconds": self.latency_seconds,
            "seconds_per_wire_byte": self.seconds_per_wire_byte}


@dataclasses.dataclass(frozen=True)
class MachineConstants:
  """Constants of a machine for predicting step times.

  Attributes:
    flops_per_second: einsum/matmul FLOPs per second of one processor.
    elementwise_bytes_per_second: bytes read plus written per second by
      element-wise work of one processor.
    op_overhead_seconds: fixed cost of one lowered per-processor TF op.
    concurrency: how many processors compute at full speed at once (the
      number of processors on a TPU pod; about 1-2 for logical CPUs sharing
      2 cores).
    default_collective: the LinkConstants of a collective whose kind and
      mesh dimensions have no entry in `collectives`.
    collectives: per collective kind (one of COLLECTIVE_KINDS), per mesh
      dimension names (a tuple; ("*",) is the kind's default), a
      LinkConstants. Given as a dict {kind: {dims: link}} or as a tuple of
      (kind, dims, link) triples; stored as the latter, sorted. `dims`
      may be a tuple or a comma-separated string ("b,m"); `link` a
      LinkConstants, a (latency, per byte) pair or a dict.
    source: free text saying where the figures come from.
    calibration_seconds: wall time of the calibration (0 if given).
    share_replicas: whether processors holding the same slice compute it
      once (PlacementMeshImpl on one task's CPUs): then an operation costs
      as many computations as it has distinct slices, not processors.
    matmul_bytes_per_second: bytes of einsum operands and results per
      second of one processor (a matmul packs its operands, far slower
      per byte than element-wise work streams them: on 2 CPU cores about
      4 GB/s against 35); 0 means the element-wise rate.
    memory_bytes_per_processor: bytes of memory of one processor (its HBM),
      0 if not given (calibration leaves it 0): a planner's default
      per-processor memory budget.
    wire_processors: the processor count P the per-wire-byte costs hold
      for (they are 1 / (P x per-processor rate), see the module
      docstring); 0 if not given. Calibration sets the measured device
      count; `for_processors` rescales.
  """
  flops_per_second: float
  elementwise_bytes_per_second: float
  op_overhead_seconds: float
  concurrency: float
  default_collective: LinkConstants
  collectives: tuple = ()
  source: str = ""
  calibration_seconds: float = 0.0
  share_replicas: bool = False
  matmul_bytes_per_second: float = 0.0
  memory_bytes_per_processor: float = 0.0
  wire_processors: int = 0

  def __post_init__(self):
    _check_number(self.flops_per_second, "flops_per_second")
    _check_number(self.elementwise_bytes_per_second,
                  "elementwise_bytes_per_second")
    _check_number(self.op_overhead_seconds, "op_overhead_seconds",
                  positive=False)
    _check_number(self.concurrency, "concurrency")
    _check_number(self.matmul_bytes_per_second, "matmul_bytes_per_second",
                  positive=False)
    _check_number(self.calibration_seconds, "calibration_seconds",
                  positive=False)
    _check_number(self.memory_bytes_per_processor,
                  "memory_bytes_per_processor", positive=False)
    if (isinstance(self.wire_processors, bool) or
        not isinstance(self.wire_processors, (int, np.integer)) or
        self.wire_processors < 0):
      raise ValueError(f"MachineConstants field 'wire_processors' must be "
                       f"a non-negative integer, got "
                       f"{self.wire_processors!r}.")
    object.__setattr__(self, "wire_processors", int(self.wire_processors))
    object.__setattr__(self, "default_collective",
                       _to_link(self.default_collective, "default_collective"))
    object.__setattr__(self, "collectives",
                       _normalize_collectives(self.collectives))
    if not isinstance(self.share_replicas, bool):
      raise ValueError(f"MachineConstants field 'share_replicas' must be "
                       f"true or false, got {self.share_replicas!r}.")
    if not isinstance(self.source, str):
      raise ValueError(f"MachineConstants field 'source' must be a string, "
                       f"got {self.source!r}.")
    object.__setattr__(self, "_links", {
        (kind, frozenset(dims)): link
        for kind, dims, link in self.collectives})

  # ------------------------------------------------------------ predictions

  def compute_seconds(self, flops, elementwise_bytes, num_ops,
                      num_processors, matmul_bytes=0):
    """Predicted time of per-processor work done by all processors at once.

    Linear in (flops, elementwise_bytes, num_ops, matmul_bytes) for a fixed
    number of processors, so that a layout's time is the sum over its
    operations.

    Args:
      flops: einsum/convolution FLOPs of one processor.
      elementwise_bytes: bytes read and written by one processor's
        element-wise work.
      num_ops: lowered TF ops of one processor.
      num_processors: processors doing this work at once (SPMD).
      matmul_bytes: bytes of one processor's einsum operands and results.

    Returns:
      seconds (float).
    """
    if num_processors < 1:
      raise ValueError(f"compute_seconds: num_processors must be >= 1, got "
                       f"{num_processors}.")
    one = (num_ops * self.op_overhead_seconds +
           flops / self.flops_per_second +
           elementwise_bytes / self.elementwise_bytes_per_second +
           matmul_bytes / (self.matmul_bytes_per_second or
                           self.elementwise_bytes_per_second))
    return one * max(1.0, num_processors / self.concurrency)

  def link(self, kind, mesh_dimension_names):
    """The LinkConstants of collective `kind` over those mesh dimensions.

    A measured or given entry for exactly those dimensions (in any order)
    if there is one; else for one dimension the kind's default ("*"), then
    `default_collective`; for several, the links of each dimension
    combined (latencies add up, the slowest per-byte cost counts).
    """
    _check_kind(kind)
    dims = _dims_tuple(mesh_dimension_names)
    found = self._links.get((kind, frozenset(dims)))
    if found is not None:
      return found
    if len(dims) > 1:
      parts = [self.link(kind, (d,)) for d in dims]
      return LinkConstants(
          sum(p.latency_seconds for p in parts),
          max(p.seconds_per_wire_byte for p in parts))
    return self._links.get((kind, frozenset(_ANY_DIMS)),
                           self.default_collective)

  def collective_seconds(self, kind, mesh_dimension_names, wire_bytes):
    """Predicted time of one collective call.

    Args:
      kind: one of COLLECTIVE_KINDS.
      mesh_dimension_names: the mesh dimensions of its groups (a tuple of
        names, or one name); several mean one group over all of them.
      wire_bytes: its wire bytes summed over all processors, as
        `collective_wire_bytes` of module mesh_impl (the lowering's
        counters) counts them.

    Returns:
      seconds: latency + wire_bytes x seconds per wire byte; 0 over no
      mesh dimension (no communication).
    """
    if not _dims_tuple(mesh_dimension_names):
      _check_kind(kind)
      return 0.0
    return self.link(kind, mesh_dimension_names).seconds(wire_bytes)

  def for_processors(self, num_processors):
    """These constants for `num_processors` processors sending at once.

    Every per-wire-byte cost (wire bytes summed over all processors) is
    scaled by wire_processors / num_processors: each processor brings its
    own links, so twice the processors move twice the bytes per second.
    Latencies and compute figures are per processor and stay. This is an
    approximation: a collective limited by a shared resource scales worse,
    notably an alltoall bound by a torus's bisection (on a square 2-D
    torus of P processors the bisection grows as sqrt(P), so its true cost
    per wire byte falls as 1/sqrt(P), not 1/P): for more processors than
    wire_processors its predicted time is optimistic, for fewer
    pessimistic. Unchanged `concurrency` (how many processors compute at
    full speed at once) is right while num_processors <= concurrency.

    Args:
      num_processors: N, a positive int.

    Returns:
      a MachineConstants with wire_processors = N; this one itself when
      wire_processors is 0 (not given) or already N.
    """
    if (isinstance(num_processors, bool) or
        not isinstance(num_processors, (int, np.integer)) or
        num_processors < 1):
      raise ValueError(f"MachineConstants.for_processors: num_processors "
                       f"must be a positive integer, got "
                       f"{num_processors!r}.")
    if not self.wire_processors or self.wire_processors == num_processors:
      return self
    factor = self.wire_processors / num_processors

    def scaled(link):
      return LinkConstants(link.latency_seconds,
                           link.seconds_per_wire_byte * factor)

    return dataclasses.replace(
        self, default_collective=scaled(self.default_collective),
        collectives=tuple((kind, dims, scaled(link))
                          for kind, dims, link in self.collectives),
        wire_processors=int(num_processors),
        source=(f"{self.source}; per-wire-byte costs scaled from "
                f"{self.wire_processors} to {num_processors} processors"))

  # ---------------------------------------------------------- (de)serialize

  def to_dict(self):
    """A JSON-compatible dict; `from_dict` reads it back."""
    collectives = {}
    for kind, dims, link in self.collectives:
      collectives.setdefault(kind, {})[",".join(dims)] = link.to_dict()
    return {
        "flops_per_second": self.flops_per_second,
        "elementwise_bytes_per_second": self.elementwise_bytes_per_second,
        "op_overhead_seconds": self.op_overhead_seconds,
        "concurrency": self.concurrency,
        "default_collective": self.default_collective.to_dict(),
        "collectives": collectives,
        "source": self.source,
        "calibration_seconds": self.calibration_seconds,
        "share_replicas": self.share_replicas,
        "matmul_bytes_per_second": self.matmul_bytes_per_second,
        "memory_bytes_per_processor": self.memory_bytes_per_processor,
        "wire_processors": self.wire_processors,
    }

  @classmethod
  def from_dict(cls, d):
    """Reads `to_dict`'s form (or a user's, see the module docstring)."""
    if not isinstance(d, dict):
      raise ValueError(f"MachineConstants: expected a dict of fields, got "
                       f"{type(d).__name__}.")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names))
    if unknown:
      raise ValueError(f"MachineConstants: unknown field(s) {unknown}; "
                       f"expected some of {names}.")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING]
    for name in required:
      if name not in d:
        raise ValueError(f"MachineConstants: missing field {name!r} "
                         f"(required: {required}).")
    return cls(**d)

  def to_json(self):
    return json.dumps(self.to_dict(), sort_keys=True)

  @classmethod
  def from_json(cls, text):
    try:
      d = json.loads(text)
    except ValueError as e:
      raise ValueError(f"MachineConstants: not valid JSON ({e}).") from None
    return cls.from_dict(d)


def machine_constants(value):
  """A MachineConstants from a user's figures.

  Args:
    value: a MachineConstants, a dict of its fields, a JSON string of that
      dict, the path of a JSON file holding it, or the name of a shipped
      machine file ("tpu_v3_pod", see `shipped_machine`) where no file of
      that path exists.

  Returns:
    a MachineConstants.

  Raises:
    ValueError: naming the missing, unknown or invalid field, or the file
      that does not exist.
  """
  if isinstance(value, MachineConstants):
    return value
  if isinstance(value, dict):
    return MachineConstants.from_dict(value)
  if isinstance(value, os.PathLike):
    value = os.fspath(value)
  if isinstance(value, str):
    if value.lstrip().startswith("{"):
      return MachineConstants.from_json(value)
    if not os.path.isfile(value):
      if _shipped_path(value) is not None:
        return shipped_machine(value)
      raise ValueError(f"machine_constants: {value!r} is neither JSON nor "
                       f"an existing file nor a shipped machine (one of "
                       f"{shipped_machine_names()}).")
    with open(value) as f:
      text = f.read()
    try:
      return MachineConstants.from_json(text)
    except ValueError as e:
      raise ValueError(f"machine_constants: file {value!r}: {e}") from None
  raise TypeError(f"machine_constants: expected MachineConstants, dict, "
                  f"JSON string or path, got {type(value).__name__}.")


def shipped_machine_names():
  """Names of the machine files shipped in SHIPPED_MACHINES_DIR, e.g.
  ["gpu_8x_node", "tpu_v3_pod"]."""
  if not os.path.isdir(SHIPPED_MACHINES_DIR):
    return []
  return sorted(name[:-len(".json")]
                for name in os.listdir(SHIPPED_MACHINES_DIR)
                if name.endswith(".json"))


def _shipped_path(name):
  """The path of shipped machine `name` (with or without ".json"), or
  None."""
  base = os.path.basename(name)
  if base != name:
    return None
  if base.endswith(".json"):
    base = base[:-len(".json")]
  if base not in shipped_machine_names():
    return None
  return os.path.join(SHIPPED_MACHINES_DIR, base + ".json")


def shipped_machine_path(name):
  """The path of the machine file shipped as `name` ("tpu_v3_pod", with or
  without ".json").

  Raises:
    ValueError: no shipped machine has that name (the message lists them).
  """
  path = _shipped_path(name) if isinstance(name, str) else None
  if path is None:
    raise ValueError(f"shipped_machine: no machine file {name!r} ships with "
                     f"mesh_tensorflow.auto_mtf; shipped: "
                     f"{shipped_machine_names()} (in "
                     f"{SHIPPED_MACHINES_DIR}).")
  return path


def shipped_machine(name):
  """The MachineConstants of a machine file shipped with the package.

  Args:
    name: "tpu_v3_pod" (a TPU v3 pod, per core, per-wire-byte costs for a
      512-core slice), "gpu_8x_node" (8 A100 GPUs joined by NVSwitch), with
      or without ".json"; `shipped_machine_names()` lists them.

  Returns:
    a MachineConstants; its `source` says where each figure comes from.

  Raises:
    ValueError: no shipped machine has that name (the message lists them).
  """
  path = shipped_machine_path(name)
  with open(path) as f:
    text = f.read()
  try:
    return MachineConstants.from_json(text)
  except ValueError as e:
    raise ValueError(f"shipped_machine: file {path!r}: {e}") from None


def _check_number(x, field, positive=True):
  ok = (isinstance(x, (int, float, np.floating, np.integer)) and
        not isinstance(x, bool) and math.isfinite(x) and
        (x > 0 if positive else x >= 0))
  if not ok:
    need = "positive" if positive else "non-negative"
    raise ValueError(f"MachineConstants field {field!r} must be a {need} "
                     f"finite number, got {x!r}.")


def _check_kind(kind):
  if kind not in COLLECTIVE_KINDS:
    raise ValueError(f"Unknown collective kind {kind!r}; expected one of "
                     f"{list(COLLECTIVE_KINDS)}.")


def _dims_tuple(names):
  if isinstance(names, str):
    names = [n for n in names.split(",") if n]
  return tuple(names)


def _to_link(value, field):
  """A LinkConstants from a LinkConstants, a pair or a dict."""
  if isinstance(value, LinkConstants):
    return value
  if isinstance(value, dict):
    keys = ("latency_seconds", "seconds_per_wire_byte")
    if set(value) != set(keys):
      raise ValueError(f"MachineConstants field {field!r} needs exactly the "
                       f"keys {list(keys)}, got {sorted(value)}.")
    value = (value[keys[0]], value[keys[1]])
  if isinstance(value, (list, tuple)) and len(value) == 2:
    try:
      return LinkConstants(*value)
    except ValueError as e:
      raise ValueError(f"MachineConstants field {field!r}: {e}") from None
  raise ValueError(f"MachineConstants field {field!r} must be LinkConstants, "
                   f"(latency_seconds, seconds_per_wire_byte) or a dict of "
                   f"them, got {value!r}.")


def _normalize_collectives(value):
  """Sorted (kind, dims tuple, LinkConstants) triples."""
  if isinstance(value, dict):
    triples = []
    for kind, per_dims in value.items():
      if not isinstance(per_dims, dict):
        raise ValueError(f"MachineConstants field 'collectives[{kind!r}]' "
                         f"must map mesh dimension names to links, got "
                         f"{per_dims!r}.")
      triples.extend((kind, dims, link) for dims, link in per_dims.items())
  else:
    triples = list(value)
  out = {}
  for triple in triples:
    kind, dims, link = triple
    field = f"collectives[{kind!r}][{dims!r}]"
    if kind not in COLLECTIVE_KINDS:
      raise ValueError(f"MachineConstants field {field!r}: unknown "
                       f"collective kind; expected one of "
                       f"{list(COLLECTIVE_KINDS)}.")
    dims = _dims_tuple(dims)
    if not dims:
      raise ValueError(f"MachineConstants field {field!r}: no mesh "
                       "dimension names.")
    out[(kind, dims)] = _to_link(link, field)
  return tuple((k, d, out[(k, d)]) for k, d in sorted(out))


# ----------------------------------------------------------- calibration


@dataclasses.dataclass(frozen=True)
class _Plan:
  """How much calibration measures."""
  matmul_sizes: tuple
  elementwise_sizes: tuple
  collective_sizes: tuple  # (elements of a slice, calls per program)
  runs: int  # Timed runs per measurement (median).
  chain: int  # Element-wise ops per chain (large operands).
  tiny_chain: int  # The same, for tiny operands (op overhead).

_FULL = _Plan((256, 512, 1024), (1 << 18, 1 << 21),
              ((256, 16), (1 << 16, 8), (1 << 19, 4)), runs=11, chain=16,
              tiny_chain=256)
_QUICK = _Plan((256,), (1 << 16,), ((256, 4), (1 << 15, 2)), runs=3,
               chain=8, tiny_chain=64)
_TINY_ELEMENTS = 16  # An element-wise op this small costs its overhead.
_SKINNY_ROWS = 8  # Rows of the matmuls that measure matmul bytes.
_SLICE_ROWS = 64  # Divisible by every group size used in practice.
_SIMD_MAX_REPEATS = 2


def mesh_shape_of(mesh_shape):
  """An mtf.Shape from a spec: "b:2;m:4", [(name, size)...], mtf.Shape, or a
  list of sizes ([2, 4] names its dimensions mesh_0, mesh_1, as the
  original's auto_mtf does)."""
  if (isinstance(mesh_shape, (list, tuple)) and mesh_shape and
      all(isinstance(s, (int, np.integer)) for s in mesh_shape)):
    return shape_lib.Shape([shape_lib.Dimension(f"mesh_{i}", int(s))
                            for i, s in enumerate(mesh_shape)])
  return shape_lib.convert_to_shape(mesh_shape)


def mesh_spec(mesh_shape):
  """"b:2;m:4": the mesh as a layout-rules-style string."""
  return ";".join(f"{d.name}:{d.size}" for d in mesh_shape_of(mesh_shape))


def calibrate(mesh_shape, devices=None, mesh_impl="placement", quick=False):
  """Measures this machine's constants for a mesh.

  The mesh's figures are derived (`for_mesh`) from one measurement of its
  devices (`calibrate_devices`), which serves every mesh shape of them.

  Args:
    mesh_shape: the mesh, e.g. "b:2;m:4", [2, 4] or an mtf.Shape.
    devices: one device per processor (default: as the mesh implementation
      picks them).
    mesh_impl: "placement" (PlacementMeshImpl) or "simd" (SimdMeshImpl).
    quick: fewer sizes and runs (a few seconds; rougher figures).

  Returns:
    a MachineConstants.
  """
  shape = mesh_shape_of(mesh_shape)
  if devices is None:
    devices = _default_devices(shape.size, mesh_impl)
  return for_mesh(calibrate_devices(devices, mesh_impl, quick), shape)


def calibrate_devices(devices, mesh_impl="placement", quick=False):
  """Measures this machine's constants for any mesh of `devices`.

  Times, under tf.function on the devices: einsums of a few sizes
  (median FLOP rate on one device; concurrency from the same einsum on one
  device against on all at once, timed back to back, at the largest size;
  the byte rate of skinny einsums, whose time is mostly their
  operands' bytes), chains of element-wise ops on all devices at once (op
  overhead and byte rate; on PlacementMeshImpl also lowered mtf ones, for
  the overhead), and every collective of the mesh implementation for every
  group size g > 1 that divides the processor count (on a mesh of
  (count / g, g) processors, all groups at once, as in a step) at a few
  sizes, fitting latency and seconds per wire byte (least squares on
  relative error, clipped to >= 0). Each figure is the median of several
  runs after a warm-up, less the same program without the work.

  A collective's time is taken to depend on its group size, not on which
  processors form its groups (strided or adjacent): so every mesh shape of
  these devices shares this one measurement (`for_mesh` names its links
  by the mesh's dimensions).

  Args:
    devices: one device per processor (a list of device strings).
    mesh_impl: "placement" (PlacementMeshImpl) or "simd" (SimdMeshImpl).
    quick: fewer sizes and runs (a few seconds; rougher figures).

  Returns:
    a MachineConstants whose collectives are keyed by group size
    (`group_dimension_name`), not by a mesh's dimensions.
  """
  start = time.perf_counter()
  devices = list(devices)
  num = len(devices)
  if mesh_impl not in MESH_IMPLS:
    raise ValueError(f"calibrate: mesh_impl must be one of "
                     f"{list(MESH_IMPLS)}, got {mesh_impl!r}.")
  if not num:
    raise ValueError("calibrate: no devices to measure.")
  plan = _QUICK if quick else _FULL
  with tf.init_scope():
    if not tf.executing_eagerly():
      raise RuntimeError(
          "auto_mtf.machine.calibrate runs programs eagerly; call it outside "
          "tf.compat.v1 graph mode, or call load_or_calibrate (which "
          "measures in a fresh process there), or pass measured constants "
          "(machine_constants).")
    flat = shape_lib.Shape([shape_lib.Dimension("_processors", num)])
    impl = _make_mesh_impl(flat, devices, mesh_impl)
    devices = impl.devices
    compute = _calibrate_compute(devices, plan)
    if mesh_impl == "placement":
      # One lowered mtf operation on every processor takes
      # compute_seconds(0, 0, 1, P): the overhead per processor is its time
      # over the processors computing at once.
      compute["op_overhead_seconds"] = max(
          compute["op_overhead_seconds"],
          _mtf_op_seconds(flat, devices, plan) /
          max(1.0, impl.size / compute["concurrency"]),
          _cross_device_op_seconds(flat, devices, plan,
                                   compute["concurrency"]))
    collectives = []
    for group in _group_sizes(num):
      group_shape = shape_lib.Shape(
          ([shape_lib.Dimension("_groups", num // group)]
           if group < num else []) +
          [shape_lib.Dimension(group_dimension_name(group), group)])
      group_impl = _make_mesh_impl(group_shape, devices, mesh_impl)
      axis = group_shape.ndims - 1
      collectives.extend(_calibrate_collectives(
          group_impl, plan, [(kind, (axis,)) for kind in COLLECTIVE_KINDS]))
  links = [link for _, _, link in collectives]
  default = LinkConstants(
      statistics.median(l.latency_seconds for l in links),
      statistics.median(l.seconds_per_wire_byte for l in links)) if links \
      else LinkConstants(0.0, 0.0)
  seconds = time.perf_counter() - start
  key = cache_key([num], devices, mesh_impl)
  return MachineConstants(
      default_collective=default, collectives=tuple(collectives),
      source=(f"calibrated{' (quick)' if quick else ''}: {mesh_impl} on "
              f"{key['devices']}, TensorFlow {key['tensorflow']}, "
              f"{key['host_cpu']}"),
      calibration_seconds=seconds, wire_processors=num,
      share_replicas=bool(getattr(impl, "share_replicas", False)), **compute)


def group_dimension_name(group_size):
  """The dimension name under which `calibrate_devices` keeps the links of
  collectives over groups of `group_size` processors."""
  return f"_group_of_{group_size}"


def _group_sizes(num):
  return [g for g in range(2, num + 1) if num % g == 0]


def for_mesh(device_constants, mesh_shape):
  """The constants of one mesh, from `calibrate_devices`'s measurement.

  Every collective kind over a mesh dimension of size s gets the links
  measured for groups of s processors; an allreduce over several mesh
  dimensions those of their product; each kind's default ("*") is the
  median of its links over the mesh's dimensions, as a measurement of the
  mesh itself would give. A group size that was not measured (a mesh of
  another processor count) falls back to `default_collective`.

  Args:
    device_constants: a MachineConstants from `calibrate_devices`.
    mesh_shape: the mesh, e.g. "b:2;m:4", [2, 4] or an mtf.Shape.

  Returns:
    a MachineConstants whose collectives are named by the mesh's
    dimensions.
  """
  shape = mesh_shape_of(mesh_shape)
  by_group = {(kind, dims[0]): link
              for kind, dims, link in device_constants.collectives
              if len(dims) == 1}
  axes = [d for d in shape.dims if d.size > 1]
  collectives = []
  per_kind = collections.defaultdict(list)
  for dim in axes:
    for kind in COLLECTIVE_KINDS:
      link = by_group.get((kind, group_dimension_name(dim.size)))
      if link is not None:
        collectives.append((kind, (dim.name,), link))
        per_kind[kind].append(link)
  for count in range(2, len(axes) + 1):
    for subset in itertools.combinations(axes, count):
      size = shape_lib.list_product(d.size for d in subset)
      link = by_group.get(("allreduce", group_dimension_name(size)))
      if link is not None:
        collectives.append(
            ("allreduce", tuple(d.name for d in subset), link))
  for kind, kind_links in per_kind.items():
    collectives.append((kind, _ANY_DIMS, LinkConstants(
        statistics.median(l.latency_seconds for l in kind_links),
        statistics.median(l.seconds_per_wire_byte for l in kind_links))))
  return dataclasses.replace(
      device_constants, collectives=tuple(collectives),
      source=f"{device_constants.source}; mesh {mesh_spec(shape)}")


def measure_mesh_collectives(mesh_shape, devices=None, mesh_impl="placement",
                             quick=False):
  """The links of every collective kind over every dimension of a mesh (and
  allreduce over all of them), measured on that mesh itself: what
  `for_mesh` derives from group sizes, for checking the derivation
  (benchmarks/calibrate.py --compare_mesh).

  Returns:
    (kind, mesh dimension names, LinkConstants) triples.
  """
  shape = mesh_shape_of(mesh_shape)
  if devices is None:
    devices = _default_devices(shape.size, mesh_impl)
  axes = [i for i, d in enumerate(shape.dims) if d.size > 1]
  cases = [(kind, (a,)) for a in axes for kind in COLLECTIVE_KINDS]
  if len(axes) > 1:
    cases.append(("allreduce", tuple(axes)))
  with tf.init_scope():
    impl = _make_mesh_impl(shape, devices, mesh_impl)
    return _calibrate_collectives(impl, _QUICK if quick else _FULL, cases)


def _default_devices(num, mesh_impl):
  del mesh_impl  # Both implementations pick the same devices.
  return placement_mesh_impl.default_devices(num)


def _make_mesh_impl(shape, devices, mesh_impl):
  if mesh_impl == "placement":
    return placement_mesh_impl.PlacementMeshImpl(shape, "", devices)
  if mesh_impl == "simd":
    return simd_mesh_impl.SimdMeshImpl(shape, "", devices)
  raise ValueError(f"calibrate: mesh_impl must be one of {list(MESH_IMPLS)}, "
                   f"got {mesh_impl!r}.")


def _median_seconds(fn, args, runs, base=None, warmup=2):
  """Median wall time of fn(*args) (a tf.function: returns when done),
  less that of base(*args) if given.

  Calls of fn and base alternate and the median is of their differences,
  so that load changing during the measurement cancels out.
  """
  for _ in range(warmup):
    fn(*args)
    if base is not None:
      base(*args)
  diffs = []
  for i in range(runs):
    pair = [fn] if base is None else ([fn, base] if i % 2 else [base, fn])
    seconds = {}
    for f in pair:
      t = time.perf_counter()
      f(*args)
      seconds[id(f)] = time.perf_counter() - t
    diffs.append(seconds[id(fn)] - (0.0 if base is None else
                                    seconds[id(base)]))
  return statistics.median(diffs)


def _on_device_identity(value):
  with tf.device(value.device):
    return tf.identity(value)


def _on(device, value):
  with tf.device(device):
    return tf.identity(tf.convert_to_tensor(value))


def _identity_program(n):
  return tf.function(lambda *xs: list(xs[:n]), autograph=False)


def _calibrate_compute(devices, plan):
  """flops_per_second, elementwise_bytes_per_second, op_overhead_seconds and
  concurrency, fitted so that compute_seconds matches all devices working
  at once."""
  rng = np.random.default_rng(0)
  num = len(devices)
  einsum = tf.function(lambda a, b: tf.einsum("ij,jk->ik", a, b),
                       autograph=False)
  identity = _identity_program(1)

  def all_einsums(*xs):
    outs = []
    for d, x in zip(devices, xs):
      with tf.device(d):
        outs.append(tf.einsum("ij,jk->ik", x, x))
    return outs

  all_einsums = tf.function(all_einsums, autograph=False)
  rates, ratios = [], []
  for n in plan.matmul_sizes:
    # One device, then the same einsum on every device at once, back to
    # back (the machine's load drifts): their ratio at every size.
    a = _on(devices[0], rng.random((n, n), np.float32))
    t = max(_median_seconds(einsum, [a, a], plan.runs, identity), 1e-9)
    rates.append(2.0 * n ** 3 / t)
    inputs = [_on(d, rng.random((n, n), np.float32)) for d in devices]
    t_all = max(_median_seconds(all_einsums, inputs, plan.runs,
                                _identity_program(num)), 1e-9)
    ratios.append(num * t / t_all)
  # Concurrency from the largest einsum only: at small sizes one device
  # leaves cores idle that others fill, but a step's time is its large
  # einsums, which already use every core (the median over sizes read
  # 1.0-1.3 on a 2-core host and ranked data parallelism too cheap).
  concurrency = min(float(num), max(1.0, ratios[-1]))
  slowdown = max(1.0, num / concurrency)
  flops_per_second = statistics.median(rates)
  matmul_bytes_per_second = _matmul_bytes_per_second(
      devices[0], plan, flops_per_second, rng)

  # Chains of element-wise ops, every device at once.
  overhead = _elementwise_op_seconds(devices, _TINY_ELEMENTS,
                                     plan.tiny_chain, plan.runs,
                                     rng) / slowdown
  byte_rates = []
  for size in plan.elementwise_sizes:
    op = _elementwise_op_seconds(devices, size, plan.chain, plan.runs,
                                 rng) / slowdown
    nbytes = 3 * 4 * size  # Two float32 inputs read, one output written.
    byte_rates.append(nbytes / max(op - overhead, op / 2))
  return dict(flops_per_second=flops_per_second,
              elementwise_bytes_per_second=statistics.median(byte_rates),
              op_overhead_seconds=overhead, concurrency=concurrency,
              matmul_bytes_per_second=matmul_bytes_per_second)


def _matmul_bytes_per_second(device, plan, flops_per_second, rng):
  """Bytes per second of einsum operands and results on one device: from
  skinny matmuls (a few rows against a square weight, and the weight
  gradient of a few rows), whose time is mostly their bytes, less their
  FLOPs at `flops_per_second`. (A fit of both rates to matmuls of many
  shapes is ill-conditioned on a loaded machine: FLOPs and bytes grow
  together; this split is stable.)"""
  n = plan.matmul_sizes[-1]
  rows = _SKINNY_ROWS
  x = _on(device, rng.random((rows, n), np.float32))
  w = _on(device, rng.random((n, n), np.float32))
  nbytes = 4 * (2 * rows * n + n * n)  # Either form reads/writes these.
  rates = []
  for equation, operands in (("bi,ih->bh", [x, w]), ("bi,bh->ih", [x, x])):
    einsum = tf.function(
        lambda a, b, equation=equation: tf.einsum(equation, a, b),
        autograph=False)
    t = _median_seconds(einsum, operands, plan.runs, _identity_program(1))
    t_bytes = max(t - 2.0 * rows * n * n / flops_per_second, t / 4, 1e-9)
    rates.append(nbytes / t_bytes)
  return statistics.median(rates)


def _elementwise_op_seconds(devices, size, chain, runs, rng):
  """Seconds per element-wise op (2 float32 inputs of `size`, 1 output)
  while every device runs a dependent chain of them."""
  scale = [_on(d, np.full([size], 0.5, np.float32)) for d in devices]
  floor = [_on(d, rng.random([size], np.float32)) for d in devices]
  num = len(devices)

  def chains(*xs):
    outs = []
    for d, c, x in zip(devices, xs[:num], xs[num:]):
      with tf.device(d):
        y = x
        for _ in range(chain // 2):  # Alternate ops: nothing fuses.
          y = tf.maximum(y * c, x)
        outs.append(y)
    return outs

  t = _median_seconds(tf.function(chains, autograph=False), scale + floor,
                      runs, _identity_program(2 * num))
  return max(t, 1e-9) / (2 * (chain // 2))


def _mtf_op_seconds(shape, devices, plan):
  """Seconds one element-wise mtf operation adds to a step when its small
  operands are split over every mesh dimension (PlacementMeshImpl): the
  per-operation cost of the lowering (one TF op per slice, the executor's
  scheduling across devices) that element-wise chains of raw TF ops miss.
  From chains of two lengths, so the import and export cancel."""
  # Imported here: the package imports this module's package.
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  dims = [mtf.Dimension(f"_calibration_{i}", d.size * 4)
          for i, d in enumerate(shape.dims)]
  layout = ";".join(f"_calibration_{i}:{d.name}"
                    for i, d in enumerate(shape.dims))
  impl = placement_mesh_impl.PlacementMeshImpl(shape, layout, devices)
  x = tf.constant(np.full([d.size for d in dims], 0.5, np.float32))

  def chain_program(length):
    def program(value):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "calibration")
      t = mtf.import_tf_tensor(mesh, value, mtf.Shape(dims))
      y = t
      for _ in range(length // 2):  # Alternate ops: nothing fuses.
        y = mtf.maximum(y * 0.5, t)
      lowering = mtf.Lowering(graph, {mesh: impl})
      return lowering.export_to_tf_tensor(y)
    return tf.function(program, autograph=False)

  short, long = plan.tiny_chain // 8, plan.tiny_chain // 2
  seconds = _median_seconds(chain_program(long), [x], plan.runs,
                            chain_program(short))
  return max(seconds, 0.0) / (long - short)


def cross_device_chain(shape, devices, length):
  """A tf.function of one argument pair (x, r) running `length` // 2 steps
  of a lowered mtf chain whose every step crosses devices, as a step's
  shared replicas and collectives do: a replicated factor, computed once
  (shared replicas, on the first processor), scales a tensor split over
  every mesh dimension, so each step's op on every other processor reads
  the factor from the first one's device. Each step is 2 mtf operations
  on one processor (the factor) and 2 on every processor."""
  # The package imports auto_mtf, so its top level imports it lazily.
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  split = [mtf.Dimension(f"_calibration_{i}", d.size * 4)
           for i, d in enumerate(shape.dims)]
  factor = mtf.Dimension("_calibration_factor", 4)
  layout = ";".join(f"_calibration_{i}:{d.name}"
                    for i, d in enumerate(shape.dims))
  impl = placement_mesh_impl.PlacementMeshImpl(shape, layout, devices)

  def program(x_value, r_value):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "calibration")
    x = mtf.import_tf_tensor(mesh, x_value, mtf.Shape(split + [factor]))
    r0 = mtf.import_tf_tensor(mesh, r_value, mtf.Shape([factor]))
    y, r = x, r0
    for _ in range(length // 2):  # Alternate ops: nothing fuses.
      r = mtf.maximum(r * 0.5, r0)
      y = mtf.maximum(y * r, x)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(y)

  inputs = [tf.constant(np.full([d.size for d in split] + [factor.size],
                                0.5, np.float32)),
            tf.constant(np.full([factor.size], 0.5, np.float32))]
  return tf.function(program, autograph=False), inputs


def _cross_device_op_seconds(shape, devices, plan, concurrency):
  """The op overhead (MachineConstants.op_overhead_seconds) that prices
  cross_device_chain's steps as measured: a step is 2 operations on one
  processor and 2 on all P, compute_seconds(0, 0, 2, 1) +
  compute_seconds(0, 0, 2, P), from chains of two lengths (the import and
  export cancel). Lowered steps cross devices wherever replicas share a
  slice or a collective runs, which an executor pays for (a chain on
  each processor's own device measured a third of it on 2 cores)."""
  short, long = plan.tiny_chain // 8, plan.tiny_chain // 2
  long_program, inputs = cross_device_chain(shape, devices, long)
  short_program, _ = cross_device_chain(shape, devices, short)
  seconds = _median_seconds(long_program, inputs, plan.runs, short_program)
  steps = (long - short) // 2
  per_step_ops = 2 + 2 * max(1.0, shape.size / concurrency)
  return max(seconds, 0.0) / steps / per_step_ops


def _apply_collective(impl, kind, axes, x):
  if kind == "allreduce":
    return impl.allreduce(x, list(axes), "SUM")
  if kind == "reduce_scatter":
    return impl.reduce_scatter(x, axes[0], 0)
  if kind == "allconcat":
    return impl.allconcat(x, axes[0], 0)
  if kind == "alltoall":
    return impl.alltoall(x, axes[0], 0, 0)
  return impl.shift_by_n_processors(x, axes[0], 1, wrap=True)


def _wire_bytes(impl, kind, axes, slice_bytes):
  """Wire bytes of one call (the counters' formula)."""
  n = shape_lib.list_product(impl.shape[a].size for a in axes)
  receivers = n if kind == "receive" else 0  # A wrapping shift by one.
  return mesh_impl_lib.collective_wire_bytes(kind, n, impl.size // n,
                                             slice_bytes, receivers)


def _calibrate_collectives(impl, plan, cases):
  """(kind, mesh dimension names, LinkConstants) for every case: a
  (kind, mesh axes) pair."""
  rng = np.random.default_rng(1)
  simd = isinstance(impl, simd_mesh_impl.SimdMeshImpl)
  points = {case: [] for case in cases}
  for elements, repeats in plan.collective_sizes:
    if simd:  # Tracing a SIMD program grows with its calls: keep it short.
      repeats = min(repeats, _SIMD_MAX_REPEATS)
    slice_shape = [_SLICE_ROWS, max(1, elements // _SLICE_ROWS)]
    slice_bytes = 4 * _SLICE_ROWS * slice_shape[1]
    timer = _simd_timer if simd else _placement_timer
    run = timer(impl, slice_shape, repeats, plan.runs, rng)
    for kind, axes in cases:
      t = run(kind, axes) / repeats
      points[(kind, axes)].append(
          (_wire_bytes(impl, kind, axes, slice_bytes), max(t, 0.0)))
  out = []
  for (kind, axes), kind_points in points.items():
    latency, per_byte = _fit_line(kind_points)
    names = tuple(impl.shape[a].name for a in axes)
    out.append((kind, names, LinkConstants(latency, per_byte)))
  return out


def _placement_timer(impl, slice_shape, repeats, runs, rng):
  """run(kind, axes): seconds of `repeats` independent calls of a
  collective on a PlacementMeshImpl, less the program without them."""
  num = impl.size
  inputs = [_on(impl.devices[p % num], rng.random(slice_shape, np.float32))
            for p in range(repeats * num)]
  base = _identity_program(len(inputs))

  def run(kind, axes):
    def program(*xs):
      # Each call waits for the previous one, as collectives on a step's
      # critical path do (independent calls would overlap).
      outs = []
      previous = []
      for r in range(repeats):
        slices = list(xs[r * num:(r + 1) * num])
        if previous:
          with tf.control_dependencies(previous):
            slices = [_on_device_identity(v) for v in slices]
        x = mesh_impl_lib.LaidOutTensor(slices)
        previous = _apply_collective(impl, kind, axes, x).tensor_list
        outs.extend(previous)
      return outs
    return _median_seconds(tf.function(program, autograph=False), inputs,
                           runs, base)

  return run


def _simd_timer(impl, slice_shape, repeats, runs, rng):
  """Like _placement_timer, for a SimdMeshImpl (through its `run`).

  `run` keeps one traced program, so the program without the collectives
  is timed once, not alternately.
  """
  inputs = [tf.constant(rng.random(slice_shape, np.float32))
            for _ in range(repeats)]

  def identity(*xs):
    return list(xs)

  base = _median_seconds(lambda *xs: impl.run(identity, *xs), inputs, runs)

  def run(kind, axes):
    def program(*xs):
      return [_apply_collective(impl, kind, axes,
                                mesh_impl_lib.LaidOutTensor([x])).one_slice
              for x in xs]
    return _median_seconds(lambda *xs: impl.run(program, *xs), inputs,
                           runs) - base

  return run


def _fit_line(points):
  """(intercept, slope) >= 0 of t = a + b x over (x, t) points, least
  squares on relative error.

  A time below 5% of the largest (a small size, or a measurement lost in
  noise and clipped to 0) is weighted as if it were 5%, so that one such
  point cannot decide the fit alone.
  """
  x = np.array([p[0] for p in points], np.float64)
  t = np.array([p[1] for p in points], np.float64)
  if len(set(x.tolist())) < 2 or not np.any(t > 0):
    return float(np.median(t)), 0.0
  w = 1.0 / np.maximum(t, max(0.05 * float(np.max(t)), 1e-9))
  a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
  (intercept, slope), *_ = np.linalg.lstsq(a, t * w, rcond=None)
  if slope < 0:
    return float(np.median(t)), 0.0
  if intercept < 0:
    return 0.0, float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
  return float(intercept), float(slope)


# ----------------------------------------------------------------- cache


def default_cache_dir():
  """$MTF_AUTO_MTF_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache, under
  mesh_tensorflow/auto_mtf."""
  if os.environ.get(CACHE_DIR_ENV):
    return os.environ[CACHE_DIR_ENV]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "mesh_tensorflow", "auto_mtf")


def _host_cpu():
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown"


def cache_key(mesh_shape, devices, mesh_impl, quick=False):
  """What the constants depend on: device kinds and count, the mesh
  implementation, TensorFlow's version and the host's CPU (and whether the
  measurement was quick: its rougher figures are kept apart). Not the
  mesh's shape: every mesh of these devices shares one measurement
  (`calibrate_devices`); `mesh_shape` must have one processor per device.
  """
  shape = mesh_shape_of(mesh_shape)
  if shape.size != len(devices):
    raise ValueError(f"auto_mtf: mesh {mesh_spec(shape)} has {shape.size} "
                     f"processors but {len(devices)} devices were given "
                     f"({list(devices)}); give one device per processor.")
  kinds = collections.Counter(
      (tf.DeviceSpec.from_string(d).device_type or "?").upper()
      for d in sorted(set(devices)))
  key = {
      "format": _CACHE_FORMAT,
      "devices": ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
      "num_processors": len(devices),
      "mesh_impl": mesh_impl,
      "tensorflow": tf.__version__,
      "host_cpu": _host_cpu(),
      "host_cores": os.cpu_count(),
  }
  if quick:
    key["quick"] = True
  return key


def cache_path(mesh_shape, devices=None, mesh_impl="placement",
               cache_dir=None, quick=False):
  """The cache file of this machine's devices (one for every mesh shape
  of them)."""
  shape = mesh_shape_of(mesh_shape)
  if devices is None:
    devices = placement_mesh_impl.default_devices(shape.size)
  key = cache_key(shape, list(devices), mesh_impl, quick)
  digest = hashlib.sha256(
      json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  return os.path.join(cache_dir or default_cache_dir(),
                      f"machine_{digest}.json")


def load_cached(mesh_shape, devices=None, mesh_impl="placement",
                cache_dir=None, quick=False):
  """(MachineConstants of the mesh, cache key) from the cached measurement
  of this machine's devices, or None. A quick request takes a full
  measurement too; a corrupt cache file counts as missing, with a
  warning."""
  shape = mesh_shape_of(mesh_shape)
  if devices is None:
    devices = placement_mesh_impl.default_devices(shape.size)
  devices = list(devices)
  for quick_entry in (False, True) if quick else (False,):
    key = cache_key(shape, devices, mesh_impl, quick_entry)
    path = cache_path(shape, devices, mesh_impl, cache_dir, quick_entry)
    if not os.path.exists(path):
      continue
    try:
      with open(path) as f:
        entry = json.load(f)
      if entry.get("key") == key:
        return for_mesh(MachineConstants.from_dict(entry["constants"]),
                        shape), key
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      message = (f"auto_mtf: machine constants cache {path} is unreadable "
                 f"({e}); measuring again.")
      warnings.warn(message)
      logging.warning(message)
  return None


def load_or_calibrate(mesh_shape, devices=None, mesh_impl="placement",
                      cache_dir=None, refresh=False, quick=False):
  """The cached constants of this machine and mesh, else calibrates.

  The cache holds one measurement of the mesh's devices
  (`calibrate_devices`), from which every mesh shape of them takes its
  figures (`for_mesh`): a search over mesh shapes measures once.
  Calibration runs in this process when it can run programs eagerly, else
  (tf.compat.v1 graph mode) in a fresh Python process given this
  process's logical CPUs and devices (the calibration command of module
  `calibration`), which measures the same devices.

  Args:
    mesh_shape: the mesh, e.g. "b:2;m:4", [2, 4] or an mtf.Shape.
    devices: one device per processor (default: the mesh implementation's).
    mesh_impl: "placement" or "simd".
    cache_dir: where the cache lives (default: `default_cache_dir()`).
    refresh: measure again even if cached.
    quick: a quick calibration (see `calibrate`) if none is cached; a full
      one cached serves too.

  Returns:
    a MachineConstants. A new measurement is written atomically; a corrupt
    cache file is measured again with a warning.

  Raises:
    CalibrationError: the measurement failed (its message says how to
      measure with the calibration command, or to do without).
  """
  if mesh_impl not in MESH_IMPLS:
    raise ValueError(f"load_or_calibrate: mesh_impl must be one of "
                     f"{list(MESH_IMPLS)}, got {mesh_impl!r}.")
  shape = mesh_shape_of(mesh_shape)
  given_devices = None if devices is None else list(devices)
  devices = given_devices or placement_mesh_impl.default_devices(shape.size)
  if not refresh:
    cached = load_cached(shape, devices, mesh_impl, cache_dir, quick)
    if cached is not None:
      return cached[0]
  cache_dir = cache_dir or default_cache_dir()
  args = calibration_subprocess.command_args(
      mesh_spec(shape), mesh_impl,
      len(tf.config.list_logical_devices("CPU")), cache_dir, quick=quick,
      refresh=refresh, devices=given_devices)
  command = calibration_subprocess.shell_command(args)
  key = cache_key(shape, devices, mesh_impl, quick)
  logging.info("auto_mtf: measuring this machine's constants for every "
               "mesh of %d processors (%s on %s%s; cached in %s)",
               shape.size, mesh_impl, key["devices"],
               ", quick" if quick else "", cache_dir)
  if not _runs_eagerly():
    constants = calibration_subprocess.run(
        args, devices, [cache_key(shape, devices, mesh_impl, q)
                        for q in ((False, True) if quick else (False,))])
    try:
      return MachineConstants.from_dict(constants)
    except (ValueError, TypeError) as e:
      raise CalibrationError(f"the calibration process gave unreadable "
                             f"constants ({e})", command) from None
  try:
    constants = calibrate_devices(devices, mesh_impl, quick=quick)
  except (tf.errors.OpError, RuntimeError) as e:
    raise CalibrationError(f"{type(e).__name__}: {e}", command) from e
  path = cache_path(shape, devices, mesh_impl, cache_dir, quick)
  try:
    _write_atomically(path, json.dumps(
        {"key": key, "constants": constants.to_dict()}, sort_keys=True,
        indent=1))
  except OSError as e:
    logging.warning("auto_mtf: could not cache machine constants in %s: %s",
                    path, e)
  return for_mesh(constants, shape)


def _runs_eagerly():
  """Whether this process can run calibration's programs now: eagerly, or
  from inside a tf.function (lifted out by init_scope)."""
  with tf.init_scope():
    return tf.executing_eagerly()


def _write_atomically(path, text):
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".machine_", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
