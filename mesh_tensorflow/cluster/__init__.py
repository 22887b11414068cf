"""Training on a TensorFlow cluster of several processes or machines.

Every machine runs one task. The chief runs the program; the others serve:

    # on host1 (and every other non-chief task):
    python -m mesh_tensorflow.cluster --worker_hosts=host0:2222,host1:2222 \\
        --task_index=1 --num_cpus=4

    # on host0, in the training program:
    cluster = mtf.cluster.connect("host0:2222,host1:2222", task_index=0,
                                  num_cpus=4)
    mesh_impl = cluster.placement_mesh_impl("b:2;m:4", "batch:b;hidden:m")

A binary run with the same flags on every task calls `start`: the chief gets
the connected Cluster, the other tasks serve.

`ClusterSpec` parses the tasks (TF_CONFIG or flags), `Cluster` connects and
names every task's devices (task by task, chief first), `serve` is what
the other tasks run, and `Cluster.failures()` turns a dead task's
TensorFlow error into a `ClusterError` naming it.

Private networks only: every task (the chief too) runs TensorFlow's gRPC
server, which listens on every interface whatever its address's host
(TensorFlow 2.21 cannot bind it to one address) and runs any graph sent to
it without authentication. Each task warns at start-up when its port is
reachable beyond loopback (exposure.py); README.md's "Security" says how
to close it (a firewall, a private network, SSH tunnels).
"""

from mesh_tensorflow.cluster.launch import start
from mesh_tensorflow.cluster.runtime import Cluster
from mesh_tensorflow.cluster.runtime import ClusterError
from mesh_tensorflow.cluster.runtime import configure_local_cpus
from mesh_tensorflow.cluster.runtime import connect
from mesh_tensorflow.cluster.runtime import serve
from mesh_tensorflow.cluster.runtime import server_config
from mesh_tensorflow.cluster.runtime import start_server
from mesh_tensorflow.cluster.runtime import wait_for_tasks
from mesh_tensorflow.cluster.spec import ClusterSpec
from mesh_tensorflow.cluster.spec import ClusterSpecError
from mesh_tensorflow.cluster.spec import Task
from mesh_tensorflow.cluster.watchdog import Watchdog
