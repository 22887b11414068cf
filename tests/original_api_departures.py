"""Where this project departs from the original's public API, and why.

DEPARTURES maps "module.name" to the reason (TF1-only names that cannot mean
anything on TF2, ...); each is also listed in CONTRIBUTING.md. PENDING holds
names still being brought in line: it must shrink to nothing.
"""

DEPARTURES = {}

PENDING = {
    "mesh_tensorflow.CustomGradientOperation",
    "mesh_tensorflow.Depend",
    "mesh_tensorflow.LazyAllreduceSum",
    "mesh_tensorflow.LazyLaidOutTensor",
    "mesh_tensorflow.MeshImpl",
    "mesh_tensorflow.RandomOperation",
    "mesh_tensorflow.WhileLoopOperation",
    "mesh_tensorflow.compatible_lazy_allreduce_sums",
    "mesh_tensorflow.random_normal",
    "mesh_tensorflow.random_uniform",
    "mesh_tensorflow.layers.annealed_dropout",
    "mesh_tensorflow.layers.attention_bias_local_2d_block",
    "mesh_tensorflow.layers.compress_mean",
    "mesh_tensorflow.layers.dot_product_attention",
    "mesh_tensorflow.layers.local_1d_halo_exchange",
    "mesh_tensorflow.layers.local_2d_halo_exchange",
    "mesh_tensorflow.layers.local_2d_self_attention_spatial_blocks",
    "mesh_tensorflow.layers.local_self_attention_spatial_blocks",
    "mesh_tensorflow.layers.masked_local_attention_1d",
    "mesh_tensorflow.layers.masked_local_attention_1d_incremental",
    "mesh_tensorflow.layers.multihead_attention_vars",
    "mesh_tensorflow.layers.multihead_encdec_attention_incremental",
    "mesh_tensorflow.layers.multihead_self_attention_memory_compressed",
    "mesh_tensorflow.layers.summary_for_clip_activation_gradient",
    "mesh_tensorflow.layers.unit_scaling_convention",
    "mesh_tensorflow.layers.us_einsum",
    "mesh_tensorflow.optimize.AdafactorWithMultiLRSchedule",
    "mesh_tensorflow.optimize.AdamWithMultiLRSchedule",
    "mesh_tensorflow.optimize.MomentumOptimizer",
    "mesh_tensorflow.optimize.compute_lr_for_step",
    "mesh_tensorflow.optimize.product_learning_rate",
    "mesh_tensorflow.optimize.reduce_rms",
    "mesh_tensorflow.placement_mesh_impl.PlacementMeshImpl",
    "mesh_tensorflow.placement_mesh_impl.allconcat_ring",
    "mesh_tensorflow.placement_mesh_impl.allreduce_ring",
    "mesh_tensorflow.placement_mesh_impl.allreduce_ring_single_shard",
    "mesh_tensorflow.placement_mesh_impl.alltoall_pointtwise",
    "mesh_tensorflow.placement_mesh_impl.alltoall_ring",
    "mesh_tensorflow.simd_mesh_impl.HierarchicalTiling",
    "mesh_tensorflow.simd_mesh_impl.SimdMeshImpl",
    "mesh_tensorflow.simd_mesh_impl.auto_logical_to_physical_tpu",
    "mesh_tensorflow.simd_mesh_impl.physical_shape_3d_from_topology_proto_4d",
    "mesh_tensorflow.test_utils.NumpyConverter",
    "mesh_tensorflow.tpu_variables.ReplicatedVariable",
    "mesh_tensorflow.utils.BalancedVariablePlacer",
    "mesh_tensorflow.utils.create_host_call",
    "mesh_tensorflow.utils.remove_summaries",
    "mesh_tensorflow.utils.topology_rank",
}
