"""`utils.run.plan = "auto"`: the binary plans its run at start-up.

The run planner (mtf.auto_mtf.plan) searches together the mesh shape, the
layout rules, the weight-update sharding level (ZeRO) and the layer
stacks' structure (pipeline stages, micro-batches, recomputed layers) of
the run's own model (transformer.plan_model.TransformerPlanModel, built
from utils.run's arguments and gin), within `auto_layout.memory_budget`
bytes per processor (also `auto_layout.machine`, `quick_calibration` and
`max_mesh_shape_dimensions`; the objective is always the predicted step
time), for N processors (`planned_processors`):

- utils.run.mesh_shape "auto": the run's devices (run_devices.
  processor_count: mesh_devices, the TPU's cores, the GPUs, else the
  logical CPUs, one unless the CPU is split);
- an explicit mesh_shape: its processor count. The plan picks the shape
  of that many processors (e.g. 'batch:2;model:4' plans for 8, perhaps as
  'stage:2;mesh_0:4'); on a machine without accelerators the binary splits
  the CPU into that many logical devices before TensorFlow starts.

The plan picks the layout rules, so utils.run.layout_rules must be "auto"
(explicit rules with a plan are an error: the plan would discard them).

The plan's table is printed. Its choices are bound in gin, the layer
stacks' bindings for the model built next, and recorded in gin's
operative config as the values utils.run ran with (utils.run.plan None,
the chosen mesh_shape, layout_rules, shard_weight_update and
shard_parameters), so a rerun with that config repeats the plan without
planning.
"""

from absl import logging
import gin

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.binary import run_auto_layout
from mesh_tensorflow.transformer.binary import run_devices

_RUN = f"{run_auto_layout._GIN_MODULE}.run"  # pylint: disable=protected-access
# The plan's settings that are utils.run's arguments (not stack bindings).
_RUN_SETTINGS = ("mesh_shape", "layout_rules", "shard_weight_update",
                 "shard_parameters")


def wants_plan(plan, mesh_shape, layout_rules):
  """Whether the run must plan itself (utils.run.plan "auto").

  Raises:
    ValueError: a plan other than None or "auto", or "auto" with explicit
      layout rules (the plan picks them; an explicit mesh shape only says
      how many processors to plan for).
  """
  del mesh_shape  # "auto" or a processor count (planned_processors).
  if plan is None:
    return False
  if not run_auto_layout.is_auto(plan):
    raise ValueError(f"utils.run.plan must be None or 'auto', got {plan!r}.")
  if not run_auto_layout.is_auto(layout_rules):
    raise ValueError(
        f"utils.run.plan = 'auto' picks the layout rules, but the run gives "
        f"utils.run.layout_rules = {_text(layout_rules)!r} (defaults.gin "
        "gives some): set utils.run.layout_rules = 'auto' with the plan, or "
        "drop utils.run.plan to run with those rules. (utils.run.mesh_shape "
        "may stay: the plan takes its processor count and picks the shape "
        "of that many.)")
  return True


def planned_processors(mesh_shape, mesh_devices=None, cluster=None):
  """N, the processors a plan is for: an explicit mesh shape's count, else
  the devices' (run_devices.processor_count).

  Raises:
    ValueError: mesh_devices listing another number of devices than the
      explicit mesh shape has processors.
  """
  if run_auto_layout.is_auto(mesh_shape):
    return run_devices.processor_count(mesh_devices, cluster)
  size = mtf.convert_to_shape(mesh_shape).size
  if mesh_devices and any(mesh_devices) and len(mesh_devices) != size:
    raise ValueError(
        f"utils.run.plan = 'auto' plans for the processors of "
        f"utils.run.mesh_shape = {_text(mesh_shape)!r} ({size}), but "
        f"utils.run.mesh_devices lists {len(mesh_devices)}: give one of "
        "them (mesh_shape 'auto' plans for the listed devices).")
  return size


def _text(value):
  """A mesh shape or layout rules as gin would give it."""
  if isinstance(value, mtf.Shape):
    return run_auto_layout.mesh_shape_string(value)
  if isinstance(value, mtf.LayoutRules):
    return value.to_string
  return value


