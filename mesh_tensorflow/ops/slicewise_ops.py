"""Slicewise operations: a TF function applied to every slice independently.

`slicewise` is the escape hatch for any computation that needs no
communication; `cwise` is its element-wise special case. Operations without a
hand-written gradient get `GenericGradOperation`, which differentiates the TF
function on each slice with a `tf.GradientTape`.
"""

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules
from mesh_tensorflow.ops import slicewise_windows as windows


class SlicewiseOperation(graph_lib.Operation):
  """Applies `tf_fn` to corresponding slices of the inputs.

  The dimensions listed in `splittable_dims` may be split; any other
  dimension must be replicated, because `tf_fn` would see only part of it.

  Args:
    tf_fn: fn(*slices) -> a tf.Tensor, or a tuple of them (one per output).
    inputs: a list of mtf Tensors.
    output_shapes: a list of Shapes, one per output.
    output_dtypes: a list of dtypes, one per output.
    splittable_dims: the Dimensions (or names) that may be split.
    grad_function: optional fn(op, *dys) -> a gradient per input; None
      differentiates `tf_fn` per slice (GenericGradOperation); 0 means no
      gradient, as in the original.
    name: an optional name.
    keeps_zero: (keyword only) whether `tf_fn` is element-wise with
      f(0, ..., 0) = 0 (relu, tanh, a cast, ...): then zero padding stays
      zero (uneven splits) and the Lowering need not zero it again. Only
      this library's own element-wise functions say so; the default is the
      safe False.
    elementwise: (keyword only) whether `tf_fn` is element-wise on slices
      of one shape (`cwise`): beyond the rank TensorFlow's kernels take,
      the slices are flattened around it (slice_utils.elementwise).
    unsplittable: (keyword only) what a layout splitting a dimension outside
      `splittable_dims` (and `halo`) gets: "refuse" (the default, a
      LayoutError naming the operation and the dimension) or "gather"
      (gathered whole around `tf_fn`; see ops/slicewise_windows.py).
    halo: (keyword only) {dimension name: h}: `tf_fn` is local along that
      dimension with radius h, so it may be split; each call sees its block
      with h neighbouring rows on either side and its results are cut back
      (see ops/slicewise_windows.py). Every input and output must have it.
  """

  # Dimensions it may split are never mixed by tf_fn: padding is safe.
  handles_padding = True

  def __init__(self, tf_fn, inputs, output_shapes, output_dtypes,
               splittable_dims, grad_function=None, name=None, *,
               keeps_zero=False, elementwise=False, unsplittable="refuse",
               halo=None):
    super().__init__(inputs, name=name or "slicewise")
    self._tf_fn = tf_fn
    self._elementwise = bool(elementwise)
    self._grad_function = grad_function
    self._keeps_zero = bool(keeps_zero)
    shapes, dtypes = list(output_shapes), list(output_dtypes)
    if len(shapes) != len(dtypes) or not shapes:
      raise errors.ShapeError(
          f"slicewise {self.name!r}: needs one output shape per output "
          f"dtype, got {len(shapes)} shapes and {len(dtypes)} dtypes.")
    self._outputs = [
        graph_lib.Tensor(self, shape_lib.convert_to_shape(s),
                         tf.as_dtype(d), index=i)
        for i, (s, d) in enumerate(zip(shapes, dtypes))]
    names = [d if isinstance(d, str) else d.name
             for d in (splittable_dims or [])]
    self._policy, self._halo = self._check_options(unsplittable, halo)
    self._declared = frozenset(names) | frozenset(self._halo)
    if self._policy == "gather":
      # Any split is lowered (by gathering): nothing is refused.
      self._initialize_splittable_and_unsplittable_dims("splittable")
    else:
      self._initialize_splittable_and_unsplittable_dims(
          "unsplittable", self._declared)

  def _check_options(self, unsplittable, halo):
    """The validated (unsplittable policy, halo dict)."""
    if unsplittable not in windows.POLICIES:
      raise ValueError(
          f"slicewise {self.name!r}: unsplittable must be one of "
          f"{windows.POLICIES}, got {unsplittable!r}.")
    halos = {}
    for name, size in dict(halo or {}).items():
      name = name if isinstance(name, str) else name.name
      if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(
            f"slicewise {self.name!r}: the halo of {name!r} must be a "
            f"non-negative int, got {size!r}.")
      for t in self._inputs + self._outputs:
        if name not in t.shape.dimension_names:
          raise errors.ShapeError(
              f"slicewise {self.name!r}: halo dimension {name!r} must be a "
              f"dimension of every input and output; {t.shape} lacks it.")
      halos[name] = size
    return unsplittable, halos

  def gathered_names(self, lowering):
    """The split dimensions lowered whole (unsplittable="gather")."""
    if self._policy != "gather":
      return frozenset()
    names = set()
    for t in self._inputs + self._outputs:
      impl = lowering.mesh_impl(t)
      names.update(d.name for d in t.shape
                   if d.name not in self._declared and
                   impl.tensor_dimension_to_mesh_axis(d) is not None)
    return frozenset(names)

  def cost_plan(self):
    """(names that may be gathered (None: none), halos per input)."""
    gather = None if self._policy != "gather" else self._declared
    return gather, [dict(self._halo)] * len(self._inputs)

  @property
  def has_gradient(self):
    if self._grad_function is not None and not callable(
        self._grad_function):
      return False  # grad_function=0: no gradient.
    return super().has_gradient

  @property
  def tf_fn(self):
    return self._tf_fn

  @property
  def padding_stays_zero(self):
    """With `keeps_zero`, when every input has every output dimension (an
    input broadcast along a padded dimension would fill its padding)."""
    names = {n for t in self._outputs for n in t.shape.dimension_names}
    return self._keeps_zero and not self._halo and all(
        names <= set(x.shape.dimension_names) for x in self._inputs)

  def check_splits(self, lowering):
    """The default refusal, saying how to opt in."""
    try:
      super().check_splits(lowering)
    except errors.LayoutError as e:
      raise errors.LayoutError(
          f"{e} Or, if tf_fn allows it, pass mtf.slicewise "
          "unsplittable='gather' (the dimension is gathered whole around "
          "it) or halo={name: rows} (it is local along the dimension).") from e

  @property
  def unsplittable_policy(self):
    return self._policy

  @property
  def halo(self):
    """{dimension name: halo rows} (a copy)."""
    return dict(self._halo)

  def gradient(self, grad_ys):
    if self._grad_function is not None:
      return self._grad_function(self, *grad_ys)
    return GenericGradOperation(self, grad_ys).outputs

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    tf_fn = self._tf_fn
    if self._elementwise:
      tf_fn = lambda *xs: slice_utils.elementwise(self._tf_fn, *xs)
    gather = self.gathered_names(lowering)
    if not gather and not self._halo:
      values = impl.slicewise(tf_fn,
                              *[lowering.tensors[x] for x in self._inputs])
      if not isinstance(values, (tuple, list)):
        values = (values,)
    else:
      values = windows.lower_windows(
          impl, tf_fn, [lowering.tensors[x] for x in self._inputs],
          [x.shape for x in self._inputs], [t.shape for t in self._outputs],
          gather, [self._halo] * len(self._inputs),
          [self._halo] * len(self._outputs),
          f"slicewise {self.name!r}")
    for t, v in zip(self._outputs, values):
      lowering.set_tensor_lowering(t, v)


