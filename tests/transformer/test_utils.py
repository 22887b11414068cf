"""transformer.utils (model-building part) and the core's gin names."""

import inspect

import gin
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import utils


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_get_variable_dtype_defaults_and_gin_strings():
  dtype = utils.get_variable_dtype()
  assert (dtype.master_dtype, dtype.slice_dtype, dtype.activation_dtype) == (
      tf.bfloat16, tf.float32, tf.float32)
  gin.parse_config("""
      utils.get_variable_dtype.activation_dtype = "bfloat16"
      get_variable_dtype.master_dtype = "float32"
      """)
  dtype = utils.get_variable_dtype()
  assert (dtype.master_dtype, dtype.slice_dtype, dtype.activation_dtype) == (
      tf.float32, tf.float32, tf.bfloat16)
  assert isinstance(dtype, mtf.VariableDType)


@pytest.mark.parametrize("args,want", [
    (("4x4", 8), "batch:4;model:8"),
    (("2x2", 1), "batch:8"),
    (("v3-8", 8), "model:8"),
    (("v2-32", 2, 4), "ensemble:4;batch:4;model:2"),
    (("8x8", 1, 1), "batch:128"),
])
def test_tpu_mesh_shape(args, want):
  assert utils.tpu_mesh_shape(*args) == mtf.convert_to_shape(want)


def test_tpu_mesh_shape_errors_name_the_topology():
  with pytest.raises(ValueError, match="'4by4'"):
    utils.tpu_mesh_shape("4by4", 2)
  with pytest.raises(ValueError, match="model_parallelism=3"):
    utils.tpu_mesh_shape("2x2", 3)


def test_tpu_mesh_shape_through_gin_as_defaults_gin_uses_it():
  gin.parse_config("""
      import mesh_tensorflow.transformer.utils
      utils.tpu_mesh_shape.model_parallelism = 4
      utils.tpu_mesh_shape.tpu_topology = "v3-32"
      """)
  assert utils.tpu_mesh_shape() == mtf.convert_to_shape("batch:8;model:4")


def test_build_model_unknown_type():
  with pytest.raises(ValueError, match="'gpt'.*bitransformer"):
    utils.build_model("gpt", 8, 8)


def test_build_model_signature_is_the_originals():
  assert list(inspect.signature(utils.build_model).parameters) == [
      "model_type", "input_vocab_size", "output_vocab_size", "layout_rules",
      "mesh_shape"]


def test_core_configurables_under_the_original_names():
  gin.parse_config("""
      import mesh_tensorflow.optimize
      optimize.AdafactorOptimizer.beta1 = 0.5
      AdafactorOptimizer.decay_rate = @optimize.adafactor_decay_rate_pow()
      adafactor_decay_rate_pow.exponent = 0.5
      VarianceScalingInitializer.scale = 2.0
      mesh_tensorflow.layers.unit_scaling_convention.value = True
      """)
  # Gin's configurable builds the core class itself (registered without
  # rebinding mtf.optimize.AdafactorOptimizer), with the bindings.
  ref = gin.get_configurable("mesh_tensorflow.optimize.AdafactorOptimizer")
  built = ref()
  assert built.__class__ is mtf.optimize.AdafactorOptimizer
  assert built._beta1 == 0.5  # pylint: disable=protected-access
  # As in the original, a direct call sees the bindings too.
  optimizer = mtf.optimize.AdafactorOptimizer()
  assert optimizer._beta1 == 0.5  # pylint: disable=protected-access
  assert mtf.layers.VarianceScalingInitializer().scale == 2.0
  assert mtf.layers.unit_scaling_convention() is True
  for name in ["SgdOptimizer", "MomentumOptimizer", "AdamWeightDecayOptimizer",
               "AdafactorWithMultiLRSchedule", "AdamWithMultiLRSchedule",
               "product_learning_rate", "compute_lr_for_step"]:
    gin.get_configurable("mesh_tensorflow.optimize." + name)
  gin.get_configurable("mesh_tensorflow.beam_search.beam_search")
  gin.get_configurable("mesh_tensorflow.beam_search.greedy_decode")
  gin.get_configurable("mesh_tensorflow.layers.clip_activation_gradient")
  gin.get_configurable("mesh_tensorflow.simd_mesh_impl.SimdMeshImpl")


def test_core_signatures_unchanged_by_gin():
  assert list(inspect.signature(
      mtf.optimize.AdafactorOptimizer).parameters)[:3] == [
          "multiply_by_parameter_scale", "learning_rate", "decay_rate"]
  assert list(inspect.signature(
      mtf.layers.unit_scaling_convention).parameters) == ["value"]
