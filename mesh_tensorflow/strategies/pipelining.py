"""Pipeline parallelism: GPipe's micro-batching as an SPMD mtf program.

GSPMD's formulation of GPipe (arXiv 2105.04663, 1811.06965): the S stages
of a model have identical structure, so their weights are stacked along a
"stage" dimension and one call of the stage function applies every stage at
once, each to its own slot of a buffer of activations shaped [stage, ...].
The batch is cut into M micro-batches, and M + S - 1 iterations run:

  iteration t: slot 0 of the buffer receives micro-batch t (t < M);
               the stage function runs on the whole buffer;
               slot S - 1 holds the output of micro-batch t - (S - 1);
               `shift` moves every slot to the next stage.

With the stage dimension split over a mesh dimension of size S (layout rule
"stage:<mesh dim>"), each processor holds one stage's weights and runs one
stage, and the shift is a hand-over between neighbours along that mesh
dimension (a collective permute on SIMD). Other dimensions keep their own
splits, so pipelining composes with data and model parallelism. Of the
S * (M + S - 1) slot-iterations, S * (S - 1) are the bubble: the fraction
(S - 1) / (M + S - 1) of the time a stage waits.

Micro-batch m holds the examples m, m + M, m + 2M, ... of the batch: the
batch dimension [batch B] is reshaped into [batch B/M, microbatch M], which
keeps every processor's block of the batch where it is when "batch" is
split (a contiguous cut would need an all-to-all). The outputs come back in
the inputs' order.

Bubble slots hold zeros, and a slot's output is replaced by zeros (with
`where`, never by multiplying) whenever that slot holds no micro-batch, so
whatever the stage function makes of zeros (even inf or NaN) never reaches a
real micro-batch, the outputs or the gradients that flow between
iterations. On PlacementMeshImpl with one stage per processor, a processor
whose slot is idle skips the stage function and its gradient altogether
(its slices are zeros; see idle_slots): the bubble then costs waiting, not
work. (Elsewhere, on SIMD or with the stages on one processor, a bubble
slot computes on zeros inside the call: a weight whose gradient reads a
value that is inf or NaN at zero input, e.g. the gain after a norm without
epsilon, gets NaN from 0 * inf. Stages finite at zero input with finite
derivatives there, as norms with an epsilon are, are safe.)

Communication: feeding slot 0 is local (every processor selects, with
`where`, the stage-0 slot of a buffer it already holds). Collecting slot
S - 1 is a sum over the stage dimension, so a reduction over the stage mesh
dimension; it is done once, at the end, on the outputs of all micro-batches
stacked along "microbatch" (one collective of the batch's size instead of M
small ones). Likewise the gradient of the inputs is reduced once.
"""

import dataclasses
import numbers

from mesh_tensorflow import errors
from mesh_tensorflow.strategies import gradient_batching
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow.strategies import idle_slots
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import constants
from mesh_tensorflow.ops import contractions
from mesh_tensorflow.ops import control_flow
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import reduce as reduce_lib
from mesh_tensorflow.ops import reshapes
from mesh_tensorflow.ops import shifts
from mesh_tensorflow.ops import stacking

__all__ = [
    "MICROBATCH_DIM_NAME",
    "PipelineInfo",
    "PipelineIterationOperation",
    "bubble_fraction",
    "pipeline",
    "pipeline_infos",
]

# The name of the dimension numbering the micro-batches.
MICROBATCH_DIM_NAME = "microbatch"


def bubble_fraction(num_stages, num_microbatches):
  """GPipe's idle fraction (S - 1) / (M + S - 1)."""
  return (num_stages - 1) / (num_microbatches + num_stages - 1)


