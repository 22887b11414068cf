"""Fine-tunes BERT on SQuAD 1.1 / 2.0 and predicts answer spans.

    python -m mesh_tensorflow.bert.run_squad \
      --vocab_file=vocab.txt --bert_config_file=bert_config.json \
      --init_checkpoint=pretraining/model.ckpt-1000 --output_dir=squad \
      --do_train --train_file=train-v1.1.json \
      --do_predict --predict_file=dev-v1.1.json

Training reads the SQuAD JSON (squad_data), fits a start and an end
logit per token on BERT's sequence output ("cls/squad/output", as the
original) and minimizes their cross entropies. Prediction writes
predictions.json, nbest_predictions.json and, with
--version_2_with_negative, null_odds.json (squad_predictions); when the
predict file has gold answers it scores the predictions with SQuAD's
official exact match and F1 (squad_evaluation) into eval_results.json.

On CPU/GPU the mesh (--mesh_shape, --layout) runs on the placement
implementation over logical CPUs or GPUs; with --use_tpu on TPU cores
(SIMD). Bad flag values end with a one-paragraph error and exit status 1.
"""

import json
import os
import random

from absl import flags
from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator as estimator_lib
from mesh_tensorflow.randomness import tf_initializers
from mesh_tensorflow.bert import bert as bert_lib
from mesh_tensorflow.bert import optimization as optimization_lib
from mesh_tensorflow.bert import run_common
from mesh_tensorflow.bert import squad_data
from mesh_tensorflow.bert import squad_evaluation
from mesh_tensorflow.bert import squad_predictions
from mesh_tensorflow.bert import tokenization

# The original's names, from the modules they now live in.
SquadExample = squad_data.SquadExample
InputFeatures = squad_data.InputFeatures
FeatureWriter = squad_data.FeatureWriter
read_squad_examples = squad_data.read_squad_examples
convert_examples_to_features = squad_data.convert_examples_to_features
input_fn_builder = squad_data.input_fn_builder
RawResult = squad_predictions.RawResult
write_predictions = squad_predictions.write_predictions
get_final_text = squad_predictions.get_final_text

FLAGS = flags.FLAGS
define = run_common.define

define("string", "bert_config_file", None,
       "The BERT model's config JSON (its architecture).")
define("string", "vocab_file", None,
       "The vocabulary file the BERT model was trained on.")
define("string", "output_dir", None,
       "Where checkpoints and predictions are written.")
define("string", "train_file", None,
       "SQuAD JSON for training, e.g. train-v1.1.json.")
define("string", "predict_file", None,
       "SQuAD JSON to predict, e.g. dev-v1.1.json or test-v1.1.json.")
define("string", "init_checkpoint", None,
       "Checkpoint to start from (usually a pretrained BERT: ours, the "
       "original's or one of Google's releases).")
define("string", "cached_train_file", None,
       "Training features already written by a previous run "
       "(train.tf_record), instead of converting --train_file again.")
define("bool", "do_lower_case", True,
       "Lower-case the input: True for uncased models, False for cased.")
define("float", "max_optimized_variable_size", 1e7,
       "Do not optimize variables larger than this.")
define("integer", "max_seq_length", 384,
       "Tokens per input sequence after WordPiece tokenization: longer "
       "ones are cut, shorter ones padded.")
define("integer", "doc_stride", 128,
       "Tokens between the starts of a long context's windows.")
define("integer", "max_query_length", 64,
       "Questions longer than this many tokens are cut to it.")
define("bool", "do_train", False, "Whether to train.")
define("bool", "do_predict", False,
       "Whether to predict the answers of --predict_file.")
define("integer", "train_batch_size", 32, "Total batch size for training.")
define("integer", "predict_batch_size", 8,
       "Total batch size for predictions.")
