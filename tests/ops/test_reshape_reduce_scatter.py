"""A reshape that splits a pending sum's mesh axis lowers to reduce_scatter.

g = einsum(x, y) summing a split batch (and length) dimension is a pending
sum over those mesh axes; renaming one of its dimensions to a name split
over such a mesh axis sums and splits at once (reduce_scatter), instead of
allreducing and then keeping a piece. Pending sums over other mesh axes
stay pending where the rest of the reshape is local. Checked against NumPy
(values and gradients through the rename) in every mode on both mesh
implementations, and by the lowering's counters: the fused lowering has no
allreduce over the scattered axis, and its reduce_scatter plus the
allconcat that renames back has the wire bytes of the allreduce it
replaces.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

X_DIMS = ["batch", "length", "d_model"]
Y_DIMS = ["batch", "length", "d_ff"]
_RNG = np.random.RandomState(0)
X = _RNG.uniform(-1.0, 1.0, size=[8, 4, 4]).astype(np.float32)
Y = _RNG.uniform(-1.0, 1.0, size=[8, 4, 16]).astype(np.float32)

# (id, mesh, rules, scattered mesh dimension, mesh dimensions whose sum
# stays pending after the rename). "d_ff_zero" is d_ff renamed.
CASES = [
    ("b8", "b:8", "batch:b;d_ff_zero:b", "b", []),
    # Pending over b and m; only b is scattered, m stays pending.
    ("b2m4_scatter_b", "b:2;m:4", "batch:b;length:m;d_ff_zero:b", "b",
     ["m"]),
    ("b2m4_scatter_m", "b:2;m:4", "batch:b;length:m;d_ff_zero:m", "m",
     ["b"]),
    # d_model split over m: only the batch sum is pending.
    ("b4m2_model", "b:4;m:2", "batch:b;d_model:m;d_ff_zero:b", "b", []),
]
# A reshape that also ends a split (d_model over c is concatenated): the
# remaining pending sum over m is reduced, not kept pending.
NOT_LOCAL = ("b2m2c2_concat", "b:2;m:2;c:2",
             "batch:b;length:m;d_model:c;d_ff_zero:b", "b", ["m"])


def _einsum(mesh, t):
  out = mtf.Shape([t["x"].shape.get_dim_by_name("d_model"),
                   t["y"].shape.get_dim_by_name("d_ff")])
  # The sum of two pending sums is one pending sum.
  return (mtf.einsum([t["x"], t["y"]], output_shape=out) +
          mtf.einsum([t["x"] * t["x"], t["y"]], output_shape=out))


def _np_einsum(x, y):
  return (np.einsum("blm,blf->mf", x, y) +
          np.einsum("blm,blf->mf", x * x, y))


def _build(mesh, t, case_id):
  g = _einsum(mesh, t)
  if case_id == NOT_LOCAL[0]:
    d_ff_zero = mtf.Dimension("d_ff_zero", 16)
    h = mtf.reshape(g, [mtf.Dimension("d_model_whole", 4), d_ff_zero])
  else:
    h = mtf.rename_dimension(g, "d_ff", "d_ff_zero")
  back = mtf.reshape(h, g.shape)
  return {"h": h, "back": back}


def _np_build(x, y):
  g = _np_einsum(x, y)
  return {"h": g, "back": g}


# Every mode for the case with a pending sum over two mesh dimensions; the
# others on both implementations (SIMD programs are slow to trace, so the
# last ones on PlacementMeshImpl only).
MODES_OF = {"b2m4_scatter_b": mtf_testing.MODES,
            "b8": ("function", "simd"), "b4m2_model": ("graph", "simd")}


def _params(cases, default_modes):
  return [pytest.param(case, mode, id=f"{case[0]}-{mode}")
          for case in cases
          for mode in MODES_OF.get(case[0], default_modes)]


@pytest.mark.parametrize("case,mode", _params(CASES + [NOT_LOCAL],
                                              ("eager",)))
def test_values_and_gradients_match_numpy(case, mode):
  case_id, mesh_shape, layout, _, _ = case
  mtf_testing.check_op(
      lambda mesh, t: _build(mesh, t, case_id), _np_build,
      {"x": (X, X_DIMS), "y": (Y, Y_DIMS)}, mesh_shape, layout, mode)


def _counters(mode, mesh_shape, layout, case_id):
  """The lowering's counters (the rename's, and the export's of the
  renamed-back value) and the exported value."""
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  lowerings = []

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    t = {"x": mtf.import_tf_tensor(mesh, tf.constant(X), mtf.Shape(
        [mtf.Dimension(n, s) for n, s in zip(X_DIMS, X.shape)])),
         "y": mtf.import_tf_tensor(mesh, tf.constant(Y), mtf.Shape(
             [mtf.Dimension(n, s) for n, s in zip(Y_DIMS, Y.shape)]))}
    back = _build(mesh, t, case_id)["back"]
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowerings.append(lowering)
    return lowering, lowering.export_to_tf_tensor(back)

  value = mtf_testing.run_in_mode(mode, build_and_lower, impl)
  return dict(lowerings[-1].counters), value


def _comm(counters, kind, what):
  return {k: v for k, v in counters.items()
          if k.startswith(f"comm/{kind}/") and k.endswith("/" + what)}


def _unfused_layout(layout):
  """The rules without the one splitting d_ff_zero: the rename is local
  and the pending sum is allreduced when exported."""
  return ";".join(r for r in layout.split(";")
                  if not r.startswith("d_ff_zero:"))


@pytest.mark.parametrize(
    "case,mode", [pytest.param(c, "function", id=f"{c[0]}-function")
                  for c in CASES] +
    [pytest.param(CASES[1], "simd", id=f"{CASES[1][0]}-simd")])
def test_fused_rename_reduce_scatters_with_the_allreduce_wire_bytes(
    case, mode):
  case_id, mesh_shape, layout, scattered, pending = case
  fused, value = _counters(mode, mesh_shape, layout, case_id)
  np.testing.assert_allclose(value, _np_einsum(X, Y), rtol=1e-5, atol=1e-5)
  assert _comm(fused, "reduce_scatter", "calls") == {
      f"comm/reduce_scatter/{scattered}/calls": 1}, fused
  # Renaming back (SIMD's export may allconcat other mesh dimensions).
  assert _comm(fused, "allconcat", "calls")[
      f"comm/allconcat/{scattered}/calls"] == 1, fused
  # What remains pending is allreduced when needed (at the export), and
  # nothing is allreduced over the scattered mesh dimension.
  assert _comm(fused, "allreduce", "calls") == {
      f"comm/allreduce/{a}/calls": 1 for a in pending}, fused

  unfused, unfused_value = _counters(mode, mesh_shape,
                                     _unfused_layout(layout), case_id)
  np.testing.assert_allclose(unfused_value, value, rtol=1e-5, atol=1e-6)
  assert not _comm(unfused, "reduce_scatter", "calls"), unfused
  mesh_order = mtf.convert_to_shape(mesh_shape).dimension_names
  assert _comm(unfused, "allreduce", "calls") == {
      "comm/allreduce/{}/calls".format("_".join(
          sorted([scattered] + pending, key=mesh_order.index))): 1}, unfused
  fused_wire = sum(v for k, v in fused.items() if k.endswith("/wire_bytes"))
  unfused_wire = sum(v for k, v in unfused.items()
                     if k.endswith("/wire_bytes"))
  assert fused_wire == unfused_wire, (fused, unfused)


def test_rename_that_is_not_local_reduces_the_other_pending_sums():
  case_id, mesh_shape, layout, scattered, pending = NOT_LOCAL
  counters, value = _counters("function", mesh_shape, layout, case_id)
  np.testing.assert_allclose(value, _np_einsum(X, Y), rtol=1e-5, atol=1e-5)
  assert counters[f"comm/reduce_scatter/{scattered}/calls"] == 1
  assert _comm(counters, "allreduce", "calls") == {
      f"comm/allreduce/{a}/calls": 1 for a in pending}, counters
  assert f"comm/allreduce/{scattered}/calls" not in counters
  assert counters["comm/allconcat/c/calls"] == 1, counters


def test_pending_sum_without_a_newly_split_summed_axis_is_allreduced():
  """A rename splitting a mesh axis the sum is not pending over is an
  allreduce and a local split, as before."""
  counters, value = _counters("function", "b:2;m:4",
                              "batch:b;d_ff_zero:m", "plain")
  np.testing.assert_allclose(value, _np_einsum(X, Y), rtol=1e-5, atol=1e-5)
  assert not _comm(counters, "reduce_scatter", "calls"), counters
  assert _comm(counters, "allreduce", "calls") == {
      "comm/allreduce/b/calls": 1}, counters


@pytest.mark.parametrize("case,lazy_axes", [
    (CASES[1], ["m"]), (CASES[2], ["b"]), (CASES[0], None),
    (NOT_LOCAL, None)], ids=["local_b", "local_m", "nothing_left",
                             "not_local"])
def test_what_stays_pending_after_the_reduce_scatter(case, lazy_axes):
  """The renamed value is still a pending sum over the mesh dimensions
  not scattered when the rest of the reshape is local; else it is
  reduced."""
  case_id, mesh_shape, layout, _, _ = case
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  t = {"x": mtf_testing.import_array(mesh, X, [
      mtf.Dimension(n, s) for n, s in zip(X_DIMS, X.shape)]),
       "y": mtf_testing.import_array(mesh, Y, [
           mtf.Dimension(n, s) for n, s in zip(Y_DIMS, Y.shape)])}
  h = _build(mesh, t, case_id)["h"]
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowered = lowering.tensors[h]
  if lazy_axes is None:
    assert isinstance(lowered, mtf.mesh_impl.LaidOutTensor), lowered
  else:
    assert isinstance(lowered, mtf.mesh_impl.LazyAllreduceSum), lowered
    assert [impl.shape[a].name for a in lowered.mesh_axes] == lazy_axes
  np.testing.assert_allclose(lowering.export_to_tf_tensor(h).numpy(),
                             _np_einsum(X, Y), rtol=1e-5, atol=1e-5)
