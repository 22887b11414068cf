"""Dimension, Shape, LayoutRules and TensorLayout."""

import pytest

import mesh_tensorflow as mtf


def test_dimension_validation():
  d = mtf.Dimension("batch", 4)
  assert (d.name, d.size) == ("batch", 4)
  assert d == mtf.Dimension("batch", 4) != mtf.Dimension("batch", 5)
  with pytest.raises(mtf.ShapeError, match="integer size"):
    mtf.Dimension("batch", 4.0)
  with pytest.raises(mtf.ShapeError, match="string"):
    mtf.Dimension(3, 4)
  with pytest.raises(mtf.ShapeError, match="non-negative"):
    mtf.Dimension("x", -1)


@pytest.mark.parametrize("value,expected", [
    (mtf.Dimension("a", 2), mtf.Dimension("a", 2)),
    (("a", 2), mtf.Dimension("a", 2)),
    (None, None),
])
def test_convert_to_dimension(value, expected):
  assert mtf.convert_to_dimension(value) == expected


def test_convert_to_dimension_errors():
  # Not a pair at all: TypeError, as in the original.
  with pytest.raises(TypeError, match="5"):
    mtf.convert_to_dimension(5)
  with pytest.raises(mtf.ShapeError, match="'a', 2, 3"):
    mtf.convert_to_dimension(("a", 2, 3))
  with pytest.raises(mtf.ShapeError, match="integer size"):
    mtf.convert_to_dimension(("a", 2.5))


def test_shape_refuses_only_a_repeated_dimension():
  with pytest.raises(mtf.ShapeError, match="duplicate dimension names"):
    mtf.Shape([("a", 2), mtf.Dimension("a", 2)])
  # One name, two sizes: allowed, as in the original.
  shape = mtf.Shape([("a", 2), ("a", 3)])
  assert shape.to_integer_list == [2, 3]
  assert shape.dimension_names == ["a", "a"]


@pytest.mark.parametrize("value", [
    "a:4,b:8", "a:4;b:8", "a:4 b:8", [("a", 4), ("b", 8)],
    [mtf.Dimension("a", 4), mtf.Dimension("b", 8)],
    mtf.Shape([("a", 4), ("b", 8)]),
])
def test_convert_to_shape(value):
  shape = mtf.convert_to_shape(value)
  assert shape.dims == [mtf.Dimension("a", 4), mtf.Dimension("b", 8)]
  assert shape.to_integer_list == [4, 8]
  assert shape.dimension_names == ["a", "b"]


def test_convert_to_shape_errors():
  with pytest.raises(mtf.ShapeError, match="'b:x'"):
    mtf.convert_to_shape("a:4,b:x")
  with pytest.raises(mtf.ShapeError, match="duplicate dimension names"):
    mtf.convert_to_shape("a:4,a:4")


def test_shape_arithmetic():
  a, b, c = mtf.Dimension("a", 2), mtf.Dimension("b", 3), mtf.Dimension("c", 5)
  s = mtf.Shape([a, b])
  assert (s + c).dims == [a, b, c]
  assert (s + [c]).dims == [a, b, c]
  assert ([c] + s).dims == [c, a, b]
  assert (s - a).dims == [b]
  assert (s - [a, c]).dims == [b]
  assert s - None == s
  with pytest.raises(TypeError, match="None"):
    s + None  # pylint: disable=pointless-statement
  with pytest.raises(mtf.ShapeError):
    s - c  # pylint: disable=pointless-statement
  assert s.size == 6
  assert mtf.Shape([]).size == 1
  assert mtf.Shape([a, b, c]).cumprod == [1, 2, 6]
  assert s.to_string == "Shape[a=2, b=3]"
  assert s.rename_dimension("a", "z").dims == [mtf.Dimension("z", 2), b]
  assert s.resize_dimension("b", 7).dims == [a, mtf.Dimension("b", 7)]
  assert s.get_dim_by_name("b") == b
  assert s == [a, b] and s != mtf.Shape([b, a])
  assert hash(s) == hash(mtf.Shape([a, b]))
  with pytest.raises(mtf.ShapeError, match="'q'"):
    s.get_dim_by_name("q")


def test_shape_is_immutable():
  s = mtf.Shape([("a", 2)])
  dims = s.dims
  dims.append(mtf.Dimension("b", 3))
  assert s.dims == [mtf.Dimension("a", 2)]
  with pytest.raises(AttributeError, match="immutable"):
    s._dims = ()  # pylint: disable=protected-access
  rules = mtf.convert_to_layout_rules("a:b")
  with pytest.raises(AttributeError, match="immutable"):
    rules._pairs = ()  # pylint: disable=protected-access


