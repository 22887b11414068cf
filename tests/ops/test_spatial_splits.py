"""Pooling and convolution along split spatial dimensions, with gradients.

The spatial dimensions "h" and "w" split over `all:8`, `b:2;m:4` and
`b:4;m:2` (mtf_testing.uneven_layouts), evenly and not (sizes 5, 7 and 12;
windows and filters that cross block boundaries), against TensorFlow's
own kernels in float64. Each table runs as one program per layout and mode.
The lowerings move only the window rows that change processor; their
collectives are pinned and must be what the cost rules predict.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import cost_model
from mesh_tensorflow.auto_mtf import valid_layouts
from tests import mtf_testing

# Every layout in eager mode; SIMD, function and graph on b2m4 (their
# tracing and collectives cost most of the file's time).
PARAMS = mtf_testing.uneven_layout_mode_params(
    ["h", "w"], modes=("eager", "simd", "function", "graph"),
    v1_shapes_layouts=(), every_layout_modes=("eager",))


def _u(shape, seed):
  return np.random.RandomState(seed).uniform(-1.0, 1.0,
                                             size=shape).astype(np.float32)


def _tf_pool(x, ksize, reduce_fn):
  """Non-overlapping VALID pooling of x[b, spatial..., c] in TF ops (so
  that float64 and its gradients work in any rank)."""
  shape = [x.shape[0]]
  begin, size = [0], [x.shape[0]]
  for n, k in zip(x.shape[1:-1], ksize):
    shape += [n // k, k]
    begin.append(0)
    size.append(n // k * k)
  x = tf.slice(x, begin + [0], size + [x.shape[-1]])
  x = tf.reshape(x, shape + [x.shape[-1]])
  return reduce_fn(x, axis=list(range(2, 2 * len(ksize) + 1, 2)))


# (name, mtf function, TF reduction, ksize, shape [b, (d,) h, w, c]).
POOLS = [
    ("max_7x12", mtf.max_pool2d, tf.reduce_max, (2, 3), (2, 7, 12, 2)),
    ("avg_12x5", mtf.avg_pool2d, tf.reduce_mean, (3, 2), (1, 12, 5, 2)),
    ("avg3d_5x7", mtf.avg_pool3d, tf.reduce_mean, (1, 2, 3),
     (1, 2, 5, 7, 2)),
]
# (name, x shape [b, h, w, cin], filter [fh, fw, cin, cout], strides,
# padding): SAME and VALID, odd and even filters, strides 1 to 3.
CONVS = [
    ("same_7x12", (1, 7, 12, 2), (3, 3, 2, 2), (1, 1), "SAME"),
    ("valid_12x5_s2", (1, 12, 5, 2), (3, 2, 2, 1), (2, 1), "VALID"),
    ("same_5x7_s3", (2, 5, 7, 1), (2, 4, 1, 2), (3, 2), "SAME"),
    ("valid_12x12", (1, 12, 12, 1), (2, 2, 1, 1), (1, 1), "VALID"),
    ("same3d_5x7", (1, 2, 5, 7, 1), (1, 3, 2, 1, 1), (1, 2, 1), "SAME"),
]
# Transposed: x [b, h, w, cin] and filter [fh, fw, cout, cin].
CONV_TRANSPOSES = [
    ("t_same_7x5_s2", (1, 7, 5, 2), (3, 3, 1, 2), (2, 2), "SAME"),
    ("t_valid_5x6", (1, 5, 6, 1), (2, 3, 2, 1), (1, 2), "VALID"),
]
# What the traced modes run (SIMD: the convolution only); tracing costs.
SHORT = ("max_7x12", "same_7x12")


def _transpose_size(n, k, s, padding):
  return n * s if padding == "SAME" else n * s + max(k - s, 0)


def _program(names):
  """(build, np_fn, inputs, np_grad_fn) of the cases in `names`, in one
  program; references: TF's own kernels in float64."""
  inputs, builders, references = {}, [], []
  for i, (name, fn, reduce_fn, ksize, shape) in enumerate(POOLS):
    if name not in names:
      continue
    dims = ["b", "h", "w", "c"] if len(shape) == 4 else ["b", "d", "h",
                                                         "w", "c"]
    inputs[name] = (_u(shape, i), [f"{name}_{d}" if d in "bc" else d
                                   for d in dims])
    builders.append(lambda t, name=name, fn=fn, k=ksize: (name, fn(
        t[name], ksize=k)))
    references.append(lambda a, name=name, r=reduce_fn, k=ksize: (
        name, _tf_pool(a[name], k, r)))
  for transpose, table in ((False, CONVS), (True, CONV_TRANSPOSES)):
    for i, (name, x_shape, f_shape, strides, padding) in enumerate(table):
      if name not in names:
        continue
      c_in, c_out = ("cout", "cin") if transpose else ("cin", "cout")
      spatial = ["d", "h", "w"][5 - len(x_shape):]
      inputs[name] = (_u(x_shape, 10 + i), [f"{name}_b"] + spatial + [
          f"{name}_cin"])
      inputs[name + "_f"] = (_u(f_shape, 20 + i), [
          f"{name}_f{d}" for d in spatial] + [f"{name}_{c_in}",
                                               f"{name}_{c_out}"])
      mtf_fn = (mtf.conv2d_transpose if transpose else
                mtf.conv3d if len(spatial) == 3 else mtf.conv2d)
      builders.append(
          lambda t, name=name, f=mtf_fn, s=strides, p=padding: (
              name, f(t[name], t[name + "_f"], s, p)))

      def ref(a, name=name, s=strides, p=padding, transpose=transpose):
        x, f = a[name], a[name + "_f"]
        if not transpose:
          return name, (tf.nn.conv3d(x, f, [1, *s, 1], p) if len(s) == 3
                        else tf.nn.conv2d(x, f, s, p))
        out = [x.shape[0]] + [
            _transpose_size(n, k, st, p)
            for n, k, st in zip(x.shape[1:3], f.shape[:2], s)] + [f.shape[2]]
        return name, tf.nn.conv2d_transpose(x, f, out, s, p)

      references.append(ref)

  def build(mesh, t):
    del mesh
    return dict(b(t) for b in builders)

  np_fn, np_grad_fn = mtf_testing.tf_reference(
      lambda **a: dict(r(a) for r in references))
  return build, np_fn, inputs, np_grad_fn


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_pooling_and_convolution_along_split_spatial_dimensions(
    mesh_shape, layout, mode):
  """Windows and filters that cross blocks (7 rows over 8 processors, 12
  over 8 pooled in threes, SAME and VALID, strides 1 to 3): each output
  block gets the rows its windows read (the halo) by receives from the
  processors that hold them. The gradients send the rows back (input
  gradients, and the transposed convolution, add overlapping halos); the
  filter gradient sums over the split dimension too."""
  names = ({c[0] for c in POOLS + CONVS + CONV_TRANSPOSES}
           if mode == "eager" else set(SHORT[1:] if mode == "simd" else
                                       SHORT))
  build, np_fn, inputs, np_grad_fn = _program(names)
  mtf_testing.check_op(build, np_fn, inputs, mesh_shape, layout, mode,
                       np_grad_fn=np_grad_fn)


