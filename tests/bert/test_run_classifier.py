"""run_classifier: the GLUE readers, feature conversion and the binary.

The binary's main runs in this process (flags parsed for each call, then
reset) on the default `batch:8` mesh over the 8 logical CPUs: it
fine-tunes the tiny config on a generated MRPC task from the pretraining
checkpoint, and it warm-starts from a TF1 name-based checkpoint written
here with `tf.compat.v1.train.Saver` under the original's variable names.
"""

import os

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert import bert as bert_lib
from mesh_tensorflow.bert import example_data
from mesh_tensorflow.bert import run_classifier
from mesh_tensorflow.bert import run_common
from mesh_tensorflow.bert import tokenization
from tests import mtf_testing
from tests.bert import generated_data
from tests.bert import numpy_bert
from tests.bert import test_bert

FLAGS = flags.FLAGS
SEQ = 16  # "[CLS] the a and the b . [SEP] a c is with the d . [SEP]"


def _write(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join("\t".join(row) + "\n" for row in rows))


def _fields(examples):
  return [(e.guid, e.text_a, e.text_b, e.label) for e in examples]


# ------------------------------------------------------------- processors


def test_mrpc_reads_glue_columns_and_keeps_quotes(tmp_path):
  header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
  _write(tmp_path / "train.tsv", [
      header, ["1", "702876", "702977", 'He said " hi .', "He greeted ."],
      ["0", "2108705", "2108831", "Yucaipa owned it .", "It was sold ."]])
  _write(tmp_path / "dev.tsv", [header, ["0", "1", "2", "a b", "c d"]])
  _write(tmp_path / "test.tsv", [
      ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
      ["0", "1089874", "1089925", "PCCW 's chief .", "Mr Lu ."]])
  processor = run_classifier.MrpcProcessor()
  assert processor.get_labels() == ["0", "1"]
  assert _fields(processor.get_train_examples(str(tmp_path))) == [
      ("train-1", 'He said " hi .', "He greeted .", "1"),
      ("train-2", "Yucaipa owned it .", "It was sold .", "0")]
  assert _fields(processor.get_dev_examples(str(tmp_path))) == [
      ("dev-1", "a b", "c d", "0")]
  assert _fields(processor.get_test_examples(str(tmp_path))) == [
      ("test-1", "PCCW 's chief .", "Mr Lu .", "0")]


def test_cola_has_no_header_except_in_its_test_file(tmp_path):
  _write(tmp_path / "train.tsv", [
      ["gj04", "1", "", "Our friends won't buy this analysis ."],
      ["gj04", "0", "*", "They drank the pub ."]])
  _write(tmp_path / "dev.tsv", [["cj99", "1", "", "The sailors rode ."]])
  _write(tmp_path / "test.tsv", [["index", "sentence"],
                                 ["0", "Bill whistled past the house ."]])
  processor = run_classifier.ColaProcessor()
  assert processor.get_labels() == ["0", "1"]
  assert _fields(processor.get_train_examples(str(tmp_path))) == [
      ("train-0", "Our friends won't buy this analysis .", None, "1"),
      ("train-1", "They drank the pub .", None, "0")]
  assert _fields(processor.get_dev_examples(str(tmp_path))) == [
      ("dev-0", "The sailors rode .", None, "1")]
  assert _fields(processor.get_test_examples(str(tmp_path))) == [
      ("test-1", "Bill whistled past the house .", None, "0")]


def _mnli_row(index, s1, s2, labels):
  return [str(index), "31193", f"{index}n", "government", "( ( b ) )",
          "( c )", "(ROOT (S b))", "(ROOT (S c))", s1, s2] + labels


