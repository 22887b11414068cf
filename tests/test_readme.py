"""Every block of README.md runs, as a new user would run it.

Which test runs which block (and why a few cannot run here) is listed in
tests/readme_testing.py; the first two tests check that the list covers
every block and every binary setting of the README. This file runs the
Python programs and fragments (each a program in its own process, its
own tmp_path and home), the error message and the repository layout;
tests/test_readme_binary.py runs the command lines.

A fragment runs with the least the README leaves to the reader: the
imports and 8 logical CPUs of the README's first example, the names it
assumes (a mesh, a graph, dimensions), small sizes, and files in tmp_path
instead of /tmp. The README's own lines are used as they are, except where
a test says what it replaces (`...`, a path).
"""

import ast
import itertools
import json
import pathlib
import re
import shlex
import sys
import textwrap

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import readme_testing

block = readme_testing.block
replace_once = readme_testing.replace_once
ROOT = readme_testing.ROOT


# ------------------------------------------------------------- coverage


def _check_entries(name, coverage):
  """Each entry names a test that exists, or says why it is not run."""
  for key, entries in coverage.items():
    assert entries, f"{name}[{key!r}] is empty"
    for entry in entries:
      if entry.startswith("not run: "):
        assert len(entry) > len("not run: ") + 10, entry
        continue
      path, test = entry.split()[0].split("::")
      source = (ROOT / path).read_text()
      assert re.search(rf"^def {test}\(", source, re.M), (
          f"{name}[{key!r}] names {entry}, which does not exist")


def test_every_readme_block_is_run_or_excused():
  blocks = readme_testing.blocks()
  uncovered = [str(b) for b in blocks
               if not any(k in b.text for k in readme_testing.COVERAGE)]
  assert not uncovered, (
      f"README blocks without a test: {uncovered}. Run them in "
      "tests/test_readme*.py and name the test in "
      "tests/readme_testing.py's COVERAGE (or say there why the suite "
      "cannot run them).")
  for key in readme_testing.COVERAGE:
    holding = [str(b) for b in blocks if key in b.text]
    assert len(holding) == 1, (
        f"COVERAGE key {key!r} is in {len(holding)} README blocks: {holding}")
  _check_entries("COVERAGE", readme_testing.COVERAGE)
  # The blocks that moved on to docs/ are still there, and still run.
  for path, coverage in readme_testing.DOCS_COVERAGE.items():
    for key in coverage:
      holding = [str(b) for b in readme_testing.blocks(path) if key in b.text]
      assert len(holding) == 1, (
          f"DOCS_COVERAGE key {key!r} is in {len(holding)} blocks of "
          f"{path}: {holding}")
    _check_entries(f"DOCS_COVERAGE[{path!r}]", coverage)


def test_every_binary_setting_in_the_text_is_run_or_excused():
  found = set(readme_testing.inline_binary_settings())
  listed = set(readme_testing.INLINE_COVERAGE)
  assert not found - listed, (
      f"binary settings in the README's text without a test: "
      f"{sorted(found - listed)} (see INLINE_COVERAGE in "
      "tests/readme_testing.py)")
  assert not listed - found, (
      f"INLINE_COVERAGE lists settings the README no longer has: "
      f"{sorted(listed - found)}")
  _check_entries("INLINE_COVERAGE", readme_testing.INLINE_COVERAGE)


# ------------------------------------------------------------ programs

_MLP_KEY = "hidden = mtf.Dimension(\"hidden\", 128)"


def _mlp_setup():
  """The README's first example up to its training function: imports, 8
  logical CPUs, the dimensions and the data (every fragment starts so)."""
  code = block(_MLP_KEY)
  return code[:code.index("\n\ndef train(")] + "\nimport json\n\n"


