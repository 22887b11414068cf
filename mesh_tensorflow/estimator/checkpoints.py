"""Checkpoints of an estimator run: the mesh's variables and the global step.

Checkpoints are written as the original library wrote them (a TF1
`tf.compat.v1.train.Saver` of its master variables), so the original, T5's
tools and converters that call `tf.train.load_variable` read them: one key
per mtf variable, its mtf name (e.g. "decoder/block_000/layer_000/
SelfAttention/k", optimizer slots such as "..._slot_vc" included), holding
the whole value in the variable's master dtype, and the int64 step under
"global_step". If asked, the training input iterator's position is saved
under "input_pipeline" too. Each processor writes only the distinct blocks
it holds (TF's sliced-tensor format), so no device assembles a whole
value, and any mesh and layout reads them back.

TensorFlow writes a checkpoint's files into "<prefix>_temp/" and renames
them into place, then the "checkpoint" state file is rewritten, itself
atomically (temp file, rename), listing only the checkpoints kept; old ones
are deleted after that. (tf.train.CheckpointManager still lists them while
it deletes them, so a process killed while pruning leaves listed
checkpoints without files.) So a process killed while saving leaves at
worst a temp directory or files of a checkpoint the state file does not
list: every listed checkpoint is complete, and `remove_partial_checkpoints`
deletes the leftovers before training resumes.

`Checkpointer.restore` reads name-based checkpoints (ours, the original's,
T5's published ones, often bfloat16): each mtf variable they name is
filled, cast to the variable's master dtype, when the lowering creates it
(checkpointing.ValueRestore), and the step at once. It also reads the
object-based checkpoints (a `tf.train.Checkpoint` of the mesh
implementation under "model" and the step under "global_step") that
earlier versions of this project wrote, with a notice; some of those also
hold an mtf variable "global_step" (under "model/"), which optimizers with
schedules used to create: it is ignored, and a checkpoint holding only that
one gives the estimator's step its value. `Checkpointer.warm_start` fills
the variables from a checkpoint of either kind outside model_dir,
optionally only those a regex matches (the original's init_checkpoint).
Variables the checkpoint lacks keep their initial values;
`after_first_trace` names them in one warning.
"""

import glob
import os
import re

from absl import logging
import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.checkpoint import functional_saver  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import device_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.training.saving import saveable_object_util  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow.storage import checkpointing
from mesh_tensorflow import simd_mesh_impl

CHECKPOINT_NAME = "model.ckpt"
INPUT_PIPELINE = "input_pipeline"
GLOBAL_STEP_KEY = "global_step/.ATTRIBUTES/VARIABLE_VALUE"
_MTF_GLOBAL_STEP_KEY = "model/global_step/.ATTRIBUTES/VARIABLE_VALUE"
NAME_BASED_GLOBAL_STEP_KEY = "global_step"
# Keys of a name-based checkpoint that are not mtf variables.
NON_VARIABLE_KEYS = (NAME_BASED_GLOBAL_STEP_KEY, INPUT_PIPELINE)
# The key of a tf.data iterator's serialized state in its saveables.
_ITERATOR_STATE = "_STATE"
# Variables of ours the original's checkpoints never hold (not reported).
_INTERNAL_VARIABLES = frozenset([simd_mesh_impl.RANDOM_STEP])
_NUMBERED = re.compile(re.escape(CHECKPOINT_NAME) + r"-(\d+)(_temp)?(\..*)?$")


def latest_checkpoint(model_dir):
  """The newest complete checkpoint in `model_dir`, or None."""
  if not model_dir or not tf.io.gfile.exists(model_dir):
    return None
  return tf.train.latest_checkpoint(model_dir)


def open_checkpoint(path, what="checkpoint"):
  """tf.train.load_checkpoint(path); ValueError naming `path` if unreadable.

  `path` is a checkpoint prefix or a directory (its latest checkpoint).
  """
  try:
    return tf.train.load_checkpoint(path)
  except (tf.errors.OpError, ValueError) as e:
    message = getattr(e, "message", str(e))
    raise ValueError(f"Could not read {what} {path!r}: not a checkpoint "
                     f"prefix or a directory holding one. TensorFlow said: "
                     f"{message}") from e


def resolve_checkpoint(path):
  """A checkpoint prefix: `path` itself, or a directory's latest one."""
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is not None:
      return latest
  return path


