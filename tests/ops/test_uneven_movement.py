"""Data movement under uneven splits, against float64 NumPy with gradients.

Reshapes, shifts and halo exchange, slice/pad/concat, split/stack/unstack,
renames, convolution and pooling, while loops, recomputed and custom
gradients and Print, on the uneven layouts of `mtf_testing.uneven_layouts`
(dimensions "b" and "n" split over `all:8`, `b:2;m:4` and `b:4;m:2`) with
the sizes 5, 7, 12 and 100. Each case table runs as one program per layout
and mode (`check_ops`; SIMD on fewer layouts, see SIMD_LAYOUTS); check_op
also asserts that every output's padding is zero. The padded lowerings of
these operations (no gathering) are pinned by their collectives, which
their cost rules must predict.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.backend import regrid
from tests import mtf_testing

# SIMD programs cost ~20 times an eager run (a tf.function of the whole
# table, inlined once per device), and the eager runs already cover every
# layout with the placement implementation. So SIMD runs on the 2-D layout
# b2m4, and, for the movements between processors that skip wholly padded
# ones (shifts and halos, slices and pads along a split dimension), also
# on all:8 with b = 5, where three processors hold only padding.
SIMD_LAYOUTS = ("b2m4",)
SIMD_LAYOUTS_EMPTY_PROCESSORS = ("all8_b", "b2m4")


def _params(simd_layouts):
  """uneven_layout_mode_params of (b, n), SIMD on `simd_layouts` only."""
  return mtf_testing.uneven_layout_mode_params(
      ["b", "n"], simd_mode_layouts=simd_layouts)


PARAMS = _params(SIMD_LAYOUTS)
PARAMS_EMPTY_PROCESSORS = _params(SIMD_LAYOUTS_EMPTY_PROCESSORS)


def _u(shape, seed):
  return np.random.RandomState(seed).uniform(-1.0, 1.0,
                                             size=shape).astype(np.float32)


def _dims(t, **sizes):
  """`t`'s shape with the named dimensions replaced by new ones."""
  return mtf.Shape([mtf.Dimension(sizes.get(d.name, (d.name, d.size))[0],
                                  sizes.get(d.name, (d.name, d.size))[1])
                    for d in t.shape])


def _np_halo(x, halo, wrap):
  """x[blocks, size]: each block with `halo` entries of the flattened
  neighbours on either side (zeros past the ends unless `wrap`)."""
  blocks, size = x.shape
  flat = x.reshape(-1)
  index = np.arange(-halo, len(flat) + halo)
  padded = (np.take(flat, index % len(flat)) if wrap
            else np.pad(flat, [(halo, halo)]))
  return np.stack([padded[b * size:b * size + size + 2 * halo]
                   for b in range(blocks)])


X = (_u((5, 7, 4), 0), ["b", "n", "d"])      # b 5, n 7
W = (_u((12, 7, 2), 1), ["b", "n", "d"])     # b 12
V = (_u((100, 2), 2), ["n", "d"])            # n 100
Y = (_u((7, 4), 3), ["n", "d"])


def _reshape(new_dims):
  """A check_ops case builder reshaping input "x" to `new_dims`."""
  return lambda mesh, t: {"y": mtf.reshape(t["x"], mtf.Shape(
      [mtf.Dimension(n, s) for n, s in new_dims]))}


