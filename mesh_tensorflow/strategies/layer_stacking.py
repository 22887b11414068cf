"""Layer-stacked variables: the weights of S identical layers as ONE variable.

A pipeline (GSPMD's formulation of GPipe) runs S identical stages at once on
a stage dimension split over a mesh dimension, so each processor must hold
only its stages' weights. Under

    with mtf.stack_layer_variables(stage_dim, member_names_fn):
      ...  # build one layer

every `mtf.get_variable(mesh, name, shape, ...)` (full scoped name F)
creates or reuses ONE variable of shape [stage_dim] + shape whose row i
stands for the per-layer variable `member_names_fn(F)[i]`, and returns its
whole (stacked) value. Its first dimension is an ordinary dimension: layout
rules may split it ("stage:pipe"), so a processor stores 1/S of it.

In every other respect the rows behave as the S separate variables:

- name: the variable is called "stacked_<stage dim>/<member 0>" in the mtf
  graph (its `member_names` list the rows); the member names are taken, so
  no other variable may use them;
- initial values: row i starts from what `mtf.get_variable` of name
  member_names[i] would start from (initializers seeded by the variable's
  scoped name are re-seeded per member, others are called per row on the
  row's shape, so fans are the layer's);
- checkpoints hold one entry per member name (the per-layer keys), each
  written by the processors holding that row, in every checkpoint path;
- optimizer slots are layer-stacked too (members "<member><suffix>"), and
  statistics over a whole variable (Adafactor's RMS and clipping) are taken
  per row.

Autostack leaves layer-stacked variables alone (their stacking is explicit).

One row, for running the layers unpipelined (decoding a model trained
pipelined): under `stack_layer_variables(stack_dim, member_names_fn,
row=i)` `mtf.get_variable` creates or reuses the SAME stacked variable
(same name, members, initial values and checkpoint entries) but returns
row i only, the value of layer member_names[i], of the layer's own shape.
The row is taken with `mtf.gather` along the stack dimension: a local
slice where that dimension is not split, and where it is split over a
mesh dimension, a masked slice summed over that mesh dimension (one
allreduce of the layer's weights per use), which a decoder can afford.
"""

import contextlib
import threading

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import extensions
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.randomness import run_seed
from mesh_tensorflow.randomness import tf_initializers
from mesh_tensorflow.storage import variable_store
from mesh_tensorflow.ops import indexing
from mesh_tensorflow.ops import variables as variables_lib

_STATE = threading.local()


def _stack():
  if not hasattr(_STATE, "frames"):
    _STATE.frames = []
  return _STATE.frames


@contextlib.contextmanager
def stack_layer_variables(stack_dim, member_names_fn, row=None):
  """Makes `mtf.get_variable` create layer-stacked variables (module doc).

  Args:
    stack_dim: the stack (stage) Dimension, or None to turn stacking off
      inside an enclosing `stack_layer_variables`.
    member_names_fn: fn(full scoped variable name) -> list of
      stack_dim.size distinct names, the per-layer variable of each row.
    row: None to get the whole stacked value, or an index into stack_dim:
      get_variable then returns that row of the stacked variable (the
      value of one layer; see "One row" in the module doc).

  Yields:
    nothing.
  """
  if stack_dim is not None:
    stack_dim = shape_lib.convert_to_dimension(stack_dim)
    if not callable(member_names_fn):
      raise TypeError(
          f"stack_layer_variables({stack_dim}): member_names_fn must be a "
          f"function of the variable name, got {member_names_fn!r}.")
    if row is not None and (isinstance(row, bool) or
                            not isinstance(row, int) or
                            not 0 <= row < stack_dim.size):
      raise ValueError(
          f"stack_layer_variables({stack_dim}): row={row!r} is not a row "
          f"of dimension {stack_dim.name!r}; give an int in "
          f"[0, {stack_dim.size}) or None for the whole stack.")
  elif row is not None:
    raise ValueError(f"stack_layer_variables(None): row={row!r} needs a "
                     "stack dimension.")
  frames = _stack()
  with contextlib.ExitStack() as stack:
    if not frames:
      # The outermost scope switches the creator on for its block.
      stack.enter_context(
          extensions.variable_creator_scope(_create_layer_stacked))
    frames.append((stack_dim, member_names_fn, row))
    try:
      yield
    finally:
      frames.pop()


def current():
  """(stack Dimension, member_names_fn) of the innermost
  `stack_layer_variables`, or None outside (or where it is turned off)."""
  frames = _stack()
  if not frames or frames[-1][0] is None:
    return None
  return frames[-1][:2]


def current_row():
  """The row of the innermost `stack_layer_variables` (see its `row`), or
  None: the whole stack, or no stacking."""
  frames = _stack()
  if not frames or frames[-1][0] is None:
    return None
  return frames[-1][2]


def stacked_name(stack_dim, member_names):
  """The mtf name of a layer-stacked variable: "stacked_<dim>/<member 0>"."""
  return f"stacked_{stack_dim.name}/{member_names[0]}"


