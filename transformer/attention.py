"""Attention on named dimensions: the computation, its parameters, variants.

The original's `mesh_tensorflow.transformer.attention` module. It defines
nothing and re-exports the names from the modules that define them:

- `multihead_attention`: `attention` (dot-product attention over named
  dimensions), `AttentionParams` (the q, k, v and o projections),
  `attention_params_simple`, `visibility_mask_to_attention_bias`,
  `maybe_reshape_attention_input_for_2d_sharding`;
- `attention_variants`: `hybrid_attention`, `synthetic_attention`;
- `local_attention`: `local_attention_1d` (attention to a window around
  each position);
- `experts_attention_params`: `ExpertsAttentionParams` (projections by a
  mixture of experts).

The variants import `multihead_attention`, never this module.

Where this differs from the original: initial values are the original's
normal distributions, seeded by the variable's name so that every layout
starts alike; `compute_output` with keep_query_heads_dims also works with
combine_dims; `local_attention_1d` never lets a query see the zeros its
halo exchange puts before the first position; the "factorized" synthesizer
multiplies a table over query positions by one over memory positions.
"""

# pylint: disable=unused-import,g-bad-import-order
from mesh_tensorflow.transformer.layers.multihead_attention import AttentionParams
from mesh_tensorflow.transformer.layers.multihead_attention import attention
from mesh_tensorflow.transformer.layers.multihead_attention import attention_params_simple
from mesh_tensorflow.transformer.layers.multihead_attention import maybe_reshape_attention_input_for_2d_sharding
from mesh_tensorflow.transformer.layers.multihead_attention import visibility_mask_to_attention_bias
from mesh_tensorflow.transformer.layers.attention_variants import hybrid_attention
from mesh_tensorflow.transformer.layers.attention_variants import synthetic_attention
from mesh_tensorflow.transformer.layers.local_attention import local_attention_1d
from mesh_tensorflow.transformer.layers.experts_attention_params import ExpertsAttentionParams