# The README MLP's step on any mesh implementation, for the fragments that
# "train with a tf.function that lowers onto impl".
_MLP_STEP = '''

def mlp_step(mesh_impl, learning_rate=None):
  """The README MLP's loss (before an SGD step when learning_rate is
  given), as a tf.function lowering onto mesh_impl."""

  @tf.function
  def step(x, y):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    mx = mtf.import_tf_tensor(mesh, x, [batch, io])
    my = mtf.import_tf_tensor(mesh, y, [batch, io])
    w1 = mtf.get_variable(mesh, "w1", [io, hidden])
    w2 = mtf.get_variable(mesh, "w2", [hidden, io])
    h = mtf.relu(mtf.einsum([mx, w1], [batch, hidden]))
    out = mtf.einsum([h, w2], [batch, io])
    loss = mtf.reduce_mean(mtf.square(out - my))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = [mtf.assign_sub(v, g * learning_rate)
               for v, g in zip(variables, grads)] if learning_rate else []
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    for update in updates:
      lowering.lowered_operation(update)
    return lowering.export_to_tf_tensor(loss)

  return step

'''


def _result(stdout):
  """The JSON dict a program printed on its last line."""
  return json.loads(stdout.strip().splitlines()[-1])


def test_mlp_example_runs(tmp_path):
  result = readme_testing.run_python(tmp_path, block(_MLP_KEY))
  lines = [l for l in result.stdout.splitlines() if "loss" in l]
  assert len(lines) == 4
  final_losses = {float(l.split()[-1]) for l in lines}
  first_losses = {float(l.split()[-3]) for l in lines}
  # Every layout ends at the same loss (to print precision), below the start.
  assert len(final_losses) == 1 and len(first_losses) == 1
  assert final_losses.pop() < first_losses.pop()


def test_mlp_example_is_make_demo_mlps_program():
  """`make demo-mlp` runs examples/mlp.py, which the README says is its
  first example plus a check: the same statements, in the same order."""
  def statements(source):
    tree = ast.parse(source)
    body = []
    for node in tree.body:
      if isinstance(node, ast.If):  # if __name__ == "__main__":
        body += node.body
      elif not isinstance(node, ast.Expr):  # the docstring
        body.append(node)
    return [ast.dump(n) for n in body]

  readme = statements(block(_MLP_KEY))
  example = statements((ROOT / "examples" / "mlp.py").read_text())
  assert example[:len(readme)] == readme


def test_transformer_example_learns_the_sentence(tmp_path):
  code = block("model = transformer.Unitransformer(")
  result = readme_testing.run_python(tmp_path, code)
  (line,) = [l for l in result.stdout.splitlines() if l.startswith("loss")]
  first, last = float(line.split()[1]), float(line.split()[3])
  # The sentence is learnt: the loss falls by more than a factor of ten.
  assert last < first / 10, line


def test_checkpoint_fragment_restores_on_one_device(tmp_path):
  code = block("path = tf.train.Checkpoint(model=impl).save(")
  code = replace_once(
      code, "... # train with a tf.function that lowers onto impl\n",
      "train_step = mlp_step(impl, learning_rate=0.05)\n"
      "losses = [float(train_step(inputs, targets)) for _ in range(5)]\n")
  code = replace_once(code, '"/tmp/run/ckpt"',
                      repr(str(tmp_path / "run" / "ckpt")))
  checks = """
trained = float(mlp_step(impl)(inputs, targets))
restored = float(mlp_step(serving)(inputs, targets))
values = mtf.storage.checkpointing.load_variables(path, prefix="model")
print(json.dumps({"losses": losses, "trained": trained,
                  "restored": restored,
                  "shapes": {k: list(np.shape(v)) for k, v in values.items()}}))
"""
  result = readme_testing.run_python(
      tmp_path, _mlp_setup() + _MLP_STEP + code + checks)
  got = _result(result.stdout)
  assert got["losses"][-1] < got["losses"][0]
  # The one-processor model restored from b:2;m:4 has the trained loss.
  np.testing.assert_allclose(got["restored"], got["trained"], rtol=1e-5)
  assert got["trained"] < got["losses"][-1]
  assert got["shapes"] == {"w1": [32, 128], "w2": [128, 32]}


