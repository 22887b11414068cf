"""The estimator's TPU path, without a TPU.

A MirroredStrategy over 8 logical CPUs stands in for TPUStrategy and host
collectives for the XLA TPU collectives (tests/simulated_tpu.py); the rest
is the code that runs on TPU: RunConfig(mesh_impl="tpu") or
TPUEstimator(use_tpu=True), SimdMeshImpl(collectives="tpu") under
strategy.run with per-core variables, and the cluster connection (TPU
system, device assignment, logical_to_physical), with TF's TPU entry points
replaced by recorders.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import estimator
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.backend import tpu_topology
from mesh_tensorflow.estimator import mesh_impls
from mesh_tensorflow.estimator import tpu_cluster
from tests import simulated_tpu
from tests.estimator import toy_model

MESH, LAYOUT = "b:2;m:4", "batch:b;hidden:m"


@pytest.fixture(name="made_impls")
def fixture_made_impls(monkeypatch):
  """Every mesh implementation the estimator makes; TPU ones get host-
  simulated TPU primitives."""
  made = []
  make = mesh_impls.make_mesh_impl

  def make_and_simulate(config, tpu=None):
    impl = make(config, tpu)
    if config.mesh_impl == "tpu":
      simulated_tpu.install(impl)
    made.append(impl)
    return impl

  monkeypatch.setattr(mesh_impls, "make_mesh_impl", make_and_simulate)
  return made


def _assert_trained_alike(est, reference):
  toy_model.assert_same_variables(toy_model.variables(est),
                                  toy_model.variables(reference))
  assert est.evaluate(toy_model.eval_input_fn)["loss"] == pytest.approx(
      reference.evaluate(toy_model.eval_input_fn)["loss"], rel=1e-5)


def _placement_reference(model_dir, steps):
  reference = toy_model.make_estimator(model_dir, MESH, LAYOUT)
  reference.train(toy_model.input_fn, steps=steps)
  return reference


def test_tpu_estimator_trains_under_a_strategy_like_placement(tmp_path,
                                                              made_impls):
  strategy = simulated_tpu.stand_in_strategy()
  config = estimator.RunConfig(
      model_dir=str(tmp_path / "tpu"), mesh_shape=MESH, layout=LAYOUT,
      strategy=strategy, tpu_config=estimator.TPUConfig(iterations_per_loop=2))
  seen_params = []

  def input_fn(params):
    seen_params.append(dict(params))
    return toy_model.input_fn()

  est = estimator.TPUEstimator(toy_model.model_fn, config=config,
                               params={"learning_rate": 0.1}, use_tpu=True,
                               train_batch_size=toy_model.BATCH)
  est.train(input_fn, steps=3)
  est.train(input_fn, steps=2)  # Resumes on a new mesh impl.
  assert est.get_variable_value("global_step") == 5
  assert seen_params[0]["use_tpu"] and seen_params[0]["batch_size"] == 8
  for impl in made_impls:
    assert isinstance(impl, simd_mesh_impl.SimdMeshImpl)
    assert impl.collectives.name == "tpu" and impl.strategy is strategy
  _assert_trained_alike(est, _placement_reference(tmp_path / "p", 5))

  predictions = [p["out"] for p in est.predict(toy_model.predict_input_fn)]
  reference = toy_model.make_estimator(tmp_path / "p", MESH, LAYOUT)
  expected = [p["out"] for p in reference.predict(
      toy_model.predict_input_fn)]
  np.testing.assert_allclose(predictions, expected, rtol=1e-5, atol=1e-6)

  # The TPU-trained model exports to one CPU device.
  receiver_fn = estimator.build_raw_serving_input_receiver_fn(
      {"x": tf.TensorSpec([toy_model.BATCH, toy_model.IO], tf.float32)})
  path = est.export_saved_model(str(tmp_path / "export"), receiver_fn)
  serve = tf.saved_model.load(path.decode()).signatures["serving_default"]
  np.testing.assert_allclose(
      serve(x=tf.constant(toy_model.INPUTS))["out"].numpy(),
      predictions[:toy_model.BATCH], rtol=1e-5, atol=1e-6)


def test_eval_on_tpu_false_evaluates_on_the_host(tmp_path, made_impls):
  config = estimator.RunConfig(
      model_dir=str(tmp_path), mesh_shape=MESH, layout=LAYOUT,
      strategy=simulated_tpu.stand_in_strategy())
  est = estimator.TPUEstimator(toy_model.model_fn, config=config,
                               params={"learning_rate": 0.1},
                               eval_on_tpu=False)
  est.train(toy_model.input_fn, steps=2)
  del made_impls[:]
  eval_params = []

  def eval_input_fn(params):
    eval_params.append(params["use_tpu"])
    return toy_model.eval_input_fn()

  est.evaluate(eval_input_fn)
  (impl,) = made_impls
  assert isinstance(impl, mtf.placement_mesh_impl.PlacementMeshImpl)
  assert eval_params == [False]


def test_tpu_model_fn_sees_the_step_on_every_core(tmp_path, made_impls):
  """Under the strategy, model_fn (run once per core) reads the estimator's
  step as TF's global step and as params["global_step"]."""
  config = estimator.RunConfig(
      model_dir=str(tmp_path), mesh_shape=MESH, layout=LAYOUT,
      strategy=simulated_tpu.stand_in_strategy(), save_summary_steps=1,
      tpu_config=estimator.TPUConfig(iterations_per_loop=2))
  est = estimator.TPUEstimator(toy_model.step_reading_model_fn,
                               config=config, use_tpu=True,
                               train_batch_size=toy_model.BATCH)
  est.train(toy_model.input_fn, steps=3)
  assert made_impls and est.get_variable_value("global_step") == 3
  scalars = toy_model.event_scalars(str(tmp_path))
  for tag in ("seen/tf_global_step", "seen/params_global_step"):
    assert scalars[tag] == {1: 0.0, 2: 1.0, 3: 2.0}
  np.testing.assert_allclose(
      [scalars["learning_rate"][n] for n in (1, 2, 3)], [0.01, 0.02, 0.03],
      rtol=1e-6)


