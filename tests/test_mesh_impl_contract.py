"""One contract for every mesh implementation, checked against NumPy.

The back ends: PlacementMeshImpl in eager, tf.function and graph mode (and
with the ring collectives, in tf.function), SimdMeshImpl with host
collectives (run in a tf.function; processors on the devices in order and in
reversed order), and SimdMeshImpl with TPU collectives simulated on the host
(processors in reversed physical order). Meshes: 1-D "all:8" and 2-D
"rows:2;cols:4".

- Collectives: processor p holds block VALUES[p] (distinct per processor);
  one program per back end and mesh runs allreduce (SUM, MAX, MIN; float
  and int), reduce_scatter (SUM, MAX, MIN on the first and last axis; int
  SUM), allconcat (and stacked), alltoall, allsplit, receive,
  shift_by_n_processors and the processor numbers and coordinates, and each
  processor's result is compared with a NumPy model of its group.
- Random tensors: every back end and layout gives the full tensor drawn on
  one processor, and each processor holds its block of it.
- Import / export: each processor holds its block of an imported tensor and
  the exported tensor is the full one (on every processor, for SIMD).
- Laid-out variables: created with the initial value's blocks, assigned,
  read back and exported.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.randomness import stateless_random
from tests import simulated_tpu

MESHES = ["all:8", "rows:2;cols:4"]
BLOCK = [8, 8]  # Every axis divides by every mesh dimension size.
_RNG = np.random.RandomState(0)
VALUES = np.stack([100 * p + _RNG.uniform(0, 10, size=BLOCK)
                   for p in range(8)]).astype(np.float32)
INT_VALUES = np.stack([100 * p + _RNG.randint(0, 50, size=BLOCK)
                       for p in range(8)]).astype(np.int32)


def _placement(**kwargs):
  return lambda mesh_shape, layout: placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, **kwargs)


def _simd_host(mesh_shape, layout):
  return simd_mesh_impl.SimdMeshImpl(mesh_shape, layout,
                                     collective_timeout_seconds=60)


def _simd_host_reversed(mesh_shape, layout):
  """Logical processor p on device size-1-p (TF ranks group members by
  device, not by processor number)."""
  size = mtf.convert_to_shape(mesh_shape).size
  return simd_mesh_impl.SimdMeshImpl(
      mesh_shape, layout, logical_to_physical=list(range(size))[::-1],
      collective_timeout_seconds=60)


def _simd_simulated_tpu(mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  impl = simd_mesh_impl.SimdMeshImpl(
      mesh_shape, layout, devices=simulated_tpu.cpu_devices(size),
      collectives="tpu", logical_to_physical=list(range(size))[::-1])
  return simulated_tpu.install(impl)


# name -> (make_impl(mesh_shape, layout), mode)
BACKENDS = {
    "placement_eager": (_placement(), "eager"),
    "placement_function": (_placement(), "function"),
    "placement_graph": (_placement(), "graph"),
    "placement_ring": (_placement(allreduce_algorithm="ring"), "function"),
    "simd_host": (_simd_host, "simd"),
    "simd_host_reversed": (_simd_host_reversed, "simd"),
    "simd_tpu_simulated": (_simd_simulated_tpu, "simd"),
}


def _execute(mode, impl, build, steps=1, finish=None, setup=None):
  """Runs `build` in `mode`, `steps` times.

  Args:
    mode: "eager", "function", "graph" or "simd".
    impl: the mesh implementation `build` lowers onto.
    build: fn() -> (slices, exported, update): dicts name -> laid-out value
      (returned per processor) and name -> full tf.Tensor, and a TF op to
      run after they are read each step, or None.
    steps: how many times to run.
    finish: optional fn(evaluate) called after the last step, with
      `evaluate` turning a structure of tf values into NumPy.
    setup: graph mode: optional fn() -> an op to run once after the
      variables are initialized.

  Returns:
    (one (slices, exported) pair of NumPy structures per step, where
    slices[name] lists every processor's slice; what `finish` returned).
  """
  def as_numpy(structure):
    return tf.nest.map_structure(np.asarray, structure)

  def tensor_lists(slices):
    return {k: v.to_laid_out_tensor().tensor_list for k, v in slices.items()}

  if mode == "simd":
    def program():
      slices, exported, _ = build()
      return ({k: v.to_laid_out_tensor().one_slice
               for k, v in slices.items()}, exported)
    step = tf.function(lambda: impl.run_each(program))
    results = []
    for _ in range(steps):
      each = as_numpy(step())
      for pnum, (_, exported) in enumerate(each):
        for k, v in exported.items():  # Assembled alike on every processor.
          np.testing.assert_array_equal(v, each[0][1][k],
                                        err_msg=f"{k} on processor {pnum}")
      results.append(({k: [e[0][k] for e in each] for k in each[0][0]},
                      each[0][1]))
    return results, finish and finish(as_numpy)
  if mode == "eager":
    results = []
    for _ in range(steps):
      slices, exported, _ = build()
      results.append(as_numpy((tensor_lists(slices), exported)))
    return results, finish and finish(as_numpy)
  if mode == "function":
    step = tf.function(lambda: (lambda s, e, _: (tensor_lists(s), e))(
        *build()))
    results = [as_numpy(step()) for _ in range(steps)]
    return results, finish and finish(as_numpy)
  assert mode == "graph", mode
  with tf.Graph().as_default():
    slices, exported, update = build()
    fetch = (tensor_lists(slices), exported)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      if setup is not None:
        sess.run(setup())
      results = []
      for _ in range(steps):
        results.append(sess.run(fetch))
        if update is not None:
          sess.run(update)
      return results, finish and finish(sess.run)


def _group_of(impl, mesh_axes, pnum):
  (group,) = [g for g in impl.processor_groups(mesh_axes) if pnum in g]
  return group


def _pcoord(impl, pnum, mesh_axis):
  return mtf.pnum_to_processor_coordinates(impl.shape, pnum)[mesh_axis]


# ------------------------------------------------------------ collectives
# Each case: (name, fn(impl, x, x_int) -> laid-out value,
#             fn(impl, pnum) -> the NumPy value processor pnum must hold).

_NP_REDUCE = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}


def _receive_sources(n):
  """Member i gets member n-1-i's slice; the last member gets zeros."""
  return [n - 1 - i for i in range(n - 1)] + [None]


def _received(impl, pnum, mesh_axis, sources, values):
  group = _group_of(impl, [mesh_axis], pnum)
  source = sources[group.index(pnum)]
  return (np.zeros_like(values[pnum]) if source is None
          else values[group[source]])


def _shift_sources(n, offset, wrap):
  sources = []
  for i in range(n):
    c = i - offset
    sources.append(c % n if wrap else (c if 0 <= c < n else None))
  return sources


def _collective_cases(impl):
  cases = []
  axes_sets = [[a] for a in range(impl.ndims)]
  if impl.ndims > 1:
    axes_sets.append(list(range(impl.ndims)))
  for axes in axes_sets:
    tag = "".join(map(str, axes))
    for reduction, np_fn in sorted(_NP_REDUCE.items()):
      cases.append((
          f"allreduce_{reduction}_{tag}",
          lambda i, x, xi, axes=axes, r=reduction: i.allreduce(x, axes, r),
          lambda i, p, axes=axes, f=np_fn: f(
              VALUES[_group_of(i, axes, p)], axis=0)))
    cases.append((
        f"allreduce_int_SUM_{tag}",
        lambda i, x, xi, axes=axes: i.allreduce(xi, axes, "SUM"),
        lambda i, p, axes=axes: INT_VALUES[_group_of(i, axes, p)].sum(
            0, dtype=np.int32)))
    cases.append((
        f"allreduce_int_MAX_{tag}",
        lambda i, x, xi, axes=axes: i.allreduce(xi, axes, "MAX"),
        lambda i, p, axes=axes: INT_VALUES[_group_of(i, axes, p)].max(0)))
  for a in range(impl.ndims):
    n = impl.shape[a].size
    group = lambda i, p, a=a: _group_of(i, [a], p)
    for axis in (0, 1):
      cases.append((
          f"allconcat_{a}_{axis}",
          lambda i, x, xi, a=a, axis=axis: i.allconcat(x, a, axis),
          lambda i, p, axis=axis, group=group: np.concatenate(
              list(VALUES[group(i, p)]), axis=axis)))
      cases.append((
          f"allsplit_{a}_{axis}",
          lambda i, x, xi, a=a, axis=axis: i.allsplit(x, a, axis),
          lambda i, p, a=a, axis=axis, n=n: np.split(
              VALUES[p], n, axis=axis)[_pcoord(i, p, a)]))
    cases.append((
        f"allconcat_stack_{a}",
        lambda i, x, xi, a=a: i.allconcat(x, a, 1, stack=True),
        lambda i, p, group=group: np.stack(list(VALUES[group(i, p)]),
                                           axis=1)))
    for split, concat in ((1, 0), (0, 1)):
      cases.append((
          f"alltoall_{a}_{split}{concat}",
          lambda i, x, xi, a=a, s=split, c=concat: i.alltoall(x, a, s, c),
          lambda i, p, a=a, s=split, c=concat, n=n, group=group:
          np.concatenate([np.split(VALUES[q], n, axis=s)[_pcoord(i, p, a)]
                          for q in group(i, p)], axis=c)))
    for reduction, np_fn in sorted(_NP_REDUCE.items()):
      for split in (0, 1):  # The first and the last axis of a slice.
        cases.append((
            f"reduce_scatter_{reduction}_{a}_{split}",
            lambda i, x, xi, a=a, s=split, r=reduction: i.reduce_scatter(
                x, a, s, r),
            lambda i, p, a=a, s=split, f=np_fn, n=n, group=group: np.split(
                f(VALUES[group(i, p)], axis=0), n, axis=s)[
                    _pcoord(i, p, a)]))
    cases.append((
        f"reduce_scatter_int_SUM_{a}",
        lambda i, x, xi, a=a: i.reduce_scatter(xi, a, 1),
        lambda i, p, a=a, n=n, group=group: np.split(
            INT_VALUES[group(i, p)].sum(0, dtype=np.int32), n, axis=1)[
                _pcoord(i, p, a)]))
    sources = _receive_sources(n)
    cases.append((
        f"receive_{a}",
        lambda i, x, xi, a=a, s=sources: i.receive(x, a, s),
        lambda i, p, a=a, s=sources: _received(i, p, a, s, VALUES)))
    for offset, wrap in ((1, True), (-1, False)):
      shift_sources = _shift_sources(n, offset, wrap)
      cases.append((
          f"shift_{a}_{offset}_{wrap}",
          lambda i, x, xi, a=a, o=offset, w=wrap: i.shift_by_n_processors(
              x, a, o, w),
          lambda i, p, a=a, s=shift_sources: _received(i, p, a, s, VALUES)))
    cases.append((
        f"pcoord_{a}",
        lambda i, x, xi, a=a: i.slicewise(
            lambda c: tf.cast(c, tf.int32), i.laid_out_pcoord(a)),
        lambda i, p, a=a: np.int32(_pcoord(i, p, a))))
  cases.append((
      "pnum",
      lambda i, x, xi: i.slicewise(lambda p: tf.cast(p, tf.int32),
                                   i.laid_out_pnum()),
      lambda i, p: np.int32(p)))
  return cases


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_collectives(backend, mesh_shape):
  make, mode = BACKENDS[backend]
  impl = make(mesh_shape, "")
  cases = _collective_cases(impl)

  def build():
    table = tf.constant(VALUES)
    int_table = tf.constant(INT_VALUES)
    pnum = impl.laid_out_pnum()
    x = impl.slicewise(lambda p: tf.gather(table, p), pnum)
    xi = impl.slicewise(lambda p: tf.gather(int_table, p), pnum)
    return {name: fn(impl, x, xi) for name, fn, _ in cases}, {}, None

  [(slices, _)], _ = _execute(mode, impl, build)
  for name, _, np_fn in cases:
    for pnum, got in enumerate(slices[name]):
      want = np_fn(impl, pnum)
      message = f"{name} on processor {pnum} ({backend}, {mesh_shape})"
      if name.startswith(("allreduce_SUM", "reduce_scatter_SUM")):
        # Summation order may differ.
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=message)
      else:
        np.testing.assert_array_equal(got, want, err_msg=message)
        assert got.dtype == np.asarray(want).dtype, message


