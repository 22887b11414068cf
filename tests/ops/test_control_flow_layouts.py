"""Operations inside loop, custom-gradient and recompute bodies are checked
against the layout and lowered exactly as outside them.

Each program runs plain, and inside a body, under layouts that split its
dimensions, in every mode: inside a body it must give the one-processor
answer (values and gradients), or, where the plain program is refused, the
same mtf error. Before the Lowering looked into while loops, a concat along
a split dimension in a loop body returned a wrong answer, and split, slice
and pad ended in TensorFlow errors.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

A = mtf.Dimension("a", 8)
B = mtf.Dimension("b", 8)


def _concat(x, y):
  return mtf.concat([mtf.slice(x, 0, 4, "b"), mtf.slice(y, 4, 4, "b")], "b")


def _split(x, y):
  first, second = mtf.split(x, B, [3, 5])
  return mtf.concat([second, first], "b") * y


def _pad(x, y):
  return mtf.pad(mtf.slice(x, 1, 6, "b"), [2, 0], "b") + y


def _reduce(x, y):
  return mtf.reduce_sum(x * y, reduced_dim=B) * y


def _einsum_shift(x, y):
  z = mtf.einsum([x, mtf.rename_dimension(y, "a", "c")], [A, mtf.Dimension(
      "c", 8)])
  return mtf.shift(mtf.rename_dimension(z, "c", "b"), 1, A, wrap=False) + x


PROGRAMS = {"concat": _concat, "split": _split, "pad": _pad,
            "reduce": _reduce, "einsum_shift": _einsum_shift}


def _plain(fn, x, y):
  return fn(x, y)


def _loop(fn, x, y):
  """One iteration of a loop adding fn(x, y) to zeros."""
  i0 = mtf.constant(x.mesh, 0, mtf.Shape([]), dtype=tf.int32)
  _, out = mtf.while_loop(
      lambda i, acc: mtf.less(i, 1),
      lambda i, acc: [i + 1, acc + fn(x, y)],
      [i0, mtf.zeros(x.mesh, x.shape)])
  return out


def _custom_gradient(fn, x, y):
  """fn with its own gradient, computed through its forward operations."""
  def grad_fn(explicit, all_inputs, forward_operations, outputs, dys):
    del explicit
    forward = outputs[0].operation.forward_outputs
    return mtf.gradients(forward, all_inputs, grad_ys=dys,
                         operations=forward_operations)

  return mtf.custom_gradient(fn, grad_fn, [x, y])


def _recompute(fn, x, y):
  return mtf.recompute_grad(fn, [x, y])


def _loop_recompute_gradient(fn, x, y):
  """A loop body that differentiates a recomputed block (as
  serialize_training_step's body differentiates a model)."""
  def body(i, acc):
    z = mtf.recompute_grad(fn, [x, y])
    (dx,) = mtf.gradients([mtf.reduce_sum(z * z)], [x])
    return [i + 1, acc + z + dx]

  i0 = mtf.constant(x.mesh, 0, mtf.Shape([]), dtype=tf.int32)
  _, out = mtf.while_loop(lambda i, acc: mtf.less(i, 1), body,
                          [i0, mtf.zeros(x.mesh, x.shape)])
  return out


def _plain_recompute_gradient(fn, x, y):
  """What _loop_recompute_gradient computes, without the loop."""
  z = fn(x, y)
  (dx,) = mtf.gradients([mtf.reduce_sum(z * z)], [x])
  return z + dx


# body -> (how to build it, the same program without a body). Outputs of
# loops cannot be differentiated; the others are, with respect to x and y.
BODIES = {
    "loop": (_loop, _plain),
    "custom_gradient": (_custom_gradient, _plain),
    "recompute": (_recompute, _plain),
    "loop_recompute_gradient": (_loop_recompute_gradient,
                                _plain_recompute_gradient),
}
LAYOUTS = [("all2_a", "all:2", "a:all"), ("all2_b", "all:2", "b:all"),
           ("2d", "rows:2;cols:2", "a:rows;b:cols")]
_X = np.random.RandomState(0).uniform(-1, 1, (8, 8)).astype(np.float32)
_Y = np.random.RandomState(1).uniform(-1, 1, (8, 8)).astype(np.float32)
_COTANGENT = np.random.RandomState(2).uniform(-1, 1, (8, 8)).astype(
    np.float32)


def _run(cases, mesh_shape, layout, mode):
  """Runs the cases {key: (wrap, fn)} in one program; returns
  {key: {"out": ..., "dx": ..., "dy": ...}} as NumPy arrays (no gradients
  for outputs of loops)."""
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(_X), [A, B], name="x")
    y = mtf.import_tf_tensor(mesh, tf.constant(_Y), [A, B], name="y")
    c = mtf.import_tf_tensor(mesh, tf.constant(_COTANGENT), [A, B])
    fetches = {}
    for key, (wrap, fn) in sorted(cases.items()):
      out = wrap(fn, x, y)
      fetches[key] = {"out": out}
      if not isinstance(out.operation, mtf.WhileLoopOperation):
        fetches[key]["dx"], fetches[key]["dy"] = mtf.gradients(
            [mtf.reduce_sum(out * c)], [x, y])
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, tf.nest.map_structure(lowering.export_to_tf_tensor,
                                           fetches)

  # Without autograph, an mtf error raised while tracing keeps its type.
  if mode == "function":
    result = tf.function(lambda: build_and_lower()[1], autograph=False)()
  elif mode == "simd":
    result = tf.function(
        lambda: impl.run_each(lambda: build_and_lower()[1]),
        autograph=False)()[0]
  else:
    return mtf_testing.run_in_mode(mode, build_and_lower)
  return tf.nest.map_structure(np.asarray, result)


