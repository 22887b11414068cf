"""README.md's code blocks, which test runs each, and how they run.

Every fenced block of the README is named in COVERAGE by a line that only
it holds, with the tests that run it or the reason the suite cannot; the
binary settings the README gives in running text are in INLINE_COVERAGE;
a block that moved on to docs/ keeps its tests in DOCS_COVERAGE.
tests/test_readme.py checks that nothing is missing from these, so a new
block or setting without a test fails the suite.

The tests run the README as a new user would: each in its own tmp_path,
with HOME (and with it ~/.cache, where auto_mtf caches its calibration)
in tmp_path, no cache or TFDS folder of this machine's user, the package's
virtual environment first on PATH, and files written by the README's
commands (/tmp/...) redirected into tmp_path.
"""

import dataclasses
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BINARY = "tests/test_readme_binary.py"
PROGRAMS = "tests/test_readme.py"

# Block (by a line only it holds) -> the tests that run it, or "not run:
# <why>". A block can be both: the second entry excuses one of its lines.
COVERAGE = {
    "make demo   #": [f"{BINARY}::test_make_demo"],
    "make test   #": ["not run: it runs this test suite (the suite cannot "
                      "run itself); every other line of the README is a "
                      "test of it"],
    "hidden = mtf.Dimension(\"hidden\", 128)": [
        f"{PROGRAMS}::test_mlp_example_runs"],
    "path = tf.train.Checkpoint(model=impl).save(": [
        f"{PROGRAMS}::test_checkpoint_fragment_restores_on_one_device"],
    "def model_fn(features, labels, mode, params):": [
        f"{PROGRAMS}::test_estimator_fragment_trains_evaluates_exports"],
    "model = transformer.Unitransformer(": [
        f"{PROGRAMS}::test_transformer_example_learns_the_sentence"],
    "BIN=\"python -m mesh_tensorflow.transformer.main": [
        f"{BINARY}::test_binary_steps_by_hand"],
    "rules = mtf.auto_mtf.layout(graph, \"b:2;m:4\", [loss])": [
        f"{PROGRAMS}::test_auto_mtf_fragment_searches_and_caches"],
    "mtf.shard_data_parallel(mesh, mesh_shape, layout_rules)  # ZeRO-1/2": [
        f"{PROGRAMS}::test_sharding_fragment_trains_like_unsharded"],
    "y = mtf.pipeline(stage_fn, x, stage, num_microbatches=16)": [
        f"{PROGRAMS}::test_pipeline_fragment_matches_layer_by_layer"],
    "cluster = mtf.cluster.connect(": [
        "not run: it needs two machines (host0, host1); tests/cluster runs "
        "the same calls with two tasks on this machine"],
    "impl = mtf.MeshImpl(\"b:2;m:4\", rules)": [
        f"{PROGRAMS}::test_uneven_split_example_prints_padded_slices"],
    "IndivisibleError: Tensor import:0": [
        f"{PROGRAMS}::test_error_message_example_is_the_real_one"],
    "--gin_param=\"utils.run.plan = 'auto'\" \\": [
        "tests/transformer/test_plan_run.py::"
        "test_planned_run_trains_with_the_plan_and_records_it",
        "tests/transformer/test_plan_run.py::"
        "test_pipelined_plan_for_the_mesh_shapes_processors_trains "
        "(an explicit mesh shape's processor count, as written)",
        "tests/transformer/test_plan_run.py::"
        "test_the_binary_splits_the_cpu_for_a_planned_mesh_shapes_processors",
        f"{PROGRAMS}::test_plan_command_plans_without_devices "
        "(on the tiny model and 2 processors: T5-11B on 512 takes minutes "
        "here)"],
    "plan = mtf.auto_mtf.plan(model, 8, memory_budget=1 << 30)": [
        f"{PROGRAMS}::test_plan_fragment_prints_the_plan"],
}

