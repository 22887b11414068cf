"""Masked-LM and next-sentence pretraining of BERT: an absl-flag binary.

Reads BERT's pretraining TFRecords (as `create_pretraining_data` writes
them), trains `BertModel` on the sum of the masked-LM and next-sentence
losses (plus the mixture-of-experts loss of MoE configs) and evaluates the
masked-LM and next-sentence accuracies and losses:

  python -m mesh_tensorflow.bert.run_pretraining \
    --bert_config_file=bert_config.json --output_dir=/tmp/pretraining \
    --input_train_files=train.tfrecord --input_eval_files=eval.tfrecord \
    --mode=train_and_eval --num_train_steps=1000 --steps_per_eval=500

Google's BERT names are accepted too: `--input_file` gives the files of
both training and evaluation (unless --input_train_files or
--input_eval_files say otherwise), and `--do_train` / `--do_eval` choose the
mode (both: train_and_eval).

Differences from the original, which did not do what its flags promised:
--mode=train trained (the original's loop only ran in the eval modes), and
--mode=eval evaluates once whatever the checkpoint's step (the original
skipped evaluating a checkpoint at --num_train_steps). Evaluation reads
the evaluation files once, at most --max_eval_steps batches, instead of
repeating them, so no record counts twice; the masked-LM metrics are
weighted means over every prediction of the whole evaluation set. The
results go to `eval_results_<step>.txt` (the original's name) and
`eval_results.txt` (Google BERT's, the latest) in --output_dir.
"""

import os

from absl import flags
from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator as mtf_estimator
from mesh_tensorflow.bert import bert as bert_lib
from mesh_tensorflow.bert import optimization as optimization_lib
from mesh_tensorflow.bert import run_common

FLAGS = flags.FLAGS

TRAIN, EVAL, TRAIN_AND_EVAL = "train", "eval", "train_and_eval"
MODES = (TRAIN, EVAL, TRAIN_AND_EVAL)
OPTIMIZERS = ("adam", "adafactor")


def _define_flags():
  """The binary's flags (each defined once per process, see run_common)."""
  define = run_common.define
  define("string", "bert_config_file", None,
         "The model's JSON config (Google BERT's keys plus mtf ones).")
  define("string", "input_train_files", None,
         "Training TFRecord files: comma-separated globs.")
  define("string", "input_eval_files", None,
         "Evaluation TFRecord files: comma-separated globs.")
  define("string", "input_file", None,
         "Google BERT's name: TFRecord files (comma-separated globs) for "
         "training and for evaluation, where --input_train_files or "
         "--input_eval_files is not given.")
  define("string", "output_dir", None,
         "Where checkpoints, summaries and eval results are written.")
  define("string", "init_checkpoint", None,
         "Checkpoint to start from (ours, the original's, or a Google BERT "
         "release): its weights only.")
  define("integer", "max_seq_length", 128,
         "Tokens per sequence; must match the records.")
  define("integer", "max_predictions_per_seq", 20,
         "Masked-LM predictions per sequence; must match the records.")
  define("enum", "mode", TRAIN_AND_EVAL, "What to run.",
         enum_values=list(MODES))
  define("bool", "do_train", False,
         "Google BERT's name: train (with --do_eval: train_and_eval); "
         "overrides --mode.")
  define("bool", "do_eval", False,
         "Google BERT's name: evaluate (with --do_train: train_and_eval); "
         "overrides --mode.")
  define("integer", "train_batch_size", 32, "Global training batch size.")
  define("integer", "eval_batch_size", 8, "Global evaluation batch size.")
  define("float", "learning_rate", 5e-5, "Peak learning rate.")
  define("bool", "clip_gradients", True,
         "Clip gradients to a global norm of 1.")
  define("enum", "optimizer", "adam", "The optimizer.",
         enum_values=list(OPTIMIZERS))
  define("integer", "num_train_steps", 100000, "Training steps in all.")
  define("integer", "num_warmup_steps", 10000,
         "Steps of linear learning-rate warm-up.")
  define("integer", "steps_per_eval", 5000,
         "Training steps between evaluations in train_and_eval.")
  define("integer", "max_eval_steps", 100,
         "At most this many evaluation batches (0: all).")
  define("integer", "tf_random_seed", None,
         "Seed of initializers and input shuffling (for reproducible runs).")
  run_common.define_mesh_and_tpu_flags()