def _error(wrap, fn, mesh_shape, layout, mode):
  """None, or (error type, message without op numbers) of one case."""
  try:
    _run({"case": (wrap, fn)}, mesh_shape, layout, mode)
  except (ValueError, TypeError, tf.errors.OpError) as e:
    # Names made unique by the graph (add_1) differ inside a body.
    return type(e), re.sub(r"_\d+'", "'", str(e))
  return None


def _layout_error(wrap, fn, mesh_shape, layout):
  """The error of a case found by lowering it (into a graph that is never
  run: layout errors come before any TensorFlow op is made)."""
  with tf.Graph().as_default():
    try:
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      x = mtf.import_tf_tensor(mesh, tf.constant(_X), [A, B], name="x")
      y = mtf.import_tf_tensor(mesh, tf.constant(_Y), [A, B], name="y")
      wrap(fn, x, y)
      mtf.Lowering(graph, {mesh: mtf.placement_mesh_impl.PlacementMeshImpl(
          mesh_shape, layout)})
    except (ValueError, TypeError) as e:
      return type(e), re.sub(r"_\d+'", "'", str(e))
  return None


_ONE_PROCESSOR = []


def _one_processor_answers():
  """Every case with and without its body, on one processor."""
  if not _ONE_PROCESSOR:
    cases = {}
    for name, fn in PROGRAMS.items():
      for body, (wrap, plain) in BODIES.items():
        cases[f"{name}/{body}"] = (plain, fn)
    _ONE_PROCESSOR.append(_run(cases, "all:1", "", "eager"))
  return _ONE_PROCESSOR[0]


# Every layout eagerly, every mode (SIMD too) on the 2-D layout, which
# splits both dimensions, so meets every error the others do and runs its
# collectives over either mesh axis, as mtf_testing.layout_mode_params has
# it.
@pytest.mark.parametrize("mesh_shape,layout,mode", [
    pytest.param(mesh_shape, layout, mode, id=f"{mode}-{layout_id}")
    for layout_id, mesh_shape, layout in LAYOUTS
    for mode in mtf_testing.MODES
    if layout_id == "2d" or mode == "eager"])
def test_bodies_agree_with_one_processor_or_fail_as_outside(
    mesh_shape, layout, mode):
  where = f"on {mesh_shape} {layout!r} in {mode} mode"
  runnable = {}
  for name, fn in sorted(PROGRAMS.items()):
    for body, (wrap, plain) in sorted(BODIES.items()):
      outside = _layout_error(plain, fn, mesh_shape, layout)
      if outside is None:
        runnable[f"{name}/{body}"] = (wrap, fn)
        continue
      assert issubclass(outside[0], mtf.LayoutError), (name, body, outside)
      if mode != "eager":
        assert _error(plain, fn, mesh_shape, layout, mode) == outside
      assert _error(wrap, fn, mesh_shape, layout, mode) == outside, (
          f"{name} in {body} {where}")
  want = _one_processor_answers()
  got = _run(runnable, mesh_shape, layout, mode)
  for key in runnable:
    for k, value in got[key].items():
      np.testing.assert_allclose(value, want[key][k], rtol=1e-5, atol=1e-5,
                                 err_msg=f"{key} {where}: {k}")


def test_the_issue_program_gives_the_same_answer_as_outside_a_loop():
  """acc + concat([p, q], "b") on ("all:2", "b:all"): in a loop body it
  once returned [0, 1, 10, 11, 2, 3, 12, 13]; the concat along the split
  dimension was then refused outside loops, and now lowers (regrid)."""
  def run(in_loop):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    b = mtf.Dimension("b", 4)
    p = mtf.import_tf_tensor(mesh, np.arange(4, dtype=np.float32), [b])
    q = mtf.import_tf_tensor(mesh, np.arange(10, 14, dtype=np.float32), [b])
    acc = mtf.zeros(mesh, [mtf.Dimension("b", 8)])
    if in_loop:
      i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)
      _, out = mtf.while_loop(lambda i, a: mtf.less(i, 1),
                              lambda i, a: [i + 1, a + mtf.concat([p, q], "b")],
                              [i0, acc])
    else:
      out = acc + mtf.concat([p, q], "b")
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "b:all")
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(out).numpy()

  expected = [0, 1, 2, 3, 10, 11, 12, 13]
  np.testing.assert_array_equal(run(in_loop=False), expected)
  np.testing.assert_array_equal(run(in_loop=True), expected)


def test_nested_loop_bodies_are_checked():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, _X, [A, B])
  i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)

  def inner(v):
    _, out = mtf.while_loop(lambda j, a: mtf.less(j, 1),
                            lambda j, a: [j + 1, a + mtf.pad(
                                mtf.slice(v, 0, 4, "b"), [0, 4], "b")],
                            [i0, mtf.zeros(mesh, v.shape)])
    return out

  _, out = mtf.while_loop(lambda i, v: mtf.less(i, 1),
                          lambda i, v: [i + 1, inner(v)], [i0, x])
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "b:all")
  result = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(out)
  expected = np.array(_X)
  expected[:, 4:] = 0
  np.testing.assert_allclose(result.numpy(), expected)