@pytest.mark.parametrize("value", [
    "batch:rows;hidden:cols", "batch:rows,hidden:cols",
    [("batch", "rows"), ("hidden", "cols")],
    mtf.LayoutRules([("batch", "rows"), ("hidden", "cols")]),
])
def test_convert_to_layout_rules(value):
  rules = mtf.convert_to_layout_rules(value)
  assert rules.pairs == [("batch", "rows"), ("hidden", "cols")]


def test_layout_rules_table():
  rules = mtf.convert_to_layout_rules("batch:rows;hidden:cols;d_ff:cols")
  mesh = mtf.convert_to_shape("rows:2;cols:4")
  cases = [
      ("batch:8,hidden:16", (0, 1)),
      ("hidden:16,batch:8", (1, 0)),
      ("io:3,batch:8", (None, 0)),
      ("d_ff:16,batch:8", (1, 0)),
      ("io:3", (None,)),
  ]
  for shape, expected in cases:
    assert rules.tensor_layout(shape, mesh) == mtf.TensorLayout(expected)
  assert rules.mesh_dimension_name_to_tensor_dimension_names("cols") == [
      "hidden", "d_ff"]


def test_layout_rules_errors():
  with pytest.raises(mtf.LayoutError, match="several mesh dimensions"):
    mtf.convert_to_layout_rules("batch:rows;batch:cols")
  rules = mtf.convert_to_layout_rules("hidden:cols;d_ff:cols")
  with pytest.raises(mtf.LayoutError, match="'hidden' and 'd_ff'.*'cols'"):
    rules.tensor_layout("hidden:8,d_ff:8", "cols:4")


def test_tensor_layout():
  layout = mtf.TensorLayout([None, 1, 0])
  assert not layout.is_fully_replicated
  assert mtf.TensorLayout([None, None]).is_fully_replicated
  assert layout.mesh_axis_to_tensor_axis(3) == (2, 1, None)
  # Mesh axes from mesh_ndims on are left out, as in the original.
  wide = mtf.TensorLayout([0, 2, 1])
  assert wide.mesh_axis_to_tensor_axis(0) == ()
  assert wide.mesh_axis_to_tensor_axis(1) == (0,)
  assert wide.mesh_axis_to_tensor_axis(2) == (0, 2)
  assert layout == (None, 1, 0)
  assert list(layout) == [None, 1, 0]


def test_anonymous_shape():
  s = mtf.anonymous_shape("a:2,b:3")
  assert s.dimension_names == ["_anonymous_a", "_anonymous_b"]
  assert mtf.anonymous_shape(s) == s


def test_named_constructors():
  assert mtf.LayoutRules.replicated().pairs == []
  assert mtf.LayoutRules.data_parallel("batch", "all").pairs == [
      ("batch", "all")]


def test_list_product():
  assert mtf.list_product([2, 3, 4]) == 24
  assert mtf.list_product([]) == 1
  assert mtf.list_product(l=[5]) == 5


def test_verify_no_new_dims():
  a, b, c = mtf.Dimension("a", 2), mtf.Dimension("b", 3), mtf.Dimension("c", 4)
  mtf.verify_no_new_dims([mtf.Shape([a]), mtf.Shape([b])], mtf.Shape([b, a]))
  with pytest.raises(mtf.ShapeError, match="'c'"):
    mtf.verify_no_new_dims([mtf.Shape([a, b])], mtf.Shape([a, c]))
  with pytest.raises(ValueError):
    mtf.verify_no_new_dims(input_shapes=[mtf.Shape([a])],
                           output_shape=mtf.Shape([b]))


def test_tensor_dim_to_mesh_dim_size_and_size_per_split():
  batch = mtf.Dimension("batch", 12)
  hidden = mtf.Dimension("hidden", 8)
  layout, mesh = "batch:rows;hidden:cols", "rows:2;cols:4"
  assert mtf.tensor_dim_to_mesh_dim_size(layout, mesh, batch) == 2
  assert mtf.tensor_dim_to_mesh_dim_size(layout, mesh, hidden) == 4
  assert mtf.tensor_dim_to_mesh_dim_size(
      layout, mesh, mtf.Dimension("other", 3)) == 1
  assert mtf.tensor_dim_to_size_per_split(layout, mesh, batch) == 6
  assert mtf.tensor_dim_to_size_per_split(
      layout=mtf.convert_to_layout_rules(layout),
      mesh_shape=mtf.convert_to_shape(mesh), tensor_dim=hidden) == 2
  with pytest.raises(mtf.IndivisibleError, match="'batch'.*13"):
    mtf.tensor_dim_to_size_per_split(layout, mesh, mtf.Dimension("batch", 13))
