"""The examples run end to end with tiny settings and print their metrics.

Each example runs in a subprocess (it sets up its own 8 logical CPUs before
TensorFlow starts) and is given every flag the issue lists, so a missing
flag fails the run.
"""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


# Runs an example as __main__ under tfds.testing.mock_data: TFDS "loads"
# random MNIST-shaped examples from argv[1] without any files or download.
_MOCK_TFDS_DRIVER = """
import runpy, sys
import tensorflow_datasets as tfds
data_dir, path = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])
with tfds.testing.mock_data(num_examples=40, data_dir=data_dir):
  runpy.run_path(path, run_name="__main__")
"""


# Runs an example as __main__ with TF's Cloud TPU entry points replaced by
# the tests' stand-ins (tests/simulated_tpu.py): an 8-core slice whose
# TPUStrategy is a MirroredStrategy over the 8 logical CPUs, with the TPU
# collectives done by host collectives.
_SIMULATED_TPU_DRIVER = """
import runpy, sys
import numpy as np
import tensorflow as tf
from mesh_tensorflow.estimator import mesh_impls
from tests import simulated_tpu
path = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, path.rsplit("/", 1)[0])

class Resolver:
  def __init__(self, tpu=None, zone=None, project=None):
    print("TPUClusterResolver", tpu, zone, project)
  def master(self):
    return "grpc://simulated-tpu"

class Topology:
  mesh_shape = np.array([4, 2, 1, 1])

tf.distribute.cluster_resolver.TPUClusterResolver = Resolver
tf.config.experimental_connect_to_cluster = lambda cluster: None
tf.tpu.experimental.initialize_tpu_system = lambda cluster: Topology()
tf.tpu.experimental.DeviceAssignment = lambda topology, core_assignment: None
tf.distribute.TPUStrategy = (
    lambda cluster, experimental_device_assignment:
    simulated_tpu.stand_in_strategy())
make = mesh_impls.make_mesh_impl

def make_simulated(config, tpu=None):
  impl = make(config, tpu)
  if config.mesh_impl == "tpu":
    print("mesh impl", type(impl).__name__, impl.collectives.name)
    simulated_tpu.install(impl)
  return impl

mesh_impls.make_mesh_impl = make_simulated
runpy.run_path(path, run_name="__main__")
"""


def _run_example(name, *args, mock_tfds_dir=None, simulated_tpu=False):
  """Runs examples/<name>.py with `args`; returns its stdout."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  command = [sys.executable, os.path.join(EXAMPLES, name + ".py"), *args]
  if mock_tfds_dir:
    command[1:1] = ["-c", _MOCK_TFDS_DRIVER, str(mock_tfds_dir)]
  if simulated_tpu:
    command[1:1] = ["-c", _SIMULATED_TPU_DRIVER]
  result = subprocess.run(
      command, cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-5000:]
  return result.stdout


def _toy_model_losses(stdout):
  """{step: eval loss} of the toy model's output; checks the final line."""
  losses = {int(s): float(v) for s, v in re.findall(
      r"^step (\d+): eval loss ([\d.e+-]+)$", stdout, re.MULTILINE)}
  final = re.search(r"^toy_model: eval loss ([\d.e+-]+) at step (\d+) -> "
                    r"([\d.e+-]+) at step (\d+) \(", stdout, re.MULTILINE)
  assert final, stdout
  assert losses[int(final.group(2))] == pytest.approx(float(final.group(1)))
  assert losses[int(final.group(4))] == pytest.approx(float(final.group(3)))
  return losses


@pytest.mark.parametrize("mesh_shape,layout,mesh_impl,optimizer,lr", [
    ("all:8", "hidden_odd:all", "placement", "SGD", "0.1"),
    ("b:2;m:4", "batch:b;hidden_odd:m", "simd", "Adafactor", "0"),
])
def test_toy_model_loss_decreases(tmp_path, mesh_shape, layout, mesh_impl,
                                  optimizer, lr):
  stdout = _run_example(
      "toy_model", f"--mesh_shape={mesh_shape}", f"--layout={layout}",
      f"--mesh_impl={mesh_impl}", f"--optimizer={optimizer}", f"--lr={lr}",
      "--batch_size=16", "--io_size=8", "--hidden_size=16",
      "--num_hidden_layers=2", "--master_dtype=float32",
      "--slice_dtype=float32", "--activation_dtype=float32",
      "--train_steps=30", "--steps_per_checkpoint=15", "--iterations=5",
      f"--model_dir={tmp_path}")
  losses = _toy_model_losses(stdout)
  assert sorted(losses) == [1, 15, 30]
  assert losses[30] < losses[15] < losses[1]
  assert os.path.exists(tmp_path / "checkpoint")


def test_toy_model_use_tpu_trains_like_placement(tmp_path):
  """--use_tpu --tpu=... on a simulated 8-core TPU slice."""
  args = ["--mesh_shape=b:2;m:4", "--layout=batch:b;hidden_odd:m",
          "--batch_size=16", "--io_size=8", "--hidden_size=16",
          "--master_dtype=float32", "--train_steps=10",
          "--steps_per_checkpoint=5", "--iterations=5"]
  stdout = _run_example(
      "toy_model", "--use_tpu", "--tpu=my-tpu", "--tpu_zone=us-central1-b",
      "--gcp_project=my-project", f"--model_dir={tmp_path / 'tpu'}", *args,
      simulated_tpu=True)
  assert "TPUClusterResolver my-tpu us-central1-b my-project" in stdout
  assert "mesh impl SimdMeshImpl tpu" in stdout
  placement = _run_example("toy_model", f"--model_dir={tmp_path / 'p'}",
                           *args)
  tpu_losses = _toy_model_losses(stdout)
  assert sorted(tpu_losses) == [1, 5, 10]
  assert tpu_losses == pytest.approx(_toy_model_losses(placement), rel=1e-4)