def test_layer_stacked_variables_fragment(tmp_path):
  setup = """
graph = mtf.Graph()
mesh = mtf.Mesh(graph, "mesh")
d_model = mtf.Dimension("d_model", 8)
d_ff = mtf.Dimension("d_ff", 16)
"""
  checks = f"""
(variable,) = graph.trainable_variables
impl = mtf.placement_mesh_impl.PlacementMeshImpl("stage:4;b:2", "stage:stage")
lowering = mtf.Lowering(graph, {{mesh: impl}})
value = lowering.export_to_tf_tensor(kernel).numpy()
path = tf.train.Checkpoint(model=impl).save({str(tmp_path / "ckpt")!r})
saved = mtf.storage.checkpointing.load_variables(path, prefix="model")

# The per-layer variable of layer 2, on one processor.
graph_2 = mtf.Graph()
mesh_2 = mtf.Mesh(graph_2, "mesh")
with tf.compat.v1.variable_scope("block_002"):
  single = mtf.get_variable(mesh_2, "kernel", [d_model, d_ff])
lowering_2 = mtf.Lowering(
    graph_2, {{mesh_2: mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")}})
print(json.dumps({{
    "shape": [d.name for d in kernel.shape.dims],
    "variable": variable.name,
    "saved": sorted(saved),
    "rows_saved": [bool(np.array_equal(saved[f"block_{{i:03d}}/kernel"],
                                       value[i])) for i in range(4)],
    "row_2_is_layer_2": bool(np.array_equal(
        lowering_2.export_to_tf_tensor(single).numpy(), value[2])),
    "rows_differ": bool(not np.array_equal(value[0], value[1])),
}}))
"""
  code = block(
      "with mtf.stack_layer_variables(mtf.Dimension(\"stage\", 4), names):")
  result = readme_testing.run_python(tmp_path,
                                     _mlp_setup() + setup + code + checks)
  got = _result(result.stdout)
  assert got["shape"] == ["stage", "d_model", "d_ff"]
  assert got["variable"].startswith("stacked_"), got["variable"]
  assert got["saved"] == [f"block_{i:03d}/kernel" for i in range(4)]
  assert all(got["rows_saved"]) and got["row_2_is_layer_2"]
  assert got["rows_differ"]


def test_estimator_fragment_trains_evaluates_exports(tmp_path):
  setup = """

def input_fn():
  return tf.data.Dataset.from_tensors(({"x": inputs}, targets)).repeat()


eval_input_fn = input_fn


def serving_input_receiver_fn():
  return estimator.ServingInputReceiver(
      None, {"x": tf.TensorSpec([batch.size, io.size], tf.float32)})

"""
  # The README's MLP as the model.
  model = """\
  x = mtf.import_tf_tensor(mesh, features["x"], [batch, io])
  w1 = mtf.get_variable(mesh, "w1", [io, hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, io])
  y = mtf.einsum([mtf.relu(mtf.einsum([x, w1], [batch, hidden])), w2],
                 [batch, io])
  updates = []
  if mode != estimator.ModeKeys.PREDICT:
    loss = mtf.reduce_mean(mtf.square(
        y - mtf.import_tf_tensor(mesh, labels, [batch, io])))
  if mode == estimator.ModeKeys.TRAIN:
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = [mtf.assign_sub(v, g * 0.05) for v, g in zip(variables, grads)]
"""
  code = block("def model_fn(features, labels, mode, params):")
  code = replace_once(
      code, "  ...                                  # build the model, loss, "
      "updates\n", model)
  code = replace_once(code, '"/tmp/model"', repr(str(tmp_path / "model")))
  code = replace_once(code, '"/tmp/export"', repr(str(tmp_path / "export")))
  checks = f"""
metrics = est.evaluate(eval_input_fn, steps=10)
est.train(input_fn, max_steps=1000)  # Already there: returns at once.
import glob, os
(export_dir,) = glob.glob({str(tmp_path / "export" / "*")!r})
served = tf.saved_model.load(export_dir).signatures["serving_default"](
    x=tf.constant(inputs))["y"].numpy()
print(json.dumps({{
    "loss": float(metrics["loss"]),
    "global_step": int(metrics["global_step"]),
    "after_resume": int(est.get_variable_value("global_step")),
    "zero_prediction_loss": float(np.mean(targets ** 2)),
    "served_loss": float(np.mean((served - targets) ** 2)),
    "checkpoints": sorted(n for n in os.listdir({str(tmp_path / "model")!r})
                          if n.endswith(".index")),
}}))
"""
  result = readme_testing.run_python(
      tmp_path, _mlp_setup() + "from mesh_tensorflow import estimator\n" +
      setup + code + checks)
  got = _result(result.stdout)
  assert got["global_step"] == got["after_resume"] == 1000
  assert got["loss"] < got["zero_prediction_loss"] / 4, got
  # Served on one processor from the b:2;m:4 checkpoint: the same model.
  np.testing.assert_allclose(got["served_loss"], got["loss"], rtol=1e-4)
  assert "model.ckpt-1000.index" in got["checkpoints"]


