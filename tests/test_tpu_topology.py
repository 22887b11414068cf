"""TPU topology helpers: rings, hierarchical tilings and automatic placement."""

import itertools

import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.backend import tpu_topology


def _neighbours(a, b):
  """Physical neighbours: distinct cores on one chip or on adjacent chips.

  Coordinates have the cores-per-chip axis last.
  """
  chip_distance = sum(abs(x - y) for x, y in zip(a[:-1], b[:-1]))
  return tuple(a) != tuple(b) and chip_distance <= 1


def _grid_neighbours(a, b):
  return sum(abs(x - y) for x, y in zip(a, b)) == 1


def _check_order(order, is_neighbour, closed):
  """Consecutive entries are neighbours; the last and first too if closed."""
  for a, b in zip(order, order[1:]):
    assert is_neighbour(a, b), (a, b, order)
  if closed and len(order) > 1:
    assert is_neighbour(order[-1], order[0]), order


def _factorisations(n, max_rank):
  """All ordered factorisations of n into at most max_rank factors > 1."""
  shapes = [[n]] if n > 1 else [[1]]
  if max_rank > 1:
    for d in range(2, n):
      if n % d == 0:
        shapes.extend([d] + rest for rest in _factorisations(n // d,
                                                             max_rank - 1)
                      if rest != [1])
  return shapes


