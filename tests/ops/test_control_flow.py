"""depend, custom_gradient, recompute_grad, while_loop and
serialize_training_step under the standard layouts and modes."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

DIMS = ["a", "b"]
PARAMS = mtf_testing.layout_mode_params(DIMS)


def _x(seed=0, shape=(8, 16)):
  return np.random.RandomState(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_custom_gradient(mesh_shape, layout, mode):
  """Forward is tanh(x) * w; the gradient is replaced by 3 * dy."""
  def build(mesh, t):
    def fn(x, w):
      return mtf.tanh(x) * w

    def grad_fn(explicit, all_inputs, forward_ops, outputs, output_grads):
      del explicit, forward_ops, outputs
      return [output_grads[0] * 3.0] + [None] * (len(all_inputs) - 1)

    return {"y": mtf.custom_gradient(fn, grad_fn, [t["x"], t["w"]])}

  mtf_testing.check_op(
      build, lambda x, w: {"y": np.tanh(x) * w},
      {"x": (_x(), DIMS), "w": (_x(1), DIMS)}, mesh_shape, layout, mode,
      grad_wrt=["x"], np_grad_fn=lambda cot, x, w: {"x": 3.0 * cot["y"]})


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_recompute_grad_matches_plain_gradient(mesh_shape, layout, mode):
  def build(mesh, t):
    def block(x):
      h = mtf.tanh(mtf.einsum([x, t["w"]], "a:8,c:8"))
      return mtf.reduce_sum(h * h, reduced_dim=mtf.Dimension("c", 8))

    return {"y": mtf.recompute_grad(block, [t["x"]])}

  def np_fn(x, w):
    h = np.tanh(x @ w)
    return {"y": (h * h).sum(1)}

  mtf_testing.check_op(
      build, np_fn, {"x": (_x(), DIMS), "w": (_x(2, (16, 8)), ["b", "c"])},
      mesh_shape, layout, mode)


def test_custom_gradient_internals_are_not_usable():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.ones(mesh, "a:2")
  inner = []

  def fn(v):
    inner.append(mtf.exp(v))
    return inner[0] * 2.0

  mtf.custom_gradient(fn, lambda *args: [None], [x])
  with pytest.raises(ValueError, match="custom gradient"):
    mtf.relu(inner[0])


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_while_loop_with_accumulator(mesh_shape, layout, mode):
  """x <- x * 0.5 three times; accumulates sum over b of x each time."""
  def build(mesh, t):
    i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)

    def cond(i, x):
      del x
      return mtf.less(i, 3)

    def body(i, x):
      total = mtf.reduce_sum(x, reduced_dim=mtf.Dimension("b", 16))
      return [i + 1, x * 0.5, total]

    _, x, acc = mtf.while_loop(cond, body, [i0, t["x"]],
                               has_accumulators=True)
    return {"x": x, "acc": acc}

  def np_fn(x):
    return {"x": x * 0.125, "acc": x.sum(1) * (1 + 0.5 + 0.25)}

  mtf_testing.check_op(build, np_fn, {"x": (_x(), DIMS)}, mesh_shape,
                       layout, mode, grad_wrt=[])


def test_while_loop_allreduces_accumulators_once():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, np.ones([8, 16], np.float32), "a:8,b:16")
  i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)
  _, acc = mtf.while_loop(
      lambda i: mtf.less(i, 4),
      lambda i: [i + 1, mtf.reduce_sum(x, reduced_dim=mtf.Dimension("b", 16))],
      [i0], has_accumulators=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "b:all")
  lowering = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(acc),
                             np.full([8], 64.0))
  assert dict(lowering.counters)["comm/allreduce/all/calls"] == 1


@pytest.mark.parametrize("mesh_shape,layout,mode", [
    p for p in mtf_testing.layout_mode_params(["batch", "hidden"])])
def test_serialize_training_step_sums_microbatch_gradients(
    mesh_shape, layout, mode):
  x_value = _x(3, (16, 8))
  w_value = _x(4, (8, 16))

  def run(num_splits):
    # Variables belong to the mesh implementation: one per run, made outside
    # the tf.function (which traces twice when it creates variables).
    impl = mtf_testing.make_impl(mode, mesh_shape, layout)

    def build_and_lower():
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      batch = mtf.Dimension("batch", 16)
      x = mtf.import_tf_tensor(mesh, x_value, [batch, ("io", 8)])
      w = mtf.get_variable(mesh, "w", "io:8,hidden:16", initializer=w_value)

      def model_fn(features):
        h = mtf.einsum([features["x"], w], reduced_dims=[mtf.Dimension(
            "io", 8)])
        return {"loss": mtf.reduce_sum(mtf.square(h)), "h": h}

      if num_splits == 1:
        outputs = model_fn({"x": x})
        (grad,) = mtf.gradients([outputs["loss"]], [w])
      else:
        (grad,), outputs = mtf.serialize_training_step(
            {"x": x}, model_fn, batch, num_splits)
      lowering = mtf.Lowering(graph, {mesh: impl})
      return lowering, [lowering.export_to_tf_tensor(grad),
                        lowering.export_to_tf_tensor(outputs["loss"]),
                        lowering.export_to_tf_tensor(outputs["h"])]
    return mtf_testing.run_in_mode(mode, build_and_lower, impl)

  whole = run(1)
  micro = run(2)
  for got, want in zip(micro, whole):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_depend_orders_an_assignment_in_graph_mode():
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    v = mtf.get_variable(mesh, "v", "a:8", initializer=tf.zeros_initializer())
    update = mtf.assign(v, mtf.ones(mesh, "a:8") * 5.0)
    after = mtf.depend(mtf.read_variable(v, [update]) * 2.0, [update])
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:8", "a:all")
    lowering = mtf.Lowering(graph, {mesh: impl})
    value = lowering.export_to_tf_tensor(after)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      np.testing.assert_array_equal(sess.run(value), np.full([8], 10.0))


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.layout_mode_params(["a", "c"]))
def test_lazy_sum_used_inside_and_after_a_loop(mesh_shape, layout, mode):
  """A sum over a split dimension, pending when the loop reads it, is
  reduced outside the loop's graph (it failed with "not an element of this
  graph" / InaccessibleTensorError when exported after the loop)."""
  def build(mesh, t):
    s = mtf.reduce_sum(t["x"], reduced_dim=mtf.Dimension("c", 16))
    i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)
    _, acc = mtf.while_loop(lambda i, a: mtf.less(i, 2),
                            lambda i, a: [i + 1, a + s],
                            [i0, mtf.zeros(mesh, s.shape)])
    return {"s": s, "acc": acc}

  mtf_testing.check_op(
      build, lambda x: {"s": x.sum(1), "acc": 2 * x.sum(1)},
      {"x": (_x(), ["a", "c"])}, mesh_shape, layout, mode, grad_wrt=[])


