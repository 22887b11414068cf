"""One mesh implementation serves two lowerings at once.

A lowering passes its operations an explicit context (layout view, idle
processors, counters) instead of swapping attributes of the mesh
implementation, so two graphs lowered on one implementation from two
threads at the same time give what they give one after the other, and the
implementation's attributes are the same objects before, during and after.

The graphs exercise all three parts of the context: an operation whose
lowering needs its unevenly split dimension whole (lowered gathering, with
that dimension replicated), marked with idle pipeline slots, followed by a
reduction whose allreduce is counted. A barrier inside that operation's
lowering makes the two lowerings overlap there.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.strategies import idle_slots

MESH = "s:4;b:2"
STAGE = mtf.Dimension("stage", 4)
D = mtf.Dimension("d", 5)  # Split unevenly over b:2.
LAYOUT = mtf.convert_to_layout_rules("stage:s;d:b").with_uneven()


class _CumsumAtRendezvous(mtf.Operation):
  """Cumulative sum along `d` (needs `d` whole); its lowering checks the
  implementation and waits for the other thread's lowering."""

  def __init__(self, x, at_lowering):
    super().__init__([x], name="cumsum_at_rendezvous")
    self._outputs = [mtf.Tensor(self, x.shape, x.dtype)]
    self._at_lowering = at_lowering

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    self._at_lowering()
    x = lowering.tensors[self.inputs[0]]
    axis = self.inputs[0].shape.dims.index(D)
    assert impl.slice_shape(self.inputs[0].shape)[axis] == D.size
    lowering.set_tensor_lowering(
        self.outputs[0],
        impl.slicewise(lambda s: tf.cumsum(s, axis=axis), x))


def _build_and_lower(impl, values, idle, at_lowering):
  """Lowers one graph; returns (lowering, {name: tf.Tensor})."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(values), mtf.Shape([STAGE, D]))
  y = _CumsumAtRendezvous(x, at_lowering).outputs[0]
  y.operation.annotate(idle_slots.IdleSlots(STAGE, frozenset(idle)))
  z = mtf.reduce_sum(y, reduced_dim=STAGE)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return lowering, {"y": lowering.export_to_tf_tensor(y),
                    "z": lowering.export_to_tf_tensor(z)}


def _snapshot(impl):
  return dict(vars(impl))


def _assert_unchanged(impl, before):
  now = vars(impl)
  changed = sorted(k for k in set(before) | set(now)
                   if now.get(k, before) is not before.get(k, now))
  assert not changed, f"lowering changed {impl!r}'s attributes {changed}"


def _inputs():
  rng = np.random.RandomState(0)
  return [(rng.rand(4, 5).astype(np.float32), {1, 3}),
          (rng.rand(4, 5).astype(np.float32), {0})]


def _lower_placement(impl, values, idle, at_lowering):
  lowering, out = _build_and_lower(impl, values, idle, at_lowering)
  return ({k: np.asarray(v) for k, v in out.items()},
          dict(lowering.counters))


def _lower_simd(impl, values, idle, at_lowering):
  """Traces (lowers) the SPMD program; returns a function running it."""
  counters = {}

  def program():
    lowering, out = _build_and_lower(impl, values, idle, at_lowering)
    counters.update(lowering.counters)
    return out

  concrete = tf.function(lambda: impl.run_each(program)).get_concrete_function()

  def run():
    return ({k: np.asarray(v) for k, v in concrete()[0].items()}, counters)

  return run


def _in_two_threads(fn, args):
  results = [None, None]
  errors = []

  def target(i):
    try:
      results[i] = fn(*args[i])
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=target, args=(i,)) for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  if errors:
    raise errors[0]
  return results


@pytest.mark.parametrize("kind", ["placement", "simd"])
def test_two_lowerings_at_once_match_one_after_the_other(kind):
  if kind == "placement":
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(MESH, LAYOUT)
    lower = _lower_placement
  else:
    impl = mtf.simd_mesh_impl.SimdMeshImpl(MESH, LAYOUT)
    lower = _lower_simd
  before = _snapshot(impl)

  def checked():
    _assert_unchanged(impl, before)

  sequential = [lower(impl, values, idle, checked)
                for values, idle in _inputs()]
  barrier = threading.Barrier(2, timeout=120)

  def at_rendezvous():
    checked()
    barrier.wait()
    checked()

  concurrent = _in_two_threads(
      lower, [(impl, values, idle, at_rendezvous)
              for values, idle in _inputs()])
  if kind == "simd":
    sequential = [run() for run in sequential]
    concurrent = [run() for run in concurrent]
  _assert_unchanged(impl, before)
  for (values, idle), (seq_out, seq_counters), (out, counters) in zip(
      _inputs(), sequential, concurrent):
    expected = np.cumsum(values, axis=1)
    if kind == "placement":
      expected[sorted(idle)] = 0  # Idle slots give zeros.
    np.testing.assert_allclose(seq_out["y"], expected, rtol=1e-6)
    for name in ("y", "z"):
      np.testing.assert_array_equal(out[name], seq_out[name])
    assert counters == seq_counters
    assert any(k.startswith("comm/allreduce/s/") for k in counters)


def test_a_lowering_creating_variables_changes_no_attribute():
  """Variables (and the random step counter) go into the implementation's
  variable store and checkpoint dependencies, made with it."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("a:2;b:4", "x:a")
  before = _snapshot(impl)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.get_variable(mesh, "w", mtf.Shape([mtf.Dimension("x", 4),
                                             mtf.Dimension("y", 3)]))
  y = mtf.dropout(w, is_training=True, keep_prob=0.5)
  lowering = mtf.Lowering(graph, {mesh: impl})
  assert lowering.export_to_tf_tensor(y).shape == [4, 3]
  _assert_unchanged(impl, before)
