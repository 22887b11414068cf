"""Mesh TensorFlow for TensorFlow 2: `import mesh_tensorflow as mtf`.

Every tensor dimension has a name, a mesh of processors has named dimensions,
and layout rules say which tensor dimensions are split over which mesh
dimensions. Build an `mtf.Graph`, lower it with `mtf.Lowering` through a mesh
implementation, and run the resulting TensorFlow ops.
"""

from mesh_tensorflow import autograph_rules
from mesh_tensorflow.storage import checkpointing
from mesh_tensorflow import cluster
from mesh_tensorflow import errors
from mesh_tensorflow import extensions
from mesh_tensorflow import mesh_impl
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow.backend import processors
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow.backend import tpu_topology
from mesh_tensorflow.errors import DTypeError
from mesh_tensorflow.errors import IndivisibleError
from mesh_tensorflow.errors import LayoutError
from mesh_tensorflow.errors import ShapeError
from mesh_tensorflow.gradients import gradients
from mesh_tensorflow.graph import Graph
from mesh_tensorflow.graph import Mesh
from mesh_tensorflow.graph import Operation
from mesh_tensorflow.graph import Tensor
from mesh_tensorflow.graph import VariableDType
from mesh_tensorflow.lowering import log_variable_sizes
from mesh_tensorflow.lowering import Lowering
from mesh_tensorflow.lowering import pretty_print_counters
from mesh_tensorflow.mesh_impl import compatible_lazy_allreduce_sums
from mesh_tensorflow.mesh_impl import convert_args_to_laid_out_tensors
from mesh_tensorflow.mesh_impl import LaidOutTensor
from mesh_tensorflow.mesh_impl import LazyAllreduceSum
from mesh_tensorflow.mesh_impl import LazyLaidOutTensor
from mesh_tensorflow.mesh_impl import MeshImpl
from mesh_tensorflow.ops import *  # pylint: disable=wildcard-import
from mesh_tensorflow.ops import mtf_abs as abs  # pylint: disable=redefined-builtin
from mesh_tensorflow.ops import mtf_pow as pow  # pylint: disable=redefined-builtin
from mesh_tensorflow.ops import mtf_range as range  # pylint: disable=redefined-builtin
from mesh_tensorflow.ops import mtf_slice as slice  # pylint: disable=redefined-builtin
from mesh_tensorflow.padding_report import padding_report
from mesh_tensorflow.backend.processors import pnum_to_group
from mesh_tensorflow.backend.processors import pnum_to_processor_coordinates
from mesh_tensorflow.backend.processors import processor_coordinates_to_pnum
from mesh_tensorflow.backend.processors import processor_groups
from mesh_tensorflow.storage.session_hooks import MtfCheckpointSaverListener
from mesh_tensorflow.storage.session_hooks import MtfRestoreHook
from mesh_tensorflow.shape import anonymous_shape
from mesh_tensorflow.shape import convert_to_dimension
from mesh_tensorflow.shape import convert_to_layout_rules
from mesh_tensorflow.shape import convert_to_shape
from mesh_tensorflow.shape import Dimension
from mesh_tensorflow.shape import is_subsequence
from mesh_tensorflow.shape import LayoutRules
from mesh_tensorflow.shape import list_product
from mesh_tensorflow.shape import Shape
from mesh_tensorflow.shape import shard_dimension_name
from mesh_tensorflow.shape import tensor_dim_to_mesh_dim_size
from mesh_tensorflow.shape import tensor_dim_to_size_per_split
from mesh_tensorflow.shape import TensorLayout
from mesh_tensorflow.shape import verify_no_new_dims
from mesh_tensorflow.version import __version__

# The strategies beyond the original (pipelining, layer stacking,
# data-parallel sharding, gradient batching), plugged into the core through
# mesh_tensorflow.extensions. Importing them registers nothing: each is
# active where a program asks for it (a scope, a graph, a mesh, an
# annotated operation); see tests/test_import_registrations.py.
from mesh_tensorflow import strategies  # pylint: disable=g-bad-import-order
from mesh_tensorflow.strategies import DataParallelSharding  # pylint: disable=g-bad-import-order
from mesh_tensorflow.strategies import pipeline  # pylint: disable=g-bad-import-order
from mesh_tensorflow.strategies import shard_data_parallel  # pylint: disable=g-bad-import-order
from mesh_tensorflow.strategies import stack_layer_variables  # pylint: disable=g-bad-import-order

# Library modules built on the language; imported last because they use
# `mesh_tensorflow` itself.
from mesh_tensorflow import layers  # pylint: disable=g-bad-import-order
from mesh_tensorflow import optimize  # pylint: disable=g-bad-import-order
from mesh_tensorflow import beam_search  # pylint: disable=g-bad-import-order
from mesh_tensorflow import test_utils  # pylint: disable=g-bad-import-order
from mesh_tensorflow import utils  # pylint: disable=g-bad-import-order

# The two changes this import makes to TensorFlow's namespaces. (In this
# package, only the ops package, imported above, sets attributes of another
# module: Tensor's operators, see ops/tensor_methods.py. Gin registration
# goes through `configurable` and rebinds nothing.)
# 1. A do-not-convert rule for tf.function's autograph (autograph_rules.py).
autograph_rules.register()

# 2. TensorFlow 2.16+ has no tf.estimator; gin-config's `gin.tf` (imported by
# the original's clients, e.g. T5) needs tf.estimator.SessionRunHook. Installs
# a small stand-in as `tf.estimator` (also under tf.compat.v1 and v2) only where
# TensorFlow lacks one; see tf_estimator_shim.py.
from mesh_tensorflow.estimator import tf_estimator_shim  # pylint: disable=g-bad-import-order,g-import-not-at-top
tf_estimator_shim.install()
del tf_estimator_shim