def test_mnli_reads_sentences_8_9_and_the_gold_label(tmp_path):
  _write(tmp_path / "train.tsv", [
      ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
       "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
       "sentence1", "sentence2", "label1", "gold_label"],
      _mnli_row(0, "Conceptually cream .", "Product and geography .",
                ["neutral", "neutral"])])
  _write(tmp_path / "dev_matched.tsv", [
      ["index"] * 16,
      _mnli_row(7, "The new rights .", "Everyone likes it .",
                ["neutral", "entailment", "neutral", "neutral", "neutral",
                 "entailment"])])
  _write(tmp_path / "test_matched.tsv", [
      ["index"] * 10, _mnli_row(3, "Hierbas .", "Sweet .", [])])
  processor = run_classifier.MnliProcessor()
  assert processor.get_labels() == ["contradiction", "entailment", "neutral"]
  assert _fields(processor.get_train_examples(str(tmp_path))) == [
      ("train-0", "Conceptually cream .", "Product and geography .",
       "neutral")]
  assert _fields(processor.get_dev_examples(str(tmp_path))) == [
      ("dev_matched-7", "The new rights .", "Everyone likes it .",
       "entailment")]
  assert _fields(processor.get_test_examples(str(tmp_path))) == [
      ("test-3", "Hierbas .", "Sweet .", "contradiction")]


def test_xnli_reads_the_language_of_the_multilingual_dev_file(tmp_path):
  _write(tmp_path / "multinli" / "multinli.train.zh.tsv", [
      ["premise", "hypo", "label"], ["他 说", "妈妈 回来 了", "neutral"],
      ["他 说", "他 没 说", "contradictory"]])
  dev = [["language", "gold_label", "sentence1_binary_parse",
          "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
          "sentence1", "sentence2", "promptID", "pairID", "genre"]]
  for language, label, s1, s2 in (("en", "neutral", "He said .", "Mom ."),
                                  ("zh", "entailment", "他 说", "他 说 了"),
                                  ("de", "neutral", "Er sagte .", "Mama .")):
    dev.append([language, label, "", "", "", "", s1, s2, "1", "2", "x"])
  _write(tmp_path / "xnli.dev.tsv", dev)
  processor = run_classifier.XnliProcessor()
  assert processor.language == "zh"
  assert processor.get_labels() == ["contradiction", "entailment", "neutral"]
  assert _fields(processor.get_train_examples(str(tmp_path))) == [
      ("train-1", "他 说", "妈妈 回来 了", "neutral"),
      ("train-2", "他 说", "他 没 说", "contradiction")]
  assert _fields(processor.get_dev_examples(str(tmp_path))) == [
      ("dev-2", "他 说", "他 说 了", "entailment")]
  assert _fields(run_classifier.XnliProcessor("de").get_dev_examples(
      str(tmp_path))) == [("dev-3", "Er sagte .", "Mama .", "neutral")]


def test_a_missing_file_or_column_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="dev.tsv"):
    run_classifier.MrpcProcessor().get_dev_examples(str(tmp_path))
  _write(tmp_path / "train.tsv", [["Quality"], ["1", "2", "3"]])
  with pytest.raises(ValueError, match="MRPC train: a row has 3"):
    run_classifier.MrpcProcessor().get_train_examples(str(tmp_path))


# ------------------------------------------------------------ features


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  vocab = generated_data.write_vocab(
      tmp_path_factory.mktemp("vocab") / "vocab.txt")
  return tokenization.FullTokenizer(vocab, do_lower_case=True)


def _ids(tokenizer, text):
  return tokenizer.convert_tokens_to_ids(text.split())


def test_pair_is_cls_a_sep_b_sep_with_segments_and_padding(tokenizer):
  example = run_classifier.InputExample("x", "The cat and the dog.",
                                        "A red is with the blue.", "1")
  f = run_classifier.convert_single_example(0, example, ["0", "1"], 20,
                                            tokenizer)
  tokens = ("[CLS] the cat and the dog . [SEP] "
            "a red is with the blue . [SEP]")
  assert f.input_ids == _ids(tokenizer, tokens) + [0] * 4
  assert f.input_mask == [1] * 16 + [0] * 4
  assert f.segment_ids == [0] * 8 + [1] * 8 + [0] * 4
  assert (f.label_id, f.is_real_example) == (1, True)


