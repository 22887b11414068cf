"""The mesh implementation an estimator run lowers onto, from its config."""

import contextlib

import tensorflow as tf

from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.estimator import tpu_cluster


def tpu_strategy(config):
  """(strategy, logical_to_physical) for a config with mesh_impl "tpu".

  A strategy given in the config is used as it is, its replica order taken
  as the physical order; otherwise the estimator connects to
  `config.cluster` (see tpu_cluster.connect).
  """
  if config.strategy is not None:
    return config.strategy, None
  return tpu_cluster.connect(config.cluster,
                             shape_lib.convert_to_shape(config.mesh_shape))


def make_mesh_impl(config, tpu=None):
  """A new PlacementMeshImpl or SimdMeshImpl (host or TPU) for `config`.

  `tpu` is the (strategy, logical_to_physical) of a "tpu" config, made once
  by `tpu_strategy`. Call outside any tf.function: the implementation owns
  the variables.
  """
  if config.mesh_impl == "tpu":
    strategy, logical_to_physical = tpu or tpu_strategy(config)
    return simd_mesh_impl.make_simd_mesh_impl(
        config.mesh_shape, config.layout, strategy=strategy,
        devices=config.devices, logical_to_physical=logical_to_physical)
  if config.mesh_impl == "simd":
    return simd_mesh_impl.make_simd_mesh_impl(
        config.mesh_shape, config.layout, devices=config.devices)
  return placement_mesh_impl.PlacementMeshImpl(
      config.mesh_shape, config.layout, devices=config.devices)


def collective_errors(mesh_impl, steps=1):
  """A context bounding the collectives of `steps` steps of a SimdMeshImpl
  (its step function calls `mesh_impl.run`), whose timeout names the mesh
  and the limit (see SimdMeshImpl.collective_errors); nothing for other
  meshes."""
  explain = getattr(mesh_impl, "collective_errors", None)
  return explain(steps) if explain is not None else contextlib.nullcontext()


def make_serving_mesh_impl(device="/device:CPU:0"):
  """A one-processor mesh on `device`, for exported models."""
  return placement_mesh_impl.PlacementMeshImpl("all:1", "", devices=[device])


def mesh_runner(mesh_impl, fn):
  """A callable running fn(*args) on `mesh_impl`.

  For a SimdMeshImpl the call goes through `mesh_impl.run`, with nested
  arguments flattened into the program's tensor arguments (None leaves,
  such as the labels of an input_fn giving features only, are left out and
  put back); the program is one object, so SimdMeshImpl reuses its trace
  across calls.
  """
  if not isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl):
    return fn
  structure = []

  def program(*flat_args):
    args, size, present = structure[0]
    flat = [None] * size
    for index, value in zip(present, flat_args):
      flat[index] = value
    return fn(*tf.nest.pack_sequence_as(args, flat))

  def run(*args):
    flat = tf.nest.flatten(args)
    present = [i for i, value in enumerate(flat) if value is not None]
    if not structure:
      structure.append((args, len(flat), present))
    return mesh_impl.run(program, *[flat[i] for i in present])

  return run


def new_global_step(mesh_impl):
  """The int64 training step of a run (made where the program can read it:
  under the TPUStrategy of a TPU mesh implementation; a resource variable
  in graph mode too)."""
  strategy = getattr(mesh_impl, "strategy", None)
  scope = strategy.scope() if strategy is not None else (
      contextlib.nullcontext())
  with scope:
    return tf.Variable(
        0, dtype=tf.int64, trainable=False, name="global_step",
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
