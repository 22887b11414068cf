"""Einsum over named dimensions against NumPy, under every standard layout and
mode; lazy allreduce combining."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

SIZES = {"a": 8, "b": 16, "c": 8}
# The all:8 layouts split each of a, b, c in turn; "2d" splits a and b.
PARAMS = mtf_testing.layout_mode_params(["a", "b", "c"])


def _dims(names):
  return [mtf.Dimension(n, SIZES[n]) for n in names]


def _array(names, seed, integer=False):
  shape = [SIZES[n] for n in names]
  rng = np.random.RandomState(seed)
  if integer:
    return rng.randint(-5, 6, size=shape).astype(np.int32)
  return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _input(names, seed, integer=False):
  names = names.split(",") if names else []
  return (_array(names, seed, integer), names)


# name -> (fn(*tensors) -> mtf Tensor, NumPy einsum equation, inputs); the
# equation's letters are the dimension names, the inputs are in its order.
CASES = {
    "matmul": (
        lambda x, w: mtf.einsum([x, w], output_shape=_dims("ac")),
        "ab,bc->ac", [_input("a,b", 0), _input("b,c", 1)]),
    "matmul_alias": (
        lambda x, w: mtf.matmul(x, w),
        "ab,bc->ac", [_input("a,b", 0), _input("b,c", 1)]),
    "batch": (
        lambda x, w: mtf.einsum([x, w], output_shape=_dims("ac")),
        "ab,abc->ac", [_input("a,b", 2), _input("a,b,c", 3)]),
    "three_operands": (
        lambda x, u, w: mtf.einsum([x, u, w], output_shape=_dims("ca")),
        "ab,b,bc->ca", [_input("a,b", 4), _input("b", 5), _input("b,c", 6)]),
    "outer": (
        lambda u, v: mtf.einsum([u, v], output_shape=_dims("ac")),
        "a,c->ac", [_input("a", 7), _input("c", 8)]),
    "broadcast_output": (
        # c is in no input: the output is broadcast along it.
        lambda x, u: mtf.einsum([x, u], output_shape=_dims("ca")),
        "ab,b->ca", [_input("a,b", 9), _input("b", 10)]),
    "reduced_dims": (
        lambda x, w: mtf.einsum([x, w], reduced_dims=_dims("b")),
        "ab,bc->ac", [_input("a,b", 11), _input("b,c", 12)]),
    "default_output": (
        # Dimensions appearing once (a, c) are kept, in order of appearance.
        lambda x, w: mtf.einsum([x, w]),
        "ab,bc->ac", [_input("a,b", 13), _input("b,c", 14)]),
    "dot_to_scalar": (
        lambda x, y: mtf.einsum([x, y], output_shape=[]),
        "ab,ab->", [_input("a,b", 15), _input("a,b", 16)]),
    "transpose": (
        lambda x: mtf.transpose(x, _dims("ba")),
        "ab->ba", [_input("a,b", 17)]),
    "integer": (
        lambda x, w: mtf.einsum([x, w], output_shape=_dims("ca")),
        "ab,bc->ca", [_input("a,b", 18, integer=True),
                      _input("b,c", 19, integer=True)]),
    "integer_broadcast_output": (
        lambda x: mtf.einsum([x], output_shape=_dims("cb")),
        "ab->cb", [_input("a,b", 20, integer=True)]),
}


def _np_einsum(equation):
  """NumPy einsum, with output dimensions missing from the inputs broadcast."""
  ins, out = equation.split("->")
  present = "".join(d for d in out if d in ins)

  def fn(*arrays):
    y = np.einsum(f"{ins}->{present}", *arrays)
    for axis, d in enumerate(out):
      if d not in ins:
        y = np.expand_dims(y, axis)
    return np.broadcast_to(y, [SIZES[d] for d in out]).copy()
  return fn


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_einsum(mesh_shape, layout, mode):
  """Values and gradients of einsum against np.einsum (every case in one
  program; mtf_testing.check_ops checks each as if alone)."""
  cases = {}
  for case, (mtf_fn, equation, inputs) in sorted(CASES.items()):
    names = [f"x{i}" for i in range(len(inputs))]
    cases[case] = (
        lambda mesh, t, fn=mtf_fn, names=names: {
            "y": fn(*[t[n] for n in names])},
        lambda np_fn=_np_einsum(equation), names=names, **arrays: {
            "y": np_fn(*[arrays[n] for n in names])},
        dict(zip(names, inputs)))
  mtf_testing.check_ops(cases, mesh_shape, layout, mode)


@pytest.mark.parametrize("make,want", [
    (lambda x, w: mtf.einsum([x, w]), "ac"),
    (lambda x, w: mtf.einsum([w, x]), "ca"),
    (lambda x, w: mtf.einsum([x, w], reduced_dims=_dims("b")), "ac"),
    (lambda x, w: mtf.einsum([x, w], reduced_dims=_dims("ab")), "c"),
    (lambda x, w: mtf.einsum([x, w], reduced_dims=_dims("b")[0]), "ac"),
    (lambda x, w: mtf.matmul(x, w, reduced_dims=_dims("b")), "ac"),
    (lambda x, w: mtf.einsum([x]), "ab"),
    (lambda x, w: mtf.transpose(x, _dims("ba")), "ba"),
])
def test_output_shape(make, want):
  """Default output shapes: dimensions appearing once, in order."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("ab"))
  w = mtf.zeros(mesh, _dims("bc"))
  assert make(x, w).shape == mtf.Shape(_dims(want))


