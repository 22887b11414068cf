"""The README's command lines run, as a new user would type them.

Each runs the real binary (`python -m mesh_tensorflow.transformer.main`)
in its own tmp_path and home (tests/readme_testing.py), with the README's
flags and gin lines as written, where "model" means what the README's own
command trains (an encoder-decoder, T5's kind). Only small sizes are
added (SMALL: the model, the batch, the steps, the eval set), paths the
README puts in /tmp or /data go to tmp_path, and a TFDS dataset comes from
`tfds.testing.mock_data` (nothing downloads).
"""

import math
import re
import shlex
import sys

import numpy as np
import sentencepiece
import tensorflow as tf

from tests import readme_testing

block = readme_testing.block
replace_once = readme_testing.replace_once
ROOT = readme_testing.ROOT
BY_HAND = "BIN=\"python -m mesh_tensorflow.transformer.main"

# Small sizes for the README's Transformer commands (the layout
# batch:2,model:4 of layouts/2x2_dp_mp.gin splits heads, d_ff and the
# vocabulary 4 ways). No spaces: the README's $BIN is split on them.
SMALL = ["d_model=16", "d_ff=32", "num_heads=4", "d_kv=4", "num_layers=1",
         'utils.run.batch_size=("sequences_per_batch",8)',
         "utils.run.train_steps=20", "utils.run.iterations_per_loop=10",
         "utils.run.save_checkpoints_steps=10",
         "embedded_task.addition_eval_dataset_fn.num_eval_examples=8"]
SMALL_FLAGS = [f"--gin_param={p}" for p in SMALL]

# Runs the binary with TFDS's mock data: every tfds.load gives random
# examples of the dataset's features, without files or download.
_MOCK_TFDS_MAIN = """
import runpy, sys
import tensorflow_datasets as tfds
with tfds.testing.mock_data(num_examples=64):
  runpy.run_module("mesh_tensorflow.transformer.main", run_name="__main__",
                   alter_sys=True)
"""

# Runs examples/transformer_demo.py (what `make demo` runs) with the
# binary's gin parameters after "--" added to each of its binary runs.
_DEMO_WITH_PARAMS = """
import importlib.util, sys
split = sys.argv.index("--")
path, args, params = sys.argv[1], sys.argv[2:split], sys.argv[split + 1:]
spec = importlib.util.spec_from_file_location("transformer_demo", path)
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)
command = demo._command
demo._command = lambda model_dir, *more: command(model_dir, *more, *params)
sys.argv = [path] + args
demo.main()
"""


def _readme_gin_files():
  """The --gin_file flags of the README's $GIN (make demo's model)."""
  return re.findall(r"--gin_file=[^\s\"]+", block(BY_HAND))


def _binary(tmp_path, *flags, mock_tfds=False, **kwargs):
  """Runs the binary with the README's $GIN, SMALL and the given flags
  (which win), model_dir tmp_path/model."""
  main = (["-c", _MOCK_TFDS_MAIN] if mock_tfds
          else ["-m", "mesh_tensorflow.transformer.main"])
  return readme_testing.run(
      tmp_path, [sys.executable, *main, f"--model_dir={tmp_path / 'model'}",
                 *_readme_gin_files(), *SMALL_FLAGS, *flags], **kwargs)


def _flags(key, tmp_path):
  """The flags of a README (or docs/) block of flags, /data/ moved into
  tmp_path."""
  text = block(key).replace("/data/", f"{tmp_path / 'data'}/")
  return shlex.split(text.replace("\\\n", " "))


def _progress(stderr):
  """[(step, loss)] of the binary's progress lines."""
  found = [(int(s), float(l)) for s, l in re.findall(
      r"^step (\d+)(?:/\d+)?:? +loss ([-\d.naif]+)", stderr, re.M)]
  assert found, stderr[-3000:]
  assert all(math.isfinite(l) for _, l in found), found
  return found


