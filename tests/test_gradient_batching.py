"""Batched weight gradients: one einsum sums a weight's marked uses' terms.

A weight w used by T einsums of the same shapes, y = sum_t tanh(x_t w), is
differentiated with its einsums marked (gradient_batching.mark): the
gradients must be NumPy's under every layout, and the graph must hold ONE
einsum for w's gradient, over operands stacked along "gradient_terms",
instead of T einsums and T - 1 adds. Unmarked einsums, marked ones of other
shapes and marks with different keys keep their own terms.
"""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.strategies import gradient_batching
from tests import mtf_testing

T, BATCH, D, E = 3, 8, 4, 6


def _inputs():
  rng = np.random.RandomState(0)
  return {
      "x": (rng.uniform(-1, 1, size=(T, BATCH, D)).astype(np.float32),
            ["time", "batch", "d"]),
      "w": (rng.uniform(-0.7, 0.7, size=(D, E)).astype(np.float32),
            ["d", "e"]),
  }


def _uses(x, w, key="k"):
  """The T einsums x_t w, marked with `key` (None: unmarked)."""
  terms = []
  for t in range(T):
    x_t = mtf.gather(x, t, x.shape.dims[0])
    product = mtf.einsum([x_t, w], reduced_dims=[w.shape.dims[0]])
    if key is not None:
      gradient_batching.mark(product.operation, key)
    terms.append(mtf.tanh(product))
  return terms


def _np_model(x, w):
  x = np.asarray(x, np.float64)
  return {"y": sum(np.tanh(x[t] @ w) for t in range(T))}


def _build(mesh, t, key="k"):
  del mesh
  return {"y": mtf.add_n(_uses(t["x"], t["w"], key))}


@pytest.mark.parametrize("mesh_shape,layout,mode",
                         mtf_testing.mesh_layout_mode_params(
                             [("all:1", ""), ("all:4", "batch:all"),
                              ("b:2;e:2", "batch:b;e:e")]))
def test_batched_gradients_are_the_sum_of_the_terms(mesh_shape, layout, mode):
  mtf_testing.check_op(_build, _np_model, _inputs(), mesh_shape, layout,
                       mode)


def _gradient_graph(build_uses, **graph_kwargs):
  """(graph, gradient of w) of sum(uses) for `build_uses(x, w)`."""
  graph = mtf.Graph(**graph_kwargs)
  mesh = mtf.Mesh(graph, "mesh")
  x, w = (
      mtf_testing.import_array(mesh, array, [
          mtf.Dimension(n, s) for n, s in zip(names, array.shape)])
      for array, names in _inputs().values())
  loss = mtf.reduce_sum(mtf.add_n(build_uses(x, w)))
  grad_w, = mtf.gradients([loss], [w])
  return graph, grad_w


def _einsums_into(graph, shape):
  return [op for op in graph.operations
          if isinstance(op, mtf.EinsumOperation) and
          op.outputs[0].shape == shape]


def test_marked_uses_make_one_einsum_over_stacked_terms():
  graph, grad_w = _gradient_graph(_uses)
  assert "batched_gradient" in grad_w.operation.name
  stacked = [x.shape for x in grad_w.operation.inputs]
  for shape in stacked:
    assert shape.get_dim_by_name(gradient_batching.TERMS_DIM_NAME).size == T
  # Only that one einsum makes a [d, e] tensor: no per-use terms.
  assert len(_einsums_into(graph, grad_w.shape)) == 1


def test_unmarked_uses_keep_one_term_each():
  graph, grad_w = _gradient_graph(lambda x, w: _uses(x, w, key=None))
  assert len(_einsums_into(graph, grad_w.shape)) == T
  assert not any(gradient_batching.TERMS_DIM_NAME in x.shape.dimension_names
                 for op in graph.operations for x in op.outputs)


def test_a_graph_made_without_batch_gradients_keeps_one_term_each():
  """Batching is the graph's default, and its setting: off, marked uses
  are differentiated as unmarked ones."""
  assert mtf.Graph().batch_gradients
  graph, grad_w = _gradient_graph(_uses, batch_gradients=False)
  assert not graph.batch_gradients
  assert "batched_gradient" not in grad_w.operation.name
  assert len(_einsums_into(graph, grad_w.shape)) == T


def test_uses_with_other_keys_or_shapes_are_summed_apart():
  """Two marked uses of each of two keys, and a marked use of its own
  shape: the two pairs are batched apart, the odd one is not deferred."""
  def uses(x, w):
    terms = _uses(x, w, key="a")[:2] + _uses(x, w, key="b")[:2]
    x_0 = mtf.gather(x, 0, x.shape.dims[0])
    wide = mtf.concat([x_0, x_0], "batch")
    odd = mtf.einsum([wide, w], reduced_dims=[w.shape.dims[0]])
    gradient_batching.mark(odd.operation, "a")
    terms.append(mtf.reduce_sum(mtf.tanh(odd), reduced_dim=odd.shape[0]))
    return [mtf.reduce_sum(t, reduced_dim=t.shape[0]) for t in terms]

  graph, grad_w = _gradient_graph(uses)
  makers = [op.name for op in _einsums_into(graph, grad_w.shape)]
  assert len(makers) == 3, makers
  assert sum("batched_gradient" in name for name in makers) == 2, makers


def test_a_weight_with_other_uses_adds_their_gradients():
  """w also used elementwise: the batched sum and that term add up."""
  def build(mesh, t):
    del mesh
    uses = _uses(t["x"], t["w"])
    extra = mtf.reduce_sum(mtf.square(t["w"]), reduced_dim=t["w"].shape[0])
    return {"y": mtf.add_n(uses) + extra}

  def np_fn(x, w):
    return {"y": _np_model(x, w)["y"] + np.sum(np.square(w), axis=0)}

  mtf_testing.check_op(build, np_fn, _inputs(), "b:2;e:2", "batch:b;e:e",
                       "eager")
