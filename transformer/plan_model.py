"""TransformerPlanModel: the Transformer binary's models, for the run planner.

The planner (mtf.auto_mtf.plan) builds the training step's graph of each
structure a model allows (mtf.auto_mtf.plan_space). For the binary's
encoder-decoder ("bitransformer") and decoder-only ("lm", "delimited_lm",
"aligned") models this module builds it exactly as the binary trains it:
run_model_fn's `training_graph`, the model built from the run's gin
configuration plus the structure's bindings (`settings`):

  stages S > 1   every layer stack a PipelinedLayerStack of S stages and M
                 micro-batches, recomputing all its layers (recompute_layers
                 = the layer count) or none;
  S = 1          a LayerStack recomputing its first k layers
                 (LayerStack.recompute_grads = [0, ..., k - 1]).

A stack's "layers" are its LayerStack's: a block of self-attention and a
feed-forward layer is two. `recompute_layers` counts up to the longest
stack's layers; a shorter stack (an encoder without encoder-decoder
attention) recomputes min(k, its layers). Bindings are per stack, in the
gin scope the binary builds it in ("encoder/", "decoder/"; none for a
single stack).

The model keeps its own gin configuration (binary/gin_state): the caller's
at construction, or parsed from files (plan_gin.from_gin, for planning a
machine you do not have: no devices and no TF variables, only the mtf
graph). Each
build installs it with the structure's bindings and puts the caller's
back, so nothing leaks into the run's configuration or its operative
config.
"""

import contextlib
import gc

import tensorflow as tf

from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import proxy_layers
from mesh_tensorflow.transformer.binary import gin_state as gin_state_lib
from mesh_tensorflow.transformer.binary import run_auto_layout
from mesh_tensorflow.transformer.binary import run_model_fn
from mesh_tensorflow.transformer.binary import run_settings
from mesh_tensorflow.transformer.models import layer_stack as layer_stack_lib
from mesh_tensorflow.transformer.models import pipelined_layer_stack

# The gin scopes the binary builds each model type's layer stacks in.
STACK_SCOPES = {"bitransformer": ("encoder", "decoder"), "lm": ("",),
                "delimited_lm": ("",), "aligned": ("",)}
_STACK_CLS = "transformer.make_layer_stack.layer_stack_cls"
_PIPELINED = "transformer.PipelinedLayerStack"
_PLAIN = "transformer.LayerStack"


class _SizedVocabulary:
  """A vocabulary known by its size only (planning without its files)."""

  def __init__(self, vocab_size):
    self.vocab_size = vocab_size


