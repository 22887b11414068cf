"""mtf.slicewise along dimensions its function does not declare splittable.

By default a layout splitting such a dimension is refused (only the caller
knows what the function does along it). The opt-in keywords: `unsplittable=
"gather"` gathers it whole around the function; `halo={name: h}` gives a
function local along `name` its block with h neighbouring rows on either
side. Both checked against float64 NumPy with gradients under the uneven
layouts (dimension "n" of sizes 5, 7, 12 and 100), and their collectives
against their cost rule.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from tests import mtf_testing

# SIMD (costly) on the layouts that split "n", which the options act on:
# all8_n (a wholly padded processor, halos spanning blocks) and b2m4; the
# eager runs (PlacementMeshImpl) cover every layout.
PARAMS = [p for p in mtf_testing.uneven_layout_mode_params(
    ["b", "n"], v1_shapes_layouts=())
          if p.values[2] != "simd" or p.id.startswith(("all8_n", "b2m4"))]
# (size of "n", halo): a halo of 2 spans two blocks of 5 over 8 (blocks of
# 1). Eager runs every case; the traced modes (costlier) fewer.
CASES = {"eager": [(5, 2), (7, 1), (12, 2), (100, 1)],
         "simd": [(7, 1)]}
TRACED_CASES = [(7, 2)]


def _u(shape, seed):
  return np.random.RandomState(seed).uniform(-1.0, 1.0,
                                             size=shape).astype(np.float32)


def _np_stencil(x, h):
  """x[i] * (x[i - h] + 2 x[i + 1]) along axis 1, x zero past the ends:
  local with radius h, not linear."""
  n = x.shape[1]
  p = np.pad(x, [(0, 0), (h, h), (0, 0)])
  return x * (p[:, :n] + 2 * p[:, h + 1:h + 1 + n])


def _tf_stencil(w, h):
  """_np_stencil of a window along axis 1 (rows wrapped at the window's
  edges are garbage that the halo cuts)."""
  return w * (tf.roll(w, h, 1) + 2 * tf.roll(w, -1, 1))


def _cumsum_then_scale(x):
  """A whole-dimension function along axis 1 ("n", not declared
  splittable)."""
  return tf.cumsum(x * x, axis=1)


def _np_cumsum_then_scale(x):
  return np.cumsum(x * x, 1)


def _case(size, h, seed):
  def build(mesh, t):
    del mesh
    x = t["x"]
    return {
        "gather": mtf.slicewise(_cumsum_then_scale, [x], name="cumsum",
                                splittable_dims=["b", "d"],
                                unsplittable="gather"),
        "halo": mtf.slicewise(lambda w: _tf_stencil(w, h), [x],
                              name="stencil", splittable_dims=["b", "d"],
                              halo={"n": h}),
    }

  def ref(x):
    return {"gather": _np_cumsum_then_scale(x), "halo": _np_stencil(x, h)}

  return build, ref, {"x": (_u((3, size, 2), seed), ["b", "n", "d"])}


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_gather_and_halo_options(mesh_shape, layout, mode):
  cases = {f"n{size}_h{h}": _case(size, h, i)
           for i, (size, h) in enumerate(CASES.get(mode, TRACED_CASES))}
  mtf_testing.check_ops(cases, mesh_shape, layout, mode)


def _lower(build, mesh_shape, rules):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(_u((3, 7, 2), 0)), "b:3;n:7;d:2")
  y = build(x)
  loss = mtf.reduce_sum(y * y)
  mtf.gradients([loss], [x])
  rules = mtf.LayoutRules(rules, allow_uneven=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules,
                                                   [""] * 8)
  return graph, rules, mtf.Lowering(graph, {mesh: impl})


def test_refused_by_default_naming_the_function_and_dimension():
  with pytest.raises(mtf.LayoutError) as info:
    _lower(lambda x: mtf.slicewise(_cumsum_then_scale, [x], name="my_cumsum",
                                   splittable_dims=["b", "d"]),
           "b:2;m:4", [("n", "m")])
  message = str(info.value)
  assert "my_cumsum" in message and "'n'" in message
  assert "unsplittable=" in message and "halo=" in message


@pytest.mark.parametrize("name,build,want", [
    ("gather", lambda x: mtf.slicewise(
        _cumsum_then_scale, [x], splittable_dims=["b", "d"],
        unsplittable="gather"), {"allconcat"}),
    ("halo", lambda x: mtf.slicewise(
        lambda w: _tf_stencil(w, 2), [x], splittable_dims=["b", "d"],
        halo={"n": 2}), {"receive"}),
])
def test_collectives_are_those_of_the_cost_rule(name, build, want):
  """Forward and gradient (a GenericGradOperation with halos 2h and h)."""
  graph, rules, lowering = _lower(build, "b:2;m:4", [("b", "b"), ("n", "m")])
  counted = cost_model.counted_collectives(dict(lowering.counters))
  assert cost_model.graph_cost(graph, "b:2;m:4", rules).collectives == (
      counted)
  assert {kind for kind, _ in counted} >= want
  assert "allconcat" not in {kind for kind, _ in counted} or name == "gather"


@pytest.mark.parametrize("kwargs,error,match", [
    ({"unsplittable": "split"}, ValueError, "one of"),
    ({"halo": {"n": -1}}, ValueError, "non-negative"),
    ({"halo": {"q": 1}}, mtf.ShapeError, "'q'"),
])
def test_option_errors(kwargs, error, match):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "b:3,n:7")
  with pytest.raises(error, match=match):
    mtf.slicewise(tf.identity, [x], **kwargs)


def test_halo_function_must_keep_the_window_length():
  with pytest.raises(ValueError, match="window length"):
    _lower(lambda x: mtf.slicewise(lambda w: w[:, 1:], [x], halo={"n": 1},
                                   splittable_dims=["b", "d"]),
           "b:2;m:4", [("n", "m")])
