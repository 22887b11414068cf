"""The training loop of the tests that train a model in every mode.

`run_steps` runs a training step, built and lowered by the caller, for a
number of steps and returns what each step fetched. The tests of sharding
(`sharding_training`), of the Transformer (`transformer/model_testing`), of
the optimizers and of autostacking train through it, so that every mode
runs a step the same way: the global step counts the steps, incremented
after each step's updates.
"""

import numpy as np
import tensorflow as tf

from mesh_tensorflow import global_step

MODES = ("eager", "function", "simd", "graph")


def run_steps(build, impl, mode, steps, fetch_after_step=False):
  """Runs `steps` training steps; returns each step's fetches as NumPy.

  Args:
    build: fn() -> (lowering, train_ops, fetches): builds and lowers one
      training step's mtf graph onto `impl`; train_ops are its lowered
      updates, fetches a structure of tf Tensors.
    impl: the mesh implementation lowered onto (a SimdMeshImpl in "simd"
      mode, see `mtf_testing.make_impl`).
    mode: "eager" and "function" build the step anew at every step (inside
      a tf.function for the latter); "simd" does so in a tf.function running
      the program on every processor (the fetches are processor 0's);
      "graph" builds it once in a compat tf.Graph and runs it in a Session.
    steps: the number of training steps.
    fetch_after_step: in graph mode, fetch in a Session.run of its own after
      the step's (reads of the variables, which would otherwise race with
      the updates), instead of with the step's.

  Returns:
    a list of `steps` structures of NumPy values.

  Raises:
    ValueError: an unknown mode.
  """
  if mode not in MODES:
    raise ValueError(f"Unknown mode {mode!r}; expected one of {MODES}.")
  if mode == "graph":
    return _run_steps_in_session(build, steps, fetch_after_step)
  step_variable = tf.Variable(0, dtype=tf.int64, trainable=False)

  def program():
    return build()[2]

  def run_step():
    fetches = impl.run_each(program)[0] if mode == "simd" else program()
    step_variable.assign_add(1)
    return fetches

  fn = run_step if mode == "eager" else tf.function(run_step)
  with global_step.global_step_scope(step_variable):
    return [tf.nest.map_structure(np.asarray, fn()) for _ in range(steps)]


def _run_steps_in_session(build, steps, fetch_after_step):
  with tf.Graph().as_default():
    step_variable = tf.compat.v1.train.get_or_create_global_step()
    lowering, train_ops, fetches = build()
    with tf.control_dependencies(train_ops):
      train_ops = list(train_ops) + [
          tf.compat.v1.assign_add(step_variable, 1)]
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      history = []
      for _ in range(steps):
        if fetch_after_step:
          sess.run(train_ops)
          history.append(sess.run(fetches))
        else:
          history.append(sess.run([train_ops, fetches])[1])
      return history
