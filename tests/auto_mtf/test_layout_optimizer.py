"""layout_optimizer.LayoutOptimizer on the memory objective: the original's
cases, budgets, validation, and the program's size."""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator


def test_variable_names():
  assert layout_optimizer._global_var_name("cake", "lie") == "x_(cake:lie)"
  assert layout_optimizer._local_var_name(frozenset(), {}) == "y_()"
  assert layout_optimizer._local_var_name(
      frozenset(["channel", "hidden"]),
      {"hidden": "x", "channel": "y"}) == "y_(channel:y,hidden:x)"
  assert layout_optimizer._local_var_name(
      frozenset(["channel", "hidden"]), {"channel": "y"}) == (
          "y_(channel:y,hidden)")


def test_generate_assignments():
  assignments = layout_optimizer._generate_assignments(
      {"s1", "s2", "s3"}, {"m1": 4, "m2": 8})
  assert {} in assignments
  assert {"s3": "m2"} in assignments
  assert {"s1": "m2", "s2": "m1"} in assignments
  assert {"s1": "m2", "s3": "m2"} not in assignments  # one mesh dim twice
  assert len(assignments) == 13  # 1 empty, 6 of one entry, 6 of two


def _einsum_graph(repeat=1, mesh_shape="m1:4,m2:2"):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x1 = mtf.zeros(mesh, "a:10,b:5")
  x2 = mtf.zeros(mesh, "b:5,c:20")
  for _ in range(repeat):
    mtf.einsum([x1, x2], "a:10,c:20")
  return layout_optimizer.LayoutOptimizer(memory_estimator.MemoryEstimator(
      graph, mtf.convert_to_shape(mesh_shape)))


def _assert_best(optimizer, layout):
  value = optimizer.evaluate_layout(layout)
  for other in ("a:m1;b:m2", "a:m1;c:m2", "b:m1;a:m2", "b:m1;c:m2",
                "c:m1;b:m2"):
    assert value <= optimizer.evaluate_layout(other)
  assert value == optimizer.evaluate_layout("c:m1;a:m2")


def test_optimize_layout():
  optimizer = _einsum_graph()
  layout = optimizer.solve()
  assert layout == "a:m2;c:m1"  # cuts the dimensions to equal sizes
  _assert_best(optimizer, layout)


def test_optimize_layout_repetition_keeps_the_program_small():
  optimizer = _einsum_graph(repeat=100)
  assert len(list(optimizer._graph.get_all_operation_names())) >= 50
  # Before any solve, as the original's test reads it.
  assert len(optimizer._model.Proto().variables) <= 50
  layout = optimizer.solve()
  assert layout == "a:m2;c:m1"
  _assert_best(optimizer, layout)


def test_optimize_layout_unsplittable():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x1 = mtf.zeros(mesh, "a:10,b:5")
  x2 = mtf.zeros(mesh, "b:5,c:20")
  # A slicewise function that declares a and c unsplittable (the original's
  # case used unstack, and this package lowers unstack, concat, slice and
  # pad split); b:5 divides by neither mesh dimension.
  mtf.slicewise(tf.identity, [x1], splittable_dims=[x1.shape[1]])
  mtf.slicewise(tf.identity, [x2], splittable_dims=[x2.shape[0]])
  optimizer = layout_optimizer.LayoutOptimizer(
      memory_estimator.MemoryEstimator(graph, "m1:4;m2:2"))
  assert optimizer.solve() == ""


def test_optimize_layout_tiebreak_prefers_more_splits():
  optimizer = _einsum_graph(mesh_shape="m1:4,m2:2,m3:1")
  assert optimizer.solve() == "a:m2;b:m3;c:m1"


