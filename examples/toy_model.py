"""Learns the identity function with stacked dense layers, on 8 logical CPUs.

The TF2 counterpart of the original's `examples/toy_model_tpu.py`: the model
maps x[batch, io] through `num_hidden_layers` bias-free dense layers whose
output dimensions alternate between `hidden_odd` and `hidden_even`, then back
to `io`, and learns y = x under a mean squared error loss. The mesh shape and
the layout rules choose how it is split (the default splits `hidden_odd`
over all 8 processors); `mtf.estimator.Estimator` trains it, evaluating at
every checkpoint.

  python examples/toy_model.py
  python examples/toy_model.py --mesh_shape="b:2;m:4" \
      --layout="batch:b;hidden_odd:m" --mesh_impl=simd
  python examples/toy_model.py --use_tpu --tpu=my-tpu --mesh_shape=all:8 \
      --model_dir=gs://bucket/toy   # Cloud TPU with 8 cores
"""

import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

# Split the CPU into 8 logical devices before TensorFlow starts.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 8)

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow import estimator  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS

flags.DEFINE_integer("batch_size", 64, "Training batch size.")
flags.DEFINE_integer("io_size", 16, "Number of input (and output) channels.")
flags.DEFINE_integer("hidden_size", 16, "Size of each hidden layer.")
flags.DEFINE_integer("num_hidden_layers", 1, "Number of hidden layers.")
flags.DEFINE_string("master_dtype", "bfloat16",
                    "dtype of the variables in checkpoints.")
flags.DEFINE_string("slice_dtype", "float32",
                    "dtype of the per-processor variable slices.")
flags.DEFINE_string("activation_dtype", "float32", "dtype of activations.")
flags.DEFINE_enum("optimizer", "SGD", ["SGD", "Adafactor"], "The optimizer.")
flags.DEFINE_float("lr", 0.1, "Learning rate; with Adafactor, 0 selects "
                   "Adafactor's default schedule.")
flags.DEFINE_string("mesh_shape", "all:8", "Mesh shape, e.g. \"b:2;m:4\".")
flags.DEFINE_string("layout", "hidden_odd:all", "Layout rules.")
flags.DEFINE_enum("mesh_impl", "placement", ["placement", "simd"],
                  "PlacementMeshImpl or SimdMeshImpl (host collectives).")
flags.DEFINE_integer("iterations", 10,
                     "Training steps per call of the compiled loop.",
                     lower_bound=1)
flags.DEFINE_integer("train_steps", 1000, "Total number of training steps.",
                     lower_bound=1)
flags.DEFINE_integer("steps_per_checkpoint", 200,
                     "Steps between checkpoints (and evaluations).",
                     lower_bound=1)
flags.DEFINE_integer("eval_batches", 4, "Batches per evaluation.",
                     lower_bound=1)
flags.DEFINE_string("model_dir", "",
                    "Checkpoint directory (resumed if it holds one); "
                    "default: a new temporary directory.")
flags.DEFINE_bool("use_tpu", False, "Run on Cloud TPU cores (one mesh "
                  "processor per core), overriding --mesh_impl.")
flags.DEFINE_string("tpu", None, "The Cloud TPU's name or address.")
flags.DEFINE_string("gcp_project", None, "The TPU's GCP project (default: "
                    "detected).")
flags.DEFINE_string("tpu_zone", None, "The TPU's zone (default: detected).")


def _variable_dtype():
  return mtf.VariableDType(tf.as_dtype(FLAGS.master_dtype),
                           tf.as_dtype(FLAGS.slice_dtype),
                           tf.as_dtype(FLAGS.activation_dtype))


def toy_model(features, mesh):
  """(outputs, loss) of the stacked dense layers on x = features."""
  batch_dim = mtf.Dimension("batch", FLAGS.batch_size)
  io_dim = mtf.Dimension("io", FLAGS.io_size)
  variable_dtype = _variable_dtype()
  x = mtf.import_tf_tensor(mesh, features, [batch_dim, io_dim])
  x = mtf.cast(x, variable_dtype.activation_dtype)
  h, h_dim = x, io_dim
  for layer in range(1, FLAGS.num_hidden_layers + 2):
    if layer == FLAGS.num_hidden_layers + 1:
      new_dim = io_dim
    elif layer % 2:
      new_dim = mtf.Dimension("hidden_odd", FLAGS.hidden_size)
    else:
      new_dim = mtf.Dimension("hidden_even", FLAGS.hidden_size)
    h = mtf.layers.dense(h, new_dim, reduced_dims=[h_dim], use_bias=False,
                         variable_dtype=variable_dtype, name=f"layer_{layer}")
    h_dim = new_dim
  loss = mtf.reduce_mean(mtf.square(mtf.cast(h, tf.float32) -
                                    mtf.cast(x, tf.float32)))
  return h, loss


