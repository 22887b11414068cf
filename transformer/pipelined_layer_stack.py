"""PipelinedLayerStack: a LayerStack run as a GPipe pipeline of stages.

The L layers of the stack run as S stages of L/S layers each (layer
s * L/S + j is the j-th layer of stage s). Stage s's layers are the same
kind as stage 0's, so their weights are stored stacked along a "stage"
dimension (`mtf.stack_layer_variables`) and one call of stage 0's layers
applies all S stages at once; `mtf.pipeline` streams M micro-batches
through them, shifting activations one stage per iteration (GSPMD's
formulation of GPipe). Split "stage" over a mesh dimension of size S
(layout rule "stage:<mesh dim>") and each processor holds the weights of
its stage only, 1/S of the stack.

Checkpoints keep each layer's own variable names (decoder/block_003/...):
a pipelined run restores into an unpipelined one and the reverse. The
same stack (same gin, same variables) also decodes: in the decoding modes
its layers run one after another, unpipelined (see the class). Gin:

  make_layer_stack.layer_stack_cls = @transformer.PipelinedLayerStack
  PipelinedLayerStack.num_stages = 4
  PipelinedLayerStack.num_microbatches = 16
  PipelinedLayerStack.recompute_grads = True  # or, for speed when the
  # activations fit: PipelinedLayerStack.batch_weight_gradients = True
  mesh_shape = "stage:4"  # and a layout rule "stage:stage"
"""

import copy

import gin
import mesh_tensorflow as mtf

from mesh_tensorflow.transformer import layer_stack as layer_stack_lib

_MODULE = layer_stack_lib._MODULE  # pylint: disable=protected-access

STAGE_DIM_NAME = "stage"

# Modes that carry decoding states from call to call: run unpipelined.
_DECODING_MODES = (layer_stack_lib.FIRST_PART, layer_stack_lib.INCREMENTAL)

# Context attributes that may hold per-example tensors: they travel
# through the pipeline with the activations when they have the batch
# dimension, so each stage sees those of the micro-batch it works on.
_PER_EXAMPLE_ATTRIBUTES = ("sequence_id", "subsequence_id", "position",
                           "encoder_output", "encoder_sequence_id",
                           "write_priority", "read_priority", "inputs",
                           "encoder_inputs")


