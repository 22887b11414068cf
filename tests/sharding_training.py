"""Training runs with and without data-parallel sharding, for comparison.

`mlp_loss` is an MLP stack with one copy per optimizer of
`make_optimizers` (every kind and option of mtf.optimize), MESHES the
8-processor meshes it is checked on. `train_variables` runs a model for some optimizer steps under one mesh,
layout, mode and sharding ("none", "update": sharded weight updates,
"parameters": sharded parameters), and returns every variable's value
(weights and optimizer slots) after the last step, plus the last Lowering's
counters and the slice shape of every variable.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing
from tests import training_loop

SHARDINGS = ("none", "update", "parameters")
BATCH = mtf.Dimension("batch", 16)
D_IN = mtf.Dimension("d_in", 8)
D_FF = mtf.Dimension("d_ff", 32)
D_OUT = mtf.Dimension("d_out", 16)
# Odd-sized: no data-parallel mesh dimension divides it (kept whole).
GAIN = mtf.Dimension("gain", 3)

_RNG = np.random.RandomState(0)
X = _RNG.randn(BATCH.size, D_IN.size).astype(np.float32)
Y = _RNG.randn(BATCH.size, D_OUT.size).astype(np.float32)

MESHES = [
    pytest.param("b:8", "batch:b", id="batch8"),
    pytest.param("b:2;m:4", "batch:b;d_ff:m", id="b2m4"),
    pytest.param("b:4;m:2", "batch:b;d_ff:m", id="b4m2"),
]


def make_optimizers():
  """One optimizer per copy of the MLP, covering every kind and option."""
  opt = mtf.optimize
  return [
      ("sgd/", opt.SgdOptimizer(0.1)),
      ("momentum/", opt.MomentumOptimizer(0.05, 0.9)),
      ("adam/", opt.AdamWeightDecayOptimizer(
          0.01, weight_decay_rate=0.01, exclude_from_weight_decay=["b1"])),
      # Factored slots, parameter scale and clipping (global RMS), the
      # default learning-rate and decay schedules of the global step.
      ("adafactor/", opt.AdafactorOptimizer(min_dim_size_to_factor=8)),
      # Unfactored slots and momentum.
      ("adafactor_m/", opt.AdafactorOptimizer(
          factored=False, beta1=0.9, learning_rate=0.01,
          multiply_by_parameter_scale=False)),
      # A learning-rate schedule variant.
      ("multi_lr/", opt.AdamWithMultiLRSchedule(
          variable_search=["w2"], alt_lr_schedules=[[0.5, 0.01]],
          learning_rate=0.01)),
  ]


def mlp_loss(mesh):
  """The sum of the losses of one two-layer MLP per optimizer."""
  x = mtf.import_tf_tensor(mesh, tf.constant(X), [BATCH, D_IN])
  y = mtf.import_tf_tensor(mesh, tf.constant(Y), [BATCH, D_OUT])
  losses = []
  for prefix, _ in make_optimizers():
    with tf.compat.v1.variable_scope(prefix.rstrip("/")):
      w1 = mtf.get_variable(mesh, "w1", [D_IN, D_FF])
      b1 = mtf.get_variable(mesh, "b1", [D_FF],
                            initializer=tf.zeros_initializer())
      w2 = mtf.get_variable(mesh, "w2", [D_FF, D_OUT])
      gain = mtf.get_variable(mesh, "gain", [GAIN],
                              initializer=tf.ones_initializer())
    h = mtf.relu(mtf.einsum([x, w1], [BATCH, D_FF]) + b1)
    out = mtf.einsum([h, w2], [BATCH, D_OUT]) * mtf.reduce_mean(gain)
    losses.append(mtf.reduce_mean(mtf.square(out - y)))
  return mtf.add_n(losses)




def shard(mesh, mesh_shape, layout, sharding):
  """Asks `mesh` for `sharding` (one of SHARDINGS)."""
  if sharding != "none":
    mtf.shard_data_parallel(mesh, mesh_shape, layout,
                            shard_parameters=(sharding == "parameters"))


def train_variables(make_loss, make_optimizers, mesh_shape, layout, mode,
                    sharding, steps):
  """Trains (`training_loop.run_steps`) and returns (values, counters,
  slice_shapes).

  Args:
    make_loss: fn(mesh) -> scalar mtf loss (building the model).
    make_optimizers: fn() -> list of (variable name prefix, optimizer): each
      trainable variable is updated by the optimizer of the first prefix
      its name starts with ("" matches all).
    mesh_shape, layout: the mesh and layout rules.
    mode: "eager", "function", "graph" (PlacementMeshImpl) or "simd".
    sharding: one of SHARDINGS.
    steps: the number of optimizer steps.

  Returns:
    values: dict from every variable's name to its value after `steps`.
    counters: dict of the last Lowering's counters.
    slice_shapes: dict from variable name to its slice shape.
  """
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)
  info = {}

  def build():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    shard(mesh, mesh_shape, layout, sharding)
    _, updates = training_step(mesh, make_loss, make_optimizers_cache())
    if mode == "graph":
      reads = {v.name: v.outputs[0] for v in graph.all_variables}
    else:
      reads = {v.name: mtf.read_variable(v, dependencies=updates)
               for v in graph.all_variables}
    lowering = mtf.Lowering(graph, {mesh: impl})
    info["counters"] = dict(lowering.counters)
    info["slice_shapes"] = {v.name: impl.slice_shape(v.shape)
                            for v in graph.all_variables}
    train_ops = [lowering.lowered_operation(u) for u in updates]
    values = {k: lowering.export_to_tf_tensor(v) for k, v in reads.items()}
    return lowering, train_ops, values

  optimizers = []

  def make_optimizers_cache():
    if not optimizers:
      optimizers.extend(make_optimizers())
    return optimizers

  history = training_loop.run_steps(build, impl, mode, steps,
                                    fetch_after_step=True)
  return history[-1], info["counters"], info["slice_shapes"]


def training_step(mesh, make_loss, optimizers):
  """Builds the loss, gradients and (unless `optimizers` is None) updates
  of one training step on `mesh`; each trainable variable is updated by
  the optimizer of the first (prefix, optimizer) of `optimizers` its name
  starts with. Returns (loss, update operations)."""
  loss = make_loss(mesh)
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = []
  if optimizers is None:
    return loss, updates
  groups = {}
  for var, grad in zip(variables, grads):
    optimizer = _optimizer_for(var.name, optimizers)
    group = groups.setdefault(id(optimizer), (optimizer, [], []))
    group[1].append(grad)
    group[2].append(var)
  for optimizer, group_grads, group_vars in groups.values():
    updates += optimizer.apply_grads(group_grads, group_vars)
  return loss, updates


def unlowered_training_step(make_loss, optimizers):
  """(mtf graph, loss) of training_step, built in a scratch tf.Graph and
  never lowered: what a layout search reads."""
  with tf.Graph().as_default():
    graph = mtf.Graph()
    loss, _ = training_step(mtf.Mesh(graph, "mesh"), make_loss, optimizers)
  return graph, loss


def _optimizer_for(name, optimizers):
  """The optimizer of the first prefix `name` starts with."""
  matches = [opt for prefix, opt in optimizers if name.startswith(prefix)]
  if not matches:
    raise ValueError(f"No optimizer for variable {name}.")
  return matches[0]


def assert_same_values(got, want, what, rtol=1e-5):
  """Every variable of `want` equals `got`'s (and no other exists), to
  `rtol` of each element or of the variable's largest magnitude: training
  sums gradients in another order, and Adam-like updates (g / sqrt(v))
  magnify the round-off of near-zero gradient elements."""
  assert sorted(got) == sorted(want), what
  for name, value in want.items():
    scale = float(np.max(np.abs(value))) if np.size(value) else 0.0
    np.testing.assert_allclose(got[name], value, rtol=rtol,
                               atol=rtol * scale, err_msg=f"{name}: {what}")


def lower_only(make_loss, make_optimizers, mesh_shape, layout, sharding,
               with_update=True):
  """Builds and lowers a training step in a compat tf.Graph without running
  it; returns (counters dict, {variable name: bytes per processor}, the
  sharding's decisions or {})."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    shard(mesh, mesh_shape, layout, sharding)
    training_step(mesh, make_loss, make_optimizers() if with_update else None)
    lowering = mtf.Lowering(graph, {mesh: impl})
    slice_bytes = {v.name: impl.slice_size(v.shape) * v.master_dtype.size
                   for v in graph.all_variables}
    sharding_of = mtf.strategies.data_parallel_sharding.sharding_of
    decisions = dict(sharding_of(mesh).decisions if sharding_of(mesh) else {})
    return dict(lowering.counters), slice_bytes, decisions
