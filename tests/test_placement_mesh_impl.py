"""PlacementMeshImpl collectives against NumPy, devices and construction errors.

Laid-out tensors are built directly from one small tf constant per processor
(processor p holds values 100 * p + 0, 1, ...), and each collective's result
on every processor is compared with a NumPy model of its grouping.
"""

import logging

from absl import logging as absl_logging
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

PlacementMeshImpl = mtf.placement_mesh_impl.PlacementMeshImpl
MESHES = ["all:8", "rows:2;cols:4"]
SLICE_SHAPE = [8, 16]  # Divisible by every mesh dimension size.


def _slices(n=8, dtype=np.float32):
  rng = np.random.RandomState(0)
  return [(100 * p + rng.uniform(0, 10, size=SLICE_SHAPE)).astype(dtype)
          for p in range(n)]


def _laid_out(impl, values):
  out = []
  for device, v in zip(impl.devices, values):
    with tf.device(device):
      out.append(tf.constant(v))
  return mtf.LaidOutTensor(out)


class _NoVariables:
  """Stands in for a Lowering in run_in_mode (no variables to copy)."""

  def copy_masters_to_slices(self):
    return tf.no_op()


def _run(mode, impl, fn, values):
  """fn(impl, laid-out values) -> LaidOutTensor; returns its slices."""
  def build_and_lower():
    return _NoVariables(), fn(impl, _laid_out(impl, values)).tensor_list
  return mtf_testing.run_in_mode(mode, build_and_lower)


def _groups(impl, mesh_axes):
  return impl.processor_groups(mesh_axes)


def _coordinate(impl, pnum, mesh_axis):
  return mtf.pnum_to_processor_coordinates(impl.shape, pnum)[mesh_axis]


def _check(got, want, dtype=np.float32):
  assert len(got) == len(want)
  for p, (g, w) in enumerate(zip(got, want)):
    if np.issubdtype(dtype, np.floating):
      np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"processor {p}")
    else:
      np.testing.assert_array_equal(g, w, err_msg=f"processor {p}")


# ---------------------------------------------------------------- allreduce

ALLREDUCE_CASES = [
    (mesh, axes) for mesh, axes_list in [
        ("all:8", [[0]]), ("rows:2;cols:4", [[0], [1], [0, 1]])]
    for axes in axes_list]
NP_REDUCE = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}


@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("reduction", sorted(NP_REDUCE))
@pytest.mark.parametrize("mesh_shape,mesh_axes", ALLREDUCE_CASES)
def test_allreduce(mesh_shape, mesh_axes, reduction, mode):
  impl = PlacementMeshImpl(mesh_shape, "")
  dtype = np.int32 if reduction == "SUM" else np.float32
  values = _slices(dtype=dtype)
  got = _run(mode, impl, lambda i, x: i.allreduce(x, mesh_axes, reduction),
             values)
  want = [None] * 8
  for group in _groups(impl, mesh_axes):
    total = NP_REDUCE[reduction](np.stack([values[p] for p in group]), axis=0)
    for p in group:
      want[p] = total
  _check(got, want, dtype)


def test_allreduce_bool_and_unknown_reduction():
  impl = PlacementMeshImpl("rows:2;cols:4", "")
  values = [np.array([p % 2 == 0, p == 3]) for p in range(8)]
  got = [np.asarray(t) for t in impl.allreduce(
      _laid_out(impl, values), [1], "MAX").tensor_list]
  assert [g.tolist() for g in got] == [[True, True]] * 4 + [[True, False]] * 4
  with pytest.raises(ValueError, match="PROD"):
    impl.allreduce(_laid_out(impl, _slices()), [0], "PROD")


# --------------------------------------------------------- allconcat & co

AXES = [("all:8", 0), ("rows:2;cols:4", 0), ("rows:2;cols:4", 1)]


@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("concat_axis", [0, 1])
@pytest.mark.parametrize("mesh_shape,mesh_axis", AXES)
def test_allconcat(mesh_shape, mesh_axis, concat_axis, mode):
  impl = PlacementMeshImpl(mesh_shape, "")
  values = _slices()
  got = _run(mode, impl, lambda i, x: i.allconcat(x, mesh_axis, concat_axis),
             values)
  want = [None] * 8
  for group in _groups(impl, [mesh_axis]):
    assert [_coordinate(impl, p, mesh_axis) for p in group] == list(
        range(len(group)))
    whole = np.concatenate([values[p] for p in group], axis=concat_axis)
    for p in group:
      want[p] = whole
  _check(got, want)


