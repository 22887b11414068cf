"""RunConfig and TPUConfig: where and how often the estimator works."""

import collections
import re

MESH_IMPLS = ("placement", "simd", "tpu")


class TPUConfig(collections.namedtuple(
    "TPUConfig", ("iterations_per_loop", "num_shards",
                  "per_host_input_for_training"))):
  """TPUEstimator's loop settings; only `iterations_per_loop` is used."""

  def __new__(cls, iterations_per_loop=2, num_shards=None,
              per_host_input_for_training=True):
    return super().__new__(cls, iterations_per_loop, num_shards,
                           per_host_input_for_training)


class RunConfig:
  """Checkpoint, summary and logging intervals, and the mesh to run on.

  Args:
    model_dir: directory of checkpoints and summaries.
    save_checkpoints_steps: write a checkpoint every this many steps (at the
      end of the loop that reaches it) and at the end of `train`.
    keep_checkpoint_max: the newest checkpoints kept; older ones are deleted.
    log_step_count_steps: log loss and steps/sec every this many steps.
    iterations_per_loop: steps per call of the compiled training function
      (a `tpu_config` overrides it).
    save_summary_steps: write TensorBoard scalars every this many steps.
    tf_random_seed: passed to tf.random.set_seed before building a program.
    mesh_shape: e.g. "b:2;m:4" (default "all:1", one processor).
    layout: layout rules, e.g. "batch:b;hidden:m".
    mesh_impl: "placement" (PlacementMeshImpl), "simd" (SimdMeshImpl,
      host collectives) or "tpu" (SimdMeshImpl under a TPUStrategy, one
      processor per core; TPUEstimator(use_tpu=True) sets it).
    devices: one device string per processor (default: local devices, or
      the TPU cores in replica order). Devices of other tasks of a cluster
      count too: `mtf.cluster.connect(...).devices(n)` (see
      mesh_tensorflow.cluster).
    cluster: a TPUClusterResolver: with mesh_impl "tpu" the estimator
      connects to it, builds the TPUStrategy and places the mesh on the
      cores with mtf.backend.tpu_topology.auto_logical_to_physical_tpu.
    tpu_config: a TPUConfig.
    strategy: instead of `cluster`, a tf.distribute strategy with one
      replica per processor, used as it is (replica i is physical
      processor i).
    checkpoint_input_pipeline: also checkpoint the training input
      iterator, so that a resumed `train` continues where the data stopped
      instead of restarting input_fn (as tf.estimator did). The dataset
      must be serializable (no Python generators or py_function) and the
      same on resume; shuffle buffers are saved too, so keep them small.
    init_checkpoint: warm start: a checkpoint prefix (or a directory: its
      latest checkpoint) of another run, ours or the original library's
      (name-based TF1 `Saver` format, e.g. T5's published checkpoints).
      While model_dir has no checkpoint, `train` starts from it: variables
      it holds are loaded by mtf name, the others keep their initial values
      (one warning lists them), and the global step is restored too (so
      fine-tuning continues the step count). Once model_dir has a
      checkpoint, resuming from it wins and this is ignored. An unreadable
      path raises ValueError when training starts.
    init_variable_filter: optional regex: with init_checkpoint, only the
      variables whose mtf names it matches (re.search; "global_step" for
      the step) are loaded.
  """

  def __init__(self, model_dir=None, save_checkpoints_steps=100,
               keep_checkpoint_max=5, log_step_count_steps=100,
               iterations_per_loop=1, save_summary_steps=100,
               tf_random_seed=None, mesh_shape="all:1", layout="",
               mesh_impl="placement", devices=None, cluster=None,
               tpu_config=None, strategy=None,
               checkpoint_input_pipeline=False, init_checkpoint=None,
               init_variable_filter=None):
    if mesh_impl not in MESH_IMPLS:
      raise ValueError(f"RunConfig mesh_impl={mesh_impl!r}: expected one of "
                       f"{MESH_IMPLS}.")
    if mesh_impl == "tpu" and cluster is None and strategy is None:
      raise ValueError(
          "RunConfig mesh_impl='tpu' (TPUEstimator use_tpu=True) needs "
          "cluster=tf.distribute.cluster_resolver.TPUClusterResolver(...) "
          "or strategy=a TPUStrategy.")
    if init_variable_filter:
      try:
        re.compile(init_variable_filter)
      except re.error as e:
        raise ValueError(f"RunConfig init_variable_filter="
                         f"{init_variable_filter!r} is not a valid regular "
                         f"expression: {e}.") from e
    if tpu_config is not None:
      iterations_per_loop = tpu_config.iterations_per_loop
    for name, value in (("save_checkpoints_steps", save_checkpoints_steps),
                        ("keep_checkpoint_max", keep_checkpoint_max),
                        ("log_step_count_steps", log_step_count_steps),
                        ("iterations_per_loop", iterations_per_loop),
                        ("save_summary_steps", save_summary_steps)):
      if value is not None and int(value) < 1:
        raise ValueError(f"RunConfig {name}={value!r} must be at least 1.")
    self.model_dir = model_dir
    self.save_checkpoints_steps = save_checkpoints_steps
    self.keep_checkpoint_max = keep_checkpoint_max
    self.log_step_count_steps = log_step_count_steps
    self.iterations_per_loop = int(iterations_per_loop)
    self.save_summary_steps = save_summary_steps
    self.tf_random_seed = tf_random_seed
    self.mesh_shape = mesh_shape
    self.layout = layout
    self.mesh_impl = mesh_impl
    self.devices = devices
    self.cluster = cluster
    self.tpu_config = tpu_config
    self.strategy = strategy
    self.checkpoint_input_pipeline = bool(checkpoint_input_pipeline)
    self.init_checkpoint = init_checkpoint or None
    self.init_variable_filter = init_variable_filter or None

  def replace(self, **kwargs):
    """A copy with some arguments changed."""
    args = dict(vars(self))
    args.update(kwargs)
    return RunConfig(**args)

  def __repr__(self):
    items = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
    return f"RunConfig({items})"