# Blocks that moved from the README to a file of docs/, which the tests
# still run: file -> {a line only that block of the file holds: tests}.
DOCS_COVERAGE = {
    "docs/bert.md": {
        "python -m mesh_tensorflow.bert.example_data --output_dir=$D": [
            "tests/bert/test_readme_commands.py::test_readme_bert_commands"],
    },
    "docs/layouts.md": {
        "moved = mtf.pad(head, [28, 0], \"length\")": [
            f"{PROGRAMS}::test_split_dimension_example_slices_and_pads"],
    },
    "docs/pipeline.md": {
        "with mtf.stack_layer_variables(mtf.Dimension(\"stage\", 4), names):": [
            f"{PROGRAMS}::test_layer_stacked_variables_fragment"],
        "transformer.PipelinedLayerStack.num_microbatches = 16": [
            f"{BINARY}::test_pipelined_bitransformer_gin_lines"],
    },
    "docs/repository_layout.md": {
        "mesh_tensorflow/        the package": [
            f"{PROGRAMS}::test_repository_layout_names_real_paths"],
    },
    "docs/transformer_binary.md": {
        "dataset.untokenized_tfds_dataset.dataset_name = 'lm1b'": [
            f"{BINARY}::test_language_model_from_tfds"],
        "dataset.untokenized_tfds_dataset.dataset_name = "
        "'wmt14_translate/de-en'": [
            f"{BINARY}::test_translation_from_tfds_with_sentencepiece"],
        "dataset.simple_text_line_dataset.glob = '/data/train.tsv'": [
            f"{BINARY}::test_tsv_file_seeded_then_sharded"],
    },
}

# Binary settings given in running text -> the tests that run them, or
# "not run: <why>".
INLINE_COVERAGE = {
    "--gin_param=\"utils.run.allow_uneven_splits = True\"": [
        "tests/transformer/test_uneven_run.py::"
        "test_trains_like_one_processor_and_reports_the_padding"],
    "--gin_param=\"utils.run.layout_rules = 'auto'\"": [
        f"{BINARY}::test_auto_mesh_shape_and_layout"],
    "--gin_param=\"utils.run.mesh_shape = 'auto'\"": [
        f"{BINARY}::test_auto_mesh_shape_and_layout"],
    "utils.run.shard_weight_update = True": [
        f"{BINARY}::test_tsv_file_seeded_then_sharded"],
    "utils.run.shard_parameters = True": [
        f"{BINARY}::test_tsv_file_seeded_then_sharded"],
    "--gin_param=\"utils.run.seed = 1\"": [
        f"{BINARY}::test_tsv_file_seeded_then_sharded",
        "tests/transformer/test_seeded_run.py::"
        "test_seeded_runs_repeat_their_losses_step_for_step"],
    "python -m mesh_tensorflow.auto_mtf.calibration --mesh_shape 'b:2;m:4'": [
        f"{PROGRAMS}::test_auto_mtf_fragment_searches_and_caches"],
    "utils.run.eval_checkpoint_step = \"latest\"": [
        f"{BINARY}::test_binary_steps_by_hand"],
    "--tpu=NAME": ["not run: it needs a Cloud TPU (the README says so)"],
    "--use_tpu --tpu=...": [
        "tests/test_examples.py::test_toy_model_use_tpu_trains_like_placement"
        " (on a simulated TPU: a real one is not available)"],
    "python -m mesh_tensorflow.transformer.main": [
        f"{BINARY}::test_binary_steps_by_hand"],
    "python -m mesh_tensorflow.cluster --worker_hosts=host0:2222,host1:2222 "
    "--task_index=1 --num_cpus=4": [
        "not run: it needs two machines; tests/cluster runs the same "
        "entry point with two tasks on this machine"],
}


@dataclasses.dataclass(frozen=True)
class Block:
  """A fenced block of the README: its info string, text and first line."""
  fence: str
  text: str
  line: int

  path: str = "README.md"

  def __str__(self):
    return f"{self.path} line {self.line} (```{self.fence})"


def readme_text():
  return README.read_text()


def docs():
  """The Markdown files of docs/, where the README's details live."""
  return sorted((ROOT / "docs").glob("*.md"))


