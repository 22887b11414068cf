"""Calibration from programs that cannot run it eagerly, and its errors.

A program in tf.compat.v1 graph mode measures the machine in a fresh
process (the calibration command) that sees its devices and fills the same
cache; a failed measurement is one CalibrationError saying what failed and
how to fix it.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from mesh_tensorflow.auto_mtf import calibration
from mesh_tensorflow.auto_mtf import calibration_subprocess
from mesh_tensorflow.auto_mtf import machine

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# A user's TF1-style script: v2 behaviour off first, the CPU split into 8
# logical devices, a small training step's graph, then the time objective
# with nothing cached (twice: the second reads the cache).
GRAPH_MODE_SCRIPT = textwrap.dedent("""
    import json
    import sys
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
    import mesh_tensorflow as mtf
    import mesh_tensorflow.auto_mtf
    from mesh_tensorflow.auto_mtf import calibration_subprocess

    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    x = mtf.get_variable(mesh, "x", "batch:64,io:32")
    w = mtf.get_variable(mesh, "w", "io:32,hidden:128")
    loss = mtf.reduce_sum(mtf.square(mtf.einsum([x, w], "batch:64,hidden:128")))
    choice = mtf.auto_mtf.api.choose_layout(
        graph, "b:2;m:4", [loss], objective="time", quick_calibration=True)

    def no_second_process(*args, **kwargs):
      raise AssertionError("measured again although cached")
    calibration_subprocess.run = no_second_process
    again = mtf.auto_mtf.api.choose_layout(
        graph, "b:2;m:4", [loss], objective="time", quick_calibration=True)
    json.dump({"eager": tf.executing_eagerly(),
               "rules": choice.layout_rules.to_string,
               "again": again.layout_rules.to_string,
               "predicted": choice.predicted_step_seconds},
              open(sys.argv[1], "w"))
""")


def test_graph_mode_script_calibrates_in_a_fresh_process(tmp_path):
  cache_dir = tmp_path / "cache"
  script = tmp_path / "script.py"
  script.write_text(GRAPH_MODE_SCRIPT)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join(
                 p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
  env[machine.CACHE_DIR_ENV] = str(cache_dir)
  result = subprocess.run(
      [sys.executable, str(script), str(tmp_path / "result.json")],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads((tmp_path / "result.json").read_text())
  assert out["eager"] is False
  assert out["predicted"] > 0
  assert out["again"] == out["rules"]
  # One measurement, of the script's 8 logical CPUs: the key this process
  # (also 8 logical CPUs) gives the mesh, so a TF2 program reads it too.
  path = machine.cache_path("b:2;m:4", cache_dir=str(cache_dir), quick=True)
  assert os.listdir(cache_dir) == [os.path.basename(path)]
  with open(path) as f:
    entry = json.load(f)
  assert entry["key"] == machine.cache_key(
      "b:2;m:4", machine.placement_mesh_impl.default_devices(8), "placement",
      quick=True)
  assert entry["key"]["devices"] == "8 CPU"
  assert machine.load_or_calibrate("b:2;m:4", cache_dir=str(cache_dir),
                                   quick=True) == machine.for_mesh(
                                       machine.MachineConstants.from_dict(
                                           entry["constants"]), "b:2;m:4")


def _in_graph_mode(**kwargs):
  """load_or_calibrate where programs cannot run eagerly (a tf.Graph)."""
  with tf.Graph().as_default():
    return machine.load_or_calibrate(**kwargs)


def test_failed_child_is_one_line_with_the_fix(tmp_path):
  """The child's own error, not its traceback, and what to do."""
  with pytest.raises(machine.CalibrationError) as info:
    _in_graph_mode(mesh_shape="b:2", devices=["/device:CPU:0",
                                              "/device:CPU:42"],
                   cache_dir=str(tmp_path), quick=True)
  error = info.value
  assert "exited with status 1" in error.reason
  assert "device '/device:CPU:42' is not a device of the calibration " \
         "process" in error.reason
  assert error.command.startswith(
      "python -m mesh_tensorflow.auto_mtf.calibration --mesh_shape b:2 ")
  assert "--devices /device:CPU:0,/device:CPU:42" in error.command
  message = str(error)
  assert "\n" not in message and "Traceback" not in message
  assert f"run `{error.command}`" in message
  assert "objective='memory'" in message and "machine=" in message
  assert not os.listdir(tmp_path)