def _collectives(build, mesh_shape, rules):
  """The collectives (kind, mesh dims) of lowering build(mesh), checked
  against what the cost model predicts."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  build(mesh)
  rules = mtf.LayoutRules(rules, allow_uneven=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, rules, [""] * mtf.convert_to_shape(mesh_shape).size)
  counters = dict(mtf.Lowering(graph, {mesh: impl}).counters)
  counted = cost_model.counted_collectives(counters)
  assert cost_model.graph_cost(graph, mesh_shape, rules).collectives == (
      counted)
  return counters


def _pool_and_gradient(mesh, x_dims, ksize):
  x = mtf.zeros(mesh, x_dims)
  y = mtf.max_pool2d(x, ksize=ksize)
  mtf.gradients([mtf.reduce_sum(y)], [x])


def test_pooling_collectives():
  """h = 12 over 8 (blocks of 2) pooled by 3 (output 4 over 8: blocks of
  1): output block p reads rows [3p, 3p + 3) of blocks p - ..., so the
  receives move only those rows, and the gradient moves them back; whole
  windows in each block (h = 16, windows of 2) move nothing."""
  counters = _collectives(
      lambda mesh: _pool_and_gradient(mesh, "b:2;h:12;w:4;c:2", (3, 2)),
      "all:8", [("h", "all")])
  assert counters["comm/receive/all/calls"] > 0
  assert "comm/allconcat/all/calls" not in counters
  counters = _collectives(
      lambda mesh: _pool_and_gradient(mesh, "b:2;h:16;w:4;c:2", (2, 2)),
      "all:8", [("h", "all")])
  assert not [k for k in counters if k.startswith("comm/")]


def _conv_and_gradients(mesh, x_dims, f_dims, strides=(1, 1),
                        padding="SAME", transpose=False):
  x = mtf.zeros(mesh, x_dims)
  f = mtf.zeros(mesh, f_dims)
  conv = mtf.conv2d_transpose if transpose else mtf.conv2d
  y = conv(x, f, strides, padding)
  mtf.gradients([mtf.reduce_sum(y * y)], [x, f])


def test_convolution_collectives():
  """conv2d SAME 3x3 of h = 12 over rows:4 (blocks of 3): output block p
  needs row 3p - 1 of p - 1 and row 3p + 3 of p + 1, one receive per
  side, 3 processors each; its input gradient sends those rows back (two
  more) and its filter gradient is a sum pending over rows too. Over 2
  processors the two neighbours' receives cost more calls than the one
  step of an allconcat, so the forward windows are gathered, as the plan
  and the cost rule say."""
  counters = _collectives(
      lambda mesh: _conv_and_gradients(mesh, "b:2;h:12;w:4;cin:2",
                                       "fh:3;fw:3;cin:2;cout:2"),
      "rows:4", [("h", "rows")])
  assert counters["comm/receive/rows/calls"] == 4 + 2
  assert "comm/allconcat/rows/calls" not in counters
  counters = _collectives(
      lambda mesh: _conv_and_gradients(mesh, "b:2;h:12;w:4;cin:2",
                                       "fh:3;fw:3;cin:2;cout:2"),
      "rows:2", [("h", "rows")])
  assert counters["comm/allconcat/rows/calls"] == 2
  _collectives(
      lambda mesh: _conv_and_gradients(mesh, "b:2;h:7;w:5;cin:2",
                                       "fh:3;fw:3;cout:1;cin:2", (2, 2),
                                       "VALID", transpose=True),
      "rows:4;cols:2", [("h", "rows"), ("w", "cols")])


def test_auto_mtf_sees_spatial_splits_as_valid():
  """The layout search's filter reads the operations' marks: spatial
  dimensions of convolutions and pooling are splittable, filter-spatial
  ones are not."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "b:2;h:12;w:4;cin:2")
  f = mtf.zeros(mesh, "fh:3;fw:3;cin:2;cout:2")
  mtf.max_pool2d(mtf.conv2d(x, f, (1, 1), "SAME"))
  validator = valid_layouts.LayoutValidator(graph, "m1:4;m2:2")
  assert validator.splittable_mtf_dimension_names == {"b", "cin", "cout",
                                                      "h", "w"}
