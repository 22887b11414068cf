"""A mesh that does not fit the devices fails at once, naming both.

SimdMeshImpl's collectives wait for every processor of a group; two
processors on one device never both arrive, so a 16-processor SIMD mesh on
8 logical CPUs used to wait forever in `run` (and an estimator on it in
`train`). No case here reaches a collective that could hang: the checks
raise while the mesh implementation is made, and the estimator's model_fn
stops the test if it is ever called, so a regression fails instead of
hanging the suite.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.backend import simd_collectives
from tests import simulated_tpu
from tests.estimator import toy_model

CPUS = simulated_tpu.cpu_devices(8)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_simd_mesh_larger_than_the_devices_fails_at_once():
  with pytest.raises(mtf.LayoutError) as error:
    simd_mesh_impl.SimdMeshImpl("x:4;y:4", "")
  message = str(error.value)
  assert "x:4;y:4" in message and "16 processors" in message
  assert "found 8" in message and "/device:CPU:7" in message


def test_simd_processors_may_not_share_a_device():
  devices = ["/cpu:0", "/device:CPU:1", "/job:localhost/replica:0/task:0"
             "/device:CPU:0", "/device:CPU:3"]
  with pytest.raises(mtf.LayoutError,
                     match=r"all:4 \(4 processors\).*processors 0 and 2"):
    simd_mesh_impl.SimdMeshImpl("all:4", "", devices=devices)


def test_simd_mesh_smaller_than_the_strategy_fails_at_once():
  """A TPU program runs once per replica: replicas beyond the mesh would
  have no processor number."""
  with pytest.raises(mtf.LayoutError, match=r"all:4 \(4 processors\).*8 "
                     r"replicas"):
    simd_mesh_impl.SimdMeshImpl(
        "all:4", "", collectives="tpu", devices=CPUS[:4],
        strategy=simulated_tpu.stand_in_strategy(8))


def test_simd_mesh_smaller_than_the_local_devices_takes_the_first():
  assert simd_mesh_impl.SimdMeshImpl("all:4", "").devices == CPUS[:4]


def test_placement_mesh_larger_than_the_devices_runs():
  """PlacementMeshImpl's collectives are plain ops: processors that share
  a device (with a warning) cannot wait for each other."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("x:4;y:4", "batch:x")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", 16)
  total = mtf.reduce_sum(mtf.import_tf_tensor(mesh, tf.range(16.0), [batch]))
  total = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(total)
  assert float(total) == 120.0


def _model_fn_that_must_not_run(features, labels, mode, params):
  raise AssertionError("model_fn was called: the run got past the mesh's "
                       "device check, and its collectives would hang.")


def test_estimator_with_a_simd_mesh_larger_than_the_devices_fails_at_once(
    tmp_path):
  config = estimator.RunConfig(model_dir=str(tmp_path), mesh_shape="x:4;y:4",
                               layout="batch:x", mesh_impl="simd")
  est = estimator.Estimator(_model_fn_that_must_not_run, config=config)
  with pytest.raises(mtf.LayoutError, match=r"x:4;y:4 \(16 processors\).*"
                     r"found 8"):
    est.train(toy_model.input_fn, steps=1)


def _threads():
  return len(os.listdir("/proc/self/task"))


