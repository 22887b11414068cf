"""Fine-tunes BERT to classify sentences or sentence pairs (GLUE tasks).

    python -m mesh_tensorflow.bert.run_classifier --task_name=MRPC \
      --do_train --do_eval --data_dir=glue/MRPC --vocab_file=vocab.txt \
      --bert_config_file=bert_config.json --init_checkpoint=pretrained \
      --output_dir=/tmp/mrpc

Reads the task's TSV files (CoLA, MNLI, MRPC, XNLI: classifier_data),
turns them into TFRecords of token ids (classifier_features), and trains,
evaluates (output_dir/eval_results.txt) and predicts (output_dir/
test_results.tsv, one line of class probabilities per test example) a
BertModel whose pooled output feeds a dense layer over the labels. The
model runs on the mesh of --mesh_shape and --layout: the placement mesh
implementation over logical CPUs (or GPUs) by default, SIMD on TPU cores
with --use_tpu. --init_checkpoint warm-starts the weights (not the step
or optimizer slots) from a pretraining checkpoint: ours, the original
library's (TF1 name-based) or one of Google's BERT releases.

The mesh has a fixed batch dimension, so evaluation and prediction sets
are always padded with PaddingInputExamples to a multiple of the batch
size (the original did so on TPU only); padding weighs nothing in the
metrics and is not written to the predictions.
"""

import os

from absl import flags
from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator
from mesh_tensorflow.randomness import tf_initializers
from mesh_tensorflow.bert import bert as bert_lib
from mesh_tensorflow.bert import optimization as optimization_lib
from mesh_tensorflow.bert import run_common
from mesh_tensorflow.bert import tokenization
# The data classes and conversions are this module's names in the original.
from mesh_tensorflow.bert.classifier_data import ColaProcessor
from mesh_tensorflow.bert.classifier_data import DataProcessor
from mesh_tensorflow.bert.classifier_data import InputExample
from mesh_tensorflow.bert.classifier_data import InputFeatures
from mesh_tensorflow.bert.classifier_data import MnliProcessor
from mesh_tensorflow.bert.classifier_data import MrpcProcessor
from mesh_tensorflow.bert.classifier_data import PaddingInputExample
from mesh_tensorflow.bert.classifier_data import XnliProcessor
from mesh_tensorflow.bert.classifier_features import convert_examples_to_features
from mesh_tensorflow.bert.classifier_features import convert_single_example
from mesh_tensorflow.bert.classifier_features import file_based_convert_examples_to_features
from mesh_tensorflow.bert.classifier_features import file_based_input_fn_builder
from mesh_tensorflow.bert.classifier_features import input_fn_builder

__all__ = [
    "InputExample", "PaddingInputExample", "InputFeatures", "DataProcessor",
    "XnliProcessor", "MnliProcessor", "MrpcProcessor", "ColaProcessor",
    "convert_single_example", "convert_examples_to_features",
    "file_based_convert_examples_to_features", "file_based_input_fn_builder",
    "input_fn_builder", "create_model", "model_fn_builder", "main",
]

FLAGS = flags.FLAGS

PROCESSORS = {
    "cola": ColaProcessor,
    "mnli": MnliProcessor,
    "mrpc": MrpcProcessor,
    "xnli": XnliProcessor,
}

OPTIMIZERS = ("adam", "adafactor")

REQUIRED_FLAGS = ("data_dir", "task_name", "vocab_file", "bert_config_file",
                  "output_dir")