@dataclasses.dataclass(frozen=True)
class PipelineInfo:
  """What one `pipeline` call runs (see `pipeline_infos`).

  Attributes:
    name: the pipeline's name.
    stage_dim: the stage Dimension (S = its size).
    num_microbatches: M.
    num_iterations: the iterations in the graph, M + S - 1.
  """
  name: str
  stage_dim: shape_lib.Dimension
  num_microbatches: int
  num_iterations: int

  @property
  def num_stages(self):
    return self.stage_dim.size

  @property
  def bubble_fraction(self):
    """(S - 1) / (M + S - 1): the expected idle fraction."""
    return bubble_fraction(self.num_stages, self.num_microbatches)


class PipelineIterationOperation(graph_lib.Operation):
  """Marks the buffer one pipeline iteration runs the stages on.

  It passes its inputs through unchanged (no TF op). It exists for two
  things only the lowering knows:
  - the layout check: a stage dimension split over a mesh dimension of
    another size would put several stages (or part of one) on a processor;
  - the counters, which count the iterations and the busy stage slots of the
    lowered program: `pipeline/iterations`, `pipeline/stage_slots` (S per
    iteration) and `pipeline/busy_slots` (slots holding a micro-batch), so
    1 - busy_slots / stage_slots is the bubble fraction of what was lowered.
  """

  def __init__(self, xs, info, iteration, name=None):
    super().__init__(xs, name=name or "pipeline_iteration")
    self._info = info
    self._iteration = iteration
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype, index=i)
                     for i, x in enumerate(xs)]

  @property
  def info(self):
    return self._info

  @property
  def iteration(self):
    return self._iteration

  @property
  def busy_slots(self):
    """The stage slots that hold a micro-batch in this iteration."""
    first, last = _busy_range(self._iteration, self._info.num_stages,
                              self._info.num_microbatches)
    return last - first + 1

  def gradient(self, grad_ys):
    return list(grad_ys)

  def check_splits(self, lowering):
    super().check_splits(lowering)
    stage_dim = self._info.stage_dim
    impl = lowering.mesh_impl(self)
    mesh_axis = impl.tensor_dimension_to_mesh_axis(stage_dim)
    if mesh_axis is None:
      return
    mesh_dim = impl.shape[mesh_axis]
    if mesh_dim.size != stage_dim.size:
      raise errors.LayoutError(
          f"pipeline {self._info.name!r}: the stage dimension "
          f"{stage_dim.name!r} (size {stage_dim.size}) is split over mesh "
          f"dimension {mesh_dim.name!r} of size {mesh_dim.size}; a pipeline "
          "needs one stage per processor along that mesh dimension. Make "
          f"them equal (use {mesh_dim.size} stages, or a mesh dimension of "
          f"size {stage_dim.size}), or do not split {stage_dim.name!r}.")

  def lower(self, lowering):
    for x, y in zip(self._inputs, self._outputs):
      lowering.set_tensor_lowering(y, lowering.tensors[x])
    lowering.add_counter("pipeline/iterations", 1)
    lowering.add_counter("pipeline/stage_slots", self._info.num_stages)
    lowering.add_counter("pipeline/busy_slots", self.busy_slots)


def pipeline_infos(graph):
  """The PipelineInfo of every `pipeline` call in mtf `graph`, in order."""
  return [op.info for op in graph.operations
          if isinstance(op, PipelineIterationOperation) and op.iteration == 0]


def _busy_range(iteration, num_stages, num_microbatches):
  """The first and last stage slot holding a micro-batch at `iteration`."""
  return (max(0, iteration - num_microbatches + 1),
          min(num_stages - 1, iteration))


