"""The Transformer's layers, by family.

The original's `transformer_layers`, `attention` and `transformer` modules
re-export them under the original's names (and gin registers them there):
attention (`multihead_attention`, `attention_variants`, `local_attention`,
`experts_attention_params`), the attention layers (`self_attention_layers`,
`attention_layer_variants`, `talking_heads_layers`, `local_self_attention`,
`experts_attention_layers`), `dense_layers`, `convolution_layers`, the
`sublayers` a layer stack runs around its layers, the mixture-of-experts
internals behind `moe` (`moe_layers`, `moe_gating`) and
`seeded_initializers`.
"""