def test_truncation_pops_the_longer_text_and_single_texts(tokenizer):
  example = run_classifier.InputExample(
      "x", "the cat and the dog .", "a red is with the blue .", "0")
  f = run_classifier.convert_single_example(0, example, ["0", "1"], 10,
                                            tokenizer)
  # 6 + 7 tokens into 7: b loses 3 and a 2 (the longer one, b on ties).
  assert f.input_ids == _ids(
      tokenizer, "[CLS] the cat and the [SEP] a red is [SEP]")
  assert f.segment_ids == [0] * 6 + [1] * 4
  single = run_classifier.InputExample("y", "the cat and the dog .",
                                       label="1")
  [f] = run_classifier.convert_examples_to_features([single], ["0", "1"], 5,
                                                    tokenizer)
  assert f.input_ids == _ids(tokenizer, "[CLS] the cat and [SEP]")
  assert f.segment_ids == [0] * 5 and f.input_mask == [1] * 5


def test_padding_example_and_unknown_label(tokenizer):
  f = run_classifier.convert_single_example(
      0, run_classifier.PaddingInputExample(), ["0", "1"], 4, tokenizer)
  assert (f.input_ids, f.input_mask, f.segment_ids) == ([0] * 4,) * 3
  assert (f.label_id, f.is_real_example) == (0, False)
  with pytest.raises(ValueError, match="label 'maybe' is not one of"):
    run_classifier.convert_single_example(
        0, run_classifier.InputExample("z", "a", label="maybe"), ["0", "1"],
        4, tokenizer)


def test_tfrecords_and_in_memory_inputs_agree(tokenizer, tmp_path):
  examples = [run_classifier.InputExample(str(i), "the cat", "a dog",
                                          str(i % 2)) for i in range(3)]
  examples.append(run_classifier.PaddingInputExample())
  path = str(tmp_path / "x.tf_record")
  run_classifier.file_based_convert_examples_to_features(
      examples, ["0", "1"], 8, tokenizer, path)
  from_file = run_classifier.file_based_input_fn_builder(
      path, 8, is_training=False, drop_remainder=True)({"batch_size": 2})
  features = run_classifier.convert_examples_to_features(
      examples, ["0", "1"], 8, tokenizer)
  in_memory = run_classifier.input_fn_builder(
      features, 8, is_training=False, drop_remainder=True)({"batch_size": 2})
  batches = list(zip(from_file, in_memory))
  assert len(batches) == 2
  for a, b in batches:
    assert sorted(a) == sorted(b)
    for name in a:
      assert a[name].dtype == tf.int32
      np.testing.assert_array_equal(a[name], b[name])
  np.testing.assert_array_equal(batches[1][0]["is_real_example"], [1, 0])
  np.testing.assert_array_equal(batches[1][0]["label_ids"], [0, 0])


# -------------------------------------------------------------- the binary


def run_main(**flag_values):
  """run_classifier.main with these flags (others at their defaults)."""
  argv = ["run_classifier"] + [f"--{name}={value}" for name, value in
                               flag_values.items()]
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    try:
      run_classifier.main(FLAGS(argv))
    finally:
      FLAGS.unparse_flags()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """The flags of the vocabulary and tiny config (those of the
  pretraining run) and the task."""
  root = tmp_path_factory.mktemp("classifier_files")
  return {"vocab_file": generated_data.write_vocab(root / "vocab.txt"),
          "bert_config_file": generated_data.write_config(
              root / "bert_config.json"),
          "task_name": "MRPC", "max_seq_length": SEQ}


def _read_results(path):
  with open(path) as f:
    return {k: float(v) for k, v in (line.split(" = ") for line in f)}


NUM_TRAIN, NUM_DEV, NUM_TEST = 512, 60, 20


