"""The Transformer models and their layer stacks.

`layer_stack` (TransformerLayer, Context, LayerStack), `pipelined_layer_stack`,
`unitransformer`, `bitransformer`, `decoding` (sampling and beam search) and
`model_helpers` (embeddings, ensemble reductions, input helpers). The
original's `transformer` module re-exports them under its names, which gin
registers.
"""