def _two_layer_graph():
  """x[batch, d_in] @ w1[d_in, hidden] @ w2[hidden, d_out]: weights big."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "batch:8,d_in:256")
  w1 = mtf.zeros(mesh, "d_in:256,hidden:1024")
  w2 = mtf.zeros(mesh, "hidden:1024,d_out:256")
  h = mtf.einsum([x, w1], "batch:8,hidden:1024")
  y = mtf.einsum([h, w2], "batch:8,d_out:256")
  return graph, y


def test_a_budget_only_a_split_layout_meets_gets_it():
  graph, y = _two_layer_graph()
  estimator = memory_estimator.MemoryEstimator(graph, "m:4", [y])
  whole = layout_optimizer.LayoutOptimizer(estimator).evaluate_layout("")
  best = layout_optimizer.LayoutOptimizer(estimator)
  smallest = best.evaluate_layout(best.solve())
  assert smallest < whole
  budget = (smallest + whole) // 2
  optimizer = layout_optimizer.LayoutOptimizer(estimator,
                                               memory_budget=budget)
  layout = optimizer.solve()
  assert layout
  assert optimizer.evaluate_layout(layout) <= budget


def test_an_impossible_budget_names_the_budget_and_the_smallest_peak():
  graph, y = _two_layer_graph()
  estimator = memory_estimator.MemoryEstimator(graph, "m:4", [y])
  best = layout_optimizer.LayoutOptimizer(estimator)
  smallest = int(best.evaluate_layout(best.solve()))
  optimizer = layout_optimizer.LayoutOptimizer(estimator, memory_budget=1000)
  with pytest.raises(layout_optimizer.SolverError,
                     match=rf"memory_budget=1000 bytes.*smallest peak is "
                           rf"{smallest} bytes"):
    optimizer.solve()


def test_bad_arguments():
  graph, y = _two_layer_graph()
  estimator = memory_estimator.MemoryEstimator(graph, "m:4", [y])
  with pytest.raises(ValueError, match="objective.*'speed'"):
    layout_optimizer.LayoutOptimizer(estimator, objective="speed")
  with pytest.raises(ValueError, match="memory_budget.*-1"):
    layout_optimizer.LayoutOptimizer(estimator, memory_budget=-1)


def test_the_solution_is_validated(monkeypatch):
  optimizer = _einsum_graph()
  # A solver that split both a and c over m1 would break an operation.
  monkeypatch.setattr(optimizer._cp_model.CpSolver, "value",
                      lambda self, var: 1 if var.name in (
                          "x_(a:m2)", "x_(c:m2)") else 0)
  with pytest.raises(mtf.LayoutError, match="both 'a' and 'c'.*'m2'"):
    optimizer.solve()


def test_print_solution(capsys):
  optimizer = _einsum_graph()
  optimizer.solve(print_solution=True)
  out = capsys.readouterr().out
  assert "x_(a:m2) = 1" in out
  assert "x_(c:m1) = 1" in out
  assert "Minimize:" in out and "z" in out
  assert "Objective value:" in out


def test_names_that_never_meet_may_share_a_mesh_dimension():
  # heads and vocab never meet in a Transformer, but one combined
  # assignment updates the variables of both (the shipped dp_mp layouts
  # split both over "model"). Here: two unrelated layers, one optimizer.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    losses, weights = [], []
    for i, (d_in, d_out) in enumerate([("p", "heads"), ("q", "vocab")]):
      x = mtf.zeros(mesh, f"batch:8,{d_in}:4")
      w = mtf.get_variable(mesh, f"w{i}", f"{d_in}:4,{d_out}:8")
      losses.append(mtf.reduce_sum(mtf.einsum([x, w], f"batch:8,{d_out}:8")))
      weights.append(w.operation)
    loss = mtf.add_n(losses)
    grads = mtf.gradients([loss], [w.outputs[0] for w in weights])
    mtf.optimize.AdafactorOptimizer().apply_grads(grads, weights)
  estimator = memory_estimator.MemoryEstimator(graph, "m:4", [loss])
  optimizer = layout_optimizer.LayoutOptimizer(estimator)
  assert optimizer.evaluate_layout("heads:m;vocab:m") < (
      optimizer.evaluate_layout("heads:m"))
  # The best splits one name of each layer over m (which two is a tie).
  pairs = [pair.split(":") for pair in optimizer.solve().split(";")]
  assert len(pairs) == 2 and all(m == "m" for _, m in pairs)
