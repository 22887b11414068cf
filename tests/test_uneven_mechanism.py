"""The mechanism of uneven splits: the switch, slice shapes, the padding
helpers, and the Lowering's two rules (gather around operations that do
not handle padding; zero the padding of outputs).

The op families under uneven layouts are checked in tests/ops/test_uneven_*.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.backend import padding
from tests import mtf_testing

PlacementMeshImpl = mtf.placement_mesh_impl.PlacementMeshImpl


def test_switch_is_off_by_default_and_error_names_it():
  rules = mtf.convert_to_layout_rules("vocab:model")
  assert not rules.allow_uneven
  impl = mtf.MeshImpl("model:4", rules)
  with pytest.raises(mtf.IndivisibleError) as info:
    impl.slice_shape("vocab:259;d:8")
  message = str(info.value)
  assert "allow_uneven=True" in message
  assert "utils.run.allow_uneven_splits" in message
  assert "pads 'vocab' to 260" in message


def test_layout_rules_compare_and_print_the_switch():
  even = mtf.LayoutRules([("vocab", "model")])
  uneven = mtf.LayoutRules([("vocab", "model")], allow_uneven=True)
  assert even != uneven and even.with_uneven() == uneven
  assert hash(even.with_uneven()) == hash(uneven)
  assert uneven.with_uneven(False) == even
  assert repr(uneven) == "LayoutRules('vocab:model', allow_uneven=True)"
  with pytest.raises(mtf.LayoutError, match="allow_uneven='yes'"):
    mtf.LayoutRules([], allow_uneven="yes")


def test_without_replicates_named_and_shard_dimensions():
  rules = mtf.LayoutRules([("vocab", "model"), ("batch", "b")],
                          allow_uneven=True)
  mesh = mtf.Shape([mtf.Dimension("b", 2), mtf.Dimension("model", 4)])
  less = rules.without({"vocab", "d_ff@b"})
  assert less.allow_uneven
  assert less.tensor_dimension_to_mesh_axis(
      mtf.Dimension("vocab", 8), mesh) is None
  assert less.tensor_dimension_to_mesh_axis(
      mtf.Dimension("batch", 8), mesh) == 0
  assert rules.tensor_dimension_to_mesh_axis(
      mtf.Dimension("d_ff@b", 8), mesh) == 0
  assert less.tensor_dimension_to_mesh_axis(
      mtf.Dimension("d_ff@b", 8), mesh) is None


@pytest.mark.parametrize("size,pieces,want", [
    (259, 4, [65, 65, 65, 64]), (5, 8, [1, 1, 1, 1, 1, 0, 0, 0]),
    (12, 8, [2, 2, 2, 2, 2, 2, 0, 0]), (100, 8, [13] * 7 + [9])])
def test_slices_hold_ceil_and_the_last_ones_the_padding(size, pieces, want):
  rules = mtf.LayoutRules([("n", "all")], allow_uneven=True)
  impl = mtf.MeshImpl(f"all:{pieces}", rules)
  shape = mtf.Shape([mtf.Dimension("n", size), mtf.Dimension("d", 3)])
  slice_size = -(-size // pieces)
  assert impl.slice_shape(shape) == [slice_size, 3]
  (axis,) = impl.padded_axes(shape)
  assert axis == padding.PaddedAxis(0, 0, size, slice_size, pieces)
  assert padding.padded_size(axis) == slice_size * pieces
  real = []
  for pnum in range(pieces):
    begin = impl.slice_begin(shape, pnum)
    assert begin == [pnum * slice_size, 0]
    block = padding.clip_block([axis], begin, [slice_size, 3])
    real.append(0 if block is None else block[1][0])
  assert real == want


def test_even_splits_have_no_padded_axes():
  rules = mtf.LayoutRules([("n", "all")], allow_uneven=True)
  impl = mtf.MeshImpl("all:4", rules)
  assert impl.padded_axes("n:8;d:3") == []
  assert impl.slice_shape("n:8;d:3") == [2, 3]


def test_fill_slice_static_and_dynamic_offsets_agree():
  axis = padding.PaddedAxis(1, 0, 7, 3, 3)  # 7 over 3: 3, 3, 1 (+2 padding)
  x = tf.ones([2, 3])
  for begin, valid in [(0, 3), (3, 3), (6, 1)]:
    static = padding.fill_slice(x, [axis], [0, begin], fill=-1.0)
    dynamic = padding.fill_slice(x, [axis], [0, tf.constant(begin)], -1.0)
    want = np.where(np.arange(3) < valid, 1.0, -1.0) * np.ones([2, 1])
    np.testing.assert_array_equal(static, want)
    np.testing.assert_array_equal(dynamic, want)
  booleans = padding.fill_slice(tf.ones([3], tf.bool),
                                [padding.PaddedAxis(0, 0, 7, 3, 3)], [6])
  np.testing.assert_array_equal(booleans, [True, False, False])


def test_neutral_values():
  assert padding.neutral_value(tf.float32, "MAX") == -np.inf
  assert padding.neutral_value(tf.int32, "MIN") == np.iinfo(np.int32).max
  assert padding.neutral_value(tf.bool, "ALL") is True
  assert padding.neutral_value(tf.float32, "SUM") == 0


def test_pad_and_strip_full_tensors():
  axis = padding.PaddedAxis(0, 0, 5, 1, 8)
  x = tf.reshape(tf.range(10.0), [5, 2])
  padded = padding.pad_full(x, [axis])
  assert padded.shape == (8, 2)
  np.testing.assert_array_equal(padded[5:], np.zeros([3, 2]))
  np.testing.assert_array_equal(padding.strip_full(padded, [axis]), x)


def test_padding_fraction():
  assert padding.padding_fraction([259], [65], [4]) == pytest.approx(1 / 260)
  assert padding.padding_fraction([8], [2], [4]) == 0.0


class _NoPaddingOp(mtf.Operation):
  """A cumulative sum along its input's first dimension, whose lowering
  knows nothing of padding: the Lowering must gather around it."""

  def __init__(self, x):
    super().__init__([x], name="no_padding_op")
    self._outputs = [mtf.Tensor(self, x.shape, x.dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    assert impl.tensor_dimension_to_mesh_axis(x.shape[0]) is None
    y = impl.slicewise(lambda s: tf.cumsum(s, axis=0) + 1.0,
                       lowering.tensors[x])
    lowering.set_tensor_lowering(self.outputs[0], y)


def _lower_custom_op(allow_uneven):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = np.arange(10, dtype=np.float32).reshape(5, 2)
  tx = mtf.import_tf_tensor(mesh, x, "n:5;d:2")
  y = _NoPaddingOp(tx).outputs[0]
  rules = mtf.LayoutRules([("n", "all")], allow_uneven=allow_uneven)
  impl = PlacementMeshImpl("all:8", rules)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return x, lowering, impl, y


def test_an_operation_without_padding_support_is_gathered_around():
  x, lowering, impl, y = _lower_custom_op(True)
  got = lowering.export_to_tf_tensor(y)
  np.testing.assert_allclose(got, np.cumsum(x, axis=0) + 1.0)
  slices = lowering.laid_out_tensor(y).tensor_list
  begins = [impl.slice_begin(y.shape, p) for p in range(8)]
  # Its output "+ 1" reached the padding; the Lowering zeroed it.
  mtf_testing.assert_padding_is_zero(slices, begins,
                                     impl.padded_axes(y.shape), "y")
  counters = dict(lowering.counters)
  assert counters["comm/allconcat/all/calls"] == 1


def test_without_the_switch_the_same_program_is_refused():
  with pytest.raises(mtf.IndivisibleError, match="allow_uneven"):
    _lower_custom_op(False)


@pytest.mark.parametrize("mode", ["eager", "simd"])
def test_a_dimension_of_size_1_split_unevenly_is_padded_on_import(mode):
  """Its slices have its full size, yet all but the first hold padding
  (zeros): importing must still cut and pad it."""
  mtf_testing.check_op(
      lambda mesh, t: {"y": t["x"] * 2.0}, lambda x: {"y": x * 2.0},
      {"x": (np.ones((3, 1), np.float32), ["d", "n"])}, "all:8",
      mtf.LayoutRules([("n", "all")], allow_uneven=True), mode)
