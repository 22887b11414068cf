"""auto_mtf.machine: machine constants, their calibration and cache."""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow.auto_mtf import machine

KINDS = mesh_impl_lib.COLLECTIVE_KINDS


def _user_dict():
  return {
      "flops_per_second": 1e12,
      "elementwise_bytes_per_second": 1e11,
      "op_overhead_seconds": 2e-6,
      "concurrency": 4,
      "default_collective": {"latency_seconds": 1e-4,
                             "seconds_per_wire_byte": 1e-9},
      "collectives": {
          "allreduce": {"x": [1e-5, 2e-10], "y": [3e-5, 4e-10],
                        "x,y": [5e-5, 1e-10]},
          "alltoall": {"*": [7e-5, 6e-10]},
      },
  }


def _constants():
  return machine.machine_constants(_user_dict())


# ------------------------------------------------------------ (de)serialize


def test_json_and_dict_round_trip():
  c = _constants()
  assert machine.MachineConstants.from_json(c.to_json()) == c
  assert machine.MachineConstants.from_dict(c.to_dict()) == c
  assert hash(machine.MachineConstants.from_json(c.to_json())) == hash(c)
  assert json.loads(c.to_json())["collectives"]["allreduce"]["x,y"] == {
      "latency_seconds": 5e-5, "seconds_per_wire_byte": 1e-10}


def test_user_figures_from_dict_json_and_file(tmp_path):
  c = _constants()
  path = tmp_path / "pod.json"
  path.write_text(json.dumps(_user_dict()))
  assert machine.machine_constants(c) is c
  assert machine.machine_constants(json.dumps(_user_dict())) == c
  assert machine.machine_constants(str(path)) == c
  assert machine.machine_constants(path) == c
  built = machine.MachineConstants(
      1e12, 1e11, 2e-6, 4, machine.LinkConstants(1e-4, 1e-9),
      (("allreduce", ("x",), machine.LinkConstants(1e-5, 2e-10)),
       ("allreduce", ("y",), (3e-5, 4e-10)),
       ("allreduce", "x,y", {"latency_seconds": 5e-5,
                             "seconds_per_wire_byte": 1e-10}),
       ("alltoall", ("*",), [7e-5, 6e-10])))
  assert built == c


@pytest.mark.parametrize("field", ["flops_per_second",
                                   "elementwise_bytes_per_second",
                                   "op_overhead_seconds", "concurrency",
                                   "default_collective"])
def test_missing_field_is_named(field):
  d = _user_dict()
  del d[field]
  with pytest.raises(ValueError, match=field):
    machine.machine_constants(d)


@pytest.mark.parametrize("field", ["flops_per_second",
                                   "elementwise_bytes_per_second",
                                   "op_overhead_seconds", "concurrency"])
def test_negative_value_is_named(field):
  d = _user_dict()
  d[field] = -1.0
  with pytest.raises(ValueError, match=field):
    machine.machine_constants(d)


def test_bad_links_and_unknown_fields_are_named(tmp_path):
  d = _user_dict()
  d["collectives"]["allreduce"]["x"] = [-1e-5, 1e-10]
  with pytest.raises(ValueError, match="latency_seconds"):
    machine.machine_constants(d)
  d = _user_dict()
  d["collectives"]["allgather"] = {"x": [1e-5, 1e-10]}
  with pytest.raises(ValueError, match="allgather"):
    machine.machine_constants(d)
  d = _user_dict()
  d["default_collective"] = {"latency_seconds": 1e-5}
  with pytest.raises(ValueError, match="seconds_per_wire_byte"):
    machine.machine_constants(d)
  d = _user_dict()
  d["flops_per_sec"] = 1e12
  with pytest.raises(ValueError, match="flops_per_sec"):
    machine.machine_constants(d)
  with pytest.raises(ValueError, match="no_such.json"):
    machine.machine_constants(str(tmp_path / "no_such.json"))
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(ValueError, match="bad.json"):
    machine.machine_constants(bad)


# -------------------------------------------------------------- predictions


def test_compute_seconds_is_linear_and_monotonic():
  c = _constants()
  a, b = (3e9, 4e8, 120), (1e9, 2e6, 7)
  both = tuple(x + y for x, y in zip(a, b))
  for p in (1, 8, 64):
    assert c.compute_seconds(*both, p) == pytest.approx(
        c.compute_seconds(*a, p) + c.compute_seconds(*b, p), rel=1e-12)
    assert c.compute_seconds(0, 0, 0, p) == 0
    for i in range(3):
      more = list(a)
      more[i] *= 2
      assert c.compute_seconds(*more, p) > c.compute_seconds(*a, p)
  # Up to `concurrency` processors run at full speed; beyond, they share.
  assert c.compute_seconds(*a, 4) == c.compute_seconds(*a, 1)
  assert c.compute_seconds(*a, 8) == pytest.approx(
      2 * c.compute_seconds(*a, 1))
  with pytest.raises(ValueError, match="num_processors"):
    c.compute_seconds(*a, 0)


