"""Processor numbering on a mesh.

A processor's number (`pnum`) counts processors in row-major order of the mesh
shape: the last mesh dimension varies fastest. Its coordinates (`pcoord`, one
per mesh dimension) are the digits of that number. On the mesh "rows:2;cols:2"
processors 0, 1, 2, 3 have coordinates (0,0), (0,1), (1,0), (1,1).

A collective over some mesh dimensions acts independently within each
*group*: the processors whose coordinates differ only along those dimensions.
"""

from mesh_tensorflow import shape as shape_lib


def pnum_to_processor_coordinates(mesh_shape, pnum):
  """The coordinates (one per mesh dimension) of processor `pnum`."""
  sizes = _sizes(mesh_shape)
  coordinates = []
  for size in reversed(sizes):
    coordinates.append(pnum % size)
    pnum //= size
  return coordinates[::-1]


def processor_coordinates_to_pnum(mesh_shape, coord):
  """The number of the processor at coordinates `coord`."""
  pnum = 0
  for size, coordinate in zip(_sizes(mesh_shape), coord):
    pnum = pnum * size + coordinate
  return pnum


def pnum_to_group(mesh_shape, group_dims, pnum):
  """Which group processor `pnum` belongs to, for groups along `group_dims`.

  Groups are numbered in row-major order of the mesh dimensions not in
  `group_dims`.
  """
  coordinates = pnum_to_processor_coordinates(mesh_shape, pnum)
  sizes = _sizes(mesh_shape)
  group = 0
  for axis, (size, coordinate) in enumerate(zip(sizes, coordinates)):
    if axis not in group_dims:
      group = group * size + coordinate
  return group


def processor_groups(mesh_shape, group_dims):
  """Lists of pnums that differ only along the mesh axes `group_dims`.

  Each list is ordered by the processors' coordinates along `group_dims`
  (row-major), which is the order collectives concatenate in.

  Example: on "rows:2;cols:2", `processor_groups(mesh, [1])` (along cols) is
  `[[0, 1], [2, 3]]` and `processor_groups(mesh, [0])` is `[[0, 2], [1, 3]]`.
  """
  group_dims = list(group_dims)
  sizes = _sizes(mesh_shape)
  groups = {}
  for pnum in range(shape_lib.list_product(sizes)):
    groups.setdefault(pnum_to_group(mesh_shape, group_dims, pnum),
                      []).append(pnum)
  return [groups[g] for g in sorted(groups)]


def _sizes(mesh_shape):
  if isinstance(mesh_shape, (list, tuple)) and all(
      isinstance(s, int) for s in mesh_shape):
    return list(mesh_shape)
  return shape_lib.convert_to_shape(mesh_shape).to_integer_list