define("float", "learning_rate", 5e-5, "The initial learning rate.")
define("bool", "clip_gradients", True, "Apply gradient clipping.")
define("string", "optimizer", "adam", "adam or adafactor.")
define("float", "num_train_epochs", 3.0,
       "Number of passes over the training examples.")
define("float", "warmup_proportion", 0.1,
       "Proportion of training with a linear learning-rate warm-up, e.g. "
       "0.1 = 10% of training.")
define("integer", "n_best_size", 20,
       "Answers per question in nbest_predictions.json.")
define("integer", "max_answer_length", 30,
       "The longest answer predicted, in tokens (start and end are "
       "predicted independently).")
define("bool", "verbose_logging", False,
       "Log the warnings of the prediction's text alignment (many are "
       "expected on SQuAD).")
define("bool", "version_2_with_negative", False,
       "SQuAD 2.0: some questions have no answer.")
define("float", "null_score_diff_threshold", 0.0,
       "Predict no answer when the null score minus the best non-null "
       "score is greater than this.")
define("integer", "tf_random_seed", None,
       "Seed of the initializers, dropout and shuffling (for repeatable "
       "runs).")
run_common.define_mesh_and_tpu_flags()

# The original trained on examples shuffled once with this seed.
_SHUFFLE_SEED = 12345


def create_model(bert_config, is_training, input_ids, input_mask, segment_ids,
                 mesh_shape=None, layout=None):
  """(start_logits, end_logits): mtf Tensors [batch, seq] of BERT's output.

  One dense layer "cls/squad/output" maps each token's hidden state to
  two logits (kernel: truncated normal, stddev 0.02). mesh_shape and
  layout (default: the flags) reach BertModel's mixture-of-experts layers.
  """
  if mesh_shape is None:
    mesh_shape = squad_data.flag_or_default("mesh_shape", "")
  if layout is None:
    layout = squad_data.flag_or_default("layout", "")
  model = bert_lib.BertModel(
      config=bert_config,
      is_training=is_training,
      input_ids=input_ids,
      input_mask=input_mask,
      token_type_ids=segment_ids,
      mesh_shape=mesh_shape,
      layout=layout)
  class_dim = mtf.Dimension("class", 2)
  logits = mtf.layers.dense(
      model.get_sequence_output(),
      reduced_dims=[model.model_dim],
      new_dims=[class_dim],
      # Seeded by the name, as BertModel's: every layout starts the same.
      kernel_initializer=tf_initializers.seeded(
          "truncated_normal_initializer",
          tf_initializers.name_seed("cls/squad/output/kernel"), stddev=0.02),
      name="cls/squad/output")
  start_logits, end_logits = mtf.unstack(logits, dim=class_dim)
  return start_logits, end_logits


def _position_loss(logits, positions, seq_dim):
  """Mean over the batch of -log softmax(logits)[position]."""
  one_hot = mtf.one_hot(positions, output_dim=seq_dim, dtype=logits.dtype)
  log_probs = mtf.log_softmax(logits, seq_dim)
  return -mtf.reduce_mean(
      mtf.reduce_sum(one_hot * log_probs, reduced_dim=seq_dim))