def write_mrpc(data_dir):
  """The README's MRPC example data (example_data.write_mrpc), whose label
  the tiny model learns in a few dozen steps."""
  return example_data.write_mrpc(data_dir, num_train=NUM_TRAIN,
                                 num_dev=NUM_DEV, num_test=NUM_TEST)


@pytest.fixture(scope="module")
def fine_tuned(files, pretrained_checkpoint, tmp_path_factory):
  """Trains, evaluates and predicts MRPC from the pretraining checkpoint."""
  root = tmp_path_factory.mktemp("mrpc")
  data_dir = write_mrpc(root / "MRPC")
  output_dir = str(root / "output")
  model_dir, vocab_file, config_file = pretrained_checkpoint
  run_main(**dict(files, vocab_file=vocab_file, bert_config_file=config_file),
           data_dir=data_dir, output_dir=output_dir,
           init_checkpoint=model_dir, do_train=True,
           do_eval=True, do_predict=True, train_batch_size=32,
           eval_batch_size=16, predict_batch_size=8, learning_rate=1e-3,
           num_train_epochs=4, iterations_per_loop=32, tf_random_seed=1)
  return data_dir, output_dir


def test_fine_tuning_beats_the_majority_class(fine_tuned):
  data_dir, output_dir = fine_tuned
  results = _read_results(os.path.join(output_dir, "eval_results.txt"))
  assert set(results) == {"eval_accuracy", "eval_loss", "global_step",
                          "loss"}
  assert results["global_step"] == NUM_TRAIN // 32 * 4
  labels = [e.label for e in
            run_classifier.MrpcProcessor().get_dev_examples(data_dir)]
  majority = max(labels.count("0"), labels.count("1")) / len(labels)
  print(f"MRPC dev accuracy {results['eval_accuracy']:.3f}, majority "
        f"class {majority:.3f}, eval loss {results['eval_loss']:.3f}")
  assert results["eval_accuracy"] > majority + 0.25
  # 60 examples in batches of 16: 4 padding examples weigh nothing, so the
  # accuracy is a multiple of 1/60.
  assert round(results["eval_accuracy"] * NUM_DEV, 4) % 1 == 0


def test_predict_writes_probabilities_of_the_real_examples(fine_tuned):
  data_dir, output_dir = fine_tuned
  with open(os.path.join(output_dir, "test_results.tsv")) as f:
    probabilities = np.array([[float(p) for p in line.split("\t")]
                              for line in f])
  assert probabilities.shape == (NUM_TEST, 2)  # Not the 4 padding ones.
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
  # The generated test set alternates labels 0, 1.
  predicted = probabilities.argmax(axis=1)
  assert (predicted == np.arange(NUM_TEST) % 2).mean() > 0.75
  del data_dir


def original_variables(config):
  """{name: shape} of the original's BertModel variables for `config`
  (Google's JSON keys, attention and feed-forward blocks)."""
  hidden, heads = config["hidden_size"], config["num_attention_heads"]
  head = hidden // heads
  vocab = config["vocab_size"] + (-config["vocab_size"] % 128)
  shapes = {
      "bert/embeddings/word_embeddings": [vocab, hidden],
      "bert/embeddings/token_type_embeddings": [config["type_vocab_size"],
                                                hidden],
      "bert/embeddings/position_embeddings": [
          config["max_position_embeddings"], hidden],
      "bert/embeddings/layer_norm/scale": [hidden],
      "bert/embeddings/layer_norm/bias": [hidden],
      "bert/pooler/dense/kernel": [hidden, hidden],
      "bert/pooler/dense_1/bias": [hidden],
  }
  for block in range(config["num_hidden_layers"]):
    prefix = f"bert/encoder/block_{block}"
    for name in ("query", "key", "value"):
      shapes[f"{prefix}/attention/{name}/kernel"] = [hidden, heads, head]
      shapes[f"{prefix}/attention/{name}/bias"] = [heads, head]
    shapes[f"{prefix}/attention/output/kernel"] = [heads, head, hidden]
    shapes[f"{prefix}/attention/output/bias"] = [hidden]
    inner = config["intermediate_size"]
    shapes[f"{prefix}/feedforward/dense_1/kernel"] = [hidden, inner]
    shapes[f"{prefix}/feedforward/dense_1/bias"] = [inner]
    shapes[f"{prefix}/feedforward/dense_2/kernel"] = [inner, hidden]
    shapes[f"{prefix}/feedforward/dense_2/bias"] = [hidden]
    for layer in ("attention", "feedforward"):
      shapes[f"{prefix}/{layer}/layer_norm/scale"] = [hidden]
      shapes[f"{prefix}/{layer}/layer_norm/bias"] = [hidden]
  return shapes


