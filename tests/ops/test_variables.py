"""Variables: creation, naming, assignment, dtypes and multi-step training.

Every test runs eagerly, inside a tf.function and in tf.compat.v1 graph mode
with a Session. Programs that assign are run in phases (a list of fetches):
in graph mode each phase is one `Session.run`, so reads and assignments
happen in the order written, as they do eagerly and in a tf.function.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.storage import variable_store
from tests import mtf_testing

DIMS = ["a", "b"]
PARAMS = mtf_testing.layout_mode_params(DIMS)
SHAPE = "a:8,b:16"


def _x(seed=0, shape=(8, 16)):
  return np.random.RandomState(seed).uniform(
      -1.0, 1.0, size=shape).astype(np.float32)


def _run(mode, impl, build):
  """Builds, lowers and runs `build(mesh) -> list of phases`.

  A phase is a dict from a name to an mtf Tensor (its value is fetched) or an
  mtf Operation such as an Assign (it is run). Returns (list of dicts of
  NumPy values, the Lowering).
  """
  lowerings = []

  def build_and_lower():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    phases = build(mesh)
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowerings.append(lowering)
    return [{k: lowering.export_to_tf_tensor(v) if isinstance(v, mtf.Tensor)
             else lowering.lowered_operation(v) for k, v in phase.items()}
            for phase in phases]

  def tensors_only(phases):
    return [{k: v for k, v in phase.items() if isinstance(v, tf.Tensor)}
            for phase in phases]

  if mode == "eager":
    results = tensors_only(build_and_lower())
  elif mode == "function":
    results = tf.function(lambda: tensors_only(build_and_lower()))()
  elif mode == "simd":
    results = tf.function(
        lambda: impl.run(lambda: tensors_only(build_and_lower())))()
  else:
    with mtf_testing.tensor_shapes_of(mode), tf.Graph().as_default():
      phases = build_and_lower()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lowerings[-1].copy_masters_to_slices())
        # Session.run gives None for operations.
        results = [{k: v for k, v in sess.run(phase).items() if v is not None}
                   for phase in phases]
  return tf.nest.map_structure(np.asarray, results), lowerings[-1]


def _impl(mesh_shape, layout, mode="eager"):
  return mtf_testing.make_impl(mode, mesh_shape, layout)


# ------------------------------------------------------------ initializers

W = _x()


def _default_value(name, shape):
  return np.asarray(variable_store.default_initializer(name)(shape))


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_initializers(mesh_shape, layout, mode):
  def build(mesh):
    return [{
        "value": mtf.get_variable(mesh, "value", SHAPE, initializer=W),
        "scalar": mtf.get_variable(mesh, "scalar", SHAPE, initializer=0.5),
        "zeros": mtf.get_variable(mesh, "zeros", SHAPE,
                                  initializer=tf.zeros_initializer()),
        "keras": mtf.get_variable(
            mesh, "keras", SHAPE,
            initializer=tf.keras.initializers.Identity(gain=2.0)),
        "default": mtf.get_variable(mesh, "default", SHAPE),
        "int": mtf.get_variable(mesh, "int", SHAPE, dtype=tf.int32,
                                initializer=tf.zeros_initializer()),
    }]

  (got,), _ = _run(mode, _impl(mesh_shape, layout, mode), build)
  np.testing.assert_array_equal(got["value"], W)
  np.testing.assert_array_equal(got["scalar"], np.full([8, 16], 0.5))
  np.testing.assert_array_equal(got["zeros"], np.zeros([8, 16]))
  np.testing.assert_array_equal(got["keras"], 2.0 * np.eye(8, 16))
  # The default (Glorot uniform seeded by name) is the same on every layout.
  default = _default_value("default", [8, 16])
  np.testing.assert_array_equal(got["default"], default)
  limit = np.sqrt(6.0 / (8 + 16))
  assert np.all(np.abs(default) <= limit) and np.std(default) > limit / 4
  assert got["int"].dtype == np.int32


def test_initializer_of_wrong_shape_raises():
  with pytest.raises(mtf.ShapeError, match="'w'"):
    _run("eager", _impl("all:1", ""),
         lambda mesh: [{"w": mtf.get_variable(mesh, "w", SHAPE,
                                              initializer=np.zeros([3]))}])


# ------------------------------------------------------------------ names

@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_variable_scope_naming_and_reuse(mode):
  created = {}

  def build(mesh):
    with tf.compat.v1.variable_scope("outer"):
      w = mtf.get_variable(mesh, "w", SHAPE, initializer=W)
      with tf.compat.v1.variable_scope("inner"):
        inner = mtf.get_variable(mesh, "w", "b:16", initializer=1.0)
      again = mtf.get_variable(mesh, "w", SHAPE, initializer=0.0)
    created.update(w=w, inner=inner, again=again, graph=mesh.graph)
    return [{"w": again, "inner": inner}]

  (got,), lowering = _run(mode, _impl("all:8", "a:all", mode), build)
  graph = created["graph"]
  assert created["again"] is created["w"]
  assert sorted(graph.name_to_variable) == ["outer/inner/w", "outer/w"]
  assert [v.name for v in graph.trainable_variables] == [
      "outer/w", "outer/inner/w"]
  # Reuse returned the first variable, initialised to W, not to 0.
  np.testing.assert_array_equal(got["w"], W)
  np.testing.assert_array_equal(got["inner"], np.ones([16]))
  laid_out = lowering.variables[graph.name_to_variable["outer/w"]]
  assert len(laid_out.slice_variables) == 8
  if mode == "graph":
    assert laid_out.master.name == "outer/w:0"
  else:
    assert laid_out.master is None


@pytest.mark.parametrize("mode", mtf_testing.MODES)
def test_slice_variable_names(mode):
  """TF slice variables are named after the mtf variable, outside any scope."""
  def build(mesh):
    with tf.compat.v1.variable_scope("outer"):
      return [{"w": mtf.get_variable(mesh, "w", SHAPE)}]

  def build_in_scope(mesh):
    with tf.name_scope("unrelated"):
      return build(mesh)

  _, lowering = _run(mode, _impl("all:8", "a:all", mode), build_in_scope)
  (laid_out,) = lowering.variables.values()
  assert [v.name for v in laid_out.slice_variables] == [
      f"outer/w_slice_{p}:0" for p in range(8)]


def test_reuse_with_another_shape_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with tf.compat.v1.variable_scope("scope"):
    mtf.get_variable(mesh, "w", SHAPE)
    with pytest.raises(mtf.ShapeError, match=r"'scope/w'.*b=16.*b=8"):
      mtf.get_variable(mesh, "w", "a:8,b:8")


def test_variable_properties():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", SHAPE, trainable=False)
  var = w.operation
  assert isinstance(var, mtf.Variable)
  assert var.value is w and var.shape == w.shape and var.size == 128
  assert not var.trainable
  assert graph.trainable_variables == [] and graph.all_variables == [var]


# ------------------------------------------------------------- assignment

C1, C2 = _x(seed=1), _x(seed=2)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_assign_then_read(mesh_shape, layout, mode):
  def build(mesh):
    w = mtf.get_variable(mesh, "w", SHAPE, initializer=W)
    c1 = mtf.import_tf_tensor(mesh, tf.constant(C1), SHAPE)
    c2 = mtf.import_tf_tensor(mesh, tf.constant(C2), SHAPE)
    var = w.operation
    return [{"initial": w},
            {"assign": mtf.assign(w, w * 2.0)},
            {"doubled": mtf.read_variable(w)},
            {"assign_add": mtf.assign_add(var, c1)},
            {"added": mtf.read_variable(var)},
            # Through a read of the variable.
            {"assign_sub": mtf.assign_sub(mtf.read_variable(w), c2)},
            {"subtracted": mtf.read_variable(w)}]

  got, _ = _run(mode, _impl(mesh_shape, layout, mode), build)
  values = {k: v for phase in got for k, v in phase.items()}
  np.testing.assert_allclose(values["initial"], W)
  np.testing.assert_allclose(values["doubled"], 2 * W)
  np.testing.assert_allclose(values["added"], 2 * W + C1, rtol=1e-6)
  np.testing.assert_allclose(values["subtracted"], 2 * W + C1 - C2,
                             rtol=1e-6, atol=1e-6)


def test_assign_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", SHAPE)
  with pytest.raises(mtf.ShapeError, match="'w'"):
    mtf.assign(w, mtf.zeros(mesh, "a:8"))
  with pytest.raises(ValueError, match="not the value of a variable"):
    mtf.assign(w + w, mtf.zeros(mesh, SHAPE))
  with pytest.raises(TypeError):
    mtf.assign("w", mtf.zeros(mesh, SHAPE))


@pytest.mark.parametrize("make_target", [
    lambda w: mtf.negative(w), lambda w: mtf.identity(w),
    lambda w: mtf.cast(mtf.cast(w, tf.bfloat16), tf.float32),
    lambda w: w * 2.0])
def test_assign_to_the_output_of_another_op_is_an_error(make_target):
  """mtf.assign(mtf.negative(v), x) used to write x to v (the target was
  found by walking back through one-input ops)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", SHAPE)
  target = make_target(w)
  for fn in (mtf.assign, mtf.assign_add, mtf.assign_sub):
    with pytest.raises(ValueError, match=(
        f"{target.operation.name!r}, not the value of a variable")):
      fn(target, mtf.zeros(mesh, SHAPE))
  # The variable itself, its value and a read of it are fine.
  for target in (w.operation, w, mtf.read_variable(w)):
    assert mtf.assign(target, mtf.zeros(mesh, SHAPE)).variables == [
        w.operation]


