"""Transformer models on Mesh TensorFlow: layers, context, stacks, models.

A model is plain Python objects configured by gin: a `LayerStack` of
`TransformerLayer`s inside a `Unitransformer` (a language model or one half
of a `Bitransformer`). This module is the original's
`mesh_tensorflow.transformer.transformer`: it defines nothing and re-exports
the names from the modules that define them, which gin registers under this
module's name:

- `layer_stack`: `TransformerLayer`, `Context`, `LayerStack`,
  `ReversibleLayerStack`, `make_layer_stack` and the decoding modes
  `FIRST_PART` and `INCREMENTAL`;
- `pipelined_layer_stack`: `PipelinedLayerStack`, a LayerStack run as
  pipelined stages (not in the original);
- `sublayers`: the `sublayer_*` functions a LayerStack wraps layers in;
- `model_helpers`: embeddings, ensemble reductions and input helpers;
- `unitransformer` and `bitransformer`: the models and their constructors.

The models import `layer_stack`, never this module, so importing any of
them does not need the others.
"""

# pylint: disable=unused-import,g-bad-import-order
from mesh_tensorflow.transformer.models.layer_stack import Context
from mesh_tensorflow.transformer.models.layer_stack import FIRST_PART
from mesh_tensorflow.transformer.models.layer_stack import INCREMENTAL
from mesh_tensorflow.transformer.models.layer_stack import LayerStack
from mesh_tensorflow.transformer.models.layer_stack import ReversibleLayerStack
from mesh_tensorflow.transformer.models.layer_stack import TransformerLayer
from mesh_tensorflow.transformer.models.layer_stack import make_layer_stack
from mesh_tensorflow.transformer.models.pipelined_layer_stack import PipelinedLayerStack
from mesh_tensorflow.transformer.layers.sublayers import sublayer_annealed_dropout
from mesh_tensorflow.transformer.layers.sublayers import sublayer_call_layer
from mesh_tensorflow.transformer.layers.sublayers import sublayer_clip_activation_gradient
from mesh_tensorflow.transformer.layers.sublayers import sublayer_dropout
from mesh_tensorflow.transformer.layers.sublayers import sublayer_legacy_dropout
from mesh_tensorflow.transformer.layers.sublayers import sublayer_legacy_final_rms_norm
from mesh_tensorflow.transformer.layers.sublayers import sublayer_legacy_rms_norm
from mesh_tensorflow.transformer.layers.sublayers import sublayer_mask_padding
from mesh_tensorflow.transformer.layers.sublayers import sublayer_residual
from mesh_tensorflow.transformer.layers.sublayers import sublayer_rezero
from mesh_tensorflow.transformer.layers.sublayers import sublayer_rms_norm
from mesh_tensorflow.transformer.layers.sublayers import sublayer_rms_norm_subsampled
from mesh_tensorflow.transformer.layers.sublayers import sublayer_scale_norm
from mesh_tensorflow.transformer.layers.sublayers import sublayer_true_layer_norm
from mesh_tensorflow.transformer.models.model_helpers import VocabEmbedding
from mesh_tensorflow.transformer.models.model_helpers import autoregressive_inputs
from mesh_tensorflow.transformer.models.model_helpers import delimited_lm_inputs_mask
from mesh_tensorflow.transformer.models.model_helpers import get_vocab_embedding_cls
from mesh_tensorflow.transformer.models.model_helpers import reduce_ensemble_logits
from mesh_tensorflow.transformer.models.model_helpers import reduce_ensemble_logits_mean_logit
from mesh_tensorflow.transformer.models.model_helpers import reduce_ensemble_logits_mean_prob
from mesh_tensorflow.transformer.models.model_helpers import reduce_ensemble_logits_select
from mesh_tensorflow.transformer.models.model_helpers import shift_targets
from mesh_tensorflow.transformer.models.model_helpers import sinusoid_positional_embedding_weights
from mesh_tensorflow.transformer.models.unitransformer import Unitransformer
from mesh_tensorflow.transformer.models.bitransformer import Bitransformer
from mesh_tensorflow.transformer.models.bitransformer import StudentTeacher
from mesh_tensorflow.transformer.models.bitransformer import make_bi_student_teacher
from mesh_tensorflow.transformer.models.bitransformer import make_bitransformer
