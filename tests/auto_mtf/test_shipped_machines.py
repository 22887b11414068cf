"""The machine-constant files shipped in mesh_tensorflow/auto_mtf/machines/.

Each loads through machine.machine_constants (by path and by name) and has
the magnitudes of its hardware's public figures: a wrong unit (bits for
bytes, per chip for per core, a lost exponent) moves a figure out of its
range.
"""

import dataclasses
import json
import os

import pytest

from mesh_tensorflow.auto_mtf import machine

GIB = 1 << 30

# name: (flops per second, HBM bytes per second, memory bytes), each a
# (low, high) range.
RANGES = {
    "tpu_v3_pod": ((1e13, 1e15), (1e11, 1e12), (15 * GIB, 17 * GIB)),
    "gpu_8x_node": ((1e14, 1e15), (1e12, 3e12), (35 * GIB, 41 * GIB)),
}
# name: the processors its per-wire-byte costs are for (its source says so).
WIRE_PROCESSORS = {"tpu_v3_pod": 512, "gpu_8x_node": 8}


def test_every_shipped_file_is_listed():
  assert sorted(machine.shipped_machine_names()) == sorted(RANGES)
  files = sorted(os.listdir(machine.SHIPPED_MACHINES_DIR))
  assert files == sorted(f"{name}.json" for name in RANGES)


@pytest.mark.parametrize("name", sorted(RANGES))
def test_shipped_machine_loads_with_sane_magnitudes(name):
  path = os.path.join(machine.SHIPPED_MACHINES_DIR, f"{name}.json")
  constants = machine.machine_constants(path)
  assert machine.shipped_machine(name) == constants
  assert machine.shipped_machine_path(name) == path
  assert machine.shipped_machine(f"{name}.json") == constants
  # A bare name is a shipped file, as --machine=tpu_v3_pod would give it.
  assert machine.machine_constants(name) == constants
  flops, hbm, memory = RANGES[name]
  assert flops[0] < constants.flops_per_second < flops[1]
  assert hbm[0] < constants.elementwise_bytes_per_second < hbm[1]
  assert memory[0] <= constants.memory_bytes_per_processor <= memory[1]
  assert constants.concurrency >= 8
  assert not constants.share_replicas
  assert len(constants.source) > 200  # Says where every figure comes from.
  assert constants.wire_processors == WIRE_PROCESSORS[name]
  assert f"{WIRE_PROCESSORS[name]}/P" in constants.source
  # Every kind has its own default link; a collective of 1 GB over all
  # processors takes between a microsecond and a second.
  kinds = {kind for kind, dims, _ in constants.collectives
           if dims == ("*",)}
  assert kinds == set(machine.COLLECTIVE_KINDS)
  for kind in machine.COLLECTIVE_KINDS:
    seconds = constants.collective_seconds(kind, ("any",), 1e9)
    assert 1e-6 < seconds < 1.0, (kind, seconds)
  # The file holds exactly what to_dict writes back (no stray fields).
  with open(path) as f:
    assert machine.MachineConstants.from_dict(json.load(f)) == constants


def test_tpu_allreduce_is_faster_per_byte_than_alltoall_and_shift():
  tpu = machine.shipped_machine("tpu_v3_pod")
  per_byte = {k: tpu.link(k, ("x",)).seconds_per_wire_byte
              for k in machine.COLLECTIVE_KINDS}
  assert per_byte["allreduce"] < per_byte["receive"] < per_byte["alltoall"]


def test_memory_per_processor_round_trips_and_defaults_to_unknown():
  tpu = machine.shipped_machine("tpu_v3_pod")
  assert tpu.memory_bytes_per_processor == 16 * GIB
  assert machine.MachineConstants.from_json(tpu.to_json()) == tpu
  d = tpu.to_dict()
  del d["memory_bytes_per_processor"]  # A file written before the field.
  assert machine.MachineConstants.from_dict(d).memory_bytes_per_processor == 0
  d["memory_bytes_per_processor"] = -1
  with pytest.raises(ValueError, match="memory_bytes_per_processor"):
    machine.MachineConstants.from_dict(d)


