"""Random mtf programs, for property tests of layouts.

`build(seed, mesh)` builds a program from a seed: the same program whatever
mesh and layout it is lowered onto, because every random choice depends on
the seed and on tensor shapes only. Programs mix element-wise ops,
broadcasting, einsum, reductions, concat / split / slice / pad / shift,
stack / unstack, top_k and the selections (top_1, argmax, n-th largest and
smallest), pooling, renames and reshapes, gathers, and while-loop, recompute
and custom-gradient bodies; the layouts may split the dimension any of them
acts along (`along_split` says which do). `check(seed, mesh_shape, layout,
mode)` runs one under a layout and compares it with one processor: the
answer must agree, or lowering must raise an mtf error that names a
dimension of the program.

Tensors reach rank MAX_RANK (7): inputs of any rank up to it over seven
base dimensions, einsum outer products and stacks. That is past the rank
limits of TensorFlow's kernels (5 for oneDNN's softmax and for the groups
of a broadcast), which tensors of rank <= 5 never meet. Every operation
keeps its output within MAX_RANK and MAX_ELEMENTS, so that programs stay
cheap: base dimensions are mostly of sizes 2 and 4.

Half of the layouts switch uneven splits on (`LayoutRules(...,
allow_uneven=True)`): their rules may then split a dimension over a mesh
dimension that does not divide its size, which the lowering pads (sizes 3
and 6, and the small sizes over larger meshes), so the same property
checks the padding of every operation the programs use.
"""

import dataclasses
import functools
import re

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mtf_testing

SIZES = (2, 2, 4, 4, 8, 6, 3)
NUM_BASE_DIMS = 7
MAX_RANK = 7
MAX_ELEMENTS = 4096
MESHES = ("all:2", "all:4", "all:8", "r:2;c:2", "r:2;c:4", "r:4;c:2")
MTF_ERRORS = (mtf.ShapeError, mtf.LayoutError, mtf.IndivisibleError)


@dataclasses.dataclass
class Program:
  """What `build` made: inputs to differentiate, outputs, dimension names."""
  inputs: list
  outputs: list
  dim_names: set
  has_loop: bool


