"""NumpyConverter: move values between NumPy and a one-processor mtf graph."""

import numpy as np
import tensorflow as tf

from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import lowering as lowering_lib
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import shape as shape_lib
from mesh_tensorflow.ops import constants


class NumpyConverter:
  """Owns an mtf Graph and Mesh ("mtf_mesh") for tests written with NumPy.

  Made in `tf.compat.v1` graph mode, it also owns a Session of the TF graph
  it was made in (`session`), which evaluates its conversions; made in eager
  code it has none (eager values need no session).
  """

  def __init__(self):
    self._graph = graph_lib.Graph()
    self._mesh = graph_lib.Mesh(self._graph, "mtf_mesh")
    self._mesh_impl = placement_mesh_impl.PlacementMeshImpl("all:1", "")
    self._tf_graph = (None if tf.executing_eagerly() else
                      tf.compat.v1.get_default_graph())
    self._session = None

  @property
  def graph(self):
    return self._graph

  @property
  def mesh(self):
    return self._mesh

  @property
  def session(self):
    """The tf.compat.v1.Session of the converter's TF graph (graph mode),
    made on first use; None when the converter was made eagerly."""
    if self._session is None and self._tf_graph is not None:
      self._session = tf.compat.v1.Session(graph=self._tf_graph)
    return self._session

  def convert_np_array_to_mtf_tensor(self, x, dim_names=None,
                                     dtype=tf.int32):
    """A constant mtf Tensor with dimensions `dim_names` (default dim0...)."""
    x = np.asarray(x)
    if dim_names is None:
      dim_names = [f"dim{i}" for i in range(x.ndim)]
    shape = shape_lib.Shape([shape_lib.Dimension(n, s)
                             for n, s in zip(dim_names, x.shape)])
    return constants.constant(self._mesh, x, shape, dtype=dtype)

  def convert_mtf_tensor_to_tf_tensor(self, mtf_tensor):
    """Lowers the graph on one processor: (lowering, full tf.Tensor)."""
    lowering = lowering_lib.Lowering(self._graph,
                                     {self._mesh: self._mesh_impl})
    return lowering, lowering.export_to_tf_tensor(mtf_tensor)

  def convert_mtf_tensor_to_np_array(self, x_mtf):
    """The value of `x_mtf` as a NumPy array (eager, or in graph mode run in
    `session` after initializing the variables)."""
    lowering, tf_tensor = self.convert_mtf_tensor_to_tf_tensor(x_mtf)
    if tf.executing_eagerly():
      return tf_tensor.numpy()
    session = self.session
    if session is None or session.graph is not tf_tensor.graph:
      raise ValueError(
          "NumpyConverter: convert in the TF graph the converter was made "
          "in (make it inside `with tf.Graph().as_default():` for graph "
          "mode).")
    with session.graph.as_default():
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(lowering.copy_masters_to_slices())
    return session.run(tf_tensor)
