"""Named dimensions, shapes and layout rules.

A `Dimension` is a (name, size) pair; a `Shape` is an ordered list of
dimensions with distinct names; `LayoutRules` map tensor-dimension names to
mesh-dimension names; a `TensorLayout` says, for one tensor on one mesh, which
mesh axis each tensor axis is split over. All are immutable values that hold
no TensorFlow objects and no devices: every change returns a new object.
"""

import collections
import numbers
import re

from mesh_tensorflow import errors

_ANONYMOUS_PREFIX = "_anonymous_"


class Dimension(collections.namedtuple("Dimension", ["name", "size"])):
  """A named tensor or mesh dimension, e.g. `Dimension("batch", 512)`.

  Dimensions compare by value; layout rules refer to them by name.
  """

  __slots__ = ()

  def __new__(cls, name, size):
    if not isinstance(name, str):
      raise errors.ShapeError(
          f"Dimension name must be a string, got {name!r} of type "
          f"{type(name).__name__}.")
    if not name:
      raise errors.ShapeError("Dimension name must not be empty.")
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
      raise errors.ShapeError(
          f"Dimension {name!r} must have an integer size, got {size!r} of "
          f"type {type(size).__name__}.")
    size = int(size)
    if size < 0:
      raise errors.ShapeError(
          f"Dimension {name!r} must have a non-negative size, got {size}.")
    return super().__new__(cls, name, size)

  def __repr__(self):
    return f"Dimension(name={self.name!r}, size={self.size})"


def convert_to_dimension(d):
  """Converts a Dimension, a (name, size) pair or None to a Dimension.

  Raises:
    TypeError: `d` is not a pair at all (e.g. an int), as in the original.
    ShapeError: `d` is a sequence but not a valid (name, size) pair.
  """
  if d is None or isinstance(d, Dimension):
    return d
  try:
    name, size = d
  except TypeError:
    raise TypeError(
        f"Cannot convert {d!r} to a Dimension: expected a Dimension or a "
        "(name, size) pair.") from None
  except ValueError:
    raise errors.ShapeError(
        f"Cannot convert {d!r} to a Dimension: expected a Dimension or a "
        "(name, size) pair.") from None
  return Dimension(name, size)


def _parse_string_to_list_of_pairs(s, seconds_to_int=False):
  """Parses "a:4,b:8" (also ';', '.' or whitespace separated) into pairs."""
  pairs = []
  for item in re.split(r"[,;.\s]+", s.strip()):
    if not item:
      continue
    parts = item.split(":")
    if len(parts) != 2 or not parts[0] or not parts[1]:
      raise errors.ShapeError(
          f"Cannot parse {item!r} in {s!r}: expected 'name:value' pairs "
          "separated by ',' or ';'.")
    name, value = parts
    if seconds_to_int:
      try:
        value = int(value)
      except ValueError:
        raise errors.ShapeError(
            f"Cannot parse {item!r} in {s!r}: the size {value!r} is not an "
            "integer.") from None
    pairs.append((name, value))
  return pairs


class _Immutable:
  """Refuses attribute assignment after construction."""

  __slots__ = ()

  def __setattr__(self, name, value):
    raise AttributeError(f"{type(self).__name__} is immutable; build a new "
                         "one instead.")

  def _init_field(self, name, value):
    object.__setattr__(self, name, value)


