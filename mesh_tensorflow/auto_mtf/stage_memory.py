"""Peak memory of a pipelined mtf graph, one stage's processor at a time.

In an mtf graph a pipeline's stages are one stage dimension: an operation
of an iteration works on every stage at once, and the shift between
iterations ties stage s's work to stage s - 1's. Lowered with the stage
dimension split one stage per processor, each processor runs its own
operations, which wait only for their own inputs: the last stage starts
the backward pass of every micro-batch as soon as the loss's gradient
exists (no later stage feeds it), so, run as soon as their inputs exist,
all its iterations' weight-gradient terms are alive before the sum that
adds them in backward order has taken the first. Scheduling the mtf
operations as one would hide this.

`peak` copies each operation once per stage, with the dependencies its
copy has after lowering, and runs the copies as soon as their inputs exist:

- a shift along the stage dimension reads the copy `offset` stages back
  (nothing past the ends, without wrap);
- an operation whose outputs lack the stage dimension but some input has
  it (a sum over the stages) reads every copy of that input;
- mtf.depend's copy waits for every stage's copy of what it depends on
  (its lowering's control dependencies are on every processor's slices),
  which orders a recomputed iteration after the backward pass of every
  stage has reached it;
- a copy on a stage the iteration leaves idle (strategies/idle_slots) is
  zeros: it reads nothing;
- an mtf.Assign reads its new values apart, each as soon as it exists
  (GraphInterface.set_operation_reads_apart): a group of them that is
  stacked (autostack) is read by the copy that makes its last member;
- every other operation reads its inputs' copies on its own stage
  (operations without the stage dimension run on every processor).

Each stage's processor holds its own copies; the peak is the largest.
"""

import collections

from mesh_tensorflow.ops import control_flow
from mesh_tensorflow.ops import shifts
from mesh_tensorflow.strategies import idle_slots


def stage_dimensions(mtf_graph, mesh_shape, layout_rules):
  """({stage dimension name}, S) of the graph's pipelines whose stage
  dimension is split over a mesh dimension of its size S (one stage per
  processor), or (set(), 1) if none is."""
  # Imported here: pipelining imports the ops this module's callers price.
  from mesh_tensorflow.strategies import pipelining  # pylint: disable=g-import-not-at-top
  names, stages = set(), 1
  for info in pipelining.pipeline_infos(mtf_graph):
    dim = info.stage_dim
    mesh_dim = layout_rules.tensor_dimension_to_mesh_axis(dim, mesh_shape)
    if mesh_dim is not None and mesh_shape.dims[mesh_dim].size == dim.size:
      names.add(dim.name)
      stages = max(stages, dim.size)
  return names, stages


def peak(mtf_graph, sizes, final, stage_names, num_stages, buffer_of=None,
         apart=None):
  """(peak bytes, {tensor name: bytes alive at the peak}) of the stage
  processor whose peak is largest.

  Args:
    mtf_graph: the mtf.Graph.
    sizes: {tensor name: bytes of its slice on one processor}; tensors
      absent count nothing (e.g. variables, held apart).
    final: names of tensors never freed (the step's outputs, variables).
    stage_names: the stage dimensions' names.
    num_stages: S, the processors along the stage mesh dimension.
    buffer_of: optional {tensor name: the tensor whose buffer it is} of the
      aliases (GraphInterface.set_tensor_alias): never allocated; reading
      one reads its source.
    apart: optional {operation name: groups of its input names} of the
      operations that read their inputs apart
      (GraphInterface.get_operation_apart_groups).
  """
  buffer_of = buffer_of or {}
  apart = apart or {}
  ops = list(mtf_graph.operations)
  producer = {}
  for i, op in enumerate(ops):
    for t in op.outputs:
      producer[t.name] = i

  def has_stage(t):
    return any(n in stage_names for n in t.shape.dimension_names)

  # reads[(op id, stage)]: the (tensor name, stage) copies it reads.
  reads = {}
  for i, op in enumerate(ops):
    mark = idle_slots.of(op)
    idle = mark.idle_stages if (
        mark is not None and mark.stage_dim.name in stage_names) else ()
    outputs_staged = bool(op.outputs) and all(has_stage(t)
                                              for t in op.outputs)
    waits_for_all = isinstance(op, control_flow.Depend)
    stage_shift = (isinstance(op, shifts.ShiftOperation) and
                   op.dim.name in stage_names and not op.wrap)
    for s in range(num_stages):
      if s in idle:
        reads[i, s] = ()
        continue
      copies = []
      for k, t in enumerate(op.inputs):
        if t.name not in producer:
          continue
        if waits_for_all and k > 0:
          copies.extend((t.name, r) for r in range(num_stages))
        elif stage_shift:
          if 0 <= s - op.offset < num_stages:
            copies.append((t.name, s - op.offset))
        elif has_stage(t) and not outputs_staged:
          copies.extend((t.name, r) for r in range(num_stages))
        else:
          copies.append((t.name, s))
      reads[i, s] = tuple(dict.fromkeys(copies))
  level = {}
  for i in range(len(ops)):
    for s in range(num_stages):
      level[i, s] = 1 + max(
          (level[producer[name], r] for name, r in reads[i, s]), default=-1)
  for i, s in list(reads):
    groups = apart.get(ops[i].name)
    if groups is None:
      continue
    reads[i, s] = ()
    for group in groups:
      # A stage's processor stacks its own copies.
      copies = [(name, s) for name in group if name in producer]
      if copies:
        last = max((level[producer[n], r], producer[n], r) for n, r in copies)
        reads[last[1:]] += tuple(copies)
  readers_left = collections.Counter()
  for node, node_reads in reads.items():
    reads[node] = tuple(dict.fromkeys(
        (buffer_of.get(name, name), r) for name, r in node_reads))
    for copy in reads[node]:
      readers_left[copy] += 1
  final = set(final) | {buffer_of[name] for name in final if name in buffer_of}
  total = [0] * num_stages
  live = [dict() for _ in range(num_stages)]
  best = [(0, {}) for _ in range(num_stages)]
  pending_free = []
  for i, s in sorted(reads, key=lambda node: (level[node], node)):
    for name, r in pending_free:
      total[r] -= live[r].pop(name, 0)
    pending_free = []
    for t in ops[i].outputs:
      if t.name in buffer_of:
        continue
      size = sizes.get(t.name, 0)
      if size:
        live[s][t.name] = size
        total[s] += size
      if not readers_left[(t.name, s)] and t.name not in final:
        pending_free.append((t.name, s))
    if total[s] > best[s][0]:
      best[s] = (total[s], dict(live[s]))
    for copy in reads[i, s]:
      readers_left[copy] -= 1
      if not readers_left[copy] and copy[0] not in final:
        pending_free.append(copy)
  return max(best, key=lambda b: b[0])
