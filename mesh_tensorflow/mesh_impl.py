"""MeshImpl: how a mesh is laid out and how its processors communicate.

A mesh implementation knows the mesh shape and the layout rules, so it can say
which slice of each tensor every processor holds. `MeshImpl` itself answers
such layout questions; backends (PlacementMeshImpl, SimdMeshImpl) provide a
short list of members (slicewise computation, four collectives, the
processor number, import/export, random numbers, laid-out variables) and
everything else is derived from them. The parts live in `backend/`:
slice and padding geometry (`layout_geometry`), the derived collectives and
their counters (`mesh_collectives`), and the lowered values of mtf tensors
and variables (`laid_out`), whose names this module exports as before.

On the mesh "rows:2;cols:2" with rules "batch:rows", a tensor
[batch=4, d=6] has slices [2, 6]: processors 0 and 1 (row 0) hold batch rows
0-1, processors 2 and 3 (row 1) hold rows 2-3, and each slice is replicated
along "cols".
"""

from absl import logging
import tensorflow as tf

from mesh_tensorflow import lowering_context
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import laid_out
from mesh_tensorflow.backend import layout_geometry
from mesh_tensorflow.backend import mesh_collectives
from mesh_tensorflow.randomness import stateless_random
from mesh_tensorflow.storage import variable_store as variable_store_lib

# The names this module has always exported (programs and the package's
# modules import them from here).
COLLECTIVE_KINDS = mesh_collectives.COLLECTIVE_KINDS
collective_wire_bytes = mesh_collectives.collective_wire_bytes
LaidOutTensor = laid_out.LaidOutTensor
LazyAllreduceSum = laid_out.LazyAllreduceSum
LazyLaidOutTensor = laid_out.LazyLaidOutTensor
LaidOutVariable = laid_out.LaidOutVariable
compatible_lazy_allreduce_sums = laid_out.compatible_lazy_allreduce_sums
convert_args_to_laid_out_tensors = laid_out.convert_args_to_laid_out_tensors
full_shape_of = laid_out.full_shape_of


# The sets of ignored rules already logged (each is logged once a process).
_LOGGED_MISSING_RULES = set()


def _log_rules_for_missing_mesh_dimensions(layout_rules, mesh_shape):
  """Logs, once per distinct set, the rules naming absent mesh dimensions."""
  mesh_names = set(mesh_shape.dimension_names)
  missing = tuple((t, m) for t, m in layout_rules if m not in mesh_names)
  if not missing or missing in _LOGGED_MISSING_RULES:
    return
  _LOGGED_MISSING_RULES.add(missing)
  logging.info(
      "Ignoring layout rules for mesh dimensions this mesh lacks: %s "
      "(mesh %s).", ";".join(f"{t}:{m}" for t, m in missing),
      mesh_shape.to_string)