def _double_slice(variable, slice_var, val):
  """A user assign_fn with the original's (variable, slice_var, val)."""
  return slice_var.assign(tf.cast(val, variable.slice_dtype) * 2,
                          read_value=False)


@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_custom_assign_fn_and_slice_functions(mesh_shape, layout, mode):
  """assign_fn(variable, slice_var, val) as in the original, on a combined
  Assign of two same-shaped variables (which autostack stores stacked) and
  one of another dtype."""
  def build(mesh):
    u = mtf.get_variable(mesh, "u", SHAPE, initializer=W)
    v = mtf.get_variable(mesh, "v", SHAPE, initializer=C1)
    s = mtf.get_variable(mesh, "s", SHAPE, initializer=C2,
                         dtype=mtf.VariableDType(tf.float32, tf.bfloat16,
                                                 tf.float32))
    one = mtf.ones(mesh, SHAPE)
    # Operations are made in the order they run (eager and tf.function run
    # them in graph order).
    phases = [{"double": mtf.Assign([u.operation, v.operation, s.operation],
                                     [one, one * 3.0, one],
                                     assign_fn=_double_slice)}]
    phases.append({"u": mtf.read_variable(u), "v": mtf.read_variable(v),
                   "s": mtf.read_variable(s)})
    phases.append({"add": mtf.Assign([u.operation, v.operation], [one, one],
                                     assign_fn=mtf.assign_add_slice)})
    phases.append({"u2": mtf.read_variable(u), "v2": mtf.read_variable(v)})
    return phases

  got, _ = _run(mode, _impl(mesh_shape, layout, mode), build)
  values = {k: v for phase in got for k, v in phase.items()}
  np.testing.assert_array_equal(values["u"], np.full([8, 16], 2.0))
  np.testing.assert_array_equal(values["v"], np.full([8, 16], 6.0))
  np.testing.assert_array_equal(values["s"], np.full([8, 16], 2.0))
  np.testing.assert_array_equal(values["u2"], np.full([8, 16], 3.0))
  np.testing.assert_array_equal(values["v2"], np.full([8, 16], 7.0))