def blocks(path="README.md"):
  """Every fenced block of the README (or of `path`, relative to the
  repository), in order."""
  found, current, start, fence = [], None, 0, ""
  for number, line in enumerate((ROOT / path).read_text().splitlines(), 1):
    if line.startswith("```"):
      if current is None:
        current, start, fence = [], number, line[3:].strip()
      else:
        found.append(Block(fence, "\n".join(current) + "\n", start, path))
        current = None
    elif current is not None:
      current.append(line)
  assert current is None, f"{path}: the block of line {start} is not closed"
  return found


def block(key):
  """The text of the one block holding `key` (a key of COVERAGE, or of
  DOCS_COVERAGE for a block in docs/)."""
  paths = [path for path, keys in DOCS_COVERAGE.items() if key in keys]
  if key in COVERAGE:
    paths.append("README.md")
  assert len(paths) == 1, (
      f"{key!r} is in {len(paths)} of COVERAGE and DOCS_COVERAGE: {paths}")
  matches = [b for b in blocks(paths[0]) if key in b.text]
  assert len(matches) == 1, (
      f"{len(matches)} blocks of {paths[0]} hold {key!r}: "
      f"{[str(b) for b in matches]}")
  return matches[0].text


def prose():
  """The README without its fenced blocks."""
  return re.sub(r"^```.*?^```", "", readme_text(), flags=re.DOTALL | re.M)


def inline_binary_settings():
  """The binary's flags and gin settings written in running text: code
  spans holding --gin_param=, --gin_file=, --tpu, a `python -m` command or
  a `utils.run.<name> = <value>` binding."""
  spans = re.findall(r"`([^`]+)`", prose())
  spans = [" ".join(s.split()) for s in spans]
  pattern = re.compile(r"--gin_param=|--gin_file=|--tpu=|^python -m |"
                       r"^utils\.run\.\w+ = \S")
  return sorted({s for s in spans if pattern.search(s)})


def replace_once(text, old, new):
  """`text` with `old` replaced by `new`; `old` must occur exactly once
  (so that a changed README makes the test say what it lost)."""
  count = text.count(old)
  assert count == 1, f"expected {old!r} once in the README block, found {count}"
  return text.replace(old, new)


# ------------------------------------------------------------ running


def new_user_env(tmp_path):
  """The environment of a new user whose home is tmp_path/home: nothing
  cached, no TFDS data, the package's virtual environment first on PATH
  (as after `source .venv/bin/activate`)."""
  home = tmp_path / "home"
  home.mkdir(exist_ok=True)
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("MTF_", "TFDS_", "XDG_", "TF_CONFIG"))}
  bin_dir = os.path.dirname(sys.executable)
  env.update(
      HOME=str(home), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
      PATH=bin_dir + os.pathsep + env.get("PATH", ""),
      VIRTUAL_ENV=os.path.dirname(bin_dir),
      PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
  return env


def auto_mtf_cache(tmp_path):
  """Where auto_mtf caches calibrations for new_user_env (~/.cache/...)."""
  return tmp_path / "home" / ".cache" / "mesh_tensorflow" / "auto_mtf"


def run(tmp_path, command, timeout=600, expect_success=True):
  """Runs `command` (argv) as the new user, in tmp_path/work; returns the
  CompletedProcess (text). Fails with the end of stderr unless it exits 0
  (or, expect_success=False, whatever it exits with)."""
  work = tmp_path / "work"
  work.mkdir(exist_ok=True)
  result = subprocess.run(
      [str(c) for c in command], cwd=work, env=new_user_env(tmp_path),
      capture_output=True, text=True, timeout=timeout, check=False)
  if expect_success:
    assert result.returncode == 0, (
        f"exit status {result.returncode}\nstdout:\n{result.stdout[-2000:]}"
        f"\nstderr:\n{result.stderr[-6000:]}")
  return result


def run_python(tmp_path, source, name="program.py", **kwargs):
  """Runs `source` as a Python program of the new user."""
  script = tmp_path / name
  script.write_text(source)
  return run(tmp_path, [sys.executable, script], **kwargs)


def run_shell(tmp_path, script, **kwargs):
  """Runs `script` with bash -e (a failing command ends it)."""
  path = tmp_path / "commands.sh"
  path.write_text(script)
  return run(tmp_path, ["bash", "-e", path], **kwargs)
