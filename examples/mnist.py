"""A spatially partitioned convnet classifying digits, on 8 logical CPUs.

The TF2 counterpart of the original's `examples/mnist.py` ("an illustration,
not a good model"). Each 28x28 image is cut into 4x4 blocks of 7x7 pixels
(dimensions `row_blocks`, `col_blocks`, `rows_size`, `cols_size`); the layout
`row_blocks:b1;col_blocks:b2` on the mesh `b1:2;b2:2` gives each processor a
quarter of every image, and `mtf.layers.conv2d_with_blocks` exchanges the
halos the 9x9 filters need between neighbouring processors. Two such
convolutions (16 filters each, relu), a mean over the filters, then three
dense layers give the logits; Adafactor minimises the softmax cross-entropy.

The data are TFDS MNIST when it is prepared in --data_dir (nothing is
downloaded), else the generated digits of `examples/digits_data.py`.

  python examples/mnist.py
  python examples/mnist.py --data_dir=~/tensorflow_datasets --train_epochs=2
"""

import os
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

# Split the CPU into 8 logical devices before TensorFlow starts.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 8)

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow import estimator  # pylint: disable=g-import-not-at-top

# The script's directory is on sys.path, so the sibling module imports.
import digits_data  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS

flags.DEFINE_string("data_dir", "/tmp/mnist_data",
                    "TFDS data directory holding a prepared `mnist` data set; "
                    "if it has none, generated digits are used.")
flags.DEFINE_string("model_dir", "",
                    "Checkpoint directory (resumed if it holds one); "
                    "default: a new temporary directory.")
flags.DEFINE_integer("batch_size", 200,
                     "Mini-batch size for training and evaluation.",
                     lower_bound=1)
flags.DEFINE_integer("hidden_size", 512, "Size of each hidden layer.")
flags.DEFINE_integer("train_epochs", 6, "Total number of training epochs.",
                     lower_bound=1)
flags.DEFINE_integer("epochs_between_evals", 3,
                     "Training epochs between evaluations.", lower_bound=1)
flags.DEFINE_integer("eval_steps", 0,
                     "Batches per evaluation; 0 evaluates the whole test set.")
flags.DEFINE_string("mesh_shape", "b1:2;b2:2", "Mesh shape.")
flags.DEFINE_string("layout", "row_blocks:b1;col_blocks:b2", "Layout rules.")
flags.DEFINE_enum("mesh_impl", "placement", ["placement", "simd"],
                  "PlacementMeshImpl or SimdMeshImpl (host collectives).")
flags.DEFINE_integer("iterations", 10,
                     "Training steps per call of the compiled loop.",
                     lower_bound=1)
flags.DEFINE_integer("num_train_examples", 6000,
                     "Size of the generated training set (no MNIST).")
flags.DEFINE_integer("num_test_examples", 1000,
                     "Size of the generated test set (no MNIST).")

ROWS, COLS, BLOCKS = 28, 28, 4