def test_slice_functions_take_the_originals_arguments():
  slice_var = tf.Variable(tf.zeros([2], tf.bfloat16))
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  var = mtf.get_variable(mesh, "w", "a:2", dtype=mtf.VariableDType(
      tf.float32, tf.bfloat16, tf.float32)).operation
  mtf.assign_slice(var, slice_var, tf.constant([1.5, 2.0]))
  mtf.assign_add_slice(variable=var, slice_var=slice_var,
                       val=tf.constant([1.0, 1.0]))
  mtf.assign_sub_slice(var, slice_var, tf.constant([0.5, 0.0]))
  assert slice_var.dtype == tf.bfloat16
  np.testing.assert_array_equal(slice_var.numpy().astype(np.float32),
                                [2.0, 3.0])


# --------------------------------------------------------------- masters

@pytest.mark.parametrize("mesh_shape,layout,mode", [
    p for p in PARAMS if p.values[2] != "simd"])
def test_master_get_assign_and_device(mesh_shape, layout, mode):
  """Variable.get_master / assign_to_master / master_device: the master
  variable in compat graph mode, the assembled slices otherwise."""
  impl = _impl(mesh_shape, layout, mode)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", SHAPE, initializer=W,
                       dtype=mtf.VariableDType(tf.float32, tf.bfloat16,
                                               tf.float32))
  var = w.operation
  with pytest.raises(ValueError, match="'w'.*Lowering"):
    var.get_master()
  bf16 = tf.bfloat16.as_numpy_dtype
  w16 = W.astype(bf16).astype(np.float32)

  def lower():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, lowering.export_to_tf_tensor(w)

  if mode in mtf_testing.GRAPH_MODES:
    with mtf_testing.tensor_shapes_of(mode), tf.Graph().as_default():
      lowering, value = lower()
      master = var.get_master()
      assert isinstance(master, tf.Variable) and master.dtype == tf.float32
      assert var.master_device == master.device
      assign = var.assign_to_master(tf.constant(C1))
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(master), W)
        sess.run(assign)
        sess.run(lowering.copy_masters_to_slices())
        np.testing.assert_array_equal(sess.run(value),
                                      C1.astype(bf16).astype(np.float32))
    return
  if mode == "eager":
    lower()
    get, assign = var.get_master, var.assign_to_master
  else:
    tf.function(lambda: lower()[1])()
    get = tf.function(var.get_master)

    @tf.function
    def assign(value):
      var.assign_to_master(value)
  assert var.master_device == "/cpu:0"
  master = get()
  assert master.dtype == tf.float32 and master.device.endswith("CPU:0")
  np.testing.assert_array_equal(master.numpy(), w16)
  assign(tf.constant(C1))
  np.testing.assert_array_equal(get().numpy(),
                                C1.astype(bf16).astype(np.float32))