_define_flags()


def input_fn_builder(input_files, max_seq_length, max_predictions_per_seq,
                     is_training, num_cpu_threads=4):
  """input_fn(params) of batches of BERT's pretraining features (int32).

  Batches have params["batch_size"] examples (the remainder is dropped: the
  mesh needs fixed shapes). Training shuffles the files and the records and
  repeats forever; evaluation reads the files once, in order.
  """
  input_files = list(input_files)
  int_features = ("input_ids", "input_mask", "segment_ids")
  prediction_features = ("masked_lm_positions", "masked_lm_ids")
  spec = {name: tf.io.FixedLenFeature([max_seq_length], tf.int64)
          for name in int_features}
  spec.update({name: tf.io.FixedLenFeature([max_predictions_per_seq],
                                           tf.int64)
               for name in prediction_features})
  spec["masked_lm_weights"] = tf.io.FixedLenFeature(
      [max_predictions_per_seq], tf.float32)
  spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)

  def decode(record):
    example = tf.io.parse_single_example(record, spec)
    # tf.Example stores int64; the mesh (and TPUs) want int32.
    return {name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
            for name, t in example.items()}

  def input_fn(params):
    batch_size = params["batch_size"]
    if is_training:
      files = tf.data.Dataset.from_tensor_slices(tf.constant(input_files))
      files = files.repeat().shuffle(len(input_files))
      records = files.interleave(
          tf.data.TFRecordDataset,
          cycle_length=max(1, min(num_cpu_threads, len(input_files))),
          num_parallel_calls=tf.data.AUTOTUNE)
      records = records.shuffle(buffer_size=100)
    else:
      records = tf.data.TFRecordDataset(input_files)
    return records.map(decode, num_parallel_calls=num_cpu_threads).batch(
        batch_size, drop_remainder=True)

  return input_fn


def model_fn_builder(bert_config, init_checkpoint, learning_rate,
                     num_train_steps, num_warmup_steps, optimizer="adam",
                     clip_gradients=True):
  """model_fn of an mtf.estimator TPUEstimator: BERT's pretraining losses.

  Args:
    bert_config: a bert.BertConfig.
    init_checkpoint: accepted as the original did, which did not use it
      either: the estimator warm-starts (RunConfig's init_checkpoint, see
      run_common.make_estimator).
    learning_rate, num_train_steps, num_warmup_steps: the learning-rate
      schedule (optimization.create_optimizer).
    optimizer: "adam" or "adafactor" (the original read --optimizer).
    clip_gradients: clip to a global norm of 1 (the original read
      --clip_gradients).

  Returns:
    model_fn(features, labels, mode, params), lowering onto
    params["mesh_impl"].
  """
  del init_checkpoint

  def model_fn(features, labels, mode, params):
    del labels
    mesh_impl = params["mesh_impl"]
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "bert_mesh")
    inputs = _import_features(mesh, features)
    is_training = mode == mtf_estimator.ModeKeys.TRAIN
    model = bert_lib.BertModel(
        config=bert_config, is_training=is_training,
        input_ids=inputs["input_ids"], input_mask=inputs["input_mask"],
        token_type_ids=inputs["segment_ids"],
        mesh_shape=mesh_impl.shape, layout=mesh_impl.layout_rules)
    (masked_lm_loss, masked_lm_example_loss,
     masked_lm_logits) = model.get_masked_lm_output(
         inputs["masked_lm_positions"], inputs["masked_lm_ids"],
         inputs["masked_lm_weights"])
    (next_sentence_loss, next_sentence_example_loss,
     next_sentence_logits) = model.get_next_sentence_output(
         inputs["next_sentence_labels"])
    total_loss = masked_lm_loss + next_sentence_loss

    update_ops = []
    if is_training:
      _, update_ops = optimization_lib.create_optimizer(
          total_loss + model.get_extra_loss(), learning_rate,
          num_train_steps, num_warmup_steps, optimizer=optimizer,
          clip_gradients=clip_gradients)
    else:
      masked_lm_predictions = mtf.argmax(masked_lm_logits, model.vocab_dim)
      next_sentence_predictions = mtf.argmax(
          next_sentence_logits, next_sentence_logits.shape.dims[-1])

    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    tf_loss = tf.cast(lowering.export_to_tf_tensor(total_loss), tf.float32)
    if is_training:
      return mtf_estimator.TPUEstimatorSpec(
          mode, loss=tf_loss, train_op=tf.group(
              [lowering.lowered_operation(op) for op in update_ops]))
    export = lowering.export_to_tf_tensor
    return mtf_estimator.TPUEstimatorSpec(
        mode, loss=tf_loss, eval_metrics=(_metric_fn, [
            export(masked_lm_example_loss), export(masked_lm_predictions),
            features["masked_lm_ids"], features["masked_lm_weights"],
            export(next_sentence_example_loss),
            export(next_sentence_predictions),
            tf.squeeze(features["next_sentence_labels"], 1)]))

  return model_fn


