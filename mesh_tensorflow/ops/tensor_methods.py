"""Tensor's arithmetic operators, installed by the ops package.

`graph.Tensor` comes before every operation, and the operations are built
on it. So, as JAX attaches its array methods from the numpy side
(jax/_src/numpy/array_methods.py), the ops package calls
`register_tensor_methods()` once, when it is imported, and `graph.py`
imports no operation. Importing any module of mesh_tensorflow runs the
package's `__init__`, which imports the ops package; so every Tensor a user
can make has its operators.
"""

from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow.ops import binary
from mesh_tensorflow.ops import comparisons
from mesh_tensorflow.ops import elementwise


def _add(self, other):
  return binary.add(self, other)


def _radd(self, other):
  return binary.add(self, other)


def _sub(self, other):
  return binary.sub(self, other)


def _rsub(self, other):
  return binary.sub(other, self)


def _mul(self, other):
  return binary.multiply(self, other)


def _rmul(self, other):
  return binary.multiply(self, other)


def _truediv(self, other):
  return binary.divide(self, other)


def _rtruediv(self, other):
  return binary.divide(other, self)


def _floordiv(self, other):
  return comparisons.floordiv(self, other)


def _rfloordiv(self, other):
  return comparisons.floordiv(other, self)


def _mod(self, other):
  return comparisons.mod(self, other)


def _rmod(self, other):
  return comparisons.mod(other, self)


def _neg(self):
  return elementwise.negative(self)


# The operators the original's Tensor had, by special method name.
_METHODS = {
    "__add__": _add,
    "__radd__": _radd,
    "__sub__": _sub,
    "__rsub__": _rsub,
    "__mul__": _mul,
    "__rmul__": _rmul,
    "__truediv__": _truediv,
    "__rtruediv__": _rtruediv,
    "__floordiv__": _floordiv,
    "__rfloordiv__": _rfloordiv,
    "__mod__": _mod,
    "__rmod__": _rmod,
    "__neg__": _neg,
}


def register_tensor_methods(tensor_class=graph_lib.Tensor):
  """Installs the arithmetic operators on `tensor_class` (idempotent)."""
  for name, method in _METHODS.items():
    method.__name__ = name
    method.__qualname__ = f"{tensor_class.__name__}.{name}"
    setattr(tensor_class, name, method)
