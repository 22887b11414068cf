"""Placing a logical mesh on the physical cores of a TPU slice.

A TPU slice is a grid of chips with a few cores on each chip. We describe it
by a *physical shape* whose last axis counts the cores on one chip and whose
other axes are the chip grid, e.g. `[4, 4, 2]` is 16 chips in a 4x4 grid with
2 cores each. Cores on the same chip, and cores on chips one link apart, are
*physical neighbours*. The topology proto of a TPU gives a 4-D
`[x, y, z, cores]` shape; `physical_shape_3d_from_topology_proto_4d` turns it
into the 3-D `[y*z, x, cores]` shape in which physical processor numbers are
counted.

A *logical-to-physical* mapping is a permutation: entry `i` is the physical
processor number (row-major over the physical shape) of logical processor `i`
(row-major over the logical mesh shape). Collectives along a logical mesh
dimension are fastest when consecutive processors along it are physical
neighbours that close into a ring, so the mappings here tile the chip grid:
the last logical mesh dimension gets a compact tile walked as a ring, and each
earlier dimension steps between tiles (strided), again in ring order.

Example on `physical_shape=[2, 2, 2]` (4 chips, 2 cores each) and logical
mesh `[2, 4]` (`batch:2;model:4`): each `model` group of 4 is two neighbouring
chips with both their cores, walked chip (0, 0) core 0, core 1, chip (0, 1)
core 0, core 1; the two `batch` rows use the two halves of the chip grid.

Everything here is pure Python: no TensorFlow and no devices.
"""

import itertools
import numbers

from mesh_tensorflow.backend import processors
from mesh_tensorflow import shape as shape_lib


def _check_shape(arg_name, shape, allow_empty=True):
  """Returns `shape` as a list of positive ints, or raises naming `arg_name`."""
  if isinstance(shape, shape_lib.Shape):
    return shape.to_integer_list
  if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
    raise ValueError(
        f"{arg_name} must be a list of positive integers, got {shape!r}.")
  shape = list(shape)
  for size in shape:
    if (isinstance(size, bool) or not isinstance(size, numbers.Integral)
        or size < 1):
      raise ValueError(
          f"{arg_name} must be a list of positive integers, got {shape!r} "
          f"(bad entry {size!r}).")
  if not shape and not allow_empty:
    raise ValueError(f"{arg_name} must not be empty.")
  return [int(size) for size in shape]


# ---------------------------------------------------------------------------
# Orderings of a grid.
# ---------------------------------------------------------------------------


def _snake(shape):
  """Boustrophedon order of a grid: consecutive entries are grid neighbours.

  A Hamiltonian path that exists for every grid; it is not closed.
  """
  if not shape:
    return [()]
  inner = _snake(shape[1:])
  order = []
  for i in range(shape[0]):
    for coordinate in inner if i % 2 == 0 else reversed(inner):
      order.append((i,) + coordinate)
  return order


def _has_grid_cycle(shape):
  """Whether a grid has a closed walk through every point once (a ring).

  A grid with more than two points has one exactly when it has an even
  number of points and at least two axes longer than 1.
  """
  nontrivial = [s for s in shape if s > 1]
  size = shape_lib.list_product(shape)
  return size <= 2 or (size % 2 == 0 and len(nontrivial) >= 2)


def _ring_2d_even_rows(m, n):
  """Ring over an m x n grid with m even and n >= 2, starting at (0, 0).

      (0,0)-(0,1)-(0,2)
        |           |
      (1,0) (1,1)-(1,2)
        |     |
      (2,0) (2,1)-(2,2)
        |           |
      (3,0)-(3,1)-(3,2)

  Rows are walked in pairs, out along row 2k and back along row 2k+1 (leaving
  column 0 free), and column 0 takes the ring home.
  """
  order = [(0, 0)]
  for i in range(0, m, 2):
    order.extend((i, j) for j in range(1, n))
    order.extend((i + 1, j) for j in range(n - 1, 0, -1))
  order.extend((i, 0) for i in range(m - 1, 0, -1))
  return order