def _reshape_ref(sizes):
  return lambda x: {"y": x.reshape(sizes)}


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_reshapes_and_renames(mesh_shape, layout, mode):
  cases = {
      # Padded dimensions kept in place, others split or merged.
      "keep": (_reshape([("b", 5), ("n", 7), ("d0", 2), ("d1", 2)]),
               _reshape_ref((5, 7, 2, 2)), {"x": X}),
      "keep12": (_reshape([("b", 12), ("one", 1), ("n", 7), ("d", 2)]),
                 _reshape_ref((12, 1, 7, 2)), {"x": W}),
      "keep_merge_tail": (_reshape([("b", 5), ("nd", 28)]),
                          _reshape_ref((5, 28)), {"x": X}),
      # Padded dimensions merged with others.
      "merge_bn": (_reshape([("bn", 35), ("d", 4)]),
                   _reshape_ref((35, 4)), {"x": X}),
      "merge_all": (_reshape([("all", 140)]), _reshape_ref((140,)),
                    {"x": X}),
      # A padded dimension split in two (neither part laid out), and one
      # whose first part keeps its name and layout.
      "split100": (_reshape([("n0", 10), ("n1", 10), ("d", 2)]),
                   _reshape_ref((10, 10, 2)), {"x": V}),
      "split12": (_reshape([("b", 6), ("b1", 2), ("n", 7), ("d", 2)]),
                  _reshape_ref((6, 2, 7, 2)), {"x": W}),
      # A dimension moved to another mesh dimension by its new name (n is
      # on m, b on b in the 2-D layouts; on all:8 one of them is).
      # A pending sum (over b's mesh dimension) reshaped keeping n: locally,
      # or to a new dimension "b" (4) that mesh dimension splits.
      "pending": (lambda mesh, t: {
          "y": mtf.reshape(mtf.reduce_sum(t["x"], reduced_dim=t["x"].shape[0]),
                           "n:7;d0:2;d1:2"),
          "z": mtf.reshape(mtf.reduce_sum(t["x"], reduced_dim=t["x"].shape[0]),
                           "n:7;b:4")},
                  lambda x: {"y": x.sum(0).reshape(7, 2, 2), "z": x.sum(0)},
                  {"x": X}),
      "move": (lambda mesh, t: {"y": mtf.rename_dimension(t["x"], "n", "b")},
               lambda x: {"y": x}, {"x": Y}),
      "rename": (lambda mesh, t: {"y": mtf.rename_dimension(t["x"], "d",
                                                            "e")},
                 lambda x: {"y": x}, {"x": X}),
      "anonymize": (lambda mesh, t: {"y": mtf.anonymize(t["x"])},
                    lambda x: {"y": x}, {"x": X}),
      "transpose": (lambda mesh, t: {"y": mtf.transpose(
          t["x"], mtf.Shape(t["x"].shape.dims[::-1]))},
                    lambda x: {"y": x.transpose(2, 1, 0)}, {"x": X}),
      "replace": (lambda mesh, t: {"y": mtf.reshape(
          t["x"], mtf.replace_dimensions(
              t["x"].shape, t["x"].shape.dims[1],
              [mtf.Dimension("n", 7), mtf.Dimension("u", 1)]))},
                  _reshape_ref((5, 7, 1, 4)), {"x": X}),
  }
  mtf_testing.check_ops(cases, mesh_shape, layout, mode)


SHIFTS = {  # name: (input, dimension, axis, offsets without / with wrap)
    "n7": (X, "n", 1, (-3, 9), (2,)),
    "b5": (X, "b", 0, (3,), (-6,)),
    "b12": (W, "b", 0, (-7,), (5,)),
    "n100": (V, "n", 0, (13, -27), (30, -13)),
}


def _shift_case(x, dim, axis, offsets, wrap_offsets):
  def build(mesh, t):
    del mesh
    out = {f"z{i}": mtf.shift(t["x"], o, dim, wrap=False)
           for i, o in enumerate(offsets)}
    out.update({f"w{i}": mtf.shift(t["x"], o, dim, wrap=True)
                for i, o in enumerate(wrap_offsets)})
    return out

  def ref(x):
    out = {f"z{i}": mtf_testing.np_shift(x, o, axis, False)
           for i, o in enumerate(offsets)}
    out.update({f"w{i}": mtf_testing.np_shift(x, o, axis, True)
                for i, o in enumerate(wrap_offsets)})
    return out

  return build, ref, {"x": x}


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         PARAMS_EMPTY_PROCESSORS)
def test_shifts(mesh_shape, layout, mode):
  cases = {name: _shift_case(*spec) for name, spec in SHIFTS.items()}
  # Blocks "n" (7, padded) of 4 entries; the halo of 5 spans two blocks.
  cases["halo"] = (
      lambda mesh, t: {
          "h1": mtf.halo_exchange(t["x"], "n", "d", 1),
          "h5_wrap": mtf.halo_exchange(t["x"], "n", "d", 5, wrap=True)},
      lambda x: {"h1": _np_halo(x, 1, False), "h5_wrap": _np_halo(x, 5, True)},
      {"x": Y})
  cases["dynamic"] = (
      lambda mesh, t: {"y": mtf.dynamic_shift(
          t["x"], mtf.constant(mesh, 2, dtype=tf.int32), "n", wrap=False)},
      lambda x: {"y": mtf_testing.np_shift(x, 2, 1, False)}, {"x": X})
  mtf_testing.check_ops(cases, mesh_shape, layout, mode)