def _define_flags():
  """The original's flags (run_common skips those already defined)."""
  define = run_common.define
  define("string", "data_dir", None,
         "The input data dir: the task's .tsv files.")
  define("string", "bert_config_file", None,
         "The BERT model's config JSON file (its architecture).")
  define("string", "task_name", None,
         f"The task to train: one of {sorted(PROCESSORS)}.")
  define("string", "vocab_file", None,
         "The vocabulary file the BERT model was trained on.")
  define("string", "output_dir", None,
         "Where the model checkpoints and results are written.")
  define("string", "init_checkpoint", None,
         "Initial checkpoint (usually of a pre-trained BERT model).")
  define("string", "cached_train_file", None,
         "A training TFRecord file prepared by an earlier run.")
  define("bool", "do_lower_case", True,
         "Lower-case the input text: True for uncased models, False for "
         "cased ones.")
  define("float", "max_optimized_variable_size", 1e7,
         "Do not optimize variables larger than this.")
  define("integer", "max_seq_length", 128,
         "Length of the token sequences after WordPiece tokenization: longer "
         "ones are truncated, shorter ones padded.")
  define("bool", "do_train", False, "Whether to run training.")
  define("bool", "do_eval", False, "Whether to evaluate on the dev set.")
  define("bool", "do_predict", False,
         "Whether to predict the classes of the test set.")
  define("integer", "train_batch_size", 32, "Total batch size for training.")
  define("integer", "eval_batch_size", 32, "Total batch size for eval.")
  define("integer", "predict_batch_size", 8,
         "Total batch size for predict.")
  define("float", "learning_rate", 5e-5, "The initial learning rate.")
  define("bool", "clip_gradients", True, "Apply gradient clipping.")
  define("string", "optimizer", "adam", "adam/adafactor")
  define("float", "num_train_epochs", 3.0,
         "Total number of training epochs to perform.")
  define("float", "warmup_proportion", 0.1,
         "Proportion of training with a linear learning rate warm-up, e.g. "
         "0.1 = 10% of training.")
  define("string", "xnli_language", "zh",
         "XNLI: the language of the training and dev data.")
  define("integer", "tf_random_seed", None,
         "Seed of initializers, dropout and shuffling (reproducible runs).")
  run_common.define_mesh_and_tpu_flags()


_define_flags()


def create_model(bert_config, is_training, input_ids, input_mask,
                 segment_ids, labels, num_labels_dim, layout, mesh_shape):
  """A classifier on BERT's pooled output.

  The pooled output ([CLS]'s), dropped out at rate 0.1 in training, goes
  through a dense layer to the labels (variables "output_weights"
  [num_labels, hidden] and "output_bias" [num_labels], the original's).

  Args:
    bert_config: a BertConfig.
    is_training: whether to apply dropout.
    input_ids, input_mask, segment_ids: int32 mtf.Tensors [batch, seq].
    labels: int32 mtf.Tensor [batch] of label indices.
    num_labels_dim: the labels' mtf.Dimension.
    layout, mesh_shape: the layout rules and mesh shape (for BERT's
      mixture-of-experts layers).

  Returns:
    (loss: mean cross-entropy plus BERT's extra losses, per_example_loss
    [batch], logits [batch, labels], probabilities [batch, labels]).
  """
  model = bert_lib.BertModel(
      config=bert_config, is_training=is_training, input_ids=input_ids,
      input_mask=input_mask, token_type_ids=segment_ids, layout=layout,
      mesh_shape=mesh_shape)
  output_layer = model.get_pooled_output()
  hidden_dim = output_layer.shape.dims[-1]
  mesh = input_ids.mesh
  output_weights = mtf.get_variable(
      mesh, "output_weights", shape=[num_labels_dim, hidden_dim],
      # Seeded by the name, as BertModel's: every layout starts the same.
      initializer=tf_initializers.seeded(
          "truncated_normal_initializer",
          tf_initializers.name_seed("output_weights"), stddev=0.02))
  output_bias = mtf.get_variable(
      mesh, "output_bias", shape=[num_labels_dim],
      initializer=tf.compat.v1.zeros_initializer())
  with tf.compat.v1.variable_scope("loss"):
    output_layer = mtf.dropout(output_layer, is_training, keep_prob=0.9)
    logits = mtf.einsum([output_layer, output_weights],
                        reduced_dims=[hidden_dim]) + output_bias
    probabilities = mtf.softmax(logits, reduced_dim=num_labels_dim)
    per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, labels, vocab_dim=num_labels_dim)
    loss = mtf.reduce_mean(per_example_loss) + model.get_extra_loss()
  return loss, per_example_loss, logits, probabilities


def _flag(name):
  """A flag's value, its default if flags were not parsed (library use)."""
  return FLAGS[name].value