def _to_4d(coordinate, physical_shape_4d):
  """Inverse of the [x, y, z, cores] -> [y*z, x, cores] numbering."""
  yz, x, core = coordinate
  y_size = physical_shape_4d[1]
  return (x, yz % y_size, yz // y_size, core)


# --------------------------------------------------------------------------
# _ring_2d and ring_order.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("m,n", list(itertools.product(range(1, 8), repeat=2)))
def test_ring_2d_visits_grid_as_ring(m, n):
  order = tpu_topology._ring_2d(m, n)
  assert sorted(order) == list(itertools.product(range(m), range(n)))
  ring_exists = m * n <= 2 or (m * n % 2 == 0 and m > 1 and n > 1)
  _check_order(order, _grid_neighbours, closed=ring_exists)


def test_ring_2d_matches_original_for_even_rows():
  assert tpu_topology._ring_2d(2, 2) == [(0, 0), (0, 1), (1, 1), (1, 0)]
  assert tpu_topology._ring_2d(4, 2) == [
      (0, 0), (0, 1), (1, 1), (2, 1), (3, 1), (3, 0), (2, 0), (1, 0)]
  assert tpu_topology._ring_2d(2, 3) == [
      (0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
  assert tpu_topology._ring_2d(1, 3) == [(0, 0), (0, 1), (0, 2)]
  assert tpu_topology.ring_order_2d(3, 1) == [(0, 0), (1, 0), (2, 0)]


def test_ring_2d_odd_rows_is_a_ring():
  # The original returned a column-major order here: (0,0), (1,0), (2,0),
  # (0,1), ... whose step from (2,0) to (0,1) is not a grid step.
  order = tpu_topology._ring_2d(3, 2)
  _check_order(order, _grid_neighbours, closed=True)


@pytest.mark.parametrize("m,n", [(0, 2), (2, -1), (2.5, 2), (True, 2)])
def test_ring_2d_rejects_bad_sizes(m, n):
  with pytest.raises(ValueError, match=r"\(m, n\)"):
    tpu_topology._ring_2d(m, n)


@pytest.mark.parametrize("shape,closed", [
    ([1], True), ([4], True), ([2, 2], True), ([4, 2], True),
    ([4, 1, 2], True), ([8, 1, 2], True), ([3, 3, 2], True),
    ([3, 1, 4], True), ([4, 4, 2], True), ([2, 3, 4, 2], True),
    ([3, 3, 3, 1], False), ([5, 1, 1], False), ([4, 1], False),
    ([2, 1], True), ([2, 2, 1], True), ([2, 3, 1], True),
])
def test_ring_order_neighbours(shape, closed):
  order = tpu_topology.ring_order(shape)
  assert sorted(order) == list(itertools.product(*[range(s) for s in shape]))
  _check_order(order, _neighbours, closed=closed)
  if not closed:
    assert not _neighbours(order[-1], order[0])


def test_ring_order_keeps_cores_of_a_chip_together_when_chips_ring():
  order = tpu_topology.ring_order([2, 2, 2])
  assert order == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                   (1, 1, 0), (1, 1, 1), (1, 0, 0), (1, 0, 1)]


# --------------------------------------------------------------------------
# Strided sub-spaces.
# --------------------------------------------------------------------------


def test_logical_1d_to_physical_subspace_auto():
  assert tpu_topology._logical_1d_to_physical_subspace_auto(
      [(2, 1), (2, 2), (1, 1)], [2, 4, 2]) == [
          (0, 0, 0), (0, 2, 0), (1, 2, 0), (1, 0, 0)]


@pytest.mark.parametrize("sizes_and_strides,match", [
    ([(2, 1), (2, 1)], "one .size, stride. pair per axis"),
    ([(2, 1), (3, 2), (1, 1)], "leaves physical axis 1"),
    ([(0, 1), (1, 1), (1, 1)], "sizes in sizes_and_strides"),
])
def test_logical_1d_to_physical_subspace_auto_errors(sizes_and_strides, match):
  with pytest.raises(ValueError, match=match):
    tpu_topology._logical_1d_to_physical_subspace_auto(
        sizes_and_strides, [2, 4, 2])


def test_logical_to_physical_v1_is_row_major_sum_of_subspaces():
  coordinates = tpu_topology._logical_to_physical_v1(
      [[(2, 4), (1, 1)], [(4, 1), (1, 1)]], [8, 1])
  assert coordinates == [(0, 0), (1, 0), (2, 0), (3, 0),
                         (4, 0), (5, 0), (6, 0), (7, 0)]


def test_logical_to_physical_v1_rejects_overlap():
  with pytest.raises(ValueError, match="one-to-one"):
    tpu_topology._logical_to_physical_v1([[(2, 1)], [(2, 1)]], [4])


# --------------------------------------------------------------------------
# HierarchicalTiling.
# --------------------------------------------------------------------------

_TILING_CASES = [
    # (spec, physical_shape, mesh shape)
    ([("batch", None), ("model", [1, 1, 2])], [2, 2, 2], [4, 2]),
    ([("batch", None), ("model", [2, 2, 2])], [4, 4, 2], [4, 8]),
    ([("batch", [4, 4, 1]), ("model", [1, 1, 2])], [4, 4, 2], [16, 2]),
    ([("batch", None), ("model", [2, 1, 2])], [4, 8, 2], [16, 4]),
    ([("a", None), ("b", [1, 2, 1]), ("c", [2, 1, 2])], [4, 4, 2], [4, 2, 4]),
    ([("all", None)], [8, 8, 2], [128]),
    ([("batch", [8, 1, 1]), ("model", [1, 8, 2])], [8, 8, 2], [8, 16]),
    ([("batch", None), ("model", [1, 1])], [3, 5], [15, 1]),
    ([("batch", None), ("model", [2, 2, 2, 2])], [4, 4, 4, 2], [8, 16]),
    ([("x", [2, 1, 1]), ("y", None), ("z", [1, 1, 2])], [2, 4, 2], [2, 4, 2]),
]


@pytest.mark.parametrize("spec,physical_shape,mesh_sizes", _TILING_CASES)
def test_hierarchical_tiling(spec, physical_shape, mesh_sizes):
  tiling = tpu_topology.HierarchicalTiling(spec, physical_shape)
  num = mtf.list_product(physical_shape)
  names = [name for name, _ in spec]
  assert tiling.mesh_shape == mtf.Shape(
      [mtf.Dimension(n, s) for n, s in zip(names, mesh_sizes)])
  spec_to_mesh_shape = tpu_topology.HierarchicalTiling.spec_to_mesh_shape
  assert tiling.mesh_shape == spec_to_mesh_shape(spec, num)
  l2p = tiling.logical_to_physical
  assert sorted(l2p) == list(range(num))
  p2l = tiling.physical_to_logical
  assert all(p2l[p] == i for i, p in enumerate(l2p))
  coordinates = tiling.physical_coordinates
  assert [mtf.processor_coordinates_to_pnum(physical_shape, c)
          for c in coordinates] == l2p
  # The last logical dimension is a compact tile at the origin, walked with
  # physical neighbours one after the other.
  last = tiling.projected_shapes[-1]
  inner = mesh_sizes[-1]
  for start in range(0, num, inner):
    group = coordinates[start:start + inner]
    _check_order(group, _neighbours, closed=False)
  assert sorted(tuple(c) for c in coordinates[:inner]) == list(
      itertools.product(*[range(s) for s in last]))


def test_hierarchical_tiling_fills_in_none():
  tiling = tpu_topology.HierarchicalTiling(
      [("batch", None), ("model", [2, 2, 2])], [4, 4, 2])
  assert tiling.projected_shapes == [[2, 2, 1], [2, 2, 2]]
  # Each model group is one 2x2 block of chips with both cores, as a ring.
  coordinates = tiling.physical_coordinates
  for start in range(0, 32, 8):
    group = coordinates[start:start + 8]
    _check_order(group, _neighbours, closed=True)
    assert len({(c[0] // 2, c[1] // 2) for c in group}) == 1


@pytest.mark.parametrize("spec,physical_shape,match", [
    ([("batch", [2, 2, 2]), ("model", [2, 2, 2])], [2, 2, 2],
     "multiply to .4, 4, 4."),
    ([("batch", None), ("model", [3, 1, 1])], [4, 4, 2], "does not divide"),
    ([("batch", None), ("model", [2, 2])], [4, 4, 2], "one entry per"),
    ([("batch", None), ("model", None)], [4, 4, 2], "at most one"),
    ([("batch", None), ("batch", [1, 1, 2])], [4, 4, 2], "repeats"),
    ([("batch", None, 3)], [4, 4, 2], "not a pair"),
    ([("", None)], [4, 4, 2], "non-empty string name"),
    ([("model", [0, 1, 2])], [4, 4, 2], "projected shape of 'model'"),
    ("batch:4", [4, 4, 2], "spec must be a list"),
    ([("batch", None)], [4, 0, 2], "physical_shape"),
])
def test_hierarchical_tiling_errors(spec, physical_shape, match):
  with pytest.raises(ValueError, match=match):
    tpu_topology.HierarchicalTiling(spec, physical_shape)


def test_spec_to_mesh_shape_errors():
  spec_to_mesh_shape = tpu_topology.HierarchicalTiling.spec_to_mesh_shape
  with pytest.raises(ValueError, match="num_processors=16"):
    spec_to_mesh_shape([("batch", [2, 2]), ("model", [1, 2])], 16)
  with pytest.raises(ValueError, match="does not divide"):
    spec_to_mesh_shape([("batch", None), ("model", [3])], 16)
  assert spec_to_mesh_shape([("batch", None), ("model", [2, 2])], 16) == (
      mtf.convert_to_shape("batch:4;model:4"))


# --------------------------------------------------------------------------
# physical_shape_3d_from_topology_proto_4d.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("shape_4d,shape_3d", [
    ([2, 2, 1, 2], [2, 2, 2]),
    ([4, 8, 1, 2], [8, 4, 2]),
    ([4, 4, 4, 2], [16, 4, 2]),
    ([2, 3, 5, 1], [15, 2, 1]),
])
def test_physical_shape_3d_from_topology_proto_4d(shape_4d, shape_3d):
  assert tpu_topology.physical_shape_3d_from_topology_proto_4d(
      shape_4d) == shape_3d


@pytest.mark.parametrize("bad", [[4, 4, 2], [1, 2, 3, 4, 5], [4, 4, 0, 2],
                                 "4x4", None])
def test_physical_shape_3d_from_topology_proto_4d_errors(bad):
  with pytest.raises(ValueError, match="mesh_shape"):
    tpu_topology.physical_shape_3d_from_topology_proto_4d(bad)


@pytest.mark.parametrize("shape_4d", [[2, 2, 1, 2], [4, 2, 1, 2],
                                      [2, 2, 2, 2], [3, 2, 2, 1]])
def test_topology_coordinates_number_cores_as_auto_placement_does(shape_4d):
  coordinates = tpu_topology.topology_coordinates(shape_4d)
  x_size, y_size, z_size, cores = shape_4d
  assert len(coordinates) == x_size * y_size * z_size * cores
  assert len({tuple(c) for c in coordinates}) == len(coordinates)
  for x, y, z, core in coordinates:
    assert 0 <= x < x_size and 0 <= y < y_size and 0 <= z < z_size
    assert 0 <= core < cores
  # Physical processor p (as auto_logical_to_physical_tpu numbers it) is the
  # core at coordinates[p].
  logical_shape = [2, len(coordinates) // 2]
  physical = tpu_topology.auto_logical_to_physical_tpu(logical_shape,
                                                       shape_4d)
  placed = tpu_topology.auto_logical_to_physical_tpu(
      logical_shape, shape_4d, return_coordinates=True)
  for logical, p in enumerate(physical):
    x, y, z, core = coordinates[p]
    assert placed[logical] == [z * y_size + y, x, core]


def test_topology_coordinates_rejects_3d_shapes():
  with pytest.raises(ValueError, match="mesh_shape"):
    tpu_topology.topology_coordinates([4, 4, 2])


# --------------------------------------------------------------------------
# auto_logical_to_physical_tpu.
# --------------------------------------------------------------------------

_PHYSICAL_SHAPES = [
    [1, 1, 1], [2, 2, 1], [2, 1, 2], [2, 2, 2], [2, 4, 1], [4, 4, 1],
    [4, 4, 2], [4, 8, 2], [8, 8, 2], [16, 16, 2], [2, 2, 4], [3, 3, 2],
    [6, 2, 1], [5, 1, 1], [3, 5, 1], [8, 1, 2], [4, 2], [6],
    # 4-D TPU topology shapes [x, y, z, cores].
    [2, 2, 1, 2], [4, 2, 1, 2], [2, 2, 2, 2], [4, 4, 4, 2], [3, 2, 2, 1],
]


def _auto_cases():
  cases = []
  for physical_shape in _PHYSICAL_SHAPES:
    num = mtf.list_product(physical_shape)
    max_rank = 2 if num > 64 else 3
    for logical_shape in _factorisations(num, max_rank):
      cases.append((logical_shape, physical_shape))
  # Size-1 logical dimensions anywhere.
  cases += [([1, 32], [4, 4, 2]), ([4, 1, 8], [4, 4, 2]), ([8, 4, 1], [8, 4]),
            ([1], [1, 1, 1]), ([], [1, 1, 1]), ([1, 1, 1, 6], [3, 1, 2])]
  return cases


def _innermost_groups(logical_shape, items):
  inner = logical_shape[-1] if logical_shape else 1
  return [items[i:i + inner] for i in range(0, len(items), inner)]


def _neighbour_frame(coordinates, physical_shape):
  if len(physical_shape) == 4:
    return [_to_4d(c, physical_shape) for c in coordinates]
  return [tuple(c) for c in coordinates]


@pytest.mark.parametrize(
    "logical_shape,physical_shape", _auto_cases(),
    ids=lambda s: "x".join(map(str, s)) or "scalar")
def test_auto_logical_to_physical_is_permutation(logical_shape,
                                                 physical_shape):
  num = mtf.list_product(physical_shape)
  l2p = tpu_topology.auto_logical_to_physical_tpu(logical_shape,
                                                  physical_shape)
  assert sorted(l2p) == list(range(num))
  coordinates = tpu_topology.auto_logical_to_physical_tpu(
      logical_shape, physical_shape, return_coordinates=True)
  if len(physical_shape) == 4:
    numbering_shape = tpu_topology.physical_shape_3d_from_topology_proto_4d(
        physical_shape)
  else:
    numbering_shape = physical_shape
  assert [mtf.processor_coordinates_to_pnum(numbering_shape, c)
          for c in coordinates] == l2p
  # Along the innermost logical mesh dimension, consecutive processors are
  # physical neighbours.
  frame = _neighbour_frame(coordinates, physical_shape)
  for group in _innermost_groups(logical_shape, frame):
    _check_order(group, _neighbours, closed=False)


@pytest.mark.parametrize("logical_shape,physical_shape", [
    ([32], [4, 4, 2]), ([2, 16], [4, 4, 2]), ([4, 8], [4, 4, 2]),
    ([8, 4], [4, 4, 2]), ([16, 2], [4, 4, 2]), ([128], [8, 8, 2]),
    ([8, 16], [8, 8, 2]), ([4, 16], [4, 8, 2]), ([16, 32], [16, 16, 2]),
    ([2, 256], [16, 16, 2]), ([8], [2, 4, 1]), ([2, 4], [2, 4, 1]),
    ([16], [8, 1, 2]), ([2, 8], [8, 1, 2]), ([18], [3, 3, 2]),
    ([3, 6], [3, 3, 2]), ([4, 4], [2, 2, 4]), ([12], [6, 2, 1]),
    ([128], [4, 4, 4, 2]), ([8, 16], [4, 4, 4, 2]), ([32, 4], [4, 4, 4, 2]),
    ([16], [2, 2, 2, 2]), ([12], [3, 2, 2, 1]),
])
def test_auto_logical_to_physical_innermost_is_ring(logical_shape,
                                                    physical_shape):
  coordinates = tpu_topology.auto_logical_to_physical_tpu(
      logical_shape, physical_shape, return_coordinates=True)
  frame = _neighbour_frame(coordinates, physical_shape)
  for group in _innermost_groups(logical_shape, frame):
    _check_order(group, _neighbours, closed=True)


def test_auto_logical_to_physical_1d_matches_original_ring():
  # Both cores of a chip together, chips in _ring_2d order.
  expected = [2 * (4 * i + j) + core
              for i, j in tpu_topology._ring_2d(4, 4) for core in range(2)]
  assert tpu_topology.auto_logical_to_physical_tpu([32], [4, 4, 2]) == expected
  assert tpu_topology.auto_logical_to_physical_tpu(
      [32], [4, 4, 1, 2]) == tpu_topology.auto_logical_to_physical_tpu(
          [32], [4, 4, 2])


def test_auto_logical_to_physical_small_example():
  assert tpu_topology.auto_logical_to_physical_tpu(
      [2, 4], [2, 2, 2], return_coordinates=True) == [
          [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1],
          [1, 0, 0], [1, 0, 1], [1, 1, 0], [1, 1, 1]]


def test_auto_logical_to_physical_outer_dimension_rings_chips():
  # With the cores taken by the inner dimension, the outer dimension walks
  # the 4x4 chip grid as a ring.
  coordinates = tpu_topology.auto_logical_to_physical_tpu(
      [16, 2], [4, 4, 2], return_coordinates=True)
  for core in range(2):
    column = [tuple(c) for c in coordinates[core::2]]
    assert all(c[-1] == core for c in column)
    _check_order(column, _neighbours, closed=True)


def test_auto_logical_to_physical_4d_uses_real_chip_grid():
  # [x, y, z, cores] = [2, 2, 2, 2]: each group of 8 is a block of 4 chips
  # that rings in the real 3-D chip grid, although the 3-D numbering
  # [y*z, x, cores] merges y and z.
  coordinates = tpu_topology.auto_logical_to_physical_tpu(
      [2, 8], [2, 2, 2, 2], return_coordinates=True)
  assert all(len(c) == 3 for c in coordinates)
  frame = _neighbour_frame(coordinates, [2, 2, 2, 2])
  for group in _innermost_groups([2, 8], frame):
    _check_order(group, _neighbours, closed=True)


@pytest.mark.parametrize("physical_shape", [[4, 4, 1], [2, 2, 4], [3, 3, 2],
                                            [4, 4, 4, 2]])
def test_auto_logical_to_physical_original_bugs(physical_shape):
  # The original returned the function `_default_value` itself when cores per
  # chip != 2 and crashed with return_coordinates=True on shapes it did not
  # recognise; both now give a proper mapping.
  num = mtf.list_product(physical_shape)
  l2p = tpu_topology.auto_logical_to_physical_tpu([num], physical_shape)
  assert isinstance(l2p, list) and sorted(l2p) == list(range(num))
  coordinates = tpu_topology.auto_logical_to_physical_tpu(
      [num], physical_shape, return_coordinates=True)
  assert len(coordinates) == num


def test_auto_logical_to_physical_accepts_mtf_shape():
  mesh_shape = mtf.convert_to_shape("batch:4;model:8")
  assert tpu_topology.auto_logical_to_physical_tpu(
      mesh_shape, [4, 4, 2]) == tpu_topology.auto_logical_to_physical_tpu(
          [4, 8], [4, 4, 2])


@pytest.mark.parametrize("logical_shape,physical_shape,match", [
    ([4, 4], [4, 4, 2], r"logical_shape=\[4, 4\] has 16 processors but "
                        r"physical_shape=\[4, 4, 2\] has 32"),
    ([4, 0], [4, 4, 2], "logical_shape must be a list of positive"),
    ([4, 8], [4, -4, 2], "physical_shape must be a list of positive"),
    ([4, 8], [], "physical_shape must not be empty"),
    ("4x8", [4, 4, 2], "logical_shape must be a list"),
    ([4, 8.0], [4, 4, 2], "logical_shape"),
])
def test_auto_logical_to_physical_errors(logical_shape, physical_shape, match):
  with pytest.raises(ValueError, match=match):
    tpu_topology.auto_logical_to_physical_tpu(logical_shape, physical_shape)
