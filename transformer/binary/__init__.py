"""The training binary's modules (`main` is its entry point).

`utils.run` runs a model from gin settings; these modules are its parts:
`run_resolution` (its arguments resolved once into a ResolvedRun),
`run_modes` (each mode's driver of a ResolvedRun), `run_settings` (its
gin-configured settings), `run_devices`, `run_auto_layout` (the layout
search), `run_model_fn`, `run_training`, `run_checkpoints`, `run_eval`,
`run_inference`, `run_scoring`, `run_features`; `progress` (the progress
display), `gin_bindings` (the core's configurables under the original's gin
names) and `config_errors` (gin errors as short messages). None is an
original module path: programs import `utils` and `main`.
"""