def test_hung_child_and_other_tasks_devices_are_errors(tmp_path, monkeypatch):
  monkeypatch.setattr(calibration_subprocess, "TIMEOUT_SECONDS", 0.01)
  with pytest.raises(machine.CalibrationError,
                     match=r"did not finish within 0\.01 s"):
    _in_graph_mode(mesh_shape="b:2", cache_dir=str(tmp_path), quick=True)
  with pytest.raises(machine.CalibrationError,
                     match=r"devices of other tasks \(/job:worker/task:1"):
    _in_graph_mode(mesh_shape="b:2", cache_dir=str(tmp_path),
                   devices=["/device:CPU:0",
                            "/job:worker/task:1/device:CPU:0"])


def test_in_process_failure_is_a_calibration_error(tmp_path, monkeypatch):
  def out_of_memory(*args, **kwargs):
    raise tf.errors.ResourceExhaustedError(None, None, "OOM\nwhen allocating")
  monkeypatch.setattr(machine, "calibrate_devices", out_of_memory)
  with pytest.raises(machine.CalibrationError) as info:
    machine.load_or_calibrate("b:2", cache_dir=str(tmp_path))
  assert info.value.reason == "ResourceExhaustedError: OOM when allocating"
  assert "--quick" not in info.value.command


def test_error_line_is_the_childs_error_or_last_line():
  assert calibration_subprocess.error_line(
      "I0000 log\nerror: ValueError: bad mesh\n") == "ValueError: bad mesh"
  traceback = ('Traceback (most recent call last):\n  File "x.py", line 1\n'
               "RuntimeError: boom\n")
  assert calibration_subprocess.error_line(traceback) == "RuntimeError: boom"
  assert calibration_subprocess.error_line("") == "no output"


def test_calibration_command_measures_once_and_caches(tmp_path, capsys):
  """The README's command (quick here), in this process: it measures the
  mesh on 8 logical CPUs, caches it where load_or_calibrate looks, and a
  second run reads the cache."""
  args = ["--mesh_shape", "b:2;m:4", "--quick", "--cache_dir", str(tmp_path)]
  assert calibration.main(args) == 0
  printed = capsys.readouterr().out
  path = machine.cache_path("b:2;m:4", cache_dir=str(tmp_path), quick=True)
  constants, key = machine.load_cached("b:2;m:4", cache_dir=str(tmp_path),
                                       quick=True)
  assert key["quick"] and key["devices"] == "8 CPU"
  assert printed.strip() == (
      "auto_mtf: machine constants of mesh b:2;m:4 (placement on 8 CPU, "
      f"{constants.source}) cached in {path}")
  assert os.listdir(tmp_path) == [os.path.basename(path)]
  before = os.path.getmtime(path)
  assert calibration.main(args) == 0
  assert os.path.getmtime(path) == before
  assert calibration.main(["--mesh_shape", "b:2;m:4", "--logical_cpus", "4",
                           "--cache_dir", str(tmp_path)]) == 1
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      "error: ValueError: TensorFlow already started with 8 logical CPU(s), "
      "not the 4 asked for; run the command in a fresh process.")


def test_op_overhead_chain_crosses_devices():
  # The op overhead is measured on a lowered chain whose every step reads
  # a shared replica from another processor: its factor runs once per
  # step, its split tensor on every processor.
  shape = machine.mesh_shape_of("p:2")
  program, inputs = machine.cross_device_chain(shape, ["/cpu:0"] * 2, 8)
  graph = program.get_concrete_function(*inputs).graph
  maxima = [op for op in graph.get_operations() if op.type == "Maximum"]
  assert len(maxima) == 4 + 2 * 4
