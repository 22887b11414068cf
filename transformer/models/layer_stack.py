"""Transformer layers, their call Context and the LayerStack.

What the models (`unitransformer`, `bitransformer`, `decoding`) and the
layer modules build on: `TransformerLayer`, `Context`, the decoding modes
`FIRST_PART` and `INCREMENTAL`, `LayerStack`, `ReversibleLayerStack` and
`make_layer_stack`. These are names of the original's
`mesh_tensorflow.transformer.transformer` module, which re-exports them; gin
registers them under that module's name (`GIN_MODULE`), as the original
did. Stacks written elsewhere subclass `LayerStack` (`PipelinedLayerStack`)
or, when they are no LayerStack, its base `SublayerRunner` (the funnel
transformer's), and share `append_layer_output` and `layer_scope`.

Layers record their hyperparameters when constructed and create their
variables (through `mtf.get_variable`) when called, so the same objects
build the model in any TensorFlow mode and on any mesh.
"""

import collections.abc
import contextlib
import json

import gin
import mesh_tensorflow as mtf
import numpy as np
import tensorflow as tf

from mesh_tensorflow.estimator import mode_keys
from mesh_tensorflow.transformer.layers.sublayers import sublayer_call_layer
from mesh_tensorflow.transformer.layers.sublayers import sublayer_dropout
from mesh_tensorflow.transformer.layers.sublayers import sublayer_legacy_dropout
from mesh_tensorflow.transformer.layers.sublayers import sublayer_legacy_final_rms_norm
from mesh_tensorflow.transformer.layers.sublayers import sublayer_legacy_rms_norm
from mesh_tensorflow.transformer.layers.sublayers import sublayer_mask_padding
from mesh_tensorflow.transformer.layers.sublayers import sublayer_residual
from mesh_tensorflow.transformer.layers.sublayers import sublayer_rms_norm

# Gin registers the configurables here (and stacks defined elsewhere, such
# as PipelinedLayerStack) under the original's module.
GIN_MODULE = "mesh_tensorflow.transformer.transformer"

# Decoding modes, besides the estimator's "train", "eval" and "infer":
# "first_part" runs the known prefix through every layer so that layers can
# build their decoding states; "incremental" runs one position at a time
# inside the decoding loop.
FIRST_PART = "first_part"
INCREMENTAL = "incremental"


class TransformerLayer:
  """A layer of a Transformer: records hyperparameters, builds in `call`.

  Subclasses take their hyperparameters in `__init__` and create their
  variables inside `call(context, x)`, which returns a tensor shaped like
  `x`. In "first_part" and "incremental" modes a layer with decoding state
  records it in the `Context` (see `Context.record_new_states`).
  """

  def call(self, context, x):
    """Applies the layer to `x` (an mtf.Tensor) given a `Context`."""
    raise NotImplementedError(
        f"{type(self).__name__} does not implement call(context, x)")

  def to_json(self):
    """The layer's hyperparameters as a JSON string."""
    return json.dumps(self, default=lambda o: {
        "class": type(o).__name__,
        **{k: v for k, v in vars(o).items() if not k.startswith("__")}})

  def set_name(self, name):
    self._name = name

  @property
  def name(self):
    return getattr(self, "_name", None)