def write_tf1_checkpoint(prefix, values, global_step):
  """A TF1 name-based checkpoint (tf.compat.v1.train.Saver) of values."""
  with tf.Graph().as_default():
    variables = [tf.compat.v1.Variable(v, name=name)
                 for name, v in values.items()]
    step = tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver(variables + [step])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(step.assign(global_step))
      return saver.save(session, str(prefix), global_step=global_step)


def test_tf1_checkpoint_with_original_names_initialises_fine_tuning(
    files, tmp_path):
  rng = np.random.RandomState(0)
  values = {name: rng.normal(0, 0.5, shape).astype(np.float32) for
            name, shape in original_variables(
                generated_data.tiny_config()).items()}
  checkpoint = write_tf1_checkpoint(tmp_path / "original" / "model.ckpt",
                                    values, global_step=12345)
  data_dir = example_data.write_mrpc(tmp_path / "MRPC", num_train=8,
                                     num_dev=8, num_test=8)
  output_dir = str(tmp_path / "output")
  # One step whose learning rate is 0 (the first of the warm-up): the
  # checkpoint it writes holds the weights fine-tuning started from. On one
  # processor, quickest to lower: checkpoints do not depend on the mesh
  # (fine_tuned restores one on the default batch:8).
  run_main(**files, data_dir=data_dir, output_dir=output_dir,
           init_checkpoint=checkpoint, do_train=True, train_batch_size=8,
           num_train_epochs=1, warmup_proportion=1.0, mesh_shape="batch:1")
  saved = tf.train.latest_checkpoint(output_dir)
  assert saved.endswith("model.ckpt-1")  # The step was not restored.
  # The model's variables (not Adam's slots, the step or the estimator's
  # random-op counter) are the original's and the classifier's two.
  names = {name for name, _ in tf.train.list_variables(saved)
           if name.startswith(("bert/", "output_")) and
           not name.endswith(("/adam_m", "/adam_v"))}
  assert names - set(values) == {"output_weights", "output_bias"}
  assert set(values) <= names
  for name, value in values.items():
    np.testing.assert_array_equal(tf.train.load_variable(saved, name), value,
                                  err_msg=name)
  assert tf.train.load_variable(saved, "output_weights").shape == (2, 32)


