"""The mesh implementation an estimator run lowers onto, from its config."""

import tensorflow as tf

from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl


def make_mesh_impl(config):
  """A new PlacementMeshImpl or host SimdMeshImpl for `config`.

  Call outside any tf.function: the implementation owns the variables.
  """
  if config.mesh_impl == "simd":
    return simd_mesh_impl.make_simd_mesh_impl(
        config.mesh_shape, config.layout, devices=config.devices)
  return placement_mesh_impl.PlacementMeshImpl(
      config.mesh_shape, config.layout, devices=config.devices)


def make_serving_mesh_impl(device="/device:CPU:0"):
  """A one-processor mesh on `device`, for exported models."""
  return placement_mesh_impl.PlacementMeshImpl("all:1", "", devices=[device])


def mesh_runner(mesh_impl, fn):
  """A callable running fn(*args) on `mesh_impl`.

  For a SimdMeshImpl the call goes through `mesh_impl.run`, with nested
  arguments flattened into the program's tensor arguments; the program is
  one object, so SimdMeshImpl reuses its trace across calls.
  """
  if not isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl):
    return fn
  structure = []

  def program(*flat_args):
    return fn(*tf.nest.pack_sequence_as(structure[0], list(flat_args)))

  def run(*args):
    if not structure:
      structure.append(args)
    return mesh_impl.run(program, *tf.nest.flatten(args))

  return run
