"""reshape, rename_dimension, replace_dimensions and broadcast against NumPy.

A reshape changes dimension names and sizes, so the layout rules may lay the
output out differently from the input; the lowering then communicates
(allconcat, allsplit, alltoall). The custom cases below are chosen so that
each branch of `ReshapeOperation.lower` runs, and a recording mesh
implementation checks which collectives it used.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing


def _x(sizes, seed=0):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=sizes).astype(np.float32)


def _reshape_case(old, new):
  """check_op arguments reshaping x[old] (name -> size) to shape `new`."""
  x = _x([s for _, s in old])
  new_shape = [mtf.Dimension(n, s) for n, s in new]
  return (lambda mesh, t: {"y": mtf.reshape(t["x"], new_shape)},
          lambda x: {"y": x.reshape([s for _, s in new])},
          {"x": (x, [n for n, _ in old])})


# (id, mesh, layout, old dims, new dims, expected collective calls as
# (collective, mesh axis, slice shape of its input)). allsplit is local; the
# slice shape it gets tells a split before the reshape (old slice shape) from
# one after it (new shape with the split dimension whole).
RESHAPE_CASES = [
    ("local_merge", "all:8", "a:all;c:all",
     [("a", 8), ("b", 16)], [("c", 128)], []),
    ("local_regroup", "all:8", "a:all;c:all",
     [("a", 8), ("b", 16)], [("c", 32), ("d", 4)], []),
    ("allconcat", "all:8", "a:all",
     [("a", 8), ("b", 16)], [("c", 16), ("d", 8)],
     [("allconcat", 0, [1, 16])]),
    ("allsplit_before", "all:8", "c:all",
     [("a", 8), ("b", 16)], [("c", 32), ("d", 4)],
     [("allsplit", 0, [8, 16])]),
    ("allsplit_after", "all:8", "d:all",
     [("a", 4), ("b", 16)], [("c", 8), ("d", 8)],
     [("allsplit", 0, [8, 8])]),
    ("alltoall", "all:8", "a:all;d:all",
     [("a", 8), ("b", 16), ("e", 2)], [("c", 8), ("d", 32)],
     [("alltoall", 0, [1, 16, 2])]),
    # The new split starts where a size-1 axis and the next axis both
    # start: the all-to-all splits the next one (the mixture-of-experts
    # dispatch, [outer_batch=1, experts, groups, ...]).
    ("alltoall_past_size_1_axis", "all:8", "a:all;d:all",
     [("o", 1), ("e", 8), ("a", 8), ("b", 4)],
     [("o", 1), ("d", 8), ("c", 8), ("b", 4)],
     [("alltoall", 0, [1, 8, 1, 4])]),
    ("allconcat_then_split_after", "all:8", "a:all;d:all",
     [("a", 8), ("b", 4), ("e", 4)], [("c", 8), ("d", 16)],
     [("allconcat", 0, [1, 4, 4]), ("allsplit", 0, [8, 16])]),
    ("2d_swap_mesh_dims", "rows:2;cols:4", "a:rows;b:cols;c:cols;d:rows",
     [("a", 8), ("b", 16)], [("c", 8), ("d", 16)],
     [("allconcat", 0, [4, 4]), ("alltoall", 1, [8, 4]),
      ("allsplit", 0, [2, 16])]),
    ("2d_allsplit_before", "rows:2;cols:4", "a:rows;c:rows;d:cols",
     [("a", 2), ("b", 4), ("e", 16)], [("c", 8), ("d", 16)],
     [("allsplit", 1, [1, 4, 16])]),
    ("2d_alltoall", "rows:2;cols:4", "a:rows;b:cols;c:rows;e:cols",
     [("a", 2), ("b", 8), ("f", 8)], [("c", 16), ("e", 8)],
     [("alltoall", 1, [1, 2, 8])]),
    ("2d_allsplit_after", "rows:2;cols:4", "a:rows;c:rows;e:cols",
     [("a", 2), ("b", 4), ("f", 16)], [("c", 2), ("h", 16), ("e", 4)],
     [("allsplit", 1, [1, 16, 4])]),
    ("2d_allsplit_after_outer", "rows:2;cols:4", "f:cols;h:cols;g:rows",
     [("a", 4), ("b", 4), ("f", 8)], [("c", 2), ("g", 8), ("h", 8)],
     [("allsplit", 0, [2, 8, 2])]),
    ("2d_allconcat_both", "rows:2;cols:4", "a:rows;b:cols",
     [("a", 8), ("b", 16)], [("c", 4), ("d", 32)],
     [("allconcat", 0, [4, 4]), ("allconcat", 1, [8, 4])]),
    # The mixture-of-experts dispatch: the split moves from the groups "g"
    # to the experts "x" over rows while d_model "m" gets split over cols.
    # Splitting first makes the all-to-all carry a quarter of d_model.
    ("2d_allsplit_before_alltoall", "rows:2;cols:4", "g:rows;x:rows;n:cols",
     [("e", 8), ("g", 4), ("m", 16)], [("x", 8), ("h", 4), ("n", 16)],
     [("allsplit", 1, [8, 2, 16]), ("alltoall", 0, [8, 2, 4])]),
    # And back: all-to-all before the allconcat that ends the cols split.
    ("2d_alltoall_before_allconcat", "rows:2;cols:4", "g:rows;x:rows;n:cols",
     [("x", 8), ("h", 4), ("n", 16)], [("e", 8), ("g", 4), ("m", 16)],
     [("alltoall", 0, [4, 4, 4]), ("allconcat", 1, [8, 2, 4])]),
]


class RecordingMeshImpl(mtf.placement_mesh_impl.PlacementMeshImpl):
  """Records the reshape collectives it is asked for."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = []

  def _record(self, kind, x, mesh_axis):
    self.calls.append(
        (kind, mesh_axis, x.to_laid_out_tensor().slice_shape))

  def allconcat(self, x, mesh_axis, concat_axis):
    self._record("allconcat", x, mesh_axis)
    return super().allconcat(x, mesh_axis, concat_axis)

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    self._record("alltoall", x, mesh_axis)
    return super().alltoall(x, mesh_axis, split_axis, concat_axis)

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    self._record("allsplit", x, mesh_axis)
    return super().allsplit(x, mesh_axis, split_axis, which)