@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("split_axis,concat_axis", [(0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("mesh_shape,mesh_axis", AXES)
def test_alltoall(mesh_shape, mesh_axis, split_axis, concat_axis, mode):
  impl = PlacementMeshImpl(mesh_shape, "")
  values = _slices()
  got = _run(mode, impl,
             lambda i, x: i.alltoall(x, mesh_axis, split_axis, concat_axis),
             values)
  want = [None] * 8
  for group in _groups(impl, [mesh_axis]):
    pieces = {q: np.split(values[q], len(group), axis=split_axis)
              for q in group}
    for k, p in enumerate(group):
      want[p] = np.concatenate([pieces[q][k] for q in group],
                               axis=concat_axis)
  _check(got, want)


@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("split_axis", [0, 1])
@pytest.mark.parametrize("mesh_shape,mesh_axis", AXES)
def test_allsplit(mesh_shape, mesh_axis, split_axis, mode):
  impl = PlacementMeshImpl(mesh_shape, "")
  values = _slices()
  got = _run(mode, impl, lambda i, x: i.allsplit(x, mesh_axis, split_axis),
             values)
  n = impl.shape[mesh_axis].size
  want = [np.split(values[p], n, axis=split_axis)[
      _coordinate(impl, p, mesh_axis)] for p in range(8)]
  _check(got, want)


# ------------------------------------------------------ receive and shifts

def _receive_model(impl, values, mesh_axis, source_pcoord):
  want = [None] * 8
  for group in _groups(impl, [mesh_axis]):
    for p, source in zip(group, source_pcoord):
      want[p] = (np.zeros_like(values[p]) if source is None
                 else values[group[source]])
  return want


@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("mesh_shape,mesh_axis", AXES)
def test_receive(mesh_shape, mesh_axis, mode):
  impl = PlacementMeshImpl(mesh_shape, "")
  n = impl.shape[mesh_axis].size
  # Reversed order, with the last member receiving nothing.
  source_pcoord = [n - 1 - i for i in range(n - 1)] + [None]
  values = _slices()
  got = _run(mode, impl, lambda i, x: i.receive(x, mesh_axis, source_pcoord),
             values)
  _check(got, _receive_model(impl, values, mesh_axis, source_pcoord))


@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("offset,wrap", [(1, True), (1, False), (-1, True),
                                         (-1, False), (3, True), (2, False)])
@pytest.mark.parametrize("mesh_shape,mesh_axis", AXES)
def test_shift_by_n_processors(mesh_shape, mesh_axis, offset, wrap, mode):
  impl = PlacementMeshImpl(mesh_shape, "")
  n = impl.shape[mesh_axis].size
  source_pcoord = []
  for i in range(n):
    c = i - offset
    source_pcoord.append(c % n if wrap else (c if 0 <= c < n else None))
  values = _slices()
  got = _run(mode, impl,
             lambda i, x: i.shift_by_n_processors(x, mesh_axis, offset, wrap),
             values)
  _check(got, _receive_model(impl, values, mesh_axis, source_pcoord))


# ------------------------------------------------------- processor numbers

@pytest.mark.parametrize("mode", mtf_testing.PLACEMENT_MODES)
@pytest.mark.parametrize("mesh_shape,mesh_axis,want", [
    ("all:8", 0, list(range(8))),
    ("rows:2;cols:4", 0, [0, 0, 0, 0, 1, 1, 1, 1]),
    ("rows:2;cols:4", 1, [0, 1, 2, 3, 0, 1, 2, 3]),
])
def test_laid_out_pcoord(mesh_shape, mesh_axis, want, mode):
  impl = PlacementMeshImpl(mesh_shape, "")

  def build_and_lower():
    pcoord = impl.laid_out_pcoord(mesh_axis)
    # Coordinates may be Python ints; make them tensors on their devices.
    return _NoVariables(), impl.slicewise(
        lambda c: tf.convert_to_tensor(c, tf.int32), pcoord).tensor_list

  got = mtf_testing.run_in_mode(mode, build_and_lower)
  assert [int(g) for g in got] == want


# ----------------------------------------------------------------- devices

def _logical_cpus():
  return [d.name for d in tf.config.list_logical_devices("CPU")]


def test_default_devices_are_distinct_logical_cpus():
  impl = PlacementMeshImpl("rows:2;cols:4", "", share_replicas=False)
  assert impl.devices == _logical_cpus()[:8]
  assert len(set(impl.devices)) == 8
  x = impl.allconcat(_laid_out(impl, _slices()), 1, 0)
  y = impl.slicewise(lambda s: s * 2.0, x)
  for laid_out in (x, y):
    placed = [tf.DeviceSpec.from_string(t.device) for t in laid_out.tensor_list]
    assert [(d.device_type, d.device_index) for d in placed] == [
        ("CPU", p) for p in range(8)]


def test_replicas_are_shared_by_default_on_one_hosts_cpus():
  assert PlacementMeshImpl("rows:2;cols:4", "").share_replicas
  gpus = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(8)]
  assert not PlacementMeshImpl("rows:2;cols:4", "", gpus).share_replicas
  two_tasks = [f"/job:worker/task:{i // 4}/device:CPU:{i % 4}"
               for i in range(8)]
  assert not PlacementMeshImpl("rows:2;cols:4", "",
                               two_tasks).share_replicas


@pytest.mark.parametrize("share", [True, False])
def test_shared_replicas_are_computed_once(share):
  """After an allconcat over cols, the 4 members of each row hold the same
  slice: shared, it is one tensor per row, and so is what is computed from
  it; the values are those of the unshared run either way."""
  impl = PlacementMeshImpl("rows:2;cols:4", "", share_replicas=share)
  x = impl.allconcat(_laid_out(impl, _slices()), 1, 0)
  y = impl.slicewise(lambda s: s * 2.0, x)
  total = impl.allreduce(y, [0], "SUM")  # Rows hold different values.
  # Over rows, each column's group exchanges the same two row slices.
  swapped = impl.alltoall(y, 0, split_axis=0, concat_axis=1)
  distinct = lambda t: len({id(s) for s in t.tensor_list})
  assert (distinct(x), distinct(y), distinct(total), distinct(swapped)) == (
      (2, 2, 1, 2) if share else (8, 8, 8, 8))
  rows = [2.0 * np.concatenate(_slices()[0:4]),
          2.0 * np.concatenate(_slices()[4:8])]
  for s in total.tensor_list:
    np.testing.assert_allclose(np.asarray(s), rows[0] + rows[1])
  half = rows[0].shape[0] // 2
  for pnum, s in enumerate(swapped.tensor_list):
    r = pnum // 4
    np.testing.assert_allclose(np.asarray(s), np.concatenate(
        [rows[0][r * half:(r + 1) * half],
         rows[1][r * half:(r + 1) * half]], axis=1))


@pytest.mark.parametrize("dims", [[("a", 4), ("b", 6)], [("a", 1024),
                                                       ("b", 512)]])
def test_shared_replicas_draw_the_same_random_slices(dims):
  """Small tensors are drawn once whole and sliced, large ones per slice:
  the slices are those of the unshared implementation."""
  shape = mtf.Shape([mtf.Dimension(n, s) for n, s in dims])
  draws = []
  for share in (True, False):
    impl = PlacementMeshImpl("rows:2;cols:4", "a:rows", share_replicas=share)
    laid_out = impl.random(shape, tf.random.uniform, {"seed": 3})
    draws.append([np.asarray(t) for t in laid_out.tensor_list])
    if share:
      assert len({id(t) for t in laid_out.tensor_list}) == 2
  for shared, own in zip(*draws):
    np.testing.assert_array_equal(shared, own)


def test_fewer_devices_than_processors_cycles_with_warning(caplog):
  with caplog.at_level(logging.WARNING):
    impl = PlacementMeshImpl("all:16", "")
  cpus = _logical_cpus()[:8]
  assert impl.devices == cpus + cpus
  assert "16 processors but only 8 devices" in caplog.text


def test_explicit_devices():
  devices = [f"/device:CPU:{7 - p}" for p in range(8)]
  impl = PlacementMeshImpl("all:8", "", devices=devices)
  assert impl.devices == devices
  x = impl.slicewise(tf.identity, _laid_out(impl, _slices()))
  assert [tf.DeviceSpec.from_string(t.device).device_index
          for t in x.tensor_list] == list(range(7, -1, -1))


@pytest.mark.parametrize("num_devices", [3, 9])
def test_wrong_number_of_devices_raises(num_devices):
  with pytest.raises(mtf.LayoutError, match=f"needs 8 devices.*got "
                     f"{num_devices}"):
    PlacementMeshImpl("rows:2;cols:4", "", devices=["/cpu:0"] * num_devices)


def test_rules_for_mesh_dimensions_the_mesh_lacks_are_ignored(caplog):
  # As in the original: T5's default rules name "ensemble" and "experts",
  # which a "model:1,batch:1" mesh lacks. The answer is that of the rules
  # without them, and the ignored rules are logged once at INFO.
  def build(mesh):
    x = mtf_testing.import_array(
        mesh, np.arange(32, dtype=np.float32).reshape(8, 4),
        [mtf.Dimension("batch", 8), mtf.Dimension("hidden", 4)])
    w = mtf.get_variable(mesh, "w", "hidden:4,out:2",
                         initializer=tf.ones_initializer())
    return {"y": mtf.einsum([x, w], output_shape="batch:8,out:2")}, None, {}

  lacking = "batch:rows;hidden:hidnen_typo;out:ensemble_h24"
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  try:
    with caplog.at_level(logging.INFO):
      got, _ = mtf_testing.run_program("rows:2;cols:4", lacking, "eager",
                                       build)
      PlacementMeshImpl("rows:2;cols:4", lacking)  # Not logged again.
  finally:
    absl_logging.set_verbosity(verbosity)
  want, _ = mtf_testing.run_program("rows:2;cols:4", "batch:rows",
                                    "eager", build)
  np.testing.assert_array_equal(got["y"], want["y"])
  assert got["y"][0].tolist() == [6.0, 6.0]
  logged = [r.getMessage() for r in caplog.records
            if "this mesh lacks" in r.getMessage()]
  assert logged == [
      "Ignoring layout rules for mesh dimensions this mesh lacks: "
      "hidden:hidnen_typo;out:ensemble_h24 (mesh Shape[rows=2, cols=4])."
  ], logged
  assert all(r.levelno == logging.INFO for r in caplog.records
             if "this mesh lacks" in r.getMessage())


def _nccl_graph_op_types(devices, algorithm):
  """Op types of a data-parallel sum lowered in graph mode (not run)."""
  with tf.Graph().as_default() as g:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, np.ones([4, 2], np.float32), "b:4,d:2")
    y = mtf.reduce_sum(x, reduced_dim=mtf.Dimension("b", 4))
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        "all:4", "b:all", devices=devices, allreduce_algorithm=algorithm)
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowering.laid_out_tensor(y)
    return [op.type for op in g.get_operations()]