def _checkpoint_step(model_dir):
  return int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])


def _eval_metrics(eval_dir, step):
  """{tag: value} the eval mode wrote to TensorBoard for `step`."""
  values = {}
  for path in eval_dir.glob("events.out.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      if event.step == step:
        for value in event.summary.value:
          values[value.tag.rsplit("/", 1)[-1]] = float(
              tf.make_ndarray(value.tensor) if value.HasField("tensor")
              else value.simple_value)
  return values


def _sentencepiece_model(folder):
  """A tiny SentencePiece model trained on words like TFDS's mock text."""
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.RandomState(0)
  letters = list("abcdefghij")
  corpus = folder / "corpus.txt"
  corpus.write_text("\n".join(
      " ".join("".join(rng.choice(letters, rng.randint(1, 6)))
               for _ in range(8)) for _ in range(200)))
  sentencepiece.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(folder / "spm"), vocab_size=32,
      model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      minloglevel=2)
  return folder / "spm.model"


# ------------------------------------------------------------ make demo


def test_binary_steps_by_hand(tmp_path):
  """The README's `make demo` by hand: train, eval, infer, export, serve,
  as a bash script, SMALL added to its $BIN."""
  script = block(BY_HAND)
  assert script.count("/tmp/") >= 5
  script = script.replace("/tmp/", f"{tmp_path}/")
  script = replace_once(script, ' $GIN"\n', ' $GIN $SMALL"\n')
  small = shlex.quote(" ".join(SMALL_FLAGS))
  result = readme_testing.run_shell(tmp_path, f"SMALL={small}\n{script}")
  model_dir = tmp_path / "addition"
  # Training: progress lines whose loss falls; checkpoints, command and
  # operative config in model_dir.
  progress = _progress(result.stderr)
  assert [s for s, _ in progress] == [10, 20], progress
  assert progress[-1][1] < progress[0][1], progress
  assert _checkpoint_step(model_dir) == 20
  assert "--gin_file=addition_demo.gin" in (model_dir / "command").read_text()
  assert "run.train_steps = 20" in (
      model_dir / "operative_config.gin").read_text()
  # Eval: the held-out sums decoded, exact match by number of carries.
  eval_dir = model_dir / "validation_eval"
  predictions = (eval_dir / "addition_20_predictions").read_text()
  assert len(predictions.splitlines()) == 8
  metrics = _eval_metrics(eval_dir, 20)
  for name in ["exact_match", "digit_accuracy"] + [
      f"exact_match_carries_{n}" for n in range(4)]:
    assert 0 <= metrics[name] <= 1, (name, metrics)
  # Infer: one decode of "417+86" in <output_filename>-<step>.
  assert (tmp_path / "in.txt").read_text() == "417+86\n"
  assert len((tmp_path / "out-20").read_text().splitlines()) == 1
  # Export, then TensorFlow alone serves it.
  (export,) = (model_dir / "export").iterdir()
  assert (export / "saved_model.pb").exists()
  assert re.search(r"^tf\.Tensor\(\[b'.*'\], shape=\(1,\), dtype=string\)$",
                   result.stdout, re.M), result.stdout