def _grid_ring(shape):
  """Orders all points of an n-D grid, as a ring when the grid has one.

  Consecutive entries always differ by 1 along one axis; the last entry is a
  neighbour of the first whenever `_has_grid_cycle(shape)`. Otherwise the
  order is a snake (a path).
  """
  shape = list(shape)
  nontrivial = [axis for axis, size in enumerate(shape) if size > 1]
  if len(nontrivial) < 2 or shape_lib.list_product(shape) % 2:
    return _snake(shape)
  # A 2-D ring over (one even axis) x (a snake through all other axes): steps
  # along the snake are grid steps, so the 2-D ring stays a ring in n-D.
  even_axis = next(axis for axis in nontrivial if shape[axis] % 2 == 0)
  other_axes = [axis for axis in nontrivial if axis != even_axis]
  path = _snake([shape[axis] for axis in other_axes])
  order = []
  for i, j in _ring_2d_even_rows(shape[even_axis], len(path)):
    coordinate = [0] * len(shape)
    coordinate[even_axis] = i
    for axis, c in zip(other_axes, path[j]):
      coordinate[axis] = c
    order.append(tuple(coordinate))
  return order


def _ring_2d(m, n):
  """Ring order of an m x n grid, as a list of (i, j) pairs.

  Consecutive pairs are grid neighbours. If m * n is even and m, n > 1 the
  last pair is a neighbour of the first, so the order is a ring; for m even
  it is the original library's ring (rows walked in pairs, column 0 back).
  When m is odd and n even the ring runs the other way round; when both are
  odd no ring exists and the order is a snake. (The original returned a
  column-major order, whose consecutive entries need not be neighbours, for
  every odd m.)

  Args:
    m: number of rows, a positive integer.
    n: number of columns, a positive integer.

  Returns:
    A list of the m * n pairs (i, j).
  """
  m, n = _check_shape("(m, n)", [m, n])
  return _grid_ring([m, n])


ring_order_2d = _ring_2d


def _ring_quality(shape):
  """How well `ring_order(shape)` rings: 2 best, 1 ring, 0 only a path."""
  if _has_grid_cycle(shape[:-1]):
    return 2
  return 1 if shape and shape[-1] > 1 else 0


def ring_order(physical_shape):
  """Orders the cores of a chip grid so consecutive cores are neighbours.

  The last axis of `physical_shape` counts cores on a chip; the others are
  the chip grid. Consecutive entries are physical neighbours (same chip or
  adjacent chips), and so are the last and the first whenever a ring exists:
  when the chip grid has a ring, or has at most two chips, all cores of a
  chip come together and the chips are walked as a ring (each link is used
  once); otherwise, with two or more cores per chip, the order runs out along
  a snake of chips on core 0 and back on the other cores. Only a chip grid
  with one core per chip and no ring (a line longer than 2 chips, or an odd
  number of chips) gets a path that is not closed.

  Args:
    physical_shape: a list of positive integers.

  Returns:
    A list of coordinate tuples, one per core.
  """
  physical_shape = _check_shape("physical_shape", physical_shape)
  if not physical_shape:
    return [()]
  chips, cores = physical_shape[:-1], physical_shape[-1]
  if cores == 1 or _has_grid_cycle(chips):
    return [chip + (core,) for chip in _grid_ring(chips)
            for core in range(cores)]
  path = _snake(chips)
  return ([chip + (0,) for chip in path] +
          [chip + (core,) for chip in reversed(path)
           for core in range(1, cores)])


# ---------------------------------------------------------------------------
# Strided sub-spaces and hierarchical tilings.
# ---------------------------------------------------------------------------