# A program's statements run one at a time, and (rules, mesh shape) kept
# after each that assigns `rules` (the README's auto_mtf block does three
# times; the first two search the mesh b:2;m:4).
_STATEMENT_BY_STATEMENT = '''
import ast as _ast
_README_BLOCK = {code!r}
_choices = []
for _statement in _ast.parse(_README_BLOCK).body:
  exec(compile(_ast.Module([_statement], type_ignores=[]), "README.md",
               "exec"))
  if isinstance(_statement, _ast.Assign):
    _choices.append(rules if isinstance(rules, tuple) else (rules, "b:2;m:4"))
'''


def test_auto_mtf_fragment_searches_and_caches(tmp_path):
  """The README's calibration command fills an empty ~/.cache; then the
  three searches (the time objective uses that measurement); each layout
  found gives the one-processor loss."""
  setup = """

def training_graph():
  \"\"\"The README MLP's training step (loss, gradients, SGD updates).\"\"\"
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mx = mtf.import_tf_tensor(mesh, inputs, [batch, io])
  my = mtf.import_tf_tensor(mesh, targets, [batch, io])
  w1 = mtf.get_variable(mesh, "w1", [io, hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, io])
  h = mtf.relu(mtf.einsum([mx, w1], [batch, hidden]))
  loss = mtf.reduce_mean(mtf.square(mtf.einsum([h, w2], [batch, io]) - my))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = [mtf.assign_sub(v, g * 0.05) for v, g in zip(variables, grads)]
  return graph, mesh, loss, updates


def lowered_loss(mesh_shape, layout):
  graph, mesh, loss, updates = training_graph()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  for update in updates:
    lowering.lowered_operation(update)
  return float(lowering.export_to_tf_tensor(loss))


graph, mesh, loss, updates = training_graph()
"""
  code = block("rules = mtf.auto_mtf.layout(graph, \"b:2;m:4\", [loss])")
  checks = """
print(json.dumps({
    "choices": [[r.to_string, str(m)] for r, m in _choices],
    "losses": [lowered_loss(m, r) for r, m in _choices],
    "reference": lowered_loss("all:1", "")}))
"""
  # Measured ahead of time, as the README offers, into the empty cache.
  (command,) = [s for s in readme_testing.inline_binary_settings()
                if s.startswith("python -m mesh_tensorflow.auto_mtf.")]
  readme_testing.run(tmp_path, [sys.executable] + shlex.split(command)[1:])
  cache = readme_testing.auto_mtf_cache(tmp_path)
  assert len(list(cache.glob("machine_*"))) == 1
  result = readme_testing.run_python(
      tmp_path, _mlp_setup() + setup +
      _STATEMENT_BY_STATEMENT.format(code=code) + checks)
  got = _result(result.stdout)
  assert len(got["choices"]) == 3, got
  for (layout, *_), loss in zip(got["choices"], got["losses"]):
    # A layout changes speed and memory, never the answer.
    np.testing.assert_allclose(loss, got["reference"], rtol=1e-5,
                               err_msg=layout)
  # The time objective found the measurement where the command left it.
  assert len(list(cache.glob("machine_*"))) == 1, list(cache.iterdir())


def test_plan_fragment_prints_the_plan(tmp_path):
  """The library call plans the tiny model (on 2 processors, for time) and
  prints its table; the settings that run it are gin."""
  code = block("plan = mtf.auto_mtf.plan(model, 8, memory_budget=1 << 30)")
  code = readme_testing.replace_once(
      code, "mtf.auto_mtf.plan(model, 8,", "mtf.auto_mtf.plan(model, 2,")
  code = readme_testing.replace_once(code, "batch_size=32", "batch_size=4")
  result = readme_testing.run_python(
      tmp_path, "import mesh_tensorflow as mtf\n" + code +
      "\nprint('SETTINGS', sorted(plan.settings))\n")
  assert "Plan: " in result.stdout and "next best:" in result.stdout
  assert "'layout_rules'" in result.stdout, result.stdout


