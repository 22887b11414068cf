"""The op tests' NumPy gradient reference: its memo returns a stored result
only for a reference that computes the same thing."""

import numpy as np
import pytest

from tests import mtf_testing

X = np.random.RandomState(0).uniform(-1, 1, (3, 4))
COT = {"y": np.random.RandomState(1).uniform(-1, 1, (3, 4))}


def _scaled(scale):
  return lambda x: {"y": np.sin(x) * scale}


def _grad(np_fn, x=X, cot=COT):
  return mtf_testing.numeric_gradients(np_fn, {"x": x}, cot, ["x"])["x"]


def test_same_code_different_closures_get_their_own_gradients():
  # One lambda's code with two closures: the memo must tell them apart.
  for scale in (2.0, 3.0, 2.0):
    np.testing.assert_allclose(_grad(_scaled(scale)),
                               COT["y"] * np.cos(X) * scale, rtol=1e-6)


def test_inputs_and_cotangents_are_part_of_the_key():
  fn = _scaled(1.0)
  np.testing.assert_allclose(_grad(fn, x=X + 1), COT["y"] * np.cos(X + 1),
                             rtol=1e-6)
  cot = {"y": -COT["y"]}
  np.testing.assert_allclose(_grad(fn, cot=cot), -COT["y"] * np.cos(X),
                             rtol=1e-6)


def test_a_stored_result_cannot_be_changed_by_its_caller():
  fn = _scaled(5.0)
  _grad(fn)[:] = 0.0
  np.testing.assert_allclose(_grad(fn), COT["y"] * np.cos(X) * 5.0,
                             rtol=1e-6)


def test_unknown_objects_are_not_memoized_but_still_work():
  class Scale:
    value = 4.0

  scale = Scale()

  def fn(x):
    return {"y": np.sin(x) * scale.value}

  np.testing.assert_allclose(_grad(fn), COT["y"] * np.cos(X) * 4.0,
                             rtol=1e-6)
  scale.value = 1.0  # Mutable state: a memo would return the old result.
  np.testing.assert_allclose(_grad(fn), COT["y"] * np.cos(X), rtol=1e-6)


def test_layout_mode_params_keeps_only_the_named_layouts():
  ids = [p.id for p in mtf_testing.layout_mode_params(
      ["a", "b"], layouts=mtf_testing.slicewise_layout_ids(["a", "b"]),
      every_layout_modes=mtf_testing.MODES, simd_mode_layouts=None)]
  assert ids == [f"{case}-{mode}" for case in ("1proc", "all8_a", "2d")
                 for mode in mtf_testing.MODES] + ["2d-graph_v1_shapes"]
  with pytest.raises(ValueError, match="all8_c"):
    mtf_testing.layout_mode_params(["a", "b"], layouts=["all8_c"])


def test_layout_mode_params_traces_on_the_2d_layout_only():
  """Every layout eagerly; simd on both 2-D layouts; every mode on the 2-D
  mesh."""
  ids = [p.id for p in mtf_testing.layout_mode_params(["a", "b"])]
  layouts = ("1proc", "all8_a", "all8_b", "2d", "2d_swapped")
  assert ids == [f"{case}-{mode}" for case in layouts
                 for mode in mtf_testing.MODES
                 if case == "2d" or mode == "eager"
                 or (mode == "simd" and case == "2d_swapped")
                 ] + ["2d-graph_v1_shapes"]
  # One dimension: simd on its one 2-D layout.
  ids = [p.id for p in mtf_testing.layout_mode_params(["a"])]
  assert [i for i in ids if i.endswith("-simd")] == ["2d-simd"]
  # Without the 2-D layout among those chosen, every mode on each of them.
  ids = [p.id for p in mtf_testing.layout_mode_params(
      ["a", "b"], layouts=["all8_b"])]
  assert ids == [f"all8_b-{mode}" for mode in mtf_testing.MODES]


