"""Idle pipeline slots: operations a processor may skip (placement only).

In iteration t of `mtf.pipeline` the stage slots outside the busy range hold
no micro-batch (the bubble). The stage function still runs on all slots, so
an SPMD program stays one program; but a processor whose slot is idle
computes on zeros a value that is discarded (forward: the iteration's output
is replaced by zeros there) or is exactly zero (backward: every gradient is
linear in the output gradient, which is zero there). On PlacementMeshImpl,
where each processor's operations are its own, those computations can be
skipped: the slices of an idle processor are zeros instead. On shared
hardware (logical devices on a few cores) that saves the bubble's work; on
real devices it frees them while they wait.

`mark_iteration` annotates (see mesh_tensorflow.extensions) each operation
of the stage function that depends on the iteration's buffers and whose
outputs all have the stage dimension with the stages that are idle; the
annotation passes itself on to the operations its operation's gradient
creates, and has the Lowering lower its operation with the mesh
implementation's `idle_processors` view (which only PlacementMeshImpl
honours) for the processors holding idle stages, when the stage dimension
is split over a mesh dimension of its size (one stage per processor).
"""

import dataclasses

from mesh_tensorflow import extensions
from mesh_tensorflow.backend import processors
from mesh_tensorflow import shape as shape_lib


@dataclasses.dataclass(frozen=True)
class IdleSlots(extensions.Annotation):
  """The stages of `stage_dim` that hold no micro-batch."""
  stage_dim: shape_lib.Dimension
  idle_stages: frozenset

  def covers(self, operation):
    """Whether every output of `operation` has the stage dimension (so
    its slices on an idle stage's processors belong to that stage)."""
    return bool(operation.outputs) and all(
        self.stage_dim in t.shape.dims for t in operation.outputs)

  def processors(self, mesh_impl):
    """The processors holding idle stages (none unless the stage dimension
    is split over a mesh dimension of its size)."""
    axis = mesh_impl.tensor_dimension_to_mesh_axis(self.stage_dim)
    if axis is None or mesh_impl.shape[axis].size != self.stage_dim.size:
      return frozenset()
    return frozenset(
        pnum for pnum in range(mesh_impl.size)
        if processors.pnum_to_processor_coordinates(
            mesh_impl.shape, pnum)[axis] in self.idle_stages)


  def lowering_scope(self, operation, lowering):
    """The idle stages' processors may give zeros instead."""
    impl = lowering.mesh_impl(operation)
    return lowering.using(impl.idle_processors(self.processors(impl)))

  def gradient_created(self, operation, created):
    """Marks the operations of `operation`'s gradient as it is."""
    for op in created:
      if self.covers(op):
        op.annotate(self)


def of(operation):
  """The IdleSlots mark of `operation`, or None."""
  return operation.annotation(IdleSlots)


def mark_iteration(operations, buffers, stage_dim, idle_stages):
  """Marks the `operations` (of one call of a stage function, in order)
  that depend on `buffers` and whose outputs all have the stage
  dimension."""
  if not idle_stages:
    return
  slots = IdleSlots(stage_dim, frozenset(idle_stages))
  dependent = set(buffers)
  for op in operations:
    if any(x in dependent for x in op.inputs):
      dependent.update(op.outputs)
      if slots.covers(op):
        op.annotate(slots)