def _log_warm_start(graph, init_checkpoint):
  """Logs the trainable variables, marking those the checkpoint holds."""
  held = {name for name, _ in tf.train.list_variables(init_checkpoint)}
  logging.info("**** Trainable variables (init from %s) ****",
               init_checkpoint)
  for var in graph.trainable_variables:
    mark = ", *INIT_FROM_CKPT*" if var.name in held else ""
    logging.info("  name = %s, shape = %s%s", var.name, var.shape, mark)


def model_fn_builder(bert_config, num_labels, init_checkpoint, learning_rate,
                     num_train_steps, num_warmup_steps, use_tpu):
  """The estimator's model_fn of the classifier.

  The model runs on params["mesh_impl"] (the estimator's, from
  --mesh_shape and --layout). --optimizer, --clip_gradients and
  --max_optimized_variable_size choose the optimizer, as in the original.

  Args:
    bert_config: a BertConfig.
    num_labels: the number of classes.
    init_checkpoint: the warm-start checkpoint, only logged here: the
      estimator loads it (RunConfig init_checkpoint, run_common).
    learning_rate: the peak learning rate.
    num_train_steps: steps of the linear decay to 0.
    num_warmup_steps: steps of the linear warm-up.
    use_tpu: kept for the original's signature (the estimator chooses the
      mesh implementation).

  Returns:
    model_fn(features, labels, mode, params) -> TPUEstimatorSpec.
  """
  del use_tpu

  def model_fn(features, labels, mode, params):
    del labels  # The labels are features["label_ids"].
    mesh_impl = params["mesh_impl"]
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "bert_mesh")
    input_ids = features["input_ids"]
    label_ids = features["label_ids"]
    if "is_real_example" in features:
      is_real_example = tf.cast(features["is_real_example"], tf.float32)
    else:
      is_real_example = tf.ones(tf.shape(label_ids), tf.float32)
    batch_size, seq_length = input_ids.shape.as_list()
    batch_dim = mtf.Dimension("batch", batch_size)
    seq_dim = mtf.Dimension("seq", seq_length)
    # The original named this dimension "seq" too (harmless there, as the
    # pooled output has no seq dimension, but a layout rule for "seq"
    # would have split the labels); it has a name of its own here.
    num_labels_dim = mtf.Dimension("num_labels", num_labels)

    def to_mtf(name, dims):
      return mtf.import_tf_tensor(mesh, tf.cast(features[name], tf.int32),
                                  dims)

    is_training = mode == estimator.ModeKeys.TRAIN
    total_loss, per_example_loss, logits, probabilities = create_model(
        bert_config, is_training, to_mtf("input_ids", [batch_dim, seq_dim]),
        to_mtf("input_mask", [batch_dim, seq_dim]),
        to_mtf("segment_ids", [batch_dim, seq_dim]),
        to_mtf("label_ids", [batch_dim]), num_labels_dim,
        mesh_impl.layout_rules, mesh_impl.shape)
    total_loss = mtf.anonymize(total_loss)
    per_example_loss = mtf.anonymize(per_example_loss)
    logits = mtf.anonymize(logits)
    probabilities = mtf.anonymize(probabilities)

    update_ops = []
    if is_training:
      _, update_ops = optimization_lib.create_optimizer(
          total_loss, learning_rate, num_train_steps, num_warmup_steps,
          max_optimized_variable_size=_flag("max_optimized_variable_size"),
          optimizer=_flag("optimizer"),
          clip_gradients=_flag("clip_gradients"))
      if init_checkpoint:
        _log_warm_start(graph, init_checkpoint)

    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    tf_loss = tf.cast(lowering.export_to_tf_tensor(total_loss), tf.float32)

    if mode == estimator.ModeKeys.TRAIN:
      return estimator.TPUEstimatorSpec(
          mode, loss=tf_loss,
          train_op=tf.group([lowering.lowered_operation(op)
                             for op in update_ops]))
    if mode == estimator.ModeKeys.EVAL:

      def metric_fn(per_example_loss, label_ids, logits, is_real_example):
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
        correct = tf.cast(tf.equal(predictions, label_ids), tf.float32)
        return {
            "eval_accuracy": estimator.metrics.mean(
                correct, weights=is_real_example),
            "eval_loss": estimator.metrics.mean(
                per_example_loss, weights=is_real_example),
        }

      return estimator.TPUEstimatorSpec(
          mode, loss=tf_loss, eval_metrics=(metric_fn, [
              lowering.export_to_tf_tensor(per_example_loss),
              tf.cast(label_ids, tf.int32),
              lowering.export_to_tf_tensor(logits), is_real_example]))
    return estimator.TPUEstimatorSpec(mode, predictions={
        "probabilities": lowering.export_to_tf_tensor(probabilities)})

  return model_fn