class _Builder:
  """Grows a list of float values by random operations."""

  def __init__(self, seed, mesh):
    self.rng = np.random.RandomState(seed)
    self.mesh = mesh
    self.values = []
    self.dim_names = set()
    self.fresh = 0
    self.has_loop = False

  # Helpers.

  def new_name(self, prefix):
    self.fresh += 1
    name = f"{prefix}{self.fresh}"
    self.dim_names.add(name)
    return name

  def pick(self, values=None, min_rank=0):
    values = [v for v in (values or self.values)
              if v.shape.ndims >= min_rank]
    if not values:
      return None
    # Prefer recent values, so programs grow deep rather than wide.
    weights = np.arange(1, len(values) + 1, dtype=np.float64)
    return values[self.rng.choice(len(values), p=weights / weights.sum())]

  def pick_dim(self, x):
    return x.shape.dims[self.rng.randint(x.shape.ndims)]

  @staticmethod
  def fits(dims):
    """Whether a tensor of `dims` keeps within MAX_RANK and MAX_ELEMENTS."""
    return (len(dims) <= MAX_RANK and
            int(np.prod([d.size for d in dims])) <= MAX_ELEMENTS)

  @staticmethod
  def resized(x, dim, size):
    """x's dimensions with `dim` of a new size."""
    return [mtf.Dimension(d.name, size) if d == dim else d
            for d in x.shape.dims]

  @staticmethod
  def union(x, y):
    return list(x.shape.dims) + [d for d in y.shape.dims
                                 if d not in x.shape.dims]

  def input_dims(self, base):
    """A random subset of the base dimensions (in their order) of a random
    rank, as large as fits."""
    rank = int(self.rng.randint(1, MAX_RANK + 1))
    while True:
      for _ in range(4):
        chosen = sorted(self.rng.choice(len(base), rank, replace=False))
        dims = [base[i] for i in chosen]
        if self.fits(dims):
          return dims
      rank -= 1

  def constant(self, dims, dtype=np.float32, high=None):
    shape = [d.size for d in dims]
    if high is None:
      array = self.rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    else:
      array = self.rng.randint(0, high, size=shape).astype(dtype)
    return mtf.import_tf_tensor(self.mesh, tf.constant(array), mtf.Shape(dims))

  # Operations: each returns a new value, or None if it does not apply.

  def unary(self, x):
    fns = [mtf.tanh, mtf.sigmoid, lambda t: mtf.square(t) * 0.5,
           mtf.negative, lambda t: mtf.exp(mtf.tanh(t)), lambda t: t * 1.5]
    return fns[self.rng.randint(len(fns))](x)

  def compatible(self, x):
    sizes = {d.name: d.size for d in x.shape.dims}
    return [y for y in self.values
            if all(sizes.get(d.name, d.size) == d.size for d in y.shape.dims)]

  def binary(self, x):
    y = self.pick([y for y in self.compatible(x)
                   if self.fits(self.union(x, y))])
    fns = [mtf.add, mtf.sub, mtf.multiply, mtf.maximum]
    return fns[self.rng.randint(len(fns))](x, y)

  def einsum(self, x):
    y = self.pick(self.compatible(x))
    keep = [d for d in self.union(x, y) if self.rng.rand() < 0.6]
    while not self.fits(keep):
      keep.pop(self.rng.randint(len(keep)))
    order = self.rng.permutation(len(keep))
    return mtf.einsum([x, y], output_shape=mtf.Shape([keep[i] for i in order]))

  def reduce(self, x):
    if not x.shape.ndims:
      return None
    dim = self.pick_dim(x)
    fns = [mtf.reduce_sum, mtf.reduce_max, mtf.reduce_mean, mtf.reduce_min]
    return fns[self.rng.randint(len(fns))](x, reduced_dim=dim)

  def softmax(self, x):
    if not x.shape.ndims:
      return None
    return mtf.softmax(x, self.pick_dim(x))

  def cumsum(self, x):
    if not x.shape.ndims:
      return None
    return mtf.cumsum(x, self.pick_dim(x))

  def concat(self, x):
    if not x.shape.ndims:
      return None
    dim = self.pick_dim(x)
    if not self.fits(self.resized(x, dim, 2 * dim.size)):
      return None
    return mtf.concat([x, mtf.tanh(x)], dim.name)

  def split(self, x):
    dims = [d for d in x.shape.dims if d.size >= 2]
    if not dims:
      return None
    dim = dims[self.rng.randint(len(dims))]
    k = self.rng.randint(1, dim.size)
    return mtf.split(x, dim, [k, dim.size - k])[self.rng.randint(2)]

  def slice(self, x):
    dims = [d for d in x.shape.dims if d.size >= 2]
    if not dims:
      return None
    dim = dims[self.rng.randint(len(dims))]
    size = self.rng.randint(1, dim.size + 1)
    begin = self.rng.randint(0, dim.size - size + 1)
    return mtf.slice(x, begin, size, dim.name)

  def pad(self, x):
    if not x.shape.ndims:
      return None
    dim = self.pick_dim(x)
    before, after = int(self.rng.randint(3)), int(self.rng.randint(3))
    if not self.fits(self.resized(x, dim, dim.size + before + after)):
      return None
    return mtf.pad(x, [before, after], dim.name)

  def shift(self, x):
    if not x.shape.ndims:
      return None
    dim = self.pick_dim(x)
    offset = int(self.rng.randint(-dim.size + 1, dim.size))
    return mtf.shift(x, offset, dim, wrap=bool(self.rng.randint(2)))

  def rename(self, x):
    if not x.shape.ndims:
      return None
    dim = self.pick_dim(x)
    return mtf.rename_dimension(x, dim.name, self.new_name("r"))

  def reshape(self, x):
    dims = list(x.shape.dims)
    if len(dims) >= 2 and self.rng.rand() < 0.5:
      i = self.rng.randint(len(dims) - 1)
      merged = mtf.Dimension(self.new_name("m"), dims[i].size * dims[i + 1].size)
      new_dims = dims[:i] + [merged] + dims[i + 2:]
    else:
      even = [i for i, d in enumerate(dims) if d.size % 2 == 0]
      if not even or len(dims) >= MAX_RANK:
        return None
      i = even[self.rng.randint(len(even))]
      halves = [mtf.Dimension(self.new_name("s"), 2),
                mtf.Dimension(self.new_name("s"), dims[i].size // 2)]
      new_dims = dims[:i] + halves + dims[i + 1:]
    return mtf.reshape(x, mtf.Shape(new_dims))

  def gather(self, x):
    if not x.shape.ndims:
      return None
    dim = self.pick_dim(x)
    index_dim = mtf.Dimension(self.new_name("g"), int(self.rng.choice([2, 4])))
    if not self.fits(self.resized(x, dim, index_dim.size)):
      return None
    indices = self.constant([index_dim], np.int32, high=dim.size)
    return mtf.gather(x, indices, dim)

  def transpose(self, x):
    dims = list(x.shape.dims)
    return mtf.transpose(
        x, mtf.Shape([dims[i] for i in self.rng.permutation(len(dims))]))

  def stack(self, x):
    count = int(self.rng.choice([2, 4]))
    if not self.fits(list(x.shape.dims) + [mtf.Dimension("k", count)]):
      return None
    parts = [x, mtf.tanh(x), x * 1.5, mtf.negative(x)][:count]
    axis = int(self.rng.randint(x.shape.ndims + 1))
    return mtf.stack(parts, self.new_name("k"), axis=axis)

  def unstack(self, x):
    dims = [d for d in x.shape.dims if 2 <= d.size <= 8]
    if not dims:
      return None
    dim = dims[self.rng.randint(len(dims))]
    parts = mtf.unstack(x, dim)
    i, j = self.rng.randint(len(parts), size=2)
    return parts[i] - 0.5 * parts[j]

  def top_k(self, x):
    """top_k along a dimension: its values, plus its indices (as floats)
    now and then; the new k dimension gets a name of its own, so that
    layouts may split it."""
    dims = [d for d in x.shape.dims if d.size >= 2]
    if not dims:
      return None
    dim = dims[self.rng.randint(len(dims))]
    k_dim = mtf.Dimension(self.new_name("k"),
                          int(self.rng.randint(1, min(dim.size, 4) + 1)))
    if not self.fits(self.resized(x, dim, k_dim.size)):
      return None
    values, indices = mtf.top_k(x, dim, k_dim)
    if self.rng.rand() < 0.5:
      return values
    return values + mtf.cast(indices, tf.float32) * 0.25

  def select(self, x):
    """A selection along a dimension: max and argmax, the n-th largest or
    smallest entry."""
    if not x.shape.ndims:
      return None
    dim = self.pick_dim(x)
    kind = self.rng.randint(4)
    if kind == 0:
      values, indices = mtf.top_1(x, dim)
      return values - mtf.cast(indices, tf.float32) * 0.5
    if kind == 1:
      return mtf.cast(mtf.argmax(x, dim), tf.float32) + mtf.reduce_sum(
          x, reduced_dim=dim)
    n = int(self.rng.randint(dim.size))
    if kind == 2:
      return mtf.nth_largest_element(x, n, dim)
    return mtf.nth_smallest_element(x, n, dim)

  def pool(self, x):
    if x.shape.ndims < 3:
      return None
    spatial = x.shape.dims[-3:-1]
    ksize = [2 if d.size >= 2 else 1 for d in spatial]
    fns = [mtf.max_pool2d, mtf.avg_pool2d]
    return fns[self.rng.randint(len(fns))](x, ksize)

  # Bodies.

  def chain(self, x, steps, shape_preserving=False):
    """A few random operations applied to x (inside a body)."""
    outer = self.values
    self.values = list(outer) + [x]
    try:
      for _ in range(steps):
        op = self.rng.choice(_PRESERVING if shape_preserving else _SIMPLE)
        y = getattr(self, op)(x)
        if y is None:
          continue
        if shape_preserving:
          y = _back_to_shape(y, x.shape)
        x = y
        self.values.append(x)
    finally:
      self.values = outer
    return x

  def recompute(self, x):
    steps = int(self.rng.randint(1, 4))
    seed = int(self.rng.randint(1 << 30))
    return mtf.recompute_grad(lambda t: self._replay(seed, t, steps), [x])

  def custom(self, x):
    steps = int(self.rng.randint(1, 4))
    seed = int(self.rng.randint(1 << 30))

    def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
                output_grads):
      # Differentiates copies of the forward operations, as a user's
      # gradient function may (internal tensors stay inside the body).
      del explicit_inputs
      graph = outputs[0].graph
      copies, copied = graph.clone_operations(
          forward_operations, {x: x for x in all_inputs})
      recomputed = [copied[t] for t in outputs[0].operation.forward_outputs]
      return mtf.gradients(recomputed, all_inputs, output_grads,
                           operations=copies)

    return mtf.custom_gradient(lambda t: self._replay(seed, t, steps),
                               grad_fn, [x])

  def _replay(self, seed, x, steps):
    saved = self.rng
    self.rng = np.random.RandomState(seed)
    try:
      return self.chain(x, steps)
    finally:
      self.rng = saved

  def loop(self, x):
    self.has_loop = True
    iterations = int(self.rng.randint(1, 3))
    steps = int(self.rng.randint(1, 3))
    seed = int(self.rng.randint(1 << 30))
    # A value computed outside the loop and used in it and after it.
    outside = self.reduce(x) if x.shape.ndims else x

    def body(i, acc):
      y = self._replay_preserving(seed, acc, steps)
      y = y + _back_to_shape(outside, acc.shape)
      return [i + 1, acc + mtf.tanh(y)]

    i0 = mtf.constant(self.mesh, 0, mtf.Shape([]), dtype=tf.int32)
    _, out = mtf.while_loop(lambda i, acc: mtf.less(i, iterations), body,
                            [i0, x])
    self.values.append(outside)
    return out

  def _replay_preserving(self, seed, x, steps):
    saved = self.rng
    self.rng = np.random.RandomState(seed)
    try:
      return self.chain(x, steps, shape_preserving=True)
    finally:
      self.rng = saved


_SIMPLE = ("unary", "binary", "einsum", "reduce", "softmax", "cumsum",
           "concat", "split", "slice", "pad", "shift", "rename", "reshape",
           "gather", "transpose", "stack", "unstack", "pool", "top_k",
           "select")
_PRESERVING = ("unary", "binary", "einsum", "reduce", "softmax", "cumsum",
               "concat", "slice", "pad", "shift", "transpose")
_ALL = _SIMPLE + ("recompute", "custom", "loop")


def _back_to_shape(y, shape):
  """y made into a tensor of `shape`: extra dims summed, missing ones
  broadcast, sizes that changed sliced or padded back."""
  for d in y.shape.dims:
    if d.name not in shape.dimension_names:
      y = mtf.reduce_sum(y, reduced_dim=d)
  for d in shape.dims:
    current = [e for e in y.shape.dims if e.name == d.name]
    if current and current[0].size > d.size:
      y = mtf.slice(y, 0, d.size, d.name)
    elif current and current[0].size < d.size:
      y = mtf.pad(y, [0, d.size - current[0].size], d.name)
  return mtf.broadcast(y, shape) if y.shape != shape else y


def build(seed, mesh, num_ops=None):
  """Builds the program of `seed` on `mesh`; returns a Program."""
  b = _Builder(seed, mesh)
  base = [mtf.Dimension(f"d{i}", int(b.rng.choice(SIZES)))
          for i in range(NUM_BASE_DIMS)]
  b.dim_names.update(d.name for d in base)
  inputs = [b.constant(b.input_dims(base))
            for _ in range(int(b.rng.randint(1, 4)))]
  b.values = list(inputs)
  for _ in range(num_ops or int(b.rng.randint(3, 9))):
    op = _ALL[b.rng.randint(len(_ALL))]
    x = b.pick()
    y = getattr(b, op)(x)
    if y is not None:
      b.values.append(y)
  outputs = b.values[-2:] if len(b.values) > len(inputs) else b.values[-1:]
  return Program(inputs, outputs, b.dim_names, b.has_loop)


def run(seed, mesh_shape, layout, mode, num_ops=None):
  """Outputs (and input gradients, when the program has no loop) of the
  program of `seed`, as NumPy arrays."""
  impl = mtf_testing.make_impl(mode, mesh_shape, layout)

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    program = build(seed, mesh, num_ops)
    fetch = {f"out{i}": y for i, y in enumerate(program.outputs)}
    if not program.has_loop:
      cotangent_rng = np.random.RandomState(seed + 1)
      total = None
      for y in program.outputs:
        c = cotangent_rng.uniform(-1, 1, y.shape.to_integer_list)
        term = mtf.reduce_sum(y * mtf.import_tf_tensor(
            mesh, tf.constant(c.astype(np.float32)), y.shape))
        total = term if total is None else total + term
      grads = mtf.gradients([total], program.inputs)
      fetch.update({f"grad{i}": g for i, g in enumerate(grads)
                    if g is not None})
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, {k: lowering.export_to_tf_tensor(v)
                      for k, v in fetch.items()}

  return mtf_testing.run_in_mode(mode, build_and_lower, impl)


@functools.lru_cache(maxsize=256)
def _built(seed, num_ops=None):
  """(graph, program) of `seed`, built once for the questions below (which
  do not lower it)."""
  graph = mtf.Graph()
  return graph, build(seed, mtf.Mesh(graph, "mesh"), num_ops)


def _operations(seed, num_ops=None):
  """The program's operations, those of bodies included."""
  operations = list(_built(seed, num_ops)[0].operations)
  while operations:
    op = operations.pop()
    operations.extend(getattr(op, "internal_operations", []))
    yield op


def dimension_names(seed, num_ops=None):
  """The names of the program's dimensions, those that library functions
  make inside it (nth_largest_element's "_top_k_", say) included."""
  return _built(seed, num_ops)[1].dim_names | {
      d.name for shape in _tensor_shapes(seed, num_ops) for d in shape.dims}


def _tensor_shapes(seed, num_ops=None):
  """The shapes of the program's tensors, those of bodies included."""
  for op in _operations(seed, num_ops):
    for t in op.outputs:
      yield t.shape


def dimension_sizes(seed, num_ops=None):
  """{dimension name: set of its sizes} over the program's tensors."""
  sizes = {}
  for shape in _tensor_shapes(seed, num_ops):
    for d in shape.dims:
      sizes.setdefault(d.name, set()).add(d.size)
  return sizes


def max_rank(seed, num_ops=None):
  """The largest rank among the program's tensors."""
  return max(shape.ndims for shape in _tensor_shapes(seed, num_ops))


def random_layout(rng, mesh_shape, dim_sizes, allow_uneven=False):
  """Layout rules splitting some dimensions over mesh dimensions.

  Mostly valid: a dimension goes to a mesh dimension that no other rule
  uses and that divides all its sizes (if `allow_uneven`, mostly to one
  that does not, padded); now and then to any mesh dimension, so that the
  errors are exercised too. With `allow_uneven`, LayoutRules with the switch on;
  otherwise a rules string.
  """
  mesh = {name: int(size) for name, size in
          (part.split(":") for part in mesh_shape.split(";"))}
  used, rules = set(), []
  for name in sorted(dim_sizes):
    if rng.rand() >= 0.4:
      continue
    fitting = [m for m in sorted(mesh) if m not in used and (
        allow_uneven or all(size % mesh[m] == 0 for size in dim_sizes[name]))]
    uneven = [m for m in fitting
              if any(size % mesh[m] for size in dim_sizes[name])]
    if uneven and rng.rand() < 0.7:
      fitting = uneven  # mostly pad when padding is allowed
    if rng.rand() < 0.85:
      if not fitting:
        continue
      choice = fitting[rng.randint(len(fitting))]
    else:
      choice = sorted(mesh)[rng.randint(len(mesh))]
    used.add(choice)
    rules.append(f"{name}:{choice}")
  if allow_uneven:
    return mtf.LayoutRules([tuple(rule.split(":")) for rule in rules],
                           allow_uneven=True)
  return ";".join(rules)


def padded_dimensions(seed, mesh_shape, layout, num_ops=None):
  """Names of the program's dimensions that `layout` splits unevenly (has
  some size the mesh dimension does not divide), padded in lowering."""
  layout = mtf.convert_to_layout_rules(layout)
  if not layout.allow_uneven:
    return set()
  mesh = mtf.convert_to_shape(mesh_shape)
  names = set()
  for name, sizes in dimension_sizes(seed, num_ops).items():
    for size in sizes:
      axis = layout.tensor_dimension_to_mesh_axis(
          mtf.Dimension(name, size), mesh)
      if axis is not None and size % mesh.dims[axis].size:
        names.add(name)
  return names


class WrongAnswer(AssertionError):
  """The program's answer under a layout differs from one processor's."""


class RawError(AssertionError):
  """Lowering or running raised something other than an mtf error naming a
  dimension of the program (a raw TensorFlow error, say)."""


def outcome(seed, mesh_shape, layout, mode, num_ops=None, rtol=1e-4):
  """Runs the program of `seed` under a layout against one processor.

  Returns (outcome, error): outcome is "agree", "error" (error is the mtf
  error, which names a dimension) or "invalid" (the program is ill-formed
  on one processor too). Raises WrongAnswer on a wrong answer and RawError
  on an mtf error that names no dimension or any other exception.
  """
  where = f"seed {seed}, mesh {mesh_shape!r}, layout {layout!r}, mode {mode}"
  try:
    want = run(seed, "all:1", "", "eager", num_ops)
  except MTF_ERRORS as e:
    return "invalid", e
  except Exception as e:  # pylint: disable=broad-except
    raise RawError(f"{where}: {type(e).__name__} on one processor: "
                   f"{e}") from e
  try:
    got = run(seed, mesh_shape, layout, mode, num_ops)
  except MTF_ERRORS as e:
    names = dimension_names(seed, num_ops)
    if not any(name in str(e) for name in names):
      raise RawError(f"{where}: {type(e).__name__} names no dimension "
                     f"of the program: {e}") from e
    return "error", e
  except Exception as e:  # pylint: disable=broad-except
    raise RawError(f"{where}: {type(e).__name__} instead of the "
                   f"one-processor answer or an mtf error: {e}") from e
  if sorted(got) != sorted(want):
    raise WrongAnswer(f"{where}: fetched {sorted(got)}, not {sorted(want)}")
  for key in want:
    scale = max(1.0, float(np.max(np.abs(want[key]), initial=0.0)))
    try:
      np.testing.assert_allclose(got[key], want[key], rtol=rtol,
                                 atol=rtol * scale, err_msg=f"{where}: {key}")
    except AssertionError as e:
      raise WrongAnswer(str(e)) from None
  return "agree", None


def check(seed, mesh_shape, layout, mode, num_ops=None, rtol=1e-4):
  """outcome()'s first part: "agree", "error" or "invalid"; raises an
  AssertionError (WrongAnswer or RawError) otherwise."""
  return outcome(seed, mesh_shape, layout, mode, num_ops, rtol)[0]


def error_cause(error):
  """A short key for an mtf error: its class and the type of the operation
  at fault ("LayoutError:PoolOperation"), or "LayoutError:layout" when the
  layout rules themselves do not fit a tensor (two of its dimensions on one
  mesh dimension, say), which no operation could lower."""
  if re.search(r"(^|Error: )Tensor \S+ \(Shape\[.*\]\) on mesh ",
               str(error)):
    # Lowering's check of every tensor's layout, before any operation.
    return f"{type(error).__name__}:layout"
  culprit = "unknown"
  tb = error.__traceback__
  while tb is not None:
    local = tb.tb_frame.f_locals
    for key in ("self", "op"):
      if isinstance(local.get(key), mtf.Operation):
        culprit = type(local[key]).__name__
    tb = tb.tb_next
  return f"{type(error).__name__}:{culprit}"


# The operations issue 48 made lowerable along a split dimension, and how
# to find that dimension's names on each.
ALONG_DIMENSIONS = {
    "ConcatOperation": lambda op: [op._dim_name],  # pylint: disable=protected-access
    "SliceOperation": lambda op: [op._dim_name],  # pylint: disable=protected-access
    "PadOperation": lambda op: [op._dim_name],  # pylint: disable=protected-access
    "SplitOperation": lambda op: [op._split_dim.name],  # pylint: disable=protected-access
    "StackOperation": lambda op: [op._new_dim.name],  # pylint: disable=protected-access
    "UnstackOperation": lambda op: [op._dim.name],  # pylint: disable=protected-access
    "TopKOperation": lambda op: [op.reduced_dim.name] + (
        [op.k_dim.name] if op.k_dim is not None else []),
}


def along_split(seed, mesh_shape, layout, num_ops=None):
  """The types of the program's operations (of ALONG_DIMENSIONS) that act
  along a dimension `layout` splits over a mesh dimension of size > 1."""
  layout = mtf.convert_to_layout_rules(layout)
  mesh = mtf.convert_to_shape(mesh_shape)
  found = set()
  for op in _operations(seed, num_ops):
    names = ALONG_DIMENSIONS.get(type(op).__name__)
    if not names:
      continue
    sizes = {d.name: d.size for t in op.inputs + op.outputs for d in t.shape}
    for name in names(op):
      try:
        axis = layout.tensor_dimension_to_mesh_axis(
            mtf.Dimension(name, sizes[name]), mesh)
      except mtf.LayoutError:
        continue
      if axis is not None and mesh.dims[axis].size > 1:
        found.add(type(op).__name__)
  return found


def cases(count, first_seed=0):
  """(seed, mesh_shape, layout, mode) cases, deterministic; half of them
  with uneven splits allowed."""
  rng = np.random.RandomState(first_seed + 12345)
  # Its own generator: the other draws do not depend on the switch's.
  uneven_rng = np.random.RandomState(first_seed + 54321)
  result = []
  for seed in range(first_seed, first_seed + count):
    mesh_shape = MESHES[rng.randint(len(MESHES))]
    layout = random_layout(rng, mesh_shape, dimension_sizes(seed),
                           allow_uneven=bool(uneven_rng.rand() < 0.5))
    mode = mtf_testing.MODES[rng.randint(len(mtf_testing.MODES))]
    result.append((seed, mesh_shape, layout, mode))
  return result