def _check_arguments(name, xs, stage_dim, num_microbatches, batch_dim):
  """Validates pipeline's arguments; returns (stage_dim, batch_dim)."""
  if not xs:
    raise ValueError(f"pipeline {name!r}: needs at least one input tensor.")
  for x in xs:
    if not isinstance(x, graph_lib.Tensor):
      raise TypeError(f"pipeline {name!r}: inputs must be mtf Tensors, got "
                      f"{x!r}.")
  if stage_dim is None or not isinstance(
      stage_dim, (shape_lib.Dimension, tuple)):
    raise errors.ShapeError(
        f"pipeline {name!r}: stage_dim must be an mtf.Dimension (name and "
        f"number of stages), e.g. mtf.Dimension('stage', 4); got "
        f"{stage_dim!r}.")
  stage_dim = shape_lib.convert_to_dimension(stage_dim)
  if stage_dim.size < 1:
    raise errors.ShapeError(
        f"pipeline {name!r}: the stage dimension {stage_dim.name!r} has size "
        f"{stage_dim.size}; it needs at least one stage.")
  if (not isinstance(num_microbatches, numbers.Integral) or
      isinstance(num_microbatches, bool)):
    raise TypeError(f"pipeline {name!r}: num_microbatches must be a Python "
                    f"int, got {num_microbatches!r}.")
  if num_microbatches < 1:
    raise errors.ShapeError(
        f"pipeline {name!r}: num_microbatches is {num_microbatches}; it must "
        "be at least 1 (1 runs the stages one after another on the whole "
        "batch).")
  if batch_dim is None:
    if not xs[0].shape.dims:
      raise errors.ShapeError(
          f"pipeline {name!r}: input {xs[0].name} is a scalar; it has no "
          "batch dimension.")
    batch_dim = xs[0].shape.dims[0]
  batch_name = (batch_dim if isinstance(batch_dim, str) else
                shape_lib.convert_to_dimension(batch_dim).name)
  batch = None
  for x in xs:
    if batch_name not in x.shape.dimension_names:
      raise errors.ShapeError(
          f"pipeline {name!r}: input {x.name} {x.shape} has no batch "
          f"dimension {batch_name!r}; every input is cut into micro-batches "
          "along it.")
    found = x.shape.get_dim_by_name(batch_name)
    if batch is not None and found != batch:
      raise errors.ShapeError(
          f"pipeline {name!r}: the inputs disagree on the batch dimension: "
          f"{batch} and {found} ({x.name}).")
    batch = found
    if stage_dim.name in x.shape.dimension_names:
      raise errors.ShapeError(
          f"pipeline {name!r}: input {x.name} {x.shape} already has the "
          f"stage dimension {stage_dim.name!r}; the pipeline adds it.")
    if MICROBATCH_DIM_NAME in x.shape.dimension_names:
      raise errors.ShapeError(
          f"pipeline {name!r}: input {x.name} {x.shape} has a dimension "
          f"named {MICROBATCH_DIM_NAME!r}, which the pipeline uses for the "
          "micro-batch number; rename it.")
  if not isinstance(batch_dim, str) and (
      shape_lib.convert_to_dimension(batch_dim) != batch):
    raise errors.ShapeError(
        f"pipeline {name!r}: batch_dim {batch_dim} does not match the inputs' "
        f"{batch}.")
  if batch.size % num_microbatches:
    divisors = [d for d in range(1, batch.size + 1) if batch.size % d == 0]
    raise errors.ShapeError(
        f"pipeline {name!r}: {num_microbatches} micro-batches do not divide "
        f"the batch dimension {batch.name!r} of size {batch.size}; choose "
        f"num_microbatches among the divisors of {batch.size} "
        f"({', '.join(map(str, divisors))}), or change the batch size.")
  return stage_dim, batch


