"""Core callables whose arguments a configuration system may supply.

The original decorated a few core functions and classes with
`@gin.configurable` (the optimizers, `layers.VarianceScalingInitializer`,
`layers.unit_scaling_convention`, `simd_mesh_impl.SimdMeshImpl`, ...), so
that gin bindings reached the calls the core makes itself: `us_einsum` asks
`unit_scaling_convention()`, `dense` builds a `VarianceScalingInitializer()`.
Gin belongs to the Transformer package here, not to the core. The core marks
those callables with `configurable` when it defines them; a marked callable
behaves exactly as written until a configuration system routes it through a
replacement with `set_configured` (the Transformer's `gin_bindings` installs
gin's wrappers). Nothing is rebound: a marked function or class is the same
object, with the same attributes, before and after.

This module imports nothing from the package, so any module may use it.
"""

import functools

# The marked callables, in the order they were marked.
_MARKED = []
# A marked callable -> the replacement its calls go through.
_CONFIGURED = {}


def configurable(fn_or_cls):
  """Marks a core function or class as configurable from outside.

  A function's calls, or a class's `__init__`, go through the replacement
  that `set_configured` installed, if any; otherwise they run as written.

  Args:
    fn_or_cls: a function or a class.

  Returns:
    the marked function (a wrapper with the same name, signature and
    docstring), or the class itself (its `__init__` wrapped once, here).
  """
  if isinstance(fn_or_cls, type):
    cls = fn_or_cls
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
      configured = _CONFIGURED.get(cls)
      (init if configured is None else configured)(self, *args, **kwargs)

    __init__.unconfigured = init
    cls.__init__ = __init__
    _MARKED.append(cls)
    return cls

  fn = fn_or_cls

  @functools.wraps(fn)
  def call(*args, **kwargs):
    configured = _CONFIGURED.get(call)
    return (fn if configured is None else configured)(*args, **kwargs)

  call.unconfigured = fn
  _MARKED.append(call)
  return call


def unconfigured(target):
  """What a marked callable runs without configuration: the function as
  written, or a class's `__init__` as written (it takes `self`)."""
  _check_marked(target)
  if isinstance(target, type):
    return target.__dict__["__init__"].unconfigured
  return target.unconfigured


def set_configured(target, replacement):
  """Routes the calls of a marked callable through `replacement`.

  Args:
    target: a callable marked with `configurable`.
    replacement: for a function, a callable taking its arguments (it
      should end by calling `unconfigured(target)`); for a class, a
      callable taking `__init__`'s arguments, `self` first (it should end
      by calling `unconfigured(target)`); None to run as written again.
  """
  _check_marked(target)
  if replacement is None:
    _CONFIGURED.pop(target, None)
  else:
    _CONFIGURED[target] = replacement


def marked():
  """The callables marked with `configurable`, in the order marked."""
  return list(_MARKED)


def _check_marked(target):
  if target not in _MARKED:
    raise ValueError(
        f"{getattr(target, '__qualname__', target)!r} is not marked with "
        "mesh_tensorflow.configurable.configurable.")