class _SlicewiseCost(cost_rules.CostRule):
  """Slicewise work, and the allconcats and receives of the gather and
  halo options (slicewise_windows.collectives)."""

  def attributes(self, info):
    gather, halos = info.op.cost_plan()
    return (gather, tuple(tuple(sorted(h.items())) for h in halos))

  def run(self, info, ctx):
    gather, halos = info.op.cost_plan()
    if gather is None and not any(halos):
      return cost_rules.CostRule.run(self, info, ctx)
    layout = ctx.layout
    names = frozenset()
    if gather is not None:
      names = frozenset(
          n for dims in info.in_dims + info.out_dims for n, _ in dims
          if n not in gather and layout.mesh_dim(n) is not None)
    return cost_rules.RuleResult(
        cost_rules.no_pending(info),
        windows.collectives(layout, info.in_dims, info.in_itemsize, names,
                            halos),
        elementwise_bytes=cost_rules.io_bytes(info, layout))


_SLICEWISE_COST = _SlicewiseCost()
cost_rules.register(SlicewiseOperation, _SLICEWISE_COST)


class GenericGradOperation(graph_lib.Operation):
  """Gradients of a slicewise operation, taken per slice by TensorFlow.

  Correct for any slicewise function (slices are independent), but it
  re-runs the forward function inside a GradientTape.
  """

  handles_padding = True

  def __init__(self, forward_op, grad_ys, name=None):
    self._forward_op = forward_op
    self._grad_ys = list(grad_ys)
    inputs = forward_op.inputs + [g for g in grad_ys if g is not None]
    super().__init__(inputs, mesh=forward_op.mesh,
                     name=name or forward_op.name + "/generic_grad")
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype, index=i)
                     for i, x in enumerate(forward_op.inputs)]
    # As in the original, every dimension is marked splittable: automatic
    # layout reads the forward operation's marks, and check_splits below
    # applies them.
    self._initialize_all_dimensions_as_splittable()

  def check_splits(self, lowering):
    """Refuses the splits the forward operation refuses: the gradient of
    each slice is right exactly where the forward function was."""
    super().check_splits(lowering)
    self._refuse_splits(lowering, self._forward_op.unsplittable_dims)

  def cost_plan(self):
    """As the forward operation's, with twice its halos on its inputs and
    its halos on the output gradients (see lower)."""
    gather, halos = self._forward_op.cost_plan()
    forward_halos = [{n: 2 * h for n, h in hs.items()} for hs in halos]
    halo = halos[0] if halos else {}
    dys = [dict(halo) for g in self._grad_ys if g is not None]
    return gather, forward_halos + dys

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    forward = self._forward_op
    num_inputs = len(forward.inputs)
    present = [g is not None for g in self._grad_ys]
    halo = forward.halo
    # With a halo of h, the gradient of a block's rows needs the output
    # rows within h of them, which need the input rows within 2h: the
    # forward function runs on windows of 2h, its results are cut by h to
    # meet the output gradients' windows of h, and the input gradients
    # are cut by 2h.
    y_axes = [[(t.shape.dimension_names.index(n), h)
               for n, h in halo.items()] for t in forward.outputs]

    def slice_grad(*args):
      xs = list(args[:num_inputs])
      dys = iter(args[num_inputs:])
      dys = [next(dys) if p else None for p in present]
      with tf.GradientTape() as tape:
        for x in xs:
          tape.watch(x)
        ys = forward.tf_fn(*xs)
        if not isinstance(ys, (tuple, list)):
          ys = [ys]
        ys = [_cut_rows(y, axes) for y, axes in zip(ys, y_axes)]
      targets = [y for y, dy in zip(ys, dys) if dy is not None]
      output_grads = [dy for dy in dys if dy is not None]
      grads = tape.gradient(targets, xs, output_gradients=output_grads)
      return tuple(tf.zeros_like(x) if g is None else g
                   for x, g in zip(xs, grads))

    gather, in_halos = self.cost_plan()
    names = forward.gathered_names(lowering) if gather is not None else ()
    xs = [lowering.tensors[x] for x in self._inputs]
    if not names and not halo:
      values = impl.slicewise(slice_grad, *xs)
    else:
      values = windows.lower_windows(
          impl, slice_grad, xs, [x.shape for x in self._inputs],
          [t.shape for t in self._outputs], names, in_halos,
          in_halos[:num_inputs], f"slicewise {forward.name!r} gradient")
    for t, v in zip(self._outputs, values):
      lowering.set_tensor_lowering(t, v)


