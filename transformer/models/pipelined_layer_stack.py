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
import functools
import types

import gin
import mesh_tensorflow as mtf
import numpy as np
import tensorflow as tf

from mesh_tensorflow.transformer.models import layer_stack as layer_stack_lib

STAGE_DIM_NAME = "stage"

# Modes that carry decoding states from call to call: run unpipelined.
_DECODING_MODES = (layer_stack_lib.FIRST_PART, layer_stack_lib.INCREMENTAL)

# The Context attributes that are not inputs of the layers: a stage's
# context gets its own value for them (see _stage_context). Every other
# attribute, whatever its name, is an input, and its per-example tensors
# are cut into micro-batches (see _PerExampleInputs).
_NOT_INPUTS = (
    # Rewritten to [stage, micro-batch] dimensions.
    "batch_dims",
    # The stack's own outputs (whole batch), appended around the pipeline.
    "layer_outputs",
    # Auxiliary losses: the caller's list, so that a stage adding one is
    # caught (auxiliary losses are not pipelined).
    "losses",
    # Values layers share during one call: a stage call has its own (those
    # cached outside the pipeline have the whole batch's shapes).
    "cache",
    # Set by the stack for each layer it runs.
    "current_layer",
    "current_layer_input",
)


@gin.configurable(module=layer_stack_lib.GIN_MODULE)
class PipelinedLayerStack(layer_stack_lib.LayerStack):
  """A LayerStack whose layers run as `num_stages` pipelined stages.

  Training, evaluation and scoring ("train", "eval", "infer", "score")
  run through `mtf.pipeline` with `num_microbatches` micro-batches; with
  `recompute_grads` each stage's activations are recomputed in the
  backward pass (GPipe); with `batch_weight_gradients` (instead) each
  weight's gradient is one einsum over all micro-batches. Every
  per-example tensor of the context (any attribute, also in a list, tuple
  or dict, that has the batch dimension) travels through the pipeline with
  the activations, so a stage's layers read the micro-batch they work on;
  the context's other values are shared by all micro-batches.

  Decoding ("first_part", "incremental") is not pipelined: the layers run
  one after another on the whole batch, as in a LayerStack, layer
  s * L/S + j reading row s of its layer-stacked variables
  (`mtf.stack_layer_variables(..., row=s)`), so decoding states,
  `context.layer_outputs` and `context.layer_index` are a LayerStack's,
  and the variables (and checkpoints) are the same.
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
        pass instead of keeping them: True or False (all layers or none;
        a list of layer indices must name every layer).
      stage_dim_name: the name of the stage dimension (for layout rules).
      batch_weight_gradients: compute each weight's gradient with one einsum
        over all micro-batches (mtf.pipeline's option of that name): faster,
        but the activations and their gradients of all micro-batches are
        kept until the end of the backward pass. Not with recompute_grads.

    Raises:
      ValueError: the stage count does not divide the layers, the layers of
        a stage differ from those of stage 0, recompute_grads lists some
        layers only, or both recompute_grads and batch_weight_gradients
        are set.
    """
    super().__init__(layers, sublayers_initial=sublayers_initial,
                     sublayers_per_layer=sublayers_per_layer,
                     sublayers_final=sublayers_final,
                     dropout_rate=dropout_rate, norm_epsilon=norm_epsilon,
                     recompute_grads=recompute_grads)
    num_layers = len(layers)
    if 0 < len(self._recomputed) < num_layers:
      raise ValueError(
          f"{layer_stack_lib.stack_description(self)}: recompute_grads="
          f"{recompute_grads!r} names {len(self._recomputed)} of the "
          f"{num_layers} layers, but a pipelined stack recomputes all its "
          "layers or none (each stage runs as one recomputed step); give "
          "True or False, or use a LayerStack for per-layer recompute.")
    # All or none: what mtf.pipeline takes.
    recompute_grads = len(self._recomputed) == num_layers > 0
    self._recompute_grads = recompute_grads
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
      difference = _difference(first, layer)
      if difference:
        raise ValueError(
            f"PipelinedLayerStack: layer {i} ({layer.name}, "
            f"{type(layer).__name__}) differs from layer "
            f"{i % self._per_stage} ({first.name}, {type(first).__name__}), "
            f"the same position in stage 0, in {difference}; every stage of "
            f"{self._per_stage} layers must repeat the layers of stage 0.")

  def call(self, context, x):
    """Runs the initial sublayers, the pipelined stages, the final ones."""
    if context.mode in _DECODING_MODES:
      return self._call_layer_by_layer(context, x)
    x = self._call_sublayers(self._sublayers_initial, x, context)
    layer_stack_lib.append_layer_output(context, x)
    per_example = _PerExampleInputs(context, _batch_dim(context))
    num_losses = len(context.losses) if context.losses is not None else 0

    def stage_fn(xs):
      stage_context = self._stage_context(context, per_example, xs)
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
        stage_fn, [x] + per_example.pipeline_inputs(), self.stage_dim,
        self.num_microbatches, batch_dim=per_example.batch_dim,
        recompute_grad=self._recompute_grads,
        batch_weight_gradients=self.batch_weight_gradients)
    x = outputs[0]
    context.layer_index += len(self._layers)
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = layer_stack_lib.sublayer_mask_padding(x, self, context)
    layer_stack_lib.append_layer_output(context, x)
    return x

  def _call_layer_by_layer(self, context, x):
    """The decoding modes: every layer in turn on the whole batch, as
    LayerStack.call does, layer s * L/S + j on row s of the weights."""
    x = self._call_sublayers(self._sublayers_initial, x, context)
    layer_stack_lib.append_layer_output(context, x)
    for lnum, layer in enumerate(self._layers):
      stage, j = divmod(lnum, self._per_stage)
      with layer_stack_lib.layer_scope(layer):
        with mtf.stack_layer_variables(
            self.stage_dim, self._member_names_fn(layer.name, j), row=stage):
          # No recompute: decoding takes no gradients.
          x = self._layer_fn(x, layer, context)
      if lnum != len(self._layers) - 1:
        layer_stack_lib.append_layer_output(context, x)
      context.layer_index += 1
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = layer_stack_lib.sublayer_mask_padding(x, self, context)
    layer_stack_lib.append_layer_output(context, x)
    return x

  def _member_names_fn(self, scope, j):
    """fn(full variable name under layer scope `scope`) -> the per-layer
    names of its rows: layer j of every stage."""
    names = [self._layers[s * self._per_stage + j].name
             for s in range(self.num_stages)]

    def member_names(full_name):
      return [_rename_scope(full_name, scope, n) for n in names]

    return member_names

  def _stage_context(self, context, per_example, xs):
    """A copy of `context` for one call of the stages: batch dims [stage,
    micro-batch], the micro-batches of this iteration's per-example inputs
    (xs[1:]), and its own values of the attributes that are not inputs."""
    stage_context = copy.copy(context)
    micro_dim = xs[0].shape.get_dim_by_name(per_example.batch_dim.name)
    stage_context.batch_dims = [self.stage_dim] + [
        micro_dim if d == per_example.batch_dim else d
        for d in context.batch_dims]
    stage_context.layer_outputs = None
    stage_context.cache = {}
    stage_context.current_layer = None
    stage_context.current_layer_input = None
    for name, value in per_example.stage_values(xs[1:]).items():
      setattr(stage_context, name, value)
    return stage_context

  def _stage_layer(self, context, x, j):
    """Layer j of every stage at once, its variables stacked by stage."""
    layer = self._layers[j]
    context.layer_index = j
    with layer_stack_lib.layer_scope(layer):
      with mtf.stack_layer_variables(self.stage_dim,
                                     self._member_names_fn(layer.name, j)):
        return self._layer_fn(x, layer, context)