def _custom_params(cases):
  # Every case eagerly and in V1_SHAPES_MODE too: these are the collectives
  # a layout change lowers to. SIMD on the 2-D cases, which between them
  # run allconcat, allsplit and alltoall over either mesh axis (the 1-D
  # cases take the same collectives over one group of all 8, and the
  # lowering's branches are the same Python code, checked eagerly).
  # tf.function and plain graph mode run on the standard 2-D layout
  # (test_reshape_standard_layouts), as layout_mode_params has it.
  return [pytest.param(*case[1:], mode, id=f"{case[0]}-{mode}")
          for case in cases
          for mode in ("eager", "simd", mtf_testing.V1_SHAPES_MODE)
          if mode != "simd" or ";" in case[1]]


@pytest.mark.parametrize("mesh_shape,layout,old,new,calls,mode",
                         _custom_params(RESHAPE_CASES))
def test_reshape_custom_layouts(mesh_shape, layout, old, new, calls, mode):
  del calls
  build, np_fn, inputs = _reshape_case(old, new)
  mtf_testing.check_op(build, np_fn, inputs, mesh_shape, layout, mode)


@pytest.mark.parametrize(
    "mesh_shape,layout,old,new,calls",
    [pytest.param(*case[1:], id=case[0]) for case in RESHAPE_CASES])
