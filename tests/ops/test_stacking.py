"""split, stack and unstack against NumPy, and their errors.

Also combined_dimension, anonymize (ops/reshapes.py) and
import_laid_out_tensor (ops/constants.py), added in the same batch.

split works locally, so the dimension it cuts (b) stays unsplit while the
others take every standard layout; stack and unstack also run with the
dimension they add or remove split over the mesh.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import reshapes
from tests import mtf_testing

DIMS = ["a", "b", "c"]


def _x(shape, seed=0):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "c"]))
def test_split(mesh_shape, layout, mode):
  # Equal pieces by count and unequal pieces by size; one piece unused, so
  # its gradient is zeros.
  def build(mesh, t):
    p0, p1 = mtf.split(t["x"], "b", 2)
    q0, _, q2 = mtf.split(t["x"], t["x"].shape[1], [1, 2, 3])
    return {"p0": p0, "p1": p1, "q0": q0, "q2": q2}

  def np_fn(x):
    return {"p0": x[:, :3], "p1": x[:, 3:], "q0": x[:, :1], "q2": x[:, 3:]}

  mtf_testing.check_op(build, np_fn, {"x": (_x((8, 6, 8)), DIMS)},
                       mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["s", "a"]))
def test_stack(mesh_shape, layout, mode):
  # The new dimension "s" (size 8) is at the front and in the middle; the
  # standard layouts split it too.
  names = [f"x{i}" for i in range(8)]

  def build(mesh, t):
    xs = [t[n] for n in names]
    front = mtf.stack(xs, "s")
    middle = mtf.stack(xs[::-1], "s", axis=-2)
    return {"front": front, "middle": middle}

  def np_fn(**arrays):
    xs = [arrays[n] for n in names]
    return {"front": np.stack(xs, axis=0),
            "middle": np.stack(xs[::-1], axis=1)}

  inputs = {n: (_x((8, 4), seed=i), ["a", "c"]) for i, n in enumerate(names)}
  mtf_testing.check_op(build, np_fn, inputs, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["s", "a"]))
def test_unstack(mesh_shape, layout, mode):
  # "s" is split over the mesh in several layouts: unstack gathers it. Two
  # outputs are unused, so their gradients are zeros.
  def build(mesh, t):
    ys = mtf.unstack(t["x"], "s")
    return {f"y{i}": y for i, y in enumerate(ys) if i not in (2, 5)}

  def np_fn(x):
    return {f"y{i}": x[:, i] for i in range(8) if i not in (2, 5)}

  mtf_testing.check_op(build, np_fn, {"x": (_x((8, 8, 4)), ["a", "s", "c"])},
                       mesh_shape, layout, mode)


def test_stack_unstack_round_trip_is_identity_with_int_dtype():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  value = np.arange(64, dtype=np.int32).reshape(8, 8)
  x = mtf.import_tf_tensor(mesh, tf.constant(value), "a:8,s:8")
  y = mtf.stack(mtf.unstack(x, "s"), "s", axis=1)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4",
                                                   "s:cols;a:rows")
  lowering = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(y), value)


def test_split_along_a_split_dimension():
  """Each piece re-partitioned as a slice (more in test_uneven_movement)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  value = np.arange(128, dtype=np.float32).reshape(8, 16)
  x = mtf.import_tf_tensor(mesh, tf.constant(value), "a:8,b:16")
  parts = mtf.split(x, "b", 2)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "b:all")
  lowering = mtf.Lowering(graph, {mesh: impl})
  for part, want in zip(parts, np.split(value, 2, axis=1)):
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(part), want)


@pytest.mark.parametrize("build,error,match", [
    (lambda x: mtf.split(x, "q", 2), mtf.ShapeError, "not a dimension"),
    (lambda x: mtf.split(x, mtf.Dimension("b", 4), 2), mtf.ShapeError,
     "has size 4"),
    (lambda x: mtf.split(x, "b", 4), mtf.ShapeError, "equal"),
    (lambda x: mtf.split(x, "b", [2, 2]), mtf.ShapeError, "sum to"),
    (lambda x: mtf.stack([x, mtf.zeros(x.mesh, "a:8,b:4")], "s"),
     mtf.ShapeError, "same shape|must have the shape"),
    (lambda x: mtf.stack([x, mtf.zeros(x.mesh, "a:8,b:6", dtype=tf.int32)],
                         "s"), TypeError, "dtype"),
    (lambda x: mtf.stack([x], "b"), mtf.ShapeError, "already"),
    (lambda x: mtf.stack([x], "s", axis=3), mtf.ShapeError, "out of range"),
    (lambda x: mtf.stack([], "s"), ValueError, "at least one"),
    (lambda x: mtf.stack([x, x], mtf.Dimension("s", 3)), mtf.ShapeError,
     "2 tensors"),
    (lambda x: mtf.unstack(x, "q"), mtf.ShapeError, "not a dimension"),
])
def test_errors(build, error, match):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:6")
  with pytest.raises(error, match=match):
    build(x)