def _import_features(mesh, features):
  """The features as mtf tensors: [batch, seq] and [batch, max_pred_seq]
  (next_sentence_labels [batch])."""
  input_ids = features["input_ids"]
  batch_dim = mtf.Dimension("batch", input_ids.shape[0])
  seq_dim = mtf.Dimension("seq", input_ids.shape[1])
  predictions_dim = mtf.Dimension(
      "max_pred_seq", features["masked_lm_positions"].shape[1])
  dims = {"input_ids": seq_dim, "input_mask": seq_dim,
          "segment_ids": seq_dim, "masked_lm_positions": predictions_dim,
          "masked_lm_ids": predictions_dim,
          "masked_lm_weights": predictions_dim}
  inputs = {name: mtf.import_tf_tensor(mesh, features[name],
                                       [batch_dim, dim])
            for name, dim in dims.items()}
  inputs["next_sentence_labels"] = mtf.import_tf_tensor(
      mesh, tf.squeeze(features["next_sentence_labels"], 1), [batch_dim])
  return inputs


def _metric_fn(masked_lm_example_loss, masked_lm_predictions, masked_lm_ids,
               masked_lm_weights, next_sentence_example_loss,
               next_sentence_predictions, next_sentence_labels):
  """Accuracies and losses, accumulated over the whole evaluation set (the
  masked-LM ones weighted by masked_lm_weights: padding counts 0)."""
  metrics = mtf_estimator.metrics
  masked_lm_correct = tf.cast(
      tf.equal(masked_lm_predictions, masked_lm_ids), tf.float32)
  next_sentence_correct = tf.cast(
      tf.equal(next_sentence_predictions, next_sentence_labels), tf.float32)
  return {
      "masked_lm_accuracy": metrics.mean(masked_lm_correct,
                                         weights=masked_lm_weights),
      "masked_lm_loss": metrics.mean(masked_lm_example_loss,
                                     weights=masked_lm_weights),
      "next_sentence_accuracy": metrics.mean(next_sentence_correct),
      "next_sentence_loss": metrics.mean(next_sentence_example_loss),
  }


def _mode():
  """--mode, or the mode --do_train / --do_eval choose."""
  if FLAGS.mode not in MODES:
    raise ValueError(f"--mode={FLAGS.mode!r}: expected one of {MODES}.")
  if not (FLAGS.do_train or FLAGS.do_eval):
    return FLAGS.mode
  mode = (TRAIN_AND_EVAL if FLAGS.do_train and FLAGS.do_eval else
          TRAIN if FLAGS.do_train else EVAL)
  if FLAGS["mode"].present and FLAGS.mode != mode:
    raise ValueError(f"--mode={FLAGS.mode} contradicts --do_train="
                     f"{FLAGS.do_train} --do_eval={FLAGS.do_eval} (which "
                     f"mean --mode={mode}): give one or the other.")
  return mode


def _require(name, why):
  if not FLAGS[name].value:
    raise ValueError(f"--{name} is required: {why}.")


def _input_files(name):
  """The files of --<name> (comma-separated globs), else of --input_file."""
  if not (FLAGS[name].value or FLAGS.input_file):
    raise ValueError(f"--{name} (or --input_file) is required: the "
                     "pretraining TFRecord files.")
  flag = name if FLAGS[name].value else "input_file"
  files = []
  for pattern in FLAGS[flag].value.split(","):
    pattern = pattern.strip()
    if not pattern:
      continue
    matches = sorted(tf.io.gfile.glob(pattern))
    if not matches:
      raise ValueError(f"--{flag}: {pattern!r} matches no file.")
    files.extend(matches)
  if not files:
    raise ValueError(f"--{flag}={FLAGS[flag].value!r} names no file.")
  logging.info("--%s: %d file(s): %s", flag, len(files), ", ".join(files))
  return files