def test_toy_model_resumes_from_model_dir(tmp_path):
  args = ["--batch_size=8", "--io_size=4", "--hidden_size=8",
          "--steps_per_checkpoint=5", "--iterations=5",
          f"--model_dir={tmp_path}"]
  first = _toy_model_losses(_run_example("toy_model", "--train_steps=5",
                                         *args))
  assert sorted(first) == [1, 5]
  # The second run starts from the checkpoint of step 5.
  second = _toy_model_losses(_run_example("toy_model", "--train_steps=10",
                                          *args))
  assert sorted(second) == [10]
  assert second[10] < first[5]
  # Already trained: it only evaluates.
  third = _toy_model_losses(_run_example("toy_model", "--train_steps=10",
                                         *args))
  assert third == pytest.approx(second)


def test_mnist_trains_on_generated_digits(tmp_path):
  stdout = _run_example(
      "mnist", "--mesh_shape=b1:2;b2:2",
      "--layout=row_blocks:b1;col_blocks:b2",
      f"--data_dir={tmp_path / 'no_data'}", f"--model_dir={tmp_path / 'm'}",
      "--batch_size=20", "--hidden_size=32", "--train_epochs=2",
      "--epochs_between_evals=1", "--eval_steps=1", "--iterations=2",
      "--num_train_examples=40", "--num_test_examples=40")
  epochs = re.findall(r"^epoch (\d+): test loss ([\d.]+), accuracy ([\d.]+)$",
                      stdout, re.MULTILINE)
  assert [int(e) for e, _, _ in epochs] == [1, 2], stdout
  final = re.search(
      r"^mnist \(generated digits\): test accuracy ([\d.]+), loss ([\d.]+) "
      r"after 2 epochs \(4 steps, ", stdout, re.MULTILINE)
  assert final, stdout
  assert 0 <= float(final.group(1)) <= 1
  assert np.isfinite(float(final.group(2)))


def test_mnist_uses_tfds_mnist_in_data_dir(tmp_path):
  data_dir = tmp_path / "tfds"
  (data_dir / "mnist").mkdir(parents=True)
  stdout = _run_example(
      "mnist", f"--data_dir={data_dir}", f"--model_dir={tmp_path / 'm'}",
      "--batch_size=20", "--hidden_size=16", "--train_epochs=1",
      "--mesh_impl=simd", mock_tfds_dir=data_dir)
  # 40 mock examples in each split: 2 training steps, 2 test batches.
  assert re.search(r"^mnist \(TFDS mnist\): test accuracy [\d.]+, loss "
                   r"[\d.]+ after 1 epochs \(2 steps, ", stdout,
                   re.MULTILINE), stdout


def _load_digits_data():
  spec = importlib.util.spec_from_file_location(
      "digits_data", os.path.join(EXAMPLES, "digits_data.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_generated_digits_are_deterministic_balanced_images():
  digits_data = _load_digits_data()
  (train_x, train_y), (test_x, test_y) = digits_data.train_and_test(50, 20)
  assert train_x.shape == (50, 28, 28) and train_x.dtype == np.float32
  assert test_x.shape == (20, 28, 28) and test_y.dtype == np.int32
  assert 0 <= train_x.min() and train_x.max() <= 1
  assert np.bincount(train_y, minlength=10).tolist() == [5] * 10
  again_x, again_y = digits_data.make_digits(50, seed=1)
  np.testing.assert_array_equal(again_x, train_x)
  np.testing.assert_array_equal(again_y, train_y)
  assert not np.array_equal(train_x[:20], test_x)
  # The ink is near the middle, as in MNIST.
  ink = train_x.mean(axis=0)
  assert ink[8:20, 8:20].mean() > 3 * ink[:4].mean()


def _load_transformer_demo():
  spec = importlib.util.spec_from_file_location(
      "transformer_demo", os.path.join(EXAMPLES, "transformer_demo.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_transformer_demo_says_what_it_gets_wrong(tmp_path):
  # The eval files `make demo` reads, as the binary's eval mode writes them.
  demo = _load_transformer_demo()
  (tmp_path / "addition_inputs").write_text("12+30\n250+250\n999+1\n")
  (tmp_path / "addition_targets").write_text("42\n500\n1000\n")
  (tmp_path / "addition_7_predictions").write_text("42\n400\n1000\n")
  mistakes = demo._eval_mistakes(str(tmp_path), 7)
  assert mistakes == ([("250+250", "400", "500")], 3)
  assert demo._mark("250+251", "401", "501") == (
      "     250+251 -> 401   (1 carry) WRONG, expected 501")
  assert demo._mark("999+1", "1000", "1000").endswith("(3 carries) right")
  text = demo._verdict({"0": 1.0, "1": 0.5, "3": 1.0}, mistakes,
                       ["12+30", "250+251"], ["42", "401"])
  assert text.startswith(
      "What it gets wrong: 1 of the 3 held-out sums (1 carry 50.0% wrong), "
      "e.g. 250+250 -> 400 (expected 500). Served: 250+251 -> 401.")
  assert "Served" not in demo._verdict({"1": 0.5}, mistakes, ["1+1"], ["2"])
  assert demo._verdict({"0": 1.0}, ([], 3), ["1+1"], ["2"]).startswith(
      "The model gets every held-out sum")
  # The served sums cover every number of carries from 0 to 3.
  assert {demo._carries(q) for q in demo.SERVED} == {0, 1, 2, 3}