def model_fn_builder(bert_config, init_checkpoint, learning_rate,
                     num_train_steps, num_warmup_steps, use_tpu,
                     max_optimized_variable_size=None, optimizer=None,
                     clip_gradients=None):
  """The model_fn(features, labels, mode, params) of SQuAD (train, predict).

  The estimator (run_common.make_estimator) lowers onto params["mesh_impl"]
  and warm-starts training from init_checkpoint; this function only logs
  it. max_optimized_variable_size, optimizer and clip_gradients default to
  the flags of those names once parsed (else 1e7, "adam", True).
  """
  del use_tpu  # The estimator's mesh implementation decides.
  if max_optimized_variable_size is None:
    max_optimized_variable_size = squad_data.flag_or_default(
        "max_optimized_variable_size", 1e7)
  if optimizer is None:
    optimizer = squad_data.flag_or_default("optimizer", "adam")
  if clip_gradients is None:
    clip_gradients = squad_data.flag_or_default("clip_gradients", True)

  def model_fn(features, labels, mode, params):
    """Builds the mtf graph of `mode` and lowers it."""
    del labels
    if mode not in (estimator_lib.ModeKeys.TRAIN,
                    estimator_lib.ModeKeys.PREDICT):
      raise ValueError(f"SQuAD's model_fn supports modes train and infer "
                       f"(predict), not {mode!r}.")
    if init_checkpoint and mode == estimator_lib.ModeKeys.TRAIN:
      logging.info("Fine-tuning from %s", init_checkpoint)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "bert_mesh")
    batch_size, seq_length = features["input_ids"].shape.as_list()
    batch_dim = mtf.Dimension("batch", batch_size)
    seq_dim = mtf.Dimension("seq", seq_length)

    def import_feature(name, dims):
      return mtf.import_tf_tensor(mesh, features[name], dims)

    is_training = mode == estimator_lib.ModeKeys.TRAIN
    start_logits, end_logits = create_model(
        bert_config=bert_config,
        is_training=is_training,
        input_ids=import_feature("input_ids", [batch_dim, seq_dim]),
        input_mask=import_feature("input_mask", [batch_dim, seq_dim]),
        segment_ids=import_feature("segment_ids", [batch_dim, seq_dim]),
        mesh_shape=params["mesh_impl"].shape,
        layout=params["mesh_impl"].layout_rules)

    if is_training:
      start_loss = _position_loss(
          start_logits, import_feature("start_positions", [batch_dim]),
          seq_dim)
      end_loss = _position_loss(
          end_logits, import_feature("end_positions", [batch_dim]), seq_dim)
      total_loss = (start_loss + end_loss) / 2.0
      _, update_ops = optimization_lib.create_optimizer(
          total_loss, learning_rate, num_train_steps, num_warmup_steps,
          max_optimized_variable_size=max_optimized_variable_size,
          optimizer=optimizer, clip_gradients=clip_gradients)
      lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
      return estimator_lib.TPUEstimatorSpec(
          mode,
          loss=tf.cast(lowering.export_to_tf_tensor(total_loss), tf.float32),
          train_op=tf.group([lowering.lowered_operation(op)
                             for op in update_ops]))

    # The ids go through the mesh too, so that every mesh implementation
    # returns them with the logits of their batch.
    unique_ids = mtf.anonymize(import_feature("unique_ids", [batch_dim]))
    start_logits = mtf.anonymize(start_logits)
    end_logits = mtf.anonymize(end_logits)
    lowering = mtf.Lowering(graph, {mesh: params["mesh_impl"]})
    return estimator_lib.TPUEstimatorSpec(
        mode,
        predictions={
            "unique_ids": lowering.export_to_tf_tensor(unique_ids),
            "start_logits": lowering.export_to_tf_tensor(start_logits),
            "end_logits": lowering.export_to_tf_tensor(end_logits),
        })

  return model_fn


def validate_flags_or_throw(bert_config):
  """Raises ValueError naming the flag when the flags cannot work."""
  tokenization.validate_case_matches_checkpoint(FLAGS.do_lower_case,
                                                FLAGS.init_checkpoint)
  for name in ("vocab_file", "bert_config_file", "output_dir"):
    if not FLAGS[name].value:
      raise ValueError(f"--{name} is required.")
  if not FLAGS.do_train and not FLAGS.do_predict:
    raise ValueError("At least one of --do_train or --do_predict must be "
                     "set.")
  if FLAGS.do_train and not FLAGS.train_file:
    raise ValueError("--do_train needs --train_file.")
  if FLAGS.do_predict and not FLAGS.predict_file:
    raise ValueError("--do_predict needs --predict_file.")
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(
        f"--max_seq_length={FLAGS.max_seq_length} is longer than the "
        f"{bert_config.max_position_embeddings} positions the BERT model "
        f"was trained on (max_position_embeddings of "
        f"{FLAGS.bert_config_file}).")
  if FLAGS.max_seq_length <= FLAGS.max_query_length + 3:
    raise ValueError(
        f"--max_seq_length={FLAGS.max_seq_length} must be greater than "
        f"--max_query_length={FLAGS.max_query_length} + 3 ([CLS] and two "
        "[SEP]).")
  for name in ("doc_stride", "train_batch_size", "predict_batch_size",
               "n_best_size", "max_answer_length"):
    if FLAGS[name].value < 1:
      raise ValueError(f"--{name}={FLAGS[name].value} must be positive.")
  if FLAGS.optimizer not in ("adam", "adafactor"):
    raise ValueError(f"--optimizer={FLAGS.optimizer!r}: use 'adam' or "
                     "'adafactor'.")