class Shape(_Immutable):
  """An ordered list of dimensions, none of them repeated.

  As in the original, only a repeated dimension (same name and size) is
  refused; two dimensions of one name and different sizes make a valid
  Shape, though operations that look dimensions up by name see the first.

  Example:
    >>> s = Shape([Dimension("batch", 4), Dimension("d", 8)])
    >>> s.size, s.dimension_names
    (32, ['batch', 'd'])
  """

  __slots__ = ("_dims",)

  def __init__(self, dims):
    dims = tuple(convert_to_dimension(d) for d in dims)
    if len(set(dims)) != len(dims):
      duplicates = sorted({d.name for d in dims if dims.count(d) > 1})
      raise errors.ShapeError(
          f"Shape {list(dims)} has duplicate dimension names {duplicates} "
          "(the same dimension twice); every dimension of a shape needs its "
          "own name (rename one, e.g. with mtf.rename_dimension).")
    self._init_field("_dims", dims)

  @property
  def dims(self):
    return list(self._dims)

  @property
  def ndims(self):
    return len(self._dims)

  def __len__(self):
    return len(self._dims)

  def __getitem__(self, key):
    return self._dims[key]

  def __iter__(self):
    return iter(self._dims)

  def __eq__(self, other):
    if isinstance(other, Shape):
      return self._dims == other._dims
    try:
      return self._dims == convert_to_shape(other)._dims
    except (errors.ShapeError, TypeError):
      return NotImplemented

  def __ne__(self, other):
    result = self.__eq__(other)
    return result if result is NotImplemented else not result

  def __hash__(self):
    return hash(self._dims)

  def __add__(self, other):
    """Appends a Dimension, a Shape or a list of dimensions."""
    if isinstance(other, Dimension):
      return Shape(self._dims + (other,))
    return Shape(self._dims + tuple(_shape_to_add(other, self)._dims))

  def __radd__(self, other):
    return _shape_to_add(other, self) + self

  def __sub__(self, other):
    """Removes dimensions.

    A single Dimension must be present; dimensions in a list or Shape that are
    absent are ignored; `- None` removes nothing.
    """
    if other is None:
      return self
    if isinstance(other, Dimension):
      if other not in self._dims:
        raise errors.ShapeError(
            f"Cannot remove {other} from {self}: it is not a dimension of "
            "the shape.")
      return Shape([d for d in self._dims if d != other])
    removed = set(convert_to_shape(other)._dims)
    return Shape([d for d in self._dims if d not in removed])

  def __repr__(self):
    return self.to_string

  @property
  def to_string(self):
    return "Shape[{}]".format(", ".join(f"{d.name}={d.size}" for d in self))

  @property
  def to_integer_list(self):
    """The sizes of the dimensions, in order (a property, as in the
    original)."""
    return [d.size for d in self._dims]

  @property
  def size(self):
    result = 1
    for d in self._dims:
      result *= d.size
    return result

  @property
  def cumprod(self):
    """Exclusive cumulative product of sizes: the stride of each dimension
    counted from the outermost one (used to match positions in reshapes)."""
    result = []
    product = 1
    for d in self._dims:
      result.append(product)
      product *= d.size
    return result

  def cumprod_to_tensor_axis(self, cumprod):
    """Returns the axis whose exclusive cumulative product is `cumprod`."""
    try:
      return self.cumprod.index(cumprod)
    except ValueError:
      return None

  @property
  def dimension_names(self):
    return [d.name for d in self._dims]

  def index(self, dim):
    """The position of a Dimension (or of a dimension name) in the shape."""
    name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
    for i, d in enumerate(self._dims):
      if d.name == name:
        if not isinstance(dim, str) and d != dim:
          raise errors.ShapeError(
              f"{dim} has the name of {d} in {self} but a different size.")
        return i
    raise errors.ShapeError(f"{dim!r} is not a dimension of {self}.")

  def __contains__(self, dim):
    if isinstance(dim, str):
      return dim in self.dimension_names
    return dim in self._dims

  def rename_dimension(self, old_name, new_name):
    if old_name not in self.dimension_names:
      raise errors.ShapeError(
          f"Cannot rename {old_name!r}: it is not a dimension of {self}.")
    return Shape([Dimension(new_name, d.size) if d.name == old_name else d
                  for d in self._dims])

  def resize_dimension(self, name, new_size):
    if name not in self.dimension_names:
      raise errors.ShapeError(
          f"Cannot resize {name!r}: it is not a dimension of {self}.")
    return Shape([Dimension(name, new_size) if d.name == name else d
                  for d in self._dims])

  def get_dim_by_name(self, name):
    for d in self._dims:
      if d.name == name:
        return d
    raise errors.ShapeError(f"{name!r} is not a dimension of {self}.")

  def has_dim_name(self, name):
    return name in self.dimension_names


