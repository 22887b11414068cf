"""The mtf operation catalogue, one module per family of operations."""

from mesh_tensorflow.ops.binary import add
from mesh_tensorflow.ops.binary import add_n
from mesh_tensorflow.ops.binary import AddNOperation
from mesh_tensorflow.ops.binary import AddOperation
from mesh_tensorflow.ops.binary import divide
from mesh_tensorflow.ops.binary import maximum
from mesh_tensorflow.ops.binary import minimum
from mesh_tensorflow.ops.binary import MinMaxOperation
from mesh_tensorflow.ops.binary import mtf_pow
from mesh_tensorflow.ops.binary import multiply
from mesh_tensorflow.ops.binary import ScalarAddOperation
from mesh_tensorflow.ops.binary import ScalarMultiplyOperation
from mesh_tensorflow.ops.binary import sub
from mesh_tensorflow.ops.binary import where
from mesh_tensorflow.ops.binary import WhereOperation
from mesh_tensorflow.ops.comparisons import binary_arguments_to_tensors
from mesh_tensorflow.ops.comparisons import binary_op_with_broadcasting
from mesh_tensorflow.ops.comparisons import BinaryOpWithBroadcasting
from mesh_tensorflow.ops.comparisons import equal
from mesh_tensorflow.ops.comparisons import floordiv
from mesh_tensorflow.ops.comparisons import greater
from mesh_tensorflow.ops.comparisons import greater_equal
from mesh_tensorflow.ops.comparisons import less
from mesh_tensorflow.ops.comparisons import less_equal
from mesh_tensorflow.ops.comparisons import logical_and
from mesh_tensorflow.ops.comparisons import logical_or
from mesh_tensorflow.ops.comparisons import mod
from mesh_tensorflow.ops.comparisons import not_equal
from mesh_tensorflow.ops.constants import Constant
from mesh_tensorflow.ops.constants import constant
from mesh_tensorflow.ops.constants import import_fully_replicated
from mesh_tensorflow.ops.constants import import_laid_out_tensor
from mesh_tensorflow.ops.constants import ImportLaidOutTensorOperation
from mesh_tensorflow.ops.constants import import_tf_tensor
from mesh_tensorflow.ops.constants import ImportOperation
from mesh_tensorflow.ops.constants import mtf_range
from mesh_tensorflow.ops.constants import ones
from mesh_tensorflow.ops.constants import ones_like
from mesh_tensorflow.ops.constants import RangeOperation
from mesh_tensorflow.ops.constants import zeros
from mesh_tensorflow.ops.constants import zeros_like
from mesh_tensorflow.ops.contractions import einsum
from mesh_tensorflow.ops.contractions import EinsumOperation
from mesh_tensorflow.ops.contractions import matmul
from mesh_tensorflow.ops.contractions import transpose
from mesh_tensorflow.ops.elementwise import cast
from mesh_tensorflow.ops.elementwise import cos
from mesh_tensorflow.ops.elementwise import elu
from mesh_tensorflow.ops.elementwise import exp
from mesh_tensorflow.ops.elementwise import gelu
from mesh_tensorflow.ops.elementwise import identity
from mesh_tensorflow.ops.elementwise import leaky_relu
from mesh_tensorflow.ops.elementwise import log
from mesh_tensorflow.ops.elementwise import logical_not
from mesh_tensorflow.ops.elementwise import mtf_abs
from mesh_tensorflow.ops.elementwise import negative
from mesh_tensorflow.ops.elementwise import reciprocal
from mesh_tensorflow.ops.elementwise import relu
from mesh_tensorflow.ops.elementwise import rsqrt
from mesh_tensorflow.ops.elementwise import selu
from mesh_tensorflow.ops.elementwise import sigmoid
from mesh_tensorflow.ops.elementwise import sign
from mesh_tensorflow.ops.elementwise import sin
from mesh_tensorflow.ops.elementwise import softplus
from mesh_tensorflow.ops.elementwise import sqrt
from mesh_tensorflow.ops.elementwise import square
from mesh_tensorflow.ops.elementwise import stop_gradient
from mesh_tensorflow.ops.elementwise import StopGradient
from mesh_tensorflow.ops.elementwise import swish
from mesh_tensorflow.ops.elementwise import tanh
from mesh_tensorflow.ops.elementwise import to_bfloat16
from mesh_tensorflow.ops.elementwise import to_float
from mesh_tensorflow.ops.elementwise import to_int32
from mesh_tensorflow.ops.indexing import gather
from mesh_tensorflow.ops.indexing import GatherOperation
from mesh_tensorflow.ops.indexing import one_hot
from mesh_tensorflow.ops.indexing import OneHotOperation
from mesh_tensorflow.ops.reduce import broadcast
from mesh_tensorflow.ops.reduce import BroadcastOperation
from mesh_tensorflow.ops.reduce import reduce_all
from mesh_tensorflow.ops.reduce import reduce_any
from mesh_tensorflow.ops.reduce import reduce_max
from mesh_tensorflow.ops.reduce import reduce_mean
from mesh_tensorflow.ops.reduce import reduce_min
from mesh_tensorflow.ops.reduce import reduce_sum
from mesh_tensorflow.ops.reduce import ReduceOperation
from mesh_tensorflow.ops.softmax import log_softmax
from mesh_tensorflow.ops.softmax import reduce_logsumexp
from mesh_tensorflow.ops.softmax import softmax
from mesh_tensorflow.ops.softmax import SoftmaxGradOperation
from mesh_tensorflow.ops.softmax import SoftmaxOperation
from mesh_tensorflow.ops.reshapes import anonymize
from mesh_tensorflow.ops.reshapes import combined_dimension
from mesh_tensorflow.ops.reshapes import rename_dimension
from mesh_tensorflow.ops.reshapes import replace_dimensions
from mesh_tensorflow.ops.reshapes import reshape
from mesh_tensorflow.ops.reshapes import ReshapeOperation
from mesh_tensorflow.ops.slicewise_ops import cwise
from mesh_tensorflow.ops.slicewise_ops import GenericGradOperation
from mesh_tensorflow.ops.slicewise_ops import slicewise
from mesh_tensorflow.ops.slicewise_ops import SlicewiseOperation
from mesh_tensorflow.ops.slicing import concat
from mesh_tensorflow.ops.slicing import ConcatOperation
from mesh_tensorflow.ops.slicing import mtf_slice
from mesh_tensorflow.ops.slicing import pad
from mesh_tensorflow.ops.slicing import PadOperation
from mesh_tensorflow.ops.slicing import SliceOperation
from mesh_tensorflow.ops.variables import assign
from mesh_tensorflow.ops.variables import assign_add
from mesh_tensorflow.ops.variables import assign_add_slice
from mesh_tensorflow.ops.variables import Assign
from mesh_tensorflow.ops.variables import assign_slice
from mesh_tensorflow.ops.variables import assign_sub
from mesh_tensorflow.ops.variables import assign_sub_slice
from mesh_tensorflow.ops.variables import create_slot
from mesh_tensorflow.ops.variables import get_variable
from mesh_tensorflow.ops.variables import read_variable
from mesh_tensorflow.ops.variables import ReadVariable
from mesh_tensorflow.ops.variables import Variable
from mesh_tensorflow.ops.variables import VariableView

# Families whose modules list their public names in __all__.
# pylint: disable=wildcard-import
from mesh_tensorflow.ops.control_flow import *
from mesh_tensorflow.ops.convolution import *
from mesh_tensorflow.ops.debug import *
from mesh_tensorflow.ops.pooling import *
from mesh_tensorflow.ops.random_ops import *
from mesh_tensorflow.ops.scans import *
from mesh_tensorflow.ops.selection import *
from mesh_tensorflow.ops.shifts import *
from mesh_tensorflow.ops.stacked_variable import *
from mesh_tensorflow.ops.stacking import *
from mesh_tensorflow.ops.tf_helpers import *
# pylint: enable=wildcard-import

__all__ = [name for name in dir() if not name.startswith("_")]

# Tensor's operators (+, -, *, /, //, %, unary -) come from the ops, which
# graph.py does not import: installed here, once (see tensor_methods.py).
from mesh_tensorflow.ops import tensor_methods  # pylint: disable=g-bad-import-order
tensor_methods.register_tensor_methods()
del tensor_methods