def _logical_1d_to_physical_subspace_auto(sizes_and_strides, physical_shape):
  """Maps a 1-D logical mesh onto a strided sub-space of the physical mesh.

  The sub-space contains the origin and has, along physical axis `a`, the
  coordinates `0, stride_a, ..., (size_a - 1) * stride_a`. Its points are
  visited in `ring_order(sizes)`, so consecutive logical processors are one
  step apart in the sub-space (physical neighbours when all strides are 1).

  Example: `sizes_and_strides=[(2, 1), (2, 2), (1, 1)]` on `[2, 4, 2]` gives
  `[(0, 0, 0), (0, 2, 0), (1, 2, 0), (1, 0, 0)]`.

  Args:
    sizes_and_strides: a list of (size, stride) pairs, one per physical axis.
    physical_shape: a list of positive integers.

  Returns:
    A list of physical coordinate tuples, one per logical processor.

  Raises:
    ValueError: if the sub-space does not fit in `physical_shape`.
  """
  physical_shape = _check_shape("physical_shape", physical_shape)
  pairs = [tuple(p) for p in sizes_and_strides]
  if len(pairs) != len(physical_shape) or any(len(p) != 2 for p in pairs):
    raise ValueError(
        f"sizes_and_strides must hold one (size, stride) pair per axis of "
        f"physical_shape={physical_shape}, got {sizes_and_strides!r}.")
  sizes = _check_shape("sizes in sizes_and_strides", [p[0] for p in pairs])
  strides = _check_shape("strides in sizes_and_strides", [p[1] for p in pairs])
  for axis, (size, stride, bound) in enumerate(
      zip(sizes, strides, physical_shape)):
    if (size - 1) * stride >= bound:
      raise ValueError(
          f"sizes_and_strides={sizes_and_strides!r} leaves physical axis "
          f"{axis} (size {bound}): {size} points with stride {stride} reach "
          f"coordinate {(size - 1) * stride}.")
  return [tuple(c * s for c, s in zip(coordinate, strides))
          for coordinate in ring_order(sizes)]


def _logical_to_physical_v1(sizes_and_strides, physical_shape,
                            fn_1d=_logical_1d_to_physical_subspace_auto):
  """Maps an m-D logical mesh onto an n-D physical mesh.

  Logical dimension `d` goes onto the strided sub-space
  `sizes_and_strides[d]` (see `_logical_1d_to_physical_subspace_auto`); a
  logical processor sits at the sum of the points its coordinates pick in
  each sub-space. The sub-spaces must together cover the physical mesh
  exactly once, which is checked.

  Args:
    sizes_and_strides: a list, per logical dimension, of a list of
      (size, stride) pairs, one per physical axis.
    physical_shape: a list of positive integers.
    fn_1d: maps one logical dimension onto its sub-space.

  Returns:
    A list of physical coordinate tuples, one per logical processor in
    row-major order of the logical mesh.

  Raises:
    ValueError: if the result is not a permutation of the physical mesh.
  """
  physical_shape = _check_shape("physical_shape", physical_shape)
  pieces = [fn_1d(x, physical_shape) for x in sizes_and_strides]
  origin = (0,) * len(physical_shape)
  coordinates = []
  # itertools.product varies the last piece fastest: row-major logical order.
  for points in itertools.product(*pieces):
    coordinates.append(tuple(sum(c) for c in zip(origin, *points)))
  num_physical = shape_lib.list_product(physical_shape)
  out_of_range = [c for c in coordinates
                  if any(x >= s for x, s in zip(c, physical_shape))]
  if (len(coordinates) != num_physical or out_of_range
      or len(set(coordinates)) != len(coordinates)):
    raise ValueError(
        f"sizes_and_strides={sizes_and_strides!r} does not map the "
        f"{len(coordinates)} logical processors one-to-one onto the "
        f"{num_physical} processors of physical_shape={physical_shape}.")
  return coordinates


