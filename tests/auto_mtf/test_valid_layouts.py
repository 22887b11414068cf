"""valid_layouts.LayoutValidator: the original's cases, plus validate_layout."""

import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import valid_layouts


@pytest.fixture(name="validator")
def _validator():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  a_dim = mtf.Dimension("a", 5)
  b_dim = mtf.Dimension("b", 10)
  x1 = mtf.zeros(mesh, mtf.Shape([a_dim, b_dim, mtf.Dimension("concat", 15)]))
  # A second size of "concat", as in the original's test.
  mtf.zeros(mesh, mtf.Shape([a_dim, b_dim, mtf.Dimension("concat", 20)]))
  # A slicewise function that treats "concat" as a whole (concat itself
  # lowers along a split dimension here, unlike in the original).
  mtf.slicewise(lambda t: t, [x1], output_shape=x1.shape,
                output_dtype=x1.dtype, splittable_dims=[a_dim, b_dim])
  # Anonymous dimensions are never splittable.
  mtf.zeros(mesh, mtf.anonymous_shape(mtf.Shape([a_dim, b_dim])))
  return valid_layouts.LayoutValidator(graph, mtf.Shape([("m1", 4),
                                                         ("m2", 2)]))


def test_splittable_names_leave_out_unsplittable_and_anonymous(validator):
  assert validator.splittable_mtf_dimension_names == {"a", "b"}


def test_mesh_dimension_sizes(validator):
  assert validator.mesh_dimension_name_to_size == {"m1": 4, "m2": 2}


def test_divisibility_and_splittability(validator):
  assert not validator.is_valid_assignment("a", "m1")  # 5 % 4
  assert not validator.is_valid_assignment("a", "m2")  # 5 % 2
  assert not validator.is_valid_assignment("b", "m1")  # 10 % 4
  assert validator.is_valid_assignment("b", "m2")
  assert not validator.is_valid_assignment("concat", "m1")
  assert not validator.is_valid_assignment("concat", "m2")


def test_every_size_of_a_name_must_divide():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.zeros(mesh, "n:8")
  mtf.zeros(mesh, "n:12")
  validator = valid_layouts.LayoutValidator(graph, "x:4;y:8")
  assert validator.is_valid_assignment("n", "x")  # gcd(8, 12) = 4
  assert not validator.is_valid_assignment("n", "y")


def test_validate_layout_names_the_fault(validator):
  validator.validate_layout({"b": "m2"}, [{"a", "b"}])
  with pytest.raises(mtf.LayoutError, match="'b'.*'m1'.*10.*4"):
    validator.validate_layout({"b": "m1"})
  with pytest.raises(mtf.LayoutError, match="'concat'.*cannot lower"):
    validator.validate_layout({"concat": "m2"})
  with pytest.raises(mtf.LayoutError, match="'m3'"):
    validator.validate_layout({"b": "m3"})


def test_validate_layout_refuses_two_names_of_one_operation_on_one_mesh_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.zeros(mesh, "p:4,q:4")
  validator = valid_layouts.LayoutValidator(graph, "x:2")
  validator.validate_layout({"p": "x", "q": "x"}, [{"p"}, {"q"}])
  with pytest.raises(mtf.LayoutError, match="both 'p' and 'q'.*'x'"):
    validator.validate_layout({"p": "x", "q": "x"}, [{"p", "q"}])


def test_enumerate_layouts_lists_every_valid_layout_once():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "p:4,q:4")
  mtf.zeros(mesh, "r:2")
  mtf.reduce_sum(x, output_shape="p:4")
  validator = valid_layouts.LayoutValidator(graph, "x:2;y:4")
  sets = [frozenset(op.outputs[0].shape.dimension_names) |
          frozenset(n for t in op.inputs for n in t.shape.dimension_names)
          for op in graph.operations]
  layouts = list(valid_layouts.enumerate_layouts(validator, sets))
  assert layouts[0] == ""
  assert len(layouts) == len(set(layouts))
  # p and q: each none, x or y, not both on one mesh dimension (7 pairs);
  # r: none or x (its size 2 is not a multiple of y's 4).
  assert len(layouts) == 7 * 2
  assert "p:x;q:y;r:x" in layouts  # r never meets p or q
  assert "p:x;q:x" not in layouts
  assert not any("r:y" in l for l in layouts)
  for layout in layouts:
    validator.validate_layout(dict(
        pair.split(":") for pair in layout.split(";") if pair), sets)
