"""Operations on tensors of rank 8, 9 and 10, against NumPy, with gradients.

Several of TensorFlow's default kernels take at most 8 dimensions, with
oneDNN on or off: Slice, StridedSlice, Pad, SelectV2 (where, and the
gradients of maximum and minimum), ReluGrad and the other activation
gradient kernels (docs/kernel_limits.md). The lowerings merge neighbouring
axes that such a kernel treats alike before calling it
(slice_utils.slice, slice_utils.pad, slice_utils.elementwise,
slice_utils.broadcasting), so that mtf tensors of any rank run. These
tests pass with TF_ENABLE_ONEDNN_OPTS at 1 and at 0 (Makefile,
BOTH_SETTINGS_TESTS).

Sizes are 1 and 2 (a rank-10 tensor has 64 entries), so one program holds
every case of every rank: one lowering and run per layout and mode.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.backend import slice_utils
from tests import mtf_testing

RANKS = (8, 9, 10)
# d0 and d1 are split by the layouts below; every other dimension has size 2
# or 1 in turn, so that slices of rank 10 keep 6 axes of size 2.
SIZES = {f"d{i}": 2 if i < 2 or i % 2 else 1 for i in range(10)}
SIZES["e0"] = 1  # Split over 2 processors: one holds only padding.
# The 2-D layout splits d0 and d1 evenly, and e0 unevenly: the padding of
# an uneven split is added with Pad, sliced away with Slice and masked with
# SelectV2 (tf.where) at these ranks too.
SPLIT = mtf.LayoutRules([("d0", "rows"), ("d1", "cols"), ("e0", "rows")],
                        allow_uneven=True)


def _names(rank):
  return [f"d{i}" for i in range(rank)]


def _dim(name):
  return mtf.Dimension(name, SIZES[name])


def _shape(names):
  return mtf.Shape([_dim(n) for n in names])


def _array(names, seed):
  """Values of size 0.2 to 2 and either sign: away from the kinks of relu
  and where, for central differences."""
  rng = np.random.RandomState(seed)
  shape = [SIZES[n] for n in names]
  values = rng.uniform(0.2, 2.0, size=shape) * rng.choice([-1, 1], shape)
  return values.astype(np.float32)


def _np_elu(x):
  return np.where(x > 0, x, np.expm1(x))


def _np_selu(x):
  scale, alpha = 1.0507009873554805, 1.6732632423543772
  return scale * np.where(x > 0, x, alpha * np.expm1(x))


def _np_shift(x, offset, axis):
  return mtf_testing.np_shift(x, offset, axis, wrap=False)


def _cases(rank):
  """name -> (build_fn, np_fn, inputs) of every op at `rank`."""
  names = _names(rank)
  last = names[-1]  # Size 2 (rank 8, 10) or 1 (rank 9); never split.
  inner = "d3"  # Size 2, never split.
  # y lacks d2 and d4: broadcast along them.
  y_names = [n for n in names if n not in ("d2", "d4")]
  x = (_array(names, rank), names)
  y = (_array(y_names, rank + 100), y_names)
  # The alternate dimensions, as one merged dimension of size 2 ** k.
  odd = [n for n in names[2:] if SIZES[n] == 2]
  merged = mtf.Dimension("merged", 2 ** len(odd))

  def activations(x):
    return (mtf.relu(x) + mtf.elu(x) + mtf.selu(x) +
            mtf.leaky_relu(x, alpha=0.3) + mtf.softplus(x))

  def np_activations(x):
    return (np.maximum(x, 0) + _np_elu(x) + _np_selu(x) +
            np.where(x > 0, x, 0.3 * x) + np.log1p(np.exp(x)))

  def np_bcast(y):
    return np.expand_dims(y, axis=(2, 4))

  cases = {
      "relu": (lambda m, t: {"y": mtf.relu(t["x"])},
               lambda x: {"y": np.maximum(x, 0)}, {"x": x}),
      "activations": (lambda m, t: {"y": activations(t["x"])},
                      lambda x: {"y": np_activations(x)}, {"x": x}),
      "binary": (lambda m, t: {"y": t["x"] * t["y"] - t["y"] + 2.0 * t["x"]},
                 lambda x, y: {"y": x * np_bcast(y) - np_bcast(y) + 2 * x},
                 {"x": x, "y": y}),
      "maximum": (lambda m, t: {"y": mtf.maximum(t["x"], t["y"])},
                  lambda x, y: {"y": np.maximum(x, np_bcast(y))},
                  {"x": x, "y": y}),
      "where": (lambda m, t: {"y": mtf.where(mtf.greater(t["x"], 0.0),
                                             t["x"], t["y"])},
                lambda x, y: {"y": np.where(x > 0, x, np_bcast(y))},
                {"x": x, "y": y}),
      "slice": (lambda m, t: {"y": mtf.slice(t["x"], 1, 1, inner)},
                lambda x: {"y": x[:, :, :, 1:2]}, {"x": x}),
      "pad": (lambda m, t: {"y": mtf.pad(t["x"], [1, 2], inner)},
              lambda x: {"y": np.pad(x, [(0, 0)] * 3 + [(1, 2)] +
                                     [(0, 0)] * (rank - 4))}, {"x": x}),
      "shift": (lambda m, t: {
          "inner": mtf.shift(t["x"], 1, inner, wrap=False),
          "split": mtf.shift(t["x"], -1, "d0", wrap=False),
          "wrap": mtf.shift(t["x"], 1, "d1", wrap=True)},
                lambda x: {"inner": _np_shift(x, 1, 3),
                           "split": _np_shift(x, -1, 0),
                           "wrap": np.roll(x, 1, axis=1)}, {"x": x}),
      "reduce": (lambda m, t: {
          "sum": mtf.reduce_sum(t["x"], reduced_dim=_dim("d0")),
          "max": mtf.reduce_max(t["x"], output_shape=_shape(
              [n for n in names if n not in ("d1", inner)]))},
                 lambda x: {"sum": np.sum(x, axis=0),
                            "max": np.max(x, axis=(1, 3))}, {"x": x}),
      "einsum": (lambda m, t: {"y": mtf.einsum(
          [t["x"], t["y"]], output_shape=_shape(["d1", "d2", last]))},
                 lambda x, y: {"y": _np_einsum(x, np_bcast(y), names,
                                               ["d1", "d2", last])},
                 {"x": x, "y": y}),
      "reshape": (lambda m, t: {"y": mtf.reshape(
          t["x"], _shape(names[:2]) + [merged] + _shape(
              [n for n in names[2:] if SIZES[n] == 1]))},
                  lambda x: {"y": _np_merge(x, names, odd)}, {"x": x}),
      "concat": (lambda m, t: {"y": mtf.concat([t["x"], t["x"] * 3.0], inner)},
                 lambda x: {"y": np.concatenate([x, 3 * x], axis=3)},
                 {"x": x}),
      # Its gradient is a scatter-add (unsorted_segment_sum).
      "gather": (lambda m, t: {"y": mtf.gather(t["x"], 1, _dim(inner))},
                 lambda x: {"y": x[:, :, :, 1]}, {"x": x}),
      # e0 is split unevenly: exp's padding is zeroed with a mask, and
      # reduce_max fills it with -inf first.
      "uneven": (lambda m, t: {
          "exp": mtf.exp(t["u"]),
          "max": mtf.reduce_max(t["u"], reduced_dim=_dim("e0"))},
                 lambda u: {"exp": np.exp(u), "max": np.max(u, axis=0)},
                 {"u": (_array(["e0"] + names[1:], rank + 200),
                        ["e0"] + names[1:])}),
  }
  return {f"{name}_rank{rank}": case for name, case in cases.items()}


def _np_einsum(x, y, names, out_names):
  letters = "abcdefghij"
  spec = "".join(letters[names.index(n)] for n in names)
  out = "".join(letters[names.index(n)] for n in out_names)
  return np.einsum(f"{spec},{spec}->{out}", x, np.broadcast_to(y, x.shape))


def _np_merge(x, names, merged):
  """x with the dimensions `merged` (all those of size 2 after d1) as one,
  followed by those of size 1."""
  ones = [n for n in names[2:] if n not in merged]
  # Dimensions of size 1 do not move entries: a plain row-major reshape.
  return x.reshape(x.shape[:2] + (-1,) + (1,) * len(ones))


def _all_cases(ranks, names=None):
  cases = {}
  for rank in ranks:
    cases.update({k: v for k, v in _cases(rank).items()
                  if names is None or k.rsplit("_", 1)[0] in names})
  return cases


def test_ops_at_ranks_8_to_10_on_one_processor():
  """Every case of every rank in one program, eagerly."""
  mtf_testing.check_ops(_all_cases(RANKS), "all:1", "", "eager")


def test_split_rank_10_on_placement():
  """Rank 10 on a 2-D mesh, PlacementMeshImpl in graph mode: slicing the
  inputs into processors, allconcat of the outputs, a shift along a split
  dimension (between processors) and an unevenly split dimension."""
  mtf_testing.check_ops(_all_cases([10]), "rows:2;cols:2", SPLIT, "graph")


def test_split_rank_10_on_simd():
  """Rank 10 on a 2-D mesh, SimdMeshImpl: each processor slices its part
  (a begin known at run time), relu and its gradient, an uneven split, and
  allconcat of the outputs. The other cases lower there as on placement."""
  mtf_testing.check_ops(_all_cases([10], ["relu", "uneven"]),
                        "rows:2;cols:2", SPLIT, "simd")


def test_slice_and_pad_with_many_axes_touched():
  """slice_utils.tf_slice and tf_pad when more axes are cut or padded
  than the kernels take at once (in stages), with a begin tensor."""
  x = np.random.RandomState(0).uniform(size=[3] * 10).astype(np.float32)
  begin = [1, 0, 1, 2, 0, 1, 1, 0, 1, 1]
  size = [1, 2, 2, 1, 1, -1, 2, 3, 1, 2]
  want = x[tuple(slice(b, None if s == -1 else b + s)
                 for b, s in zip(begin, size))]
  np.testing.assert_array_equal(
      slice_utils.tf_slice(tf.constant(x), begin, size).numpy(), want)
  np.testing.assert_array_equal(
      slice_utils.tf_slice(tf.constant(x), tf.constant(begin),
                           list(want.shape)).numpy(), want)
  paddings = [[1, 0], [0, 0], [0, 2], [1, 1], [0, 0], [0, 0], [2, 0],
              [0, 1], [1, 0], [0, 0]]
  np.testing.assert_array_equal(
      slice_utils.tf_pad(tf.constant(x), paddings, 3.0).numpy(),
      np.pad(x, paddings, constant_values=3.0))


def test_rank_9_slice_of_unknown_sizes_is_an_mtf_error():
  """Axes can be merged only with static sizes: otherwise an mtf error
  names the kernel, the rank and the limit, not TensorFlow's."""
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None] + [2] * 8)
    with pytest.raises(mtf.ShapeError, match=r"Slice.*rank 9.*at most 8"):
      slice_utils.tf_slice(x, [0] * 9, [1] + [2] * 8)