def test_make_demo(tmp_path):
  """`make demo` runs examples/transformer_demo.py; here with SMALL (and
  its model_dir in tmp_path). Its last check, 95% exact match, needs the
  full 3000 steps: a 20-step model fails it, and says so."""
  dry_run = readme_testing.run(tmp_path, ["make", "-C", ROOT, "-n", "demo"])
  (command,) = [l for l in dry_run.stdout.splitlines()
                if "transformer_demo.py" in l]
  assert command.split()[1:] == ["examples/transformer_demo.py"], command
  result = readme_testing.run(
      tmp_path, [sys.executable, "-c", _DEMO_WITH_PARAMS,
                 ROOT / "examples" / "transformer_demo.py",
                 f"--model_dir={tmp_path / 'demo'}", "--", *SMALL],
      expect_success=False)
  if result.returncode:
    assert result.stderr.strip().splitlines()[-1].startswith(
        "demo: exact match "), result.stderr[-3000:]
    assert result.stderr.strip().endswith("is below 95%")
  out = result.stdout
  assert out.count("$ ") == 4, out  # train, eval, infer, export
  summary = out[out.index("\nSummary"):]
  for step in ("train", "eval", "infer", "export", "serve"):
    assert re.search(rf"^  {step} +\d+ s  ", summary, re.M), (step, summary)
  assert "20 steps" in summary
  assert re.search(r"^(What it gets wrong:|The model gets every)", out,
                   re.M), out[-2000:]


# ------------------------------------------------------------ other data


def test_tsv_file_seeded_then_sharded(tmp_path):
  """The TSV lines of docs/transformer_binary.md with the README's seed and
  `utils.run.shard_weight_update = True` for 10 steps, then continued to
  20 with `utils.run.shard_parameters = True` (sharded and unsharded
  checkpoints restore each other). Orthogonal settings share runs to save
  the suite's time; that two seeded runs repeat their losses is
  tests/transformer/test_seeded_run.py's test."""
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / "train.tsv").write_text(
      "".join(f"{a}+{b}\t{a + b}\n" for a in range(10) for b in range(10)))
  tsv = _flags("dataset.simple_text_line_dataset.glob = '/data/train.tsv'",
               tmp_path)
  (seed,) = [s for s in readme_testing.inline_binary_settings()
             if "utils.run.seed" in s]
  first = _binary(tmp_path, *tsv, *shlex.split(seed),
                  "--gin_param=utils.run.shard_weight_update = True",
                  "--gin_param=utils.run.train_steps=10")
  config = (tmp_path / "model" / "operative_config.gin").read_text()
  assert "packed_parallel_tsv_dataset" in config
  assert "\nrun.seed = 1\n" in config
  assert "\nrun.shard_weight_update = True\n" in config
  second = _binary(tmp_path, *tsv,
                   "--gin_param=utils.run.shard_parameters = True")
  config = (tmp_path / "model" / "operative_config.gin").read_text()
  assert "\nrun.shard_parameters = True\n" in config
  assert _progress(first.stderr)[-1][0] == 10
  assert _progress(second.stderr)[-1][0] == 20
  assert _checkpoint_step(tmp_path / "model") == 20


def test_translation_from_tfds_with_sentencepiece(tmp_path):
  _sentencepiece_model(tmp_path / "data")
  result = _binary(tmp_path, *_flags(
      "dataset.untokenized_tfds_dataset.dataset_name = "
      "'wmt14_translate/de-en'", tmp_path), mock_tfds=True)
  assert _progress(result.stderr)[-1][0] == 20
  config = (tmp_path / "model" / "operative_config.gin").read_text()
  assert "'wmt14_translate/de-en'" in config
  assert f"'{tmp_path / 'data' / 'spm.model'}'" in config
  assert "run.model_type = 'bitransformer'" in config


def test_language_model_from_tfds(tmp_path):
  """The lm1b lines of docs/transformer_binary.md's "Other data"."""
  _sentencepiece_model(tmp_path / "data")
  result = _binary(tmp_path, *_flags(
      "dataset.untokenized_tfds_dataset.dataset_name = 'lm1b'", tmp_path),
                   mock_tfds=True)
  assert _progress(result.stderr)[-1][0] == 20
  config = (tmp_path / "model" / "operative_config.gin").read_text()
  assert f"'{tmp_path / 'data' / 'spm.model'}'" in config
  assert "run.model_type = 'lm'" in config


# ------------------------------------------------------------ pipeline


