"""Parallelism strategies beyond the original Mesh TensorFlow.

Each plugs into the core through its declared extension points
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
- `autostack`: same-shaped variables stored as one per processor (a
  storage planner of the Lowering).
"""

from mesh_tensorflow.parallel import autostack
from mesh_tensorflow.parallel import data_parallel_sharding
from mesh_tensorflow.parallel import gradient_batching
from mesh_tensorflow.parallel import idle_slots
from mesh_tensorflow.parallel import layer_stacking
from mesh_tensorflow.parallel import pipelining
from mesh_tensorflow.parallel.data_parallel_sharding import DataParallelSharding
from mesh_tensorflow.parallel.data_parallel_sharding import shard_data_parallel
from mesh_tensorflow.parallel.layer_stacking import stack_layer_variables
from mesh_tensorflow.parallel.pipelining import pipeline