class Context:
  """What the layers of one model call need to know besides their input.

  A Unitransformer creates one per call and passes it to every layer. It
  carries the mode, the batch and length dimensions, positions and segment
  ids of packed examples, the encoder's output for encoder-decoder
  attention, lists onto which layers append auxiliary losses and layer
  outputs, and the decoding states: "states" are loop variables that change
  at every decoding step, "constant_states" are computed once in
  "first_part" mode and read at every "incremental" step.
  """

  def __init__(self,
               model,
               mesh,
               batch_dims,
               length_dim,
               variable_dtype,
               beam_dim=None,
               mode=mode_keys.ModeKeys.TRAIN,
               position=None,
               position_is_default=False,
               sequence_id=None,
               subsequence_id=None,
               states=None,
               new_states=None,
               losses=None,
               initial_position=None,
               layer_outputs=None,
               encoder_output=None,
               encoder_sequence_id=None,
               constant_states=None,
               shared_params=None,
               encoder_layer_outputs=None,
               write_priority=None,
               read_priority=None,
               inputs=None,
               encoder_inputs=None,
               num_microbatches=1):
    """Creates a context.

    Args:
      model: the Unitransformer making the call.
      mesh: the mtf.Mesh.
      batch_dims: a list of mtf.Dimension.
      length_dim: the mtf.Dimension of sequence positions.
      variable_dtype: an mtf.VariableDType.
      beam_dim: an optional mtf.Dimension (beam search).
      mode: "train", "eval", "infer", "first_part" or "incremental".
      position: an optional int32 Tensor, each token's position; None means
        its index along `length_dim`.
      position_is_default: True when `position` equals
        `mtf.range(mesh, length_dim, tf.int32)`, so that position embeddings
        can be a slice instead of a gather.
      sequence_id: an optional int32 Tensor telling apart the examples packed
        into one row (0 marks padding), or the Python int 1 when there is no
        padding.
      subsequence_id: an optional int32 Tensor (several targets per input).
      states: the decoding states read in "incremental" mode.
      new_states: a list onto which layers append their new states.
      losses: a list onto which layers append auxiliary losses.
      initial_position: the first position to decode ("first_part" mode).
      layer_outputs: a list onto which the stack appends each layer output.
      encoder_output: the encoder's output, for encoder-decoder attention.
      encoder_sequence_id: like `sequence_id`, aligned with encoder_output.
      constant_states: a list of structures recorded in "first_part" mode
        and read back in the same order in "incremental" mode.
      shared_params: a dict of parameters shared between the Unitransformers
        of one model (the shared embedding of a Bitransformer).
      encoder_layer_outputs: the encoder's layer outputs (read only).
      write_priority: an optional Tensor; in self-attention position a sees
        position b iff read_priority[a] >= write_priority[b].
      read_priority: an optional Tensor (see write_priority).
      inputs: the input ids of this call.
      encoder_inputs: the encoder's input ids.
      num_microbatches: how many microbatches a training step is split into.
    """
    self.model = model
    self.mesh = mesh
    self.batch_dims = batch_dims
    self.length_dim = length_dim
    self.variable_dtype = variable_dtype
    self.beam_dim = beam_dim
    self.mode = mode
    self.position = position
    self.position_is_default = position_is_default
    self.sequence_id = sequence_id
    self.subsequence_id = subsequence_id
    self.states = states
    self.new_states = new_states
    self.losses = losses
    self.initial_position = initial_position
    # A fresh list by default, as in the original, so that stacks can
    # always append to it.
    self.layer_outputs = [] if layer_outputs is None else layer_outputs
    self.encoder_output = encoder_output
    self.encoder_sequence_id = encoder_sequence_id
    self.constant_states = constant_states
    self.next_constant_state = 0
    self.shared_params = shared_params if shared_params is not None else {}
    self.layer_index = 0
    self.encoder_layer_outputs = encoder_layer_outputs
    # Values layers share with each other during one call.
    self.cache = {}
    self.write_priority = write_priority
    self.read_priority = read_priority
    self.inputs = inputs
    self.encoder_inputs = encoder_inputs
    self.num_microbatches = num_microbatches
    # Set by LayerStack while a layer's sublayers run (sublayer_call_layer
    # calls current_layer; sublayer_residual adds current_layer_input).
    self.current_layer = None
    self.current_layer_input = None

  @property
  def train(self):
    """True in training mode (dropout and auxiliary losses apply)."""
    return self.mode == mode_keys.ModeKeys.TRAIN

  @property
  def activation_dtype(self):
    return self.variable_dtype.activation_dtype

  @property
  def encoder_length_dim(self):
    """The encoder output's length dimension (named "memory_length")."""
    for dim in self.encoder_output.shape.dims:
      if dim.name == "memory_length":
        return dim
    raise ValueError(
        "the encoder output has no 'memory_length' dimension: "
        f"{self.encoder_output.shape}")

  def get_states(self, n):
    """The next `n` decoding states ("incremental" mode).

    Layers read their states in the order they recorded them: the states a
    layer reads start where the new states recorded so far end.
    """
    start = len(self.new_states)
    return self.states[start:start + n]

  def record_new_states(self, new_states):
    """Appends a layer's new decoding states (a list of Tensors)."""
    self.new_states.extend(new_states)

  def record_constant_state(self, s):
    """Keeps `s` ("first_part" mode) for `get_constant_state` later."""
    self.constant_states.append(s)

  def get_constant_state(self):
    """The next structure recorded by `record_constant_state`."""
    state = self.constant_states[self.next_constant_state]
    self.next_constant_state += 1
    return state

  @property
  def nonpadding(self):
    """1.0 where there is a token and 0.0 in padding, or None if unknown."""
    if self.sequence_id is None:
      return None
    if isinstance(self.sequence_id, int):
      return self.sequence_id  # The int 1: no padding anywhere.
    return mtf.cast(mtf.not_equal(self.sequence_id, 0),
                    self.activation_dtype)

  def get_position(self):
    """Each token's position: `position`, else its index along length."""
    if self.position_is_default or self.position is None:
      return mtf.range(self.mesh, self.length_dim, tf.int32)
    return self.position