def _check_stage_outputs(name, ys, xs):
  """stage_fn's outputs, as a list, checked against its inputs."""
  if isinstance(ys, graph_lib.Tensor):
    ys = [ys]
  if not isinstance(ys, (list, tuple)):
    raise TypeError(f"pipeline {name!r}: stage_fn must return a list of mtf "
                    f"Tensors, got {ys!r}.")
  ys = list(ys)
  if len(ys) != len(xs):
    raise errors.ShapeError(
        f"pipeline {name!r}: stage_fn returned {len(ys)} tensors for "
        f"{len(xs)} inputs; it must return one per input, each with its "
        "input's shape (return extra inputs unchanged).")
  for i, (y, x) in enumerate(zip(ys, xs)):
    if not isinstance(y, graph_lib.Tensor):
      raise TypeError(f"pipeline {name!r}: stage_fn output {i} is not an mtf "
                      f"Tensor: {y!r}.")
    if y.shape != x.shape:
      raise errors.ShapeError(
          f"pipeline {name!r}: stage_fn output {i} has shape {y.shape}, but "
          f"its input has {x.shape}; a stage must keep the shape, since its "
          "output is the next stage's input.")
    if y.dtype != x.dtype:
      raise errors.DTypeError(
          f"pipeline {name!r}: stage_fn output {i} has dtype {y.dtype.name}, "
          f"but its input has {x.dtype.name}.")
  return ys