def convert_to_shape(x):
  """Converts a Shape, a list of dimensions/pairs, or "a:4,b:8" to a Shape.

  None converts to None.
  """
  if x is None or isinstance(x, Shape):
    return x
  if isinstance(x, str):
    x = _parse_string_to_list_of_pairs(x, seconds_to_int=True)
  if isinstance(x, Dimension):
    return Shape([x])
  try:
    items = list(x)
  except TypeError:
    raise errors.ShapeError(
        f"Cannot convert {x!r} to a Shape: expected a Shape, a list of "
        "Dimensions or (name, size) pairs, or a string like 'a:4,b:8'.") from None
  return Shape(items)


def _shape_to_add(other, shape):
  if other is None:
    raise TypeError(f"Cannot add None to {shape}: expected a Dimension, a "
                    "Shape or a list of dimensions.")
  return convert_to_shape(other)


def dimension_of(shape, dim, context):
  """The Dimension of `shape` named like `dim` (a Dimension or a name).

  Raises ShapeError, prefixed with `context`, if there is none or if a
  given Dimension's size differs.
  """
  name = dim.name if isinstance(dim, Dimension) else dim
  if not isinstance(name, str) or name not in shape.dimension_names:
    raise errors.ShapeError(
        f"{context}: {dim!r} is not a dimension of {shape}.")
  found = shape.get_dim_by_name(name)
  if isinstance(dim, Dimension) and dim.size != found.size:
    raise errors.ShapeError(
        f"{context}: {dim} has size {dim.size} but the tensor's dimension "
        f"{name!r} has size {found.size} ({shape}).")
  return found


def check_consistent_sizes(shapes, context):
  """Raises ShapeError if dimensions of one name have different sizes."""
  sizes = {}
  for shape in shapes:
    for d in shape:
      if sizes.setdefault(d.name, d.size) != d.size:
        raise errors.ShapeError(
            f"{context}: dimension {d.name!r} has size {sizes[d.name]} in one "
            f"operand and {d.size} in another; operand shapes are "
            f"{', '.join(map(str, shapes))}.")


def anonymous_dimension_name(name):
  """The name that hides `name` from layout rules (so it stays replicated)."""
  if name.startswith(_ANONYMOUS_PREFIX):
    return name
  return _ANONYMOUS_PREFIX + name


def anonymous_shape(shape):
  """A copy of `shape` whose dimension names match no layout rule."""
  shape = convert_to_shape(shape)
  return Shape([Dimension(anonymous_dimension_name(d.name), d.size)
                for d in shape])


def is_subsequence(short_seq, long_seq):
  """True if `short_seq` appears in order (not necessarily contiguous)."""
  it = iter(long_seq)
  return all(any(x == y for y in it) for x in short_seq)


def list_product(l):
  """The product of the integers in `l` (1 for an empty list)."""
  result = 1
  for v in l:
    result *= v
  return result


def verify_no_new_dims(input_shapes, output_shape):
  """Raises ShapeError if `output_shape` has a dimension no input has.

  Args:
    input_shapes: a list of Shapes.
    output_shape: a Shape.
  """
  known = set()
  for s in input_shapes:
    known.update(convert_to_shape(s).dims)
  output_shape = convert_to_shape(output_shape)
  new = [d for d in output_shape.dims if d not in known]
  if new:
    raise errors.ShapeError(
        f"Output shape {output_shape} has dimensions {new} that none of the "
        f"input shapes {[str(convert_to_shape(s)) for s in input_shapes]} "
        "has; no new dimensions are allowed here.")


def tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim):
  """In how many pieces `layout` splits `tensor_dim` on `mesh_shape` (1 if
  it is replicated).

  Lets graph-building code peek at the layout it will be lowered with.

  Args:
    layout: LayoutRules or anything convert_to_layout_rules accepts.
    mesh_shape: a Shape or anything convert_to_shape accepts.
    tensor_dim: a Dimension.
  """
  layout_rules = convert_to_layout_rules(layout)
  mesh_shape = convert_to_shape(mesh_shape)
  mesh_axis = layout_rules.tensor_dimension_to_mesh_axis(tensor_dim,
                                                         mesh_shape)
  return 1 if mesh_axis is None else mesh_shape.dims[mesh_axis].size


def tensor_dim_to_size_per_split(layout, mesh_shape, tensor_dim):
  """The size of each piece of `tensor_dim` under `layout` on `mesh_shape`
  (ceil(size / pieces), padding included, when the rules allow uneven
  splits).

  Raises:
    IndivisibleError: the mesh dimension does not divide `tensor_dim`, and
      the rules do not allow uneven splits.
  """
  tensor_dim = convert_to_dimension(tensor_dim)
  pieces = tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim)
  if convert_to_layout_rules(layout).allow_uneven:
    return -(-tensor_dim.size // pieces)
  if tensor_dim.size % pieces:
    raise errors.IndivisibleError(
        f"Tensor dimension {tensor_dim.name!r} (size {tensor_dim.size}) does "
        f"not divide evenly into the {pieces} pieces of its mesh dimension "
        f"under layout {convert_to_layout_rules(layout)} on mesh "
        f"{convert_to_shape(mesh_shape)} (LayoutRules(..., "
        "allow_uneven=True) would pad it).")
  return tensor_dim.size // pieces


class LayoutRules(_Immutable):
  """Ordered (tensor-dimension name, mesh-dimension name) pairs.

  A tensor dimension named by a rule is split evenly over that mesh dimension;
  every other tensor dimension is replicated. Several tensor dimensions may
  share a mesh dimension (`d_ff:model, heads:model`) as long as no tensor has
  two of them.

  Example: on the mesh "rows:2;cols:4", the rules "batch:rows;hidden:cols"
  give a tensor [batch=8, hidden=16, io=3] slices [4, 4, 3]; processor
  (row r, col c) holds batch block r and hidden block c.

  Uneven splits: by default a split dimension must be a multiple of its
  mesh dimension (else lowering raises IndivisibleError). With
  `allow_uneven=True` any size may be split: a dimension of size n over a
  mesh dimension of size k is padded to ceil(n/k)*k and every processor
  holds ceil(n/k) of it, the last ones partly (or wholly) padding. The
  padding is kept zero and masked wherever it could change a result, so
  the answer is the same as on one processor; it costs the padding's
  memory and compute (see `padding_report`). E.g. a vocabulary of 259 over
  "model:4" is held as 4 slices of 65, the last with one padded row.

  `replicated_names` (keyword only) names tensor dimensions kept
  replicated whatever the pairs or a shard name ("d_ff@batch") say.
  """

  __slots__ = ("_pairs", "_allow_uneven", "_replicated_names")

  def __init__(self, pairs, allow_uneven=False, *, replicated_names=()):
    checked = []
    for pair in pairs:
      if (not isinstance(pair, (tuple, list)) or len(pair) != 2 or
          not all(isinstance(p, str) and p for p in pair)):
        raise errors.LayoutError(
            f"Layout rule {pair!r} is not a (tensor dimension name, mesh "
            "dimension name) pair of strings.")
      pair = (pair[0], pair[1])
      if pair not in checked:
        checked.append(pair)
    by_tensor_dim = collections.defaultdict(list)
    for tensor_dim, mesh_dim in checked:
      by_tensor_dim[tensor_dim].append(mesh_dim)
    for tensor_dim, mesh_dims in by_tensor_dim.items():
      if len(mesh_dims) > 1:
        raise errors.LayoutError(
            f"Layout rules map tensor dimension {tensor_dim!r} to several "
            f"mesh dimensions {mesh_dims}; a tensor dimension can be split "
            "over at most one mesh dimension.")
    self._init_field("_pairs", tuple(checked))
    if not isinstance(allow_uneven, bool):
      raise errors.LayoutError(
          f"LayoutRules(allow_uneven={allow_uneven!r}): expected True or "
          "False.")
    self._init_field("_allow_uneven", allow_uneven)
    self._init_field("_replicated_names", frozenset(replicated_names))

  @property
  def allow_uneven(self):
    """Whether a dimension may be split over a mesh dimension that does not
    divide its size (padded to the next multiple; see the class doc)."""
    return self._allow_uneven

  def with_uneven(self, allow_uneven=True):
    """These rules, with uneven splits allowed (or not)."""
    return LayoutRules(self._pairs, allow_uneven=allow_uneven,
                       replicated_names=self._replicated_names)

  def without(self, names):
    """These rules with the tensor dimensions named in `names` replicated,
    shard dimensions ("d_ff@batch") included."""
    return LayoutRules([(t, m) for t, m in self._pairs if t not in names],
                       allow_uneven=self._allow_uneven,
                       replicated_names=self._replicated_names | set(names))

  @classmethod
  def replicated(cls):
    """Rules that split nothing."""
    return cls([])

  @classmethod
  def data_parallel(cls, batch_dim_name, mesh_dim_name):
    """Rules that split only the batch dimension."""
    return cls([(batch_dim_name, mesh_dim_name)])

  @property
  def pairs(self):
    return list(self._pairs)

  def __iter__(self):
    return iter(self._pairs)

  def __len__(self):
    return len(self._pairs)

  def __eq__(self, other):
    return (isinstance(other, LayoutRules) and
            set(self._pairs) == set(other._pairs) and
            self._allow_uneven == other._allow_uneven and
            self._replicated_names == other._replicated_names)

  def __hash__(self):
    return hash((frozenset(self._pairs), self._allow_uneven,
                 self._replicated_names))

  def __repr__(self):
    if self._allow_uneven:
      return f"LayoutRules({self.to_string!r}, allow_uneven=True)"
    return "LayoutRules({!r})".format(self.to_string)

  @property
  def to_string(self):
    """The rules as convert_to_layout_rules reads them: "batch:b;d_ff:m"."""
    return ";".join(f"{t}:{m}" for t, m in self._pairs)

  def mesh_dimension_names(self):
    return sorted({m for _, m in self._pairs})

  def mesh_dimension_for(self, tensor_dim_name):
    """The mesh dimension name a tensor dimension name maps to, or None.

    A rule naming the tensor dimension wins. Failing that, a name of the
    form "<name>@<mesh dimension>" (a shard dimension, see
    `shard_dimension_name`) says its own mesh dimension: that is how
    weight-update and parameter sharding (`mtf.shard_data_parallel`) split
    a variable's dimension over the data-parallel mesh dimension without
    new rules.
    """
    for t, m in self._pairs:
      if t == tensor_dim_name:
        return m
    if tensor_dim_name in self._replicated_names:
      return None
    _, mesh_dim = split_shard_dimension_name(tensor_dim_name)
    return mesh_dim

  def tensor_dimension_to_mesh_axis(self, tensor_dimension, mesh_shape):
    """The index in `mesh_shape` that `tensor_dimension` is split over.

    Returns None for a replicated dimension, or when the rule names a mesh
    dimension the mesh does not have: such a rule is ignored, as in the
    original (mesh implementations log it once when built).
    """
    mesh_dim_name = self.mesh_dimension_for(
        convert_to_dimension(tensor_dimension).name)
    if mesh_dim_name is None:
      return None
    mesh_shape = convert_to_shape(mesh_shape)
    for i, d in enumerate(mesh_shape):
      if d.name == mesh_dim_name:
        return i
    return None

  def tensor_layout(self, tensor_shape, mesh_shape):
    """The TensorLayout of `tensor_shape` on `mesh_shape`.

    Raises:
      LayoutError: two dimensions of the tensor map to one mesh dimension.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    mesh_shape = convert_to_shape(mesh_shape)
    axes = [self.tensor_dimension_to_mesh_axis(d, mesh_shape)
            for d in tensor_shape]
    seen = {}
    for d, axis in zip(tensor_shape, axes):
      if axis is None:
        continue
      if axis in seen:
        mesh_dim = mesh_shape[axis]
        raise errors.LayoutError(
            f"Tensor dimensions {seen[axis].name!r} and {d.name!r} of "
            f"{tensor_shape} are both laid out over mesh dimension "
            f"{mesh_dim.name!r} (size {mesh_dim.size}); a tensor can use each "
            "mesh dimension at most once. Change the layout rules so that "
            "one of them is replicated or uses another mesh dimension.")
      seen[axis] = d
    return TensorLayout(axes)

  def mesh_dimension_name_to_tensor_dimension_names(self, mesh_dimension_name):
    return [t for t, m in self._pairs if m == mesh_dimension_name]


SHARD_MARK = "@"


def shard_dimension_name(base_name, mesh_dim_name):
  """The name of tensor dimension `base_name` split over `mesh_dim_name`
  whatever the layout rules say: "d_ff@batch"."""
  return f"{base_name}{SHARD_MARK}{mesh_dim_name}"


def split_shard_dimension_name(name):
  """(base name, mesh dimension name or None): "d_ff@batch" gives
  ("d_ff", "batch"); a plain name gives (name, None)."""
  base, mark, mesh_dim = name.rpartition(SHARD_MARK)
  if not mark or not base or not mesh_dim:
    return name, None
  return base, mesh_dim


def convert_to_layout_rules(x):
  """Converts LayoutRules, "batch:rows;hidden:cols" or pairs to LayoutRules."""
  if isinstance(x, LayoutRules):
    return x
  if x is None:
    return LayoutRules([])
  if isinstance(x, str):
    x = _parse_string_to_list_of_pairs(x)
  return LayoutRules(list(x))


class TensorLayout(_Immutable):
  """For each tensor axis, the mesh axis it is split over, or None."""

  __slots__ = ("_tensor_axis_to_mesh_axis",)

  def __init__(self, tensor_axis_to_mesh_axis):
    self._init_field("_tensor_axis_to_mesh_axis",
                     tuple(tensor_axis_to_mesh_axis))

  def __eq__(self, other):
    if isinstance(other, TensorLayout):
      other = other._tensor_axis_to_mesh_axis
    return self._tensor_axis_to_mesh_axis == tuple(other)

  def __hash__(self):
    return hash(self._tensor_axis_to_mesh_axis)

  def __repr__(self):
    return f"TensorLayout{self._tensor_axis_to_mesh_axis}"

  def __len__(self):
    return len(self._tensor_axis_to_mesh_axis)

  def __getitem__(self, key):
    return self._tensor_axis_to_mesh_axis[key]

  def __iter__(self):
    return iter(self._tensor_axis_to_mesh_axis)

  @property
  def tensor_axis_to_mesh_axis(self):
    return self._tensor_axis_to_mesh_axis

  @property
  def is_fully_replicated(self):
    return all(a is None for a in self._tensor_axis_to_mesh_axis)

  def mesh_axis_to_tensor_axis(self, mesh_ndims):
    """For each of the first `mesh_ndims` mesh axes, the tensor axis split
    over it, or None (mesh axes from `mesh_ndims` on are not reported)."""
    axes = self._tensor_axis_to_mesh_axis
    return tuple(axes.index(m) if m in axes else None
                 for m in range(mesh_ndims))