def test_matmul_bytes_have_their_own_rate():
  d = _user_dict()
  plain = machine.machine_constants(d)
  # Unset: einsum bytes cost as element-wise bytes do.
  assert plain.compute_seconds(0, 0, 0, 1, matmul_bytes=1e9) == (
      pytest.approx(plain.compute_seconds(0, 1e9, 0, 1)))
  d["matmul_bytes_per_second"] = 1e9
  slow = machine.machine_constants(d)
  assert slow.compute_seconds(0, 0, 0, 1, matmul_bytes=3e9) == (
      pytest.approx(3.0))
  assert slow.compute_seconds(1e12, 1e11, 0, 8, matmul_bytes=1e9) == (
      pytest.approx(2 * (1 + 1 + 1)))
  assert machine.MachineConstants.from_json(slow.to_json()) == slow
  d["matmul_bytes_per_second"] = -1
  with pytest.raises(ValueError, match="matmul_bytes_per_second"):
    machine.machine_constants(d)


def test_collective_seconds_is_linear_and_monotonic():
  c = _constants()
  for kind in KINDS:
    for dims in [("x",), ("y",), ("x", "y"), ("z",)]:
      latency = c.link(kind, dims).latency_seconds
      f = lambda w, kind=kind, dims=dims: c.collective_seconds(kind, dims, w)
      assert f(3e6 + 5e5) == pytest.approx(f(3e6) + f(5e5) - latency)
      assert f(1e6) >= f(1e3) >= f(0) == pytest.approx(latency)
  assert c.collective_seconds("allreduce", (), 1e6) == 0
  with pytest.raises(ValueError, match="allgather"):
    c.collective_seconds("allgather", ("x",), 1)


def test_links_measured_defaulted_and_combined():
  c = _constants()
  assert c.link("allreduce", ("x",)) == machine.LinkConstants(1e-5, 2e-10)
  assert c.link("allreduce", "x") == c.link("allreduce", ("x",))
  # Measured over both dimensions, in either order.
  assert c.link("allreduce", ("y", "x")) == machine.LinkConstants(5e-5, 1e-10)
  # The kind's default, then the machine's.
  assert c.link("alltoall", ("x",)) == machine.LinkConstants(7e-5, 6e-10)
  assert c.link("receive", ("x",)) == c.default_collective
  assert c.link("allreduce", ("z",)) == c.default_collective
  # Not measured together: latencies add, the slowest per-byte cost counts.
  combined = c.link("allreduce", ("x", "z"))
  assert combined.latency_seconds == pytest.approx(1e-5 + 1e-4)
  assert combined.seconds_per_wire_byte == 1e-9


# -------------------------------------------------------------- wire bytes


def test_collective_wire_bytes_formula():
  wire = mesh_impl_lib.collective_wire_bytes
  # 2 groups of 4 members holding 100 bytes each.
  assert wire("allreduce", 4, 2, 100) == 2 * 2 * 3 * 100
  assert wire("reduce_scatter", 4, 2, 100) == 2 * 3 * 100
  assert wire("alltoall", 4, 2, 100) == 2 * 3 * 100
  assert wire("allconcat", 4, 2, 100) == 2 * 4 * 3 * 100
  assert wire("receive", 4, 2, 100, receivers=3) == 2 * 3 * 100
  assert wire("receive", 4, 2, 100) == 0
  # A reduce-scatter and the allconcat of its pieces equal an allreduce.
  assert (wire("reduce_scatter", 4, 2, 100) + wire("allconcat", 4, 2, 25) ==
          wire("allreduce", 4, 2, 100))
  with pytest.raises(ValueError, match="allgather"):
    wire("allgather", 4, 2, 100)


def _counted(impl, fn):
  """The counters of fn(view of `impl` counting its collectives)."""
  counts = {}
  fn(impl.counting(lambda k, v: counts.__setitem__(k, counts.get(k, 0) + v)))
  return counts