def members_of(full_name, shape):
  """(stack Dimension, member names) of variable `full_name` (row shape
  `shape`) under the current `stack_layer_variables`."""
  stack_dim, member_names_fn = current()
  if stack_dim.name in shape.dimension_names:
    raise errors.ShapeError(
        f"Variable {full_name!r} {shape} already has the stack dimension "
        f"{stack_dim.name!r}; under mtf.stack_layer_variables give the "
        "shape of ONE layer's variable (the stack dimension is added).")
  member_names = member_names_fn(full_name)
  if isinstance(member_names, str):
    raise TypeError(f"member_names_fn({full_name!r}) gave a string; it must "
                    "give a list of names, one per row.")
  stacked_shape = shape_lib.Shape([stack_dim] + shape.dims)
  return stack_dim, variables_lib.check_member_names(
      full_name, stacked_shape, member_names)


def _renamed_origin(origin, full_name, member):
  """The name a seed's origin would have had in member's layer, or None.

  `origin` (the name a layer derived a seed from in the current scope) is
  the variable's own name, or a name in the same scope.
  """
  if origin == full_name:
    return member
  scope = full_name.rpartition("/")[0]
  member_scope = member.rpartition("/")[0]
  if scope and origin.startswith(scope + "/"):
    rest = origin[len(scope) + 1:]
    return f"{member_scope}/{rest}" if member_scope else rest
  return None


def _row_initializer(initializer, full_name, member):
  """What an ordinary get_variable of name `member` would initialise with."""
  if initializer is None:
    return variable_store.default_initializer(member)
  seed = getattr(initializer, "seed", None)
  with_seed = getattr(initializer, "with_seed", None)
  if seed is None or with_seed is None:
    return initializer
  origin = getattr(initializer, "seed_origin", None)
  if origin is None:
    # Not derived from a name (an explicit seed): every layer's own
    # variable would get that same seed.
    return initializer
  renamed = _renamed_origin(origin, full_name, member)
  if renamed is None:
    return initializer
  return with_seed(tf_initializers.seed_of_name(renamed))


def _call(initializer, shape, dtype):
  value = variable_store.call_initializer(initializer, shape, dtype)
  return tf.broadcast_to(value, shape)


class RowInitializer:
  """fn(shape, dtype): the stacked initial value, row i from the i-th
  member's own initializer (see `row`).

  Args:
    initializer: the initializer get_variable was given (None: its
      default, per member name).
    full_name: the full scoped name get_variable was called with.
    member_names: the member names, one per row.
  """

  def __init__(self, initializer, full_name, member_names):
    self._initializer = initializer
    self._full_name = full_name
    self._member_names = list(member_names)
    # The seeds derive from names under the run seed of now.
    self._run_seed = run_seed.get_seed()
    self._row_initializers = None

  @property
  def _rows(self):
    """The members' initializers, made on first use: a pipeline looks up
    each stacked variable once per iteration, and all but the first
    lookup find the variable made and never initialise it."""
    if self._row_initializers is None:
      with run_seed.seed_scope(self._run_seed):
        self._row_initializers = [
            _row_initializer(self._initializer, self._full_name, m)
            for m in self._member_names]
    return self._row_initializers

  def row(self, index, row_shape, dtype):
    """Row `index`'s initial value, of `row_shape` and `dtype`."""
    return _call(self._rows[index], [int(s) for s in row_shape],
                 tf.as_dtype(dtype))

  def __call__(self, shape, dtype=tf.float32, **unused_kwargs):
    shape = [int(s) for s in shape]
    return tf.stack([self.row(i, shape[1:], dtype)
                     for i in range(len(self._rows))])


def _row(value, row):
  """Row `row` of a stacked variable's value (all of it if row is None)."""
  if row is None:
    return value
  return indexing.gather(value, row, value.shape.dims[0])


def _create_layer_stacked(next_creator, request):
  """Makes variables layer-stacked under `stack_layer_variables` (a creator
  of its block, extensions point 3), and switches `_create_stacked_slot`
  on for their graph."""
  if request.slot_of is not None or current() is None:
    return next_creator(request)
  row = current_row()
  stack_dim, member_names = members_of(request.name, request.shape)
  request.mesh.graph.add_variable_creator(_create_stacked_slot)
  value = next_creator(request.replace(
      name=stacked_name(stack_dim, member_names),
      shape=shape_lib.Shape([stack_dim] + request.shape.dims),
      initializer=RowInitializer(request.initializer, request.name,
                                 member_names),
      member_names=tuple(member_names)))
  return _row(value, row)


def _create_stacked_slot(next_creator, request):
  """Makes the optimizer slots of layer-stacked variables layer-stacked (a
  creator of the graphs that have such variables, extensions point 3)."""
  members = None if request.slot_of is None else request.slot_of.member_names
  if members is None:
    return next_creator(request)
  suffix = request.name[len(request.slot_of.name):]
  slot_members = [m + suffix for m in members]
  return next_creator(request.replace(
      member_names=tuple(slot_members),
      initializer=RowInitializer(request.initializer, request.name,
                                 slot_members)))
