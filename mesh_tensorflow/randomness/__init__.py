"""Layout-invariant randomness: the same numbers under every layout.

- `philox`: the counter-based generator, per element of the full tensor.
- `stateless_random`, `stateless_uniform`: random ops whose slices draw
  their part of the full tensor's numbers.
- `tf_initializers`: TF initializers seeded by the variable's name.
- `run_seed`: the run's seed, mixed into every seed taken from a name.
"""
