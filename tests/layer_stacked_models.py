"""A small model of 4 identical layers, with per-layer or layer-stacked
variables, for the tests of mtf.stack_layer_variables."""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.randomness import tf_initializers

LAYERS = 4
STAGE = mtf.Dimension("stage", LAYERS)
BATCH = mtf.Dimension("batch", 4)
D = mtf.Dimension("d", 8)
H = mtf.Dimension("h", 16)
X = np.random.RandomState(3).randn(BATCH.size, D.size).astype(np.float32)
VARIABLES = ["dense/kernel", "dense/out", "scale", "bias"]
MEMBERS = sorted(f"block_{i:03d}/{v}" for i in range(LAYERS)
                 for v in VARIABLES)


def fill_by_fan_in(shape, dtype=tf.float32):
  """A plain initializer whose value depends on the shape it is called on
  (1 / first dimension): rows must be initialised on the row shape."""
  return tf.fill(shape, tf.cast(1.0 / shape[0], dtype))


def layer_variables(mesh):
  """One layer's variables, under the current variable scope."""
  out_init = tf_initializers.seeded(
      "random_normal_initializer", tf_initializers.name_seed("dense/out"),
      stream=2, stddev=0.3)
  return {
      "kernel": mtf.get_variable(mesh, "dense/kernel", [D, H]),
      "out": mtf.get_variable(mesh, "dense/out", [H, D],
                              initializer=out_init),
      "scale": mtf.get_variable(mesh, "scale", [D],
                                initializer=fill_by_fan_in),
      "bias": mtf.get_variable(mesh, "bias", [D],
                               initializer=tf.zeros_initializer()),
  }


def members(full_name):
  """The member names of a variable built in the scope "block_000"."""
  return [full_name.replace("block_000", f"block_{i:03d}", 1)
          for i in range(LAYERS)]


def layers(mesh, stacked):
  """The variables of every layer, a list of dicts (rows when stacked)."""
  if not stacked:
    result = []
    for i in range(LAYERS):
      with tf.compat.v1.variable_scope(f"block_{i:03d}"):
        result.append(layer_variables(mesh))
    return result
  with mtf.stack_layer_variables(STAGE, members):
    with tf.compat.v1.variable_scope("block_000"):
      stacked_vars = layer_variables(mesh)
  rows = {k: mtf.unstack(v, STAGE) for k, v in stacked_vars.items()}
  return [{k: rows[k][i] for k in rows} for i in range(LAYERS)]


def loss(mesh, stacked):
  """The mean square of the last layer's output."""
  x = mtf.import_tf_tensor(mesh, tf.constant(X), mtf.Shape([BATCH, D]))
  for v in layers(mesh, stacked):
    h = mtf.relu(mtf.einsum([x, v["kernel"]], mtf.Shape([BATCH, H])))
    x = mtf.einsum([h, v["out"]], mtf.Shape([BATCH, D])) * v["scale"] + (
        v["bias"] + x)
  return mtf.reduce_mean(mtf.square(x))


def rows_by_member(values, graph):
  """{member or variable name: value} from {mtf name: value} of a graph's
  variables."""
  out = {}
  for var in graph.all_variables:
    if var.name not in values:
      continue
    value = values[var.name]
    if var.member_names is None:
      out[var.name] = value
    else:
      for row, name in enumerate(var.member_names):
        out[name] = value[row]
  return out
