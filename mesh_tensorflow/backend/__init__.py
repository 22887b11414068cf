"""What the mesh implementations are built from.

The three implementations stay where the original had them
(`mesh_tensorflow.placement_mesh_impl`, `mesh_tensorflow.simd_mesh_impl`,
with their base class in `mesh_tensorflow.mesh_impl`); their parts live
here:

- `processors`: processor numbers, coordinates and groups on a mesh.
- `slice_utils`: which part of a full tensor each processor holds.
- `placement_collectives`, `simd_collectives`, `tpu_collectives`: the
  collectives of each implementation (one TF op per device, TF's
  collective ops, XLA's cross-replica ops).
- `placement_variables`: the placement implementation's per-device
  variables (and autostacked storage).
- `tpu_topology`: TPU device assignment and physical meshes.
"""