class SublayerRunner(TransformerLayer):
  """Runs layers wrapped in three pipelines of sublayer functions.

  The part of a stack that `LayerStack` and the funnel transformer's stack
  (which is no LayerStack, as in the original) share: the pipelines
  `_sublayers_initial`, `_sublayers_per_layer` and `_sublayers_final` (see
  `layers/sublayers.py`), how one of them runs, and how one layer runs through
  the per-layer pipeline. Subclasses set `_layers` and write `call`.
  """

  def _set_sublayers(self, initial, per_layer, final):
    """Sets the pipelines; an unset one gets the one defaults.gin binds, so
    that a stack built without gin is the usual pre-norm residual stack."""
    self._sublayers_initial = (
        [sublayer_dropout] if initial is None else initial)
    self._sublayers_per_layer = (
        [sublayer_rms_norm, sublayer_call_layer, sublayer_dropout,
         sublayer_residual] if per_layer is None else per_layer)
    self._sublayers_final = (
        [sublayer_rms_norm, sublayer_dropout] if final is None else final)

  def _call_sublayers(self, sublayers, x, context):
    for s in sublayers:
      x = s(x, self, context)
    return x

  def _layer_fn(self, x, layer, context):
    """Runs one layer's sublayers; checks the result is shaped like x."""
    context.current_layer = layer
    context.current_layer_input = x
    y = self._call_sublayers(self._sublayers_per_layer, x, context)
    if y.shape != x.shape:
      raise ValueError(
          f"Layer {type(layer).__name__} ({layer.name}) returned a misshaped "
          f"output: its input is {x.shape}, its output {y.shape}.")
    return y

  @property
  def num_layers(self):
    return len(self.layers)

  @property
  def layers(self):
    return self._layers