def repeat_period(layers):
  """The fewest layers p whose kinds repeat through `layers` (layer i is
  like layer i % p, as _difference compares them): a PipelinedLayerStack
  of these layers takes the stage counts S with len(layers) / S a multiple
  of p."""
  num_layers = len(layers)
  for period in range(1, num_layers + 1):
    if num_layers % period == 0 and all(
        _difference(layers[i % period], layers[i]) is None
        for i in range(period, num_layers)):
      return period
  return max(num_layers, 1)


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


class _PerExampleInputs:
  """The per-example tensors of a Context, cut into micro-batches.

  Every attribute of the context but _NOT_INPUTS is walked, whatever its
  name: a Tensor with the batch dimension travels through the pipeline with
  the activations, so each stage reads those of the micro-batch it works
  on; lists, tuples and dicts are walked item by item. A Tensor without the
  batch dimension, and any other value (the model, the mesh, dimensions,
  numbers), is shared by all micro-batches. A per-example tensor that
  cannot be cut is an error naming the attribute: one whose dimension of
  the batch's name has another size, or one held inside another object
  (which the stage could not be given a micro-batch of).
  """

  def __init__(self, context, batch_dim):
    self.batch_dim = batch_dim
    self._tensors = {}  # id(tensor) -> tensor: each once, in found order.
    # {attribute: its value}, of the attributes holding some.
    self._fields = {name: value for name, value in vars(context).items()
                    if name not in _NOT_INPUTS and self._walk(value, name)}

  def _walk(self, value, path):
    """Collects the per-example tensors of `value`; True if any."""
    if isinstance(value, mtf.Tensor):
      if self.batch_dim not in value.shape.dims:
        self._check_shared(value, path)
        return False
      self._tensors[id(value)] = value
      return True
    # any() of lists, not generators: every item is walked.
    if isinstance(value, (list, tuple)):
      return any([self._walk(v, f"{path}[{i}]")
                  for i, v in enumerate(value)])
    if isinstance(value, dict):
      return any([self._walk(v, f"{path}[{k!r}]") for k, v in value.items()])
    held = _held_per_example_tensor(value, path, self.batch_dim)
    if held:
      raise ValueError(
          f"PipelinedLayerStack: context.{path} is a {type(value).__name__} "
          f"holding a per-example tensor ({held}), which the pipeline cannot "
          "cut into micro-batches. Keep per-example tensors in the context "
          "directly or in lists, tuples or dicts.")
    return False

  def _check_shared(self, tensor, path):
    """Refuses a tensor with a dimension of the batch's name but another
    size: it looks per-example, but cannot be cut with the batch."""
    name = self.batch_dim.name
    if name in tensor.shape.dimension_names:
      raise ValueError(
          f"PipelinedLayerStack: context.{path} has shape {tensor.shape}, "
          f"whose dimension {name!r} is not the batch dimension "
          f"{self.batch_dim} the pipeline cuts into micro-batches. Give it "
          f"the batch dimension if it is per-example, or rename its "
          f"dimension if it is not.")

  def pipeline_inputs(self):
    """The tensors to send through the pipeline (booleans as int32, since
    the pipeline adds its buffers)."""
    return [mtf.cast(t, tf.int32) if t.dtype == tf.bool else t
            for t in self._tensors.values()]

  def stage_values(self, micro_inputs):
    """{attribute: its value with each per-example tensor replaced by its
    micro-batch}, given the pipeline's buffers of `pipeline_inputs()`."""
    micro = {}
    for t, m in zip(self._tensors.values(), micro_inputs):
      micro[id(t)] = mtf.cast(m, tf.bool) if t.dtype == tf.bool else m
    return {name: _replace_tensors(value, micro)
            for name, value in self._fields.items()}


