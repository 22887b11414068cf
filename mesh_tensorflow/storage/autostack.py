"""Autostack: which mtf variables a Lowering stores stacked together.

Variables with the same mesh, shape, dtypes and trainability that are written
by exactly the same Assign operations (as `Optimizer.apply_grads` produces
through `Graph.combine_assignments`) can live in one TF variable per
processor with a leading "stacked" axis: one read and one assignment per
processor instead of one per variable. On large meshes that cuts the number
of TF variables and ops, hence build time. Unlike the original library, the
mtf graph is left as it is: stacking is a storage decision of the mesh
implementation, so `graph.all_variables` and checkpoints (by mtf name) are
the same with and without it. The Lowering plans with it (its `autostack`
argument, on by default, as in the original).
"""

import collections

from mesh_tensorflow.ops import variables as variables_lib

# Like the original: stacking copies values, so by default only small
# variables are stacked, unless there are very many slices to save on.
MAX_COMBINED_VARIABLE_SIZE = 2**29
SMALL_SLICE_LIMIT = 2**16
MANY_SLICES = 2**16
LARGE_SLICE_LIMIT = 2**27


class StackGroup:
  """Variables one Lowering stores as one stack, in stack order.

  It also holds, for that lowering, the one read of the stack that all its
  members share (set by the mesh implementation).
  """

  def __init__(self, variables):
    self.variables = list(variables)
    self.names = [v.name for v in variables]
    self.unstacked_reads = None


def plan(graph, mesh_to_impl,
         max_combined_variable_size=MAX_COMBINED_VARIABLE_SIZE,
         max_combined_slice_size=None):
  """Returns {mtf Variable: StackGroup} for the variables worth stacking.

  Args:
    graph: the mtf Graph.
    mesh_to_impl: {mtf Mesh: MeshImpl}; meshes whose implementation does not
      support stacking are skipped.
    max_combined_variable_size: at most this many elements per stack.
    max_combined_slice_size: at most this many elements per stacked slice;
      None picks 2**16, or 2**27 when the graph has >= 2**16 slices.
  """
  # Layer-stacked variables are stacked already, and their checkpoint
  # entries are their rows: autostack leaves them alone.
  variables = [v for v in graph.all_variables
               if v.has_own_storage and
               getattr(v, "member_names", None) is None and
               mesh_to_impl[v.mesh].supports_autostack]
  if not variables:
    return {}
  if max_combined_slice_size is None:
    total_slices = sum(mesh_to_impl[v.mesh].size for v in variables)
    max_combined_slice_size = (LARGE_SLICE_LIMIT if total_slices >= MANY_SLICES
                               else SMALL_SLICE_LIMIT)
  writers = collections.defaultdict(list)
  for op in graph.operations:
    if isinstance(op, variables_lib.Assign):
      for v in op.variables:
        writers[v].append(op)
  buckets = collections.OrderedDict()
  for v in variables:
    dtype = v.variable_dtype
    key = (v.mesh, v.shape, dtype.master_dtype, dtype.slice_dtype,
           dtype.activation_dtype, v.trainable,
           tuple(id(op) for op in writers[v]))
    if any(op.variables.count(v) > 1 for op in writers[v]):
      continue  # assigned twice in one op: keep it on its own
    buckets.setdefault(key, []).append(v)
  result = {}
  for members in buckets.values():
    impl = mesh_to_impl[members[0].mesh]
    size = max(1, members[0].size)
    slice_size = max(1, impl.slice_size(members[0].shape))
    per_stack = min(max_combined_variable_size // size,
                    max_combined_slice_size // slice_size)
    if per_stack < 2:
      continue
    for start in range(0, len(members), per_stack):
      chunk = members[start:start + per_stack]
      if len(chunk) < 2:
        continue
      group = StackGroup(chunk)
      for v in chunk:
        result[v] = group
  return result