@gin.configurable(module=GIN_MODULE)
class LayerStack(SublayerRunner):
  """A stack of layers, each wrapped in a pipeline of sublayer functions.

  The sublayers (see `layers/sublayers.py`) say how a layer is wrapped:
  the usual pre-norm residual block is `[sublayer_rms_norm,
  sublayer_call_layer, sublayer_dropout, sublayer_residual]`. After
  `sublayers_final` padding is zeroed. Every layer runs under its name's
  variable scope (`make_layer_stack` names them `block_000/layer_000`,
  ...).
  """

  def __init__(self,
               layers,
               sublayers_initial=None,
               sublayers_per_layer=None,
               sublayers_final=None,
               dropout_rate=None,
               norm_epsilon=None,
               recompute_grads=False):
    """Creates a LayerStack.

    Args:
      layers: a list of TransformerLayer.
      sublayers_initial: an optional list of sublayer functions, run once on
        the stack's input. Default (as defaults.gin): [sublayer_dropout].
      sublayers_per_layer: an optional list of sublayer functions, run for
        each layer (`sublayer_call_layer` among them calls it). Default:
        [sublayer_rms_norm, sublayer_call_layer, sublayer_dropout,
        sublayer_residual].
      sublayers_final: an optional list of sublayer functions, run on the
        last layer's output. Default: [sublayer_rms_norm, sublayer_dropout].
      dropout_rate: legacy mode (with norm_epsilon): a float; the sublayers
        are then the legacy ones, whose variables have old checkpoints'
        names ("layer_norm", "final_layer_norm").
      norm_epsilon: legacy mode (with dropout_rate): a float.
      recompute_grads: which layers' activations are recomputed in the
        backward pass (`mtf.recompute_grad`) instead of kept: True (every
        layer), False (none) or a collection of layer indices, e.g.
        `[0, 1]` (the first two; a run planner's per-layer choice).

    Raises:
      ValueError: only one of dropout_rate and norm_epsilon is given, or
        recompute_grads names no layer of the stack.
    """
    self._layers = layers
    self._recompute_grads = recompute_grads
    self._recomputed = recomputed_layers(
        recompute_grads, len(layers), stack_description(self))
    self._sublayers_initial = sublayers_initial
    self._sublayers_per_layer = sublayers_per_layer
    self._sublayers_final = sublayers_final
    if (dropout_rate is None) != (norm_epsilon is None):
      raise ValueError(
          "LayerStack: give both dropout_rate and norm_epsilon (legacy mode) "
          f"or neither, got dropout_rate={dropout_rate}, "
          f"norm_epsilon={norm_epsilon}.")
    if dropout_rate is not None:
      self._legacy_init(dropout_rate, norm_epsilon)
    else:
      self._set_sublayers(
          sublayers_initial, sublayers_per_layer, sublayers_final)

  def _legacy_init(self, dropout_rate, norm_epsilon):
    """The pipeline of old checkpoints, for dropout_rate/norm_epsilon."""
    self.dropout_rate = dropout_rate
    self.norm_epsilon = norm_epsilon
    if (self._sublayers_initial is not None or
        self._sublayers_per_layer is not None or
        self._sublayers_final is not None):
      tf.compat.v1.logging.warning(
          "LayerStack legacy mode (dropout_rate, norm_epsilon): the given "
          "sublayers are ignored.")
    self._sublayers_initial = [sublayer_legacy_dropout]
    self._sublayers_per_layer = [sublayer_legacy_rms_norm,
                                 sublayer_call_layer,
                                 sublayer_legacy_dropout,
                                 sublayer_residual]
    self._sublayers_final = [sublayer_legacy_final_rms_norm,
                             sublayer_legacy_dropout]

  def call(self, context, x):
    """Runs the initial sublayers, every layer, then the final ones."""
    x = self._call_sublayers(self._sublayers_initial, x, context)
    append_layer_output(context, x)
    for lnum, layer in enumerate(self._layers):
      with layer_scope(layer):
        if lnum in self._recomputed:
          def fn(x, l=layer, c=context):
            return self._layer_fn(x, l, c)
          x = mtf.recompute_grad(fn, [x])
        else:
          x = self._layer_fn(x, layer, context)
      if lnum != len(self._layers) - 1:
        append_layer_output(context, x)
      context.layer_index += 1
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = sublayer_mask_padding(x, self, context)
    append_layer_output(context, x)
    return x


def recomputed_layers(recompute_grads, num_layers, stack):
  """The frozenset of layer indices a stack's `recompute_grads` names.

  Args:
    recompute_grads: True (every layer), False or None (none), or a
      collection of indices in [0, num_layers).
    num_layers: the stack's layer count.
    stack: the stack's description, for errors (stack_description).

  Raises:
    ValueError: anything else, or an index out of range, naming it.
  """
  if recompute_grads is None or isinstance(recompute_grads, (bool, np.bool_)):
    return frozenset(range(num_layers)) if recompute_grads else frozenset()
  if isinstance(recompute_grads, (str, bytes)) or not isinstance(
      recompute_grads, collections.abc.Iterable):
    raise ValueError(
        f"{stack}: recompute_grads must be True, False or a list of layer "
        f"indices, got {recompute_grads!r}.")
  indices = list(recompute_grads)
  for index in indices:
    if (not isinstance(index, (int, np.integer)) or
        isinstance(index, (bool, np.bool_)) or
        not 0 <= index < num_layers):
      raise ValueError(
          f"{stack}: recompute_grads names layer index {index!r}, but the "
          f"stack has {num_layers} layers (indices 0 to {num_layers - 1}).")
  return frozenset(int(i) for i in indices)