def _read_config():
  _require("bert_config_file", "the model's JSON config")
  path = FLAGS.bert_config_file
  if not tf.io.gfile.exists(path):
    raise ValueError(f"--bert_config_file={path!r}: no such file.")
  try:
    return bert_lib.BertConfig.from_json_file(path)
  except (ValueError, TypeError, KeyError) as e:
    raise ValueError(f"--bert_config_file={path!r}: {e}") from None


def _check_sizes(bert_config):
  for name in ("max_seq_length", "max_predictions_per_seq",
               "train_batch_size", "eval_batch_size"):
    if FLAGS[name].value < 1:
      raise ValueError(f"--{name}={FLAGS[name].value}: must be positive.")
  # Learned absolute positions end at max_position_embeddings (relative
  # attention has no such limit).
  max_positions = bert_config.max_position_embeddings
  if (bert_config.position_signal == "embedding" and
      FLAGS.max_seq_length > max_positions):
    raise ValueError(
        f"--max_seq_length={FLAGS.max_seq_length} is longer than the "
        f"model's max_position_embeddings ({max_positions}) in "
        f"--bert_config_file={FLAGS.bert_config_file!r}.")


def _write_eval_results(results):
  """Logs the results and writes them to eval_results_<step>.txt and
  eval_results.txt in --output_dir."""
  lines = [f"{key} = {results[key]}" for key in sorted(results)]
  logging.info("Eval results: %s", ", ".join(lines))
  names = (f"eval_results_{int(results['global_step'])}.txt",
           "eval_results.txt")
  for name in names:
    with tf.io.gfile.GFile(os.path.join(FLAGS.output_dir, name), "w") as f:
      f.write("\n".join(lines) + "\n")


def _current_step(bert_estimator):
  if bert_estimator.latest_checkpoint() is None:
    return 0
  return int(bert_estimator.get_variable_value("global_step"))


def main(_):
  run_common.prepare_devices()
  mode = _mode()
  bert_config = _read_config()
  _require("output_dir", "where checkpoints and eval results go")
  _check_sizes(bert_config)
  if FLAGS.optimizer not in OPTIMIZERS:
    raise ValueError(f"--optimizer={FLAGS.optimizer!r}: expected one of "
                     f"{OPTIMIZERS}.")
  training = mode in (TRAIN, TRAIN_AND_EVAL)
  evaluating = mode in (EVAL, TRAIN_AND_EVAL)
  train_files = _input_files("input_train_files") if training else None
  eval_files = _input_files("input_eval_files") if evaluating else None
  tf.io.gfile.makedirs(FLAGS.output_dir)

  model_fn = model_fn_builder(
      bert_config, FLAGS.init_checkpoint, FLAGS.learning_rate,
      FLAGS.num_train_steps, FLAGS.num_warmup_steps,
      optimizer=FLAGS.optimizer, clip_gradients=FLAGS.clip_gradients)
  bert_estimator = run_common.make_estimator(
      model_fn, FLAGS.output_dir, train_batch_size=FLAGS.train_batch_size,
      eval_batch_size=FLAGS.eval_batch_size,
      init_checkpoint=run_common.init_checkpoint_for(
          FLAGS.init_checkpoint, bert_config, FLAGS.output_dir),
      tf_random_seed=FLAGS.tf_random_seed)

  def evaluate():
    results = bert_estimator.evaluate(
        input_fn_builder(eval_files, FLAGS.max_seq_length,
                         FLAGS.max_predictions_per_seq, is_training=False),
        steps=FLAGS.max_eval_steps or None)
    _write_eval_results(results)

  if not training:
    evaluate()
    return
  train_input_fn = input_fn_builder(
      train_files, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
      is_training=True)
  step = _current_step(bert_estimator)
  if step >= FLAGS.num_train_steps:
    logging.info("Global step %d >= --num_train_steps=%d: nothing to train.",
                 step, FLAGS.num_train_steps)
  while step < FLAGS.num_train_steps:
    if mode == TRAIN_AND_EVAL:
      step = min(step + max(1, FLAGS.steps_per_eval), FLAGS.num_train_steps)
    else:
      step = FLAGS.num_train_steps
    bert_estimator.train(train_input_fn, max_steps=step)
    if evaluating:
      evaluate()


if __name__ == "__main__":
  run_common.run(main)