# ------------------------------------------------ random, import, export

LAYOUTS = [("all:8", "b:all"), ("rows:2;cols:4", "a:rows;b:cols"),
           ("rows:2;cols:4", "b:rows")]
LAYOUT_IDS = ["1d", "2d", "2d_partly_replicated"]
SHAPE = mtf.convert_to_shape("a:8,b:16")
FULL = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
RANDOM = {  # name -> (tf_fn, kwargs)
    "uniform": (tf.random.uniform,
                {"seed": 11, "minval": -1.0, "maxval": 2.0}),
    "normal": (tf.compat.v1.random_normal,
               {"seed": 13, "mean": 1.0, "stddev": 2.0}),
}
# Checked on fewer back ends (each draw adds ~100 ops per processor to a
# PlacementMeshImpl program, and tracing them dominates this file's time).
MORE_RANDOM = {
    "uniform_int": (tf.compat.v1.random_uniform,
                    {"seed": 12, "minval": 3, "maxval": 90,
                     "dtype": tf.int32}),
    "truncated_normal": (tf.random.truncated_normal,
                         {"seed": 14, "stddev": 3.0}),
}


def _one_processor_draw(tf_fn, kwargs):
  distribution, seed, dtype, params = stateless_random.parse_tf_fn(tf_fn,
                                                                   kwargs)
  full = SHAPE.to_integer_list
  return stateless_random.sample(distribution, seed, full, full, [0, 0],
                                 dtype=dtype, **params).numpy()


