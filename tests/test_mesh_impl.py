"""MeshImpl, the base of mesh implementations, and the lazy laid-out values.

`mtf.MeshImpl(shape, layout_rules)` answers layout questions without
devices, as in the original; its backend members raise NotImplementedError
naming the member. Every member that the lowering and the ops use on a
mesh implementation is declared on MeshImpl, and both implementations
provide the backend ones.
"""

import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import mesh_impl as mesh_impl_lib

PlacementMeshImpl = mtf.placement_mesh_impl.PlacementMeshImpl
SimdMeshImpl = mtf.simd_mesh_impl.SimdMeshImpl

BACKEND_MEMBERS = ("slicewise", "allreduce", "allconcat", "alltoall",
                   "receive", "laid_out_pnum", "import_tf_tensor",
                   "export_to_tf_tensor", "random", "devices",
                   "LaidOutVariable")


def test_mesh_impl_answers_layout_questions():
  impl = mtf.MeshImpl(shape="rows:2;cols:4",
                      layout_rules="batch:rows;hidden:cols")
  batch, hidden, other = (mtf.Dimension("batch", 8),
                          mtf.Dimension("hidden", 12),
                          mtf.Dimension("other", 3))
  shape = mtf.Shape([batch, other, hidden])
  assert impl.size == 8 and impl.ndims == 2
  assert impl.tensor_dimension_to_mesh_axis(batch) == 0
  assert impl.tensor_dimension_to_mesh_axis(hidden) == 1
  assert impl.tensor_dimension_to_mesh_axis(other) is None
  assert impl.tensor_layout(shape).tensor_axis_to_mesh_axis == (0, None, 1)
  assert impl.slice_shape(shape) == [4, 3, 3]
  assert impl.slice_begin(shape, 6) == [4, 0, 6]  # coordinates (1, 2)
  assert impl.slice_size(shape) == 36
  assert impl.laid_out_size(shape) == 36 * 8
  assert impl.mesh_axis_to_cumprod(shape) == [1, 24]  # Sizes before.
  assert impl.processor_groups([1]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert not impl.supports_autostack
  with pytest.raises(mtf.IndivisibleError, match="'other'"):
    mtf.MeshImpl("all:2", "other:all").slice_shape(shape)
  # A rule naming a mesh dimension the mesh lacks is ignored (as in the
  # original): "hidden" stays whole.
  lacking = mtf.MeshImpl("all:2", "hidden:model")
  assert lacking.tensor_dimension_to_mesh_axis(mtf.Dimension("hidden", 4)) is (
      None)
  assert lacking.slice_shape("hidden:4") == [4]
  with pytest.raises(NotImplementedError, match=r"MeshImpl\.devices"):
    impl.devices  # pylint: disable=pointless-statement


@pytest.mark.parametrize("member,args", [
    ("slicewise", (tf.identity,)),
    ("allreduce", (None, [0], "SUM")),
    ("allconcat", (None, 0, 0)),
    ("alltoall", (None, 0, 0, 1)),
    ("receive", (None, 0, [0, 1])),
    ("laid_out_pnum", ()),
    ("import_tf_tensor", ("a:2", np.zeros([2]))),
    ("export_to_tf_tensor", ("a:2", None)),
    ("random", ("a:2", tf.random.uniform, {})),
    ("make_laid_out_variable", (None,)),
])
def test_backend_members_of_mesh_impl_raise_naming_the_member(member, args):
  impl = mtf.MeshImpl("all:2", "")
  with pytest.raises(NotImplementedError,
                     match=rf"MeshImpl\.{member} is not implemented"):
    getattr(impl, member)(*args)


@pytest.mark.parametrize("cls", [PlacementMeshImpl, SimdMeshImpl])
def test_implementations_provide_every_backend_member(cls):
  for member in BACKEND_MEMBERS:
    assert vars(mtf.MeshImpl).get(member) is not getattr(cls, member), (
        f"{cls.__name__} does not provide {member}")
  assert issubclass(cls.LaidOutVariable, mesh_impl_lib.LaidOutVariable)


def test_every_member_used_on_a_mesh_impl_is_declared():
  """Scans the package for `mesh_impl.X` / `impl.X` / `lowering.mesh_impl(
  ...).X`: no duck-typed member outside the implementations' own files."""
  pattern = re.compile(
      r"\b(?:mesh_impl|impl|_mesh_impl|mesh_impl\([^()]*\))\.([A-Za-z_]\w*)")
  package = pathlib.Path(mtf.__file__).parent
  used = {}
  for path in package.rglob("*.py"):
    if path.name in ("simd_mesh_impl.py", "placement_mesh_impl.py"):
      continue  # An implementation may use its own extra members.
    for match in pattern.finditer(path.read_text()):
      used.setdefault(match.group(1), set()).add(path.name)
  assert "variable_store" in used and "make_laid_out_variable" in used
  undeclared = {name: sorted(files) for name, files in used.items()
                if not hasattr(mtf.MeshImpl, name)}
  assert not undeclared


def test_laid_out_variable_protocol_is_declared():
  protocol = mesh_impl_lib.LaidOutVariable()
  for member in ("read", "assign_to_slices", "copy_master_to_slices",
                 "copy_slices_to_master"):
    with pytest.raises(NotImplementedError, match=member):
      getattr(protocol, member)(*([None, None] if member == "assign_to_slices"
                                  else []))
  for prop in ("laid_out_tensor", "slice_variables", "master", "storage"):
    with pytest.raises(NotImplementedError, match=prop):
      getattr(protocol, prop)


def test_variable_store_and_run_have_defaults():
  impl = mtf.MeshImpl("all:2", "")
  assert impl.variable_store is impl.variable_store
  assert impl.run(lambda a, b: a + b, 2, 3) == 5
  placement = PlacementMeshImpl("all:2", "")
  assert placement.run(lambda: 7) == 7


@pytest.mark.parametrize("make", [
    lambda: PlacementMeshImpl("all:2", "a:all"),
    lambda: SimdMeshImpl("all:2", "a:all"),
])
def test_import_and_export_take_the_mtf_tensor_first(make):
  impl = make()
  with pytest.raises(TypeError, match=r"x must be the mtf Tensor.*\(x, tf_x\)"):
    impl.import_tf_tensor(tf.zeros([2]), "a:2")
  with pytest.raises(TypeError, match="x must be the mtf Tensor"):
    impl.export_to_tf_tensor(np.zeros([2]), None)


def test_import_and_export_accept_an_mtf_tensor():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:4,b:2")
  impl = PlacementMeshImpl("all:2", "a:all")
  value = np.arange(8, dtype=np.float32).reshape(4, 2)
  laid_out = impl.import_tf_tensor(x, value)
  np.testing.assert_array_equal(laid_out.tensor_list[1], value[2:])
  np.testing.assert_array_equal(
      impl.export_to_tf_tensor(x, laid_out_x=laid_out), value)


# ---------------------------------------------------------- lazy values

def _laid_out(impl, values):
  return impl.slicewise(lambda p: tf.constant(values)[p], impl.laid_out_pnum())


def test_lazy_allreduce_sum_reduces_once_and_counts():
  impl = PlacementMeshImpl("all:4", "")
  counted = []
  x = _laid_out(impl, [1.0, 2.0, 3.0, 4.0])
  lazy = mtf.LazyAllreduceSum(impl, x, [0],
                              add_counter_fn=lambda: counted.append(1))
  assert lazy.slice_shape == []
  assert not counted
  first = lazy.to_laid_out_tensor()
  assert lazy.to_laid_out_tensor() is first and counted == [1]
  assert [float(t) for t in first.tensor_list] == [10.0] * 4


def test_adding_compatible_lazy_sums_stays_lazy():
  impl = PlacementMeshImpl("rows:2;cols:2", "")
  a = mtf.LazyAllreduceSum(impl, _laid_out(impl, [1.0, 2.0, 3.0, 4.0]), [1])
  b = mtf.LazyAllreduceSum(impl, _laid_out(impl, [10.0, 20.0, 30.0, 40.0]),
                           [1])
  other_axes = mtf.LazyAllreduceSum(impl, _laid_out(impl, [0.0] * 4), [0])
  assert mtf.compatible_lazy_allreduce_sums([a, b])
  assert not mtf.compatible_lazy_allreduce_sums([a, other_axes])
  assert not mtf.compatible_lazy_allreduce_sums([a, a.laid_out_input])
  assert not mtf.compatible_lazy_allreduce_sums([])
  total = a + b
  assert isinstance(total, mtf.LazyAllreduceSum)
  # Groups along cols: {0, 1} and {2, 3}.
  assert [float(t) for t in total.to_laid_out_tensor().tensor_list] == [
      33.0, 33.0, 77.0, 77.0]
  mixed = a + other_axes
  assert isinstance(mixed, mtf.LaidOutTensor)
  assert [float(t) for t in mixed.tensor_list] == [3.0, 3.0, 7.0, 7.0]


def test_lazy_laid_out_tensor_computes_once():
  impl = PlacementMeshImpl("all:2", "")
  calls = []

  def compute():
    calls.append(1)
    return _laid_out(impl, [[1.0, 2.0], [3.0, 4.0]])

  lazy = mtf.LazyLaidOutTensor(compute, [2])
  assert lazy.slice_shape == [2] and not calls
  doubled = impl.slicewise(lambda t: t * 2, lazy)
  assert lazy.to_laid_out_tensor() is lazy.to_laid_out_tensor()
  assert calls == [1]
  np.testing.assert_array_equal(doubled.tensor_list[1], [6.0, 8.0])
