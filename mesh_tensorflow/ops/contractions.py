"""Einsum over named dimensions: products, contractions and transposes.

`einsum(xs, output_shape)` multiplies its inputs, matching dimensions by name,
and sums over every dimension missing from the output. Each processor
contracts its own slices; dimensions that are summed over while split across
the mesh leave partial sums, which are allreduced over those mesh dimensions
(lazily, see `LazyAllreduceSum`).

Example on mesh "rows:2;cols:2" with rules "batch:rows;hidden:cols":
x[batch, hidden] * w[hidden, io] -> y[batch, io]. Processor (r, c) multiplies
its x block (batch block r, hidden block c) with its w block (hidden block c),
giving a partial y for batch block r; an allreduce over "cols" sums the two
hidden blocks.
"""

import math
import string

import tensorflow as tf

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.backend import slice_utils
from mesh_tensorflow.ops import cost_rules

_LETTERS = string.ascii_letters


def _union_of_dims(shapes):
  dims = []
  for shape in shapes:
    for d in shape:
      if d not in dims:
        dims.append(d)
  return dims


class EinsumOperation(graph_lib.Operation):
  """Product of the inputs, summed over dimensions not in `output_shape`."""

  # Padding is zero in every operand: a padded position contributes 0 to
  # a sum over it, and is 0 in the output.
  handles_padding = True

  def __init__(self, inputs, output_shape, name=None):
    super().__init__(inputs, name=name or "einsum")
    output_shape = shape_lib.convert_to_shape(output_shape)
    shape_lib.check_consistent_sizes([x.shape for x in inputs] + [output_shape], self.name)
    dtypes = {x.dtype for x in inputs}
    if len(dtypes) != 1:
      raise TypeError(f"einsum {self.name!r}: inputs must share a dtype, got "
                      f"{sorted(d.name for d in dtypes)}.")
    self._outputs = [graph_lib.Tensor(self, output_shape, inputs[0].dtype)]

  @property
  def padding_stays_zero(self):
    """A product with a zero factor: zero padding in every output dimension
    some input has (one that none has is broadcast, copying values)."""
    names = set()
    for x in self._inputs:
      names.update(x.shape.dimension_names)
    return set(self._outputs[0].shape.dimension_names) <= names

  def gradient_operands(self, dy, index):
    """The einsum operands of input `index`'s gradient (summed to its
    shape), given the output's gradient dy."""
    return [dy] + self._inputs[:index] + self._inputs[index + 1:]

  def gradient(self, grad_ys):
    return [einsum(self.gradient_operands(grad_ys[0], i), output_shape=x.shape,
                   name=self.name + f"_grad_{i}")
            for i, x in enumerate(self._inputs)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out_shape = self._outputs[0].shape
    input_shapes = [x.shape for x in self._inputs]
    all_dims = _union_of_dims(input_shapes)
    intersection = shape_lib.Shape([d for d in out_shape if d in all_dims])
    inputs = [lowering.tensors[x] for x in self._inputs]
    replicate = _dims_to_replicate(impl.tensor_dimension_to_mesh_axis,
                                   all_dims, out_shape)
    for i, x in enumerate(self._inputs):
      gathered = {d.name for d in x.shape if d in replicate}
      if gathered:
        inputs[i] = impl.gather_dimensions(inputs[i], x.shape, gathered)
    reduced_mesh_axes = sorted({
        impl.tensor_dimension_to_mesh_axis(d) for d in all_dims
        if d not in out_shape and d not in replicate and
        impl.tensor_dimension_to_mesh_axis(d) is not None})

    products_order = _elementwise_order(input_shapes, intersection)
    is_float = (self._outputs[0].dtype.is_floating or
                self._outputs[0].dtype.is_complex)
    if is_float and products_order is None:
      equation = einsum_equation(input_shapes, intersection)
      if len(input_shapes) == 2 and _prefer_swapped(
          equation, [impl.slice_shape(s) for s in input_shapes]):
        swapped = _swapped_equation(equation)
        fn = lambda a, b: impl.einsum(swapped, b, a)
      else:
        fn = lambda *slices: impl.einsum(equation, *slices)
    else:
      full = shape_lib.Shape(products_order or all_dims)

      def fn(*slices):
        # Some input has full's first dimension: the product has full rank.
        slices = slice_utils.broadcastable(
            [slice_utils.expand_to(s, shape, full, leading_ones=False)
             for s, shape in zip(slices, input_shapes)])
        product = slices[0]
        for s in slices[1:]:
          product = product * s
        return slice_utils.reduce_to(product, full, intersection)

    y = impl.slicewise(fn, *inputs)
    if reduced_mesh_axes:
      y = mesh_impl_lib.LazyAllreduceSum(impl, y, reduced_mesh_axes)
    if intersection != out_shape:
      y = impl.broadcast_impl(y.to_laid_out_tensor(), intersection, out_shape)
    lowering.set_tensor_lowering(self._outputs[0], y)


@cost_rules.rule_for(EinsumOperation)
class _EinsumCost(cost_rules.CostRule):
  """FLOPs of the local einsum, the allconcats of `_dims_to_replicate`, and
  a sum pending over the mesh dimensions of split summed-over dimensions
  (allreduced at once when the output broadcasts further)."""

  may_pend = True

  def run(self, info, ctx):
    layout = ctx.layout
    out = info.out_dims[0]
    all_dims = _union_of_dims(info.in_dims)
    replicate = _dims_to_replicate(lambda d: layout.mesh_dim(d[0]), all_dims,
                                   out)
    collectives = []
    for dims, itemsize in zip(info.in_dims, info.in_itemsize):
      sizes = layout.slice_sizes(dims)
      for k, d in enumerate(dims):
        if d in replicate:
          collectives.append(cost_rules.collective(
              layout, "allconcat", (layout.mesh_dim(d[0]),),
              math.prod(sizes) * itemsize))
          sizes[k] = d[1]
    reduced = layout.summed_mesh_dims([all_dims], out, skip=replicate)
    flops = 2
    for d in all_dims:
      m = layout.mesh_dim(d[0])
      whole = m is None or d in replicate
      # A padded (uneven) slice holds ceil(size / pieces).
      flops *= d[1] if whole else -(-d[1] // layout.sizes[m])
    pending = reduced
    intersection = [d for d in out if d in all_dims]
    if len(intersection) != len(out):
      # Broadcast to the output right away: the partial sums of the
      # intersection are reduced here.
      if reduced:
        collectives.append(cost_rules.collective(
            layout, "allreduce", reduced,
            cost_rules.slice_bytes(layout, intersection,
                                   info.out_itemsize[0])))
      pending = ()
    # Its operands and result pass through memory too: a skinny matmul
    # (a weight gradient of few rows) costs its bytes more than its FLOPs.
    return cost_rules.RuleResult([pending], collectives, flops=flops,
                                 matmul_bytes=cost_rules.io_bytes(info,
                                                                  layout))


def _elementwise_order(input_shapes, out_shape):
  """The dimension order in which to multiply the inputs element-wise (then
  sum), or None when the einsum is a real contraction.

  TF's Einsum kernel turns every equation into a batched matrix product, so
  an element-wise product (x[a, b, c] * y[a, b] -> [a, b, c]) becomes
  millions of 1x1 products: 2-30x slower than a broadcasting multiply.
  Element-wise means: no dimension is summed over (each goes to the
  output; multiply in the output's order), or every input has every
  dimension (multiply in the first input's order, then sum).
  """
  union = _union_of_dims(input_shapes)
  if all(d in out_shape for d in union):
    return list(out_shape)
  if all(len(shape) == len(union) for shape in input_shapes):
    return list(input_shapes[0])
  return None


def _dims_to_replicate(mesh_axis_of, all_dims, out_shape):
  """Summed-over dimensions to gather before the local einsum.

  Dimensions of different inputs may be split over the same mesh dimension
  (x[a, b] and w[c] with rules "b:all;c:all"). Then each processor's partial
  product mixes blocks that must not meet: summing them over the mesh would be
  wrong. On each such mesh dimension, one dimension stays split (the output's
  if it has one there, else the largest) and the summed-over others are
  allconcatenated first.

  Args:
    mesh_axis_of: function of a dimension, the mesh axis splitting it or
      None.
    all_dims: the inputs' dimensions (Dimensions or (name, size) pairs).
    out_shape: the output's, of the same kind.

  Returns:
    the set of dimensions to replicate.
  """
  by_axis = {}
  for d in all_dims:
    axis = mesh_axis_of(d)
    if axis is not None:
      by_axis.setdefault(axis, []).append(d)
  replicate = set()
  for dims in by_axis.values():
    if len(dims) > 1:
      keep = max(dims, key=lambda d: (d in out_shape, d[1]))
      replicate.update(d for d in dims if d != keep and d not in out_shape)
  return replicate


def _natural_output(a, b, out):
  """The label order in which tf.einsum's matmul of terms `a`, `b` comes out
  before any output transpose: batch labels (in both inputs and the output),
  then the free labels of `a`, then those of `b`."""
  batch = [c for c in a if c in b and c in out]
  free_a = [c for c in a if c not in b and c in out]
  free_b = [c for c in b if c not in a and c in out]
  return "".join(batch + free_a + free_b)


def _swap_avoids_transpose(equation):
  """True if tf.einsum would transpose its result, and would not with the two
  operands the other way round."""
  inputs, out = equation.split("->")
  a, b = inputs.split(",")
  return _natural_output(a, b, out) != out and _natural_output(b, a, out) == out


def _prefer_swapped(equation, slice_shapes):
  """Whether tf.einsum runs a two-operand equation faster with the operands
  the other way round.

  First, avoid a wide adjoint left operand (see `_wide_adjoint`). Else,
  avoid transposing the result: tf.einsum writes a matmul's result as
  [batch, free labels of the first operand, free labels of the second] and
  transposes it when the equation asks otherwise; weight gradients
  (dy[b, h], x[b, i] -> dw[i, h]) ask for the other order, and swapping
  saves that copy.
  """
  sizes = _label_sizes(equation, slice_shapes)
  swapped = _swapped_equation(equation)
  wide, wide_swapped = (_wide_adjoint(equation, sizes),
                        _wide_adjoint(swapped, sizes))
  if wide != wide_swapped:
    return wide
  return _swap_avoids_transpose(equation)


def _label_sizes(equation, slice_shapes):
  """Each input label's size in the local slices."""
  terms = equation.split("->")[0].split(",")
  return {c: n for term, shape in zip(terms, slice_shapes)
          for c, n in zip(term, shape)}


def _wide_adjoint(equation, sizes):
  """True if tf.einsum would multiply with the first operand adjoint (it is
  laid out [batch, contracted, free]) and that operand's free size M exceeds
  the second's N.

  TF's matmul kernels on CPU are markedly slower with a wide adjoint left
  operand: dx[h, i] = x[b, h]^T dy[b, i] takes 6.2 ms for M=512, N=128 and
  4.8 ms the other way round (result transposed), the attention's
  dv = weights^T . dout 8.5 ms against 4.4 ms (the tiny Transformer's shapes,
  2-core CPU).
  """
  inputs, out = equation.split("->")
  a, b = inputs.split(",")
  batch = [c for c in a if c in b and c in out]
  contract = [c for c in a if c in b and c not in out]
  free_a = [c for c in a if c not in b and c in out]
  free_b = [c for c in b if c not in a and c in out]
  if not contract or not free_a or not free_b:
    return False
  rank = {c: (0 if c in batch else 1 if c in contract else 2)
          for c in batch + contract + free_a}
  order = [rank[c] for c in a if c in rank]
  if order != sorted(order):
    return False  # Not [batch, contracted, free]: no adjoint.
  product = lambda labels: math.prod(sizes[c] for c in labels)
  return product(free_a) > product(free_b)


def _swapped_equation(equation):
  inputs, out = equation.split("->")
  a, b = inputs.split(",")
  return f"{b},{a}->{out}"


def einsum_equation(input_shapes, output_shape):
  """A tf.einsum equation with one letter per dimension name."""
  letters = {}
  for shape in list(input_shapes) + [output_shape]:
    for d in shape:
      if d.name not in letters:
        if len(letters) == len(_LETTERS):
          raise errors.ShapeError(
              f"einsum over more than {len(_LETTERS)} distinct dimensions.")
        letters[d.name] = _LETTERS[len(letters)]
  term = lambda shape: "".join(letters[d.name] for d in shape)
  return ",".join(term(s) for s in input_shapes) + "->" + term(output_shape)


def einsum(xs, output_shape=None, reduced_dims=None, name=None):
  """Einstein summation over named dimensions.

  Args:
    xs: list of mtf Tensors with a common dtype.
    output_shape: the output Shape. By default, the dimensions that occur in
      exactly one input, in order of appearance.
    reduced_dims: alternatively, the dimensions to sum over.
    name: optional name.

  Returns:
    an mtf Tensor of `output_shape`.
  """
  xs = list(xs)
  if not xs:
    raise ValueError("einsum needs at least one input.")
  shapes = [x.shape for x in xs]
  shape_lib.check_consistent_sizes(shapes, name or "einsum")
  all_dims = _union_of_dims(shapes)
  output_shape = shape_lib.convert_to_shape(output_shape)
  if reduced_dims is not None:
    if isinstance(reduced_dims, shape_lib.Dimension):
      reduced_dims = [reduced_dims]  # A Dimension is a tuple: test it first.
    reduced_dims = [shape_lib.convert_to_dimension(d) for d in reduced_dims]
    for d in reduced_dims:
      if d not in all_dims:
        raise errors.ShapeError(
            f"einsum: reduced dimension {d} is not in any input "
            f"({', '.join(map(str, shapes))}).")
    implied = shape_lib.Shape([d for d in all_dims if d not in reduced_dims])
    if output_shape is None:
      output_shape = implied
    elif set(output_shape.dims) != set(implied.dims):
      raise errors.ShapeError(
          f"einsum: output_shape {output_shape} is inconsistent with "
          f"reduced_dims {reduced_dims} for inputs "
          f"{', '.join(map(str, shapes))}.")
  elif output_shape is None:
    counts = {}
    for shape in shapes:
      for d in shape:
        counts[d] = counts.get(d, 0) + 1
    output_shape = shape_lib.Shape([d for d in all_dims if counts[d] == 1])
  return EinsumOperation(xs, output_shape, name=name).outputs[0]


def matmul(a, b, output_shape=None, reduced_dims=None, name=None):
  """Alias of einsum([a, b], ...)."""
  return einsum([a, b], output_shape=output_shape, reduced_dims=reduced_dims,
                name=name or "matmul")


def transpose(x, new_shape, name=None):
  """Reorders the dimensions of `x` to `new_shape` (same dimensions)."""
  new_shape = shape_lib.convert_to_shape(new_shape)
  if set(x.shape.dims) != set(new_shape.dims):
    raise errors.ShapeError(
        f"transpose: {new_shape} does not have the same dimensions as "
        f"{x.name} {x.shape}.")
  return einsum([x], output_shape=new_shape, name=name or "transpose")