class MeshImpl(layout_geometry.LayoutGeometry,
               mesh_collectives.MeshCollectives,
               tf.__internal__.tracking.Trackable):
  """A mesh's shape and layout rules; the base of mesh implementations.

  Built directly, `MeshImpl(shape, layout_rules)` answers layout questions
  without devices: `tensor_layout`, `tensor_dimension_to_mesh_axis`,
  `slice_shape`, `slice_begin`, `laid_out_size`, `processor_groups`, ...
  Lowering needs a backend (PlacementMeshImpl, SimdMeshImpl), which provides
  the members that raise NotImplementedError here: `slicewise`, the
  collectives `allreduce`, `allconcat`, `alltoall`, `receive`,
  `laid_out_pnum`, `import_tf_tensor`, `export_to_tf_tensor`, `random`,
  `devices` and `LaidOutVariable` (or `make_laid_out_variable`). Everything
  else is derived from them; backends also override derived members where
  they can do better (`reduce_scatter`, the weight-update-sharding
  collective, is allreduce + allsplit here).

  A mesh implementation owns the TF variables of the mtf variables lowered
  onto it (its `variable_store`), and is trackable:
  `tf.train.Checkpoint(model=mesh_impl)` saves them by mtf name,
  independently of the layout (see `checkpointing`).

  Lowering changes nothing here. What one lowering step depends on (the
  layout as its operation sees it, idle processors, where collectives are
  counted) is a LoweringContext; `bound(context)`, and `replicating`,
  `idle_processors` and `counting`, give views of this implementation in
  another context, sharing its devices, variables and caches. So one
  implementation serves several lowerings at once.

  Args:
    shape: the mesh shape, e.g. "rows:2;cols:4" or a list of Dimensions.
    layout_rules: e.g. "batch:rows;hidden:cols" or a LayoutRules.

  A rule naming a mesh dimension the mesh lacks is ignored, as in the
  original (T5's default rules name "ensemble", which most meshes lack); such
  rules are logged once at INFO, so that a typo can still be seen.
  """

  LaidOutTensor = LaidOutTensor
  # The backend's LaidOutVariable class, built as
  # LaidOutVariable(variable, mesh_impl) by `make_laid_out_variable`.
  LaidOutVariable = None

  def __init__(self, shape, layout_rules):
    self._shape = shape_lib.convert_to_shape(shape)
    layout_rules = shape_lib.convert_to_layout_rules(layout_rules)
    _log_rules_for_missing_mesh_dimensions(layout_rules, self._shape)
    self._context = lowering_context.LoweringContext(layout_rules)
    self._variable_store = variable_store_lib.VariableStore(
        checkpoint_root=self)
    # Its checkpoint dependencies (the variables the store tracks under it)
    # are containers made now, filled as variables are created.
    self._maybe_initialize_trackable()

  def __repr__(self):
    rules = ";".join(f"{t}:{m}" for t, m in self._layout_rules)
    return f"{type(self).__name__}({self._shape.to_string}, {rules!r})"

  # ------------------------------------------------------ lowering context

  @property
  def context(self):
    """The LoweringContext this object lays out and counts by."""
    return self._context

  @property
  def _layout_rules(self):
    return self._context.layout_rules

  @property
  def unbound(self):
    """The mesh implementation this is a view of (itself if none)."""
    return self.__dict__.get("_view_of", self)

  def bound(self, context):
    """This implementation as seen in `context` (a LoweringContext).

    A view: a new object of this class sharing everything but the context
    (devices, variable store, caches); neither it nor this implementation
    is changed afterwards. A Lowering hands each operation the view of its
    context (see `Lowering.mesh_impl`).
    """
    if context is self._context:
      return self
    view = object.__new__(type(self))
    view.__dict__.update(self.__dict__)
    view.__dict__["_context"] = context
    view.__dict__["_view_of"] = self.unbound
    return view

  def replicating(self, names):
    """This implementation with the tensor dimensions named in `names` laid
    out replicated: how an operation whose lowering does not handle padding
    is lowered on padded inputs (see Lowering.lower_operation)."""
    return self.bound(self._context.replicating(names))

  def idle_processors(self, pnums):
    """This implementation with processors `pnums` idle: its `slicewise`
    may skip them, giving zeros (they hold idle pipeline slots, see
    mtf.strategies.idle_slots). Only an implementation whose processors run
    their own operations does (PlacementMeshImpl); by default every
    processor computes."""
    return self.bound(self._context.idle_processors(pnums))

  def counting(self, counter_fn):
    """This implementation with its collectives reporting their traffic to
    fn(key, value) (a Lowering counts with its `add_counter`)."""
    return self.bound(self._context.counting(counter_fn))

  def _not_implemented(self, member):
    """The error of a member only backends provide."""
    return NotImplementedError(
        f"{type(self).__name__}.{member} is not implemented: MeshImpl itself "
        "only answers layout questions (tensor_layout, slice_shape, ...). "
        "Lower onto a PlacementMeshImpl or a SimdMeshImpl.")

  # ---------------------------------------------------------------- layout

  @property
  def shape(self):
    return self._shape

  @property
  def ndims(self):
    return self._shape.ndims

  @property
  def size(self):
    return self._shape.size

  @property
  def layout_rules(self):
    return self._layout_rules

  @property
  def supports_control_dependencies(self):
    """Whether lowered ops may carry control dependencies (XLA: no)."""
    return True

  # ------------------------------------------------------ backend members

  @property
  def devices(self):
    """The device of each processor, in processor number order."""
    raise self._not_implemented("devices")

  def slicewise(self, fn, *inputs):
    """Applies `fn` to each slice; non-laid-out arguments go to every call.

    Returns a LaidOutTensor, or a tuple of them when `fn` returns a tuple.
    """
    raise self._not_implemented("slicewise")

  def laid_out_pnum(self):
    """A laid-out value holding each processor's number."""
    raise self._not_implemented("laid_out_pnum")

  def import_tf_tensor(self, x, tf_x):
    """Lays out `tf_x`, the full value of mtf Tensor `x`.

    Args:
      x: the mtf Tensor (or its Shape) that `tf_x` is the value of.
      tf_x: a tf.Tensor (or anything convertible) of x's full shape.

    Returns:
      a LaidOutTensor.
    """
    raise self._not_implemented("import_tf_tensor")

  def export_to_tf_tensor(self, x, laid_out_x):
    """The full tf.Tensor of mtf Tensor `x` from its laid-out value.

    Args:
      x: the mtf Tensor (or its Shape).
      laid_out_x: its LaidOutTensor (or lazy laid-out value).

    Returns:
      a tf.Tensor of x's full shape.
    """
    raise self._not_implemented("export_to_tf_tensor")

  def random(self, shape, tf_fn, kwargs):
    """A laid-out random tensor of mtf `shape`, the same under every layout.

    `tf_fn` names the distribution the way the original library did, by a
    TensorFlow random function: tf.random.uniform, tf.random.normal,
    tf.random.truncated_normal (or their tf.compat.v1 names), or one of
    the strings "uniform", "normal", "truncated_normal". `kwargs` holds its
    arguments: `seed` (an int or a scalar integer tensor; default 0),
    `dtype`, and minval/maxval (uniform) or mean/stddev (normal, truncated
    normal); `name` is ignored. Other functions raise ValueError: their
    values could not be made independent of the layout.

    Each processor computes its own slice with `stateless_random.sample`:
    every element is a pure function of (seed, its linear index in the full
    tensor), so replicated slices agree, different blocks differ, and the
    exported full tensor does not depend on the mesh or the layout. No
    communication; O(slice size) work.

    On "rows:2;cols:2" with rules "a:rows", a tensor [a=4, b=6] is drawn as
    rows 0-1 of the full tensor on processors 0 and 1 and rows 2-3 on
    processors 2 and 3.

    Args:
      shape: the mtf Shape of the full tensor.
      tf_fn: the TensorFlow random function (or distribution name).
      kwargs: dict of its arguments (see above).

    Returns:
      a LaidOutTensor.
    """
    raise self._not_implemented("random")

  def _random_sampler(self, shape, tf_fn, kwargs, whole=False):
    """A function of `begin` (ints, or scalar integer tensors in an SPMD
    program) giving the slice of `random(shape, tf_fn, kwargs)` that starts
    there (the whole tensor, from begin 0, with `whole`)."""
    shape = shape_lib.convert_to_shape(shape)
    distribution, seed, dtype, params = stateless_random.parse_tf_fn(
        tf_fn, kwargs, f"{type(self).__name__}.random")
    full_shape = shape.to_integer_list
    slice_shape = full_shape if whole else self.slice_shape(shape)

    compiled = stateless_random.compiled_sampler(
        distribution, full_shape, slice_shape, dtype=dtype, **params)

    def sample(begin):
      if compiled is not None and full_shape:
        return compiled(seed, begin)
      return stateless_random.sample(distribution, seed, full_shape,
                                     slice_shape, begin, dtype=dtype,
                                     **params)

    return sample

  # ------------------------------------------------------------ variables

  @property
  def variable_store(self):
    """The VariableStore holding the TF variables of this mesh's mtf
    variables (by mtf name, per execution context), checkpointed under
    this object."""
    return self._variable_store

  def make_laid_out_variable(self, variable, stack_group=None):
    """The LaidOutVariable (per-processor TF variables) of mtf `variable`.

    `stack_group` (from the Lowering's autostack plan, or None) names the
    variables to store together with it, where the implementation stacks
    (see `supports_autostack`).
    """
    del stack_group
    if self.LaidOutVariable is None:
      raise self._not_implemented("make_laid_out_variable")
    return self.LaidOutVariable(variable, self)  # pylint: disable=not-callable

  def next_random_step(self):
    """Advances the "mtf_random_step" counter; returns its old value.

    The counter lives in the variable store (on the host), so it is
    checkpointed with the model.
    """
    counter = self.variable_store.counter("mtf_random_step")
    with tf.device(counter.device):
      after = tf.convert_to_tensor(counter.assign_add(1, read_value=True))
      return after - 1

  @property
  def supports_autostack(self):
    """Whether `make_laid_out_variable` honours stack groups."""
    return False

  def assign_to_variables(self, laid_out_variables, laid_out_values,
                          assign_fn):
    """Lowers one Assign of several variables; returns a TF op or None."""
    ops = [v.assign_to_slices(assign_fn, x.all_slices)
           for v, x in zip(laid_out_variables, laid_out_values)]
    ops = [op for op in ops if op is not None]
    if tf.executing_eagerly():
      return None
    return tf.group(*ops)

  def run(self, fn, *args):
    """Runs a step program `fn(*args)` on this mesh; returns its result.

    Here a direct call: one program holds every processor's ops.
    SimdMeshImpl runs `fn` as the program of each processor instead, so
    calling `mesh_impl.run(fn, ...)` works on every implementation.
    """
    return fn(*args)

  def einsum(self, equation, *slices):
    """Local einsum of slices; an override point for backends.

    mtf's equations are canonical (one letter per dimension, explicit
    output, no ellipsis), so one or two operands go straight to the Einsum
    op: tf.einsum would parse and validate the equation again in Python for
    every slice, a large share of PlacementMeshImpl's lowering time on big
    meshes. More operands take tf.einsum's contraction-order search.
    """
    if len(slices) <= 2:
      return tf.raw_ops.Einsum(inputs=list(slices), equation=equation)
    return tf.einsum(equation, *slices)

  def Print(self, x, data, message, **kwargs):  # pylint: disable=invalid-name
    """Returns laid-out x, printing `message` and the tf.Tensors `data` when
    it is computed (at once when eager)."""
    print_op = tf.print(message, *data, **kwargs)
    if tf.executing_eagerly():
      return x

    def fn(s):
      with tf.control_dependencies([print_op]):
        return tf.identity(s)

    return self.slicewise(fn, x)
