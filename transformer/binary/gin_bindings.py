"""Gin names for the core's configurables, as the original had them.

The original decorated a few core classes and functions with
`@gin.configurable` (optimizers, `layers.VarianceScalingInitializer`,
`simd_mesh_impl.SimdMeshImpl`, ...), and its gin files and operative configs
bind them (`utils.run.optimizer = @optimize.AdafactorOptimizer`,
`AdafactorOptimizer.decay_rate = ...`). Gin stays out of the core here: the
core marks those callables with `mesh_tensorflow.configurable.configurable`,
and this module, imported by the Transformer package, registers each under
the original's module and name and routes the marked callable through gin's
wrapper (`configurable.set_configured`). Nothing in the core is rebound or
mutated: `mtf.layers.unit_scaling_convention` and `AdafactorOptimizer` are
the same objects, with the same attributes, before and after.

As in the original, the bindings reach every call: a direct
`mtf.optimize.AdafactorOptimizer()`, `layers.unit_scaling_convention()`
inside `us_einsum`, the `VarianceScalingInitializer()` that `dense` builds.
A gin reference (`@optimize.AdafactorOptimizer`) gives a stand-in subclass
that gin registers; calling it builds the core class itself. With no
bindings, everything behaves as before.
"""

import gin

from mesh_tensorflow import beam_search
from mesh_tensorflow import configurable
from mesh_tensorflow import layers
from mesh_tensorflow import optimize
from mesh_tensorflow import simd_mesh_impl

# (core module object, the original's module name, names in it).
CORE_CONFIGURABLES = (
    (beam_search, "mesh_tensorflow.beam_search",
     ("beam_search", "greedy_decode")),
    (layers, "mesh_tensorflow.layers",
     ("VarianceScalingInitializer", "clip_activation_gradient",
      "unit_scaling_convention")),
    (optimize, "mesh_tensorflow.optimize",
     ("AdafactorOptimizer", "AdafactorWithMultiLRSchedule",
      "AdamWeightDecayOptimizer", "AdamWithMultiLRSchedule",
      "MomentumOptimizer", "SgdOptimizer", "adafactor_decay_rate_pow",
      "compute_lr_for_step", "product_learning_rate")),
    (simd_mesh_impl, "mesh_tensorflow.simd_mesh_impl", ("SimdMeshImpl",)),
)


def _stand_in(cls):
  """A subclass for gin to decorate in place instead of `cls`.

  Its `__init__` is the core class's unconfigured one, so gin's wrapper of
  it applies the bindings and records them in the operative config; calling
  the stand-in builds an instance of `cls` itself.
  """

  def __new__(unused_stand_in, *args, **kwargs):
    return cls(*args, **kwargs)

  return type(cls.__name__, (cls,), {
      "__init__": configurable.unconfigured(cls),
      "__new__": __new__,
      "__module__": cls.__module__,
      "__qualname__": cls.__qualname__,
      "__doc__": cls.__doc__,
  })


def _register(target, module_name, name):
  if isinstance(target, type):
    stand_in = gin.configurable(name, module=module_name)(_stand_in(target))
    configurable.set_configured(target, stand_in.__dict__["__init__"])
  else:
    configured = gin.external_configurable(
        configurable.unconfigured(target), name=name, module=module_name)
    configurable.set_configured(target, configured)


def _register_all():
  for module, module_name, names in CORE_CONFIGURABLES:
    for name in names:
      _register(getattr(module, name), module_name, name)


_register_all()