def _cut_rows(y, axes):
  """Slice `y` without h rows at either side of each (axis, h) of axes."""
  for axis, h in axes:
    if h:
      size = slice_utils.static_shape(y)[axis]
      begin = [0] * len(slice_utils.static_shape(y))
      sizes = [-1] * len(begin)
      begin[axis], sizes[axis] = h, size - 2 * h
      y = slice_utils.tf_slice(y, begin, sizes)
  return y


cost_rules.register(GenericGradOperation, _SLICEWISE_COST)


def slicewise(tf_fn, xs, output_shape=None, output_dtype=None,
              splittable_dims=None, grad_function=None, name=None, *,
              keeps_zero=False, unsplittable="refuse", halo=None):
  """Applies `tf_fn` to each slice of `xs`.

  Args:
    tf_fn: a function of TF tensors (one slice of each of `xs`).
    xs: list of mtf Tensors.
    output_shape: Shape of the output (default: shape of xs[0]), or a list of
      Shapes when `output_dtype` is a list (several outputs).
    output_dtype: dtype of the output (default: dtype of xs[0]) or a list.
    splittable_dims: dimensions that `tf_fn` treats independently per
      element and that may therefore be split (default: none).
    grad_function: optional fn(op, *dys) returning a gradient per input.
    name: optional name.
    keeps_zero: (keyword only) `tf_fn` is element-wise and maps zeros to
      zero (see SlicewiseOperation).
    unsplittable: (keyword only) "refuse" (default): a layout splitting a
      dimension outside `splittable_dims` gets a LayoutError, since only
      the caller knows what `tf_fn` does along it; "gather": such
      dimensions are gathered whole around `tf_fn` (an allconcat per
      input and dimension) and its results split back.
    halo: (keyword only) {dimension name: h} for a `tf_fn` that is local
      along that dimension with radius h (a convolution, a stencil): the
      dimension may be split; `tf_fn` sees each block with h rows of its
      neighbours on either side (zeros past the ends) and must return the
      dimension at that window length; h rows are cut from either side of
      each result. Every input and output must have the dimension.

  Returns:
    an mtf Tensor, or a tuple of them for several outputs.
  """
  multiple = isinstance(output_dtype, (list, tuple))
  if multiple:
    shapes = (list(output_shape) if output_shape is not None
              else [None] * len(output_dtype))
    dtypes = list(output_dtype)
  else:
    shapes, dtypes = [output_shape], [output_dtype]
  # As in the original, a missing shape or dtype is that of xs[0].
  shapes = [xs[0].shape if shp is None else shp for shp in shapes]
  dtypes = [xs[0].dtype if d is None else d for d in dtypes]
  op = SlicewiseOperation(tf_fn, xs, shapes, dtypes, splittable_dims or [],
                          grad_function=grad_function, name=name,
                          keeps_zero=keeps_zero, unsplittable=unsplittable,
                          halo=halo)
  if multiple:
    return tuple(op.outputs)
  return op.outputs[0]


def cwise(tf_fn, xs, output_dtype=None, grad_function=None, name=None, *,
          keeps_zero=False):
  """An element-wise function of same-shaped tensors; every dim splittable.

  `keeps_zero` (keyword only): f(0, ..., 0) = 0 (see SlicewiseOperation).
  Slices beyond the rank TensorFlow's kernels take are flattened around
  `tf_fn` (SlicewiseOperation's `elementwise`).
  """
  shape = xs[0].shape
  for x in xs[1:]:
    if x.shape != shape:
      raise errors.ShapeError(
          f"cwise {name or 'op'}: inputs must have the same shape, got "
          f"{shape} and {x.shape}.")
  op = SlicewiseOperation(tf_fn, xs, [shape], [output_dtype or xs[0].dtype],
                          shape.dims, grad_function=grad_function, name=name,
                          keeps_zero=keeps_zero, elementwise=True)
  return op.outputs[0]