def test_output_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:8,b:6")
  assert [t.shape.to_integer_list for t in mtf.split(x, "b", [1, 5])] == [
      [8, 1], [8, 5]]
  assert mtf.stack([x, x, x], "s", axis=-1).shape == mtf.Shape(
      [mtf.Dimension("a", 8), mtf.Dimension("b", 6), mtf.Dimension("s", 3)])
  assert len(mtf.unstack(x, mtf.Dimension("b", 6))) == 6
  assert mtf.stack([x, x], mtf.Dimension("s", 2)).shape.to_string == (
      "Shape[s=2, a=8, b=6]")


# reshapes.combined_dimension, reshapes.anonymize and
# constants.import_laid_out_tensor (tested here with the other ops of this
# batch; they may move to test_reshapes.py and test_constants.py).


def test_combined_dimension():
  a, b = mtf.Dimension("a", 4), mtf.Dimension("b", 6)
  assert reshapes.combined_dimension([a, b]) == mtf.Dimension("a", 24)
  assert reshapes.combined_dimension([a, ("c", 2)], name="ac") == (
      mtf.Dimension("ac", 8))
  assert reshapes.combined_dimension([b]) == b
  with pytest.raises(mtf.ShapeError, match="one or more"):
    reshapes.combined_dimension([])


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "b"]))
def test_anonymize_and_flatten(mesh_shape, layout, mode):
  def build(mesh, t):
    x = t["x"]
    a, b, c = x.shape.dims
    anonymous = reshapes.anonymize(x)
    assert anonymous.shape == mtf.anonymous_shape(x.shape)
    flat = mtf.reshape(x, [reshapes.combined_dimension([a, b]), c])
    return {"anonymous": anonymous, "flat": flat}

  mtf_testing.check_op(
      build, lambda x: {"anonymous": x, "flat": x.reshape(64, 3)},
      {"x": (_x((8, 8, 3)), ["a", "b", "c"])}, mesh_shape, layout, mode)


def test_anonymize_replicates_every_slice():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  value = _x((8, 16))
  y = reshapes.anonymize(
      mtf.import_tf_tensor(mesh, tf.constant(value), "a:8,b:16"))
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4",
                                                   "a:rows;b:cols")
  lowering = mtf.Lowering(graph, {mesh: impl})
  for s in lowering.laid_out_tensor(y).tensor_list:
    np.testing.assert_array_equal(s, value)


def _laid_out(impl, value, shape, dtype=tf.float32):
  """The slices of `value` for `impl`, cut in NumPy and placed by hand.

  On a SimdMeshImpl: the one slice of the processor being traced.
  """
  slice_shape = impl.slice_shape(shape)
  slices = []
  for pnum in range(impl.size):
    begin = impl.slice_begin(shape, pnum)
    index = tuple(slice(b, b + n) for b, n in zip(begin, slice_shape))
    slices.append(value[index])
  if isinstance(impl, mtf.simd_mesh_impl.SimdMeshImpl):
    return mtf.LaidOutTensor(
        [tf.gather(tf.constant(np.stack(slices), dtype=dtype),
                   impl.pnum_tensor)])
  placed = []
  for s, device in zip(slices, impl.devices):
    with tf.device(device):
      placed.append(tf.constant(s, dtype=dtype))
  return mtf.LaidOutTensor(placed)


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "b"]))
def test_import_laid_out_tensor(mesh_shape, layout, mode):
  value = _x((8, 8, 3), seed=3)
  shape = mtf.Shape([mtf.Dimension("a", 8), mtf.Dimension("b", 8),
                     mtf.Dimension("c", 3)])

  def build(mesh, t):
    y = constants.import_laid_out_tensor(
        mesh, _laid_out(mtf_testing.current_impl(), value, shape), shape)
    # A product with an input checks that gradients flow past the import.
    return {"y": y, "product": y * t["x"]}

  mtf_testing.check_op(
      build, lambda x: {"y": value.astype(np.float64), "product": value * x},
      {"x": (_x((8, 8, 3)), ["a", "b", "c"])}, mesh_shape, layout, mode)


