"""The Transformer binary on a 2-task cluster: the same command on both
tasks, only --task_index differs; the tiny model trains to the same
variables as on one process."""

import sys

from absl import flags
import gin
import numpy as np

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import main as main_lib
from tests.cluster import cluster_testing

FLAGS = flags.FLAGS
TRAIN_STEPS = 4
TINY = [
    "d_model = 16", "d_ff = 32", "num_heads = 2", "d_kv = 8",
    "num_layers = 1", "dropout_rate = 0.0",
    "Unitransformer.max_length = 8", "max_digits = 2",
    "utils.get_variable_dtype.activation_dtype = 'float32'",
    "utils.serialize_num_microbatches.tokens_per_microbatch_per_replica = "
    "None",
    "utils.run.mesh_shape = 'batch:2;model:2'",
    "utils.run.layout_rules = 'batch:batch,d_ff:model,heads:model,"
    "vocab:model'",
    "utils.run.batch_size = ('sequences_per_batch', 8)",
    f"utils.run.train_steps = {TRAIN_STEPS}",
    "utils.run.iterations_per_loop = 2",
    "utils.run.save_checkpoints_steps = 2",
    "utils.run.learning_rate_schedule = 0.01",
]
GIN_FILES = ["models/bi_base.gin", "problems/addition.gin"]


def _argv(model_dir, *extra):
  return (["main", f"--model_dir={model_dir}", "--noprogress"] +
          [f"--gin_file={f}" for f in GIN_FILES] +
          [f"--gin_param={p}" for p in TINY] + list(extra))


def _run_in_process(model_dir):
  FLAGS.unparse_flags()
  argv = FLAGS(_argv(model_dir))
  gin.clear_config()
  try:
    main_lib.main(argv)
  finally:
    gin.clear_config()
    FLAGS.unparse_flags()


def _start(cluster, model_dir, task_index):
  argv = _argv(model_dir, f"--worker_hosts={cluster.worker_hosts}",
               f"--task_index={task_index}")
  return cluster.start_process(
      [sys.executable, "-m", "tests.cluster.transformer_main"] + argv[1:])


def test_tiny_transformer_on_two_tasks_matches_one_process(tmp_path):
  _run_in_process(tmp_path / "local")
  with cluster_testing.LocalCluster(2) as cluster:
    _start(cluster, tmp_path / "cluster", 1)
    rc, _, err = cluster.wait(_start(cluster, tmp_path / "cluster", 0))
  assert rc == 0, err[-3000:]
  assert f"Connected to cluster {{'worker': {cluster.hosts!r}}}" in err
  local = mtf.storage.checkpointing.load_variables(str(tmp_path / "local"), "model")
  on_cluster = mtf.storage.checkpointing.load_variables(str(tmp_path / "cluster"),
                                                "model")
  assert sorted(on_cluster) == sorted(local)
  for name in local:
    np.testing.assert_allclose(on_cluster[name], local[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)
