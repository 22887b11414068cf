"""Which tensor dimensions may be split over which mesh dimensions.

A layout assigns tensor-dimension names to mesh dimensions. An assignment is
allowed when some operation does not refuse to split the dimension (its
`unsplittable_dims`), the dimension is not anonymous (`_anonymous_<name>`,
what `mtf.anonymous_shape` makes to keep a dimension whole), and every size
the name takes anywhere in the graph is a multiple of the mesh dimension's
size. With uneven splits allowed (`allow_uneven`, as
`LayoutRules.allow_uneven` lowers them: padded to the next multiple),
every size need only be at least the mesh dimension's size: a smaller one
would give some processors nothing but padding.

Changed from the original: the greatest common divisor comes from
`math.gcd` (the original's `fractions.gcd` is gone since Python 3.9), and
`validate_layout` checks a whole layout, which the original never did
before handing a chosen layout back.
"""

import math
import re

from mesh_tensorflow import errors
from mesh_tensorflow import shape as shape_lib

_ANONYMOUS = re.compile(r"_anonymous_")


class LayoutValidator(object):
  """Answers whether a tensor dimension may be assigned to a mesh dimension.

  Example:
    validator = LayoutValidator(mtf_graph, mtf.convert_to_shape("m1:4;m2:2"))
    validator.splittable_mtf_dimension_names  # {"batch", "d_ff", ...}
    validator.is_valid_assignment("batch", "m1")  # all sizes divisible by 4?
  """

  def __init__(self, mtf_graph, mesh_shape, allow_uneven=False):
    """Reads the graph's dimension names, sizes and splittability.

    Args:
      mtf_graph: an mtf.Graph.
      mesh_shape: an mtf.Shape (or anything convert_to_shape takes).
      allow_uneven: whether a mesh dimension may split a size it does not
        divide (padded, see the module doc).
    """
    mesh_shape = shape_lib.convert_to_shape(mesh_shape)
    names = set()
    unsplittable = set()
    size_gcd = {}
    size_min = {}
    for operation in mtf_graph.operations:
      unsplittable.update(operation.unsplittable_dims)
      for tensor in operation.outputs:
        for dim in tensor.shape.dims:
          size_gcd[dim.name] = math.gcd(size_gcd.get(dim.name, 0), dim.size)
          size_min[dim.name] = min(size_min.get(dim.name, dim.size),
                                   dim.size)
          if not _ANONYMOUS.match(dim.name):
            names.add(dim.name)
    self._splittable_mtf_dimension_names = names - unsplittable
    self._mtf_dimension_name_to_size_gcd = size_gcd
    self._mtf_dimension_name_to_min_size = size_min
    self._mesh_dimension_name_to_size = {
        d.name: d.size for d in mesh_shape.dims}
    self._allow_uneven = bool(allow_uneven)

  @property
  def allow_uneven(self):
    """Whether assignments that do not divide (padded) are allowed."""
    return self._allow_uneven

  @property
  def splittable_mtf_dimension_names(self):
    """Set of tensor-dimension names a layout may assign."""
    return self._splittable_mtf_dimension_names

  @property
  def mesh_dimension_name_to_size(self):
    """{mesh dimension name: size}."""
    return self._mesh_dimension_name_to_size

  def is_valid_assignment(self, mtf_dimension_name, mesh_dimension_name):
    """Whether `mtf_dimension_name` may be split over `mesh_dimension_name`:
    it is splittable and every size it has is a multiple of the mesh
    dimension's size (with allow_uneven: at least that size)."""
    if mtf_dimension_name not in self._splittable_mtf_dimension_names:
      return False
    mesh_size = self._mesh_dimension_name_to_size[mesh_dimension_name]
    if self._allow_uneven:
      return self._mtf_dimension_name_to_min_size[mtf_dimension_name] >= (
          mesh_size)
    return self._mtf_dimension_name_to_size_gcd[mtf_dimension_name] % (
        mesh_size) == 0

  def is_uneven_assignment(self, mtf_dimension_name, mesh_dimension_name):
    """Whether some size of `mtf_dimension_name` is not a multiple of the
    mesh dimension's size (the split pads it)."""
    mesh_size = self._mesh_dimension_name_to_size[mesh_dimension_name]
    return bool(self._mtf_dimension_name_to_size_gcd[mtf_dimension_name] %
                mesh_size)

  def validate_layout(self, layout, operation_dimension_sets=()):
    """Raises a LayoutError naming the first fault of `layout`.

    Args:
      layout: {tensor dimension name: mesh dimension name}.
      operation_dimension_sets: iterable of sets of dimension names no two
        of which may share a mesh dimension (those of each tensor, as the
        layout optimizer's `constraint_sets` gives them).
    """
    for name, mesh_name in sorted(layout.items()):
      if mesh_name not in self._mesh_dimension_name_to_size:
        raise errors.LayoutError(
            f"layout assigns {name!r} to mesh dimension {mesh_name!r}, which "
            f"the mesh {sorted(self._mesh_dimension_name_to_size)} lacks.")
      if not self.is_valid_assignment(name, mesh_name):
        if name not in self._splittable_mtf_dimension_names:
          reason = "an operation cannot lower it split, or it is unknown"
        elif self._allow_uneven:
          reason = (f"its smallest size "
                    f"{self._mtf_dimension_name_to_min_size[name]} is less "
                    f"than {self._mesh_dimension_name_to_size[mesh_name]}")
        else:
          reason = (f"its sizes share only the factor "
                    f"{self._mtf_dimension_name_to_size_gcd[name]}, not a "
                    f"multiple of "
                    f"{self._mesh_dimension_name_to_size[mesh_name]} "
                    "(allow_uneven=True would pad it)")
        raise errors.LayoutError(
            f"layout assigns {name!r} to mesh dimension {mesh_name!r}: "
            f"{reason}.")
    for dimension_set in operation_dimension_sets:
      used = {}
      for name in sorted(dimension_set):
        mesh_name = layout.get(name)
        if mesh_name is None:
          continue
        if mesh_name in used:
          raise errors.LayoutError(
              f"layout splits both {used[mesh_name]!r} and {name!r} over mesh "
              f"dimension {mesh_name!r}, but one tensor has both.")
        used[mesh_name] = name


def enumerate_layouts(validator, operation_dimension_sets):
  """Yields every valid layout as a "name:mesh;..." string (sorted names).

  A layout is valid when each assignment passes
  `validator.is_valid_assignment` and no two names of one set of
  `operation_dimension_sets` (e.g. each tensor's names) share a mesh
  dimension. The empty layout
  comes first. Benchmarks measure these to judge the search.
  """
  names = sorted(validator.splittable_mtf_dimension_names)
  mesh_names = list(validator.mesh_dimension_name_to_size)
  neighbours = {name: set() for name in names}
  for dimension_set in operation_dimension_sets:
    for name in dimension_set:
      if name in neighbours:
        neighbours[name].update(d for d in dimension_set if d != name)
  options = {name: [m for m in mesh_names
                    if validator.is_valid_assignment(name, m)]
             for name in names}

  def extend(index, layout):
    if index == len(names):
      yield ";".join(f"{d}:{m}" for d, m in sorted(layout.items()))
      return
    name = names[index]
    yield from extend(index + 1, layout)
    taken = {layout[d] for d in neighbours[name] if d in layout}
    for mesh_name in options[name]:
      if mesh_name not in taken:
        layout[name] = mesh_name
        yield from extend(index + 1, layout)
        del layout[name]

  yield from extend(0, {})
