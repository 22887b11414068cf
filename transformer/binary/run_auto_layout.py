"""`utils.run.layout_rules = "auto"`: the binary picks its layout at start-up.

With layout rules "auto" the run searches the layout rules of the given
mesh shape; with mesh shape "auto" too it takes the processor count from
the devices (run_devices.processor_count) and searches the mesh shapes of
that count as well (mtf.auto_mtf.api.choose_layout). The searched graph is
the training step's (model, loss, gradients, optimizer updates: the same
function builds both, run_model_fn's `training_graph`), in one microbatch,
also in the other modes, so that evaluation and inference use the layout
training would. Layers whose graph depends on the layout (the
mixture-of-experts group sizes) are searched as built without layout rules.

The choice is printed, bound in gin (`utils.run.mesh_shape`,
`utils.run.layout_rules`) and recorded in gin's operative config as the
values utils.run ran with, so a rerun with that config repeats it without
searching (utils.run resolves its settings once, see run_resolution). The
search's settings are gin parameters of `auto_layout` (objective,
memory_budget, machine, max_mesh_shape_dimensions, quick_calibration).
The time objective measures the machine once per mesh shape where nothing
is cached (see mtf.auto_mtf.machine.load_or_calibrate); a failed
measurement ends the run with one message saying how to measure it or do
without.
"""

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.binary import run_features
from mesh_tensorflow.transformer.binary import run_settings

_GIN_MODULE = "mesh_tensorflow.transformer.utils"
AUTO = "auto"


def is_auto(value):
  """Whether a mesh_shape or layout_rules value asks for the search."""
  return isinstance(value, str) and value.strip().lower() == AUTO


def wants_search(mesh_shape, layout_rules):
  """Whether the run must search its layout (layout_rules "auto").

  Raises:
    ValueError: mesh_shape "auto" with explicit layout rules.
  """
  if is_auto(mesh_shape) and not is_auto(layout_rules):
    raise ValueError(
        f'utils.run.mesh_shape = "auto" needs utils.run.layout_rules = '
        f'"auto" too (the mesh dimensions are named by the search, so '
        f"explicit rules cannot name them), got layout_rules "
        f"{layout_rules!r}. Give an explicit mesh shape, or let the search "
        "pick both.")
  return is_auto(layout_rules)


def fixed_batch_size(sequence_length, batch_size):
  """The batch size in sequences, which must not depend on the layout.

  Raises:
    ValueError: a per-replica batch size (the replicas are what the search
      decides).
  """
  if isinstance(batch_size, int):
    return batch_size
  method = batch_size[0] if isinstance(batch_size, (tuple, list)) else None
  if isinstance(method, str) and method.endswith("per_replica"):
    raise ValueError(
        f'utils.run.layout_rules = "auto" needs a batch size that does not '
        f"depend on the layout, got utils.run.batch_size = {batch_size!r} "
        "(its replicas are what the search decides). Give an integer or "
        "('sequences_per_batch', n) or ('tokens_per_batch', n).")
  return run_settings.compute_batch_size(sequence_length, None, None,
                                         batch_size)


@gin.configurable("auto_layout", module=_GIN_MODULE)
def search_settings(objective="time", memory_budget=None, machine=None,
                    max_mesh_shape_dimensions=2, quick_calibration=False):
  """The search's settings as gin gives them (`auto_layout.objective`,
  ...; see search_layout): the layout search's, and (but the objective)
  the run planner's (run_plan)."""
  return dict(objective=objective, memory_budget=memory_budget,
              machine=machine,
              max_mesh_shape_dimensions=max_mesh_shape_dimensions,
              quick_calibration=quick_calibration)


def search_layout(mtf_graph, mtf_outputs, mesh_shape_or_processor_count,
                  objective="time", memory_budget=None, machine=None,
                  max_mesh_shape_dimensions=2, shard_weight_update=False,
                  shard_parameters=False, quick_calibration=False,
                  allow_uneven=False):
  """The LayoutChoice of a graph (see mtf.auto_mtf.api.choose_layout).

  Args:
    mtf_graph: the training step's mtf.Graph.
    mtf_outputs: its outputs (the loss).
    mesh_shape_or_processor_count: an mtf.Shape (layouts of that mesh) or
      an int (mesh shapes of that many processors too).
    objective: "time" (least predicted step time within memory_budget) or
      "memory" (least peak memory per processor, the original's).
    memory_budget: optional bytes per processor the peak must fit in.
    machine: objective "time": the machine's constants (see
      mtf.auto_mtf.api.layout); None measures this machine once per mesh
      shape (about a minute; cached).
    max_mesh_shape_dimensions: the most mesh dimensions a searched mesh
      shape has.
    shard_weight_update, shard_parameters: the run's data-parallel sharding
      (utils.run's), counted in the memory of each layout.
    quick_calibration: measure the machine in seconds instead (rougher
      figures) where nothing is cached.
    allow_uneven: also consider splits that need padding
      (utils.run.allow_uneven_splits), priced with their padding.

  Returns:
    an mtf.auto_mtf.api.LayoutChoice.

  Raises:
    ValueError: the search or the machine's measurement failed (the
      binary reports it in one paragraph, as bad input), saying how to fix
      it.
  """
  # pylint: disable=g-import-not-at-top
  # Imported on use: a run with explicit rules does not load auto_mtf (and
  # importing the transformer adds no core module).
  from mesh_tensorflow.auto_mtf import api as auto_mtf_api
  from mesh_tensorflow.auto_mtf import calibration_subprocess  # (the same)
  from mesh_tensorflow.auto_mtf import layout_optimizer  # (the same)
  # pylint: enable=g-import-not-at-top
  try:
    return auto_mtf_api.choose_layout(
        mtf_graph, mesh_shape_or_processor_count, mtf_outputs,
        objective=objective, memory_budget=memory_budget, machine=machine,
        max_mesh_shape_dimensions=max_mesh_shape_dimensions,
        shard_weight_update=shard_weight_update,
        shard_parameters=shard_parameters,
        quick_calibration=quick_calibration, allow_uneven=allow_uneven)
  except calibration_subprocess.CalibrationError as e:
    raise ValueError(
        f'utils.run.layout_rules = "auto": the layout search (objective '
        f"{objective!r}) needs this machine's constants, and measuring them "
        f"failed: {e.reason}. To fix it, run `{e.command}` (it measures "
        "them once and caches them), or set auto_layout.objective = "
        "'memory', or give the machine's constants in "
        "auto_layout.machine (a JSON file of "
        "mtf.auto_mtf.machine.MachineConstants).") from e
  except (layout_optimizer.SolverError, ImportError) as e:
    # A ValueError: the binary reports it in one paragraph, as bad input.
    raise ValueError(
        f'utils.run.layout_rules = "auto": the layout search (objective '
        f"{objective!r}) failed: {e}") from e