def _np_split(x, sizes, axis):
  return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_slice_pad_concat_split_stack(mesh_shape, layout, mode):
  def along_d(mesh, t):
    del mesh
    x, w = t["x"], t["w"]
    parts = mtf.split(x, "d", [1, 3])
    return {
        "slice": mtf.slice(x, 1, 2, "d"),
        "pad": mtf.pad(x, [1, 2], "d"),
        "concat": mtf.concat([x, x * 2.0], "d"),
        "split0": parts[0], "split1": parts[1],
        "slice12": mtf.slice(w, 1, 1, "d"),
        "print": mtf.Print(x, [mtf.reduce_sum(x)], "x"),
    }

  def along_d_ref(x, w):
    parts = _np_split(x, [1, 3], 2)
    return {"slice": x[:, :, 1:3], "pad": np.pad(x, [(0, 0), (0, 0), (1, 2)]),
            "concat": np.concatenate([x, x * 2], 2),
            "split0": parts[0], "split1": parts[1],
            "slice12": w[:, :, 1:2], "print": x}

  def stacks(mesh, t):
    del mesh
    y, x = t["y"], t["x"]
    return {
        # A new dimension named "b" is split (unevenly) as the rules say.
        "stack_b": mtf.stack([y * float(i + 1) for i in range(5)], "b", 0),
        "stack_s": mtf.stack([y, y * 3.0], "s", 1),
        **{f"unstack_b{i}": u for i, u in enumerate(mtf.unstack(x, "b"))},
        **{f"unstack_d{i}": u for i, u in enumerate(mtf.unstack(x, "d"))},
    }

  def stacks_ref(y, x):
    return {
        "stack_b": np.stack([y * (i + 1) for i in range(5)], 0),
        "stack_s": np.stack([y, y * 3], 1),
        **{f"unstack_b{i}": x[i] for i in range(5)},
        **{f"unstack_d{i}": x[:, :, i] for i in range(4)},
    }

  def along_d_100(mesh, t):
    del mesh
    v = t["v"]
    return {"concat": mtf.concat([v, mtf.slice(v, 1, 1, "d")], "d"),
            "pad": mtf.pad(v, [2, 0], "d")}

  def along_d_100_ref(v):
    return {"concat": np.concatenate([v, v[:, 1:2]], 1),
            "pad": np.pad(v, [(0, 0), (2, 0)])}

  mtf_testing.check_ops(
      {"d": (along_d, along_d_ref, {"x": X, "w": W}),
       "stacks": (stacks, stacks_ref, {"y": Y, "x": X}),
       "d100": (along_d_100, along_d_100_ref, {"v": V})},
      mesh_shape, layout, mode)


# Slices and pads along the split dimensions "b" and "n" of sizes 5, 7, 12
# and 100: case -> (input, [(dimension, axis, "slice", begin, size) or
# (dimension, axis, "pad", before, after)]). On the layouts of PARAMS they
# cross block boundaries, start and end inside one block, cover whole
# blocks and leave processors empty.
ALONG_SPLIT = {
    "x": (X, [("b", 0, "slice", 1, 3), ("b", 0, "pad", 2, 1),
              ("n", 1, "slice", 2, 4), ("n", 1, "pad", 5, 0)]),
    "w": (W, [("b", 0, "slice", 3, 2), ("b", 0, "slice", 6, 6)]),
    "v": (V, [("n", 0, "slice", 10, 80), ("n", 0, "slice", 37, 5),
              ("n", 0, "pad", 13, 15)]),
}
# What the traced modes (SIMD, function, graph) run, to keep their cost
# down: a pad of b (5) and a slice of n (100); their gradients are a slice
# and a pad.
ALONG_SPLIT_TRACED = {
    "x": (X, [("b", 0, "pad", 2, 1)]),
    "v": (V, [("n", 0, "slice", 10, 80)]),
}


