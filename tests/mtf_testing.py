"""Shared test helpers: devices, layouts, execution modes and a NumPy check.

Every op test runs the same mtf program under a table of meshes and layouts,
in each of TensorFlow's three execution modes on PlacementMeshImpl, and in
tf.function mode on SimdMeshImpl (host collectives; mode "simd"), and
compares the exported values (and gradients) with a NumPy reference computed
in float64.

Mode "graph_v1_shapes" is graph mode with TensorFlow 1's TensorShape
behaviour on (`tf.Tensor.shape[i]` is a `Dimension`), as programs that call
`tf.compat.v1.disable_v2_behavior()` have it. `layout_mode_params` adds it
for the layout in V1_SHAPES_LAYOUTS (the 2-D mesh, whose collectives run on
two mesh axes), not for all of them: it lowers the same way as "graph", and
the suite has a time budget (all standard layouts cost ~5 minutes of CPU
time, this one ~1.5).

For the same budget, `layout_mode_params` runs every layout eagerly on
PlacementMeshImpl, "simd" (SimdMeshImpl) on the 2-D layouts of
SIMD_MODE_LAYOUTS, and tf.function and graph mode on the layouts of
TRACED_MODE_LAYOUTS (the 2-D mesh). Both implementations lower an
operation by the same Python code and differ in their collectives, so what
a layout changes (which slices, which collectives) is checked eagerly on
every layout, SimdMeshImpl's collectives on the meshes whose groups run
over one mesh axis or the other, and what a mode changes (tracing, a
compat-mode Session, static shapes) on the layout that splits the most;
the other pairs add nothing these do not. tf.function and graph mode are
~40% of an op test's time, and SIMD on every layout was ~1/3 of the suite.

`uneven_layout_mode_params` chooses the same way among `uneven_layouts`
(LayoutRules with allow_uneven=True, for sizes the mesh does not divide),
SIMD on the 2-D layouts "b2m4" and "b4m2", tracing on "b2m4".
"""

import contextlib
import os
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_DEVICES = 8
# "simd" is tf.function mode on SimdMeshImpl; the others use
# PlacementMeshImpl.
PLACEMENT_MODES = ("eager", "function", "graph")
MODES = PLACEMENT_MODES + ("simd",)
# Graph mode with TF1's TensorShape behaviour (PlacementMeshImpl).
V1_SHAPES_MODE = "graph_v1_shapes"
# standard_layouts case ids that layout_mode_params also runs in
# V1_SHAPES_MODE.
V1_SHAPES_LAYOUTS = ("2d",)
# The modes that run a compat-mode tf.Graph in a Session.
GRAPH_MODES = ("graph", V1_SHAPES_MODE)
# The modes layout_mode_params runs under every layout; the others run on
# the standard_layouts case ids in TRACED_MODE_LAYOUTS.
EVERY_LAYOUT_MODES = ("eager", "simd")
TRACED_MODE_LAYOUTS = ("2d",)
# The standard and uneven case ids on which layout_mode_params and
# uneven_layout_mode_params run "simd": the 2-D meshes, whose collectives
# run over groups of either mesh axis (the other layouts lower by the same
# Python code, checked eagerly on PlacementMeshImpl).
SIMD_MODE_LAYOUTS = ("2d", "2d_swapped")
UNEVEN_SIMD_MODE_LAYOUTS = ("b2m4", "b4m2")


@contextlib.contextmanager
def v1_tensor_shapes():
  """Turns TF1's TensorShape behaviour on for the block.

  TensorFlow keeps it in a process-wide flag, so the previous behaviour is
  restored on the way out, whatever happens inside.
  """
  was_v2 = not isinstance(tf.TensorShape([1])[0], tf.compat.v1.Dimension)
  tf.compat.v1.disable_v2_tensorshape()
  try:
    yield
  finally:
    if was_v2:
      tf.compat.v1.enable_v2_tensorshape()


def tensor_shapes_of(mode):
  """A context with the TensorShape behaviour of `mode`, for tests that
  run a mode themselves (v1 in V1_SHAPES_MODE, unchanged otherwise)."""
  if mode == V1_SHAPES_MODE:
    return v1_tensor_shapes()
  return contextlib.nullcontext()


