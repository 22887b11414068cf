r"""The Transformer's command-line binary: train, evaluate, decode, export.

    python -m mesh_tensorflow.transformer.main \
      --model_dir=/tmp/addition \
      --gin_file=models/tiny.gin --gin_file=problems/addition.gin \
      --gin_param="utils.run.mesh_shape = 'batch:2;model:4'" \
      --gin_param="utils.run.mode = 'train'"

Gin files are looked up as given, then under --gin_location_prefix, then in
the shipped gin folder (models/, layouts/, problems/). The binary writes its
command line to <model_dir>/command (command.1, ... for later runs) and, when
training, the operative gin config to <model_dir>/operative_config.gin. On a
machine without GPUs it splits the CPU into as many logical devices as the
mesh has processors. Bad input (a missing gin file, an unknown gin
parameter, a mesh that does not divide a dimension, an unreadable
checkpoint) ends with a one-paragraph message and exit status 1;
--show_traceback shows the Python traceback too.

On several machines run the same command on each, with --worker_hosts
(every task's host:port) and its own --task_index: task 0 trains on the
devices of all tasks, the others serve theirs (see mesh_tensorflow.cluster).
"""

import contextlib
import os
import shlex
import sys

from absl import app
from absl import flags
import gin

import mesh_tensorflow as mtf
from mesh_tensorflow import cluster as cluster_lib
from mesh_tensorflow.transformer.binary import config_errors
from mesh_tensorflow.transformer.binary import progress
from mesh_tensorflow.transformer.binary import run_devices
from mesh_tensorflow.transformer import utils

flags.DEFINE_string("model_dir", "/tmp/transformer_standalone",
                    "The run's directory: checkpoints, summaries, config.")
flags.DEFINE_string("tpu", None, "The Cloud TPU to use (default: none, run "
                    "on this machine's CPUs/GPUs).")
# --gcp_project, --tpu_zone and --show_traceback mean the same in the BERT
# binaries (mesh_tensorflow.bert), which define them too: a process
# importing both (a test run, the wheel's import check) defines them once.
if "gcp_project" not in flags.FLAGS:
  flags.DEFINE_string("gcp_project", None, "The GCP project of the TPU.")
if "tpu_zone" not in flags.FLAGS:
  flags.DEFINE_string("tpu_zone", None, "The GCE zone of the TPU.")
flags.DEFINE_string("tpu_job_name", None, "The TPU worker job's name.")
flags.DEFINE_multi_string("module_import", None, "Modules to import first "
                          "(e.g. ones registering TFDS datasets or gin "
                          "configurables).")
if "show_traceback" not in flags.FLAGS:
  flags.DEFINE_boolean("show_traceback", False, "On an error, also print "
                       "the Python traceback.")
flags.DEFINE_string("worker_hosts", None, "Comma-separated host:port of "
                    "every task of a TensorFlow cluster to train on "
                    "(default: this process alone).")
flags.DEFINE_integer("task_index", 0, "This task's index in --worker_hosts: "
                     "0 trains, the others serve their devices.")
flags.DEFINE_boolean("progress", True, "Show a progress line while "
                     "training.")
FLAGS = flags.FLAGS


def _command_file(model_dir):
  """The first free of <model_dir>/command, command.1, command.2, ..."""
  path = os.path.join(model_dir, "command")
  n = 0
  while os.path.exists(path if n == 0 else f"{path}.{n}"):
    n += 1
  return path if n == 0 else f"{path}.{n}"


# The flags a command line records, in this order.
_RECORDED_FLAGS = ("model_dir", "tpu", "gcp_project", "tpu_zone",
                   "tpu_job_name", "module_import", "gin_location_prefix",
                   "gin_file", "gin_param")


def command_line():
  """A shell command that repeats this run (the flags given to it)."""
  words = [sys.executable, "-m", "mesh_tensorflow.transformer.main"]
  for name in _RECORDED_FLAGS:
    flag = FLAGS[name]
    if not flag.present:
      continue
    values = flag.value if isinstance(flag.value, list) else [flag.value]
    if name == "gin_location_prefix":
      values = [",".join(values)]
    words += [shlex.quote(f"--{name}={v}") for v in values]
  return " ".join(words)


def _write_command(model_dir):
  os.makedirs(model_dir, exist_ok=True)
  with open(_command_file(model_dir), "w") as f:
    f.write(command_line() + "\n")


def _mesh_size():
  """The processor count of utils.run.mesh_shape, if gin gives it plainly."""
  try:
    shape = gin.query_parameter("utils.run.mesh_shape")
  except ValueError:
    return None
  if isinstance(shape, str) and shape.strip().lower() == "auto":
    return None  # The devices decide (utils.run searches the layout).
  if isinstance(shape, (str, mtf.Shape, list)):
    return mtf.convert_to_shape(shape).size
  return None


def _split_cpu_early():
  """Splits the CPU for the mesh before anything starts TensorFlow's
  devices (utils.run checks again, for meshes gin computes). With
  utils.run.plan = 'auto' an explicit mesh shape's processor count is what
  the plan is for (run_plan.planned_processors): as many logical CPUs."""
  if FLAGS.tpu:
    return
  size = _mesh_size()
  if size:
    run_devices.ensure_local_devices(size)


def _is_serving_task():
  if not FLAGS.worker_hosts:
    return False
  return not cluster_lib.ClusterSpec.from_worker_hosts(
      FLAGS.worker_hosts, FLAGS.task_index).is_chief


def _start_cluster():
  """With --worker_hosts: the chief's connected Cluster (other tasks serve
  here and never return); else None."""
  if not FLAGS.worker_hosts:
    return None
  size = _mesh_size()
  if size is None:
    raise ValueError("--worker_hosts needs utils.run.mesh_shape given as a "
                     "string in gin, e.g. 'batch:2;model:4' (not 'auto'; "
                     "layout_rules 'auto' searches the rules of that "
                     "mesh).")
  return cluster_lib.start(FLAGS.worker_hosts, FLAGS.task_index,
                           num_processors=size)


def error_message(exc):
  """One paragraph saying what went wrong, without TF/gin call stacks."""
  return config_errors.describe(exc, (cluster_lib.ClusterError,))


def main(_):
  """Parses gin and runs utils.run (the argument: absl's leftover argv)."""
  if len(_) > 1:
    raise app.UsageError(f"Unexpected arguments: {_[1:]}")
  config_errors.import_modules(FLAGS.module_import, "module_import")
  if not _is_serving_task():
    _write_command(FLAGS.model_dir)
  utils.parse_gin_defaults_and_flags()
  cluster = _start_cluster()
  run_args = {}
  if cluster is None:
    _split_cpu_early()
  else:
    run_args["mesh_devices"] = cluster.devices(_mesh_size())
  hooks = []
  if FLAGS.progress:
    hooks.append(progress.ProgressDisplay())
  with cluster.failures() if cluster else contextlib.nullcontext():
    return utils.run(tpu_job_name=FLAGS.tpu_job_name, tpu=FLAGS.tpu,
                     gcp_project=FLAGS.gcp_project, tpu_zone=FLAGS.tpu_zone,
                     model_dir=FLAGS.model_dir, train_hooks=hooks, **run_args)


def main_with_errors(argv):
  """main, with a configuration mistake reported as one paragraph and exit
  status 1 (config_errors); a bug keeps its traceback. Returns None: what
  utils.run returns is no exit status."""
  config_errors.run_main(main, argv, (cluster_lib.ClusterError,))


def console_entry_point():
  app.run(main_with_errors)


if __name__ == "__main__":
  console_entry_point()