def step_key(reader):
  """The key of the global step in a checkpoint, or None."""
  for key in (GLOBAL_STEP_KEY, NAME_BASED_GLOBAL_STEP_KEY,
              _MTF_GLOBAL_STEP_KEY):
    if reader.has_tensor(key):
      return key
  return None


def listed_checkpoints(model_dir):
  """Checkpoint prefixes the state file lists (oldest first)."""
  state = tf.train.get_checkpoint_state(model_dir)
  if state is None:
    return []
  return list(state.all_model_checkpoint_paths)


def remove_partial_checkpoints(model_dir):
  """Deletes temp directories and files of checkpoints the state file does
  not list (left by a process killed while saving)."""
  listed = {os.path.basename(p) for p in listed_checkpoints(model_dir)}
  for path in glob.glob(os.path.join(model_dir, CHECKPOINT_NAME + "-*")):
    match = _NUMBERED.match(os.path.basename(path))
    if match is None:
      continue
    prefix = f"{CHECKPOINT_NAME}-{match.group(1)}"
    if match.group(2) or prefix not in listed:
      logging.warning("Removing partial checkpoint file %s", path)
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)


class Checkpointer:
  """Restores and saves (mesh implementation, global step) in model_dir.

  Writes the original's name-based checkpoints (see the module docstring).
  Eager (`session` None): variables created after `restore` are filled as
  the lowering creates them. Compat graph mode: made in the run's tf.Graph
  once the model is built, with the run's `session`, in which restoring
  and saving run; the keys and files are the same as eager, so either mode
  resumes the other's checkpoints.
  """

  def __init__(self, model_dir, mesh_impl, global_step, max_to_keep=5,
               session=None):
    self._session = session
    self._root = mesh_impl.variable_store.checkpoint_root()
    self._global_step = global_step
    self._model_dir = model_dir
    self._max_to_keep = max_to_keep
    self._mesh_impl = mesh_impl
    self._cleaned = False
    self._iterator = None  # the input pipeline's, when tracked
    self._checkpoint = None  # tf.train.Checkpoint of an object-based restore
    self._status = None  # of an object-based restore
    self._values = None  # ValueRestore of a name-based restore / warm start
    self._reported = False
    self._graph_save = None  # compat graph mode: (keys, prefix feed, op)

  def restore(self, path=None):
    """Restores `path` (default: the latest checkpoint); returns the path
    restored or None.

    Reads name-based checkpoints (ours and the original's) and the
    object-based ones earlier versions of this project wrote. mtf
    variables are filled as the lowering creates them; the global step at
    once.
    """
    path = path or latest_checkpoint(self._model_dir)
    if path is None:
      return None
    reader = open_checkpoint(path)
    if checkpointing.is_name_based(reader):
      self._restore_values(path, reader)
      logging.info("Restoring checkpoint %s", path)
      return path
    _notice_object_based(path)
    self._checkpoint = tf.train.Checkpoint(model=self._root,
                                           global_step=self._global_step)
    self._status = self._checkpoint.restore(path)
    self._status.expect_partial()
    if self._session is not None:
      self._status.run_restore_ops(self._session)
    if not reader.has_tensor(GLOBAL_STEP_KEY) and reader.has_tensor(
        _MTF_GLOBAL_STEP_KEY):
      step = int(reader.get_tensor(_MTF_GLOBAL_STEP_KEY))
      logging.warning("Checkpoint %s holds the step only as the mtf "
                      "variable 'global_step' of an earlier version: "
                      "resuming at step %d.", path, step)
      self._set_step(step)
    logging.info("Restored checkpoint %s", path)
    return path

  def warm_start(self, path, variable_filter=None):
    """Starts from another run's checkpoint (the original's init_checkpoint).

    Args:
      path: a checkpoint prefix, or a directory (its latest checkpoint), of
        either format.
      variable_filter: optional regex; only variables whose mtf names it
        matches (re.search) are loaded, "global_step" included.

    Returns:
      the checkpoint prefix read.

    Raises:
      ValueError: `path` cannot be read as a checkpoint.
    """
    prefix = resolve_checkpoint(path)
    reader = open_checkpoint(prefix, what="init_checkpoint")
    wanted = None
    if variable_filter:
      pattern = re.compile(variable_filter)
      wanted = lambda name: pattern.search(name) is not None
    self._restore_values(prefix, reader, wanted)
    logging.info("Warm-starting from %s%s", prefix,
                 f" (variables matching {variable_filter!r})"
                 if variable_filter else "")
    return prefix

  def _restore_values(self, path, reader, wanted=None):
    """Fills the mtf variables and the step from whole values by name."""
    keys = checkpointing.variable_keys(reader)
    for key in NON_VARIABLE_KEYS:
      keys.pop(key, None)
    self._values = checkpointing.ValueRestore(path, reader, keys, wanted)
    self._values.attach(self._root)
    if self._session is not None and self._values.graph_ops:
      self._session.run(self._values.graph_ops,
                        feed_dict=self._values.feed_dict)
    key = step_key(reader)
    if key is not None and (wanted is None or wanted("global_step")):
      self._set_step(int(reader.get_tensor(key)))

  def _set_step(self, step):
    if self._session is None:
      self._global_step.assign(step)
      return
    value = tf.compat.v1.placeholder(tf.int64, [])
    self._session.run(self._global_step.assign(value, read_value=False),
                      feed_dict={value: step})

  def after_first_trace(self, strict=False):
    """Reports, once, what the first lowering left unrestored.

    A name-based restore or warm start names, in one warning, the
    variables the checkpoint did not hold (they keep their initial
    values). With `strict`, an object-based restore (a checkpoint of an
    earlier version) raises if an existing variable was not in it.
    """
    if self._reported:
      return
    self._reported = True
    if self._status is not None and strict:
      try:
        self._status.assert_existing_objects_matched()
      except AssertionError as e:
        if not _only_internal_unmatched(str(e)):
          raise
    if self._values is None:
      return
    missing = sorted(n for n in self._values.missing
                     if n not in _INTERNAL_VARIABLES)
    if missing:
      logging.warning("%d variable(s) not in checkpoint %s keep their "
                      "initial values: %s", len(missing),
                      self._values.path, ", ".join(missing))
    logging.info("Restored %d variable(s) from %s",
                 len(self._values.restored), self._values.path)

  def track_input_pipeline(self, iterator, restored_path):
    """Saves `iterator`'s position from now on (eager only).

    If `restore` restored a checkpoint (`restored_path`) that holds a
    position, the iterator is moved there.
    """
    if restored_path is not None:
      reader = tf.train.load_checkpoint(restored_path)
      keys = reader.get_variable_to_shape_map()
      if self._checkpoint is not None:  # an object-based checkpoint
        held = any(k.startswith(INPUT_PIPELINE + "/") for k in keys)
      else:
        held = INPUT_PIPELINE in keys
      if not held:
        logging.warning("Checkpoint %s holds no input pipeline position: "
                        "input_fn starts from its beginning.", restored_path)
      try:
        if self._checkpoint is not None:
          # Restored at once: restoration of objects attached late.
          setattr(self._checkpoint, INPUT_PIPELINE, iterator)
        elif held:
          _restore_iterator(iterator, restored_path)
      except tf.errors.OpError as e:
        raise ValueError(
            "Could not restore the input pipeline position saved in "
            f"{restored_path}: input_fn must build the same dataset as the "
            "run that saved it (or set RunConfig "
            f"checkpoint_input_pipeline=False). TensorFlow said: "
            f"{e.message}") from e
    self._iterator = iterator

  def _save_specs(self):
    """{checkpoint key: {slice spec: SaveSpec}} of everything saved."""
    specs = checkpointing.save_specs(self._root)
    for key in NON_VARIABLE_KEYS:
      if key in specs:
        raise ValueError(
            f"The model has an mtf variable named {key!r}, the checkpoint "
            "key of the estimator's own state; rename the variable.")
    step = self._global_step
    specs[NAME_BASED_GLOBAL_STEP_KEY] = {"": saveable_object.SaveSpec(
        step.read_value, "", NAME_BASED_GLOBAL_STEP_KEY, dtype=tf.int64,
        device=_host(step.device))}
    if self._iterator is not None:
      iterator = self._iterator
      specs[INPUT_PIPELINE] = {"": saveable_object.SaveSpec(
          lambda: iterator._serialize_to_tensors()[_ITERATOR_STATE],  # pylint: disable=protected-access
          "", INPUT_PIPELINE, dtype=tf.variant, device="/cpu:0")}
    if self._session is None:
      # One spelling per host ("cpu:1" is "/job:localhost/.../CPU:1"), so
      # that TF sees one host and saves without tracing a function.
      for blocks in specs.values():
        for spec in blocks.values():
          spec.device = device_util.canonicalize(spec.device)
    return specs

  def _write(self, prefix):
    """Writes the checkpoint files of `prefix` (TF writes them into
    "<prefix>_temp/" and renames them into place)."""
    specs = self._save_specs()
    if self._session is None:
      functional_saver.MultiDeviceSaver({None: specs}).save(prefix)
      return
    keys = sorted(specs)
    if self._graph_save is None or self._graph_save[0] != keys:
      with self._session.graph.as_default():
        feed = tf.compat.v1.placeholder(tf.string, [])
        op = functional_saver.MultiDeviceSaver({None: specs}).save(feed)
      self._graph_save = (keys, feed, op)
    _, feed, op = self._graph_save
    self._session.run(op, feed_dict={feed: prefix})

  def save(self, step):
    """Writes the checkpoint of `step`, lists it, prunes old ones; returns
    its path.

    The state file is rewritten (atomically) before any old checkpoint is
    deleted and lists only the ones kept, so every checkpoint it lists is
    complete even if the process dies while pruning.
    """
    if not self._cleaned:
      tf.io.gfile.makedirs(self._model_dir)
      remove_partial_checkpoints(self._model_dir)
      self._cleaned = True
    path = os.path.join(self._model_dir, f"{CHECKPOINT_NAME}-{step}")
    try:
      self._write(path)
    except tf.errors.FailedPreconditionError as e:
      remove_partial_checkpoints(self._model_dir)
      if self._iterator is None:
        raise
      raise ValueError(
          "RunConfig checkpoint_input_pipeline=True, but the input "
          "pipeline cannot be checkpointed (a Python generator or "
          "py_function in the dataset?); build it from serializable ops or "
          f"turn the option off. TensorFlow said: {e.message}") from e
    name = os.path.basename(path)
    # Paths relative to model_dir, so the directory can be moved.
    kept = [os.path.basename(p) for p in listed_checkpoints(self._model_dir)]
    kept = [p for p in kept if p != name] + [name]
    dropped = kept[:-self._max_to_keep] if self._max_to_keep else []
    kept = kept[len(dropped):]
    # The function behind tf.compat.v1.train.update_checkpoint_state,
    # without its deprecation warning on every save.
    checkpoint_management.update_checkpoint_state_internal(
        _state_dir(self._model_dir), name, all_model_checkpoint_paths=kept)
    for old in dropped:
      old_prefix = os.path.join(self._model_dir, old)
      for old_file in tf.io.gfile.glob(old_prefix + ".*"):
        tf.io.gfile.remove(old_file)
    logging.info("Saved checkpoint for step %d: %s", step, path)
    return path


