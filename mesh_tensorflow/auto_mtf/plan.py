"""Plans a Transformer's run for a machine you may not have.

  python -m mesh_tensorflow.auto_mtf.plan \\
      --gin_file=transformer/gin/models/t5_11b.gin \\
      --num_processors=512 --memory_per_processor=16GiB \\
      --machine=tpu_v3_pod

builds the model's training graph from its gin files with abstract shapes
(no devices, no variables: nothing is allocated), searches the plan
(mtf.auto_mtf.plan: mesh shape, layout, sharding level, pipeline stages,
micro-batches, recompute) with the machine's constants (a JSON file of
mtf.auto_mtf.machine.MachineConstants, or the name of one this package
ships) and prints the plan table, or one paragraph when nothing fits.

This module is also callable: `mtf.auto_mtf.plan(...)` is planner.plan,
whether the name is bound to the function or to this module.
"""

import re
import sys
import types

from absl import app
from absl import flags
from absl import logging

from mesh_tensorflow.auto_mtf import planner

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10,
          "m": 10**6, "mb": 10**6, "mib": 2**20, "g": 10**9, "gb": 10**9,
          "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(text):
  """Bytes of "16GiB", "512 MiB", "1.5e10" or an int.

  Raises:
    ValueError: naming the text and the units understood.
  """
  if isinstance(text, int):
    return text
  match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*",
                       str(text))
  unit = match.group(2).lower() if match else None
  if not match or unit not in _UNITS:
    raise ValueError(
        f"memory {text!r} is not a size: give a number with an optional "
        f"unit, e.g. 16GiB, 512MiB, 1.5e10 (units: "
        f"{', '.join(u for u in _UNITS if u)}).")
  return int(float(match.group(1)) * _UNITS[unit])


def plan(*args, **kwargs):
  """mtf.auto_mtf.plan: see planner.plan."""
  return planner.plan(*args, **kwargs)


plan.__doc__ = planner.plan.__doc__


def _define_flags():
  flags.DEFINE_multi_string("gin_file", [], "gin files of the model.")
  flags.DEFINE_multi_string("gin_param", [], "extra gin bindings.")
  flags.DEFINE_integer("num_processors", None, "processors to plan for.")
  flags.DEFINE_string("memory_per_processor", None,
                      "memory budget per processor, e.g. 16GiB.")
  flags.DEFINE_string("machine", None,
                      "machine constants: a JSON file or a shipped name.")
  flags.DEFINE_integer("batch_size", None,
                       "sequences per batch (default: the gin's).")
  flags.DEFINE_integer("sequence_length", None,
                       "tokens per sequence (default: the gin's).")
  flags.DEFINE_integer("vocab_size", None,
                       "vocabulary size (default: the gin's vocabulary, or "
                       "its macro vocab_size).")
  flags.DEFINE_integer("max_mesh_shape_dimensions", 2,
                       "the most mesh dimensions besides 'stage'.")
  flags.DEFINE_bool("allow_uneven", False, "also plan padded splits.")


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.num_processors or not f.machine:
    raise app.UsageError("--num_processors and --machine are required.")
  if not f["verbosity"].present:
    # The library logs a line per variable it shards; the table is what
    # this command is for (-v 0 shows them).
    logging.set_verbosity(logging.WARNING)
  # pylint: disable=g-import-not-at-top
  # On use: importing the package (mtf.auto_mtf.plan) loads neither TF's
  # devices (machine) nor the Transformer (plan_gin).
  from mesh_tensorflow.auto_mtf import machine as machine_lib
  from mesh_tensorflow.transformer import plan_gin  # (the same)
  # pylint: enable=g-import-not-at-top
  budget = (parse_bytes(f.memory_per_processor)
            if f.memory_per_processor else None)
  model = plan_gin.from_gin(
      f.gin_file, f.gin_param, batch_size=f.batch_size,
      sequence_length=f.sequence_length, vocab_size=f.vocab_size)
  constants = machine_lib.machine_constants(_machine_path(f.machine))
  try:
    result = planner.plan(model, f.num_processors, memory_budget=budget,
                          machine=constants,
                          max_mesh_shape_dimensions=(
                              f.max_mesh_shape_dimensions),
                          allow_uneven=f.allow_uneven)
  except planner.PlanError as e:
    print(f"No plan: {e}", file=sys.stderr)
    return 1
  print(result.table())
  return 0


def _machine_path(name):
  """A shipped machine's file for its name, else the name as given."""
  # pylint: disable=g-import-not-at-top
  # On use, as in main.
  from mesh_tensorflow.auto_mtf import machine as machine_lib
  # pylint: enable=g-import-not-at-top
  shipped = getattr(machine_lib, "shipped_machine_path", None)
  if shipped is not None and re.fullmatch(r"[A-Za-z0-9_]+", name):
    try:
      return shipped(name)
    except ValueError:
      pass
  return name


class _CallableModule(types.ModuleType):
  """This module, callable as planner.plan (see the module doc)."""

  def __call__(self, *args, **kwargs):
    return planner.plan(*args, **kwargs)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
else:
  sys.modules[__name__].__class__ = _CallableModule
