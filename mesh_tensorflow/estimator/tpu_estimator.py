"""TPUEstimator: the Estimator with TPUEstimator's arguments."""

from mesh_tensorflow.estimator import estimator as estimator_lib
from mesh_tensorflow.estimator.mode_keys import ModeKeys


class TPUEstimator(estimator_lib.Estimator):
  """Estimator taking TPUEstimator's batch-size and `use_tpu` arguments.

  input_fn gets the batch size of its mode as params["batch_size"]. With
  use_tpu=False the model runs on the RunConfig's mesh on CPU/GPU.
  use_tpu=True needs a TPUStrategy over real TPU cores, which this
  estimator does not drive yet: it raises a clear error.
  """

  def __init__(self, model_fn=None, model_dir=None, config=None, params=None,
               use_tpu=True, train_batch_size=None, eval_batch_size=None,
               predict_batch_size=None, batch_axis=None,
               eval_on_tpu=True, export_to_tpu=True, warm_start_from=None):
    del batch_axis, eval_on_tpu, export_to_tpu
    if warm_start_from is not None:
      raise NotImplementedError("TPUEstimator warm_start_from is not "
                                "supported.")
    if use_tpu:
      raise NotImplementedError(
          "TPUEstimator(use_tpu=True) is not supported: no TPU strategy is "
          "wired into the estimator. Use use_tpu=False (CPU/GPU), or run "
          "the model with mtf.simd_mesh_impl.make_simd_mesh_impl(..., "
          "strategy=tf.distribute.TPUStrategy(...)) directly.")
    super().__init__(model_fn, model_dir=model_dir, config=config,
                     params=params)
    self._batch_sizes = {ModeKeys.TRAIN: train_batch_size,
                         ModeKeys.EVAL: eval_batch_size,
                         ModeKeys.PREDICT: predict_batch_size}
    self._use_tpu = use_tpu

  def _input_params(self, mode):
    params = super()._input_params(mode)
    params["use_tpu"] = self._use_tpu
    if self._batch_sizes[mode] is not None:
      params["batch_size"] = self._batch_sizes[mode]
    return params