@pytest.mark.parametrize("mesh_impl", ["placement", "simd"])
def test_calibration_wire_bytes_are_the_counters(mesh_impl):
  """Every collective calibration times counts, in the lowering's
  counters, the wire bytes calibration fits against."""
  shape = machine.mesh_shape_of("b:2;m:4")
  impl = machine._make_mesh_impl(shape, None, mesh_impl)
  slice_shape = [8, 4]

  def one(kind, axes):
    def body(counted):
      if mesh_impl == "placement":
        x = mesh_impl_lib.LaidOutTensor(
            [tf.ones(slice_shape) * p for p in range(impl.size)])
        machine._apply_collective(counted, kind, axes, x)
      else:
        def program():
          x = mesh_impl_lib.LaidOutTensor([tf.ones(slice_shape)])
          return machine._apply_collective(counted, kind, axes,
                                           x).one_slice
        impl.trace_program(program)
    return _counted(impl, body)

  cases = [(kind, (a,)) for a in range(shape.ndims) for kind in KINDS]
  for kind, axes in cases + [("allreduce", (0, 1))]:
    counts = one(kind, axes)
    names = "_".join(shape.dims[a].name for a in axes)
    assert counts[f"comm/{kind}/{names}/wire_bytes"] == machine._wire_bytes(
        impl, kind, axes, 4 * 8 * 4), (kind, axes)


def test_lowering_counters_use_the_formula():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, np.ones([8, 16], np.float32), "batch:8,io:16")
  w = mtf.import_tf_tensor(mesh, np.ones([16, 4], np.float32), "io:16,h:4")
  y = mtf.einsum([x, w], "batch:8,h:4")
  z = mtf.reduce_sum(y, reduced_dim=mtf.Dimension("batch", 8))
  shifted = mtf.shift(y, 1, mtf.Dimension("batch", 8), wrap=False)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("b:2;m:4",
                                                   "batch:b;io:m")
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(z)
  lowering.export_to_tf_tensor(shifted)
  counters = dict(lowering.counters)
  wire = mesh_impl_lib.collective_wire_bytes
  # The einsum sums over io, split over m: groups of 4, [4, 4] float32
  # slices; the batch sum then over b: groups of 2, [4] slices.
  assert counters["comm/allreduce/m/wire_bytes"] == wire(
      "allreduce", 4, 2, 4 * 4 * 4) * counters["comm/allreduce/m/calls"]
  assert counters["comm/allreduce/b/wire_bytes"] == wire(
      "allreduce", 2, 4, 4 * 4) * counters["comm/allreduce/b/calls"]
  # A shift by one row without wrap: the second member of each b group
  # receives the first one's last row, [1, h=4].
  assert counters["comm/receive/b/wire_bytes"] == wire(
      "receive", 2, 4, 1 * 4 * 4, receivers=1)


# -------------------------------------------------------------- calibration


# SimdMeshImpl traces a program per case (about 0.5 s each): a smaller mesh.
@pytest.mark.parametrize("mesh_impl,mesh_shape", [("placement", [2, 4]),
                                                  ("simd", [2, 2])],
                         ids=["placement_2x4", "simd_2x2"])
def test_quick_calibration_gives_sane_constants(mesh_impl, mesh_shape):
  c = machine.calibrate(mesh_shape, mesh_impl=mesh_impl, quick=True)
  for value in (c.flops_per_second, c.elementwise_bytes_per_second,
                c.matmul_bytes_per_second, c.concurrency):
    assert 0 < value < math.inf
  assert 0 <= c.op_overhead_seconds < math.inf
  assert 1 <= c.concurrency <= np.prod(mesh_shape)
  measured = {(kind, dims) for kind, dims, _ in c.collectives}
  total = 0.0
  for kind in KINDS:
    for dims in [("mesh_0",), ("mesh_1",)]:
      assert (kind, dims) in measured
      seconds = c.collective_seconds(kind, dims, 1 << 20)
      assert 0 <= seconds < math.inf
      total += seconds
  assert ("allreduce", ("mesh_0", "mesh_1")) in measured
  assert total > 0
  assert c.calibration_seconds > 0
  assert mesh_impl in c.source
  assert c.wire_processors == np.prod(mesh_shape)  # What the costs hold for.
  assert machine.MachineConstants.from_json(c.to_json()) == c


def test_fit_recovers_a_line_and_clips_at_zero():
  points = [(x, 2e-5 + 1e-10 * x) for x in (1e3, 1e6, 1e7)]
  latency, per_byte = machine._fit_line(points)
  assert latency == pytest.approx(2e-5) and per_byte == pytest.approx(1e-10)
  # Falling times: no negative per-byte cost.
  assert machine._fit_line([(1e3, 3e-3), (1e6, 1e-3)])[1] == 0
  # Rising faster than proportionally: no negative latency.
  latency, per_byte = machine._fit_line([(1e3, 1e-6), (1e6, 3e-3)])
  assert latency == 0 and per_byte > 0


def test_calibrate_names_a_bad_mesh_impl():
  with pytest.raises(ValueError, match="tpu_pod"):
    machine.calibrate([2, 4], mesh_impl="tpu_pod", quick=True)


# -------------------------------------------------------------------- cache


class _FakeCalibrate:
  """Stands in for measuring: returns fixed constants, counts calls."""

  def __init__(self):
    self.calls = 0

  def __call__(self, devices, mesh_impl="placement", quick=False):
    self.calls += 1
    d = _user_dict()
    d["flops_per_second"] = 1e9 * self.calls
    return machine.machine_constants(d)


