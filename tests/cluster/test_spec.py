"""Parsing a cluster from TF_CONFIG or flags, and the chief's start-up
checks (no TensorFlow servers are started here)."""

import json
import socket

import pytest

from mesh_tensorflow import cluster


def test_worker_hosts_and_task_index():
  spec = cluster.ClusterSpec.from_worker_hosts("a:1, b:2,c:3", 1)
  assert spec.jobs == {"worker": ["a:1", "b:2", "c:3"]}
  assert spec.task == cluster.Task("worker", 1, "b:2")
  assert spec.task.name == "/job:worker/task:1"
  assert not spec.is_chief
  assert cluster.ClusterSpec.from_worker_hosts("a:1,b:2", 0).is_chief
  assert spec.as_tf_config() == {"cluster": {"worker": ["a:1", "b:2", "c:3"]},
                                 "task": {"type": "worker", "index": 1}}


def test_tf_config_orders_chief_first(monkeypatch):
  config = {"cluster": {"ps": ["p:9"], "worker": ["w0:1", "w1:1"],
                        "chief": ["c:1"]},
            "task": {"type": "worker", "index": 1}}
  monkeypatch.setenv("TF_CONFIG", json.dumps(config))
  spec = cluster.ClusterSpec.from_tf_config()
  assert [t.name for t in spec.tasks] == [
      "/job:chief/task:0", "/job:worker/task:0", "/job:worker/task:1",
      "/job:ps/task:0"]
  assert spec.task.address == "w1:1"
  assert cluster.ClusterSpec.from_tf_config(
      dict(config, task={"type": "chief", "index": 0})).is_chief
  assert spec.task_of_device(
      "/job:worker/replica:0/task:1/device:CPU:3").address == "w1:1"
  assert spec.task_of_device("/job:worker/replica:0/task:7/device:CPU:0") is (
      None)


@pytest.mark.parametrize("make, message", [
    (lambda: cluster.ClusterSpec.from_worker_hosts("a:1,b:2", 2),
     "task_index 2 is out of range"),
    (lambda: cluster.ClusterSpec.from_worker_hosts("a:1,b", 0),
     "'b' of job 'worker' is not host:port"),
    (lambda: cluster.ClusterSpec.from_worker_hosts("a:1,a:1", 0),
     "a:1 is given to two tasks"),
    (lambda: cluster.ClusterSpec.from_worker_hosts("", 0),
     "worker_hosts is empty"),
    (lambda: cluster.ClusterSpec.from_tf_config("{nope"),
     "not valid JSON"),
    (lambda: cluster.ClusterSpec.from_tf_config(
        {"cluster": {"worker": ["a:1"]}, "task": {"type": "chief"}}),
     "job 'chief' is not in the cluster"),
])
def test_bad_specs_name_the_fault(make, message):
  with pytest.raises(cluster.ClusterSpecError, match=message):
    make()


def test_missing_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(cluster.ClusterSpecError, match="TF_CONFIG is not set"):
    cluster.ClusterSpec.from_tf_config()


def test_only_the_chief_connects():
  spec = cluster.ClusterSpec.from_worker_hosts("a:1,b:2", 1)
  with pytest.raises(cluster.ClusterError, match="not the chief"):
    cluster.Cluster(spec)


def test_unreachable_task_at_start_up_is_named_within_the_timeout():
  # The probe fails before anything connects, so this runs in the test
  # process without touching its TensorFlow context.
  with socket.socket() as s:  # a port nobody listens on
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  with pytest.raises(cluster.ClusterError,
                     match=f"Cannot reach task /job:worker/task:1 at "
                     f"localhost:{port}") as info:
    cluster.connect(f"localhost:1,localhost:{port}", task_index=0,
                    startup_timeout=0.5)
  assert info.value.task == cluster.Task("worker", 1, f"localhost:{port}")


def test_server_entry_point_rejects_a_bad_spec(capsys):
  from mesh_tensorflow.cluster import __main__ as entry  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as info:
    entry.main(["--worker_hosts=a:1,b", "--task_index=1"])
  assert info.value.code == 2
  assert "Address 'b' of job 'worker' is not host:port" in (
      capsys.readouterr().err)