# --------------------------------------------------------- stacked variables

@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_stacked_variable(mesh_shape, layout, mode):
  """A StackedVariable reads and writes its members, which keep their own
  names (and checkpoint entries)."""
  created = {}

  def build(mesh):
    u = mtf.get_variable(mesh, "u", SHAPE, initializer=W)
    v = mtf.get_variable(mesh, "v", SHAPE, initializer=C1)
    stacked = mtf.StackedVariable([u.operation, v.operation])
    created["stacked"] = stacked
    rows = mtf.unstack(stacked.outputs[0], stacked.shape.dims[0])
    update = mtf.assign_add(stacked, mtf.ones(mesh, stacked.shape))
    return [{"stacked": stacked.outputs[0], "row1": rows[1]},
            {"update": update},
            {"u": mtf.read_variable(u), "v": mtf.read_variable(v),
             "again": mtf.read_variable(stacked)}]

  got, _ = _run(mode, _impl(mesh_shape, layout, mode), build)
  values = {k: v for phase in got for k, v in phase.items()}
  np.testing.assert_array_equal(values["stacked"], np.stack([W, C1]))
  np.testing.assert_array_equal(values["row1"], C1)
  np.testing.assert_allclose(values["u"], W + 1, rtol=1e-6)
  np.testing.assert_allclose(values["v"], C1 + 1, rtol=1e-6)
  np.testing.assert_allclose(values["again"], np.stack([W, C1]) + 1,
                             rtol=1e-6)
  stacked = created["stacked"]
  assert stacked.name == "stacked/u"
  assert stacked.original_names == ["u", "v"]
  assert stacked.shape.dims[0] == mtf.Dimension("stacked", 2)


