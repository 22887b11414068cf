"""Parallelism strategies beyond the original Mesh TensorFlow.

(Not called `parallel`: `mtf.parallel` is the original's function that
calls a function once per device, and a subpackage of that name would
shadow it.) Each plugs into the core through its declared extension points
(mesh_tensorflow.extensions), never the reverse: the core imports nothing
from here.

- `pipelining`: `mtf.pipeline`, GSPMD's formulation of GPipe, with
  `idle_slots` (an annotation letting idle stages skip their work) and
  `gradient_batching` (a gradient rewrite summing a weight's repeated
  gradient terms with one einsum).
- `layer_stacking`: `mtf.stack_layer_variables`, the weights of S identical
  layers as one variable (a variable creator).
- `data_parallel_sharding`: `mtf.shard_data_parallel`, sharded weight
  updates and parameters (ZeRO; a mesh extension).
"""

from mesh_tensorflow.strategies import data_parallel_sharding
from mesh_tensorflow.strategies import gradient_batching
from mesh_tensorflow.strategies import idle_slots
from mesh_tensorflow.strategies import layer_stacking
from mesh_tensorflow.strategies import pipelining
from mesh_tensorflow.strategies.data_parallel_sharding import DataParallelSharding
from mesh_tensorflow.strategies.data_parallel_sharding import shard_data_parallel
from mesh_tensorflow.strategies.layer_stacking import stack_layer_variables
from mesh_tensorflow.strategies.pipelining import pipeline