def test_plan_command_plans_without_devices(tmp_path):
  """The README's plan command, on the tiny model and 2 processors (T5-11B
  on 512 takes minutes here): a table, within the budget."""
  (command,) = [line for line in block(
      "--gin_param=\"utils.run.plan = 'auto'\" \\").replace(
          "\\\n", " ").splitlines()
                if line.startswith("python -m mesh_tensorflow.auto_mtf.plan")]
  command = readme_testing.replace_once(
      command, "--gin_file=models/t5_11b.gin",
      "--gin_file=models/lm_base.gin --gin_file=models/tiny.gin "
      "--batch_size=4 --sequence_length=8 --vocab_size=64")
  command = readme_testing.replace_once(command, "--num_processors=512",
                                        "--num_processors=2")
  result = readme_testing.run(
      tmp_path, [sys.executable] + shlex.split(command)[1:])
  assert "Plan: " in result.stdout, result.stdout
  assert "budget 16.00 GiB/processor" in result.stdout


def test_sharding_fragment_trains_like_unsharded(tmp_path):
  """ZeRO-1/2 as written, ZeRO-3 as the comment offers instead, and no
  sharding: five Adafactor steps of the README MLP give the same losses,
  and the sharding records what it split."""
  code = block("mtf.shard_data_parallel(mesh, mesh_shape, layout_rules)  "
               "# ZeRO-1/2")
  zero3 = replace_once(
      code, "mtf.shard_data_parallel(mesh, mesh_shape, layout_rules)  "
      "# ZeRO-1/2\n", "")
  zero3 = replace_once(zero3, "# or: mtf.shard_data_parallel(",
                       "mtf.shard_data_parallel(")
  zero3 = replace_once(zero3, "\n#   ", "\n    ")
  plain = 'mesh = mtf.Mesh(graph, "my_mesh")\n'
  program = _mlp_setup()
  for name, variant in (("plain", plain), ("zero12", code),
                        ("zero3", zero3)):
    program += f"\n\ndef {name}_mesh(graph, mesh_shape, layout_rules):\n"
    program += textwrap.indent(variant, "  ") + "  return mesh\n"
  program += """

mesh_shape, layout_rules = "b:4;m:2", "batch:b;hidden:m"
global_step = tf.compat.v1.train.get_or_create_global_step()


def train(make_mesh, steps=5):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout_rules)
  global_step.assign(0)
  record = {}

  @tf.function
  def step(x, y):
    graph = mtf.Graph()
    mesh = make_mesh(graph, mesh_shape, layout_rules)
    mx = mtf.import_tf_tensor(mesh, x, [batch, io])
    my = mtf.import_tf_tensor(mesh, y, [batch, io])
    w1 = mtf.get_variable(mesh, "w1", [io, hidden])
    w2 = mtf.get_variable(mesh, "w2", [hidden, io])
    h = mtf.relu(mtf.einsum([mx, w1], [batch, hidden]))
    loss = mtf.reduce_mean(mtf.square(mtf.einsum([h, w2], [batch, io]) - my))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = mtf.optimize.AdafactorOptimizer(learning_rate=0.01).apply_grads(
        grads, variables)
    sharding = mtf.strategies.data_parallel_sharding.sharding_of(mesh)
    record["decisions"] = dict(sharding.decisions) if sharding else {}
    record["shapes"] = {v.name: v.shape.to_string for v in variables}
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies(
        [lowering.lowered_operation(u) for u in updates]):
      global_step.assign_add(1)
      return tf.identity(lowering.export_to_tf_tensor(loss))

  record["losses"] = [float(step(inputs, targets)) for _ in range(steps)]
  return record


print(json.dumps({name: train(make) for name, make in (
    ("plain", plain_mesh), ("zero12", zero12_mesh), ("zero3", zero3_mesh))}))
"""
  got = _result(readme_testing.run_python(tmp_path, program).stdout)
  plain_losses = got["plain"]["losses"]
  assert plain_losses[-1] < plain_losses[0]
  for name in ("zero12", "zero3"):
    np.testing.assert_allclose(got[name]["losses"], plain_losses, rtol=1e-5,
                               atol=1e-6, err_msg=name)
    # hidden is split over m already, so io (32) is sharded over b (4).
    assert got[name]["decisions"]["w1"] == "sharded: io@b over b", got
    assert got[name]["decisions"]["w2"] == "sharded: io@b over b", got
  assert got["plain"]["decisions"] == {}
  # ZeRO-3 stores the variables themselves in shards; ZeRO-1/2 does not.
  assert got["zero12"]["shapes"] == got["plain"]["shapes"]
  assert got["zero3"]["shapes"]["w1"] == "Shape[io@b=32, hidden=128]"