def mnist_model(image, labels, mesh):
  """(logits, loss, accuracy) of the convnet; the last two need labels."""
  batch_dim = mtf.Dimension("batch", FLAGS.batch_size)
  row_blocks_dim = mtf.Dimension("row_blocks", BLOCKS)
  col_blocks_dim = mtf.Dimension("col_blocks", BLOCKS)
  rows_dim = mtf.Dimension("rows_size", ROWS // BLOCKS)
  cols_dim = mtf.Dimension("cols_size", COLS // BLOCKS)
  classes_dim = mtf.Dimension("classes", 10)
  one_channel_dim = mtf.Dimension("one_channel", 1)

  x = mtf.import_tf_tensor(
      mesh, tf.reshape(image, [FLAGS.batch_size, BLOCKS, ROWS // BLOCKS,
                               BLOCKS, COLS // BLOCKS, 1]),
      [batch_dim, row_blocks_dim, rows_dim, col_blocks_dim, cols_dim,
       one_channel_dim])
  x = mtf.transpose(x, [batch_dim, row_blocks_dim, col_blocks_dim, rows_dim,
                        cols_dim, one_channel_dim])

  filters1_dim = mtf.Dimension("filters1", 16)
  filters2_dim = mtf.Dimension("filters2", 16)
  f1 = mtf.relu(mtf.layers.conv2d_with_blocks(
      x, filters1_dim, filter_size=[9, 9], strides=[1, 1], padding="SAME",
      h_blocks_dim=row_blocks_dim, w_blocks_dim=col_blocks_dim, name="conv0"))
  f2 = mtf.relu(mtf.layers.conv2d_with_blocks(
      f1, filters2_dim, filter_size=[9, 9], strides=[1, 1], padding="SAME",
      h_blocks_dim=row_blocks_dim, w_blocks_dim=col_blocks_dim, name="conv1"))
  x = mtf.reduce_mean(f2, reduced_dim=filters2_dim)

  hidden1_dim = mtf.Dimension("hidden1", FLAGS.hidden_size)
  hidden2_dim = mtf.Dimension("hidden2", FLAGS.hidden_size)
  h1 = mtf.layers.dense(
      x, hidden1_dim,
      reduced_dims=[row_blocks_dim, col_blocks_dim, rows_dim, cols_dim],
      activation=mtf.relu, name="hidden1")
  h2 = mtf.layers.dense(h1, hidden2_dim, reduced_dims=[hidden1_dim],
                        activation=mtf.relu, name="hidden2")
  logits = mtf.layers.dense(h2, classes_dim, reduced_dims=[hidden2_dim],
                            name="logits")
  if labels is None:
    return logits, None, None
  labels = mtf.import_tf_tensor(mesh, tf.cast(labels, tf.int32), [batch_dim])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, labels, classes_dim))
  correct = mtf.to_float(mtf.equal(mtf.argmax(logits, classes_dim), labels))
  return logits, loss, mtf.reduce_mean(correct)


def model_fn(features, labels, mode, params):
  """Builds the convnet, lowers it onto params["mesh_impl"]."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  logits, loss, accuracy = mnist_model(features["image"], labels, mesh)
  classes_dim = logits.shape.dims[-1]
  probabilities = mtf.softmax(logits, classes_dim)
  classes = mtf.argmax(logits, classes_dim)
  updates = []
  if mode == estimator.ModeKeys.TRAIN:
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = mtf.optimize.AdafactorOptimizer().apply_grads(grads, variables)
  lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
  if mode == estimator.ModeKeys.PREDICT:
    return estimator.EstimatorSpec(mode, predictions={
        "classes": lowering.export_to_tf_tensor(classes),
        "probabilities": lowering.export_to_tf_tensor(probabilities)})
  return estimator.EstimatorSpec(
      mode, loss=lowering.export_to_tf_tensor(loss),
      train_op=tf.group([lowering.lowered_operation(u) for u in updates]),
      eval_metric_ops={"accuracy": lowering.export_to_tf_tensor(accuracy)})


def _to_numpy(dataset):
  """(images float32 [n, 28, 28] in [0, 1], labels int32) of a TFDS split."""
  images, labels = [], []
  for image, label in dataset.batch(10000).as_numpy_iterator():
    images.append(image[..., 0].astype(np.float32) / 255)
    labels.append(label.astype(np.int32))
  return np.concatenate(images), np.concatenate(labels)


def load_data():
  """(name, (train images, labels), (test images, labels)) as NumPy.

  TFDS MNIST if it is prepared in --data_dir, else generated digits.
  """
  data_dir = os.path.expanduser(FLAGS.data_dir)
  if os.path.isdir(os.path.join(data_dir, "mnist")):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    try:
      splits = tfds.load("mnist", split=["train", "test"], data_dir=data_dir,
                         download=False, as_supervised=True)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("Could not load TFDS mnist from %s (%s); using "
                      "generated digits.", data_dir, e)
    else:
      return ("TFDS mnist",) + tuple(_to_numpy(split) for split in splits)
  logging.info("No TFDS mnist in %s: generating %d + %d digits.", data_dir,
               FLAGS.num_train_examples, FLAGS.num_test_examples)
  train, test = digits_data.train_and_test(FLAGS.num_train_examples,
                                           FLAGS.num_test_examples)
  return "generated digits", train, test


def make_input_fn(images, labels, epochs=None):
  """Full batches of ({"image": images}, labels).

  With `epochs` (a range of epoch numbers) the examples come in a shuffled
  order that depends only on the epoch number, so the training data do not
  depend on how training is split between evaluations.
  """
  if epochs is None:
    order = np.arange(len(images))
  else:
    order = np.concatenate([np.random.RandomState(epoch).permutation(
        len(images)) for epoch in epochs])

  def input_fn():
    all_images = tf.constant(images)
    all_labels = tf.constant(labels.astype(np.int32))
    batches = tf.data.Dataset.from_tensor_slices(order).batch(
        FLAGS.batch_size, drop_remainder=True)
    return batches.map(lambda i: ({"image": tf.gather(all_images, i)},
                                  tf.gather(all_labels, i)))

  return input_fn


def run():
  """Trains and evaluates; returns (data name, [(epoch, eval results)])."""
  name, (train_x, train_y), (test_x, test_y) = load_data()
  if min(len(train_x), len(test_x)) < FLAGS.batch_size:
    raise ValueError(f"--batch_size={FLAGS.batch_size} is larger than the "
                     "training or test set.")
  logging.info("Data: %s, %d training and %d test examples.", name,
               len(train_x), len(test_x))
  model_dir = FLAGS.model_dir or tempfile.mkdtemp(prefix="mnist_")
  config = estimator.RunConfig(
      model_dir=model_dir, mesh_shape=FLAGS.mesh_shape, layout=FLAGS.layout,
      mesh_impl=FLAGS.mesh_impl, iterations_per_loop=FLAGS.iterations,
      save_checkpoints_steps=None, log_step_count_steps=FLAGS.iterations,
      tf_random_seed=0)
  classifier = estimator.Estimator(model_fn, config=config)
  history = []
  steps_per_epoch = len(train_x) // FLAGS.batch_size
  for epoch in range(0, FLAGS.train_epochs, FLAGS.epochs_between_evals):
    epochs = min(FLAGS.epochs_between_evals, FLAGS.train_epochs - epoch)
    classifier.train(make_input_fn(train_x, train_y,
                                   range(epoch, epoch + epochs)),
                     max_steps=(epoch + epochs) * steps_per_epoch)
    results = classifier.evaluate(make_input_fn(test_x, test_y),
                                  steps=FLAGS.eval_steps or None)
    history.append((epoch + epochs, results))
    logging.info("Epoch %d: test accuracy %.4f, loss %.4f", epoch + epochs,
                 results["accuracy"], results["loss"])
  return name, history


def main(argv):
  del argv
  start = time.time()
  name, history = run()
  seconds = time.time() - start
  for epoch, results in history:
    print(f"epoch {epoch}: test loss {results['loss']:.4f}, "
          f"accuracy {results['accuracy']:.4f}")
  results = history[-1][1]
  print(f"mnist ({name}): test accuracy {results['accuracy']:.4f}, "
        f"loss {results['loss']:.4f} after {history[-1][0]} epochs "
        f"({results['global_step']} steps, {seconds:.1f} s)")


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  app.run(main)