def test_gpu_groups_allreduce_with_nccl_in_graph_mode():
  gpus = [f"/device:GPU:{i}" for i in range(4)]
  assert _nccl_graph_op_types(gpus, "auto").count("NcclAllReduce") == 4
  assert "NcclAllReduce" not in _nccl_graph_op_types(gpus, "gather")
  cpus = [f"/device:CPU:{i}" for i in range(4)]
  assert "NcclAllReduce" not in _nccl_graph_op_types(cpus, "auto")
  with pytest.raises(ValueError, match="distinct GPUs"):
    _nccl_graph_op_types(cpus, "nccl")
  with pytest.raises(ValueError, match="allreduce_algorithm"):
    mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "",
                                              allreduce_algorithm="tree")


def test_random_slices_agree_on_replicas_and_differ_across_blocks():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4",
                                                   "a:rows")
  shape = mtf.convert_to_shape("a:4,b:3")
  kwargs = {"seed": 7, "minval": -1.0, "maxval": 1.0}
  values = [np.asarray(s) for s in impl.random(
      shape, tf.random.uniform, kwargs).tensor_list]
  assert all(v.shape == (2, 3) for v in values)
  for pnum in range(8):  # pnums 0-3 hold block 0, 4-7 block 1
    np.testing.assert_array_equal(values[pnum], values[4 * (pnum // 4)])
  assert not np.array_equal(values[0], values[4])
  again = impl.random(shape, tf.compat.v1.random_uniform, kwargs)
  np.testing.assert_array_equal(np.asarray(again.tensor_list[5]), values[5])
  # The blocks are those of the same tensor drawn on one processor.
  whole = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "").random(
      shape, "uniform", kwargs).tensor_list[0]
  np.testing.assert_array_equal(np.asarray(whole),
                                np.concatenate([values[0], values[4]]))
  with pytest.raises(ValueError, match="'random_gamma'"):
    impl.random(shape, tf.random.gamma, {"seed": 7})