def test_while_loop_num_loop_vars_returns_the_first_outputs():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)
  x = mtf.import_tf_tensor(mesh, np.arange(4, dtype=np.float32), "a:4")
  step = mtf.ones(mesh, "a:4")
  outputs = mtf.while_loop(lambda i, v, d: mtf.less(i, 3),
                           lambda i, v, d: [i + 1, v + d, d * 2.0],
                           [i0, x, step], num_loop_vars=2)
  assert len(outputs) == 2
  lowering = mtf.Lowering(
      graph, {mesh: mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")})
  assert int(lowering.export_to_tf_tensor(outputs[0])) == 3
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(outputs[1]),
                                np.arange(4) + 1 + 2 + 4)


@pytest.mark.parametrize("num_loop_vars", [0, 3])
def test_while_loop_refuses_num_loop_vars_out_of_range(num_loop_vars):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)
  with pytest.raises(ValueError, match="num_loop_vars"):
    mtf.while_loop(lambda i, v: mtf.less(i, 3), lambda i, v: [i + 1, v],
                   [i0, mtf.ones(mesh, "a:4")], num_loop_vars=num_loop_vars)


def test_operations_take_the_original_parameters():
  """Positional arguments in the original's order."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.ones(mesh, "a:4")
  assert mtf.Depend(x, [mtf.zeros(mesh, "a:4")], "after").name == "after"
  i0 = mtf.constant(mesh, 0, mtf.Shape([]), dtype=tf.int32)
  loop = mtf.WhileLoopOperation(
      lambda i, v: mtf.less(i, 2), lambda i, v: [i + 1, v * 2.0, v],
      [i0, x], {"maximum_iterations": 5}, True, "my_loop")
  assert loop.name == "my_loop" and len(loop.outputs) == 3
  with graph.capture_operations() as forward:
    y = mtf.exp(x)
  op = mtf.CustomGradientOperation(
      [x], [x], [y], lambda *args: [args[-1][0]], forward, "my_gradient")
  assert op.name == "my_gradient"
  (dx,) = mtf.gradients([mtf.reduce_sum(op.outputs[0])], [x])
  lowering = mtf.Lowering(
      graph, {mesh: mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(dx), np.ones(4))
  np.testing.assert_array_equal(
      lowering.export_to_tf_tensor(loop.outputs[2]), np.full(4, 3.0))


def test_custom_gradient_fn_may_read_the_forward_tensors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, np.array([1., 2.], np.float32), "a:2")

  def grad_fn(explicit, all_inputs, forward_operations, outputs, dys):
    del explicit, all_inputs
    forward = outputs[0].operation.forward_outputs[0]
    assert forward.operation in forward_operations
    return [dys[0] * forward]  # d exp(x) = exp(x) dx

  y = mtf.custom_gradient(mtf.exp, grad_fn, [x])
  (dx,) = mtf.gradients([mtf.reduce_sum(y)], [x])
  with pytest.raises(ValueError, match="internal to a custom gradient"):
    mtf.relu(y.operation.forward_outputs[0])
  lowering = mtf.Lowering(
      graph, {mesh: mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(dx),
                             np.exp([1., 2.]), rtol=1e-6)