def test_import_laid_out_tensor_marks_every_dimension_unsplittable():
  # As in the original (the slices fix the layout); lowering still accepts
  # any layout they fit (test_import_laid_out_tensor).
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  y = constants.import_laid_out_tensor(
      mesh, mtf.LaidOutTensor([tf.zeros([8, 2])]), "a:8,b:2")
  assert y.operation.unsplittable_dims == {"a", "b"}
  assert not y.operation.splittable_dims


@pytest.mark.parametrize("make,error,match", [
    (lambda: [tf.zeros([8, 2])] * 8, TypeError, "LaidOutTensor"),
    (lambda: mtf.LaidOutTensor([]), ValueError, "no slices"),
    (lambda: mtf.LaidOutTensor([tf.zeros([8, 2]), tf.zeros([8, 2], tf.int32)]),
     TypeError, "slice 1 has dtype int32"),
    (lambda: mtf.LaidOutTensor([tf.zeros([16])] * 8), mtf.ShapeError,
     "rank 2"),
])
def test_import_laid_out_tensor_build_errors(make, error, match):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(error, match=match):
    constants.import_laid_out_tensor(mesh, make(), "a:8,b:2")


@pytest.mark.parametrize("count,match", [
    (4, "got 4 slices.*holds 8"),
    (8, r"slice 0 has shape \[8, 2\].*\[1, 2\]"),
])
def test_import_laid_out_tensor_layout_errors(count, match):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  constants.import_laid_out_tensor(
      mesh, mtf.LaidOutTensor([tf.zeros([8, 2])] * count), "a:8,b:2")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "a:all")
  with pytest.raises(mtf.LayoutError, match=match):
    mtf.Lowering(graph, {mesh: impl})


def _uneven_stack_cases():
  """stack and unstack of a dimension "n" of sizes 7, 12 and 100 (5 is in
  test_uneven_movement), split over the mesh as the uneven layouts say."""
  def case(size, seed):
    def build(mesh, t):
      del mesh
      ys = mtf.unstack(t["x"], "n")
      return {"stack": mtf.stack([y * float(i % 3 + 1)
                                  for i, y in enumerate(ys)], "n", axis=1),
              "first": ys[0], "last": ys[-1]}

    def ref(x):
      scale = (np.arange(size) % 3 + 1).reshape(1, size, 1)
      return {"stack": x * scale, "first": x[:, 0], "last": x[:, -1]}

    return build, ref, {"x": (_x((3, size, 2), seed), ["b", "n", "d"])}

  return {f"n{size}": case(size, i) for i, size in enumerate((7, 12, 100))}


@pytest.mark.parametrize(
    "mesh_shape,layout,mode",
    mtf_testing.uneven_layout_mode_params(["b", "n"], modes=("eager",),
                                          v1_shapes_layouts=()))
def test_stack_unstack_of_an_uneven_split_dimension(mesh_shape, layout, mode):
  # Each processor stacks only its block (no communication); unstack
  # all-concatenates "n" once for all its outputs.
  mtf_testing.check_ops(_uneven_stack_cases(), mesh_shape, layout, mode)


def test_stack_and_unstack_collectives_match_their_cost_rules():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(_x((3, 7, 2))), "b:3;n:7;d:2")
  ys = mtf.unstack(x, "n")
  y = mtf.stack(ys, "n", axis=1)
  mtf.gradients([mtf.reduce_sum(y * y)], [x])
  rules = mtf.LayoutRules([("b", "b"), ("n", "m")], allow_uneven=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("b:2;m:4", rules,
                                                   [""] * 8)
  counters = dict(mtf.Lowering(graph, {mesh: impl}).counters)
  counted = cost_model.counted_collectives(counters)
  assert cost_model.graph_cost(graph, "b:2;m:4", rules).collectives == (
      counted)
  # The two unstacks (forward, and the gradient of the stack) allconcat
  # over m; the stacks (forward, and the gradient of the unstack) move
  # nothing (the loss's pending sum is not lowered).
  assert {kind for kind, _ in counted} == {"allconcat"}
  assert counters["comm/allconcat/m/calls"] == 2