class HierarchicalTiling:
  """A logical mesh placed on the physical mesh as nested tiles.

  `spec` lists the logical mesh dimensions as (name, projected_shape) pairs.
  `projected_shape` has one entry per physical axis: how far the logical
  dimension extends along that axis. The last logical dimension gets a
  compact tile at the origin; each earlier dimension repeats the tile of all
  later ones, so it is strided by their extent. Along every physical axis the
  projected shapes must multiply to the physical size; one projected shape
  may be None and is then filled in.

  Example on `physical_shape=[4, 4, 2]`:
  `HierarchicalTiling([("batch", None), ("model", [2, 2, 2])], [4, 4, 2])`
  has mesh shape `batch:4;model:8`; each `model` group is a 2x2 block of
  chips with both cores, and `batch` walks the four blocks in a ring.
  """

  def __init__(self, spec, physical_shape):
    physical_shape = _check_shape("physical_shape", physical_shape)
    names, projected = _parse_spec(spec, len(physical_shape))
    if None in projected:
      index = projected.index(None)
      others = [p for p in projected if p is not None]
      filled = []
      for axis, size in enumerate(physical_shape):
        used = shape_lib.list_product(p[axis] for p in others)
        if size % used:
          raise ValueError(
              f"spec={spec!r} does not fit physical_shape={physical_shape}: "
              f"along physical axis {axis} (size {size}) the given projected "
              f"shapes multiply to {used}, which does not divide {size}.")
        filled.append(size // used)
      projected[index] = filled
    products = [shape_lib.list_product(p[axis] for p in projected)
                for axis in range(len(physical_shape))]
    if products != physical_shape:
      raise ValueError(
          f"spec={spec!r} does not fit physical_shape={physical_shape}: the "
          f"projected shapes multiply to {products} axis by axis; make them "
          f"multiply to {physical_shape} (or give None for one of them).")
    strides = [1] * len(physical_shape)
    sizes_and_strides = []
    for shape in reversed(projected):
      sizes_and_strides.append(list(zip(shape, strides)))
      strides = [s * x for s, x in zip(strides, shape)]
    sizes_and_strides.reverse()
    self._physical_shape = physical_shape
    self._projected_shapes = projected
    self._physical_coordinates = _logical_to_physical_v1(
        sizes_and_strides, physical_shape)
    self._logical_to_physical = [
        processors.processor_coordinates_to_pnum(physical_shape, list(c))
        for c in self._physical_coordinates]
    self._mesh_shape = shape_lib.Shape(
        [shape_lib.Dimension(name, shape_lib.list_product(shape))
         for name, shape in zip(names, projected)])

  @property
  def logical_to_physical(self):
    """Physical processor number of each logical processor."""
    return list(self._logical_to_physical)

  @property
  def physical_to_logical(self):
    """Logical processor number of each physical processor."""
    inverse = [0] * len(self._logical_to_physical)
    for logical, physical in enumerate(self._logical_to_physical):
      inverse[physical] = logical
    return inverse

  @property
  def physical_coordinates(self):
    """Physical coordinates of each logical processor."""
    return [list(c) for c in self._physical_coordinates]

  @property
  def physical_shape(self):
    return list(self._physical_shape)

  @property
  def projected_shapes(self):
    """The projected shape of each logical dimension, None filled in."""
    return [list(p) for p in self._projected_shapes]

  @property
  def mesh_shape(self):
    """The logical mesh shape, an `mtf.Shape`."""
    return self._mesh_shape

  @classmethod
  def spec_to_mesh_shape(cls, spec, num_processors):
    """The mesh shape of `spec`, before the physical shape is known.

    Args:
      spec: a list of (name, projected_shape or None) pairs.
      num_processors: the number of physical processors.

    Returns:
      An `mtf.Shape`.

    Raises:
      ValueError: if `spec` cannot cover exactly `num_processors`.
    """
    (num_processors,) = _check_shape("num_processors", [num_processors])
    names, projected = _parse_spec(spec, None)
    sizes = [None if p is None else shape_lib.list_product(p)
             for p in projected]
    known = shape_lib.list_product(s for s in sizes if s is not None)
    if None in sizes:
      if num_processors % known:
        raise ValueError(
            f"spec={spec!r} cannot cover num_processors={num_processors}: "
            f"the given projected shapes hold {known} processors, which "
            f"does not divide {num_processors}.")
      sizes[sizes.index(None)] = num_processors // known
    elif known != num_processors:
      raise ValueError(
          f"spec={spec!r} covers {known} processors, not "
          f"num_processors={num_processors}.")
    return shape_lib.Shape(
        [shape_lib.Dimension(name, size) for name, size in zip(names, sizes)])


def _parse_spec(spec, physical_ndims):
  """Splits a HierarchicalTiling spec into names and projected shapes."""
  if isinstance(spec, (str, bytes)) or not hasattr(spec, "__iter__"):
    raise ValueError(
        f"spec must be a list of (name, projected_shape) pairs, got {spec!r}.")
  names, projected = [], []
  for entry in spec:
    if not isinstance(entry, (list, tuple)) or len(entry) != 2:
      raise ValueError(
          f"spec must be a list of (name, projected_shape) pairs; entry "
          f"{entry!r} of spec={spec!r} is not a pair.")
    name, shape = entry
    if not isinstance(name, str) or not name:
      raise ValueError(
          f"spec entry {entry!r} needs a non-empty string name.")
    if shape is not None:
      shape = _check_shape(f"projected shape of {name!r} in spec", shape)
      if physical_ndims is not None and len(shape) != physical_ndims:
        raise ValueError(
            f"spec entry {entry!r}: the projected shape needs one entry per "
            f"physical axis ({physical_ndims}), got {len(shape)}.")
    names.append(name)
    projected.append(shape)
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"spec={spec!r} repeats the names {duplicates}.")
  if projected.count(None) > 1:
    raise ValueError(
        f"spec={spec!r} leaves {projected.count(None)} projected shapes as "
        "None; at most one can be filled in.")
  return names, projected