class _FakeResolver:

  def master(self):
    return "grpc://fake-tpu:8470"


class _FakeTopology:
  mesh_shape = np.array([4, 2, 1, 1])


def test_cluster_connection_places_the_mesh_on_the_cores(
    tmp_path, monkeypatch, made_impls):
  """With RunConfig(cluster=...), the estimator initializes the TPU system
  once, assigns replica p to the core auto_logical_to_physical_tpu calls
  physical processor p, and maps the mesh with it."""
  calls = []
  stand_in = simulated_tpu.stand_in_strategy()
  monkeypatch.setattr(tpu_cluster, "_TOPOLOGIES", {})
  monkeypatch.setattr(tf.config, "experimental_connect_to_cluster",
                      lambda cluster: calls.append(("connect", cluster)))

  def initialize(cluster):
    calls.append(("initialize", cluster))
    return _FakeTopology()

  def device_assignment(topology, core_assignment):
    calls.append(("device_assignment", topology, core_assignment))
    return "the-device-assignment"

  def tpu_strategy(cluster, experimental_device_assignment):
    calls.append(("strategy", cluster, experimental_device_assignment))
    return stand_in

  monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                      initialize)
  monkeypatch.setattr(tf.tpu.experimental, "DeviceAssignment",
                      device_assignment)
  monkeypatch.setattr(tf.distribute, "TPUStrategy", tpu_strategy)

  resolver = _FakeResolver()
  config = estimator.RunConfig(model_dir=str(tmp_path / "tpu"),
                               mesh_shape=MESH, layout=LAYOUT,
                               cluster=resolver)
  est = estimator.TPUEstimator(toy_model.model_fn, config=config,
                               params={"learning_rate": 0.1})
  est.train(toy_model.input_fn, steps=2)
  est.train(toy_model.input_fn, steps=1)

  assert [c[0] for c in calls] == ["connect", "initialize",
                                   "device_assignment", "strategy"]
  assert calls[0][1] is resolver and calls[3][1] is resolver
  _, topology, core_assignment = calls[2]
  assert isinstance(topology, _FakeTopology)
  assert core_assignment.shape == (8, 1, 4)
  assert core_assignment[:, 0].tolist() == tpu_topology.topology_coordinates(
      [4, 2, 1, 1])
  assert calls[3][2] == "the-device-assignment"
  want_map = tpu_topology.auto_logical_to_physical_tpu([2, 4], [4, 2, 1, 1])
  assert want_map != list(range(8))
  for impl in made_impls:
    assert impl.logical_to_physical == want_map
  _assert_trained_alike(est, _placement_reference(tmp_path / "p", 3))


def test_mesh_and_slice_sizes_must_match(monkeypatch):
  monkeypatch.setattr(tpu_cluster, "_TOPOLOGIES",
                      {"grpc://fake-tpu:8470": _FakeTopology()})
  with pytest.raises(mtf.LayoutError, match="4 processors.*8 cores"):
    tpu_cluster.connect(_FakeResolver(), mtf.convert_to_shape("all:4"))


def test_tpu_configuration_errors(tmp_path):
  with pytest.raises(ValueError, match="cluster=.*TPUClusterResolver"):
    estimator.RunConfig(mesh_impl="tpu")
  with pytest.raises(ValueError, match="cluster="):
    estimator.TPUEstimator(toy_model.model_fn, model_dir=str(tmp_path))
  config = estimator.RunConfig(mesh_impl="tpu", strategy=object())
  with pytest.raises(ValueError, match="use_tpu=False"):
    estimator.TPUEstimator(toy_model.model_fn, config=config, use_tpu=False)