# Dimensions of different inputs split over one mesh dimension: each
# processor's partial product would mix blocks that must not meet, so the
# lowering gathers the summed-over ones first (and the result is unchanged).
CONFLICTING_SPLITS = [
    pytest.param("ab,c->ac", "all:8", "b:all;c:all", id="reduced_and_kept"),
    pytest.param("ab,c->a", "all:8", "b:all;c:all", id="two_reduced"),
    pytest.param("ab,c->a", "rows:2;cols:4", "a:cols;b:rows;c:rows",
                 id="two_reduced_2d"),
    pytest.param("ab,c->cb", "rows:2;cols:4", "a:rows;b:cols;c:rows",
                 id="reduced_and_kept_2d"),
]


@pytest.mark.parametrize("mode", mtf_testing.MODES)
@pytest.mark.parametrize("equation,mesh_shape,layout", CONFLICTING_SPLITS)
def test_conflicting_splits(equation, mesh_shape, layout, mode):
  """Inputs with different dimensions on one mesh dimension."""
  in_names = equation.split("->")[0].split(",")
  out_names = equation.split("->")[1]
  names = [f"x{i}" for i in range(len(in_names))]
  inputs = {n: (_array(d, seed=i), list(d))
            for i, (n, d) in enumerate(zip(names, in_names))}
  np_fn = _np_einsum(equation)
  mtf_testing.check_op(
      lambda mesh, t: {"y": mtf.einsum([t[n] for n in names],
                                       output_shape=_dims(out_names))},
      lambda **arrays: {"y": np_fn(*[arrays[n] for n in names])},
      inputs, mesh_shape, layout, mode)


def test_size_mismatch_names_dimension():
  """Same name, different sizes: a ShapeError that names the dimension."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("ab"))
  w = mtf.zeros(mesh, [mtf.Dimension("b", 4), mtf.Dimension("c", 8)])
  with pytest.raises(mtf.ShapeError, match=r"'b'.*16.*4|'b'.*4.*16"):
    mtf.einsum([x, w], output_shape=_dims("ac"))
  with pytest.raises(mtf.ShapeError, match="'b'"):
    mtf.einsum([x, w])
  with pytest.raises(mtf.ShapeError, match="'b'"):
    mtf.einsum([x], output_shape=[mtf.Dimension("a", 8),
                                  mtf.Dimension("b", 4)])


def test_bad_reduced_dims_and_transpose():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("ab"))
  with pytest.raises(mtf.ShapeError, match="c"):
    mtf.einsum([x], reduced_dims=_dims("c"))
  with pytest.raises(mtf.ShapeError, match="transpose"):
    mtf.transpose(x, _dims("ac"))


def test_dtype_mismatch_is_type_error():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, _dims("ab"))
  i = mtf.zeros(mesh, _dims("bc"), dtype=tf.int32)
  with pytest.raises(TypeError, match="int32"):
    mtf.einsum([x, i])


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_lazy_allreduce_combines(mode):
  """y1 + y2 of two contractions over a split dimension: one allreduce."""
  x, w1, w2 = _array("ab", 0), _array("bc", 1), _array("bc", 2)
  lowerings = []

  impl = mtf_testing.make_impl(mode, "all:8", "b:all")

  def build_and_lower():
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    imported = [mtf.import_tf_tensor(mesh, tf.constant(v), _dims(names))
                for v, names in ((x, "ab"), (w1, "bc"), (w2, "bc"))]
    tx, tw1, tw2 = imported
    y1 = mtf.einsum([tx, tw1], reduced_dims=_dims("b"))
    y2 = mtf.einsum([tx, tw2], reduced_dims=_dims("b"))
    z = y1 + y2
    lowering = mtf.Lowering(mesh.graph, {mesh: impl})
    lowerings.append(lowering)
    return lowering, lowering.export_to_tf_tensor(z)

  z = mtf_testing.run_in_mode(mode, build_and_lower, impl)
  np.testing.assert_allclose(z, x @ w1 + x @ w2, rtol=1e-5, atol=1e-5)
  counters = dict(lowerings[-1].counters)
  allreduces = {k: v for k, v in counters.items()
                if k.startswith("comm/allreduce/") and k.endswith("/calls")}
  assert allreduces == {"comm/allreduce/all/calls": 1}, counters