def plan_run(arguments, cluster=None):
  """Plans the run of utils.run's arguments (a dict name -> value), prints
  the plan's table and binds and records its choices (see the module).

  Returns:
    the mtf.auto_mtf.planner.Plan.

  Raises:
    ValueError: no plan fits the budget (one paragraph: the smallest peak
      and the choices that reach it), or the planner cannot run, saying
      why.
  """
  # pylint: disable=g-import-not-at-top
  # Imported on use, as run_auto_layout's search: a run that does not plan
  # loads neither the planner nor the plan model.
  from mesh_tensorflow.auto_mtf import calibration_subprocess  # (on use)
  from mesh_tensorflow.auto_mtf import layout_optimizer  # (on use)
  from mesh_tensorflow.auto_mtf import planner  # (on use)
  from mesh_tensorflow.transformer import plan_model  # (on use)
  # pylint: enable=g-import-not-at-top
  a = arguments
  if a["optimizer"] is None:
    raise ValueError("utils.run.plan = 'auto' plans the training graph, in "
                     "every mode: it needs utils.run.optimizer.")
  num_processors = planned_processors(a["mesh_shape"], a["mesh_devices"],
                                      cluster)
  if num_processors == 1 and run_auto_layout.is_auto(a["mesh_shape"]):
    logging.warning(
        "utils.run.plan = 'auto' plans for 1 processor: the run has one "
        "device. To plan for N logical CPUs of this machine, give "
        "utils.run.mesh_shape a shape of N processors (e.g. 'all:8').")
  settings = run_auto_layout.search_settings()
  budget = settings["memory_budget"]
  asked = (f"utils.run.plan = 'auto' on {num_processors} processors with "
           f"auto_layout.memory_budget = {budget!r}")
  model = plan_model.TransformerPlanModel.from_run_arguments(a)
  try:
    chosen = planner.plan(
        model, num_processors, memory_budget=budget,
        machine=settings["machine"],
        max_mesh_shape_dimensions=settings["max_mesh_shape_dimensions"],
        allow_uneven=a["allow_uneven_splits"],
        quick_calibration=settings["quick_calibration"])
  except planner.PlanError as e:
    raise ValueError(f"{asked}: {e}") from e
  except calibration_subprocess.CalibrationError as e:
    raise ValueError(
        f"{asked}: the planner needs this machine's constants, and "
        f"measuring them failed: {e.reason}. To fix it, run `{e.command}` "
        "(it measures them once and caches them), or give the machine's "
        "constants in auto_layout.machine (a JSON file of "
        "mtf.auto_mtf.machine.MachineConstants).") from e
  except (layout_optimizer.SolverError, ImportError) as e:
    raise ValueError(f"{asked}: the planner failed: {e}") from e
  table = chosen.table()
  logging.info("%s", table)
  print(table, flush=True)
  bind_plan(chosen)
  return chosen


def run_values(plan):
  """utils.run's arguments the plan sets: {name: value as gin gives it}."""
  return {"mesh_shape": run_auto_layout.mesh_shape_string(plan.mesh_shape),
          "layout_rules": plan.layout_rules.to_string,
          "shard_weight_update": plan.zero != "none",
          "shard_parameters": plan.zero == "parameters"}


def stack_bindings(plan):
  """The plan's other settings: gin binding lines (the layer stacks')."""
  lines = []
  for key, value in plan.settings.items():
    selector, _, name = key.rpartition(".")
    if name in _RUN_SETTINGS and selector in ("", "run", "utils.run", _RUN):
      continue  # utils.run's own (run_values).
    text = value if isinstance(value, str) else repr(value)
    lines.append(f"{key} = {text}")
  return lines


def bind_plan(plan):
  """Binds the plan in the current gin scope: the layer stacks' bindings
  (read when the model is built, and so recorded as operative), and
  utils.run's values, recorded in the operative config in place of the
  "auto" (and plan) that utils.run was given."""
  scope = gin.current_scope_str()
  prefix = f"{scope}/" if scope else ""
  values = run_values(plan)
  with gin.unlock_config():
    gin.parse_config([prefix + line for line in stack_bindings(plan)])
    for name, value in dict(values, plan=None).items():
      gin.bind_parameter(f"{prefix}{_RUN}.{name}", value)
  run_auto_layout._record_operative(  # pylint: disable=protected-access
      scope, _RUN, dict(values, plan=None))
  logging.info("plan: utils.run %s; gin %s", values, stack_bindings(plan))