def _host(device):
  """The CPU of the host of `device` (a device string, maybe empty)."""
  return saveable_object_util.set_cpu0(device or "/cpu:0")


def _restore_iterator(iterator, path):
  """Moves `iterator` to the position saved in checkpoint `path`."""
  with tf.device("/cpu:0"):
    state, = tf.raw_ops.RestoreV2(prefix=path, tensor_names=[INPUT_PIPELINE],
                                  shape_and_slices=[""], dtypes=[tf.variant])
  iterator._restore_from_tensors({_ITERATOR_STATE: state})  # pylint: disable=protected-access


_NOTIFIED = set()


def _notice_object_based(path):
  """Says once per checkpoint that it is in the earlier, object-based form."""
  if path in _NOTIFIED:
    return
  _NOTIFIED.add(path)
  logging.warning(
      "Checkpoint %s is in the object-based form earlier versions of this "
      "project wrote (keys 'model/<name>/.ATTRIBUTES/VARIABLE_VALUE'); it "
      "restores, and new checkpoints are written under the original's "
      "names.", path)


def _state_dir(model_dir):
  """model_dir made absolute if it is a relative local path: given a
  relative directory, TF rewrites the listed names relative to it as if
  they were relative to the working directory ("../model.ckpt-5"), and
  the checkpoints are then never found."""
  if "://" in model_dir or os.path.isabs(model_dir):
    return model_dir
  return os.path.abspath(model_dir)


def _only_internal_unmatched(message):
  """Whether an assert_existing_objects_matched failure lists only internal
  variables (e.g. the sampling counter, which a checkpoint of a model
  trained without randomness lacks; it starts at 0)."""
  count = re.search(r"Found (\d+) Python objects", message)
  names = re.findall(r"<tf\.Variable '([^':]+)", message)
  return bool(count and names and int(count.group(1)) == len(names) and
              all(name in _INTERNAL_VARIABLES for name in names))