_EXPECTED_RANDOM = {}
INIT = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 8.0


def _block(impl, full, pnum):
  begin = impl.slice_begin(SHAPE, pnum)
  size = impl.slice_shape(SHAPE)
  return full[tuple(slice(b, b + s) for b, s in zip(begin, size))]


def _check_slices_and_full(impl, slices, full, message):
  for pnum, got in enumerate(slices):
    np.testing.assert_array_equal(got, _block(impl, full, pnum),
                                  err_msg=f"{message}, processor {pnum}")


def _check_values_and_variables(backend, mesh_shape, layout, draws,
                                variables=True):
  """Random draws, an imported tensor and (if `variables`) a laid-out
  variable: each processor holds its block, exports give the full tensor.

  The variable is created from INIT (its slice variables hold INIT's
  blocks), assigned v <- 2 v + 1 on each of two steps, and read back
  through the laid-out variable protocol; in graph mode the master is
  updated by copy_slices_to_masters.
  """
  make, mode = BACKENDS[backend]
  impl = make(mesh_shape, layout)
  for k, v in draws.items():
    if k not in _EXPECTED_RANDOM:
      _EXPECTED_RANDOM[k] = _one_processor_draw(*v)
  lowerings, laid_out_variables = [], []

  def build():
    laid_out = {k: impl.random(SHAPE, tf_fn, kwargs)
                for k, (tf_fn, kwargs) in draws.items()}
    laid_out["imported"] = impl.import_tf_tensor(SHAPE, tf.constant(FULL))
    exported = {k: impl.export_to_tf_tensor(SHAPE, v)
                for k, v in laid_out.items()}
    update = None
    if variables:
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      v = mtf.get_variable(mesh, "v", SHAPE,
                           initializer=tf.constant_initializer(INIT))
      assign = mtf.assign(v, v * 2.0 + 1.0)
      lowering = mtf.Lowering(graph, {mesh: impl})
      lowerings.append(lowering)
      laid_out_variable = lowering.variables[v.operation]
      assert isinstance(laid_out_variable, mtf.mesh_impl.LaidOutVariable)
      laid_out_variables.append(laid_out_variable)
      laid_out["v"] = lowering.laid_out_tensor(v)
      exported["v"] = lowering.export_to_tf_tensor(v)
      update = lowering.lowered_operation(assign)
    return laid_out, exported, update

  def finish(evaluate):
    if not variables:
      return None
    laid_out = laid_out_variables[-1]
    values = {"slices": [v.read_value() for v in laid_out.slice_variables]}
    if mode == "graph":
      values["master"] = laid_out.master
      tf.compat.v1.get_default_session().run(
          lowerings[-1].copy_slices_to_masters())
    return evaluate(values)

  steps, final = _execute(
      mode, impl, build, steps=2 if variables else 1, finish=finish,
      setup=lambda: (lowerings[-1].copy_masters_to_slices() if lowerings
                     else tf.no_op()))
  where = f"({backend}, {mesh_shape}, {layout!r})"
  expected = {k: _EXPECTED_RANDOM[k] for k in draws}
  expected["imported"] = FULL
  for step, (slices, exported) in enumerate(steps):
    if variables:
      expected["v"] = [INIT, 2 * INIT + 1][step]
    for name, full in expected.items():
      message = f"{name} step {step} {where}"
      np.testing.assert_array_equal(exported[name], full, err_msg=message)
      _check_slices_and_full(impl, slices[name], full, message)
  if variables:
    assert len(final["slices"]) == impl.size
    _check_slices_and_full(impl, final["slices"], 4 * INIT + 3,
                           f"slice variables {where}")
    if mode == "graph":
      np.testing.assert_array_equal(final["master"], 4 * INIT + 3)


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_random_import_export_variables(backend, mesh_shape, layout):
  _check_values_and_variables(backend, mesh_shape, layout, RANDOM)


