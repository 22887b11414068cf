"""TPUEstimator: the Estimator with TPUEstimator's arguments."""

from mesh_tensorflow.estimator import estimator as estimator_lib
from mesh_tensorflow.estimator import run_config as run_config_lib
from mesh_tensorflow.estimator.mode_keys import ModeKeys


class TPUEstimator(estimator_lib.Estimator):
  """Estimator taking TPUEstimator's batch-size and `use_tpu` arguments.

  input_fn gets the batch size of its mode as params["batch_size"] and
  params["use_tpu"]. With use_tpu=True the model runs on Cloud TPU cores,
  one mesh processor per core: a SimdMeshImpl with TPU collectives under
  the TPUStrategy of `config.cluster` (or `config.strategy`); evaluation
  too, unless eval_on_tpu=False, which evaluates on the host's devices
  (PlacementMeshImpl, same mesh and layout). With use_tpu=False the model
  runs on the config's mesh implementation on CPU/GPU. Exports always serve
  on one CPU device.
  """

  def __init__(self, model_fn=None, model_dir=None, config=None, params=None,
               use_tpu=True, train_batch_size=None, eval_batch_size=None,
               predict_batch_size=None, batch_axis=None,
               eval_on_tpu=True, export_to_tpu=True, warm_start_from=None):
    del batch_axis, export_to_tpu
    if warm_start_from is not None:
      raise NotImplementedError("TPUEstimator warm_start_from is not "
                                "supported.")
    config = config or run_config_lib.RunConfig()
    if use_tpu:
      config = config.replace(mesh_impl="tpu")
    elif config.mesh_impl == "tpu":
      raise ValueError("TPUEstimator(use_tpu=False) with RunConfig "
                       "mesh_impl='tpu': pass use_tpu=True, or pick "
                       "mesh_impl 'placement' or 'simd'.")
    super().__init__(model_fn, model_dir=model_dir, config=config,
                     params=params)
    self._batch_sizes = {ModeKeys.TRAIN: train_batch_size,
                         ModeKeys.EVAL: eval_batch_size,
                         ModeKeys.PREDICT: predict_batch_size}
    self._use_tpu = use_tpu
    self._eval_on_tpu = eval_on_tpu

  def _mesh_config(self, mode):
    if mode == ModeKeys.EVAL and self._use_tpu and not self._eval_on_tpu:
      return self.config.replace(mesh_impl="placement")
    return self.config

  def _input_params(self, mode):
    params = super()._input_params(mode)
    params["use_tpu"] = self._use_tpu and (mode != ModeKeys.EVAL or
                                           self._eval_on_tpu)
    if self._batch_sizes[mode] is not None:
      params["batch_size"] = self._batch_sizes[mode]
    return params