def _check_batch_size(name):
  """A batch size must split over the mesh dimension the batch is on."""
  value = FLAGS[name].value
  shape = run_common.mesh_shape()
  axis = run_common.layout_rules().tensor_dimension_to_mesh_axis(
      mtf.Dimension("batch", value), shape)
  if axis is not None and value % shape.dims[axis].size:
    dim = shape.dims[axis]
    raise ValueError(
        f"--{name}={value} does not divide by mesh dimension {dim.name!r} "
        f"of size {dim.size} (--mesh_shape={FLAGS.mesh_shape}, --layout "
        "puts the batch on it).")


def _train(estimator, tokenizer, train_examples, num_train_steps):
  """Writes the training features (unless cached) and trains."""
  if FLAGS.cached_train_file:
    train_file = FLAGS.cached_train_file
  else:
    writer = FeatureWriter(
        filename=os.path.join(FLAGS.output_dir, "train.tf_record"),
        is_training=True)
    convert_examples_to_features(
        examples=train_examples, tokenizer=tokenizer,
        max_seq_length=FLAGS.max_seq_length, doc_stride=FLAGS.doc_stride,
        max_query_length=FLAGS.max_query_length, is_training=True,
        output_fn=writer.process_feature)
    writer.close()
    train_file = writer.filename
    logging.info("Training: %d examples, %d features, batch size %d, %d "
                 "steps", len(train_examples), writer.num_features,
                 FLAGS.train_batch_size, num_train_steps)
  estimator.train(
      input_fn=input_fn_builder(
          input_file=train_file, seq_length=FLAGS.max_seq_length,
          is_training=True, drop_remainder=True),
      max_steps=num_train_steps)


def _predict(estimator, tokenizer, init_checkpoint):
  """Predicts --predict_file, writes the prediction files; returns the
  predictions {question id: text}."""
  eval_examples = read_squad_examples(
      input_file=FLAGS.predict_file, is_training=False)
  writer = FeatureWriter(
      filename=os.path.join(FLAGS.output_dir, "eval.tf_record"),
      is_training=False)
  eval_features = []

  def append_feature(feature):
    eval_features.append(feature)
    writer.process_feature(feature)

  convert_examples_to_features(
      examples=eval_examples, tokenizer=tokenizer,
      max_seq_length=FLAGS.max_seq_length, doc_stride=FLAGS.doc_stride,
      max_query_length=FLAGS.max_query_length, is_training=False,
      output_fn=append_feature)
  writer.close()
  logging.info("Predicting: %d examples, %d features, batch size %d",
               len(eval_examples), len(eval_features),
               FLAGS.predict_batch_size)

  # Predicting without training: output_dir's model, else (as the
  # original's init_from_checkpoint did) the --init_checkpoint's weights.
  checkpoint_path = None
  if estimator.latest_checkpoint() is None and init_checkpoint:
    checkpoint_path = init_checkpoint
  all_results = []
  for result in estimator.predict(
      input_fn_builder(input_file=writer.filename,
                       seq_length=FLAGS.max_seq_length, is_training=False,
                       drop_remainder=False),
      checkpoint_path=checkpoint_path, yield_single_examples=True):
    unique_id = int(result["unique_ids"])
    if unique_id < squad_data.FIRST_UNIQUE_ID:
      continue  # Padding of the last batch.
    all_results.append(RawResult(
        unique_id=unique_id,
        start_logits=[float(x) for x in result["start_logits"].flat],
        end_logits=[float(x) for x in result["end_logits"].flat]))

  return write_predictions(
      eval_examples, eval_features, all_results, FLAGS.n_best_size,
      FLAGS.max_answer_length, FLAGS.do_lower_case,
      os.path.join(FLAGS.output_dir, "predictions.json"),
      os.path.join(FLAGS.output_dir, "nbest_predictions.json"),
      os.path.join(FLAGS.output_dir, "null_odds.json"))