def test_rank_10_variable_and_random_on_simd():
  """A rank-10 variable split unevenly on SimdMeshImpl (its initial value
  sliced into processors), a gather from it, relu's gradient into it, and
  a layout-invariant random tensor (padded and sliced per processor)."""
  names = ["e0"] + _names(10)[1:]

  def build(mesh):
    v = mtf.get_variable(mesh, "v", _shape(names),
                         initializer=tf.random_normal_initializer(seed=1))
    outputs = {"r": mtf.random_uniform(mesh, _shape(names), seed=3),
               "g": mtf.gather(v, 1, _dim("d3"))}
    return outputs, mtf.reduce_sum(mtf.relu(v)), {"v": v}

  got, _ = mtf_testing.run_program("rows:2;cols:2", SPLIT, "simd", build)
  want, _ = mtf_testing.run_program("all:1", "", "eager", build)
  for key in ("r", "g", "v", "d_v"):
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
  np.testing.assert_array_equal(got["d_v"], (want["v"] > 0) * 1.0)
  np.testing.assert_array_equal(got["g"], want["v"][:, :, :, 1])


def _variable_values(impl, names, scale):
  """Variable `v` of those dimensions, scaled in place by `scale`, read
  back whole."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  v = mtf.get_variable(mesh, "v", _shape(names),
                       initializer=tf.random_normal_initializer(seed=1))
  v = mtf.read_variable(v, dependencies=[mtf.assign(v, v * scale)])
  return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(v).numpy()


def test_rank_10_checkpoint_restores_into_an_uneven_split(tmp_path):
  """Restoring pads each processor's block back to its slice (Pad)."""
  names = ["e0"] + _names(10)[1:]

  path = str(tmp_path / "ckpt")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:2", SPLIT)
  saved = _variable_values(impl, names, 3.0)
  tf.train.Checkpoint(model=impl).write(path)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:2", SPLIT)
  tf.train.Checkpoint(model=impl).restore(path).expect_partial()
  np.testing.assert_array_equal(_variable_values(impl, names, 1.0), saved)


def test_rank_10_split_checkpoint_restores_under_other_layouts(tmp_path):
  """TF's sliced checkpoints stop at rank 8 (RestoreV2 aborts the process
  reading a block of a rank-9 tensor): a variable of higher rank is saved
  as one whole tensor, and restores under any layout."""
  names = _names(10)

  path = str(tmp_path / "ckpt")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:2", SPLIT)
  saved = _variable_values(impl, names, 3.0)
  tf.train.Checkpoint(model=impl).write(path)
  (key,) = [k for k, _ in tf.train.list_variables(path)
            if k.startswith("model/")]
  np.testing.assert_array_equal(tf.train.load_variable(path, key), saved)
  for mesh_shape, rules in (("all:1", []), ("rows:2;cols:2",
                                            [("d1", "rows"), ("d3", "cols")])):
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules)
    tf.train.Checkpoint(model=impl).restore(path).expect_partial()
    np.testing.assert_array_equal(_variable_values(impl, names, 1.0), saved)
