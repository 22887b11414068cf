"""What the three BERT binaries share: flags, devices, estimator, errors.

The original's binaries each defined their flags at import; some names
(--max_seq_length, --eval_batch_size, ...) are in several of them, so a
program (or a test) importing two binaries would fail with a duplicate
flag. Here a flag is defined once per process by whichever binary comes
first (`define`); run as a program, each binary has its own defaults.

On CPU/GPU the mesh runs on the placement implementation (or SIMD with
--mesh_impl=simd), one processor per logical CPU (split before TensorFlow
starts) or GPU; with --use_tpu on the TPU cores of --tpu_name.
"""

from absl import app
from absl import flags
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator
from mesh_tensorflow.bert import google_checkpoint
from mesh_tensorflow.transformer.binary import config_errors
from mesh_tensorflow.transformer.binary import run_devices

FLAGS = flags.FLAGS

DEFAULT_LAYOUT = ("batch:batch,vocab:model,intermediate:model,"
                  "num_heads:model,experts:batch")

# Warm starts load the model's weights only: not the step, not optimizer
# slots (the original's get_assignment_map_from_checkpoint skipped names
# with "global_step", "adam_" or "slot_").
WARM_START_FILTER = r"^(?!global_step$)(?!.*(?:adam_|slot_))"


def define(kind, name, default, help_text, **kwargs):
  """flags.DEFINE_<kind>(name, ...) unless the flag already exists.

  For kind "enum", pass enum_values=[...] as a keyword.
  """
  if name in FLAGS:
    return
  if kind == "enum":
    flags.DEFINE_enum(name, default, kwargs.pop("enum_values"), help_text,
                      **kwargs)
    return
  getattr(flags, f"DEFINE_{kind}")(name, default, help_text, **kwargs)


def define_mesh_and_tpu_flags():
  """The mesh, layout, checkpointing and Cloud TPU flags of every binary."""
  define("string", "mesh_shape", "batch:8",
         "Mesh shape, e.g. 'batch:8' or 'batch:2;model:4'.")
  define("string", "layout", DEFAULT_LAYOUT,
         "Layout rules: tensor dimension:mesh dimension pairs.")
  define("enum", "mesh_impl", "placement",
         "Mesh implementation on CPU/GPU (--use_tpu always uses SIMD on the "
         "TPU cores).", enum_values=["placement", "simd"])
  define("bool", "use_tpu", False, "Run on Cloud TPU cores.")
  define("string", "tpu_name", None,
         "The Cloud TPU: its name or a grpc://address:8470 URL.")
  define("string", "tpu_zone", None, "[Optional] GCE zone of the Cloud TPU.")
  define("string", "gcp_project", None,
         "[Optional] Project of the Cloud TPU.")
  define("string", "master", None, "[Optional] TensorFlow master URL.")
  define("integer", "save_checkpoints_steps", 1000,
         "How often to save the model checkpoint.")
  define("integer", "iterations_per_loop", 1000,
         "Steps per compiled training loop (and per log line).")
  define("bool", "show_traceback", False,
         "On bad input, also log the Python traceback.")


def mesh_shape():
  """--mesh_shape as an mtf.Shape; a bad value names the flag."""
  try:
    return mtf.convert_to_shape(FLAGS.mesh_shape)
  except (ValueError, TypeError) as e:
    raise ValueError(f"--mesh_shape={FLAGS.mesh_shape!r}: {e}") from None


def layout_rules():
  """--layout as mtf.LayoutRules; a bad value names the flag."""
  try:
    return mtf.convert_to_layout_rules(FLAGS.layout)
  except (ValueError, TypeError) as e:
    raise ValueError(f"--layout={FLAGS.layout!r}: {e}") from None


def prepare_devices():
  """Splits the CPU into one logical device per processor of the mesh.

  Call before anything starts TensorFlow's devices (on GPUs, TPUs or with
  enough logical CPUs already, a no-op).
  """
  if not FLAGS.use_tpu:
    run_devices.ensure_local_devices(mesh_shape().size)


def _tpu_cluster():
  if not FLAGS.use_tpu:
    return None
  if not FLAGS.tpu_name and not FLAGS.master:
    raise ValueError("--use_tpu needs --tpu_name (or --master).")
  return tf.distribute.cluster_resolver.TPUClusterResolver(
      FLAGS.tpu_name or FLAGS.master, zone=FLAGS.tpu_zone,
      project=FLAGS.gcp_project)


def init_checkpoint_for(init_checkpoint, bert_config, output_dir):
  """The checkpoint to warm-start from, given --init_checkpoint.

  Ours and the original's (mtf variable names) are used as they are; one of
  Google's BERT releases (google-research/bert names) is converted once
  into mtf names and shapes under output_dir (google_checkpoint).
  """
  if not init_checkpoint:
    return None
  return google_checkpoint.prepare_init_checkpoint(
      init_checkpoint, bert_config, output_dir)


def make_estimator(model_fn, output_dir, train_batch_size=None,
                   eval_batch_size=None, predict_batch_size=None,
                   init_checkpoint=None, params=None, tf_random_seed=None):
  """A TPUEstimator over the flags' mesh, layout and TPU settings.

  Args:
    model_fn: model_fn(features, labels, mode, params); the mesh
      implementation is params["mesh_impl"].
    output_dir: the model directory (checkpoints, summaries).
    train_batch_size, eval_batch_size, predict_batch_size: global batch
      sizes, given to input functions as params["batch_size"].
    init_checkpoint: optional checkpoint to start training from (ours, the
      original's name-based one, or Google's BERT release): the weights
      only, neither the step nor optimizer slots.
    params: extra params for model_fn and input_fn.
    tf_random_seed: optional seed of the run's initializers and dropout.

  Returns:
    an mtf.estimator.TPUEstimator.
  """
  mesh_shape()  # Bad values fail here, naming the flag.
  layout_rules()
  config = estimator.RunConfig(
      model_dir=output_dir,
      save_checkpoints_steps=FLAGS.save_checkpoints_steps,
      keep_checkpoint_max=10,
      log_step_count_steps=FLAGS.iterations_per_loop,
      iterations_per_loop=FLAGS.iterations_per_loop,
      tf_random_seed=tf_random_seed,
      mesh_shape=FLAGS.mesh_shape, layout=FLAGS.layout,
      mesh_impl="tpu" if FLAGS.use_tpu else FLAGS.mesh_impl,
      cluster=_tpu_cluster(),
      init_checkpoint=init_checkpoint or None,
      init_variable_filter=WARM_START_FILTER if init_checkpoint else None)
  return estimator.TPUEstimator(
      model_fn, config=config, params=params, use_tpu=FLAGS.use_tpu,
      train_batch_size=train_batch_size, eval_batch_size=eval_batch_size,
      predict_batch_size=predict_batch_size)


def run(main):
  """app.run(main), a mistake in the flags or files reported as one
  paragraph naming the flag, with exit status 1 (config_errors); a bug
  keeps its traceback."""

  def main_with_errors(argv):
    return config_errors.run_main(main, argv)

  app.run(main_with_errors)