@pytest.mark.parametrize("backend", ["placement_eager", "simd_host"])
def test_more_random_distributions(backend):
  _check_values_and_variables(backend, "rows:2;cols:4", "a:rows;b:cols",
                              MORE_RANDOM, variables=False)


def test_random_values_have_their_distributions():
  u = _one_processor_draw(*RANDOM["uniform"])
  assert -1.0 <= u.min() and u.max() < 2.0
  ints = _one_processor_draw(*MORE_RANDOM["uniform_int"])
  assert ints.dtype == np.int32 and 3 <= ints.min() and ints.max() < 90
  t = _one_processor_draw(*MORE_RANDOM["truncated_normal"])
  assert np.abs(t).max() <= 6.0 and t.std() > 1.5
  big = stateless_random.sample("truncated_normal", 3, [20000], [20000], [0],
                                dtype=tf.float64).numpy()
  assert np.abs(big).max() <= 2.0
  # The normal truncated to [-2, 2] has standard deviation 0.8796.
  assert abs(big.std() - 0.8796) < 0.02 and abs(big.mean()) < 0.02


# ---------------------------------------------------- shared replicas

def test_placement_reduce_scatter_of_shared_replicas_is_done_once():
  """Groups whose members hold the very same (shared) slices reduce them
  once; the values are those of distinct copies."""
  impl = placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "",
                                               share_replicas=True)
  table = tf.constant(VALUES[:4])
  # Each processor's slice depends on its "cols" coordinate only, so the
  # two groups along "cols" hold the same four tensors.
  x = impl.slicewise(lambda c: tf.gather(table, c), impl.laid_out_pcoord(1))
  y = impl.reduce_scatter(x, 1, 0, "SUM")
  assert y.tensor_list[:4] == y.tensor_list[4:]
  assert len({id(t) for t in y.tensor_list}) == 4
  for pnum, got in enumerate(y.tensor_list):
    np.testing.assert_allclose(
        got.numpy(), np.split(VALUES[:4].sum(0), 4)[pnum % 4], rtol=1e-6)


