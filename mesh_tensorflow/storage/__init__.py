"""Where variables live between steps: TF variables and checkpoints.

- `variable_store`: the TF variables of mtf variables' slices, created or
  found by name, and their initial values.
- `checkpointing`: checkpoints by mtf name, the same under every layout and
  in every execution mode.
- `autostack`: which variables a Lowering stores stacked together, one TF
  variable per processor (the Lowering's `autostack`, on by default).
- `session_hooks`: the original's `MtfRestoreHook` and
  `MtfCheckpointSaverListener`.
"""