def pipeline(stage_fn, inputs, stage_dim, num_microbatches, batch_dim=None,
             recompute_grad=False, batch_weight_gradients=False, name=None):
  """Runs S stacked stages on M micro-batches, GPipe style (see module doc).

  The weights of `stage_fn` are stacked along `stage_dim`, e.g.
  `mtf.get_variable(mesh, "w", [stage_dim, d_model, d_ff])`: one call applies
  every stage to its own slot of the buffer. It is called once per
  iteration; variables are created by the first call and found by name
  afterwards. Splitting `stage_dim` over a mesh dimension of size S gives
  each processor one stage (an error at lowering if the sizes differ).

  Example, a 4-stage MLP on mesh "stage:4" with layout "stage:stage":

    stage = mtf.Dimension("stage", 4)
    def stage_fn(xs):
      w = mtf.get_variable(mesh, "w", [stage, d_model, d_model])
      return [xs[0] + mtf.relu(mtf.einsum([xs[0], w], xs[0].shape))]
    y = mtf.pipeline(stage_fn, x, stage, num_microbatches=16)

  Args:
    stage_fn: fn(list of Tensors) -> list of Tensors of the same shapes and
      dtypes (a Tensor when there is one input). Each input is shaped
      [stage_dim] + its micro-batch shape, where the batch dimension has
      size B/M. Inputs other than the activations (e.g. int32 positions)
      travel with them, so each stage sees those of its micro-batch; return
      them unchanged.
    inputs: an mtf Tensor or a list of them, all with the batch dimension.
    stage_dim: the mtf Dimension of the stacked stages (S = its size).
    num_microbatches: M, a Python int >= 1 that divides the batch size.
    batch_dim: the batch Dimension or its name (default: the first
      dimension of the first input).
    recompute_grad: wrap each iteration's stage_fn call in
      `mtf.recompute_grad` (GPipe's re-materialization): the backward pass
      keeps only the buffers between iterations and recomputes the rest.
    batch_weight_gradients: compute the gradient of each weight the stages
      use in einsums with ONE einsum over all iterations' terms, instead of
      one (small) einsum per iteration and a sum (see gradient_batching):
      faster, the more so the smaller the micro-batches and where the
      batch is split (one all-reduce per weight instead of one per
      iteration), but every iteration's einsum operands stay alive until
      the end of the backward pass. Not with recompute_grad, which exists
      to free them.
    name: the pipeline's name (in its operations and PipelineInfo).

  Returns:
    the outputs of the last stage for the whole batch, in the order of the
    inputs: a list of Tensors shaped like `inputs`, or one Tensor if
    `inputs` was one. `pipeline_infos(graph)` tells the iteration count.
  """
  name = name or "pipeline"
  single = isinstance(inputs, graph_lib.Tensor)
  xs = [inputs] if single else list(inputs)
  stage_dim, batch = _check_arguments(name, xs, stage_dim, num_microbatches,
                                      batch_dim)
  if recompute_grad and batch_weight_gradients:
    raise ValueError(
        f"pipeline {name!r}: batch_weight_gradients keeps every iteration's "
        "activations until the end of the backward pass, and recompute_grad "
        "exists to drop them; set one of the two.")
  mesh = xs[0].mesh
  num_stages, m = stage_dim.size, num_microbatches
  microbatch_dim = shape_lib.Dimension(MICROBATCH_DIM_NAME, m)
  inner_batch = shape_lib.Dimension(batch.name, batch.size // m)
  info = PipelineInfo(name, stage_dim, m, m + num_stages - 1)

  stage = constants.mtf_range(mesh, stage_dim, "int32")
  is_first = comparisons.equal(stage, 0)
  is_last = comparisons.equal(stage, num_stages - 1)

  # [batch B] -> [batch B/M, microbatch M]: micro-batch j holds examples
  # j, j + M, ...; local where "batch" is split.
  split_shapes = []
  feeds = []  # feeds[i][t]: the buffer of input i that feeds micro-batch t.
  for x in xs:
    dims = x.shape.dims
    axis = x.shape.dimension_names.index(batch.name)
    split_shape = shape_lib.Shape(
        dims[:axis] + [inner_batch, microbatch_dim] + dims[axis + 1:])
    split_shapes.append(split_shape)
    x_split = reshapes.reshape(x, split_shape)
    feed = binary.where(is_first, x_split, 0,
                        output_shape=[stage_dim] + split_shape.dims)
    feeds.append(stacking.unstack(feed, microbatch_dim))

  def call_stage_fn(*buffers):
    return _check_stage_outputs(name, stage_fn(list(buffers)), buffers)

  collected = []  # Per iteration t >= S - 1, the buffers after stage_fn.
  ys = None
  for t in range(info.num_iterations):
    if t == 0:
      buffers = [f[0] for f in feeds]
    else:
      buffers = [shifts.shift(y, 1, stage_dim, wrap=False) for y in ys]
      if t < m:
        # Slot 0 of the shifted buffer is exactly zero: adding the feed,
        # zero outside slot 0, puts micro-batch t there and changes nothing
        # else.
        buffers = [binary.add(b, f[t]) for b, f in zip(buffers, feeds)]
    buffers = PipelineIterationOperation(
        buffers, info, t, name=f"{name}_iteration_{t}").outputs
    with mesh.graph.capture_operations() as stage_ops:
      if recompute_grad:
        ys = control_flow.recompute_grad(call_stage_fn, buffers)
        ys = [ys] if isinstance(ys, graph_lib.Tensor) else list(ys)
      else:
        ys = call_stage_fn(*buffers)
    if batch_weight_gradients:
      for op in stage_ops:
        if isinstance(op, contractions.EinsumOperation):
          gradient_batching.mark(op, name)
    first, last = _busy_range(t, num_stages, m)
    idle_slots.mark_iteration(
        stage_ops, buffers, stage_dim,
        [s for s in range(num_stages) if not first <= s <= last])
    if first > 0 or last < num_stages - 1:
      busy = comparisons.logical_and(comparisons.greater_equal(stage, first),
                                     comparisons.less_equal(stage, last))
      ys = [binary.where(busy, y, 0) for y in ys]
    if t >= num_stages - 1:
      collected.append(ys)

  outputs = []
  for i, (x, split_shape) in enumerate(zip(xs, split_shapes)):
    axis = 1 + split_shape.dimension_names.index(MICROBATCH_DIM_NAME)
    stacked = stacking.stack([ys[i] for ys in collected], MICROBATCH_DIM_NAME,
                             axis=axis)
    last_slot = binary.where(is_last, stacked, 0)
    y = reduce_lib.reduce_sum(last_slot, reduced_dim=stage_dim)
    outputs.append(reshapes.reshape(y, x.shape))
  return outputs[0] if single else outputs


# The iteration marker hands its inputs on with no TF op.
cost_rules.register(PipelineIterationOperation, cost_rules.PassThroughCost())
