"""What `import mesh_tensorflow` and running a program leave process-wide.

A strategy is active for a graph, a mesh or a scope because the program
said so, never because a module was imported. In a fresh interpreter this
imports mesh_tensorflow, then builds and lowers a small program that uses
layer stacking, gradient batching, seeded initializers, optimizer slots and
autostack, and reports every module-level container of the package that is
filled at import or that the program filled. Only the declared tables may
be: the operations' cost rules (and the autograph rule, which lives in
TensorFlow's own config).
"""

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import json
import sys
import types

import mesh_tensorflow as mtf
import tensorflow as tf
from mesh_tensorflow import extensions
from mesh_tensorflow.strategies import gradient_batching


def containers():
  found = {}
  for name, module in list(sys.modules.items()):
    if not (name == "mesh_tensorflow" or name.startswith("mesh_tensorflow.")):
      continue
    for attr, value in list(vars(module).items()):
      if isinstance(value, (list, dict, set)) and not attr.startswith("__"):
        found[f"{name}.{attr}"] = (value, len(value))
  return found


at_import = containers()
report = {"extension_lists": sorted(
    attr for attr, value in vars(extensions).items()
    if isinstance(value, list) and value)}

graph = mtf.Graph()
mesh = mtf.Mesh(graph, "mesh")
batch = mtf.Dimension("batch", 4)
d = mtf.Dimension("d", 3)
stage = mtf.Dimension("stage", 2)
x = mtf.ones(mesh, [batch, d])
with mtf.stack_layer_variables(stage, lambda n: [f"l{i}/{n}" for i in "01"]):
  w = mtf.get_variable(
      mesh, "w", [d], initializer=tf.compat.v1.random_normal_initializer())
  v = mtf.layers.dense(x, d, name="dense", use_bias=False)
u = mtf.get_variable(
    mesh, "u", [d], initializer=tf.compat.v1.random_normal_initializer())
y = mtf.einsum([x, w], output_shape=[batch, stage, d])
z = mtf.einsum([x, w], output_shape=[batch, stage, d])
gradient_batching.mark(y.operation, "k")
gradient_batching.mark(z.operation, "k")
loss = (mtf.reduce_sum(y) + mtf.reduce_sum(z) + mtf.reduce_sum(v) +
        mtf.reduce_sum(u))
variables = graph.trainable_variables
grads = mtf.gradients([loss], [t.outputs[0] for t in variables])
mtf.optimize.AdafactorOptimizer().apply_grads(grads, variables)
report["used"] = sorted({
    "gradient batching" for op in graph.operations
    if "batched_gradient" in op.name} | {
    "stacked slots" for v in graph.all_variables
    if v.member_names and v.name.endswith("slot_v")} | {
    "seed origins" for v in graph.all_variables
    if getattr(v.initializer, "seed_origin", None) == "u"})
impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "")
mtf.Lowering(graph, {mesh: impl})
report["batch_gradients_default"] = getattr(mtf.Graph(), "batch_gradients",
                                            None)

report["filled_at_import"] = sorted(
    key for key, (value, size) in at_import.items()
    if size and ("regist" in key.lower() or "rule" in key.lower() or
                 "creator" in key.lower() or "rewrite" in key.lower() or
                 "planner" in key.lower()))
report["filled_by_the_program"] = sorted(
    key for key, (value, size) in at_import.items() if len(value) != size)
print("REPORT" + json.dumps(report))
"""


def test_import_and_a_program_register_nothing_process_wide():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
  result = subprocess.run([sys.executable, "-c", _SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
  lines = [l for l in result.stdout.splitlines() if l.startswith("REPORT")]
  assert lines, result.stderr[-3000:]
  report = json.loads(lines[-1][len("REPORT"):])
  # No process-wide variable creators, gradient rewrites or planners.
  assert report["extension_lists"] == []
  # The only registry filled at import: the cost rules of the operations.
  assert report["filled_at_import"] == [
      "mesh_tensorflow.ops.cost_rules._RULES"], report
  assert report["used"] == ["gradient batching", "seed origins",
                            "stacked slots"], report
  # Gradient batching: on by default, a setting of the graph.
  assert report["batch_gradients_default"] is True
  # A program leaves nothing behind it (no map of seeds to names).
  assert report["filled_by_the_program"] == [], report