def stack_description(stack):
  """"<class> (gin scope '<scope>')" of a stack being constructed: the
  scope (e.g. "encoder") tells the stacks of a model apart."""
  scope = gin.current_scope_str()
  name = type(stack).__name__
  return f"{name} (gin scope {scope!r})" if scope else name


def append_layer_output(context, x):
  """Appends a stack's output `x` to `context.layer_outputs`, if kept."""
  if context.layer_outputs is not None:
    context.layer_outputs.append(x)


def layer_scope(layer):
  """The variable scope of a layer: its name, or none if it has none."""
  if layer.name:
    return tf.compat.v1.variable_scope(layer.name)
  return contextlib.nullcontext()


@gin.configurable(module=GIN_MODULE)
class ReversibleLayerStack(LayerStack):
  """A LayerStack as a reversible network (RevNet; used by the Reformer).

  The input is split into two copies x1, x2; each layer adds its output to
  one half and swaps them (`mtf.layers.reversible_half_residual_and_swap`),
  so with `recompute_grads` the backward pass reconstructs each layer's
  input from its output instead of keeping it. The output is x1 + x2. Give
  sublayers_per_layer without `sublayer_residual`: the stack adds it.
  """

  def call(self, context, x):
    """Runs the layers as reversible half-residual blocks."""
    x = self._call_sublayers(self._sublayers_initial, x, context)
    append_layer_output(context, x)
    x1, x1_backwards, x2, x2_backwards = x, None, x, None
    for lnum, layer in enumerate(self._layers):
      with layer_scope(layer):
        def fn(x, l=layer, c=context):
          return self._layer_fn(x, l, c)
        x1, x1_backwards, x2, x2_backwards = (
            mtf.layers.reversible_half_residual_and_swap(
                x1, x1_backwards, x2, x2_backwards, fn,
                recompute_grads=lnum in self._recomputed))
      if lnum != len(self._layers) - 1:
        append_layer_output(context, x1 + x2)
      context.layer_index += 1
    x = x1 + x2
    x = self._call_sublayers(self._sublayers_final, x, context)
    append_layer_output(context, x)
    return x


@gin.configurable(module=GIN_MODULE)
def make_layer_stack(layers=gin.REQUIRED,
                     layer_stack_cls=LayerStack,
                     num_layers=6,
                     block_scope=True):
  """A LayerStack of `num_layers` blocks of `layers` (gin-configurable).

  Each item of `layers` is a TransformerLayer subclass, or a list/tuple of
  such a class, an optional string (the layer's name) and an optional dict
  (its constructor's keyword arguments), e.g.
  `[transformer_layers.DenseReluDense, "ffn", {"hidden_size": 2048}]`.

  Args:
    layers: a list of layer specifications (see above).
    layer_stack_cls: the stack class, e.g. LayerStack or
      ReversibleLayerStack.
    num_layers: how many times the block of `layers` repeats.
    block_scope: if True layers are named `block_<b>/layer_<n>` (n within
      the block, or the given name: `block_<b>/<name>`); else
      `layer_<n>` (n over the whole stack) or the given name.

  Returns:
    a `layer_stack_cls`.
  """
  layer_stack = []
  for block in range(num_layers):
    for n, spec in enumerate(layers):
      cls, name, kwargs = _parse_layer_spec(spec)
      if block_scope:
        name = "block_{:03d}/{}".format(block, name or "layer_{:03d}".format(n))
      else:
        name = name or "layer_{:03d}".format(len(layer_stack))
      layer = cls(**kwargs)
      layer.set_name(name)
      layer_stack.append(layer)
  return layer_stack_cls(layer_stack)


def _parse_layer_spec(spec):
  """(class, name or None, kwargs) of one item of make_layer_stack's list."""
  if not isinstance(spec, (list, tuple)):
    return spec, None, {}
  cls, name, kwargs = None, None, {}
  for item in spec:
    if isinstance(item, str):
      name = item
    elif isinstance(item, dict):
      kwargs = item
    else:
      cls = item
  if cls is None:
    raise ValueError(f"make_layer_stack: layer specification {spec!r} has no "
                     "layer class.")
  return cls, name, kwargs