def _fail(*args, **kwargs):
  raise AssertionError("calibrate called although the cache holds it")


def test_cache_is_used_refreshed_and_recovers(tmp_path, monkeypatch):
  fake = _FakeCalibrate()
  monkeypatch.setattr(machine, "calibrate_devices", fake)
  first = machine.load_or_calibrate([2, 4], cache_dir=str(tmp_path))
  assert fake.calls == 1
  path = machine.cache_path([2, 4], cache_dir=str(tmp_path))
  assert os.path.exists(path)
  assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]

  monkeypatch.setattr(machine, "calibrate_devices", _fail)
  assert machine.load_or_calibrate([2, 4], cache_dir=str(tmp_path)) == first
  assert machine.load_or_calibrate(
      "mesh_0:2;mesh_1:4", cache_dir=str(tmp_path)) == first

  monkeypatch.setattr(machine, "calibrate_devices", fake)
  refreshed = machine.load_or_calibrate([2, 4], cache_dir=str(tmp_path),
                                        refresh=True)
  assert fake.calls == 2 and refreshed != first
  monkeypatch.setattr(machine, "calibrate_devices", _fail)
  assert machine.load_or_calibrate([2, 4], cache_dir=str(tmp_path)) == (
      refreshed)

  # Another mesh of the same devices: the same entry; another processor
  # count: another.
  assert machine.load_or_calibrate(
      [4, 2], cache_dir=str(tmp_path)).flops_per_second == (
          refreshed.flops_per_second)
  monkeypatch.setattr(machine, "calibrate_devices", fake)
  machine.load_or_calibrate([4], cache_dir=str(tmp_path))
  assert fake.calls == 3

  with open(path, "w") as f:
    f.write('{"key": {"format"')
  with pytest.warns(UserWarning, match="measuring again"):
    recovered = machine.load_or_calibrate([2, 4], cache_dir=str(tmp_path))
  assert fake.calls == 4 and recovered.flops_per_second == 4e9
  monkeypatch.setattr(machine, "calibrate_devices", _fail)
  assert machine.load_or_calibrate([2, 4], cache_dir=str(tmp_path)) == (
      recovered)
  assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_cache_dir_from_environment(tmp_path, monkeypatch):
  fake = _FakeCalibrate()
  monkeypatch.setattr(machine, "calibrate_devices", fake)
  monkeypatch.setenv(machine.CACHE_DIR_ENV, str(tmp_path / "env"))
  machine.load_or_calibrate([8], mesh_impl="simd")
  assert machine.default_cache_dir() == str(tmp_path / "env")
  assert os.listdir(tmp_path / "env")
  key = machine.cache_key(machine.mesh_shape_of([8]),
                          ["/device:CPU:%d" % i for i in range(8)], "simd")
  assert key["num_processors"] == 8 and "mesh_shape" not in key
  assert key["tensorflow"] == tf.__version__
  assert key["mesh_impl"] == "simd"


def test_mesh_shapes_of_one_device_count_share_one_measurement(
    tmp_path, monkeypatch):
  """Searching every mesh shape of 8 processors measures the machine once:
  each mesh's figures are derived from the one measurement of its
  devices (a collective's by its group size)."""
  monkeypatch.setenv(machine.CACHE_DIR_ENV, str(tmp_path))
  # No timing: every measured program takes a millisecond.
  monkeypatch.setattr(machine, "_median_seconds",
                      lambda *args, **kwargs: 1e-3)
  measured = []
  real_compute = machine._calibrate_compute

  def counting_compute(devices, plan):
    measured.append(len(devices))
    return real_compute(devices, plan)

  monkeypatch.setattr(machine, "_calibrate_compute", counting_compute)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = mtf.get_variable(mesh, "x", "batch:64,io:32")
  w = mtf.get_variable(mesh, "w", "io:32,hidden:16")
  loss = mtf.reduce_sum(mtf.square(mtf.einsum([x, w], "batch:64,hidden:16")))
  mtf.auto_mtf.api.choose_layout(graph, 8, [loss], objective="time",
                                 quick_calibration=True)
  assert measured == [8]
  by_size = {}
  for sizes in ([8], [4, 2], [2, 4], [2, 2, 2]):
    constants = machine.load_or_calibrate(sizes, quick=True)
    for i, size in enumerate(sizes):
      for kind in KINDS:
        link = constants.link(kind, (f"mesh_{i}",))
        assert by_size.setdefault((kind, size), link) == link
    if len(sizes) > 1:
      assert constants.link("allreduce", [f"mesh_{i}" for i in range(
          len(sizes))]) == by_size[("allreduce", 8)]
  assert measured == [8]