def test_pipeline_fragment_matches_layer_by_layer(tmp_path):
  """mtf.pipeline on the mesh and rules of the README's comment equals
  the four stages applied one after another (NumPy)."""
  code = block("y = mtf.pipeline(stage_fn, x, stage, num_microbatches=16)")
  mesh_shape, rules = re.search(r'# mesh "([^"]+)", rules "([^"]+)"',
                                code).groups()
  setup = """
graph = mtf.Graph()
mesh = mtf.Mesh(graph, "mesh")
batch = mtf.Dimension("batch", 32)  # 16 micro-batches of 2, split over batch
d_model = mtf.Dimension("d_model", 8)
d_ff = mtf.Dimension("d_ff", 16)
x_value = np.random.RandomState(1).randn(32, 8).astype(np.float32)
x = mtf.import_tf_tensor(mesh, x_value, [batch, d_model])
"""
  checks = f"""
impl = mtf.placement_mesh_impl.PlacementMeshImpl({mesh_shape!r}, {rules!r})
lowering = mtf.Lowering(graph, {{mesh: impl}})
weights = {{v.name: lowering.export_to_tf_tensor(v.outputs[0]).numpy()
            for v in graph.trainable_variables}}
expected = x_value
for s in range(4):
  h = np.maximum(expected @ weights["w"][s], 0)
  expected = expected + h @ weights["v"][s]
got = lowering.export_to_tf_tensor(y).numpy()
print(json.dumps({{"shape": y.shape.to_string, "names": sorted(weights),
                  "error": float(np.max(np.abs(got - expected))),
                  "scale": float(np.max(np.abs(expected)))}}))
"""
  result = readme_testing.run_python(tmp_path,
                                     _mlp_setup() + setup + code + checks)
  got = _result(result.stdout)
  assert got["shape"] == "Shape[batch=32, d_model=8]"
  assert got["names"] == ["v", "w"]
  assert got["error"] <= 1e-5 * max(1.0, got["scale"]), got


# ------------------------------------------------------------ the rest


def test_uneven_split_example_prints_padded_slices(capsys):
  code = block('impl = mtf.MeshImpl("b:2;m:4", rules)')
  exec(compile(code, "README.md", "exec"), {"mtf": mtf})  # pylint: disable=exec-used
  assert capsys.readouterr().out.strip() == "[15, 65]"


def test_split_dimension_example_slices_and_pads(capsys):
  """The example's figures are the lowering's: a padded 100 over 8 and
  the receives docs/layouts.md (where the README sends it) quotes."""
  code = block('moved = mtf.pad(head, [28, 0], "length")')
  scope = {"mtf": mtf, "np": np}
  exec(compile(code, "docs/layouts.md", "exec"),  # pylint: disable=exec-used
       scope)
  shape, counters = capsys.readouterr().out.strip().splitlines()
  assert shape == "[13, 4]"
  counters = ast.literal_eval(counters)
  assert counters == {"comm/receive/all/calls": 4,
                      "comm/receive/all/bytes": 5120,
                      "comm/receive/all/wire_bytes": 3504}
  text = " ".join((ROOT / "docs" / "layouts.md").read_text().split())
  assert "send 3,504 bytes over the wire in 4 receives" in text
  x = scope["x"]
  moved = scope["lowering"].export_to_tf_tensor(scope["moved"]).numpy()
  np.testing.assert_array_equal(moved, np.pad(x[:100], [(28, 0), (0, 0)]))
  # "gathering the length once would send 14,336"
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  seq = mtf.import_tf_tensor(mesh, x, "length:128;d:4")
  mtf.slicewise(lambda t: t, [seq], splittable_dims=["d"],
                unsplittable="gather")
  gathered = mtf.Lowering(graph, {mesh: scope["impl"]}).counters
  assert dict(gathered)["comm/allconcat/all/wire_bytes"] == 14336
  assert "would send 14,336" in text
  # The local attention figures are test_split_length_attention's.
  assert "8 receives (14,824 bytes on the wire)" in text