def _score(predictions):
  """Official scores of the predictions, if the predict file has answers:
  written to eval_results.json, printed and returned (else None)."""
  with tf.io.gfile.GFile(FLAGS.predict_file, "r") as f:
    dataset = json.load(f)["data"]
  if not squad_evaluation.has_answers(dataset):
    return None
  scores = squad_evaluation.evaluate(dataset, predictions,
                                     FLAGS.version_2_with_negative)
  with tf.io.gfile.GFile(
      os.path.join(FLAGS.output_dir, "eval_results.json"), "w") as f:
    f.write(json.dumps(scores, indent=2) + "\n")
  logging.info("SQuAD scores: %s", scores)
  print(json.dumps(scores))
  return scores


def main(_):
  """Trains and/or predicts as the flags say."""
  run_common.prepare_devices()
  if not FLAGS.bert_config_file:
    raise ValueError("--bert_config_file is required.")
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  validate_flags_or_throw(bert_config)
  for name in ("train_batch_size", "predict_batch_size"):
    _check_batch_size(name)
  tf.io.gfile.makedirs(FLAGS.output_dir)
  tokenizer = tokenization.FullTokenizer(
      vocab_file=FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case)

  train_examples = None
  num_train_steps = num_warmup_steps = None
  if FLAGS.do_train:
    train_examples = read_squad_examples(
        input_file=FLAGS.train_file, is_training=True)
    num_train_steps = int(len(train_examples) / FLAGS.train_batch_size *
                          FLAGS.num_train_epochs)
    if num_train_steps < 1:
      raise ValueError(
          f"--train_file={FLAGS.train_file} has {len(train_examples)} "
          f"examples: with --train_batch_size={FLAGS.train_batch_size} and "
          f"--num_train_epochs={FLAGS.num_train_epochs} that is no "
          "training step.")
    num_warmup_steps = int(num_train_steps * FLAGS.warmup_proportion)
    # Shuffled once here, so the input's shuffle buffer can stay small.
    random.Random(_SHUFFLE_SEED).shuffle(train_examples)

  model_fn = model_fn_builder(
      bert_config=bert_config,
      init_checkpoint=FLAGS.init_checkpoint,
      learning_rate=FLAGS.learning_rate,
      num_train_steps=num_train_steps,
      num_warmup_steps=num_warmup_steps,
      use_tpu=FLAGS.use_tpu)
  init_checkpoint = run_common.init_checkpoint_for(
      FLAGS.init_checkpoint, bert_config, FLAGS.output_dir)
  estimator = run_common.make_estimator(
      model_fn, FLAGS.output_dir,
      train_batch_size=FLAGS.train_batch_size,
      predict_batch_size=FLAGS.predict_batch_size,
      init_checkpoint=init_checkpoint, tf_random_seed=FLAGS.tf_random_seed)

  if FLAGS.do_train:
    _train(estimator, tokenizer, train_examples, num_train_steps)
  if FLAGS.do_predict:
    _score(_predict(estimator, tokenizer, init_checkpoint))


if __name__ == "__main__":
  run_common.run(main)