def test_host_collectives_hold_no_thread_per_call():
  """TF's per-op collective timeout starts a thread per call that sleeps
  for the whole timeout (thousands alive in a training run): by default
  the ops have none, and one watchdog thread keeps every deadline."""
  impl = simd_mesh_impl.SimdMeshImpl("all:2", "batch:all")

  def program(x):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch = mtf.Dimension("batch", 4)
    y = mtf.import_tf_tensor(mesh, x, [batch])
    total = mtf.reduce_sum(y)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return (lowering.export_to_tf_tensor(total),
            lowering.export_to_tf_tensor(y))

  concrete = impl.trace_program(program, tf.TensorSpec([4], tf.float32))
  collectives = [op for op in concrete.graph.get_operations()
                 if op.type.startswith("Collective") and
                 op.type != "CollectiveAssignGroupV2"]
  assert {op.type for op in collectives} == {"CollectiveReduceV2",
                                             "CollectiveGatherV2"}
  for op in collectives:
    assert op.get_attr("timeout_seconds") == 0, op.name
  x = tf.range(4, dtype=tf.float32)
  for _ in range(3):
    impl.run(program, x)
  before = _threads()
  for _ in range(30):
    total, _ = impl.run(program, x)
  assert float(total) == 6.0
  # Before: two more threads per processor and run (60 here).
  assert _threads() - before < 10


# A collective that never completes: processor 0 reduces with a group of 2
# whose second member never comes. Run in a fresh process, since the abort
# leaves that process's collectives unusable.
_LONELY_COLLECTIVE = textwrap.dedent("""
    import time
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tensorflow.python.ops import collective_ops
    from mesh_tensorflow import simd_mesh_impl
    from mesh_tensorflow.backend import simd_collectives
    simd_collectives.DEFAULT_TIMEOUT_SECONDS = 2.0
    impl = simd_mesh_impl.SimdMeshImpl("all:2", "")

    @tf.function
    def lonely(x):
      return collective_ops.all_reduce_v2(x, group_size=2, group_key=7,
                                          instance_key=7)

    start = time.monotonic()
    try:
      with impl.collective_errors(), tf.device("/cpu:0"):
        lonely(tf.ones([2]))
    except tf.errors.DeadlineExceededError as e:
      print(round(time.monotonic() - start), e.message)
""")


def test_a_collective_that_never_completes_fails_at_its_deadline(tmp_path):
  script = tmp_path / "lonely.py"
  script.write_text(_LONELY_COLLECTIVE)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join(
                 p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
  result = subprocess.run([sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  seconds, message = result.stdout.strip().split(" ", 1)
  assert 2 <= int(seconds) < 60
  assert message.startswith("SimdMeshImpl for mesh all:2 (2 processors) on "
                            "['/device:CPU:0', '/device:CPU:1']: a "
                            "collective did not complete within 2 s"), message


@pytest.mark.parametrize("value", [0, -1, float("inf")])
def test_collective_timeout_must_be_positive_and_finite(value):
  with pytest.raises(ValueError, match="collective_timeout_seconds"):
    simd_mesh_impl.SimdMeshImpl("all:2", "",
                                collective_timeout_seconds=value)


# What TensorFlow 2.21 raises when a host collective's timeout fires (and
# for every collective of the process after it), seen in a run where
# processor 1 of "all:2" skipped an all-reduce with a 1 s timeout.
TF_TIMEOUT = ("Collective ops is aborted by: Collective has timed out waiting "
              "for other workers.\nThe error could be from a previous "
              "operation. Restart your program to reset.")


def test_a_collective_timeout_names_the_mesh_its_devices_and_the_limit():
  """In a test process a real timeout would abort every later collective,
  so TF's error is raised here by hand; `run` and the estimator's loops
  pass theirs through the same `collective_errors`."""
  impl = simd_mesh_impl.SimdMeshImpl("all:2", "", collective_timeout_seconds=7)
  with pytest.raises(tf.errors.DeadlineExceededError) as error:
    with impl.collective_errors():
      raise tf.errors.DeadlineExceededError(None, None, TF_TIMEOUT)
  message = error.value.message
  assert message.startswith("SimdMeshImpl for mesh all:2 (2 processors) on "
                             "['/device:CPU:0', '/device:CPU:1']: a "
                             "collective did not complete within 7 s "
                             "(collective_timeout_seconds)"), message
  assert "restart it" in message
  other = tf.errors.InvalidArgumentError(None, None, "not a collective")
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    with impl.collective_errors():
      raise other
  assert error.value is other
