"""The Transformer's plan model from gin files, for planning a machine you
do not have (`python -m mesh_tensorflow.auto_mtf.plan`).

Apart from plan_model because it reads utils.run's defaults and gin
lookup, and utils imports the binary, which plans with plan_model.

Example:
  model = plan_gin.from_gin(["models/bi_base.gin"], batch_size=128,
                            sequence_length=512, vocab_size=32128)
  plan = mtf.auto_mtf.plan(model, 8)
"""

import inspect

from mesh_tensorflow.transformer import plan_model
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer.binary import gin_state as gin_state_lib

# The utils.run arguments a plan model is made of.
_RUN_ARGUMENTS = ("model_type", "sequence_length", "batch_size",
                  "optimizer", "learning_rate_schedule", "train_steps",
                  "total_run_steps", "ensemble_inputs", "autostack",
                  "variable_filter")


def from_gin(gin_files, gin_params=(), batch_size=None, sequence_length=None,
             vocab_size=None):
  """The TransformerPlanModel of gin files and bindings, as the binary
  would parse them (defaults.gin first; files looked up as given, then
  among the shipped ones), without devices, data or TF variables: the
  features are those the model type needs, and the vocabulary is
  utils.run's if it can be built, else `vocab_size` or the gin macro
  `vocab_size`.

  Gin's own configuration is left as it was.

  Args:
    gin_files: gin file names or paths.
    gin_params: gin binding lines.
    batch_size: sequences per batch (default utils.run.batch_size, if it
      does not depend on the layout).
    sequence_length: an int or a dict (default utils.run's).
    vocab_size: the vocabulary's size, in place of utils.run.vocabulary.
  """
  folders = [utils.gin_dir()]
  files = [utils.find_gin_file("defaults.gin", folders)] + [
      utils.find_gin_file(name, folders) for name in gin_files]
  state = gin_state_lib.GinState.parse(files, gin_params,
                                       search_paths=folders)
  defaults = {name: p.default for name, p in
              inspect.signature(utils.run).parameters.items()}
  arguments = {name: state.query(f"utils.run.{name}", defaults[name])
               for name in _RUN_ARGUMENTS}
  if vocab_size is None:
    arguments["vocabulary"] = _gin_vocabulary(state)
  else:
    arguments["vocabulary"] = vocab_size
  if sequence_length is None and not isinstance(
      arguments["sequence_length"], (int, dict)):
    raise ValueError("plan_gin.from_gin: give sequence_length "
                     "(utils.run.sequence_length is not bound).")
  return plan_model.TransformerPlanModel.from_run_arguments(
      arguments, batch_size, sequence_length, gin_state=state)


def _gin_vocabulary(state):
  """utils.run.vocabulary of a GinState, else the macro vocab_size."""
  error = None
  try:
    vocabulary = state.query("utils.run.vocabulary")
  except Exception as e:  # pylint: disable=broad-except
    # E.g. a SentencePiece model that is not on this machine.
    vocabulary, error = None, e
  if vocabulary is not None:
    return vocabulary
  size = state.query("vocab_size/gin.macro.value")
  if size is None:
    raise ValueError(
        "plan_gin.from_gin: no vocabulary: utils.run.vocabulary "
        + (f"failed ({error}) " if error else "is not bound ")
        + "and there is no gin macro vocab_size; give vocab_size.")
  return size
