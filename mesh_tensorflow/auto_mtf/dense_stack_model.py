"""A stack of dense blocks the run planner can build in every structure.

L blocks  h = relu(x @ w1[io, hidden]);  x = h @ w2[hidden, io]  on
x[batch, io], a mean squared error against a target[batch, io], and one
optimizer update of every weight, in float32: the dense stack of
benchmarks/mlp_stack.py as a `plan_space.PlanModel`, so that the planner
and benchmarks/plan.py can build it plain, with recomputed blocks, and as
a GPipe pipeline of S stages and M micro-batches.

Every structure computes the same function from the same initial weights:
a pipelined stack keeps block i's weights as row i // (L/S) of the
layer-stacked variable of block i % (L/S) (mtf.stack_layer_variables),
initialised and checkpointed as block i's own.
"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import proxy_layers

OPTIMIZERS = ("adafactor", "sgd", "adam")


def make_optimizer(name):
  """An mtf.optimize optimizer by name (one of OPTIMIZERS)."""
  if name == "adafactor":
    return mtf.optimize.AdafactorOptimizer()
  if name == "sgd":
    return mtf.optimize.SgdOptimizer(0.1)
  if name == "adam":
    return mtf.optimize.AdamWeightDecayOptimizer(1e-3)
  raise ValueError(f"DenseStackModel: optimizer must be one of {OPTIMIZERS}, "
                   f"got {name!r}.")


def _block_name(i):
  return f"block_{i:03d}"


class DenseStackModel(plan_space.PlanModel):
  """L dense blocks on x[batch, io]: plain, recomputed or pipelined.

  Args:
    num_layers: L, the blocks.
    batch, io, hidden: the sizes of the dimensions "batch", "io", "hidden".
    optimizer: one of OPTIMIZERS (mtf.optimize's defaults for Adafactor;
      SGD at 0.1; AdamWeightDecay at 1e-3).
    seed: the seed of the inputs and targets (fixed, so runs repeat).
  """

  def __init__(self, num_layers=8, batch=64, io=64, hidden=256,
               optimizer="adafactor", seed=0):
    for name, value in (("num_layers", num_layers), ("batch", batch),
                        ("io", io), ("hidden", hidden)):
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"DenseStackModel: {name} must be a positive "
                         f"integer, got {value!r}.")
    make_optimizer(optimizer)  # Checks the name.
    self.num_layers = num_layers
    self.batch_dim = mtf.Dimension("batch", batch)
    self.io_dim = mtf.Dimension("io", io)
    self.hidden_dim = mtf.Dimension("hidden", hidden)
    self.optimizer = optimizer
    self.seed = seed

  def __repr__(self):
    return (f"DenseStackModel(num_layers={self.num_layers}, "
            f"batch={self.batch_dim.size}, io={self.io_dim.size}, "
            f"hidden={self.hidden_dim.size}, optimizer={self.optimizer!r}, "
            f"seed={self.seed})")

  # ------------------------------------------------------------ structures

  def structures(self, num_processors):
    """Plain with 0, L/2 or L recomputed blocks; for each S > 1 dividing
    num_processors and L, M in {S, 2S, 4S} dividing the batch, recomputing
    all blocks or none."""
    layers = self.num_layers
    batch = self.batch_dim.size
    out = [plan_space.Structure(recompute_layers=k)
           for k in sorted({0, layers // 2, layers})]
    for stages in range(2, num_processors + 1):
      if num_processors % stages or layers % stages:
        continue
      for micro_batches in (stages, 2 * stages, 4 * stages):
        if batch % micro_batches:
          continue
        for k in (0, layers):
          out.append(plan_space.Structure(stages, micro_batches, k))
    return out

  def settings(self, structure):
    """Keyword arguments of plan_space.Structure that run `structure`."""
    self._check(structure)
    return {"stages": structure.stages,
            "micro_batches": structure.micro_batches,
            "recompute_layers": structure.recompute_layers}

  def _check(self, structure):
    layers = self.num_layers
    if layers % structure.stages:
      raise ValueError(
          f"DenseStackModel: {structure.stages} stages do not divide the "
          f"{layers} blocks.")
    if self.batch_dim.size % structure.micro_batches:
      raise ValueError(
          f"DenseStackModel: {structure.micro_batches} micro-batches do not "
          f"divide the batch of {self.batch_dim.size}.")
    if structure.recompute_layers > layers:
      raise ValueError(
          f"DenseStackModel: recompute_layers={structure.recompute_layers} "
          f"is more than the {layers} blocks.")
    if structure.pipelined and structure.recompute_layers not in (0, layers):
      raise ValueError(
          f"DenseStackModel: a pipelined stack recomputes all {layers} "
          f"blocks or none, not {structure.recompute_layers}.")

  # ----------------------------------------------------------------- build

  def inputs(self):
    """(x, target) as NumPy float32 arrays of shape [batch, io]."""
    rng = np.random.RandomState(self.seed)
    shape = (self.batch_dim.size, self.io_dim.size)
    return (rng.randn(*shape).astype(np.float32),
            rng.randn(*shape).astype(np.float32))

  def build(self, structure, zero="none", mesh_shape=None,
            layout_rules=None):
    """(mtf.Graph, [loss]) of one training step (see PlanModel.build)."""
    self._check(structure)
    if structure.pipelined:
      layers = [(False, 1)] * (self.num_layers // structure.stages)
    else:
      layers = [(i < structure.recompute_layers, 1)
                for i in range(self.num_layers)]
    return self._build(structure, layers, zero, mesh_shape, layout_rules)

  def build_proxy(self, structure, zero="none", mesh_shape=None,
                  layout_rules=None):
    """3 blocks per run of like blocks (per stage when pipelined), the
    middle one weighted (see PlanModel.build_proxy); None if no run is
    longer than 3."""
    self._check(structure)
    if structure.pipelined:
      layers = proxy_layers.runs([False] * (self.num_layers //
                                            structure.stages))
    else:
      layers = proxy_layers.runs([i < structure.recompute_layers
                                  for i in range(self.num_layers)])
    if layers is None:
      return None
    graph, outputs = self._build(structure, layers, zero, mesh_shape,
                                 layout_rules)
    return graph, outputs, {_block_name(i) + "/": weight
                            for i, (_, weight) in enumerate(layers)}

  def _build(self, structure, layers, zero, mesh_shape, layout_rules):
    """The step with `layers`, [(recomputed, weight)] per block (per stage
    block when pipelined)."""
    shard_weight_update, shard_parameters = plan_space.zero_flags(zero)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    if shard_weight_update:
      mtf.shard_data_parallel(
          mesh, mesh_shape, layout_rules,
          shard_weight_update=True, shard_parameters=shard_parameters)
    x_value, target_value = self.inputs()
    shape = mtf.Shape([self.batch_dim, self.io_dim])
    x = mtf.import_tf_tensor(mesh, tf.constant(x_value), shape)
    target = mtf.import_tf_tensor(mesh, tf.constant(target_value),
                                            shape)
    if structure.pipelined:
      y = self._pipelined(mesh, x, structure, len(layers))
    else:
      y = self._plain(mesh, x, [recompute for recompute, _ in layers])
    loss = mtf.reduce_mean(mtf.square(y - target))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    make_optimizer(self.optimizer).apply_grads(grads, variables)
    return graph, [loss]

  def _block(self, x, w1, w2):
    """relu(x @ w1) @ w2, keeping x's other dimensions (e.g. "stage")."""
    hidden_shape = mtf.Shape([self.hidden_dim if d == self.io_dim else d
                              for d in x.shape.dims])
    h = mtf.relu(mtf.einsum([x, w1], hidden_shape))
    return mtf.einsum([h, w2], x.shape)

  def _plain(self, mesh, x, recomputed):
    for i, recompute in enumerate(recomputed):
      # The block's operations carry its name, as its weights do (the
      # planner's proxy finds a layer by name).
      with tf.compat.v1.variable_scope(_block_name(i)):
        w1, w2 = self._weights(mesh)
        if recompute:
          x = mtf.recompute_grad(
              lambda v, w1=w1, w2=w2: self._block(v, w1, w2), [x])
        else:
          x = self._block(x, w1, w2)
    return x

  def _weights(self, mesh):
    w1 = mtf.get_variable(mesh, "w1",
                                    [self.io_dim, self.hidden_dim])
    w2 = mtf.get_variable(mesh, "w2",
                                    [self.hidden_dim, self.io_dim])
    return w1, w2

  def _pipelined(self, mesh, x, structure, per_stage):
    stages = structure.stages
    stage_dim = mtf.Dimension(self.stage_dimension_name, stages)
    weights = []
    for j in range(per_stage):

      def members(full_name, j=j):
        return [full_name.replace(_block_name(j),
                                  _block_name(s * per_stage + j), 1)
                for s in range(stages)]

      with mtf.stack_layer_variables(stage_dim, members):
        with tf.compat.v1.variable_scope(_block_name(j)):
          weights.append(self._weights(mesh))

    def stage_fn(xs):
      h = xs[0]
      for j, (w1, w2) in enumerate(weights):
        with tf.compat.v1.variable_scope(_block_name(j)):
          h = self._block(h, w1, w2)
      return [h]

    return mtf.pipeline(
        stage_fn, [x], stage_dim, structure.micro_batches,
        batch_dim=self.batch_dim.name,
        recompute_grad=structure.recompute_layers == self.num_layers)[0]