def _check_flags():
  """ValueError naming the flag, for values that can be checked early."""
  missing = [f"--{name}" for name in REQUIRED_FLAGS if not _flag(name)]
  if missing:
    raise ValueError(f"{', '.join(missing)} must be set (required).")
  if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
    raise ValueError("At least one of --do_train, --do_eval or --do_predict "
                     "must be set.")
  if FLAGS.task_name.lower() not in PROCESSORS:
    raise ValueError(f"--task_name={FLAGS.task_name!r}: task not found; "
                     f"expected one of {sorted(PROCESSORS)}.")
  if FLAGS.optimizer not in OPTIMIZERS:
    raise ValueError(f"--optimizer={FLAGS.optimizer!r}: expected one of "
                     f"{OPTIMIZERS}.")
  for name in ("train_batch_size", "eval_batch_size", "predict_batch_size",
               "max_seq_length"):
    if _flag(name) < 1:
      raise ValueError(f"--{name}={_flag(name)} must be positive.")


def _padded(examples, batch_size):
  """examples plus PaddingInputExamples up to a multiple of batch_size."""
  return list(examples) + [PaddingInputExample()
                           for _ in range(-len(examples) % batch_size)]


def _train(est, processor, label_list, tokenizer, num_train_steps):
  """Trains on the training set (or --cached_train_file)."""
  if FLAGS.cached_train_file:
    train_file = FLAGS.cached_train_file
  else:
    train_file = os.path.join(FLAGS.output_dir, "train.tf_record")
    file_based_convert_examples_to_features(
        processor.get_train_examples(FLAGS.data_dir), label_list,
        FLAGS.max_seq_length, tokenizer, train_file)
  logging.info("***** Running training: %d steps of batch size %d *****",
               num_train_steps, FLAGS.train_batch_size)
  est.train(input_fn=file_based_input_fn_builder(
      train_file, FLAGS.max_seq_length, is_training=True,
      drop_remainder=True), max_steps=num_train_steps)


def _padded_features_file(examples, batch_size, name, label_list,
                          tokenizer):
  """Writes `examples`, padded to whole batches, as output_dir/<name>.
  tf_record; returns (the padded examples, the file's path)."""
  padded = _padded(examples, batch_size)
  path = os.path.join(FLAGS.output_dir, f"{name}.tf_record")
  file_based_convert_examples_to_features(
      padded, label_list, FLAGS.max_seq_length, tokenizer, path)
  logging.info("***** Running %s: %d examples (%d actual, %d padding), "
               "batch size %d *****", name, len(padded), len(examples),
               len(padded) - len(examples), batch_size)
  return padded, path


