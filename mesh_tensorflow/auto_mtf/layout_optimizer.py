"""Chooses a layout by integer programming (OR-tools CP-SAT).

A layout maps tensor-dimension names to mesh dimensions. As in the original,
the variables are the names, not the tensors, which keeps the program small
however large the graph:

  x[d, m]  1 if tensor dimension d is split over mesh dimension m.
  y[S][a]  for every set S of dimension names used together by an operation
           or a tensor (or, for the time objective, on which an operation's
           cost depends), and every allowed assignment a of S to mesh
           dimensions: 1 if the x agree with a exactly.
  z        the peak bytes per processor.

Constraints: each d on at most one mesh dimension; no two names of one
tensor on the same mesh dimension; only assignments LayoutValidator
allows (divisibility, splittability); exactly one y[S][.] per set, and
x[d, m] the sum of the y[S][a] with a[d] = m for every d in S (so the x
agree with the chosen a); and at every step of a memory-minimizing
schedule, the bytes of the tensors in memory under the chosen assignments
are at most z (for the time objective only under a budget: else z is free
and they cannot bind).

Objectives:
  "memory" (the original's): minimize z, ties going to more splitting.
  "time" (new): minimize the predicted step time, the sum over operations of
      cost_model.operation_cost under the assignment of the names it
      depends on (cost_model.cost_dimension_names), priced by
      machine.MachineConstants (compute and each collective), subject to
      z <= memory_budget when one is given; ties going to more splitting.

Changed from the original: OR-tools' current snake_case API; the peak-memory
constraints are summed per dimension set (the bytes of a set's tensors
divide alike under an assignment) and dominated steps are dropped, which
keeps the program small for graphs of thousands of tensors; a solution is
checked with LayoutValidator before it is returned; a budget no layout meets
raises SolverError naming the budget and the smallest peak there is; two
names may share a mesh dimension unless one tensor has both (the original
forbade it within an operation, which excluded layouts lowering accepts:
a reshape from batch to experts over one mesh dimension, or one assignment
op updating the variables of heads and of vocab, as the shipped layouts
have); variables count as resident for the whole step (MemoryEstimator);
data-parallel sharding's memory is counted when asked for.

Uneven splits (a MemoryEstimator with allow_uneven): an assignment whose
mesh dimension does not divide a size is allowed (LayoutValidator), and
priced as the lowering pads it. Memory: the bytes of a tensor with such a
dimension are the product of its slice sizes, ceil(n/k) per split
dimension, so its memory is summed per dimension set and sizes of those
dimensions (a _PaddedKey) instead of per dimension set. Time: the cost
model prices padded slices, and the gathering around operations that do
not handle padding (cost_model).
"""

import collections
import itertools
import logging

import numpy as np

from mesh_tensorflow.strategies import data_parallel_sharding
from mesh_tensorflow import mesh_impl as mesh_impl_lib
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.auto_mtf import print_cp_model_solution
from mesh_tensorflow.auto_mtf import scheduler
from mesh_tensorflow.auto_mtf import solver_backend

OBJECTIVES = ("memory", "time")


class SolverError(Exception):
  """The solver found no layout, or none that meets the memory budget.

  Attributes:
    smallest_peak: for a budget no layout meets, the smallest peak bytes
      per processor any layout reaches (else None).
    smallest_layout: the layout string reaching it (else None).
  """

  def __init__(self, message, smallest_peak=None, smallest_layout=None):
    super().__init__(message)
    self.smallest_peak = smallest_peak
    self.smallest_layout = smallest_layout