# ---------------------------------------------------------------------------
# Automatic placement.
# ---------------------------------------------------------------------------


def physical_shape_3d_from_topology_proto_4d(mesh_shape):
  """Turns a TPU topology's `[x, y, z, cores]` into `[y * z, x, cores]`.

  Physical processor numbers used with this library count row-major over the
  3-D shape. For z > 1 the first axis merges (y, z) as `z * y_size + y`.

  Args:
    mesh_shape: a list of 4 positive integers.

  Returns:
    A list of 3 integers.

  Raises:
    ValueError: if `mesh_shape` is not 4 positive integers.
  """
  mesh_shape = _check_shape("mesh_shape", mesh_shape)
  if len(mesh_shape) != 4:
    raise ValueError(
        f"mesh_shape must be a 4-D TPU topology shape [x, y, z, cores], got "
        f"{mesh_shape}.")
  x, y, z, cores = mesh_shape
  return [y * z, x, cores]


def topology_coordinates(mesh_shape):
  """The TPU topology coordinates `[x, y, z, core]` of each physical
  processor number, for a topology of shape `[x, y, z, cores]`.

  Entry p is the core that this library (and `auto_logical_to_physical_tpu`)
  calls physical processor p: row-major over
  `physical_shape_3d_from_topology_proto_4d(mesh_shape)`. Building a
  `tf.tpu.experimental.DeviceAssignment` whose replica p runs on entry p
  makes TPU replica ids and physical processor numbers the same, whatever
  order TensorFlow would pick by default.

  Args:
    mesh_shape: a TPU topology's `mesh_shape` (4 positive integers).

  Returns:
    A list of `[x, y, z, core]` lists, one per core.
  """
  rows, x_size, cores = physical_shape_3d_from_topology_proto_4d(mesh_shape)
  y_size = mesh_shape[1]
  coordinates = []
  for row in range(rows):
    z, y = divmod(row, y_size)
    for x in range(x_size):
      for core in range(cores):
        coordinates.append([x, y, z, core])
  return coordinates


def _divisors(n):
  return [d for d in range(1, n + 1) if n % d == 0]