def model_fn(features, labels, mode, params):
  """Builds the toy model and its training step on params["mesh_impl"]."""
  del labels  # The target is the input.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  outputs, loss = toy_model(features, mesh)
  mean_output = mtf.reduce_mean(mtf.cast(outputs, tf.float32))
  updates = []
  if mode == estimator.ModeKeys.TRAIN:
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    if FLAGS.optimizer == "Adafactor":
      optimizer = mtf.optimize.AdafactorOptimizer(
          learning_rate=FLAGS.lr or None)
    else:
      optimizer = mtf.optimize.SgdOptimizer(FLAGS.lr)
    updates = optimizer.apply_grads(grads, variables)
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  if mode == estimator.ModeKeys.PREDICT:
    return estimator.EstimatorSpec(mode, predictions={
        "outputs": lowering.export_to_tf_tensor(outputs)})
  return estimator.EstimatorSpec(
      mode, loss=lowering.export_to_tf_tensor(loss),
      train_op=tf.group([lowering.lowered_operation(u) for u in updates]),
      eval_metric_ops={
          "mean_output": lowering.export_to_tf_tensor(mean_output)})


def make_input_fn(seed, start=0, num_batches=None):
  """Batches (x, x) of standard normal x; batch i is the same in every run."""

  def input_fn():
    stop = start + num_batches if num_batches else 2**62
    indices = tf.data.Dataset.range(start, stop)

    def batch(i):
      x = tf.random.stateless_normal(
          [FLAGS.batch_size, FLAGS.io_size], seed=tf.stack([seed, i]))
      return x, x

    return indices.map(batch)

  return input_fn


def run():
  """Trains, evaluating after step 1 and at every checkpoint.

  Returns:
    the list of (global step, eval loss).
  """
  model_dir = FLAGS.model_dir or tempfile.mkdtemp(prefix="toy_model_")
  cluster = None
  if FLAGS.use_tpu:
    cluster = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=FLAGS.tpu, zone=FLAGS.tpu_zone, project=FLAGS.gcp_project)
  config = estimator.RunConfig(
      model_dir=model_dir, mesh_shape=FLAGS.mesh_shape, layout=FLAGS.layout,
      mesh_impl=FLAGS.mesh_impl, cluster=cluster,
      save_checkpoints_steps=FLAGS.steps_per_checkpoint,
      iterations_per_loop=FLAGS.iterations,
      log_step_count_steps=FLAGS.steps_per_checkpoint, tf_random_seed=0)
  est = estimator.TPUEstimator(model_fn, config=config,
                               use_tpu=FLAGS.use_tpu)
  logging.info("toy_model: mesh %s, layout %r, %s, model_dir %s",
               FLAGS.mesh_shape, FLAGS.layout,
               "tpu" if FLAGS.use_tpu else FLAGS.mesh_impl, model_dir)
  eval_input_fn = make_input_fn(seed=2, num_batches=FLAGS.eval_batches)
  step = 0
  if est.latest_checkpoint():
    step = int(est.get_variable_value("global_step"))
  history = []
  while step < FLAGS.train_steps:
    if step == 0:
      next_step = 1  # Evaluate once early, to show where the loss starts.
    else:
      every = FLAGS.steps_per_checkpoint
      next_step = min((step // every + 1) * every, FLAGS.train_steps)
    est.train(make_input_fn(seed=1, start=step), max_steps=next_step)
    results = est.evaluate(eval_input_fn)
    step = results["global_step"]
    history.append((step, results["loss"]))
    logging.info("step %d: eval loss %.6f", step, results["loss"])
  if not history:  # The checkpoint in model_dir is already trained.
    results = est.evaluate(eval_input_fn)
    history.append((results["global_step"], results["loss"]))
  return history


def main(argv):
  del argv
  start = time.time()
  history = run()
  seconds = time.time() - start
  for step, loss in history:
    print(f"step {step}: eval loss {loss:.6f}")
  (first_step, first), (last_step, last) = history[0], history[-1]
  print(f"toy_model: eval loss {first:.6f} at step {first_step} -> "
        f"{last:.6f} at step {last_step} ({seconds:.1f} s)")


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  app.run(main)