def test_stacked_variable_masters_and_errors():
  impl = _impl("all:2", "a:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  u = mtf.get_variable(mesh, "u", SHAPE, initializer=W).operation
  v = mtf.get_variable(mesh, "v", SHAPE, initializer=C1).operation
  stacked = mtf.StackedVariable([u, v])
  with pytest.raises(mtf.ShapeError, match="'w'"):
    mtf.StackedVariable([u, mtf.get_variable(mesh, "w", "a:8").operation])
  mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_array_equal(stacked.get_master().numpy(),
                                np.stack([W, C1]))
  stacked.assign_to_master(tf.constant(np.stack([C1, W])))
  np.testing.assert_array_equal(u.get_master().numpy(), C1)
  np.testing.assert_array_equal(v.get_master().numpy(), W)
  assert stacked.master_device == u.master_device
  bad = mtf.Graph()
  bad_mesh = mtf.Mesh(bad, "mesh")
  s = mtf.StackedVariable([mtf.get_variable(bad_mesh, "x", SHAPE).operation])
  with pytest.raises(mtf.LayoutError, match="'stacked'"):
    mtf.Lowering(bad, {bad_mesh: _impl("all:2", "stacked:all")})
  del s


# ----------------------------------------------------------------- dtypes

@pytest.mark.parametrize("mesh_shape,layout,mode", PARAMS)
def test_variable_dtypes(mesh_shape, layout, mode):
  c1 = np.full([8, 16], 0.25, np.float32)
  bf16 = tf.bfloat16.as_numpy_dtype
  created = {}

  def build(mesh):
    act = mtf.get_variable(mesh, "act", SHAPE, initializer=W,
                           dtype=mtf.VariableDType(tf.float32, tf.float32,
                                                   tf.bfloat16))
    slc = mtf.get_variable(mesh, "slc", SHAPE, initializer=W,
                           dtype=mtf.VariableDType(tf.float32, tf.bfloat16,
                                                   tf.float32))
    kw = mtf.get_variable(mesh, "kw", SHAPE, initializer=W,
                          activation_dtype=tf.bfloat16)
    assert (act.dtype, slc.dtype, kw.dtype) == (
        tf.bfloat16, tf.float32, tf.bfloat16)
    created.update(act=act.operation, slc=slc.operation, kw=kw.operation)
    one = mtf.import_tf_tensor(mesh, tf.constant(c1), SHAPE)
    return [{"act": mtf.cast(act, tf.float32), "slc": slc},
            {"add_act": mtf.assign_add(act, mtf.cast(one, tf.bfloat16)),
             "add_slc": mtf.assign_add(slc, one)},
            {"act2": mtf.cast(mtf.read_variable(act), tf.float32),
             "slc2": mtf.read_variable(slc)}]

  got, lowering = _run(mode, _impl(mesh_shape, layout, mode), build)
  values = {k: v for phase in got for k, v in phase.items()}
  w16 = W.astype(bf16).astype(np.float32)
  np.testing.assert_array_equal(values["act"], w16)
  np.testing.assert_array_equal(values["slc"], w16)
  # act keeps float32 slices: its update is exact up to the final cast.
  np.testing.assert_array_equal(
      values["act2"], (W + c1).astype(bf16).astype(np.float32))
  np.testing.assert_array_equal(
      values["slc2"], (w16 + c1).astype(bf16).astype(np.float32))
  expected_dtypes = {"act": (tf.float32, tf.float32, tf.bfloat16),
                     "slc": (tf.float32, tf.bfloat16, tf.float32),
                     "kw": (tf.float32, tf.float32, tf.bfloat16)}
  for name, (master, slice_dtype, activation) in expected_dtypes.items():
    var = created[name]
    assert (var.master_dtype, var.slice_dtype, var.activation_dtype) == (
        master, slice_dtype, activation)
    laid_out = lowering.variables[var]
    assert {v.dtype for v in laid_out.slice_variables} == {slice_dtype}
    if mode in mtf_testing.GRAPH_MODES:
      assert laid_out.master.dtype == master


# --------------------------------------------------------------- training

X = _x(seed=3, shape=(8, 8))
Y = _x(seed=4, shape=(8, 4))
W1 = _x(seed=5, shape=(8, 16))
W2 = _x(seed=6, shape=(16, 4))
LEARNING_RATE = 0.1
STEPS = 5


def _numpy_training_losses():
  """SGD on the 2-layer MLP in float64."""
  w1, w2 = W1.astype(np.float64), W2.astype(np.float64)
  x, y = X.astype(np.float64), Y.astype(np.float64)
  losses = []
  for _ in range(STEPS):
    pre = x @ w1
    h = np.maximum(pre, 0)
    err = h @ w2 - y
    losses.append(np.mean(err ** 2))
    d_pred = 2 * err / err.size
    d_w2 = h.T @ d_pred
    d_w1 = x.T @ (d_pred @ w2.T * (pre > 0))
    w1, w2 = w1 - LEARNING_RATE * d_w1, w2 - LEARNING_RATE * d_w2
  return np.array(losses)


def _training_step(mesh):
  """One SGD step of a 2-layer MLP; returns (loss, assign operations)."""
  x = mtf.import_tf_tensor(mesh, tf.constant(X), "batch:8,io:8")
  y = mtf.import_tf_tensor(mesh, tf.constant(Y), "batch:8,out:4")
  w1 = mtf.get_variable(mesh, "w1", "io:8,hidden:16", initializer=W1)
  w2 = mtf.get_variable(mesh, "w2", "hidden:16,out:4", initializer=W2)
  h = mtf.relu(mtf.einsum([x, w1], output_shape="batch:8,hidden:16"))
  pred = mtf.einsum([h, w2], output_shape="batch:8,out:4")
  loss = mtf.reduce_mean(mtf.square(pred - y))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = [mtf.assign_sub(v, g * LEARNING_RATE)
             for v, g in zip(variables, grads)]
  return loss, updates


def _train(mode, impl):
  """Losses of STEPS training steps, each lowered on the same `impl`."""
  def lower_step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, updates = _training_step(mesh)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering, lowering.export_to_tf_tensor(loss), [
        lowering.lowered_operation(u) for u in updates]

  if mode == "eager":
    losses = [lower_step()[1].numpy() for _ in range(STEPS)]
  elif mode in ("function", "simd"):
    if mode == "simd":
      step = tf.function(lambda: impl.run(lambda: lower_step()[1]))
    else:
      step = tf.function(lambda: lower_step()[1])
    losses = [step().numpy()]
    # TF traces a function that creates variables twice on its first call
    # (the second trace finds them in the store); later calls never retrace.
    traces = step.experimental_get_tracing_count()
    losses += [step().numpy() for _ in range(STEPS - 1)]
    assert step.experimental_get_tracing_count() == traces <= 2
  else:
    with mtf_testing.tensor_shapes_of(mode), tf.Graph().as_default():
      lowering, loss, updates = lower_step()
      train_op = tf.group(*updates)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        losses = [sess.run([loss, train_op])[0] for _ in range(STEPS)]
  return np.array(losses)


@pytest.mark.parametrize(
    "mesh_shape,layout,mode", mtf_testing.layout_mode_params(
        ["batch", "hidden"]) + mtf_testing.extra_layout_params(
            "2d_io_hidden", "rows:2;cols:4", "io:rows;hidden:cols"))
def test_training_is_layout_independent(mesh_shape, layout, mode):
  """Layout changes speed, never the answer: the losses match NumPy."""
  impl = _impl(mesh_shape, layout, mode)
  losses = _train(mode, impl)
  want = _numpy_training_losses()
  assert want[-1] < 0.8 * want[0]  # It learns.
  np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-6)
  if mode not in mtf_testing.GRAPH_MODES:
    # Variables were created once, on the first step, and persisted.
    assert sorted(impl.variable_store.eager_entries()) == ["w1", "w2"]


def test_read_variable_operation_takes_var_and_name():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  w = mtf.get_variable(mesh, "w", SHAPE)
  read = mtf.ReadVariable(w.operation, "my_read")
  assert read.name.startswith("my_read") and read.variable is w.operation
  assert read.outputs[0].shape == w.shape