def test_unknown_shipped_name_lists_the_shipped_ones():
  with pytest.raises(ValueError, match="tpu_v3_pod"):
    machine.shipped_machine("tpu_v9")
  with pytest.raises(ValueError, match="tpu_v3_pod"):
    machine.shipped_machine_path("../machines/tpu_v3_pod")
  with pytest.raises(ValueError, match="gpu_8x_node"):
    machine.machine_constants("tpu_v9")


def test_per_wire_byte_costs_scale_with_the_processor_count():
  tpu = machine.shipped_machine("tpu_v3_pod")
  assert tpu.for_processors(512) == tpu
  pod = tpu.for_processors(1024)  # Twice the processors sending at once.
  assert pod.wire_processors == 1024
  for kind in machine.COLLECTIVE_KINDS:
    old, new = tpu.link(kind, ("x",)), pod.link(kind, ("x",))
    assert new.seconds_per_wire_byte == pytest.approx(
        old.seconds_per_wire_byte / 2, rel=1e-12)
    assert new.latency_seconds == old.latency_seconds
  assert pod.default_collective.seconds_per_wire_byte == pytest.approx(
      tpu.default_collective.seconds_per_wire_byte / 2, rel=1e-12)
  # Compute figures are per processor: unchanged.
  assert (pod.flops_per_second, pod.concurrency) == (
      tpu.flops_per_second, tpu.concurrency)
  assert tpu.compute_seconds(1e9, 0, 0, 512) == tpu.compute_seconds(
      1e9, 0, 0, 1)  # concurrency 2048: 512 cores all at full speed.
  assert machine.MachineConstants.from_json(pod.to_json()) == pod
  gpu = machine.shipped_machine("gpu_8x_node").for_processors(4)
  assert gpu.link("allreduce", ("x",)).seconds_per_wire_byte == (
      pytest.approx(2 / (8 * 300e9), rel=1e-9))
  with pytest.raises(ValueError, match="for_processors"):
    tpu.for_processors(0)


def test_wire_processors_round_trips_and_defaults_to_not_given():
  tpu = machine.shipped_machine("tpu_v3_pod")
  assert machine.MachineConstants.from_dict(tpu.to_dict()) == tpu
  d = tpu.to_dict()
  del d["wire_processors"]  # A file written before the field.
  old = machine.MachineConstants.from_dict(d)
  assert old.wire_processors == 0
  assert old.for_processors(1024) is old  # Not given: taken as is.
  d["wire_processors"] = 2.5
  with pytest.raises(ValueError, match="wire_processors"):
    machine.MachineConstants.from_dict(d)


def test_plan_scales_the_machine_to_its_processor_count():
  pytest.importorskip("ortools")
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow.auto_mtf  # pylint: disable=g-import-not-at-top,unused-import
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    b, io = mtf.Dimension("batch", 8), mtf.Dimension("io", 512)
    h = mtf.Dimension("hidden", 512)
    x = mtf.import_tf_tensor(mesh, tf.zeros([8, 512]), mtf.Shape([b, io]))
    w1 = mtf.get_variable(mesh, "w1", [io, h])
    w2 = mtf.get_variable(mesh, "w2", [h, io])
    y = mtf.einsum([mtf.einsum([x, w1], [b, h]), w2], [b, io])
    loss = mtf.reduce_mean(mtf.square(y))
    grads = mtf.gradients([loss], [w1, w2])
  gpu = machine.shipped_machine("gpu_8x_node")

  def step_time(constants):
    # A budget below the weights and their gradients (4 MiB) forces a
    # split, so a collective.
    return mtf.auto_mtf.plan(graph, 2, memory_budget=2.5 * (1 << 20),
                             machine=constants,
                             mtf_outputs=[loss] + grads).step_time

  given = step_time(gpu)
  assert given.collectives > 0
  assert given == step_time(gpu.for_processors(2))
  assert given != step_time(dataclasses.replace(gpu, wire_processors=0))