class LayoutOptimizer(object):
  """Builds and solves the layout program for one graph and mesh.

  Example:
    estimator = memory_estimator.MemoryEstimator(mtf_graph, mesh_shape, [y])
    optimizer = LayoutOptimizer(estimator)
    layout = optimizer.solve()        # e.g. "batch:m1;d_ff:m2"
    optimizer.evaluate_layout(layout)  # its peak bytes per processor
  """

  def __init__(self, memory_estimator, scheduler_alg="LIST",
               objective="memory", memory_budget=None, machine=None,
               max_search_seconds=60.0, shard_weight_update=False,
               shard_parameters=False, fixed_rules=None, step_costs=None,
               proxy_scale=None):
    """Sets up the integer program.

    Args:
      memory_estimator: a memory_estimator.MemoryEstimator.
      scheduler_alg: one of scheduler.SCHEDULER_ALGORITHMS ("LIST", the
        original's, orders to save memory; "ASAP" as TF's executor runs).
      objective: "memory" (minimize peak memory, the original's) or "time"
        (minimize predicted step time).
      memory_budget: optional bytes per processor the peak must not exceed.
      machine: for objective "time", a machine.MachineConstants (or
        anything machine.machine_constants takes); None calibrates this
        machine for the mesh (cached on disk).
      max_search_seconds: the solver's time limit.
      shard_weight_update: count memory as mtf.shard_data_parallel would
        store it: the optimizer's slots sharded over the mesh dimensions a
        name containing "batch" is split over (ZeRO-1/2).
      shard_parameters: the variables too (ZeRO-3).
      fixed_rules: optional {tensor-dimension name: mesh dimension name}
        every layout must have (a pipeline's "stage" on the stage mesh
        dimension, say).
      step_costs: the step_costs of a time optimizer of the same
        estimator, machine, fixed rules and proxy_scale (reused).
      proxy_scale: optional proxy_layers.Scale: the estimator's graph is
        a proxy of fewer layers, priced (time and memory) as the model it
        stands for.

    Raises:
      ValueError: an unknown objective or a non-positive budget, or a
        fixed rule the graph and mesh do not allow.
      ImportError: OR-tools is not installed (pip install
        mesh-tensorflow-tf2[auto_mtf]).
    """
    if objective not in OBJECTIVES:
      raise ValueError(
          f"objective must be one of {OBJECTIVES}, got {objective!r}.")
    if memory_budget is not None and not memory_budget > 0:
      raise ValueError(
          f"memory_budget must be a positive number of bytes, got "
          f"{memory_budget!r}.")
    self._cp_model = solver_backend.cp_model_module()
    self._estimator = memory_estimator
    self._scheduler_alg = scheduler_alg
    self._objective = objective
    self._memory_budget = memory_budget
    self._max_search_seconds = max_search_seconds
    self._shard_parameters = bool(shard_parameters)
    self._shard_weight_update = bool(shard_weight_update) or (
        self._shard_parameters)
    self._layout_validator = memory_estimator.get_layout_validator()
    self._uneven = self._layout_validator.allow_uneven
    self._fixed_rules = self._checked_fixed_rules(fixed_rules or {})
    self._graph = memory_estimator.get_graph_interface()
    self._scale = proxy_scale
    self._mesh_sizes = self._layout_validator.mesh_dimension_name_to_size
    self._divisors_of = {}
    self._sharded_bytes_of = {}
    self._preprocess_input()
    self._step_costs = None
    if objective == "time":
      self._step_costs = step_costs or _step_cost_table(
          memory_estimator, self._layout_validator, machine,
          self._assignments_of, proxy_scale)
      self._dimension_sets |= set(self._step_costs)
    self._program = None  # Built on first use (see _model).

  @property
  def _model(self):
    """The CP-SAT program, built on first use: the planner prices many
    layouts with optimizers it never solves."""
    if self._program is None:
      self._program = self._cp_model.CpModel()
      self._initialize_variables()
      self._add_constraints()
      self._build_objective_function()
    return self._program

  def _checked_fixed_rules(self, fixed_rules):
    """The fixed rules, each an assignment the validator allows."""
    fixed = dict(fixed_rules)
    splittable = self._layout_validator.splittable_mtf_dimension_names
    for name, mesh_dim in sorted(fixed.items()):
      if (name not in splittable or
          not self._layout_validator.is_valid_assignment(name, mesh_dim)):
        raise ValueError(
            f"fixed rule {name}:{mesh_dim} is not allowed on mesh "
            f"{_mesh_string(self._layout_validator.mesh_dimension_name_to_size)}"
            f": {name!r} is not a splittable dimension of the graph, or "
            f"{mesh_dim!r} is not a mesh dimension that can split it.")
    return fixed

  # ------------------------------------------------------------ the program

  def _preprocess_input(self):
    """Dimension sets of operations and tensors, and their assignments."""
    splittable = self._layout_validator.splittable_mtf_dimension_names
    graph = self._graph
    # The same for every optimizer of one estimator: made once.
    cache = self._estimator.__dict__.setdefault("_dimension_sets_of", {})
    if not cache:
      cache["operations"] = {
          name: frozenset(
              graph.get_operation_mtf_dimension_names(name) & splittable)
          for name in graph.get_all_operation_names()}
      cache["tensors"] = {
          name: frozenset(
              set(graph.get_tensor_mtf_dimension_names(name)) & splittable)
          for name in graph.get_all_tensor_names()}
    self._operation_dimension_set = cache["operations"]
    self._tensor_dimension_set = dict(cache["tensors"])
    self.constraint_sets = self._interacting_sets()
    self._sharded_tensors = self._find_sharded_tensors(splittable)
    self._operation_dimension_sets = set(
        self._operation_dimension_set.values())
    self._dimension_sets = self._operation_dimension_sets | set(
        self._tensor_dimension_set.values())
    self._neighbours = collections.defaultdict(set)
    for dimension_set in self.constraint_sets:
      for name in dimension_set:
        self._neighbours[name].update(dimension_set - {name})
    self._assignments = {}

  def _interacting_sets(self):
    """Sets of names no two of which may share a mesh dimension: those of
    each tensor, the rule LayoutRules enforce. (The original used each
    operation's names, which also forbade what lowering handles: a reshape
    from batch to experts both split over one mesh dimension, as the
    shipped MoE layouts do, or an assignment of many variables at once.)"""
    return set(self._tensor_dimension_set.values()) - {frozenset()}

  def _assignments_of(self, dimension_set):
    """Every allowed assignment of `dimension_set` (made once): each name
    unsplit or on a mesh dimension it divides, two names on one mesh
    dimension only if no tensor has both (a set gathered from several
    tensors, as an operation's or a cost set is, may hold such a pair)."""
    found = self._assignments.get(dimension_set)
    if found is None:
      found = []
      names = sorted(dimension_set)
      options = {n: [m for m in self._mesh_sizes
                     if self._layout_validator.is_valid_assignment(n, m)]
                 for n in names}
      for n in names:
        if n in self._fixed_rules:
          options[n] = [self._fixed_rules[n]]

      def extend(index, assignment):
        if index == len(names):
          found.append(dict(assignment))
          return
        name = names[index]
        if name not in self._fixed_rules:
          extend(index + 1, assignment)
        taken = {assignment[d] for d in self._neighbours[name]
                 if d in assignment}
        for m in options[name]:
          if m not in taken:
            assignment[name] = m
            extend(index + 1, assignment)
            del assignment[name]

      extend(0, {})
      self._assignments[dimension_set] = found
    return found

  def _find_sharded_tensors(self, splittable):
    """{tensor name: mtf Tensor} of the variables data-parallel sharding
    stores as shards (slots; with shard_parameters, every variable). Their
    dimension sets gain the batch names, whose mesh dimensions shard them."""
    if not self._shard_weight_update:
      return {}
    self._data_names = frozenset(n for n in splittable if "batch" in n)
    graph = self._estimator.mtf_graph
    trainable = {id(v) for v in graph.trainable_variables}
    sharded = {}
    for variable in graph.all_variables:
      if self._shard_parameters or id(variable) not in trainable:
        tensor = variable.outputs[0]
        sharded[tensor.name] = tensor
        self._tensor_dimension_set[tensor.name] = (
            self._tensor_dimension_set[tensor.name] | self._data_names)
    return sharded

  def _tensor_bytes(self, tensor_name, assignment):
    """Bytes per processor of a tensor under an assignment of (at least)
    its dimension set, sharded as mtf.shard_data_parallel would."""
    tensor = self._sharded_tensors.get(tensor_name)
    if tensor is None:
      return self._slice_bytes(tensor_name, assignment)
    # The same for every optimizer of one estimator (mesh) and level: the
    # planner prices each level's layouts with optimizers of their own.
    cache = self._estimator.__dict__.setdefault("_sharded_bytes_of", {})
    key = (self._shard_parameters, tensor_name,
           tuple(sorted(assignment.items())))
    found = cache.get(key)
    if found is None:
      found = cache[key] = self._compute_sharded_bytes(tensor, assignment)
    return found

  def _compute_sharded_bytes(self, tensor, assignment):
    """_tensor_bytes of a sharded variable's tensor."""
    tensor_name = tensor.name
    data_mesh_dims = sorted({m for d, m in assignment.items()
                             if d in self._data_names})
    own = {d: m for d, m in assignment.items()
           if d in tensor.shape.dimension_names}
    if not data_mesh_dims:
      return self._slice_bytes(tensor_name, own)
    rules = shape_lib.LayoutRules(sorted(own.items()),
                                  allow_uneven=self._uneven)
    mesh_shape = _mesh_string(self._mesh_sizes)
    sharding = data_parallel_sharding.DataParallelSharding(
        mesh_shape, rules, shard_parameters=self._shard_parameters,
        data_mesh_dims=data_mesh_dims)
    update_shape = sharding.plan_variable(tensor_name, tensor.shape)
    impl = mesh_impl_lib.MeshImpl(mesh_shape, rules)
    return impl.slice_size(update_shape) * tensor.dtype.size

  def _slice_bytes(self, tensor_name, assignment):
    """Bytes per processor of a tensor under `assignment` (padded slices
    when uneven splits are allowed)."""
    if self._uneven:
      return self._graph.get_tensor_slice_size(tensor_name, assignment,
                                               self._mesh_sizes)
    return self._graph.get_tensor_size(tensor_name, assignment,
                                       self._mesh_sizes)

  def _memory_key(self, tensor_name):
    """(key, amount) of a tensor in the memory steps: its dimension set and
    whole bytes; with uneven splits, if one of its dimensions may be
    padded, a _PaddedKey of the set and those dimensions' sizes, and the
    bytes of the other dimensions (its slice's bytes are those times the
    product of the padded slice sizes)."""
    graph = self._graph
    dimension_set = self._tensor_dimension_set[tensor_name]
    whole = graph.get_tensor_size(tensor_name)
    if not self._uneven or not dimension_set:
      return dimension_set, whole
    sizes = dict(zip(graph.get_tensor_mtf_dimension_names(tensor_name),
                     graph.get_tensor_shape(tensor_name).as_list()))
    if not any(sizes[d] % k for d in dimension_set
               for k in self._mesh_sizes.values()):
      return dimension_set, whole
    split_sizes = tuple(sorted((d, sizes[d]) for d in dimension_set))
    return (_PaddedKey(dimension_set, split_sizes),
            whole // shape_lib.list_product(s for _, s in split_sizes))

  def _initialize_variables(self):
    model = self._model
    self._global_vars = {}
    for d in sorted(self._layout_validator.splittable_mtf_dimension_names):
      for m in self._mesh_sizes:
        self._global_vars[(d, m)] = model.new_bool_var(_global_var_name(d, m))
    # y[S][a] in the order of self._assignments_of(S); sets sorted, so
    # that the program (and the solver's pick among equal optima) does not
    # depend on Python's hash seed.
    self._local_vars = {}
    for dimension_set in sorted(self._dimension_sets, key=sorted):
      self._local_vars[dimension_set] = [
          model.new_bool_var(_local_var_name(dimension_set, a))
          for a in self._assignments_of(dimension_set)]
    upper_bound = sum(
        self._graph.get_tensor_size(t)
        for t in self._graph.get_all_tensor_names()
        if self._graph.is_tensor_on_canonical_device(t))
    self._memory_var = model.new_int_var(0, max(upper_bound, 1), "z")

  def _add_constraints(self):
    """The constraints of the module doc, in a fixed order (sets sorted):
    the program must not depend on Python's hash seed."""
    model = self._model
    x = self._global_vars
    for m in self._mesh_sizes:
      for dimension_set in sorted(self.constraint_sets, key=sorted):
        if len(dimension_set) > 1:
          model.add(sum(x[(d, m)] for d in sorted(dimension_set)) <= 1)
    for d, m in sorted(self._fixed_rules.items()):
      model.add(x[(d, m)] == 1)
    for d in sorted(self._layout_validator.splittable_mtf_dimension_names):
      model.add(sum(x[(d, m)] for m in self._mesh_sizes) <= 1)
      for m in self._mesh_sizes:
        if not self._layout_validator.is_valid_assignment(d, m):
          model.add(x[(d, m)] == 0)
    for dimension_set, local in self._local_vars.items():
      model.add_exactly_one(local)
      # The x agree with the chosen assignment exactly: x[d, m] is the sum
      # of the y whose assignment puts d on m. (Linking each y to the x by
      # implications says the same in many more clauses, which the
      # solver's presolve spent seconds probing.)
      putting = collections.defaultdict(list)
      for y, assignment in zip(local, self._assignments_of(dimension_set)):
        for d, m in assignment.items():
          putting[(d, m)].append(y)
      for d in sorted(dimension_set):
        for m in self._mesh_sizes:
          model.add(x[(d, m)] == self._cp_model.LinearExpr.sum(
              putting[(d, m)]))
    if self._objective == "memory" or self._memory_budget is not None:
      # Else z is free and these constraints cannot change the pick.
      # What most steps hold (the variables, and their slots, say) is one
      # expression bounded once, not repeated in every step's sum; so is
      # each prefix of a chain of tensors held in nested steps (_cohorts).
      chains, common, rest, _ = self._memory_steps()
      self._cohort_vars = {}
      for i, chain in enumerate(chains):
        total, bound = 0, 0
        for length, (key, amount) in enumerate(chain, 1):
          expression, most = self._memory_expression({key: amount})
          bound += most
          prefix = model.new_int_var(0, max(bound, 1),
                                     f"cohort_{i}_{length}")
          model.add(prefix == total + expression)
          self._cohort_vars[(i, length)] = (prefix, bound)
          total = prefix
      resident = 0
      if common:
        expression, most = self._memory_expression(common)
        resident = model.new_int_var(0, max(most, 1), "resident")
        model.add(resident == expression)
      for bytes_by_set in rest:
        expression = (self._memory_expression(bytes_by_set)[0]
                      if bytes_by_set else 0)
        model.add(expression + resident <= self._memory_var)
    if self._memory_budget is not None:
      model.add(self._memory_var <= int(self._memory_budget))

  def _memory_expression(self, bytes_by_set):
    """(bytes per processor of a step's tensors as a linear expression,
    its largest value)."""
    variables = []
    coefficients = []
    most = 0
    for key, whole_bytes in bytes_by_set.items():
      if isinstance(key, _Cohort):
        cohort, cohort_most = self._cohort_vars[key]
        variables.append(cohort)
        coefficients.append(whole_bytes)
        most += max(whole_bytes * cohort_most, 0)
        continue
      if isinstance(key, _ShardedTensor):
        dimension_set = self._tensor_dimension_set[key.name]
        terms = [whole_bytes * b for b in self._sharded_bytes(key.name)]
      elif isinstance(key, _PaddedKey):
        dimension_set = key.dimension_set
        terms = [whole_bytes * _padded_elements(key.sizes, a,
                                                self._mesh_sizes)
                 for a in self._assignments_of(dimension_set)]
      else:
        dimension_set = key
        terms = [-(-whole_bytes // divisor)
                 for divisor in self._divisors(key)]
      coefficients += terms
      most += max(terms, default=0)
      variables += self._local_vars[dimension_set]
    return (self._cp_model.LinearExpr.weighted_sum(variables, coefficients),
            most)

  def _divisors(self, dimension_set):
    """Per assignment of `dimension_set` (in order), how many slices it
    cuts a tensor of those names into (computed once)."""
    found = self._divisors_of.get(dimension_set)
    if found is None:
      found = self._divisors_of[dimension_set] = [
          _divisor(a, self._mesh_sizes)
          for a in self._assignments_of(dimension_set)]
    return found

  def _sharded_bytes(self, tensor_name):
    """Per assignment of a sharded variable's dimension set (in order),
    its bytes per processor (computed once)."""
    found = self._sharded_bytes_of.get(tensor_name)
    if found is None:
      dimension_set = self._tensor_dimension_set[tensor_name]
      found = self._sharded_bytes_of[tensor_name] = [
          self._tensor_bytes(tensor_name, a)
          for a in self._assignments_of(dimension_set)]
    return found

  def _memory_steps(self):
    """(chains, common, steps, (matrix, keys)): per schedule step,
    {dimension set: whole bytes of its tensors in memory, or
    _ShardedTensor: 1}, in schedule order; steps another step dominates
    (no less of every key) are dropped; keys held in nested steps are
    chained into _Cohort keys (see _cohorts); what most steps hold (each
    key's most frequent amount) is taken out of them into `common` (see
    _split_common); the matrix holds the steps' amounts of the keys
    before. The same for every optimizer of one graph, schedule, sharding
    and dimension sets (the planner's mesh shapes of one structure):
    computed once for them."""
    key = (self._scheduler_alg, self._shard_weight_update,
           self._shard_parameters, self._uneven, id(self._scale),
           frozenset(self._tensor_dimension_set.items()),
           tuple(sorted(self._mesh_sizes.values())) if self._uneven else ())
    for graph, steps_of in _MEMORY_STEPS:
      if graph is self._estimator.mtf_graph:
        if key not in steps_of:
          steps_of[key] = self._compute_memory_steps()
        return steps_of[key]
    steps_of = {key: self._compute_memory_steps()}
    _MEMORY_STEPS[:] = _MEMORY_STEPS[-(_MAX_SCHEDULED_GRAPHS - 1):] + [
        (self._estimator.mtf_graph, steps_of)]
    return steps_of[key]

  def _compute_memory_steps(self):
    graph = self._graph
    keyed = {}  # {tensor name: (key, amount)}
    weights = self._tensor_weights()
    for t in graph.get_all_tensor_names():
      if t in self._sharded_tensors:
        keyed[t] = (_ShardedTensor(t), weights.get(t, 1))
      elif graph.is_tensor_on_canonical_device(t):
        key, amount = self._memory_key(t)
        keyed[t] = (key, amount * weights.get(t, 1))
    # Keys as columns (in _key_order); consecutive steps differ by a few
    # tensors: update a row of totals, keep each distinct row once.
    keys = sorted({key for key, _ in keyed.values()},
                  key=lambda k: _key_order((k, 0)))
    column = {key: i for i, key in enumerate(keys)}
    keyed = {t: (column[key], amount) for t, (key, amount) in keyed.items()}
    totals = np.zeros(len(keys), dtype=np.int64)
    seen = set()
    rows = []
    for added, removed in self._schedule_deltas():
      for t in removed:
        if t in keyed:
          i, amount = keyed[t]
          totals[i] -= amount
      for t in added:
        if t in keyed:
          i, amount = keyed[t]
          totals[i] += amount
      row = totals.tobytes()
      if row not in seen:
        seen.add(row)
        rows.append(totals.copy())
    if not rows:
      return [], {}, [], (np.zeros((0, 0), dtype=np.int64), [])
    steps = _undominated(np.array(rows))
    return _split_common(*_cohorts(steps, keys)) + ((steps, keys),)

  def peak_lower_bound(self):
    """A lower bound of the peak bytes per processor of every layout (with
    this optimizer's sharding and fixed rules): the largest step with each
    of its keys at its least bytes on its own (a relaxation: the layout
    makes them agree). Cheap next to the program: a budget below it has
    no layout, which solve() so reports without building the program."""
    _, _, _, (steps, keys) = self._memory_steps()
    if not keys:
      return 0
    least = np.ones(len(keys), dtype=np.int64)
    divide = np.ones(len(keys), dtype=np.int64)
    for j, key in enumerate(keys):
      if isinstance(key, _ShardedTensor):
        least[j] = min(self._sharded_bytes(key.name))
      elif isinstance(key, _PaddedKey):
        least[j] = min(_padded_elements(key.sizes, a, self._mesh_sizes)
                       for a in self._assignments_of(key.dimension_set))
      else:
        divide[j] = max(self._divisors(key))
    return int(((-(-steps // divide)) * least).sum(axis=1).max())

  def _build_objective_function(self):
    scale = len(self._layout_validator.splittable_mtf_dimension_names) + 1
    splits = sum(self._global_vars.values())
    if self._objective == "memory":
      self._model.minimize(scale * self._memory_var - splits)
      return
    variables = []
    coefficients = []
    for dimension_set, local in self._local_vars.items():
      costs = self._step_costs.get(dimension_set)
      if costs is None:
        continue
      for y, assignment in zip(local, self._assignments_of(dimension_set)):
        variables.append(y)
        coefficients.append(
            _nanoseconds(costs[_local_var_name(dimension_set, assignment)]))
    self._model.minimize(
        scale * self._cp_model.LinearExpr.weighted_sum(
            variables, coefficients) - splits)

  @property
  def step_costs(self):
    """Objective "time": {dimension set: {assignment: seconds}}, the priced
    operations (see the step_costs argument)."""
    return self._step_costs

  def _schedule(self):
    """The memory-minimizing schedule (computed once per graph: it does
    not depend on the layout or the mesh)."""
    return _cached_schedule(self._graph, self._estimator.mtf_graph,
                            self._scheduler_alg)

  def _schedule_deltas(self):
    """The memory-minimizing schedule's contents, step by step, as
    (allocated, freed) tensor names (computed once per estimator: the
    schedule does not depend on the layout)."""
    cache = self._estimator.__dict__.setdefault("_schedule_deltas_of", {})
    if self._scheduler_alg not in cache:
      cache[self._scheduler_alg] = (
          self._graph.compute_memory_deltas_under_schedule(self._schedule()))
    return cache[self._scheduler_alg]

  def _tensor_weights(self):
    """{tensor name: weight} of a proxy graph's tensors that stand for
    several layers' ({} without a proxy_scale)."""
    if self._scale is None:
      return {}
    cache = self._estimator.__dict__.setdefault("_tensor_weights_of", {})
    key = (self._scheduler_alg, id(self._scale))
    if key not in cache:
      cache[key] = self._scale.tensor_weights(self._graph, self._schedule())
    return cache[key]

  # ---------------------------------------------------------------- solving

  def solve(self, print_solution=False, explain_budget=True):
    """Solves the program and returns the layout, e.g. "a:m2;c:m1".

    Args:
      print_solution: also print every variable and the objective.
      explain_budget: where no layout meets the budget, solve the memory
        program too, for the SolverError's smallest peak (False: leave it
        None; smallest_peak() gives it later, the planner asks only when
        it reports it).

    Raises:
      SolverError: no layout was found, none meets the memory budget, or
        the solver's layout fails validation.
    """
    if (self._memory_budget is not None and
        self.peak_lower_bound() > self._memory_budget):
      # Sound: no layout's peak is below the bound (peak_lower_bound).
      return self._over_budget(explain_budget)
    cp_model = self._cp_model
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = self._max_search_seconds
    solver.parameters.num_workers = 1  # deterministic among equal optima
    # Probing (in presolve and search) took seconds on programs of a few
    # thousand y and found nothing the search needed; the full linear
    # relaxation of the exactly-one and linking constraints bounds the
    # objective well, so the search proves the optimum in a fraction of the
    # time (seconds to tenths on the Transformer and MoE models of
    # benchmarks/auto_layout.py). The optimum is the same either way.
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.linearization_level = 2
    status = solver.solve(self._model)
    self._cp_solver = solver
    if status == cp_model.FEASIBLE:
      logging.warning("auto_mtf: the solver stopped at its time limit (%.0f "
                      "s); the layout may not be optimal.",
                      self._max_search_seconds)
    elif status != cp_model.OPTIMAL:
      if status == cp_model.INFEASIBLE and self._memory_budget is not None:
        return self._over_budget(explain_budget)
      raise SolverError(
          f"the layout solver found no layout (status "
          f"{solver.status_name(status)}).")
    if print_solution:
      print_cp_model_solution.print_solution(self._model, solver)
    layout = {d: m for (d, m), var in self._global_vars.items()
              if solver.value(var)}
    self._layout_validator.validate_layout(
        layout, self.constraint_sets)
    return _layout_string(layout)

  def _over_budget(self, explain_budget):
    """Raises the SolverError of a budget no layout meets."""
    if not explain_budget:
      raise SolverError(
          f"no layout fits memory_budget={int(self._memory_budget)} "
          f"bytes per processor on mesh {_mesh_string(self._mesh_sizes)}.")
    raise self._budget_error()

  def smallest_peak(self):
    """(peak bytes, layout) of the layout of least peak memory, with this
    optimizer's sharding and fixed rules."""
    unbounded = LayoutOptimizer(self._estimator, self._scheduler_alg,
                                objective="memory",
                                max_search_seconds=self._max_search_seconds,
                                shard_weight_update=self._shard_weight_update,
                                shard_parameters=self._shard_parameters,
                                fixed_rules=self._fixed_rules,
                                proxy_scale=self._scale)
    smallest_layout = unbounded.solve()
    return int(unbounded.evaluate_layout(smallest_layout)), smallest_layout

  def _budget_error(self):
    """SolverError naming the budget and the smallest peak any layout
    reaches."""
    smallest, smallest_layout = self.smallest_peak()
    return SolverError(
        f"no layout fits memory_budget={int(self._memory_budget)} bytes per "
        f"processor on mesh {_mesh_string(self._mesh_sizes)}; the smallest "
        f"peak is {int(smallest)} bytes (layout {smallest_layout!r}): raise "
        f"the budget or use more processors.",
        smallest_peak=int(smallest), smallest_layout=smallest_layout)

  # ------------------------------------------------------------- evaluating

  def evaluate_layout(self, layout):
    """The objective's value for `layout` (a "d:m;..." string, LayoutRules
    or pairs): peak bytes per processor for "memory", predicted seconds per
    step for "time". Unsplittable names are skipped with a warning."""
    if self._objective == "time":
      return self.evaluate_step_seconds(layout)
    return self.evaluate_peak_memory(layout)

  def evaluate_peak_memory(self, layout):
    """Peak bytes per processor of `layout` under the schedule."""
    layout = self._layout_dict(layout)
    graph = self._graph
    weights = self._tensor_weights()
    sizes = {}
    divisors = {}  # {dimension set: slices under the layout}
    for t in graph.get_all_tensor_names():
      if not graph.is_tensor_on_canonical_device(t):
        continue
      dimension_set = self._tensor_dimension_set[t]
      if self._uneven or t in self._sharded_tensors:
        assignment = {d: layout[d] for d in dimension_set if d in layout}
        size = self._tensor_bytes(t, assignment)
      else:
        divisor = divisors.get(dimension_set)
        if divisor is None:
          divisor = divisors[dimension_set] = _divisor(
              {d: layout[d] for d in dimension_set if d in layout},
              self._mesh_sizes)
        size = -(-graph.get_tensor_size(t) // divisor)
      sizes[t] = size * weights.get(t, 1)
    peak, _ = peak_under_schedule(self._schedule_deltas(), sizes)
    return peak


  def evaluate_step_seconds(self, layout):
    """Predicted seconds per step of `layout` (objective "time" only)."""
    if self._step_costs is None:
      raise ValueError(
          "evaluate_step_seconds needs a LayoutOptimizer built with "
          "objective='time'.")
    layout = self._layout_dict(layout)
    total = 0.0
    for dimension_set, costs in self._step_costs.items():
      assignment = {d: layout[d] for d in dimension_set if d in layout}
      key = _local_var_name(dimension_set, assignment)
      if key not in costs:
        raise ValueError(f"layout {_layout_string(layout)!r} is not allowed: "
                         f"assignment {key} of an operation is invalid.")
      total += costs[key]
    return total

  def _layout_dict(self, layout):
    splittable = self._layout_validator.splittable_mtf_dimension_names
    result = {}
    for d, m in shape_lib.convert_to_layout_rules(layout):
      if d in splittable:
        result[d] = m
      else:
        logging.warning("auto_mtf: skipping unsplittable dimension %s.", d)
    return result


# ------------------------------------------------------- schedule memory


# The schedules of the graphs searched last: {scheduler: schedule} per
# graph (a plan searches one graph on many mesh shapes).
_SCHEDULES = []
# The memory steps of the graphs searched last (see _memory_steps).
_MEMORY_STEPS = []
_MAX_SCHEDULED_GRAPHS = 4


def _cached_schedule(graph_interface, mtf_graph, scheduler_alg):
  """scheduler.minimize_peak_memory of a graph, computed once per graph
  (and operation count) and scheduler."""
  # pylint: disable=protected-access
  key = (len(graph_interface._operations), scheduler_alg,
         frozenset(graph_interface._final_tensor_names))
  # pylint: enable=protected-access
  for graph, schedules in _SCHEDULES:
    if graph is mtf_graph:
      if key not in schedules:
        schedules[key] = scheduler.minimize_peak_memory(graph_interface,
                                                        scheduler_alg)
      return schedules[key]
  schedules = {key: scheduler.minimize_peak_memory(graph_interface,
                                                   scheduler_alg)}
  _SCHEDULES[:] = _SCHEDULES[-(_MAX_SCHEDULED_GRAPHS - 1):] + [
      (mtf_graph, schedules)]
  return schedules[key]


def peak_under_schedule(deltas, sizes):
  """(peak bytes, index of the first step reaching it) of a schedule's
  (allocated, freed) names per step (GraphInterface.
  compute_memory_deltas_under_schedule) with {tensor name: bytes} (names
  absent count 0); (0, None) if empty."""
  total = 0
  peak, at = 0, None
  for step, (added, removed) in enumerate(deltas):
    total -= sum(sizes.get(t, 0) for t in removed)
    total += sum(sizes.get(t, 0) for t in added)
    if at is None or total > peak:
      peak, at = total, step
  return peak, at


# ------------------------------------------------------------- step costs


def _step_cost_table(estimator, validator, machine, assignments_of,
                     scale=None):
  """{dimension set: {local var name: predicted seconds}}: each operation's
  cost under every allowed assignment of the names it depends on, summed
  over the operations sharing those names."""
  # Imported here: the time objective's modules are not needed otherwise.
  from mesh_tensorflow.auto_mtf import step_cost  # pylint: disable=g-import-not-at-top
  table = step_cost.cost_table(estimator, validator, machine, assignments_of,
                               scale)
  return {dimension_set: {_local_var_name(dimension_set, assignment): seconds
                          for assignment, seconds in costs}
          for dimension_set, costs in table.items()}


# ---------------------------------------------------------------- helpers


class _ShardedTensor(collections.namedtuple("_ShardedTensor", ["name"])):
  """A memory step's key for one sharded variable (its bytes depend on its
  own dimensions' sizes, not only on how many processors split them)."""


class _PaddedKey(collections.namedtuple("_PaddedKey",
                                        ["dimension_set", "sizes"])):
  """A memory step's key for tensors of one dimension set whose dimensions
  of that set have these sizes ((name, size) pairs, sorted), one of which
  an uneven split may pad: their slices' bytes are their amount (bytes of
  the other dimensions) times the product of the slice sizes."""


def _key_order(item):
  """Sorts a memory step's (key, amount) items: dimension sets by their
  names, then sharded tensors by name, then padded keys by names and sizes
  (not by hash, which varies)."""
  key = item[0]
  if isinstance(key, _ShardedTensor):
    return (1, [key.name])
  if isinstance(key, _PaddedKey):
    return (2, sorted(key.dimension_set), list(key.sizes))
  return (0, sorted(key))


def _padded_elements(sizes, assignment, mesh_sizes):
  """The product of the slice sizes of the dimensions `sizes` ((name,
  size) pairs) under `assignment`: ceil(size / k) when split k ways."""
  product = 1
  for name, size in sizes:
    m = assignment.get(name)
    product *= size if m is None else -(-size // mesh_sizes[m])
  return product


_MAX_DOMINATING_STEPS = 512


def _undominated(steps):
  """The rows of `steps` (a steps x keys matrix of amounts) none of the
  _MAX_DOMINATING_STEPS largest kept before them dominates (has no less
  of every key), largest total first (the same total: in the given
  order)."""
  order = np.argsort(-steps.sum(axis=1), kind="stable")
  kept = np.zeros_like(steps)
  num_kept = 0
  for i in order:
    row = steps[i]
    # Against the largest kept steps only: a dominated step kept is a
    # redundant constraint, and comparing with every kept step is
    # quadratic in the steps (tens of thousands for T5-11B).
    compared = min(num_kept, _MAX_DOMINATING_STEPS)
    if compared and (kept[:compared] >= row).all(axis=1).any():
      continue
    kept[num_kept] = row
    num_kept += 1
  return kept[:num_kept]


class _Cohort(collections.namedtuple("_Cohort", ["index", "length"])):
  """A memory step's key for the first `length` keys of chain `index` of
  _cohorts, which a step holds (each at its one amount) and no others of
  the chain."""


def _cohorts(steps, keys):
  """(steps, keys, chains): keys every step holds at one amount or not at
  all are chained where the steps holding each hold the next's too
  (optimizer slots an ASAP schedule allocates one by one, never freed);
  a step holding the first k keys of a chain and no others has amount 1
  of _Cohort(chain, k) instead of those k keys. chains lists each's
  [(key, amount)], in order. Exact: a step's bytes are linear in its
  amounts, and the first k keys' bytes are one expression (the
  constraints bound each prefix once, not in every step)."""
  present = {}
  for j in range(steps.shape[1]):
    column = steps[:, j]
    held = column != 0
    values = np.unique(column[held])
    if len(values) == 1:
      present[j] = (held, int(values[0]))
  chains = []  # Lists of column indices, each held by a subset of the last.
  for j in sorted(present, key=lambda j: -int(present[j][0].sum())):
    held = present[j][0]
    for chain in chains:
      if not (held & ~present[chain[-1]][0]).any():
        chain.append(j)
        break
    else:
      chains.append([j])
  chains = [chain for chain in chains if len(chain) > 1]
  if not chains:
    return steps, keys, []
  merged = {j for chain in chains for j in chain}
  kept = [j for j in range(steps.shape[1]) if j not in merged]
  new_keys = [keys[j] for j in kept]
  new_columns = [steps[:, kept]]
  for index, chain in enumerate(chains):
    lengths = sum(present[j][0].astype(np.int64) for j in chain)
    for length in range(1, len(chain) + 1):
      new_keys.append(_Cohort(index, length))
      new_columns.append((lengths == length).astype(np.int64)[:, None])
  return (np.concatenate(new_columns, axis=1), new_keys,
          [[(keys[j], present[j][1]) for j in chain] for chain in chains])


def _split_common(steps, keys, cohorts=()):
  """(common, rest) of memory steps (a steps x keys matrix of amounts):
  `common` {key: amount} holds each key's amount in most steps (the
  largest of equally many; zeros left out), `rest` each step's
  difference from it ({key: amount}, zeros left out, amounts possibly
  negative), in order. A step's bytes are the common ones plus its
  rest's exactly: per key they are linear in the amount (a dimension
  set's rounding up cannot change them: its amounts are whole tensors'
  bytes, which every allowed assignment divides, or padded slices'
  factors). The variables and optimizer slots that most steps hold (most
  of each step's keys with sharding, one per variable) are so priced
  once, not per step."""
  common = np.zeros(steps.shape[1], dtype=np.int64)
  for j in range(steps.shape[1]):
    values, counts = np.unique(steps[:, j], return_counts=True)
    best = counts.max()
    common[j] = values[counts == best].max()
  rest = []
  for row in steps - common:
    nonzero = np.flatnonzero(row)
    rest.append({keys[j]: int(row[j]) for j in nonzero})
  return (list(cohorts),
          {keys[j]: int(common[j]) for j in np.flatnonzero(common)}, rest)


def _divisor(assignment, mesh_sizes):
  divisor = 1
  for m in assignment.values():
    divisor *= mesh_sizes[m]
  return divisor


def _nanoseconds(seconds):
  return int(round(seconds * 1e9))


def _layout_string(layout):
  return ";".join(sorted(f"{d}:{m}" for d, m in layout.items()))


def _mesh_string(mesh_sizes):
  return ";".join(f"{m}:{s}" for m, s in mesh_sizes.items())


def _global_var_name(splittable_dimension, mesh_dimension):
  """Name of x[d, m]: "x_(d:m)"."""
  return f"x_({splittable_dimension}:{mesh_dimension})"


def _local_var_name(splittable_dimensions, assignment):
  """Name of y[S][a]: "y_(" then S's names sorted, each with ":mesh" when
  assigned, comma-separated, then ")"."""
  parts = []
  for d in sorted(splittable_dimensions):
    parts.append(f"{d}:{assignment[d]}" if d in assignment else d)
  return "y_(" + ",".join(parts) + ")"


def _generate_assignments(splittable_dimensions, mesh_dimension_to_size):
  """Every map of some of `splittable_dimensions` to distinct mesh
  dimensions (a list of dicts; {} included)."""
  assignments = []
  dims = sorted(splittable_dimensions)
  mesh = list(mesh_dimension_to_size)
  for count in range(min(len(dims), len(mesh)) + 1):
    for chosen in itertools.combinations(dims, count):
      for targets in itertools.permutations(mesh, count):
        assignments.append(dict(zip(chosen, targets)))
  return assignments