def configure_logical_devices(num_devices=NUM_DEVICES):
  """Splits the CPU into `num_devices` logical devices (before TF starts)."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  except RuntimeError:
    pass  # The runtime already started; the check below says if it is enough.
  have = len(tf.config.list_logical_devices("CPU"))
  if have < num_devices:
    raise RuntimeError(f"Tests need {num_devices} logical CPUs, have {have}.")


def standard_layouts(dim_names):
  """(id, mesh shape, layout rules) cases for tensors with `dim_names`.

  One processor; `all:8` splitting each dimension in turn; a 2-D mesh
  `rows:2;cols:4` splitting the first two dimensions both ways round.
  Dimensions used with `all:8` must have sizes divisible by 8.
  """
  cases = [("1proc", "all:1", "")]
  for name in dim_names:
    cases.append((f"all8_{name}", "all:8", f"{name}:all"))
  if len(dim_names) >= 2:
    a, b = dim_names[:2]
    cases.append(("2d", "rows:2;cols:4", f"{a}:rows;{b}:cols"))
    cases.append(("2d_swapped", "rows:2;cols:4", f"{b}:rows;{a}:cols"))
  else:
    cases.append(("2d", "rows:2;cols:4", f"{dim_names[0]}:cols"))
  return cases


_CURRENT_IMPL = []


def current_impl():
  """The mesh implementation check_op is lowering onto (for build_fns that
  lay out slices by hand)."""
  return _CURRENT_IMPL[-1]


def make_impl(mode, mesh_shape, layout, **kwargs):
  """The mesh implementation a test in `mode` runs on.

  Make it outside any tf.function: it owns the program's variables.
  """
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  if mode == "simd":
    return mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, **kwargs)
  return mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout,
                                                   **kwargs)


def run_in_mode(mode, build_and_lower, impl=None, each_processor=False):
  """Runs `build_and_lower()` -> (lowering, structure of tf tensors).

  Returns the structure as NumPy values, computed eagerly, inside a
  tf.function, or in a compat-mode tf.Graph with a Session (with TF1's
  TensorShape behaviour in V1_SHAPES_MODE). In "simd" mode
  (`impl` must be the SimdMeshImpl lowered onto, from `make_impl`) it is
  the program of one processor, run on all of them inside a tf.function;
  the result is processor 0's, or every processor's as a list when
  `each_processor`.
  """
  if mode == "simd":
    import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
    if not isinstance(impl, mtf.simd_mesh_impl.SimdMeshImpl):
      raise TypeError("simd mode runs on a SimdMeshImpl: pass impl="
                      f"make_impl('simd', ...), got {impl!r}.")
    def program():
      return build_and_lower()[1]

    def run_each():
      return impl.run_each(program)

    results = tf.function(run_each)()
    results = [tf.nest.map_structure(np.asarray, r) for r in results]
    return results if each_processor else results[0]
  if mode == "eager":
    _, result = build_and_lower()
    return tf.nest.map_structure(np.asarray, result)
  if mode == "function":
    def traced():
      return build_and_lower()[1]

    result = tf.function(traced)()
    return tf.nest.map_structure(np.asarray, result)
  if mode == V1_SHAPES_MODE:
    with v1_tensor_shapes():
      return run_in_mode("graph", build_and_lower)
  if mode == "graph":
    with tf.Graph().as_default():
      lowering, result = build_and_lower()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        return sess.run(result)
  raise ValueError(f"Unknown mode {mode!r}.")


def _cotangent(shape, seed):
  return np.random.RandomState(seed).uniform(-1.0, 1.0, size=shape)


def numeric_gradients(np_fn, inputs, cotangents, wrt, eps=1e-6):
  """d(sum_k <np_fn(inputs)[k], cotangents[k]>)/d(inputs[w]) by central
  differences in float64.

  Memoized: an op test runs the same reference under every layout and mode
  (up to 25 times), and these differences are a fifth of its time on a
  1,024-element input. The key is the reference's code and everything it
  closes over (see _fingerprint), the inputs, cotangents, `wrt` and `eps`.
  """
  try:
    key = _fingerprint((np_fn, inputs, cotangents, tuple(wrt), eps))
  except _Uncacheable:
    key = None
  if key is not None and key in _NUMERIC_GRADIENTS:
    return {k: v.copy() for k, v in _NUMERIC_GRADIENTS[key].items()}
  grads = _numeric_gradients(np_fn, inputs, cotangents, wrt, eps)
  if key is not None:
    _NUMERIC_GRADIENTS[key] = {k: v.copy() for k, v in grads.items()}
  return grads


_NUMERIC_GRADIENTS = {}


class _Uncacheable(Exception):
  """A value _fingerprint cannot describe by value or stable identity."""


def _fingerprint(value, _active=()):
  """A hashable key equal for two values only when they compute the same.

  Python functions by their file, code, defaults and closure (recursively),
  so a lambda re-made for each test case matches; the module-level names
  its code reads are its module's, which tests do not reassign. NumPy
  arrays by dtype, shape and bytes; containers and scalars by value;
  modules, classes and built-in or NumPy functions by identity (the key
  holds them, so an id is never reused). Anything else, or a value that
  contains itself, is _Uncacheable.
  """
  if value is None or isinstance(value, (bool, int, float, complex, str,
                                         bytes)):
    return (type(value).__name__, value)
  if isinstance(value, np.generic):
    return ("np.generic", value.dtype.str, value.tobytes())
  if isinstance(value, np.ndarray):
    return ("ndarray", value.dtype.str, value.shape, value.tobytes())
  if id(value) in _active:
    raise _Uncacheable("a value that contains itself")
  active = _active + (id(value),)
  if isinstance(value, (list, tuple)):
    return (type(value).__name__,) + tuple(
        _fingerprint(v, active) for v in value)
  if isinstance(value, dict):
    return ("dict",) + tuple((_fingerprint(k, active),
                              _fingerprint(v, active))
                             for k, v in value.items())
  if isinstance(value, types.FunctionType):
    code = value.__code__
    return ("function", code.co_filename, value.__module__, code,
            _fingerprint(value.__defaults__, active),
            _fingerprint(value.__kwdefaults__, active),
            tuple(_fingerprint(_cell_contents(c), active)
                  for c in value.__closure__ or ()))
  if isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType,
                        np.ufunc)) or (callable(value) and getattr(
                            value, "__module__", "").startswith("numpy")):
    return ("object", value)
  raise _Uncacheable(type(value))


def _cell_contents(cell):
  try:
    return cell.cell_contents
  except ValueError:  # Not assigned yet.
    raise _Uncacheable("an empty closure cell") from None


def _numeric_gradients(np_fn, inputs, cotangents, wrt, eps):
  """numeric_gradients without the memo."""
  inputs64 = {k: np.asarray(v, np.float64) if np.issubdtype(
      np.asarray(v).dtype, np.floating) else v for k, v in inputs.items()}

  def objective(values):
    outputs = np_fn(**values)
    return sum(float(np.sum(np.asarray(outputs[k], np.float64) * c))
               for k, c in cotangents.items())

  grads = {}
  for name in wrt:
    base = inputs64[name]
    grad = np.zeros_like(base)
    for index in np.ndindex(base.shape):
      plus = dict(inputs64)
      minus = dict(inputs64)
      plus[name] = base.copy()
      minus[name] = base.copy()
      plus[name][index] += eps
      minus[name][index] -= eps
      grad[index] = (objective(plus) - objective(minus)) / (2 * eps)
    grads[name] = grad
  return grads


def check_op(build_fn, np_fn, inputs, mesh_shape, layout, mode,
             grad_wrt=None, np_grad_fn=None, rtol=1e-5, atol=1e-5,
             grad_rtol=1e-4, grad_atol=1e-4):
  """Checks an mtf program against NumPy under one layout and mode.

  Args:
    build_fn: fn(mesh, tensors) -> dict of mtf output Tensors, where
      `tensors` maps each input name to an imported mtf Tensor.
    np_fn: fn(**arrays) -> dict of NumPy outputs with the same keys.
    inputs: dict name -> (NumPy array, list of dimension names).
    mesh_shape, layout: the mesh and its layout rules.
    mode: one of MODES, or V1_SHAPES_MODE.
    grad_wrt: names of float inputs to check gradients for (default: all
      float inputs when any output is float; [] disables).
    np_grad_fn: optional fn(cotangents, **arrays) -> dict of expected
      gradients, for ops NumPy cannot differentiate numerically (e.g.
      stop_gradient); default: central differences of `np_fn`.
  """
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  arrays = {k: v[0] for k, v in inputs.items()}
  float_inputs = [k for k, a in arrays.items()
                  if np.issubdtype(np.asarray(a).dtype, np.floating)]
  expected = np_fn(**arrays)
  float_outputs = [k for k, v in expected.items()
                   if np.issubdtype(np.asarray(v).dtype, np.floating)]
  if grad_wrt is None:
    grad_wrt = float_inputs if float_outputs else []
  cotangents = {k: _cotangent(np.shape(expected[k]), seed=i)
                for i, k in enumerate(sorted(float_outputs))}

  begins = {}
  padded = {}
  # One mesh implementation, made outside any tf.function: it owns the
  # program's variables (a tf.function traces twice when it creates them).
  impl = make_impl(mode, mesh_shape, layout)

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    tensors = {}
    for name, (array, dim_names) in inputs.items():
      array = np.asarray(array)
      shape = mtf.Shape([mtf.Dimension(n, s)
                         for n, s in zip(dim_names, array.shape)])
      tensors[name] = mtf.import_tf_tensor(mesh, tf.constant(array), shape,
                                           name=name)
    outputs = build_fn(mesh, tensors)
    grads = {}
    if grad_wrt:
      terms = []
      for k in sorted(float_outputs):
        y = outputs[k]
        c = mtf.import_tf_tensor(
            mesh, tf.constant(cotangents[k], dtype=y.dtype), y.shape)
        terms.append(mtf.reduce_sum(y * c))
      total = terms[0]
      for t in terms[1:]:
        total = total + t
      grad_list = mtf.gradients([total], [tensors[k] for k in grad_wrt])
      grads = {k: g for k, g in zip(grad_wrt, grad_list)}
    lowering = mtf.Lowering(graph, {mesh: impl})
    exported = {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}
    exported_grads = {k: lowering.export_to_tf_tensor(g)
                      for k, g in grads.items() if g is not None}
    slices = {k: lowering.laid_out_tensor(v).tensor_list
              for k, v in outputs.items()}
    begins.update({k: [impl.slice_begin(v.shape, p)
                       for p in range(impl.size)]
                   for k, v in outputs.items()})
    padded.update({k: impl.padded_axes(v.shape) for k, v in outputs.items()})
    return lowering, {"outputs": exported, "grads": exported_grads,
                      "slices": slices}

  _CURRENT_IMPL.append(impl)
  try:
    if mode == "simd":
      per_processor = run_in_mode(mode, build_and_lower, impl,
                                  each_processor=True)
      result = per_processor[0]
      # Each processor's program holds its own slice.
      result["slices"] = {k: [r["slices"][k][0] for r in per_processor]
                          for k in result["slices"]}
    else:
      result = run_in_mode(mode, build_and_lower)
  finally:
    _CURRENT_IMPL.pop()
  where = f"[mesh {mesh_shape!r}, layout {layout!r}, mode {mode}]"
  for k, want in expected.items():
    got = result["outputs"][k]
    assert got.shape == np.shape(want), (
        f"{where} output {k!r}: shape {got.shape} != {np.shape(want)}")
    if np.issubdtype(np.asarray(want).dtype, np.floating):
      np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                 err_msg=f"{where} output {k!r}")
    else:
      np.testing.assert_array_equal(got, want, err_msg=f"{where} output {k!r}")
    assert_replicas_agree(result["slices"][k], begins[k],
                          f"{where} output {k!r}")
    assert_padding_is_zero(result["slices"][k], begins[k], padded[k],
                           f"{where} output {k!r}")
  if grad_wrt:
    if np_grad_fn is not None:
      want_grads = np_grad_fn(cotangents, **arrays)
    else:
      want_grads = numeric_gradients(np_fn, arrays, cotangents, grad_wrt)
    for k in grad_wrt:
      assert k in result["grads"], f"{where}: no gradient for input {k!r}"
      np.testing.assert_allclose(result["grads"][k], want_grads[k],
                                 rtol=grad_rtol, atol=grad_atol,
                                 err_msg=f"{where} gradient of {k!r}")
  return result


def check_ops(cases, mesh_shape, layout, mode, **kwargs):
  """check_op of several independent programs in one lowering and run.

  A check_op call costs mostly per call (a SIMD or tf.function program is
  traced, optimized and placed once per call), so a test of a table of
  ops under one layout and mode checks them together: each case is
  checked exactly as check_op would check it alone (its outputs against
  NumPy, replicas agreeing, gradients of its float inputs when it has a
  float output against central differences of its own reference), and a
  failure names the case in the output or gradient it reports.

  Args:
    cases: dict case name -> (build_fn, np_fn, inputs), check_op's
      arguments; its tensors and outputs are named "<case>__<name>".
    mesh_shape, layout, mode: as for check_op.
    **kwargs: check_op's tolerances, shared by every case.
  """
  merged_inputs = {}
  grad_wrt = []
  for case, (_, np_fn, inputs) in cases.items():
    arrays = {k: v[0] for k, v in inputs.items()}
    has_float_output = any(
        np.issubdtype(np.asarray(v).dtype, np.floating)
        for v in np_fn(**arrays).values())
    for name, value in inputs.items():
      merged_inputs[f"{case}__{name}"] = value
      if has_float_output and np.issubdtype(np.asarray(value[0]).dtype,
                                            np.floating):
        grad_wrt.append(f"{case}__{name}")

  def split(values, case):
    prefix = f"{case}__"
    return {k[len(prefix):]: v for k, v in values.items()
            if k.startswith(prefix)}

  def build(mesh, tensors):
    outputs = {}
    for case, (build_fn, _, _) in cases.items():
      got = build_fn(mesh, split(tensors, case))
      outputs.update({f"{case}__{k}": v for k, v in got.items()})
    return outputs

  def reference(**arrays):
    outputs = {}
    for case, (_, np_fn, _) in cases.items():
      got = np_fn(**split(arrays, case))
      outputs.update({f"{case}__{k}": v for k, v in got.items()})
    return outputs

  def grad_reference(cotangents, **arrays):
    # Per case, so each case's differences perturb its own reference only
    # (and hit numeric_gradients' memo of that case).
    grads = {}
    for case, (_, np_fn, _) in cases.items():
      wrt = [k for k in split({w: w for w in grad_wrt}, case)]
      if wrt:
        got = numeric_gradients(np_fn, split(arrays, case),
                                split(cotangents, case), wrt)
        grads.update({f"{case}__{k}": v for k, v in got.items()})
    return grads

  return check_op(build, reference, merged_inputs, mesh_shape, layout, mode,
                  grad_wrt=grad_wrt, np_grad_fn=grad_reference, **kwargs)


def check_op_table(table, mesh_shape, layout, mode, **kwargs):
  """check_ops of a table of positional cases: name -> (mtf_fn, np_fn,
  inputs), where both functions take the inputs in their dict order and
  return one output ("y")."""
  cases = {}
  for name, (mtf_fn, np_fn, inputs) in table.items():
    names = list(inputs)
    cases[name] = (
        lambda mesh, t, fn=mtf_fn, names=names: {
            "y": fn(*[t[n] for n in names])},
        lambda fn=np_fn, names=names, **arrays: {
            "y": fn(*[arrays[n] for n in names])},
        inputs)
  check_ops(cases, mesh_shape, layout, mode, **kwargs)


def assert_replicas_agree(slices, begins, what):
  """Slices at the same position of the full tensor must be identical."""
  first = {}
  for pnum, (s, begin) in enumerate(zip(slices, begins)):
    key = tuple(begin)
    if key in first:
      np.testing.assert_array_equal(
          np.asarray(s), np.asarray(slices[first[key]]),
          err_msg=f"{what}: replicated slices on processors {first[key]} and "
          f"{pnum} differ")
    else:
      first[key] = pnum


def assert_padding_is_zero(slices, begins, padded_axes, what):
  """The padding of unevenly split slices must be zero (False): the
  invariant every padded lowering relies on (see backend/padding.py)."""
  for pnum, (s, begin) in enumerate(zip(slices, begins)):
    s = np.asarray(s)
    for axis in padded_axes:
      valid = max(0, min(axis.slice_size, axis.size - begin[axis.tensor_axis]))
      pad = np.take(s, range(valid, axis.slice_size), axis=axis.tensor_axis)
      assert not np.any(pad), (
          f"{what}: processor {pnum} holds non-zero padding along axis "
          f"{axis.tensor_axis} (positions {valid}..{axis.slice_size - 1} of "
          f"its slice): {pad}")


def layout_mode_params(dim_names, modes=MODES,
                       v1_shapes_layouts=V1_SHAPES_LAYOUTS, layouts=None,
                       every_layout_modes=EVERY_LAYOUT_MODES,
                       traced_mode_layouts=TRACED_MODE_LAYOUTS,
                       simd_mode_layouts=SIMD_MODE_LAYOUTS):
  """pytest parameters (mesh_shape, layout, mode) with readable ids.

  Every standard layout (or only the case ids in `layouts`) in each of
  `modes` that is in `every_layout_modes`, except "simd", which runs on
  the layouts named in `simd_mode_layouts` (on every chosen layout when
  none of them is chosen; None: on every layout); the other modes on the
  layouts named in `traced_mode_layouts` (likewise; pass
  every_layout_modes=MODES and simd_mode_layouts=None for the full
  product); when `modes` has "graph", also the layouts named in
  `v1_shapes_layouts` in V1_SHAPES_MODE.
  """
  return _case_mode_params(
      standard_layouts(dim_names), "standard", dim_names, modes,
      v1_shapes_layouts, layouts, every_layout_modes, traced_mode_layouts,
      simd_mode_layouts)


# uneven_layouts case ids that uneven_layout_mode_params runs in the
# traced modes ("function", "graph", V1_SHAPES_MODE).
UNEVEN_TRACED_MODE_LAYOUTS = ("b2m4",)


def uneven_layouts(dim_names):
  """(id, mesh shape, LayoutRules) cases splitting `dim_names` unevenly.

  LayoutRules with allow_uneven=True, for tensors whose sizes the mesh
  dimensions need not divide (issue 40 checks sizes 5, 7, 12 and 100):
  `all:8` splitting each dimension in turn ("all8_<name>"); the 2-D meshes
  `b:2;m:4` ("b2m4") and `b:4;m:2` ("b4m2") splitting the first dimension
  over b and the second over m (a single dimension goes over m). Size 5
  over 8 leaves three processors wholly padding; 7 over 4 pads the last
  slice by one; 100 over 8 holds 13 per processor, the last 9 of them real.
  """
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  def rules(pairs):
    return mtf.LayoutRules(pairs, allow_uneven=True)

  cases = [(f"all8_{name}", "all:8", rules([(name, "all")]))
           for name in dim_names]
  if len(dim_names) >= 2:
    pairs = [(dim_names[0], "b"), (dim_names[1], "m")]
  else:
    pairs = [(dim_names[0], "m")]
  cases.append(("b2m4", "b:2;m:4", rules(pairs)))
  cases.append(("b4m2", "b:4;m:2", rules(pairs)))
  return cases


def uneven_layout_mode_params(
    dim_names, modes=MODES, v1_shapes_layouts=UNEVEN_TRACED_MODE_LAYOUTS,
    layouts=None, every_layout_modes=EVERY_LAYOUT_MODES,
    traced_mode_layouts=UNEVEN_TRACED_MODE_LAYOUTS,
    simd_mode_layouts=UNEVEN_SIMD_MODE_LAYOUTS):
  """pytest parameters (mesh_shape, layout, mode) over `uneven_layouts`.

  As layout_mode_params chooses them: every uneven layout (or the case ids
  in `layouts`) eagerly, "simd" on the 2-D layouts "b2m4" and "b4m2", and
  "function", "graph" and V1_SHAPES_MODE on "b2m4" only.
  """
  return _case_mode_params(
      uneven_layouts(dim_names), "uneven", dim_names, modes,
      v1_shapes_layouts, layouts, every_layout_modes, traced_mode_layouts,
      simd_mode_layouts)


def _chosen(cases, named):
  """The ids of `cases` among `named`, or all of them when none is (or
  `named` is None)."""
  ids = {case[0] for case in cases}
  return ids if named is None else (ids & set(named)) or ids


def _case_mode_params(cases, kind, dim_names, modes, v1_shapes_layouts,
                      layouts, every_layout_modes, traced_mode_layouts,
                      simd_mode_layouts=None):
  """layout_mode_params over (id, mesh shape, layout) `cases`."""
  import pytest  # pylint: disable=g-import-not-at-top
  if layouts is not None:
    unknown = set(layouts) - {case_id for case_id, _, _ in cases}
    if unknown:
      raise ValueError(f"No {kind} layouts {sorted(unknown)} for "
                       f"dimensions {dim_names}")
    cases = [case for case in cases if case[0] in layouts]
  traced_cases = _chosen(cases, traced_mode_layouts)
  simd_cases = _chosen(cases, simd_mode_layouts)

  def runs(case_id, mode):
    if mode == "simd" and mode in every_layout_modes:
      return case_id in simd_cases
    return mode in every_layout_modes or case_id in traced_cases

  params = [pytest.param(mesh, layout, mode, id=f"{case_id}-{mode}")
            for case_id, mesh, layout in cases for mode in modes
            if runs(case_id, mode)]
  if "graph" in modes and V1_SHAPES_MODE not in modes:
    params += [
        pytest.param(mesh, layout, V1_SHAPES_MODE,
                     id=f"{case_id}-{V1_SHAPES_MODE}")
        for case_id, mesh, layout in cases
        if case_id in v1_shapes_layouts]
  return params


def extra_layout_params(case_id, mesh_shape, layout, modes=MODES):
  """pytest parameters (mesh_shape, layout, mode) for a layout beside the
  standard ones: in the modes of `modes` that are in EVERY_LAYOUT_MODES,
  as layout_mode_params runs a layout outside TRACED_MODE_LAYOUTS (the
  test's standard 2-D layout runs in the other modes)."""
  import pytest  # pylint: disable=g-import-not-at-top
  return [pytest.param(mesh_shape, layout, mode, id=f"{case_id}-{mode}")
          for mode in modes if mode in EVERY_LAYOUT_MODES]


def mesh_layout_mode_params(layouts, modes=MODES, full_product=False):
  """pytest parameters (mesh_shape, layout, mode) for (mesh_shape, layout)
  pairs, as layout_mode_params chooses them: every pair eagerly, "simd" on
  the pairs whose mesh has two or more dimensions (their collectives run
  over groups of either mesh axis; the other pairs lower by the same
  Python code, checked eagerly), the other modes on the first pair whose
  mesh has two dimensions; a mode that would have no pair runs on every
  pair. Only the modes of `modes`; `full_product`: every mode on every
  pair."""
  import pytest  # pylint: disable=g-import-not-at-top
  every = set(range(len(layouts)))
  multi_d = {i for i, (mesh, _) in enumerate(layouts) if mesh.count(":") >= 2}
  two_d = [i for i, (mesh, _) in enumerate(layouts) if mesh.count(":") == 2]
  traced = set(two_d[:1]) or every

  def runs(i, mode):
    if mode == "simd":
      return full_product or i in (multi_d or every)
    return full_product or mode in EVERY_LAYOUT_MODES or i in traced

  return [pytest.param(mesh, layout, mode,
                       id=f"{mesh}-{layout or 'none'}-{mode}")
          for i, (mesh, layout) in enumerate(layouts) for mode in modes
          if runs(i, mode)]


def slicewise_layout_ids(dim_names):
  """The standard layouts that reach every lowering path of an op whose
  inputs and output all have `dim_names` (an element-wise op).

  Such an op lowers to the same TF op on each processor's slice whichever
  dimension is split and onto whichever mesh axis, so one processor, the
  first dimension split 8 ways (the others replicated) and the 2-D mesh
  (both split) cover it; splitting another dimension, or the 2-D mesh the
  other way round, only changes which slice a processor holds.
  """
  return ("1proc", f"all8_{dim_names[0]}", "2d")


def import_array(mesh, array, dims):
  """Imports a NumPy array as an mtf Tensor with dimensions `dims`."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  return mtf.import_tf_tensor(mesh, tf.constant(array), mtf.Shape(dims))


def run_program(mesh_shape, layout, mode, build, fetch_variables=True):
  """Builds, differentiates, lowers and runs a program with variables.

  One mesh implementation is made outside any tf.function (it owns the
  variables), as a user would have it.

  Args:
    mesh_shape, layout: the mesh and its layout rules.
    mode: one of MODES, or V1_SHAPES_MODE.
    build: fn(mesh) -> (outputs, loss, wrt): a dict of mtf Tensors to fetch,
      a scalar mtf loss (or None) and a dict of mtf Tensors to differentiate
      it by; gradients come back as "d_<name>".
    fetch_variables: also return every trainable variable's value under its
      name.

  Returns:
    (dict of NumPy values, the mtf Graph).
  """
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  impl = make_impl(mode, mesh_shape, layout)
  graphs = []

  def build_and_lower():
    graph = mtf.Graph()
    graphs.append(graph)
    mesh = mtf.Mesh(graph, "mesh")
    outputs, loss, wrt = build(mesh)
    outputs = dict(outputs)
    if fetch_variables:
      for var in graph.trainable_variables:
        outputs[var.name] = var.outputs[0]
    if loss is not None:
      names = sorted(wrt)
      grads = mtf.gradients([loss], [wrt[k] for k in names])
      outputs.update({"d_" + k: g for k, g in zip(names, grads)})
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, {k: lowering.export_to_tf_tensor(v)
                      for k, v in outputs.items()}

  return run_in_mode(mode, build_and_lower, impl), graphs[-1]


def np_shift(x, offset, axis, wrap):
  """NumPy reference of mtf.shift: `x` moved by `offset` along `axis`,
  wrapping around or filled with zeros."""
  if wrap:
    return np.roll(x, offset, axis=axis)
  y = np.zeros_like(x)
  size = x.shape[axis]
  src = np.arange(size) - offset
  ok = (src >= 0) & (src < size)
  index = [slice(None)] * x.ndim
  index[axis] = np.nonzero(ok)[0]
  take = [slice(None)] * x.ndim
  take[axis] = src[ok]
  y[tuple(index)] = x[tuple(take)]
  return y


def tf_reference(tf_fn):
  """(np_fn, np_grad_fn) for check_op from tf_fn(**float64 tensors) -> dict
  of outputs: TensorFlow's own op in float64 as the reference (e.g. a
  convolution), with its gradients from a GradientTape."""
  def np_fn(**arrays):
    out = tf_fn(**{k: tf.constant(v, tf.float64) for k, v in arrays.items()})
    return {k: v.numpy() for k, v in out.items()}

  def np_grad_fn(cotangents, **arrays):
    tensors = {k: tf.constant(v, tf.float64) for k, v in arrays.items()}
    with tf.GradientTape() as tape:
      tape.watch(list(tensors.values()))
      out = tf_fn(**tensors)
      total = tf.add_n([tf.reduce_sum(out[k] * c)
                        for k, c in cotangents.items()])
    grads = tape.gradient(total, tensors)
    return {k: g.numpy() for k, g in grads.items()}

  return np_fn, np_grad_fn
