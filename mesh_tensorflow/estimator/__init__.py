"""tf.estimator-style training of mtf models on TF2.

`Estimator(model_fn, model_dir, config, params)` trains, evaluates, predicts
and exports a model function that builds an mtf graph and lowers it onto
`params["mesh_impl"]`; `RunConfig` chooses the mesh, the layout, the mesh
implementation and the checkpoint, summary and logging intervals.
`TPUEstimator` keeps TPUEstimator's arguments. `metrics` has eval metrics
accumulated over the whole evaluation set (weighted mean, sum, max).
Checkpoints of the original library (TF1 name-based) restore too, and
`RunConfig(init_checkpoint=...)` warm-starts training from either kind.
"""

from mesh_tensorflow.estimator import metrics
from mesh_tensorflow.estimator.checkpoints import remove_partial_checkpoints
from mesh_tensorflow.estimator.estimator import Estimator
from mesh_tensorflow.estimator.estimator_spec import EstimatorSpec
from mesh_tensorflow.estimator.estimator_spec import TPUEstimatorSpec
from mesh_tensorflow.estimator.export import build_raw_serving_input_receiver_fn
from mesh_tensorflow.estimator.export import ServingInputReceiver
from mesh_tensorflow.estimator.mode_keys import ModeKeys
from mesh_tensorflow.estimator.run_config import RunConfig
from mesh_tensorflow.estimator.run_config import TPUConfig
from mesh_tensorflow.estimator.tpu_estimator import TPUEstimator