def test_reshape_collectives(mesh_shape, layout, old, new, calls):
  """Each case takes the lowering branch it was designed for."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _x([s for _, s in old])
  old_shape = mtf.Shape([mtf.Dimension(n, s) for n, s in old])
  new_shape = mtf.Shape([mtf.Dimension(n, s) for n, s in new])
  y = mtf.reshape(mtf.import_tf_tensor(mesh, tf.constant(x), old_shape),
                  new_shape)
  impl = RecordingMeshImpl(mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  assert impl.calls == calls
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y),
                             x.reshape(new_shape.to_integer_list))


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "b", "c", "d"]))
def test_reshape_standard_layouts(mesh_shape, layout, mode):
  build, np_fn, inputs = _reshape_case([("a", 8), ("b", 16)],
                                       [("c", 16), ("d", 8)])
  mtf_testing.check_op(build, np_fn, inputs, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "b"]))
def test_reshape_of_pending_allreduce(mesh_shape, layout, mode):
  """A reshape of a reduction over a split dimension keeps the sum right."""
  def build(mesh, t):
    s = mtf.reduce_sum(t["x"], output_shape=t["x"].shape[:1])
    return {"y": mtf.reshape(s, [mtf.Dimension("c", 2),
                                 mtf.Dimension("e", 4)])}
  mtf_testing.check_op(build, lambda x: {"y": x.sum(1).reshape(2, 4)},
                       {"x": (_x([8, 16]), ["a", "b"])},
                       mesh_shape, layout, mode)


def test_reshape_wrong_size_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:16")
  with pytest.raises(mtf.ShapeError, match="128 elements"):
    mtf.reshape(x, "c:100")


def test_reshape_to_same_shape_is_identity():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:16")
  assert mtf.reshape(x, x.shape) is x


# ------------------------------------------------------- rename_dimension

@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "b", "c"]))
def test_rename_dimension(mesh_shape, layout, mode):
  # Renaming a to c changes the layout when a and c have different rules.
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.rename_dimension(t["x"], "a", "c")},
      lambda x: {"y": x},
      {"x": (_x([8, 16]), ["a", "b"])}, mesh_shape, layout, mode)


@pytest.mark.parametrize("layout,calls", [
    ("a:all;c:all", []),
    ("a:all", [("allconcat", 0, [1, 16])]),
    ("c:all", [("allsplit", 0, [8, 16])]),
])
def test_rename_dimension_collectives(layout, calls):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(_x([8, 16])), "a:8,b:16")
  y = mtf.rename_dimension(x, "a", "c")
  assert y.shape == mtf.Shape([mtf.Dimension("c", 8), mtf.Dimension("b", 16)])
  impl = RecordingMeshImpl("all:8", layout)
  mtf.Lowering(graph, {mesh: impl})
  assert impl.calls == calls


def test_rename_dimension_of_shape():
  shape = mtf.Shape([mtf.Dimension("a", 8), mtf.Dimension("b", 16)])
  assert mtf.rename_dimension(shape, "b", "c") == mtf.Shape(
      [mtf.Dimension("a", 8), mtf.Dimension("c", 16)])


# ----------------------------------------------------- replace_dimensions

A, B, E, F = (mtf.Dimension("a", 8), mtf.Dimension("b", 4),
              mtf.Dimension("e", 4), mtf.Dimension("f", 16))


@pytest.mark.parametrize("old,new,want", [
    ([B, E], F, [A, F]),
    (B, [mtf.Dimension("g", 2), mtf.Dimension("h", 2)],
     [A, mtf.Dimension("g", 2), mtf.Dimension("h", 2), E]),
    (A, mtf.Dimension("z", 8), [mtf.Dimension("z", 8), B, E]),
    ([A, B, E], [F, mtf.Dimension("g", 8)], [F, mtf.Dimension("g", 8)]),
])
def test_replace_dimensions_shape(old, new, want):
  assert mtf.replace_dimensions(mtf.Shape([A, B, E]), old, new) == mtf.Shape(
      want)


@pytest.mark.parametrize("old,new,match", [
    ([A, E], mtf.Dimension("g", 32), "consecutive"),
    ([E, B], F, "consecutive"),
    (mtf.Dimension("q", 4), E, "not a dimension"),
    ([B, E], mtf.Dimension("g", 8), "different total sizes"),
])
def test_replace_dimensions_errors(old, new, match):
  with pytest.raises(mtf.ShapeError, match=match):
    mtf.replace_dimensions(mtf.Shape([A, B, E]), old, new)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "f"]))
def test_replace_dimensions_tensor(mesh_shape, layout, mode):
  def build(mesh, t):
    y = mtf.replace_dimensions(t["x"], [B, E], F)
    assert y.shape == mtf.Shape([A, F])
    return {"y": y}
  mtf_testing.check_op(build, lambda x: {"y": x.reshape(8, 16)},
                       {"x": (_x([8, 4, 4]), ["a", "b", "e"])},
                       mesh_shape, layout, mode)


def test_replace_dimensions_tensor_error():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, mtf.Shape([A, B, E]))
  with pytest.raises(mtf.ShapeError, match="consecutive"):
    mtf.replace_dimensions(x, [A, E], mtf.Dimension("g", 32))


# -------------------------------------------------------------- broadcast

@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "b", "c"]))
def test_broadcast(mesh_shape, layout, mode):
  # New dimension c in the middle, and the old dimensions in another order.
  def np_fn(x):
    return {"y": np.broadcast_to(x.T[:, None, :], (16, 8, 8)).copy()}
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.broadcast(t["x"], "b:16,c:8,a:8")},
      np_fn, {"x": (_x([8, 16]), ["a", "b"])}, mesh_shape, layout, mode)


def test_broadcast_missing_dimension_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:16")
  with pytest.raises(mtf.ShapeError, match="missing"):
    mtf.broadcast(x, "a:8,c:16")


def test_broadcast_operation_takes_the_originals_parameters():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, "a:4")
  y = mtf.BroadcastOperation(x, output_shape="b:2,a:4",
                             name="bcast").outputs[0]
  assert y.shape == mtf.convert_to_shape("b:2,a:4")
  assert y.operation.name.startswith("bcast")