def _replace_tensors(value, replacements):
  """`value` with each Tensor t in it (also in lists, tuples and dicts)
  replaced by replacements[id(t)], if there."""
  if isinstance(value, mtf.Tensor):
    return replacements.get(id(value), value)
  if isinstance(value, (list, dict)):
    new = copy.copy(value)  # Keeps the class (e.g. an OrderedDict).
    for k in range(len(value)) if isinstance(value, list) else value:
      new[k] = _replace_tensors(value[k], replacements)
    return new
  if isinstance(value, tuple):
    items = [_replace_tensors(v, replacements) for v in value]
    return type(value)(*items) if hasattr(value, "_fields") else type(
        value)(items)
  return value


def _held_per_example_tensor(value, path, batch_dim):
  """Where a value the pipeline does not walk (a set, or an object's
  attributes, one level down) holds a Tensor with the batch dimension's
  name, or None. Classes, functions and modules hold none."""
  if isinstance(value, (set, frozenset)):
    items = [(f"an item of context.{path}", v) for v in value]
  elif isinstance(value, (type, types.FunctionType, types.ModuleType)):
    return None
  else:
    items = [(f"context.{path}.{k}", v)
             for k, v in getattr(value, "__dict__", {}).items()]
  while items:
    where, v = items.pop()
    if isinstance(v, mtf.Tensor):
      if batch_dim.name in v.shape.dimension_names:
        return f"{where}, shape {v.shape}"
    elif isinstance(v, (list, tuple, set, frozenset)):
      items.extend((f"{where}[{i}]", w) for i, w in enumerate(v))
    elif isinstance(v, dict):
      items.extend((f"{where}[{k!r}]", w) for k, w in v.items())
  return None