def _tiles(size, remaining):
  """All tiles (one factor per axis, each dividing `remaining`) of `size`."""
  if not remaining:
    return [()] if size == 1 else []
  tiles = []
  for d in _divisors(remaining[0]):
    if size % d == 0:
      tiles.extend((d,) + rest for rest in _tiles(size // d, remaining[1:]))
  return tiles


def _tile_score(tile, remaining):
  """Higher is better: ring first, then cores on a chip, then compactness."""
  chips = tile[:-1]
  outer = [r // t for r, t in zip(remaining, tile)]
  return (_ring_quality(list(tile)),
          tile[-1],
          -sum(t - 1 for t in chips),
          -max(chips, default=1),
          _ring_quality(outer),
          -sum(o - 1 for o in outer[:-1]))


def _auto_sizes_and_strides(logical_shape, physical_shape):
  """Chooses nested tiles, the last logical dimension innermost.

  Each logical dimension takes the best-scoring tile of what the later ones
  left. Such a tile always exists: for every prime the exponents still free
  along the physical axes add up to those the remaining logical dimensions
  need, so any choice leaves the rest solvable.
  """
  remaining = list(physical_shape)
  strides = [1] * len(physical_shape)
  sizes_and_strides = []
  for size in reversed(logical_shape):
    tile = max(_tiles(size, remaining), key=lambda t: _tile_score(t, remaining))
    sizes_and_strides.append(list(zip(tile, strides)))
    strides = [s * t for s, t in zip(strides, tile)]
    remaining = [r // t for r, t in zip(remaining, tile)]
  sizes_and_strides.reverse()
  return sizes_and_strides


def auto_logical_to_physical_tpu(logical_shape, physical_shape,
                                 return_coordinates=False):
  """A logical-to-physical mapping that makes collectives fast on a TPU.

  Later logical mesh dimensions get priority: the last one is placed on a
  compact tile of the chip grid (all cores of a chip together) walked as a
  ring of physical neighbours whenever the tile allows one, and each earlier
  dimension walks the tiles of the later ones, again in ring order. Works for
  any physical shape and any logical shape with the same number of
  processors; where no ring exists (e.g. an odd number of single-core chips)
  the order is a path of neighbours.

  Example: `auto_logical_to_physical_tpu([4, 8], [4, 4, 2])` puts each group
  of 8 on a 2x2 block of chips and the 4 groups on the 4 blocks.

  Args:
    logical_shape: a list of positive integers (or an `mtf.Shape`).
    physical_shape: a list of positive integers: `[x, y, cores]`-style with
      cores last, or a 4-D TPU topology shape `[x, y, z, cores]`, which is
      placed on its real 3-D chip grid and numbered in the
      `physical_shape_3d_from_topology_proto_4d` shape.
    return_coordinates: if True, return physical coordinates (in the 3-D
      shape for a 4-D `physical_shape`) instead of processor numbers.

  Returns:
    A permutation of `range(num_processors)` (entry `i` is the physical
    processor of logical processor `i`), or a list of coordinate lists.

  Raises:
    ValueError: if a shape is malformed or the two shapes hold different
      numbers of processors.
  """
  logical_shape = _check_shape("logical_shape", logical_shape)
  physical_shape = _check_shape("physical_shape", physical_shape,
                                allow_empty=False)
  num_logical = shape_lib.list_product(logical_shape)
  num_physical = shape_lib.list_product(physical_shape)
  if num_logical != num_physical:
    raise ValueError(
        f"logical_shape={logical_shape} has {num_logical} processors but "
        f"physical_shape={physical_shape} has {num_physical}; they must "
        "match.")
  if len(physical_shape) == 4:
    output_shape = physical_shape_3d_from_topology_proto_4d(physical_shape)
    x_size, y_size, z_size, cores = physical_shape
    # Place on the real chip grid, with axes ordered (z, y, x) so that for
    # z == 1 the result is the same as on the 3-D shape [y, x, cores].
    grid = [z_size, y_size, x_size, cores]

    def to_output(coordinate):
      z, y, x, core = coordinate
      return [z * y_size + y, x, core]
  else:
    output_shape = grid = physical_shape

    def to_output(coordinate):
      return list(coordinate)

  coordinates = [
      to_output(c) for c in _logical_to_physical_v1(
          _auto_sizes_and_strides(logical_shape, grid), grid)]
  if return_coordinates:
    return coordinates
  return [processors.processor_coordinates_to_pnum(output_shape, c)
          for c in coordinates]
