"""The core's declared extension points: how strategies plug in.

The language and its lowering (graph, ops, gradients, lowering, optimize,
the mesh implementations) name no parallelism strategy. A strategy (see
`mesh_tensorflow.strategies`) plugs in through these points only:

1. Operation annotations. `op.annotate(annotation)` attaches an
   `Annotation` (one per annotation class) to an operation;
   `op.annotation(cls)` reads it back. The Lowering lowers an operation
   inside every annotation's `lowering_scope`, and `mtf.gradients` gives
   every annotation the operations its operation's gradient created
   (`gradient_created`), without knowing who set them.
2. Gradient rewrites, declared by an annotation class: its
   `gradient_rewrite(operations, downstream)` gives, per `mtf.gradients`
   call over operations one of which carries such an annotation, a
   `GradientRewrite` that may take over the gradient of some operations
   and deliver their terms later, e.g. summed by one einsum.
3. Variable creators. Every `mtf.get_variable` (and every optimizer slot)
   goes through a stack of creators, `creator(next_creator, request)`,
   each of which may rewrite the `VariableRequest` (name, shape, storage
   shape, initializer, member names) and the value it returns:
   `variable_creator_scope(creator)` for a block of code,
   `graph.add_variable_creator(creator)` for one graph's variables, and
   mesh extensions (below) for one mesh's variables.
4. Mesh extensions. `mesh.add_extension(extension)` attaches a
   `MeshExtension` to an `mtf.Mesh`: it creates that mesh's variables
   (`create_variable`), says in what shape an optimizer updates a variable
   (`update_view`) and checks the mesh implementation it is lowered on
   (`check_lowering`).
"""

import contextlib
import dataclasses
import threading
from typing import Any, Optional


class Annotation:
  """A declared annotation of an operation (see the module doc, point 1).

  Subclasses are frozen dataclasses or other immutable values; an
  operation holds at most one annotation of each class.
  """

  def lowering_scope(self, operation, lowering):  # pylint: disable=unused-argument
    """A context manager the Lowering lowers `operation` in."""
    return contextlib.nullcontext()

  def gradient_created(self, operation, created):
    """Called with the operations `operation`'s gradient created."""

  # fn(operations, downstream) -> GradientRewrite, or None: the rewrite of
  # mtf.gradients (point 2) that operations annotated so ask for. A
  # subclass declares it as a staticmethod.
  gradient_rewrite = None


class GradientRewrite:
  """Takes over the gradient of some operations (module doc, point 2)."""

  def takes_over(self, operation):  # pylint: disable=unused-argument
    """Whether `gradient` below gives `operation`'s input gradients."""
    return False

  def gradient(self, operation, grad_outputs):
    """The input gradients of `operation` (None for deferred terms)."""
    raise NotImplementedError(type(self).__name__)

  def pop_terms(self, tensor):  # pylint: disable=unused-argument
    """The deferred gradient terms of `tensor`, now that it is needed."""
    return []


@dataclasses.dataclass(frozen=True)
class VariableRequest:
  """What `mtf.get_variable` (or an optimizer slot) asks to create.

  Attributes:
    mesh: the mtf.Mesh.
    name: the full scoped name.
    shape: the Shape of the value returned.
    variable_dtype: the VariableDType.
    initializer: fn(shape, dtype), a value, or None (the default).
    trainable: whether it is trained.
    kwargs: the extra keyword arguments of get_variable.
    storage_shape: the Shape the variable is stored in (None: `shape`);
      the value is renamed from it to `shape`.
    member_names: one name per entry of the first dimension (a
      layer-stacked variable), or None.
    slot_of: the Variable whose optimizer slot this is, or None.
  """
  mesh: Any
  name: str
  shape: Any
  variable_dtype: Any
  initializer: Any
  trainable: bool
  kwargs: dict = dataclasses.field(default_factory=dict)
  storage_shape: Any = None
  member_names: Optional[tuple] = None
  slot_of: Any = None

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


class MeshExtension:
  """A strategy attached to one mtf.Mesh (module doc, point 4)."""

  def create_variable(self, next_creator, request):
    """Creates the variable `request` asks for (through `next_creator`)."""
    return next_creator(request)

  def update_view(self, grad, variable):
    """(gradient, variable) in the shape an optimizer updates them."""
    return grad, variable

  def check_lowering(self, mesh_impl, mesh):
    """Raises if `mesh` cannot be lowered on `mesh_impl`."""


_SCOPED = threading.local()


def _scoped_creators():
  if not hasattr(_SCOPED, "creators"):
    _SCOPED.creators = []
  return _SCOPED.creators


@contextlib.contextmanager
def variable_creator_scope(creator):
  """Runs variable creation inside the block through `creator`.

  Args:
    creator: fn(next_creator, request) -> the variable's value (an mtf
      Tensor of `request.shape`), calling next_creator(request) (perhaps
      with a rewritten request) to go on.

  Yields:
    nothing.
  """
  creators = _scoped_creators()
  creators.append(creator)
  try:
    yield
  finally:
    creators.pop()


def create_variable(request, base_creator):
  """Runs `request` through the creators, innermost scope first, then the
  graph's and the mesh's, ending in `base_creator(request)`."""
  chain = (list(reversed(_scoped_creators())) +
           list(request.mesh.graph.variable_creators) +
           [ext.create_variable for ext in request.mesh.extensions])

  def call(index, req):
    if index == len(chain):
      return base_creator(req)
    return chain[index](lambda r: call(index + 1, r), req)

  return call(0, request)


def gradient_rewrites(operations, downstream):
  """The GradientRewrites of one `mtf.gradients` call: one per annotation
  class with a `gradient_rewrite` that some operation carries."""
  factories = []
  for op in operations:
    for annotation in op.annotations:
      factory = type(annotation).gradient_rewrite
      if factory is not None and factory not in factories:
        factories.append(factory)
  return [factory(operations, downstream) for factory in factories]