def _along_split_case(x, ops):
  """A check_ops case: each of `ops` (dimension, axis, kind, a, b) applied
  to input "x"."""

  def build(mesh, t):
    del mesh
    return {f"y{i}": (mtf.slice(t["x"], a, b, dim) if kind == "slice" else
                      mtf.pad(t["x"], [a, b], dim))
            for i, (dim, _, kind, a, b) in enumerate(ops)}

  def ref(x):
    out = {}
    for i, (_, axis, kind, a, b) in enumerate(ops):
      pads = [(0, 0)] * x.ndim
      pads[axis] = (a, b)
      out[f"y{i}"] = (np.take(x, range(a, a + b), axis=axis)
                      if kind == "slice" else np.pad(x, pads))
    return out

  return build, ref, {"x": x}


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         PARAMS_EMPTY_PROCESSORS)
def test_slice_and_pad_along_a_split_dimension(mesh_shape, layout, mode):
  """Re-partitioned by permutes of the rows that move (backend.regrid);
  the gradients (pad of a slice, slice of a pad) go the same way."""
  table = ALONG_SPLIT if mode == "eager" else ALONG_SPLIT_TRACED
  cases = {name: _along_split_case(*case) for name, case in table.items()}

  def concats(mesh, t):
    del mesh
    x = t["x"]
    parts = mtf.split(x, "b", [3, 2])
    return {"b": mtf.concat([x, x * 2.0], "b"),
            "n": mtf.concat([mtf.slice(x, 1, 2, "n"), x], "n"),
            "split0": parts[0], "split1": parts[1]}

  def concats_ref(x):
    return {"b": np.concatenate([x, x * 2], 0),
            "n": np.concatenate([x[:, 1:3], x], 1),
            "split0": x[:3], "split1": x[3:]}

  if mode == "eager":
    cases["concat"] = (concats, concats_ref, {"x": X})
  else:  # the traced modes: concat and split of b only
    cases["concat"] = (
        lambda mesh, t: {k: v for k, v in concats(mesh, t).items()
                         if k in ("b", "split1")},
        lambda x: {k: v for k, v in concats_ref(x).items()
                   if k in ("b", "split1")},
        {"x": X})
  mtf_testing.check_ops(cases, mesh_shape, layout, mode)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_convolution_and_pooling(mesh_shape, layout, mode):
  """Batch "b" (5) and the input channels "n" (7) padded; a 1-D
  convolution as conv2d over a height of 1, as layers.conv1d does it."""
  def build(mesh, t):
    del mesh
    return {
        "conv2d": mtf.conv2d(t["x"], t["f"], (1, 1), "SAME"),
        "conv1d": mtf.conv2d(t["x1"], t["f1"], (1, 2), "VALID"),
        "max": mtf.max_pool2d(t["p"]),
        "avg": mtf.avg_pool2d(t["p"], ksize=(1, 3)),
    }

  def tf_fn(x, f, x1, f1, p):
    return {
        "conv2d": tf.nn.conv2d(x, f, 1, "SAME"),
        "conv1d": tf.nn.conv2d(x1, f1, (1, 2), "VALID"),
        "max": tf.nn.max_pool2d(p, 2, 2, "VALID"),
        "avg": tf.nn.avg_pool2d(p, (1, 3), (1, 3), "VALID"),
    }

  np_fn, np_grad_fn = mtf_testing.tf_reference(tf_fn)
  mtf_testing.check_op(
      build, np_fn,
      {"x": (_u((5, 3, 3, 7), 4), ["b", "h", "w", "n"]),
       "f": (_u((2, 2, 7, 3), 5), ["fh", "fw", "n", "c"]),
       "x1": (_u((5, 1, 6, 7), 6), ["b", "fake_height", "w", "n"]),
       "f1": (_u((1, 3, 7, 12), 7), ["fh", "fw", "n", "c"]),
       "p": (_u((5, 4, 6, 7), 8), ["b", "h", "w", "n"])},
      mesh_shape, layout, mode, np_grad_fn=np_grad_fn)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_loops_and_gradient_blocks(mesh_shape, layout, mode):
  """while_loop, recompute_grad and custom_gradient with padded tensors
  inside."""
  def loop(mesh, t):
    i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)

    def body(i, x):
      total = mtf.reduce_sum(x, reduced_dim=x.shape.get_dim_by_name("b"))
      return [i + 1, mtf.shift(x, 1, "n", wrap=True) * 0.5, total]

    _, x, acc = mtf.while_loop(lambda i, x: mtf.less(i, 3), body,
                               [i0, t["x"]], has_accumulators=True)
    return {"x": x, "acc": acc}

  def loop_ref(x):
    acc = 0
    for _ in range(3):
      acc = acc + x.sum(0)
      x = np.roll(x, 1, axis=1) * 0.5
    return {"x": x, "acc": acc}

  def recompute(mesh, t):
    del mesh

    def block(x):
      h = mtf.tanh(mtf.reshape(x, _dims(x, d=("e", 4))))
      h = mtf.shift(h, 2, "n", wrap=False)
      return mtf.reduce_sum(h * h, reduced_dim=h.shape.get_dim_by_name("e"))

    return {"y": mtf.recompute_grad(block, [t["x"]])}

  def recompute_ref(x):
    h = mtf_testing.np_shift(np.tanh(x), 2, 1, False)
    return {"y": (h * h).sum(2)}

  def custom(mesh, t):
    del mesh

    def grad_fn(explicit, all_inputs, forward_ops, outputs, output_grads):
      del explicit, forward_ops, outputs
      return [output_grads[0] * 3.0] + [None] * (len(all_inputs) - 1)

    return {"y": mtf.custom_gradient(
        lambda x: mtf.tanh(mtf.shift(x, -1, "b", wrap=True)), grad_fn,
        [t["x"]])}

  def custom_ref(x):
    return {"y": np.tanh(np.roll(x, -1, axis=0))}

  mtf_testing.check_op(loop, loop_ref, {"x": X}, mesh_shape, layout, mode,
                       grad_wrt=[])
  mtf_testing.check_op(
      recompute, recompute_ref, {"x": X}, mesh_shape, layout, mode)
  mtf_testing.check_op(
      custom, custom_ref, {"x": X}, mesh_shape, layout, mode,
      np_grad_fn=lambda cot, x: {"x": 3.0 * cot["y"]})


