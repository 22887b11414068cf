"""What uneven splits cost: the padded dimensions and tensors of a graph.

With `LayoutRules(..., allow_uneven=True)` a dimension of size n split over
a mesh dimension of size k is held padded to ceil(n/k)*k (see
`backend/padding.py`). The padding costs memory (in variables and the
activations the lowering holds) and compute (the operations run on padded
slices). `padding_report(graph, mesh_to_impl)` lists, before or after
lowering, each padded dimension and each padded tensor with its size and
its padded size, and logs them, so that a run says at start-up what its
layout pays for not dividing.
"""

import dataclasses
from typing import List, Tuple

from absl import logging


@dataclasses.dataclass(frozen=True)
class PaddedDimension:
  """A tensor dimension split unevenly over a mesh dimension.

  Attributes:
    name: the tensor dimension's name.
    size: its logical size.
    mesh_dim: the mesh dimension's name.
    pieces: the mesh dimension's size.
    padded_size: ceil(size / pieces) * pieces.
  """
  name: str
  size: int
  mesh_dim: str
  pieces: int
  padded_size: int

  @property
  def percent(self):
    """The padding, in percent of the logical size."""
    return 100.0 * (self.padded_size - self.size) / self.size


@dataclasses.dataclass(frozen=True)
class PaddedTensor:
  """A tensor of the graph with at least one padded dimension.

  Attributes:
    name: the tensor's name.
    is_variable: whether it is a variable's value (memory held for the whole
      run) rather than an activation (memory and compute of one step).
    shape: the mtf Shape.
    dims: the names of its padded dimensions.
    elements: its logical number of elements.
    padded_elements: the elements of the padded tensor (the slices of all
      processors, counting each replica once).
  """
  name: str
  is_variable: bool
  shape: object
  dims: Tuple[str, ...]
  elements: int
  padded_elements: int

  @property
  def percent(self):
    """The padding, in percent of the logical elements."""
    if not self.elements:
      return 0.0
    return 100.0 * (self.padded_elements - self.elements) / self.elements


@dataclasses.dataclass(frozen=True)
class PaddingReport:
  """The padded dimensions and tensors of a graph, with totals.

  Attributes:
    dimensions: the PaddedDimensions, by name.
    tensors: the PaddedTensors, in graph order.
    variable_elements, padded_variable_elements: the elements of all
      variables, logical and padded (memory).
    activation_elements, padded_activation_elements: likewise for the
      outputs of the other operations (a proxy of compute and of the
      activations' memory).
    lines: the lines logged.
  """
  dimensions: List[PaddedDimension]
  tensors: List[PaddedTensor]
  variable_elements: int
  padded_variable_elements: int
  activation_elements: int
  padded_activation_elements: int
  lines: List[str]


def _percent(padded, logical):
  return 100.0 * (padded - logical) / logical if logical else 0.0


def padding_report(graph, mesh_to_impl, verbose=True, log_file=None):
  """Lists and logs (at INFO) what uneven splits pad in `graph`.

  Args:
    graph: an mtf Graph.
    mesh_to_impl: {Mesh: MeshImpl} it is (or will be) lowered with; tensors
      of other meshes are left out.
    verbose: also log one line per padded variable and one per shape of the
      other padded tensors (else only the dimensions and the totals).
    log_file: an optional writable file that gets the same lines.

  Returns:
    a PaddingReport (empty lists and no lines if nothing is padded).
  """
  dimensions = {}
  tensors = []
  totals = {True: [0, 0], False: [0, 0]}
  seen = set()
  variables = {id(v) for v in graph.all_variables}
  for operation in graph.operations:
    is_variable = id(operation) in variables
    for tensor in operation.outputs:
      impl = mesh_to_impl.get(tensor.mesh)
      if impl is None or id(tensor) in seen:
        continue
      seen.add(id(tensor))
      padded_elements = tensor.shape.size
      axes = impl.padded_axes(tensor.shape)
      for axis in axes:
        dim = tensor.shape.dims[axis.tensor_axis]
        padded_size = axis.slice_size * axis.pieces
        padded_elements = padded_elements // dim.size * padded_size
        dimensions.setdefault(
            (dim.name, dim.size, axis.mesh_axis),
            PaddedDimension(dim.name, dim.size,
                            impl.shape.dims[axis.mesh_axis].name,
                            axis.pieces, padded_size))
      totals[is_variable][0] += tensor.shape.size
      totals[is_variable][1] += padded_elements
      if axes:
        tensors.append(PaddedTensor(
            tensor.name, is_variable, tensor.shape,
            tuple(tensor.shape.dims[a.tensor_axis].name for a in axes),
            tensor.shape.size, padded_elements))
  dimensions = sorted(dimensions.values(), key=lambda d: (d.name, d.size))
  report = PaddingReport(
      dimensions, tensors, totals[True][0], totals[True][1],
      totals[False][0], totals[False][1], _lines(dimensions, tensors, totals,
                                                 verbose))
  for line in report.lines:
    logging.info(line)
  if log_file is not None and report.lines:
    log_file.write("\n".join(report.lines) + "\n")
  return report


def _lines(dimensions, tensors, totals, verbose):
  """The report's text: dimensions, tensors (if verbose), totals."""
  if not dimensions:
    return []
  lines = [f"Uneven splits: {len(dimensions)} padded dimension(s), "
           f"{len(tensors)} padded tensor(s)"]
  for d in dimensions:
    lines.append(f"Padded dimension {d.name} (size {d.size}) over "
                 f"{d.mesh_dim}:{d.pieces} -> {d.padded_size} "
                 f"(+{d.percent:.1f}%)")
  if verbose:
    # Variables one by one; other tensors (many, alike) by shape.
    by_shape = {}
    for t in tensors:
      if t.is_variable:
        lines.append(f"Padded variable {t.name} {t.shape.to_string} "
                     f"({', '.join(t.dims)}): {t.elements} -> "
                     f"{t.padded_elements} elements (+{t.percent:.1f}%)")
      else:
        by_shape.setdefault(t.shape, []).append(t)
    for shape, alike in by_shape.items():
      t = alike[0]
      lines.append(f"Padded tensors {shape.to_string} ({', '.join(t.dims)}), "
                   f"{len(alike)} of them, e.g. {t.name}: {t.elements} -> "
                   f"{t.padded_elements} elements each (+{t.percent:.1f}%)")
  for is_variable, what in ((True, "memory of variables"),
                            (False, "compute (operation outputs)")):
    logical, padded = totals[is_variable]
    lines.append(f"Padding cost, {what}: {logical} -> {padded} elements "
                 f"(+{_percent(padded, logical):.1f}%)")
  return lines