# ---------------------------------------------------------- wire bytes

def _wire_cases(impl):
  """(name, fn(impl, x), counter kind, mesh axes, per-processor wire bytes
  of a bandwidth-optimal algorithm as a Fraction of the slice bytes s,
  for group size n; for receive, of the members that receive)."""
  from fractions import Fraction  # pylint: disable=g-import-not-at-top
  cases = []
  for a in range(impl.ndims):
    n = impl.shape[a].size
    sources = _receive_sources(n)
    receiving = sum(1 for i, c in enumerate(sources)
                    if c is not None and c != i)
    cases += [
        ("allreduce", lambda i, x, a=a: i.allreduce(x, [a], "SUM"),
         [a], Fraction(2 * (n - 1), n)),
        ("reduce_scatter", lambda i, x, a=a: i.reduce_scatter(x, a, 0),
         [a], Fraction(n - 1, n)),
        ("allconcat", lambda i, x, a=a: i.allconcat(x, a, 1),
         [a], Fraction(n - 1)),
        ("alltoall", lambda i, x, a=a: i.alltoall(x, a, 0, 1),
         [a], Fraction(n - 1, n)),
        ("receive", lambda i, x, a=a, s=sources: i.receive(x, a, s),
         [a], Fraction(receiving, n)),
    ]
  if impl.ndims > 1:
    n = impl.size
    cases.append(("allreduce", lambda i, x: i.allreduce(
        x, list(range(i.ndims)), "MAX"), list(range(impl.ndims)),
                  Fraction(2 * (n - 1), n)))
  return cases


