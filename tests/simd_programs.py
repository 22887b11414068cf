"""An mtf program exercising every collective, run on a mesh implementation.

Shared by the SimdMeshImpl tests (host and TPU back ends), which compare its
results with PlacementMeshImpl's.
"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl

RNG = np.random.RandomState(11)
X = RNG.randn(8, 4).astype(np.float32)
INTS = RNG.randint(-50, 50, size=(8, 16)).astype(np.int32)

BATCH = mtf.Dimension("batch", 8)
IO = mtf.Dimension("io", 4)
HIDDEN = mtf.Dimension("hidden", 16)


def ops_program(mesh, x, ints):
  """Exercises allreduce (sum/max/min, int, bool), allconcat, alltoall,
  receive, import/export, random and a variable update."""
  xm = mtf.import_tf_tensor(mesh, x, [BATCH, IO])
  im = mtf.import_tf_tensor(mesh, ints, [BATCH, HIDDEN])
  w = mtf.get_variable(mesh, "w", [IO, HIDDEN])
  h = mtf.tanh(mtf.einsum([xm, w], [BATCH, HIDDEN]))
  loss = mtf.reduce_sum(mtf.square(h))
  (grad,) = mtf.gradients([loss], [w])
  update = mtf.assign_sub(w, grad * 0.1)
  folded = mtf.reshape(h, [mtf.Dimension("rows", 4),
                           mtf.Dimension("cols", 32)])
  return {
      "loss": loss,
      "h": h,
      "max_over_batch": mtf.reduce_max(h, reduced_dim=BATCH),
      "min_over_hidden": mtf.reduce_min(h, reduced_dim=HIDDEN),
      "int_sum": mtf.reduce_sum(im, reduced_dim=BATCH),
      "any_positive": mtf.reduce_any(mtf.greater(im, 40),
                                     reduced_dim=HIDDEN),
      "folded": folded,
      "shifted": mtf.shift(h, 1, HIDDEN, wrap=False),
      "rolled": mtf.shift(h, -3, BATCH, wrap=True),
      "noise": mtf.random_uniform(mesh, [BATCH, HIDDEN], seed=5),
      "grad": grad,
  }, update


def run_ops_program(impl, mode, steps=2):
  """Runs the ops program `steps` times; returns the list of outputs."""

  def program(x, ints):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs, _ = ops_program(mesh, x, ints)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}

  if isinstance(impl, simd_mesh_impl.SimdMeshImpl):
    step = lambda x, ints: impl.run(program, x, ints)
  else:
    step = program
  if mode == "function":
    step = tf.function(step)
  return [tf.nest.map_structure(np.asarray, step(tf.constant(X),
                                                 tf.constant(INTS)))
          for _ in range(steps)]


def assert_same_results(got_steps, want_steps):
  """Integers equal, floats to round-off, at every step."""
  for step, (got, want) in enumerate(zip(got_steps, want_steps)):
    for name in want:
      if want[name].dtype.kind in "biu":
        np.testing.assert_array_equal(got[name], want[name],
                                      err_msg=f"{name} step {step}")
      else:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5,
                                   atol=1e-6, err_msg=f"{name} step {step}")