def test_error_message_example_is_the_real_one():
  text = block("IndivisibleError: Tensor import:0")
  intro = readme_testing.readme_text().split("```\nIndivisibleError")[0]
  # The program the README's sentence before the message describes.
  assert 'mtf.import_tf_tensor(mesh, x, "batch:6;d:8")' in " ".join(
      intro[-400:].split())
  assert "`all:4`" in intro[-400:] and "`batch:all`" in intro[-400:]
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = np.zeros([6, 8], np.float32)
  mtf.relu(mtf.import_tf_tensor(mesh, x, "batch:6;d:8"))
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:4", "batch:all")
  with pytest.raises(mtf.IndivisibleError) as info:
    mtf.Lowering(graph, {mesh: impl})
  assert " ".join(text.split()) == f"IndivisibleError: {info.value}"


def test_repository_layout_names_real_paths():
  """The layout's entries exist, and it names every top-level folder, every
  subpackage of mesh_tensorflow and of transformer/, and every file of
  docs/."""
  text = block("mesh_tensorflow/        the package")
  named, folder, docs_text = [], "", ""
  for line in text.splitlines():
    tokens = line.split()
    if not tokens:
      continue
    indent = len(line) - len(line.lstrip())
    if indent == 0:
      names = [tokens[0]]
      folder = tokens[0] if tokens[0].endswith("/") else ""
    elif indent == 2:
      names = [folder + t for t in itertools.takewhile(
          lambda t: t.endswith(("/", ".py")), tokens)]
    else:
      names = []
    named.extend(names)
    if folder == "docs/":
      docs_text += line
  assert len(named) > 10, named
  missing = [n for n in named if not (ROOT / n).exists()]
  assert not missing, f"the README's repository layout names {missing}"
  for top in ("mesh_tensorflow", "transformer", "examples", "tests",
              "benchmarks", "docs", "tools"):
    assert f"{top}/" in named, top
  packages = sorted(str(p.parent.relative_to(ROOT)) + "/"
                    for top in ("mesh_tensorflow", "transformer")
                    for p in (ROOT / top).glob("*/__init__.py"))
  unnamed = [p for p in packages if p not in named]
  assert not unnamed, f"the repository layout lacks {unnamed}"
  doc_names = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
  assert [d for d in doc_names if d not in docs_text] == []


def test_paths_named_in_the_text_exist():
  """Every entry point the README's text (and docs/'s, where its details
  went) names by path exists."""
  for path in [readme_testing.README] + readme_testing.docs():
    paths = set(re.findall(
        r"`(?:python )?((?:examples|benchmarks|tools|tests|docs)/[\w/]+\.\w+)",
        path.read_text()))
    assert paths or path != readme_testing.README
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{path.name} names {missing}"
  assert pathlib.Path(ROOT / "Makefile").exists()


def test_links_in_the_readme_and_docs_resolve():
  """Every relative Markdown link of README.md and docs/*.md names a file
  that exists (the README sends the reader to docs/ for the details)."""
  links = []
  for path in [readme_testing.README] + readme_testing.docs():
    text = re.sub(r"^```.*?^```", "", path.read_text(),
                  flags=re.DOTALL | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if not re.match(r"[a-z]+:|#", target):
        links.append((path, target.split("#")[0]))
  readme_links = [t for p, t in links if p == readme_testing.README]
  assert any(t.startswith("docs/") for t in readme_links), readme_links
  missing = [f"{p.name}: {t}" for p, t in links
             if not (p.parent / t).exists()]
  assert not missing, f"links to files that do not exist: {missing}"