def test_googles_checkpoint_initialises_fine_tuning(files, tmp_path):
  """--init_checkpoint of a release in google-research/bert's names: the
  binary converts it (heads split out, vocabulary padded) and starts from
  its weights."""
  config = generated_data.tiny_config()
  weights = numpy_bert.random_google_weights(config, seed=2)
  weights["global_step"] = np.int64(1000)
  release = tmp_path / "uncased_tiny"
  release.mkdir()
  checkpoint = test_bert.save_with_tf1_saver(
      weights, str(release / "bert_model.ckpt"))
  data_dir = example_data.write_mrpc(tmp_path / "MRPC", num_train=8,
                                     num_dev=8, num_test=8)
  output_dir = tmp_path / "output"
  run_main(**files, data_dir=data_dir, output_dir=str(output_dir),
           init_checkpoint=checkpoint, do_train=True, train_batch_size=8,
           num_train_epochs=1, warmup_proportion=1.0, mesh_shape="batch:1")
  assert (output_dir / "google_init").is_dir()
  saved = tf.train.latest_checkpoint(str(output_dir))
  assert saved.endswith("model.ckpt-1")  # Weights only, not the step.
  hidden, heads = config["hidden_size"], config["num_attention_heads"]
  google = "bert/encoder/layer_1/attention/self/query/kernel"
  np.testing.assert_array_equal(
      tf.train.load_variable(saved,
                             "bert/encoder/block_1/attention/query/kernel"),
      weights[google].reshape(hidden, heads, hidden // heads))
  embeddings = tf.train.load_variable(saved, "bert/embeddings/word_embeddings")
  vocab = config["vocab_size"]
  assert embeddings.shape == (128, hidden)
  np.testing.assert_array_equal(embeddings[:vocab],
                                weights["bert/embeddings/word_embeddings"])


def test_bad_flag_is_one_paragraph(files, tmp_path, monkeypatch, capsys):
  argv = ["run_classifier", "--task_name=nope", "--do_train",
          f"--data_dir={tmp_path}", f"--output_dir={tmp_path}",
          f"--vocab_file={files['vocab_file']}",
          f"--bert_config_file={files['bert_config_file']}"]
  monkeypatch.setattr("sys.argv", argv)
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    try:
      with pytest.raises(SystemExit) as exit_info:
        run_common.run(run_classifier.main)
    finally:
      FLAGS.unparse_flags()
  assert exit_info.value.code == 1
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert error.startswith("error: ")
  assert error.endswith("--task_name='nope': task not found; expected one "
                        "of ['cola', 'mnli', 'mrpc', 'xnli'].")


# ----------------------------------------------------------------- layouts

LAYOUTS = {
    "one": ("all:1", ""),
    "batch:8": ("batch:8", "batch:batch"),
    "model:8": ("model:8", "vocab:model,intermediate:model,num_heads:model"),
    "b:2;m:4": ("b:2;m:4", "batch:b,vocab:m,intermediate:m,num_heads:m"),
}


def classifier_program(mesh_shape, layout):
  """create_model's loss and probabilities (training: dropout on) for the
  tiny config, eagerly on `mesh_shape` and `layout`."""
  config = bert_lib.BertConfig.from_dict(generated_data.tiny_config())
  rng = np.random.RandomState(0)
  ids = rng.randint(7, config.vocab_size, size=(8, 16)).astype(np.int32)
  mask = (np.arange(16) < rng.randint(8, 17, size=(8, 1))).astype(np.int32)
  segments = (np.arange(16) >= 6).astype(np.int32) * mask
  labels = rng.randint(0, 2, size=(8,)).astype(np.int32)

  def build(mesh):
    batch, seq = mtf.Dimension("batch", 8), mtf.Dimension("seq", 16)
    loss, _, _, probabilities = run_classifier.create_model(
        config, True, *(mtf_testing.import_array(mesh, a, [batch, seq])
                        for a in (ids, mask, segments)),
        mtf_testing.import_array(mesh, labels, [batch]),
        mtf.Dimension("num_labels", 2), layout, mesh_shape)
    return {"loss": loss, "probabilities": probabilities}, None, {}

  values, _ = mtf_testing.run_program(mesh_shape, layout, "eager", build,
                                      fetch_variables=False)
  return values


def test_classifier_is_the_same_on_every_layout():
  """The head's initial weights and dropout do not depend on the layout."""
  results = {name: classifier_program(*spec)
             for name, spec in LAYOUTS.items()}
  assert abs(results["one"]["loss"] - np.log(2)) < 0.2
  for name, values in results.items():
    for key in ("loss", "probabilities"):
      np.testing.assert_allclose(values[key], results["one"][key],
                                 rtol=1e-4, atol=1e-5, err_msg=name)
