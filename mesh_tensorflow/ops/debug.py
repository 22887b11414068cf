"""Print and scalar summaries."""

import contextlib

import tensorflow as tf
from tensorflow.core.framework import summary_pb2  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow import errors
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow.ops import cost_rules

__all__ = [
    "Print",
    "PrintOperation",
    "ScalarSummaryOperation",
    "scalar_summary",
]


class PrintOperation(graph_lib.Operation):
  """Identity of x that prints the full values of `data` when x is used."""

  handles_padding = True
  padding_stays_zero = True

  def __init__(self, x, data, message, name=None, **kwargs):
    super().__init__([x] + list(data), name=name or "Print")
    self._message = message
    self._print_kwargs = kwargs
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [grad_ys[0]] + [None] * (len(self._inputs) - 1)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    data = [lowering.export_to_tf_tensor(t) for t in self._inputs[1:]]
    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.Print(lowering.laid_out_tensor(self._inputs[0]), data,
                   self._message, **self._print_kwargs))


cost_rules.register(PrintOperation, cost_rules.SLICEWISE)


def Print(x, data, message, name=None, **kwargs):  # pylint: disable=invalid-name
  """Returns x; prints `message` and the full values of `data` (mtf Tensors)
  whenever x is computed. Works eagerly (prints at once), in tf.function and
  in graph mode. kwargs go to tf.print (e.g. summarize=-1)."""
  return PrintOperation(x, data, message, name=name, **kwargs).outputs[0]


_SUMMARY_COLLECTORS = []

# The TF graph collection of (name, scalar tf.Tensor) pairs that lowering a
# scalar_summary adds to outside eager execution, as in the original
# (`mtf.utils.create_host_call` reads it).
SCALAR_SUMMARIES_COLLECTION_KEY = "mtf_scalar_summaries"


@contextlib.contextmanager
def collect_scalar_summaries():
  """Within it, lowering a scalar_summary adds name -> tf scalar to the
  yielded dict instead of writing it.

  For callers that write the summaries elsewhere: e.g. outside a
  SimdMeshImpl program, whose per-device calls cannot share one summary
  writer.
  """
  collected = {}
  _SUMMARY_COLLECTORS.append(collected)
  try:
    yield collected
  finally:
    _SUMMARY_COLLECTORS.pop()


class ScalarSummaryOperation(graph_lib.Operation):
  """Identity of a scalar that records it as a summary named `name`.

  As in the original, `name` is both the summary's name and (made unique
  in the graph) the operation's. The value is kept in
  `lowering.scalar_summaries` (the training loop writes those), and written
  at once with tf.summary.scalar when a default summary writer and step are
  set.
  """

  def __init__(self, name, x):
    super().__init__([x], name=name)
    if x.shape.ndims:
      raise errors.ShapeError(
          f"scalar_summary {name!r}: {x.name} must be a scalar, got "
          f"{x.shape}.")
    self._summary_name = name
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return grad_ys

  def lower(self, lowering):
    x = self._inputs[0]
    value = lowering.export_to_tf_tensor(x)
    lowering.add_scalar_summary(self._summary_name, value)
    if not tf.executing_eagerly():
      tf.compat.v1.add_to_collection(SCALAR_SUMMARIES_COLLECTION_KEY,
                                     (self._summary_name, value))
    if _SUMMARY_COLLECTORS:
      _SUMMARY_COLLECTORS[-1][self._summary_name] = value
    else:
      write_scalar(self._summary_name, value)
    lowering.set_tensor_lowering(self._outputs[0], lowering.tensors[x])


# It exports its input and passes it on: one op, no slice work (the export's
# collectives on SimdMeshImpl are not modelled).
cost_rules.register(ScalarSummaryOperation, cost_rules.NO_WORK)


def write_scalar(name, value):
  """Writes a TensorBoard scalar if a default writer and step are set.

  Uses tf.summary.write with the scalars plugin's metadata, so it needs no
  TensorBoard installation.
  """
  if tf.summary.experimental.get_step() is None:
    return
  metadata = summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(
          plugin_name="scalars"))
  tf.summary.write(name, tf.cast(value, tf.float32),
                   metadata=metadata.SerializeToString())


def scalar_summary(name, x):
  """Records scalar x for TensorBoard under `name`; returns x."""
  return ScalarSummaryOperation(name, x).outputs[0]