class _Stack:
  """What the planner needs of one layer stack: its gin scope, layer
  count, repeat period (for stage counts) and class."""

  def __init__(self, scope, stack):
    self.scope = scope
    self.num_layers = len(stack.layers)
    self.period = pipelined_layer_stack.repeat_period(stack.layers)
    self.cls = type(stack)

  @property
  def prefix(self):
    return f"{self.scope}/" if self.scope else ""

  def takes_stages(self, stages):
    return (self.num_layers % stages == 0 and
            (self.num_layers // stages) % self.period == 0)


class TransformerPlanModel(plan_space.PlanModel):
  """The binary's Transformer in every structure the planner searches."""

  def __init__(self, model_type, batch_size, sequence_length, vocabulary,
               optimizer, learning_rate_schedule=0.01, train_dataset_fn=None,
               ensemble_inputs=None, autostack=True, variable_filter=None,
               gin_state=None):
    """A plan model of the binary's settings (utils.run's names).

    Args:
      model_type: "bitransformer", "lm", "delimited_lm" or "aligned".
      batch_size: sequences per batch (an int).
      sequence_length: an int or a dict feature -> length.
      vocabulary: a Vocabulary, an (inputs, targets) pair of them, or an
        int (the size; also in a pair).
      optimizer: an mtf.optimize.Optimizer class (utils.run.optimizer).
      learning_rate_schedule: a float or a function of `step` (bound).
      train_dataset_fn: optional; the features are those of its examples
        (else those the model type needs).
      ensemble_inputs, autostack, variable_filter: as utils.run's.
      gin_state: a binary.gin_state.GinState the model is built under
        (default: gin's configuration now).

    Raises:
      ValueError: a model type or batch size the planner does not take.
    """
    if model_type not in STACK_SCOPES:
      raise ValueError(
          f"TransformerPlanModel: model_type {model_type!r} is not planned; "
          f"expected one of {', '.join(STACK_SCOPES)}.")
    if not isinstance(batch_size, int) or batch_size < 1:
      raise ValueError(
          f"TransformerPlanModel: batch_size must be a number of sequences "
          f"(an int >= 1), got {batch_size!r}.")
    if optimizer is None:
      raise ValueError("TransformerPlanModel: the training graph needs an "
                       "optimizer (utils.run.optimizer).")
    if isinstance(sequence_length, int):
      sequence_length = {"inputs": sequence_length,
                         "targets": sequence_length}
    self.model_type = model_type
    self.batch_size = batch_size
    self.sequence_length = dict(sequence_length)
    self._vocabulary = _sized(vocabulary)
    self._optimizer = optimizer
    self._learning_rate_schedule = learning_rate_schedule
    self._ensemble_inputs = ensemble_inputs
    self._autostack = autostack
    self._variable_filter = variable_filter
    self._gin = gin_state or gin_state_lib.GinState.capture()
    with self._gin.installed():
      stacks = _layer_stacks(self._build_model(), model_type)
      with tf.Graph().as_default():
        features = run_auto_layout.training_features(
            model_type, batch_size, self.sequence_length, ensemble_inputs,
            train_dataset_fn, vocabulary)
    self._feature_shapes = {k: v.shape.as_list() for k, v in features.items()}
    self._stacks = [_Stack(scope, stack) for scope, stack in
                    zip(STACK_SCOPES[model_type], stacks)]
    outer = self._gin.query(
        "utils.tpu_estimator_model_fn.outer_batch_size", 1) or 1
    # The dimension the pipeline cuts into micro-batches.
    self.pipeline_batch = batch_size // outer

  @classmethod
  def from_run_arguments(cls, arguments, batch_size=None,
                         sequence_length=None, gin_state=None):
    """The plan model of utils.run's arguments (a dict name -> value, as
    run_resolution.resolve takes them); batch_size and sequence_length
    default to theirs (a batch size that does not depend on the layout)."""
    a = arguments
    if sequence_length is None:
      sequence_length = a["sequence_length"]
    if isinstance(sequence_length, int):
      sequence_length = {"inputs": sequence_length,
                         "targets": sequence_length}
    gin_state = gin_state or gin_state_lib.GinState.capture()
    with gin_state.installed():  # Steps and batch may be gin functions.
      if batch_size is None:
        batch_size = _fixed_batch_size(sequence_length, a["batch_size"])
      train_steps = a["train_steps"]
      if not isinstance(train_steps, int):
        train_steps = train_steps(batch_size, sequence_length)
    return cls(
        model_type=a["model_type"], batch_size=batch_size,
        sequence_length=sequence_length, vocabulary=a["vocabulary"],
        optimizer=a["optimizer"],
        learning_rate_schedule=run_settings.bind_learning_rate_schedule(
            a["learning_rate_schedule"], a["total_run_steps"] or train_steps),
        train_dataset_fn=a.get("train_dataset_fn"),
        ensemble_inputs=a.get("ensemble_inputs"),
        autostack=a.get("autostack", True),
        variable_filter=a.get("variable_filter"), gin_state=gin_state)

  @property
  def num_layers(self):
    """The longest stack's layer count: recompute_layers' all."""
    return max(s.num_layers for s in self._stacks)

  @property
  def stack_layers(self):
    """{gin scope: layer count} of the model's stacks."""
    return {s.scope: s.num_layers for s in self._stacks}

  def _pipelinable(self):
    return all(issubclass(s.cls, pipelined_layer_stack.PipelinedLayerStack)
               or s.cls is layer_stack_lib.LayerStack for s in self._stacks)

  def structures(self, num_processors):
    """The structures on num_processors processors (see the module)."""
    num_layers = self.num_layers
    if not self._pipelinable():
      # Another stack class (reversible, ...): searched as configured.
      return [plan_space.Structure()]
    found = [plan_space.Structure(recompute_layers=k)
             for k in sorted({0, num_layers // 2, num_layers})]
    for stages in range(2, num_processors + 1):
      if num_processors % stages or not all(
          s.takes_stages(stages) for s in self._stacks):
        continue
      for micro_batches in (stages, 2 * stages, 4 * stages):
        if self.pipeline_batch % micro_batches:
          continue
        found += [plan_space.Structure(stages, micro_batches, k)
                  for k in (0, num_layers)]
    return found

  def _check(self, structure):
    if not isinstance(structure, plan_space.Structure):
      raise ValueError(f"TransformerPlanModel: expected a Structure, got "
                       f"{structure!r}.")
    if structure.recompute_layers > self.num_layers:
      raise ValueError(
          f"TransformerPlanModel: {structure.describe()!r} recomputes "
          f"{structure.recompute_layers} layers; the stacks have "
          f"{self.stack_layers}.")
    if structure.pipelined:
      bad = [s for s in self._stacks if not s.takes_stages(structure.stages)]
      if bad:
        raise ValueError(
            f"TransformerPlanModel: {structure.stages} stages do not divide "
            f"the {bad[0].scope or 'layer'} stack's {bad[0].num_layers} "
            f"layers into stages that repeat its {bad[0].period}-layer "
            "block.")
      if structure.recompute_layers not in (0, self.num_layers):
        raise ValueError(
            f"TransformerPlanModel: a pipelined stack recomputes all its "
            f"layers or none; {structure.describe()!r} recomputes "
            f"{structure.recompute_layers} of {self.num_layers}.")
      if self.pipeline_batch % structure.micro_batches:
        raise ValueError(
            f"TransformerPlanModel: {structure.micro_batches} micro-batches "
            f"do not divide the batch of {self.pipeline_batch} sequences.")

  def settings(self, structure):
    """{gin binding key: value as a gin file writes it} that run
    `structure` in the binary (per stack scope)."""
    self._check(structure)
    settings = {}
    for s in self._stacks:
      p = s.prefix
      if structure.pipelined:
        recompute = structure.recompute_layers == self.num_layers
        settings[p + _STACK_CLS] = f"@{_PIPELINED}"
        settings[f"{p}{_PIPELINED}.num_stages"] = str(structure.stages)
        settings[f"{p}{_PIPELINED}.num_microbatches"] = str(
            structure.micro_batches)
        settings[f"{p}{_PIPELINED}.recompute_grads"] = str(recompute)
        if recompute:  # Not with recompute (PipelinedLayerStack says).
          settings[f"{p}{_PIPELINED}.batch_weight_gradients"] = "False"
        continue
      if s.cls is not layer_stack_lib.LayerStack:
        settings[p + _STACK_CLS] = f"@{_PLAIN}"
      k = min(structure.recompute_layers, s.num_layers)
      settings[f"{p}{_PLAIN}.recompute_grads"] = (
          "True" if k == s.num_layers else
          "False" if k == 0 else str(list(range(k))))
    return settings

  def build(self, structure, zero="none", mesh_shape=None,
            layout_rules=None):
    """(mtf.Graph, [loss]) of the training step in `structure` (see
    plan_space.PlanModel.build)."""
    return self._build(self.settings(structure), zero, mesh_shape,
                       layout_rules)

  def build_proxy(self, structure, zero="none", mesh_shape=None,
                  layout_rules=None):
    """The step with 3 blocks per run of like blocks of each stack (per
    stage when pipelined), the middle one weighted (see
    plan_space.PlanModel.build_proxy); None if no run is longer than 3."""
    settings = self.settings(structure)
    weights = {}
    shrunk = False
    for s in self._stacks:
      if s.num_layers % s.period:
        return None
      blocks = s.num_layers // s.period
      if structure.pipelined:
        per_stage = proxy_layers.runs([False] * (blocks // structure.stages))
        if per_stage is None:
          per_stage = [(False, 1)] * (blocks // structure.stages)
        else:
          shrunk = True
        settings[f"{s.prefix}transformer.make_layer_stack.num_layers"] = str(
            len(per_stage) * structure.stages)
        runs = per_stage
      else:
        k = min(structure.recompute_layers, s.num_layers)
        if k % s.period:
          return None
        kinds = [b < k // s.period for b in range(blocks)]
        runs = proxy_layers.runs(kinds)
        if runs is None:
          runs = [(kind, 1) for kind in kinds]
        else:
          shrunk = True
        recomputed = sum(kind for kind, _ in runs) * s.period
        settings[f"{s.prefix}transformer.make_layer_stack.num_layers"] = str(
            len(runs))
        settings[f"{s.prefix}{_PLAIN}.recompute_grads"] = (
            "True" if recomputed == len(runs) * s.period else
            "False" if recomputed == 0 else str(list(range(recomputed))))
      for j, (_, weight) in enumerate(runs):
        weights[f"{s.prefix}block_{j:03d}/"] = weight
    if not shrunk:
      return None
    graph, outputs = self._build(settings, zero, mesh_shape, layout_rules)
    return graph, outputs, weights

  def _build(self, settings, zero, mesh_shape, layout_rules):
    """(mtf.Graph, [loss]) of the training step under gin `settings`."""
    shard_weight_update, shard_parameters = plan_space.zero_flags(zero)
    if shard_weight_update and (mesh_shape is None or layout_rules is None):
      raise ValueError(
          f"TransformerPlanModel.build: zero={zero!r} shards over the mesh; "
          "give mesh_shape and layout_rules.")
    bindings = [f"{k} = {v}" for k, v in settings.items()]
    with self._gin.installed(bindings), _garbage_collection_paused():
      model_fn = run_model_fn.tpu_estimator_model_fn(
          model_type=self.model_type, transformer_model=self._build_model(),
          vocabulary=self._vocabulary, model_dir=None, use_tpu=False,
          mesh_shape=None, layout_rules=None, batch_size=self.batch_size,
          sequence_length=self.sequence_length, autostack=self._autostack,
          keep_checkpoint_max=None, save_checkpoints_steps=None,
          learning_rate_schedule=self._learning_rate_schedule,
          optimizer=self._optimizer, variable_filter=self._variable_filter,
          ensemble_inputs=self._ensemble_inputs)
      features = self.feature_values()
      graph, loss = model_fn.training_graph(
          features, mesh_shape=mesh_shape, layout_rules=layout_rules,
          shard_weight_update=shard_weight_update,
          shard_parameters=shard_parameters)
    return graph, [loss]

  def feature_values(self):
    """The training batch the graph is built on: zeros (the planner prices
    shapes only). A subclass that runs the graph and compares its losses
    gives tokens here."""
    return {k: tf.zeros(shape, tf.int32)
            for k, shape in self._feature_shapes.items()}

  @property
  def feature_shapes(self):
    """{feature name: [rows, length]} of the training batch."""
    return dict(self._feature_shapes)

  def _build_model(self):
    """The Transformer of the installed gin configuration."""
    return run_settings.build_model(
        model_type=self.model_type,
        input_vocab_size=run_settings.inputs_vocabulary(
            self._vocabulary).vocab_size,
        output_vocab_size=run_settings.targets_vocabulary(
            self._vocabulary).vocab_size)


@contextlib.contextmanager
def _garbage_collection_paused():
  """Python's cyclic garbage collector off for a graph build: a big model's
  build makes millions of objects and no garbage, and the collector's
  passes over them took about 40% of the build's CPU time (T5-11B)."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


def _layer_stacks(model, model_type):
  """The model's layer stacks, in STACK_SCOPES' order."""
  if model_type == "bitransformer":
    return [model.encoder.layer_stack, model.decoder.layer_stack]
  return [model.layer_stack]


def _sized(vocabulary):
  """`vocabulary` with ints (sizes) as stand-in vocabularies."""
  if isinstance(vocabulary, tuple):
    return tuple(_sized(v) for v in vocabulary)
  if isinstance(vocabulary, int):
    return _SizedVocabulary(vocabulary)
  if vocabulary is None:
    raise ValueError("TransformerPlanModel: give a vocabulary (or its "
                     "size).")
  return vocabulary


def _fixed_batch_size(sequence_length, batch_size):
  """utils.run.batch_size in sequences, if it does not depend on the
  layout."""
  method = batch_size[0] if isinstance(batch_size, (tuple, list)) else None
  if isinstance(method, str) and method.endswith("per_replica"):
    raise ValueError(
        f"TransformerPlanModel: utils.run.batch_size = {batch_size!r} "
        "depends on the layout (its replicas are what the plan decides); "
        "give the batch size in sequences (batch_size=...), or bind "
        "utils.run.batch_size to an int, ('sequences_per_batch', n) or "
        "('tokens_per_batch', n).")
  return run_auto_layout.fixed_batch_size(sequence_length, batch_size)