@pytest.mark.parametrize("mesh_shape", MESHES)
@pytest.mark.parametrize("backend", ["placement_function", "simd_host"])
def test_wire_bytes_counters(backend, mesh_shape):
  """Every collective counts calls, input bytes and the exact wire bytes
  of a bandwidth-optimal algorithm; a reduce_scatter plus the allconcat
  of its result has the allreduce's wire bytes."""
  make, mode = BACKENDS[backend]
  impl = make(mesh_shape, "")
  cases = _wire_cases(impl)
  recorded = []

  def counting(counters):
    return lambda k, v: counters.__setitem__(k, counters.get(k, 0) + v)

  def build():
    counters, composition = {}, {}
    recorded[:] = [counters, composition]
    counted = impl.counting(counting(counters))
    table = tf.constant(VALUES)
    x = counted.slicewise(lambda p: tf.gather(table, p),
                          counted.laid_out_pnum())
    out = {str(k): c[1](counted, x) for k, c in enumerate(cases)}
    composed = impl.counting(counting(composition))
    out["gathered"] = composed.allconcat(composed.reduce_scatter(x, 0, 1),
                                         0, 1)
    return out, {}, None

  _execute(mode, impl, build)
  counters, composition = recorded
  slice_bytes = VALUES[0].nbytes
  want = {}
  for kind, _, axes, per_processor in cases:
    key = "comm/{}/{}".format(
        kind, "_".join(impl.shape[a].name for a in axes))
    want[key + "/calls"] = want.get(key + "/calls", 0) + 1
    want[key + "/bytes"] = want.get(key + "/bytes", 0) + (
        slice_bytes * impl.size)
    wire = per_processor * slice_bytes * impl.size
    assert wire.denominator == 1, (kind, wire)
    want[key + "/wire_bytes"] = want.get(key + "/wire_bytes", 0) + int(wire)
  assert {k: v for k, v in counters.items() if k.startswith("comm/")} == want
  axis0 = impl.shape[0].name
  assert composition[f"comm/reduce_scatter/{axis0}/calls"] == 1
  assert composition[f"comm/allconcat/{axis0}/calls"] == 1
  assert (composition[f"comm/reduce_scatter/{axis0}/wire_bytes"] +
          composition[f"comm/allconcat/{axis0}/wire_bytes"]) == (
              counters[f"comm/allreduce/{axis0}/wire_bytes"])


def test_pretty_print_counters_totals_keep_bytes_and_wire_bytes_apart():
  lines = mtf.lowering.pretty_print_counters({
      "comm/allreduce/all/calls": 2, "comm/allreduce/all/bytes": 100,
      "comm/allreduce/all/wire_bytes": 175,
      "comm/allconcat/all/bytes": 10, "comm/allconcat/all/wire_bytes": 70,
      "compute/EinsumOperation/output_elements": 1000})
  assert "  comm/total_bytes: 110" in lines
  assert "  comm/total_wire_bytes: 245" in lines


def test_default_reduce_scatter_is_allreduce_then_allsplit():
  """A backend with only the original four collectives still lowers
  reduce_scatter (MeshImpl's default), with the same values."""
  impl = placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "")
  table = tf.constant(VALUES)
  x = impl.slicewise(lambda p: tf.gather(table, p), impl.laid_out_pnum())
  counters = {}
  default = mtf.mesh_impl.MeshImpl.reduce_scatter(
      impl.counting(counters.__setitem__), x, 1, 1, "MAX")
  assert set(counters) == {"comm/allreduce/cols/calls",
                           "comm/allreduce/cols/bytes",
                           "comm/allreduce/cols/wire_bytes"}
  own = impl.reduce_scatter(x, 1, 1, "MAX")
  for pnum in range(8):
    np.testing.assert_array_equal(default.tensor_list[pnum].numpy(),
                                  own.tensor_list[pnum].numpy())
  assert mtf.mesh_impl.MeshImpl.reduce_scatter(
      placement_mesh_impl.PlacementMeshImpl("a:1;b:8", ""), x, 0, 0) is x
