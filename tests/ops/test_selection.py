"""top_k, top_1, argmax, nth largest/smallest and sampling against NumPy,
under every standard layout (which split each reduced dimension in turn,
including blocks smaller than k) and mode."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.ops import selection
from tests import mtf_testing

SIZES = {"a": 8, "b": 16, "c": 8}
ABC = ["a", "b", "c"]
PARAMS = mtf_testing.layout_mode_params(ABC)

# Distinct values (a permutation), at least 0.01 apart: no ties, and the
# central differences of the reference never cross an order change.
X = (np.random.RandomState(0).permutation(8 * 16 * 8).reshape(8, 16, 8) /
     100.0 - 5.0).astype(np.float32)
X_INT = np.random.RandomState(1).permutation(8 * 16 * 8).reshape(
    8, 16, 8).astype(np.int32)


def _dim(name):
  return mtf.Dimension(name, SIZES[name])


def _np_top_k(x, axis, k):
  """Values and indices of the k largest along `axis`, moved to the end."""
  order = np.argsort(-x, axis=axis, kind="stable")
  indices = np.take(order, np.arange(k), axis=axis)
  values = np.take_along_axis(x, indices, axis=axis)
  return (np.moveaxis(values, axis, -1),
          np.moveaxis(indices, axis, -1).astype(np.int32))


# name -> (reduced dimension, k). Under "all:8" the blocks of a and c hold one
# entry and those of b two, fewer than k: the merge must still find the top k.
TOP_K_CASES = {
    "b_k4": ("b", 4),
    "a_k3": ("a", 3),
    "c_full_sort": ("c", 8),
}


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_top_k(mesh_shape, layout, mode):
  """Values, indices and the gradient of the values, for each case."""
  def build(mesh, t):
    outputs = {}
    for case, (name, k) in TOP_K_CASES.items():
      values, indices = mtf.top_k(t["x"], _dim(name),
                                  mtf.Dimension(f"k_{case}", k))
      outputs[f"{case}_values"] = values
      outputs[f"{case}_indices"] = indices
    return outputs

  def reference(x):
    outputs = {}
    for case, (name, k) in TOP_K_CASES.items():
      values, indices = _np_top_k(x, ABC.index(name), k)
      outputs[f"{case}_values"] = values
      outputs[f"{case}_indices"] = indices
    return outputs

  mtf_testing.check_op(build, reference, {"x": (X, ABC)}, mesh_shape, layout,
                       mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_top_1_and_argmax(mesh_shape, layout, mode):
  """top_1 returns (values, indices) as in the original; argmax with int64,
  on int inputs."""
  def build(mesh, t):
    values, indices = mtf.top_1(t["x"], _dim("b"))
    return {
        "top_1_indices": indices,
        "top_1_values": values,
        "argmax_a_int64": mtf.argmax(t["x"], _dim("a"), dtype=tf.int64),
        "argmax_c_of_ints": mtf.argmax(t["n"], _dim("c")),
    }

  def reference(x, n):
    return {
        "top_1_indices": np.argmax(x, axis=1).astype(np.int32),
        "top_1_values": np.max(x, axis=1),
        "argmax_a_int64": np.argmax(x, axis=0).astype(np.int64),
        "argmax_c_of_ints": np.argmax(n, axis=2).astype(np.int32),
    }

  mtf_testing.check_op(build, reference,
                       {"x": (X, ABC), "n": (X_INT, ABC)},
                       mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_nth_largest_and_smallest(mesh_shape, layout, mode):
  """n counts from 0; values and gradients."""
  def build(mesh, t):
    return {
        "largest_2_of_b": mtf.nth_largest_element(t["x"], 2, _dim("b")),
        "smallest_1_of_a": mtf.nth_smallest_element(t["x"], 1, _dim("a")),
        "largest_0_of_c": mtf.nth_largest_element(t["x"], 0, _dim("c")),
    }

  def reference(x):
    return {
        "largest_2_of_b": -np.sort(-x, axis=1)[:, 2, :],
        "smallest_1_of_a": np.sort(x, axis=0)[1],
        "largest_0_of_c": np.max(x, axis=2),
    }

  mtf_testing.check_op(build, reference, {"x": (X, ABC)}, mesh_shape, layout,
                       mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_sample_with_temperature_zero_is_argmax(mesh_shape, layout, mode):
  mtf_testing.check_op(
      lambda mesh, t: {"s": mtf.sample_with_temperature(
          t["x"], _dim("b"), temperature=0.0)},
      lambda x: {"s": np.argmax(x, axis=1).astype(np.int32)},
      {"x": (X, ABC)}, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("all:8", "b:all"), ("rows:2;cols:4", "a:rows;b:cols")])
def test_sample_with_temperature(mesh_shape, layout):
  """Samples are valid indices; a very peaked distribution gives its mode."""
  peaked = np.full((8, 16, 8), -1e4, np.float32)
  mode_index = np.random.RandomState(2).randint(0, 16, size=(8, 8))
  np.put_along_axis(peaked, mode_index[:, None, :], 0.0, axis=1)

  def build(mesh, t):
    return {"any": mtf.sample_with_temperature(t["x"], _dim("b")),
            "peaked": mtf.sample_with_temperature(t["p"], _dim("b"),
                                                  temperature=0.5)}

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    t = {k: mtf.import_tf_tensor(mesh, tf.constant(v),
                                 [_dim(n) for n in ABC])
         for k, v in (("x", X), ("p", peaked))}
    outputs = build(mesh, t)
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, {k: lowering.export_to_tf_tensor(v)
                      for k, v in outputs.items()}

  result = mtf_testing.run_in_mode("eager", build_and_lower)
  assert result["any"].shape == (8, 8)
  assert result["any"].dtype == np.int32
  assert np.all((result["any"] >= 0) & (result["any"] < 16))
  np.testing.assert_array_equal(result["peaked"], mode_index)


def test_output_shapes():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, [_dim(n) for n in ABC])
  k_dim = mtf.Dimension("k", 3)
  values, indices = mtf.top_k(x, _dim("b"), k_dim)
  assert values.shape == mtf.Shape([_dim("a"), _dim("c"), k_dim])
  assert indices.shape == values.shape
  assert values.dtype == tf.float32 and indices.dtype == tf.int32
  values, indices = mtf.top_1(x, _dim("a"))
  assert indices.shape == values.shape == mtf.Shape([_dim("b"), _dim("c")])
  assert values.dtype == tf.float32 and indices.dtype == tf.int32
  # The original's parameter order: (x, reduced_dim, name).
  values, indices = mtf.top_1(x, _dim("a"), "my_top_1")
  assert values.operation.name.startswith("my_top_1")
  assert mtf.argmax(x, _dim("a"), "my_argmax").dtype == tf.int32
  assert mtf.nth_smallest_element(x, 1, _dim("c")).shape == mtf.Shape(
      [_dim("a"), _dim("b")])
  assert "top_k" in selection.__all__


def test_bad_arguments():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, [_dim("a"), _dim("b")])
  with pytest.raises(mtf.ShapeError, match="'c'"):
    mtf.top_k(x, _dim("c"), mtf.Dimension("k", 2))
  with pytest.raises(mtf.ShapeError, match="already has a dimension named 'a'"):
    mtf.top_k(x, _dim("b"), mtf.Dimension("a", 2))
  with pytest.raises(mtf.ShapeError, match="k = 17"):
    mtf.top_k(x, _dim("b"), mtf.Dimension("k", 17))
  with pytest.raises(ValueError, match="n = 16"):
    mtf.nth_largest_element(x, 16, _dim("b"))
  with pytest.raises(TypeError, match="int32 or int64"):
    mtf.argmax(x, _dim("b"), dtype=tf.float32)


# SIMD (costly) on all8_n (k = 20 of 100 gathers the blocks) and b2m4
# (n and k split: merging candidates, k's blocks kept); the eager runs
# (PlacementMeshImpl) cover every layout.
UNEVEN_PARAMS = [
    p for p in mtf_testing.uneven_layout_mode_params(["n", "k"])
    if p.values[2] != "simd" or p.id.startswith(("all8_n", "b2m4"))]


def _distinct(shape, seed):
  """Distinct float32 values at least 0.01 apart (no ties)."""
  size = int(np.prod(shape))
  return (np.random.RandomState(seed).permutation(size).reshape(shape) /
          100.0 - 1.0).astype(np.float32)


def _top_k_case(n, ks, seed, ties=False):
  """A check_ops case: top_k of x[d:2, n] along n for each k of `ks` (values
  and indices; k_dim "k", split as the layout says). With `ties`, x holds
  small integers (many equal entries: the smaller index must win, as on
  one processor)."""
  if ties:
    x = np.random.RandomState(seed).randint(0, 3, size=(2, n)).astype(
        np.int32)
  else:
    x = _distinct((2, n), seed)

  def build(mesh, t):
    del mesh
    out = {}
    for k in ks:
      out[f"values_k{k}"], out[f"indices_k{k}"] = mtf.top_k(
          t["x"], mtf.Dimension("n", n), mtf.Dimension("k", k))
    return out

  def reference(x):
    out = {}
    for k in ks:
      out[f"values_k{k}"], out[f"indices_k{k}"] = _np_top_k(x, 1, k)
    return out

  return build, reference, {"x": (x, ["d", "n"])}


@pytest.mark.parametrize("mesh_shape,layout,mode", UNEVEN_PARAMS)
def test_top_k_with_split_reduced_and_k_dims(mesh_shape, layout, mode):
  """top_k along a dimension n of 5, 7, 12 and 100 split evenly or not,
  with k small and larger than a block, and its k dimension split too (as
  the layout says, padded when uneven); gradients scatter back to the
  chosen entries. Both lowerings run: gathering the blocks (k = 20 of 100
  over 8) and merging each block's candidates (k = 20 of 100 and k = 2 of
  12 over b:2, k = 1 of 7 over 4)."""
  mtf_testing.check_ops(
      {"n5": _top_k_case(5, [5], 0),
       "n7": _top_k_case(7, [1], 1),
       "n100": _top_k_case(100, [20], 3),
       "ties": _top_k_case(12, [2], 4, ties=True)},
      mesh_shape, layout, mode)


@pytest.mark.parametrize("mode", ["eager", "simd"])
def test_top_k_gradient_with_reduced_and_k_dims_on_one_mesh_dimension(mode):
  """A layout may split n and k over one mesh dimension (no tensor of top_k
  has both); its gradient must not make one that does (it refused with a
  LayoutError on its one-hot of [d, k, n])."""
  mtf_testing.check_ops(
      {"n7": _top_k_case(7, [3], 1), "n12": _top_k_case(12, [5], 4)},
      "b:2;m:4", mtf.LayoutRules([("n", "m"), ("k", "m"), ("d", "b")],
                                 allow_uneven=True), mode)


def _top_k_collectives(mesh_shape, rules, n, k):
  """The collectives of top_k of x[d:3, n] along n (k_dim "k"), as
  counted, after checking them against the cost model's prediction."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(_distinct((3, n), 0)),
                           f"d:3;n:{n}")
  mtf.top_k(x, mtf.Dimension("n", n), mtf.Dimension("k", k))
  rules = mtf.LayoutRules(rules, allow_uneven=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules,
                                                   [""] * 8)
  counted = cost_model.counted_collectives(
      dict(mtf.Lowering(graph, {mesh: impl}).counters))
  assert cost_model.graph_cost(graph, mesh_shape, rules).collectives == (
      counted)
  return counted


@pytest.mark.parametrize("mesh_shape,rules,n,k,want_calls", [
    # Blocks of 13 (the last 9 real), k = 4: each processor's 4 candidates
    # and their indices (two allconcats) are cheaper than its 13 entries.
    ("all:8", [("n", "all")], 100, 4, 2),
    # k = 20 > a block: gathering the blocks (one allconcat) is cheaper.
    ("all:8", [("n", "all")], 100, 20, 1),
    ("b:2;m:4", [("n", "m"), ("k", "b")], 7, 3, 1),
    ("b:2;m:4", [("n", "b"), ("k", "m")], 12, 2, 2),
    # Only k split: no communication.
    ("all:8", [("k", "all")], 12, 5, 0),
])
def test_top_k_cost_rule_prices_the_lowering(mesh_shape, rules, n, k,
                                             want_calls):
  """The cost rule predicts the lowering's collectives, and the cheaper of
  merging candidates and gathering the dimension is the one lowered."""
  counted = _top_k_collectives(mesh_shape, rules, n, k)
  assert sum(c["calls"] for c in counted.values()) == want_calls
  assert {kind for kind, _ in counted} <= {"allconcat"}
