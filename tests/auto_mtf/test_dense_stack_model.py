"""DenseStackModel: every structure trains like the one-processor stack.

Each structure of a 4-block stack is lowered on 8 processors (a pipeline's
stages over a mesh dimension "stage" of size S) at some ZeRO level, runs
one step, and must give the loss of the plain stack on one processor and
the same weights and slots after the step (pipelined rows named as the
blocks they stand for).
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import dense_stack_model
from mesh_tensorflow.auto_mtf import plan_space
from tests import layer_stacked_models

S = plan_space.Structure


def small_model(optimizer="adafactor"):
  return dense_stack_model.DenseStackModel(
      num_layers=4, batch=16, io=8, hidden=16, optimizer=optimizer, seed=1)


def one_step(model, structure, zero, mesh_shape, layout):
  """(loss, {member or variable name: value after one step})."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    graph, (loss,) = model.build(structure, zero, mesh_shape, layout)
    lowering = mtf.Lowering(graph, {loss.mesh: impl})
    updates = [lowering.lowered_operation(op) for op in graph.operations
               if isinstance(op, mtf.Assign)]
    with tf.control_dependencies([u for u in updates if u is not None]):
      train = tf.compat.v1.assign_add(step, 1)
    tf_loss = lowering.export_to_tf_tensor(loss)
    reads = {v.name: lowering.export_to_tf_tensor(v.outputs[0])
             for v in graph.all_variables}
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      loss_value, _ = sess.run([tf_loss, train])
      values = sess.run(reads)
  return loss_value, layer_stacked_models.rows_by_member(values, graph)


_REFERENCES = {}


def reference(optimizer):
  """One step of the plain stack on one processor (computed once)."""
  if optimizer not in _REFERENCES:
    _REFERENCES[optimizer] = one_step(small_model(optimizer), S(), "none",
                                      "all:1", "")
  return _REFERENCES[optimizer]


# Structures of small_model() on 8 processors, each on a mesh that splits
# its stages, spanning S, M / S, recompute (none, some, all) and the ZeRO
# levels (a sample: each case costs seconds of lowering). SGD but for the
# default, Adafactor: mtf.optimize's own tests check each optimizer on
# layer-stacked and sharded variables.
CASES = [
    (S(), "none", "b:2;m:4", "batch:b;hidden:m", "adafactor"),
    (S(recompute_layers=2), "weight_update", "all:8", "batch:all", "sgd"),
    (S(2, 4, 0), "parameters", "stage:2;b:4", "stage:stage;batch:b", "sgd"),
    (S(2, 8, 0), "weight_update", "stage:2;b:2;m:2",
     "stage:stage;batch:b;hidden:m", "sgd"),
    (S(4, 4, 4), "parameters", "stage:4;b:2", "stage:stage;batch:b", "sgd"),
]


@pytest.mark.parametrize(
    "structure,zero,mesh_shape,layout,optimizer", CASES,
    ids=[f"{c[0].describe()}-{c[1]}-{c[2]}-{c[4]}" for c in CASES])
def test_structure_trains_like_one_processor(structure, zero, mesh_shape,
                                             layout, optimizer):
  assert structure in small_model().structures(8)
  want_loss, want = reference(optimizer)
  loss, got = one_step(small_model(optimizer), structure, zero, mesh_shape,
                       layout)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    scale = float(np.max(np.abs(value)))
    np.testing.assert_allclose(got[name], value, rtol=1e-4,
                               atol=1e-4 * scale, err_msg=name)


def test_the_cases_span_every_choice():
  structures = small_model().structures(8)
  cases = [c[0] for c in CASES]

  def choices(ss):
    return ({s.stages for s in ss}, {s.micro_batches // s.stages for s in ss},
            {min(s.recompute_layers, 2) for s in ss})

  assert choices(cases) == choices(structures)
  assert {c[1] for c in CASES} == set(plan_space.ZERO_LEVELS)


def test_structures_and_settings():
  model = dense_stack_model.DenseStackModel(num_layers=8, batch=16)
  structures = model.structures(8)
  assert S() in structures and S(recompute_layers=4) in structures
  assert S(8, 8, 8) in structures and S(8, 16, 0) in structures
  assert S(8, 32, 0) not in structures  # 32 micro-batches of 16.
  assert all(s.recompute_layers in (0, 8) for s in structures if s.pipelined)
  settings = model.settings(S(4, 8, 8))
  assert S(**settings) == S(4, 8, 8)
  with pytest.raises(ValueError, match="3 stages do not divide the 8"):
    model.build(S(3, 3, 0))
  with pytest.raises(ValueError, match="all 8 blocks or none"):
    model.settings(S(2, 2, 4))
  with pytest.raises(ValueError, match="optimizer must be one of"):
    dense_stack_model.DenseStackModel(optimizer="lamb")