def test_mesh_layout_mode_params_traces_on_the_first_2d_mesh():
  layouts = [("all:1", ""), ("all:8", "h:all"), ("r:2;c:4", "b:r;h:c"),
             ("r:2;c:4", "h:r;b:c")]
  ids = [p.id for p in mtf_testing.mesh_layout_mode_params(layouts)]
  # Every pair eagerly, SIMD on both 2-D pairs, the rest on the first.
  assert ids == [f"{m}-{l or 'none'}-{mode}" for i, (m, l) in
                 enumerate(layouts) for mode in mtf_testing.MODES
                 if mode == "eager" or i == 2 or (i == 3 and mode == "simd")]
  ids = [p.id for p in mtf_testing.mesh_layout_mode_params(
      layouts, full_product=True)]
  assert ids == [f"{m}-{l or 'none'}-{mode}" for m, l in layouts
                 for mode in mtf_testing.MODES]
  # Without a 2-D mesh, every mode on every pair.
  ids = [p.id for p in mtf_testing.mesh_layout_mode_params(
      layouts[:2], modes=("eager", "graph", "simd"))]
  assert ids == ["all:1-none-eager", "all:1-none-graph", "all:1-none-simd",
                 "all:8-h:all-eager", "all:8-h:all-graph", "all:8-h:all-simd"]


def _check_ops_cases(wrong_value=False, wrong_gradient=False):
  """Two cases for check_ops: a float op with gradients and a comparison
  of float inputs (values only), one of them optionally wrong."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
  ab = ["a", "b"]
  square = (
      (lambda mesh, t: {"y": t["x"] * mtf.stop_gradient(t["x"])})
      if wrong_gradient else (lambda mesh, t: {"y": t["x"] * t["x"]}))
  return {
      "square": (square, lambda x: {"y": x * x}, {"x": (x, ab)}),
      "less": (lambda mesh, t: {"y": mtf.less(t["x"], t["z"])},
               lambda x, z: {"y": (x < z) ^ wrong_value},
               {"x": (x, ab), "z": (x[:, ::-1].copy(), ab)}),
  }


def test_check_ops_checks_each_case_as_if_alone():
  """Values and gradients per case; a case without float outputs gets no
  gradient check (its float inputs have no gradient)."""
  mtf_testing.check_ops(_check_ops_cases(), "all:2", "a:all", "eager")


@pytest.mark.parametrize("wrong,message", [
    ("value", "output 'less__y'"),
    ("gradient", "gradient of 'square__x'"),
])
def test_check_ops_names_the_failing_case(wrong, message):
  cases = _check_ops_cases(wrong_value=(wrong == "value"),
                           wrong_gradient=(wrong == "gradient"))
  with pytest.raises(AssertionError, match=message):
    mtf_testing.check_ops(cases, "all:2", "a:all", "eager")


def test_uneven_layouts_split_each_dimension_and_both_2d_meshes():
  cases = {case_id: (mesh, layout) for case_id, mesh, layout
           in mtf_testing.uneven_layouts(["a", "b"])}
  assert list(cases) == ["all8_a", "all8_b", "b2m4", "b4m2"]
  assert all(layout.allow_uneven for _, layout in cases.values())
  assert cases["all8_b"][0] == "all:8"
  assert cases["all8_b"][1].pairs == [("b", "all")]
  assert cases["b2m4"][0] == "b:2;m:4" and cases["b4m2"][0] == "b:4;m:2"
  assert cases["b4m2"][1].pairs == [("a", "b"), ("b", "m")]
  one_dim = {case_id: layout for case_id, _, layout
             in mtf_testing.uneven_layouts(["v"])}
  assert one_dim["b2m4"].pairs == [("v", "m")]


def test_uneven_layout_mode_params_traces_on_b2m4_only():
  params = mtf_testing.uneven_layout_mode_params(["a", "b"])
  ids = [p.id for p in params]
  assert ids == [f"{case}-{mode}"
                 for case in ("all8_a", "all8_b", "b2m4", "b4m2")
                 for mode in mtf_testing.MODES
                 if case == "b2m4" or mode == "eager"
                 or (mode == "simd" and case == "b4m2")
                 ] + ["b2m4-graph_v1_shapes"]
  assert all(p.values[1].allow_uneven for p in params)
  ids = [p.id for p in mtf_testing.uneven_layout_mode_params(
      ["a", "b"], layouts=["b4m2"], modes=("eager",))]
  assert ids == ["b4m2-eager"]
  with pytest.raises(ValueError, match="uneven layouts.*all8_c"):
    mtf_testing.uneven_layout_mode_params(["a", "b"], layouts=["all8_c"])