def test_pipelined_bitransformer_gin_lines(tmp_path):
  """The PipelinedLayerStack lines of docs/pipeline.md as a gin file, then
  the run continued with the option they offer instead of recompute_grads:
  an encoder-decoder of 4 layers per stack, 1 per stage.

  Besides SMALL, one override: 2 micro-batches, not 16. With 16 (and a
  batch of 32 sequences, 2 per micro-batch and processor) the 19
  pipeline iterations of both stacks on 8 logical CPUs take about three
  CPU-minutes to trace and compile; with 2, 5 iterations show the same
  lines at work (micro-batches in flight on several stages at once). The
  schedule itself at M >= S is tests/transformer/test_pipelined_run.py's.
  """
  lines = block("transformer.PipelinedLayerStack.num_microbatches = 16")
  batched = replace_once(
      lines, "transformer.PipelinedLayerStack.recompute_grads = True", "#")
  batched = replace_once(
      batched, "# transformer.PipelinedLayerStack.batch_weight_gradients",
      "transformer.PipelinedLayerStack.batch_weight_gradients")
  small = ["--gin_param=num_layers=4",
           "--gin_param=transformer.PipelinedLayerStack.num_microbatches=2",
           "--gin_param=utils.run.iterations_per_loop=1"]
  for name, text, steps in (("pipeline.gin", lines, 2),
                            ("batched.gin", batched, 3)):
    (tmp_path / name).write_text(text)
    result = _binary(tmp_path, f"--gin_file={tmp_path / name}", *small,
                     f"--gin_param=utils.run.train_steps={steps}")
    assert _progress(result.stderr)[-1][0] == steps
    assert "mesh_shape=Shape[stage=4, batch=2]" in result.stderr
    config = (tmp_path / "model" / "operative_config.gin").read_text()
    option = ("recompute_grads" if name == "pipeline.gin"
              else "batch_weight_gradients")
    for stack in ("encoder", "decoder"):  # Both stacks are pipelined.
      assert f"\n{stack}/PipelinedLayerStack.num_stages = 4\n" in config
      assert f"\n{stack}/PipelinedLayerStack.{option} = True\n" in config
  names = tf.train.load_checkpoint(str(tmp_path / "model")) \
      .get_variable_to_shape_map()
  # Each layer keeps its own name in the checkpoint.
  assert "decoder/block_003/layer_002/DenseReluDense/wi/kernel" in names, (
      sorted(names))


# ----------------------------------------------------------- auto layout


def test_auto_mesh_shape_and_layout(tmp_path):
  """mesh_shape and layout_rules 'auto' (the README's two settings in one
  run), on 4 mesh devices as docs/auto_layout.md advises on a CPU-only
  machine, with the default objective: the machine is measured first, into
  an empty ~/.cache."""
  result = _binary(
      tmp_path, "--gin_param=utils.run.mesh_shape = 'auto'",
      "--gin_param=utils.run.layout_rules = 'auto'",
      "--gin_param=utils.run.mesh_devices = "
      "['/cpu:0', '/cpu:0', '/cpu:0', '/cpu:0']")
  (line,) = [l for l in result.stdout.splitlines()
             if l.startswith("auto layout")]
  assert line.startswith("auto layout (time): "), line
  mesh = re.search(r"utils.run.mesh_shape = '([^']*)'", line).group(1)
  rules = re.search(r"utils.run.layout_rules = '([^']*)'", line).group(1)
  assert mesh in ("mesh_0:4", "mesh_0:2;mesh_1:2"), line
  # The choice is in the operative config, so that a rerun repeats it.
  config = (tmp_path / "model" / "operative_config.gin").read_text()
  assert f"\nrun.mesh_shape = '{mesh}'\n" in config
  assert f"\nrun.layout_rules = '{rules}'\n" in config
  assert _progress(result.stderr)[-1][0] == 20
  cached = list(readme_testing.auto_mtf_cache(tmp_path).glob("machine_*"))
  assert len(cached) == 1, cached  # One for every mesh shape searched.