def _difference(a, b, path="", seen=None):
  """Where two layers' configurations differ (a description), or None.

  Compared by structure, not by repr: the same class, then Tensors by
  shape and dtype, lists, tuples and dicts item by item, layers and other
  plain objects attribute by attribute (a layer's name aside), and numbers,
  strings, None, functions, classes and values of classes with their own
  equality (Dimension, Shape, VariableDType) with `==`.
  """
  seen = set() if seen is None else seen
  if type(a) is not type(b):
    return f"{path or 'the class'}: {type(a).__name__} vs {type(b).__name__}"
  if a is b:
    return None
  if isinstance(a, mtf.Tensor):
    if (a.shape, a.dtype) == (b.shape, b.dtype):
      return None
    return (f"{path}: a tensor {a.shape} {a.dtype.name} vs "
            f"{b.shape} {b.dtype.name}")
  if isinstance(a, np.ndarray):
    if a.dtype == b.dtype and np.array_equal(a, b):
      return None
    return f"{path}: {a!r} vs {b!r}"
  if isinstance(a, (list, tuple)):
    if len(a) != len(b):
      return f"{path}: {len(a)} items vs {len(b)}"
    pairs = [(f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
  elif isinstance(a, dict):
    if set(a) != set(b):
      return f"{path}: keys {list(a)} vs {list(b)}"
    pairs = [(f"{path}[{k!r}]", a[k], b[k]) for k in a]
  elif isinstance(a, functools.partial):
    pairs = [(_attribute_path(path, n), getattr(a, n), getattr(b, n))
             for n in ("func", "args", "keywords")]
  elif _compared_by_attributes(a):
    if (id(a), id(b)) in seen:  # A cycle: compared further up.
      return None
    seen.add((id(a), id(b)))
    attributes_a, attributes_b = _attributes(a), _attributes(b)
    if set(attributes_a) != set(attributes_b):
      return (f"{path or 'the attributes'}: {sorted(attributes_a)} vs "
              f"{sorted(attributes_b)}")
    pairs = [(_attribute_path(path, k), v, attributes_b[k])
             for k, v in attributes_a.items()]
  else:
    return None if a == b else f"{path or 'the value'}: {a!r} vs {b!r}"
  for where, x, y in pairs:
    difference = _difference(x, y, where, seen)
    if difference:
      return difference
  return None


def _compared_by_attributes(value):
  """Whether `value` is a plain object (a layer, a hyperparameter set),
  compared attribute by attribute rather than with `==`."""
  return (hasattr(value, "__dict__") and
          type(value).__eq__ is object.__eq__ and
          not isinstance(value, (type, types.FunctionType, types.MethodType,
                                 types.BuiltinFunctionType,
                                 types.ModuleType)))


def _attributes(value):
  """An object's attributes; for a layer, without its name (which differs
  from stage to stage by design)."""
  attributes = dict(vars(value))
  if isinstance(value, layer_stack_lib.TransformerLayer):
    attributes.pop("_name", None)
  return attributes


def _attribute_path(path, name):
  return f"{path}.{name}" if path else name


def _batch_dim(context):
  for d in context.batch_dims:
    if d.name == "batch":
      return d
  return context.batch_dims[0]


def _divisors(n):
  return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