def _collectives(build, mesh_shape, rules):
  """The collectives of lowering `build(mesh, x[b:5, n:7, d:4])`, checked
  against those the cost model predicts (the operations' cost rules price
  their padded lowerings)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(X[0]), "b:5;n:7;d:4")
  outputs = build(mesh, x)
  rules = mtf.LayoutRules(rules, allow_uneven=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules,
                                                   [""] * 8)
  del outputs
  counted = cost_model.counted_collectives(
      dict(mtf.Lowering(graph, {mesh: impl}).counters))
  assert cost_model.graph_cost(graph, mesh_shape, rules).collectives == (
      counted)
  return {kind for kind, _ in counted}


@pytest.mark.parametrize("name,build,want", [
    ("reshape_keeps_padded", lambda mesh, x: [
        mtf.reshape(x, "b:5;n:7;d0:2;d1:2")], set()),
    ("reshape_pending_sum_keeps_padded", lambda mesh, x: [
        mtf.reshape(mtf.reduce_sum(x, reduced_dim=x.shape[0]), "n:7;b:4")],
     {"reduce_scatter"}),
    ("slice_pad_concat_split", lambda mesh, x: [
        mtf.slice(x, 1, 2, "d"), mtf.pad(x, [1, 0], "d"),
        mtf.concat([x, x], "d"), mtf.split(x, "d", 2)[1]], set()),
    ("stack_padded", lambda mesh, x: [
        mtf.stack([mtf.import_tf_tensor(mesh, tf.constant(Y[0]),
                                        "n:7;d:4")] * 5, "b")], set()),
    ("conv_pool_padded_batch_and_channels", lambda mesh, x: [
        mtf.conv2d(mtf.zeros(mesh, "b:5;h:3;w:3;n:7"),
                   mtf.zeros(mesh, "fh:2;fw:2;n:7;c:3"), (1, 1), "SAME"),
        mtf.max_pool2d(mtf.zeros(mesh, "b:5;h:4;w:4;n:7"))], set()),
    ("slice_pad_split_padded", lambda mesh, x: [
        mtf.slice(x, 1, 3, "n"), mtf.pad(x, [2, 1], "b"),
        mtf.slice(x, 4, 1, "b"), mtf.concat([x, x], "n"),
        mtf.split(x, "b", [2, 3])[1]], {"receive"}),
    ("shift_padded", lambda mesh, x: [
        mtf.shift(x, 3, "n", wrap=False), mtf.shift(x, -2, "b", wrap=True),
        mtf.shift(x, 5, "n", wrap=True)], {"receive"}),
])
def test_padded_movement_lowers_without_gathering(name, build, want):
  """These keep their padded dimensions in place (or move data along one
  with receives): no allconcat, unlike operations the Lowering gathers
  around (see test_uneven_mechanism)."""
  del name
  assert _collectives(build, "b:2;m:4", [("b", "b"), ("n", "m")]) == want


def test_a_slice_of_100_rows_of_128_split_8_ways():
  """The first 100 rows lie on blocks p - 1 and p of 16 (p - 2 and p - 1
  for the last two) of output block p of 13 (padded): two receives move
  101 rows; gathering (allconcat) would move 896."""
  the_plan = regrid.plan(128, 100, 8, 0)
  assert the_plan.widths == {1: 13, 2: 5}
  assert the_plan.receivers == {1: 7, 2: 2}
  assert (the_plan.permute_rows(), the_plan.gather_rows(8)) == (101, 896)
  assert not the_plan.gathers(8)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(_u((128, 2), 4)), "n:128;d:2")
  mtf.slice(x, 0, 100, "n")
  rules = mtf.LayoutRules([("n", "all")], allow_uneven=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", rules, [""] * 8)
  counters = dict(mtf.Lowering(graph, {mesh: impl}).counters)
  assert counters["comm/receive/all/calls"] == 2
  assert counters["comm/receive/all/wire_bytes"] == 101 * 2 * 4
  assert cost_model.graph_cost(graph, "all:8", rules).collectives == (
      cost_model.counted_collectives(counters))


def test_slice_and_pad_gather_when_the_plan_says_so(monkeypatch):
  """When gathering is cheaper (Plan.gathers, forced here) the lowering
  gathers the dimension with one allconcat, and the cost rule says so."""
  monkeypatch.setattr(regrid.Plan, "gathers", lambda self, k: True)
  assert _collectives(
      lambda mesh, x: [mtf.slice(x, 1, 3, "n"), mtf.pad(x, [2, 1], "n")],
      "b:2;m:4", [("b", "b"), ("n", "m")]) == {"allconcat"}


def test_rank_7_with_three_padded_dimensions():
  """Three padded dimensions of a rank-7 tensor (on a 3-D mesh) between
  unpadded ones: importing pads one dimension at a time (TF's Pad takes at
  most 6 groups of padded and unpadded axes), the padding fill broadcasts
  a mask of three axes. Run with TF_ENABLE_ONEDNN_OPTS at 0 and 1."""
  x = _u((2, 3, 2, 3, 2, 3, 2), 9)
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.shift(t["x"] * 2.0, 1, "a", wrap=True)},
      lambda x: {"y": np.roll(x * 2.0, 1, axis=1)},
      {"x": (x, ["z", "a", "y", "c", "w", "e", "v"])}, "p:2;q:2;r:2",
      mtf.LayoutRules([("a", "p"), ("c", "q"), ("e", "r")],
                      allow_uneven=True), "eager")
