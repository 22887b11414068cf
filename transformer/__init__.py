"""The Transformer package, installed as `mesh_tensorflow.transformer`.

The top level keeps the original's module paths, which programs import:
`transformer` (the models and the layer stack), `transformer_layers` and
`attention` (the layers), `moe` mixture of experts, `vocab_embeddings`
embedding variants, `learning_rate_schedules`, `utils` (builds and runs
models from gin), `main` (the binary), `dataset` (the tf.data input
pipelines), `vocabulary` (text to ids and back), and the original's model
variants (adaptive_softmax, evolved_transformer, fixup_layers,
funnel_transformer, memory_layers, universal_transformer).

This project's modules sit in subpackages by role, and the modules above
re-export their names: `models/` (layer stacks, Unitransformer,
Bitransformer, decoding), `layers/` (the layers by family, sublayers, MoE
internals), `binary/` (the parts of `utils.run`, its progress display,
`gin_bindings`, which registers the core's configurables under the
original's names, and `config_errors`), `data/` (`embedded_task`, the
default data: addition written as text). Every gin configurable has the
original's name, so the original's gin files (shipped in `gin/`) parse
unchanged.
"""

from mesh_tensorflow.transformer import adaptive_softmax
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer.data import embedded_task
from mesh_tensorflow.transformer import evolved_transformer
from mesh_tensorflow.transformer import funnel_transformer
from mesh_tensorflow.transformer.binary import gin_bindings
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import memory_layers
from mesh_tensorflow.transformer import moe
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocab_embeddings
from mesh_tensorflow.transformer import vocabulary