@gin.configurable(module=_MODULE)
class PipelinedLayerStack(layer_stack_lib.LayerStack):
  """A LayerStack whose layers run as `num_stages` pipelined stages.

  Training, evaluation and scoring ("train", "eval", "infer", "score")
  run through `mtf.pipeline` with `num_microbatches` micro-batches; with
  `recompute_grads` each stage's activations are recomputed in the
  backward pass (GPipe); with `batch_weight_gradients` (instead) each
  weight's gradient is one einsum over all micro-batches. Decoding ("first_part", "incremental") is not
  pipelined: the layers run one after another on the whole batch, as in
  a LayerStack, layer s * L/S + j reading row s of its layer-stacked
  variables (`mtf.stack_layer_variables(..., row=s)`), so decoding
  states, `context.layer_outputs` and `context.layer_index` are a
  LayerStack's, and the variables (and checkpoints) are the same.
  """

  def __init__(self,
               layers,
               num_stages=1,
               num_microbatches=1,
               sublayers_initial=None,
               sublayers_per_layer=None,
               sublayers_final=None,
               dropout_rate=None,
               norm_epsilon=None,
               recompute_grads=False,
               stage_dim_name=STAGE_DIM_NAME,
               batch_weight_gradients=False):
    """Creates a PipelinedLayerStack.

    Args:
      layers: a list of TransformerLayer; layer s * L/S + j must be the
        same kind, with the same hyperparameters, as layer j.
      num_stages: S, which divides len(layers).
      num_microbatches: M, which divides the batch.
      sublayers_initial, sublayers_per_layer, sublayers_final,
        dropout_rate, norm_epsilon: as for LayerStack.
      recompute_grads: recompute each stage's activations in the backward
        pass instead of keeping them.
      stage_dim_name: the name of the stage dimension (for layout rules).
      batch_weight_gradients: compute each weight's gradient with one einsum
        over all micro-batches (mtf.pipeline's option of that name): faster,
        but the activations and their gradients of all micro-batches are
        kept until the end of the backward pass. Not with recompute_grads.

    Raises:
      ValueError: the stage count does not divide the layers, the layers of
        a stage differ from those of stage 0, or both recompute_grads and
        batch_weight_gradients are set.
    """
    super().__init__(layers, sublayers_initial=sublayers_initial,
                     sublayers_per_layer=sublayers_per_layer,
                     sublayers_final=sublayers_final,
                     dropout_rate=dropout_rate, norm_epsilon=norm_epsilon,
                     recompute_grads=recompute_grads)
    num_layers = len(layers)
    if num_stages < 1 or num_layers % num_stages:
      raise ValueError(
          f"PipelinedLayerStack: num_stages={num_stages} does not divide the "
          f"{num_layers} layers; give a stage count that divides "
          f"{num_layers} (e.g. "
          f"{_divisors(num_layers)}) or change the number of layers.")
    if num_microbatches < 1:
      raise ValueError(
          f"PipelinedLayerStack: num_microbatches must be >= 1, got "
          f"{num_microbatches}.")
    if recompute_grads and batch_weight_gradients:
      raise ValueError(
          "PipelinedLayerStack: recompute_grads drops each stage's "
          "activations and batch_weight_gradients keeps them all; set one "
          "of the two.")
    self.num_stages = num_stages
    self.num_microbatches = num_microbatches
    self.batch_weight_gradients = batch_weight_gradients
    self.stage_dim = mtf.Dimension(stage_dim_name, num_stages)
    self._per_stage = num_layers // num_stages
    for i, layer in enumerate(layers):
      first = layers[i % self._per_stage]
      if _config(layer) != _config(first):
        raise ValueError(
            f"PipelinedLayerStack: layer {i} ({layer.name}, "
            f"{type(layer).__name__}) differs from layer "
            f"{i % self._per_stage} ({first.name}, {type(first).__name__}), "
            f"the same position in stage 0; every stage of "
            f"{self._per_stage} layers must repeat the layers of stage 0.")

  def call(self, context, x):
    """Runs the initial sublayers, the pipelined stages, the final ones."""
    if context.mode in _DECODING_MODES:
      return self._call_layer_by_layer(context, x)
    x = self._call_sublayers(self._sublayers_initial, x, context)
    layer_stack_lib._append_layer_output(context, x)  # pylint: disable=protected-access
    batch_dim = _batch_dim(context)
    carried = [a for a in _PER_EXAMPLE_ATTRIBUTES
               if _has_dim(getattr(context, a, None), batch_dim)]
    inputs = [x] + [getattr(context, a) for a in carried]
    num_losses = len(context.losses) if context.losses is not None else 0

    def stage_fn(xs):
      stage_context = self._stage_context(context, carried, xs, batch_dim)
      y = xs[0]
      for j in range(self._per_stage):
        y = self._stage_layer(stage_context, y, j)
        if (context.losses is not None and
            len(context.losses) != num_losses):
          layer = self._layers[j]
          raise ValueError(
              f"PipelinedLayerStack: layer {layer.name} "
              f"({type(layer).__name__}) added an auxiliary loss (e.g. a "
              "mixture of experts) inside a pipelined stage; auxiliary "
              "losses are not pipelined. Run this model with a LayerStack "
              "(make_layer_stack.layer_stack_cls = @transformer.LayerStack),"
              " which restores the same checkpoint, or drop the layer's "
              "loss.")
      return [y] + list(xs[1:])

    outputs = mtf.pipeline(
        stage_fn, inputs, self.stage_dim, self.num_microbatches,
        batch_dim=batch_dim, recompute_grad=self._recompute_grads,
        batch_weight_gradients=self.batch_weight_gradients)
    x = outputs[0]
    context.layer_index += len(self._layers)
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = layer_stack_lib.sublayer_mask_padding(x, self, context)
    layer_stack_lib._append_layer_output(context, x)  # pylint: disable=protected-access
    return x

  def _call_layer_by_layer(self, context, x):
    """The decoding modes: every layer in turn on the whole batch, as
    LayerStack.call does, layer s * L/S + j on row s of the weights."""
    x = self._call_sublayers(self._sublayers_initial, x, context)
    layer_stack_lib._append_layer_output(context, x)  # pylint: disable=protected-access
    for lnum, layer in enumerate(self._layers):
      stage, j = divmod(lnum, self._per_stage)
      with layer_stack_lib._layer_scope(layer):  # pylint: disable=protected-access
        with mtf.stack_layer_variables(
            self.stage_dim, self._member_names_fn(layer.name, j), row=stage):
          # No recompute: decoding takes no gradients.
          x = self._layer_fn(x, layer, context)
      if lnum != len(self._layers) - 1:
        layer_stack_lib._append_layer_output(context, x)  # pylint: disable=protected-access
      context.layer_index += 1
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = layer_stack_lib.sublayer_mask_padding(x, self, context)
    layer_stack_lib._append_layer_output(context, x)  # pylint: disable=protected-access
    return x

  def _member_names_fn(self, scope, j):
    """fn(full variable name under layer scope `scope`) -> the per-layer
    names of its rows: layer j of every stage."""
    names = [self._layers[s * self._per_stage + j].name
             for s in range(self.num_stages)]

    def member_names(full_name):
      return [_rename_scope(full_name, scope, n) for n in names]

    return member_names

  def _stage_context(self, context, carried, xs, batch_dim):
    """A copy of `context` for one call of the stages: batch dims
    [stage, micro-batch], the carried tensors of this iteration, and its
    own cache (cached values have the full batch's shapes)."""
    stage_context = copy.copy(context)
    stage_context.cache = {}
    stage_context.layer_outputs = None
    micro_dim = xs[0].shape.get_dim_by_name(batch_dim.name)
    stage_context.batch_dims = [self.stage_dim] + [
        micro_dim if d == batch_dim else d for d in context.batch_dims]
    for name, value in zip(carried, xs[1:]):
      setattr(stage_context, name, value)
    return stage_context

  def _stage_layer(self, context, x, j):
    """Layer j of every stage at once, its variables stacked by stage."""
    layer = self._layers[j]
    context.layer_index = j
    with layer_stack_lib._layer_scope(layer):  # pylint: disable=protected-access
      with mtf.stack_layer_variables(self.stage_dim,
                                     self._member_names_fn(layer.name, j)):
        return self._layer_fn(x, layer, context)


def _rename_scope(full_name, old, new):
  """`full_name` with its scope component(s) `old` replaced by `new`."""
  parts = full_name.split("/")
  old_parts = old.split("/")
  n = len(old_parts)
  for i in range(len(parts) - n + 1):
    if parts[i:i + n] == old_parts:
      return "/".join(parts[:i] + new.split("/") + parts[i + n:])
  raise ValueError(
      f"PipelinedLayerStack: variable {full_name!r} is not under its "
      f"layer's scope {old!r}.")


def _config(layer):
  """A layer's kind and hyperparameters, without its name."""
  return (type(layer), {k: repr(v) for k, v in vars(layer).items()
                        if k != "_name"})


def _batch_dim(context):
  for d in context.batch_dims:
    if d.name == "batch":
      return d
  return context.batch_dims[0]


def _has_dim(value, dim):
  return isinstance(value, mtf.Tensor) and dim in value.shape.dims


def _divisors(n):
  return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