def training_features(model_type, batch_size, sequence_length,
                      ensemble_inputs, train_dataset_fn=None,
                      vocabulary=None):
  """Zeros in place of a training batch: the features train_dataset_fn's
  examples have (when it is given), else those the model type needs, each
  [batch (times ensemble members), length]."""
  if train_dataset_fn is not None:
    dataset = train_dataset_fn(sequence_length=sequence_length,
                               vocabulary=vocabulary, dataset_split="train")
    keys = [k for k in dataset.element_spec
            if k in run_features.MODEL_FEATURES]
  else:
    keys = ["targets"] if model_type == "lm" else ["inputs", "targets"]
  rows = batch_size * (ensemble_inputs or 1)
  return {k: tf.zeros([rows, sequence_length[k.split("_")[0]]], tf.int32)
          for k in keys}


def choose(model_fn, mesh_shape_or_processor_count, features_fn,
           shard_weight_update=False, shard_parameters=False,
           allow_uneven=False):
  """Searches the layout of model_fn's training graph.

  Args:
    model_fn: a model function of run_model_fn.tpu_estimator_model_fn
      (its `training_graph` builds the graph searched).
    mesh_shape_or_processor_count: an mtf.Shape or a processor count.
    features_fn: () -> a dict of TF features (see training_features).
    shard_weight_update, shard_parameters: utils.run's data-parallel
      sharding (the search counts its memory).
    allow_uneven: utils.run.allow_uneven_splits (padded splits searched).

  Returns:
    an mtf.auto_mtf.api.LayoutChoice.
  """
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    mtf_graph, loss = model_fn.training_graph(features_fn())
  # Searched outside that graph: the search reads the mtf graph alone, and
  # the time objective's calibration (on a new machine) runs eagerly in
  # this process, unless the program is in tf.compat.v1 graph mode (then
  # it runs in a fresh process).
  return search_layout(mtf_graph, [loss], mesh_shape_or_processor_count,
                       shard_weight_update=shard_weight_update,
                       shard_parameters=shard_parameters,
                       allow_uneven=allow_uneven, **search_settings())


def mesh_shape_string(mesh_shape):
  """"name:size;..." of an mtf.Shape, as utils.run.mesh_shape takes it."""
  return ";".join(f"{d.name}:{d.size}" for d in mesh_shape.dims)


def report(choice):
  """Logs and prints the choice, one line: the predictions, then the gin
  bindings that repeat it."""
  line = (f"auto layout ({choice.objective}): {choice.describe()}; gin: "
          f"utils.run.mesh_shape = {mesh_shape_string(choice.mesh_shape)!r}"
          f" utils.run.layout_rules = {choice.layout_rules.to_string!r}")
  logging.info("%s", line)
  print(line, flush=True)
  return line


def bind_choice(choice):
  """Binds utils.run.mesh_shape and layout_rules to the choice (in the
  current gin scope) and records them in the operative config in place of
  the "auto" that utils.run was given, as if gin had given the choice."""
  scope = gin.current_scope_str()
  prefix = f"{scope}/" if scope else ""
  chosen = {"mesh_shape": mesh_shape_string(choice.mesh_shape),
            "layout_rules": choice.layout_rules.to_string}
  with gin.unlock_config():
    for name, value in chosen.items():
      gin.bind_parameter(f"{prefix}{_GIN_MODULE}.run.{name}", value)
  _record_operative(scope, f"{_GIN_MODULE}.run", chosen)


def _record_operative(scope, selector, values):
  """Records values as parameters configurable `selector` ran with in
  `scope`, as gin does when it supplies them to a call. gin has no public
  call for this: its operative config maps (scope, selector) to them."""
  # pylint: disable=protected-access
  with gin.config._OPERATIVE_CONFIG_LOCK:
    gin.config._OPERATIVE_CONFIG.setdefault((scope, selector), {}).update(
        values)
  # pylint: enable=protected-access


def mesh_shape_or_processor_count(mesh_shape, processor_count_fn):
  """The mesh shape to search on, or (mesh_shape "auto") the processor
  count processor_count_fn() gives."""
  if is_auto(mesh_shape):
    count = processor_count_fn()
    logging.info('mesh_shape "auto": %d processors', count)
    return count
  return mtf.convert_to_shape(mesh_shape)