def _evaluate(est, processor, label_list, tokenizer):
  """Evaluates on the dev set; writes output_dir/eval_results.txt."""
  examples = processor.get_dev_examples(FLAGS.data_dir)
  if not examples:
    raise ValueError(f"No dev examples in --data_dir={FLAGS.data_dir}.")
  padded, eval_file = _padded_features_file(
      examples, FLAGS.eval_batch_size, "eval", label_list, tokenizer)
  result = est.evaluate(input_fn=file_based_input_fn_builder(
      eval_file, FLAGS.max_seq_length, is_training=False,
      drop_remainder=True), steps=len(padded) // FLAGS.eval_batch_size)
  with tf.io.gfile.GFile(
      os.path.join(FLAGS.output_dir, "eval_results.txt"), "w") as writer:
    for key in sorted(result):
      logging.info("  %s = %s", key, result[key])
      writer.write(f"{key} = {result[key]}\n")
  return result


def _predict(est, processor, label_list, tokenizer, task_name):
  """Predicts the test set; writes output_dir/test_results.tsv."""
  try:
    examples = processor.get_test_examples(FLAGS.data_dir)
  except NotImplementedError:
    raise ValueError(f"--do_predict: task {task_name} has no test set "
                     "reader (as in the original).") from None
  _, predict_file = _padded_features_file(
      examples, FLAGS.predict_batch_size, "predict", label_list, tokenizer)
  results = est.predict(input_fn=file_based_input_fn_builder(
      predict_file, FLAGS.max_seq_length, is_training=False,
      drop_remainder=True))
  written = 0
  with tf.io.gfile.GFile(
      os.path.join(FLAGS.output_dir, "test_results.tsv"), "w") as writer:
    for prediction in results:
      if written == len(examples):
        break  # The rest is padding.
      writer.write("\t".join(str(p) for p in prediction["probabilities"]) +
                   "\n")
      written += 1
  if written != len(examples):
    raise ValueError(f"Prediction gave {written} results for "
                     f"{len(examples)} test examples.")


def main(_):
  """Trains, evaluates and/or predicts, as --do_train/eval/predict say."""
  _check_flags()
  run_common.prepare_devices()
  tokenization.validate_case_matches_checkpoint(FLAGS.do_lower_case,
                                                FLAGS.init_checkpoint)
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(
        f"--max_seq_length={FLAGS.max_seq_length}: the BERT model was only "
        f"trained up to sequence length "
        f"{bert_config.max_position_embeddings} (max_position_embeddings "
        f"of {FLAGS.bert_config_file}).")
  tf.io.gfile.makedirs(FLAGS.output_dir)
  task_name = FLAGS.task_name.lower()
  if task_name == "xnli":
    processor = XnliProcessor(language=FLAGS.xnli_language)
  else:
    processor = PROCESSORS[task_name]()
  label_list = processor.get_labels()
  tokenizer = tokenization.FullTokenizer(vocab_file=FLAGS.vocab_file,
                                         do_lower_case=FLAGS.do_lower_case)

  num_train_steps = num_warmup_steps = None
  if FLAGS.do_train:
    num_train_examples = len(processor.get_train_examples(FLAGS.data_dir))
    num_train_steps = int(num_train_examples / FLAGS.train_batch_size *
                          FLAGS.num_train_epochs)
    if num_train_steps < 1:
      raise ValueError(
          f"{num_train_examples} training examples, --train_batch_size="
          f"{FLAGS.train_batch_size} and --num_train_epochs="
          f"{FLAGS.num_train_epochs} make no training step.")
    num_warmup_steps = int(num_train_steps * FLAGS.warmup_proportion)

  init_checkpoint = run_common.init_checkpoint_for(
      FLAGS.init_checkpoint, bert_config, FLAGS.output_dir)
  model_fn = model_fn_builder(
      bert_config=bert_config, num_labels=len(label_list),
      init_checkpoint=init_checkpoint, learning_rate=FLAGS.learning_rate,
      num_train_steps=num_train_steps, num_warmup_steps=num_warmup_steps,
      use_tpu=FLAGS.use_tpu)
  est = run_common.make_estimator(
      model_fn, FLAGS.output_dir, train_batch_size=FLAGS.train_batch_size,
      eval_batch_size=FLAGS.eval_batch_size,
      predict_batch_size=FLAGS.predict_batch_size,
      init_checkpoint=init_checkpoint, tf_random_seed=FLAGS.tf_random_seed)

  if FLAGS.do_train:
    _train(est, processor, label_list, tokenizer, num_train_steps)
  if FLAGS.do_eval:
    _evaluate(est, processor, label_list, tokenizer)
  if FLAGS.do_predict:
    _predict(est, processor, label_list, tokenizer, task_name)


if __name__ == "__main__":
  run_common.run(main)
