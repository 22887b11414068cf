"""The Transformer package, installed as `mesh_tensorflow.transformer`.

`transformer` holds the models (Unitransformer, Bitransformer) and the layer
stack; `transformer_layers` and `attention` the layers; `moe` mixture of
experts; `vocab_embeddings` embedding variants; `learning_rate_schedules` the
schedules; `utils` builds models from gin; `dataset` the tf.data input
pipelines (packing, padding, encoding); `vocabulary` turns text into ids and
back; `embedded_task` is the default data (addition written as text). Every
gin configurable has the original's name, so the original's gin files
(shipped in `gin/`) parse unchanged; `gin_bindings` registers the core's
configurables (optimizers, initializers) under the original's names.
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
