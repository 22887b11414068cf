"""Runs the TensorFlow ops the lowerings emit on tensors of rank 6 to 8.

TensorFlow picks its CPU kernels by the user's CPU: with AVX-512 it turns
oneDNN on by default (TF_ENABLE_ONEDNN_OPTS=1 forces it on, =0 off), and
some oneDNN kernels, and some default ones, take only so many dimensions
(oneDNN's Softmax at most 5). Tensors of rank <= 5 never find out. This
script runs every family of TF ops that mesh_tensorflow's lowerings and the
Transformer emit, at the ranks asked for, forward and with gradients, eagerly
and inside a tf.function (grappler's oneDNN fusions, layer norm, swish,
matmul + bias, only happen in graphs; inputs are arguments, not constants,
so that grappler cannot fold the kernels away), in a subprocess per oneDNN
setting.

Where a lowering guards a kernel (mesh_tensorflow/backend/slice_utils.py: softmax
over merged axes, broadcasting within 5 axis groups), the family runs the
ops as the lowering emits them, and the bare kernel beside it for the
record. The last family lowers small mtf programs (layer norm, attention,
dense layers, ...) on one and on two processors, with mtf.gradients.

Prints one line per family and setting, "ok" or what failed; exits
non-zero if anything the lowerings emit failed. docs/kernel_limits.md
records what had a limit.

  python tools/kernel_rank_audit.py                  # ranks 6,7,8; both
  python tools/kernel_rank_audit.py --onednn=1 --ranks=6,9 --family=softmax
"""

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SETTINGS = ("1", "0")


def _parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--ranks", default="6,7,8",
                      help="comma-separated tensor ranks (default 6,7,8)")
  parser.add_argument("--onednn", default="both", choices=SETTINGS + ("both",),
                      help="TF_ENABLE_ONEDNN_OPTS setting(s) to run")
  parser.add_argument("--family", default="",
                      help="comma-separated family names (default: all)")
  parser.add_argument("--modes", default="eager,graph",
                      help="eager and/or graph (a tf.function)")
  parser.add_argument("--no-bare", dest="bare", action="store_false",
                      help="skip the bare kernels run for the record")
  parser.add_argument("--child", action="store_true",
                      help=argparse.SUPPRESS)  # Runs in this process.
  return parser.parse_args(argv)


def main(argv=None):
  args = _parse_args(argv)
  if args.child:
    return _child(args)
  settings = SETTINGS if args.onednn == "both" else (args.onednn,)
  children = []
  for setting in settings:  # Concurrently: each is mostly one core's work.
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting,
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
                   [str(ROOT)] + os.environ.get("PYTHONPATH", "").split(
                       os.pathsep)).rstrip(os.pathsep))
    command = [sys.executable, str(pathlib.Path(__file__).resolve()),
               "--child", f"--ranks={args.ranks}", f"--onednn={setting}",
               f"--family={args.family}", f"--modes={args.modes}"] + (
                   [] if args.bare else ["--no-bare"])
    children.append((setting, subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)))
  status = 0
  for setting, child in children:
    stdout, stderr = child.communicate()
    sys.stdout.write(stdout)
    if child.returncode:
      status = 1
    if child.returncode not in (0, 1):
      sys.stdout.write(f"onednn={setting}: the audit itself failed "
                       f"(exit {child.returncode}):\n{stderr[-3000:]}\n")
  return status


# ---------------------------------------------------------------------------
# The child: everything below runs with TF_ENABLE_ONEDNN_OPTS already set.

np = tf = mtf = slice_utils = None  # Imported by _child.


def _sizes(rank):
  """Sizes 2, 3, 2, 3, ...: small, and unequal so that axes cannot mix."""
  return [2 + i % 2 for i in range(rank)]


def _array(shape, low=-2.0, high=2.0, dtype="float32", seed=0):
  values = np.random.RandomState(seed).uniform(low, high, size=shape)
  return values.astype(dtype)


def _alternating(rank, first):
  """A shape with every other axis of size 1, from axis `first` (0 or 1)."""
  return [1 if i % 2 == first else n for i, n in enumerate(_sizes(rank))]


class Case:
  """One op at one rank: `fn(*tensors)` on `inputs` (NumPy arrays).

  `fn` is what the lowerings emit (None: they never emit this form; it is
  here for the record). `bare` is the kernel without the lowering's guard,
  or a form the lowerings avoid, run for the record only (with TensorFlow
  gradients). `grad`: also take TensorFlow gradients of fn's float outputs
  with respect to the float inputs (False where the case computes its own,
  the op has none, or the lowerings differentiate it otherwise).
  """

  def __init__(self, fn, inputs, bare=None, grad=True,
               modes=("eager", "graph")):
    self.fn, self.inputs, self.bare, self.grad = fn, inputs, bare, grad
    self.modes = modes


def _unary(fn, low=-2.0, high=2.0):
  return lambda r: Case(fn, [_array(_sizes(r), low, high)])


def _binary(fn, low=-2.0, high=2.0, dtype="float32"):
  return lambda r: Case(fn, [_array(_sizes(r), low, high, dtype, 1),
                             _array(_sizes(r), low, high, dtype, 2)])


def _grad_kernel(op, **names):
  """A raw gradient kernel taking two same-shaped tensors."""
  (a, low), (b, _) = names.items()
  return lambda r: Case(lambda x, y: op(**{a: x, b: y}),
                        [_array(_sizes(r), low, 2.0, seed=1),
                         _array(_sizes(r), -1.0, 1.0, seed=2)], grad=False)


def _unary_math():
  return {
      "exp": _unary(tf.exp), "log": _unary(tf.math.log, 0.5),
      "sqrt": _unary(tf.sqrt, 0.5), "rsqrt": _unary(tf.math.rsqrt, 0.5),
      "square": _unary(tf.square), "reciprocal": _unary(tf.math.reciprocal,
                                                        0.5),
      "sin": _unary(tf.sin), "cos": _unary(tf.cos), "abs": _unary(tf.abs),
      "sign": _unary(tf.sign), "negative": _unary(tf.negative),
      "erfinv": _unary(tf.math.erfinv, -0.9, 0.9),
      "pow_scalar": _unary(lambda x: tf.pow(x, 1.5), 0.5),
      "scale_shift": _unary(lambda x: x * 0.5 + 1.0),
      "clip_by_value": _unary(lambda x: tf.clip_by_value(x, -1.0, 1.0)),
      "identity": _unary(tf.identity),
      "stop_gradient": _unary(lambda x: x + tf.stop_gradient(x)),
      "cast_bfloat16": _unary(lambda x: tf.cast(tf.cast(x, tf.bfloat16),
                                                tf.float32)),
      "cast_int32": _unary(lambda x: tf.cast(x, tf.int32)),
  }


def _activations():
  return {
      "relu": _unary(tf.nn.relu), "elu": _unary(tf.nn.elu),
      "selu": _unary(tf.nn.selu), "leaky_relu": _unary(tf.nn.leaky_relu),
      "gelu_tanh": _unary(lambda x: tf.nn.gelu(x, approximate=True)),
      "gelu_exact": _unary(tf.nn.gelu), "silu": _unary(tf.nn.silu),
      "x_times_sigmoid_x": _unary(lambda x: x * tf.sigmoid(x)),
      "softplus": _unary(tf.nn.softplus), "sigmoid": _unary(tf.sigmoid),
      "tanh": _unary(tf.tanh),
      "ReluGrad": _grad_kernel(tf.raw_ops.ReluGrad, features=-2.0,
                               gradients=0),
      "EluGrad": _grad_kernel(tf.raw_ops.EluGrad, outputs=-0.9, gradients=0),
      "SeluGrad": _grad_kernel(tf.raw_ops.SeluGrad, outputs=-1.5,
                               gradients=0),
      "LeakyReluGrad": _grad_kernel(tf.raw_ops.LeakyReluGrad, features=-2.0,
                                    gradients=0),
      "SoftplusGrad": _grad_kernel(tf.raw_ops.SoftplusGrad, features=-2.0,
                                   gradients=0),
      "SigmoidGrad": _grad_kernel(tf.raw_ops.SigmoidGrad, y=0.1, dy=0),
      "TanhGrad": _grad_kernel(tf.raw_ops.TanhGrad, y=-0.9, dy=0),
      "SqrtGrad": _grad_kernel(tf.raw_ops.SqrtGrad, y=0.5, dy=0),
      "RsqrtGrad": _grad_kernel(tf.raw_ops.RsqrtGrad, y=0.5, dy=0),
      "ReciprocalGrad": _grad_kernel(tf.raw_ops.ReciprocalGrad, y=0.5, dy=0),
  }


def _binary_same_shape():
  cases = {name: _binary(fn) for name, fn in [
      ("add", tf.add), ("subtract", tf.subtract), ("multiply", tf.multiply),
      ("maximum", tf.maximum), ("minimum", tf.minimum),
      ("squared_difference", tf.math.squared_difference),
      ("floordiv", tf.math.floordiv), ("floormod", tf.math.floormod),
      ("less", tf.less), ("greater_equal", tf.greater_equal),
      ("equal", tf.equal), ("not_equal", tf.not_equal)]}
  cases.update({
      "divide": _binary(tf.math.divide, 0.5),
      "pow": _binary(tf.pow, 0.5),
      "add_n": _binary(lambda x, y: tf.add_n([x, y, x])),
      "where": _binary(lambda x, y: tf.where(x > y, x, y)),
      "truncatediv_int32": _binary(tf.truncatediv, 1, 9, "int32"),
      "logical_ops": _binary(lambda x, y: tf.logical_or(
          tf.logical_and(x > 0, y > 0), tf.logical_not(x > y))),
      "bitwise_uint32": lambda r: Case(
          lambda x, y: tf.bitwise.bitwise_xor(tf.bitwise.bitwise_and(
              x, y), tf.bitwise.bitwise_or(tf.bitwise.left_shift(x, 3),
                                           tf.bitwise.right_shift(y, 2))),
          [_array(_sizes(r), 0, 2**31, "uint32", 1),
           _array(_sizes(r), 0, 2**31, "uint32", 2)]),
      "bitcast": _unary(lambda x: tf.bitcast(tf.bitcast(x, tf.int32),
                                             tf.float32)),
  })
  return cases


def _alternating_case(lowered, bare, operands=2):
  """Operands whose axes alternate between 1 and full size, so that the
  broadcast has as many axis groups as the rank."""
  def build(r):
    inputs = [_array(_alternating(r, i % 2), seed=i)
              for i in range(operands)]
    return Case(lowered, inputs, bare=bare)
  return build


def _broadcast_binary():
  def guarded(fn):
    return lambda *xs: fn(*slice_utils.broadcastable(xs))

  full = _sizes
  cases = {name: _alternating_case(guarded(fn), fn) for name, fn in [
      ("add", tf.add), ("multiply", tf.multiply), ("maximum", tf.maximum),
      ("pow", lambda x, y: tf.pow(tf.abs(x) + 0.5, y)),
      ("less", tf.less), ("floormod", tf.math.floormod)]}
  cases["where"] = _alternating_case(
      guarded(lambda c, x, y: tf.where(c > 0, x, y)),
      lambda c, x, y: tf.where(c > 0, x, y), operands=3)
  cases["broadcast_to"] = lambda r: Case(
      lambda x: slice_utils.broadcast_to(x, full(r)),
      [_array(_alternating(r, 1))],
      bare=lambda x: tf.broadcast_to(x, full(r)))
  cases["add_n_of_broadcasts"] = lambda r: Case(
      lambda x, y: tf.add_n([slice_utils.broadcast_to(x, full(r)),
                             slice_utils.broadcast_to(y, full(r))]),
      [_array(_alternating(r, 0)), _array(_alternating(r, 1))],
      bare=lambda x, y: tf.add_n([tf.broadcast_to(x, full(r)),
                                  tf.broadcast_to(y, full(r))]))
  # Patterns the lowerings emit without a guard (at most 3 groups):
  # a reduced axis kept as 1, and operands ending the output's axes.
  cases["keepdims_minus"] = lambda r: Case(
      lambda x: x - tf.reduce_max(x, axis=2, keepdims=True),
      [_array(_sizes(r))])
  cases["trailing_operand"] = lambda r: Case(
      tf.multiply, [_array(_sizes(r)), _array(_sizes(r)[-3:], seed=1)])
  return cases


def _reduction(fn, axes, emitted, alternate):
  def build(r):
    reduce = lambda x: fn(x, axis=axes(r))
    return Case(reduce if emitted else None, [_array(_sizes(r))],
                grad=not alternate,
                bare=reduce if alternate or not emitted else None)
  return build


def _reductions():
  # The lowerings reduce with these kernels, and differentiate reductions
  # themselves (an mtf broadcast), never with TensorFlow's gradients, which
  # broadcast the gradient back over every other axis: over alternating
  # axes they meet the broadcasting limit. mtf.reduce_logsumexp is built of
  # mtf operations; tf.reduce_logsumexp subtracts a broadcast maximum.
  cases = {}
  for name, fn in [("sum", tf.reduce_sum), ("max", tf.reduce_max),
                   ("min", tf.reduce_min), ("mean", tf.reduce_mean),
                   ("prod", tf.reduce_prod),
                   ("logsumexp", tf.reduce_logsumexp)]:
    for axes_name, axes in [("last", lambda r: [r - 1]),
                            ("first", lambda r: [0]),
                            ("alternate", lambda r: list(range(0, r, 2))),
                            ("all", lambda r: None)]:
      cases[f"{name}_{axes_name}"] = _reduction(
          fn, axes, emitted=name != "logsumexp",
          alternate=axes_name == "alternate")
  cases["sum_keepdims_middle"] = _unary(
      lambda x: tf.reduce_sum(x, axis=[1, 3], keepdims=True))
  cases["any_all"] = _unary(lambda x: tf.logical_or(
      tf.reduce_any(x > 1, axis=[0, 2]), tf.reduce_all(x > -1, axis=[0, 2])))
  cases["mean_int32_truncatediv"] = lambda r: Case(
      lambda x: tf.truncatediv(tf.reduce_sum(x, axis=[1, 2]), 6),
      [_array(_sizes(r), 0, 9, "int32")])
  cases["unsorted_segment_sum"] = lambda r: Case(
      lambda x: tf.math.unsorted_segment_sum(
          tf.reshape(x, [-1] + _sizes(r)[2:]),
          tf.constant([0, 1, -1, 1, 0, 1]), 2), [_array(_sizes(r))])
  return cases


def _softmax():
  cases = {}
  for name, axis in [("first", 0), ("middle", 2), ("last", -1)]:
    cases[f"softmax_{name}"] = (
        lambda r, axis=axis: Case(
            lambda x: slice_utils.softmax(x, axis), [_array(_sizes(r))],
            bare=lambda x: tf.nn.softmax(x, axis=axis)))
  # Not emitted (mtf.log_softmax is x - logsumexp): for the record only.
  cases["log_softmax_last"] = lambda r: Case(
      None, [_array(_sizes(r))], bare=lambda x: tf.nn.log_softmax(x, -1))
  return cases


def _contractions():
  letters = "abcdefghijklmnop"

  def einsum(eq_fn, shapes_fn, grad=True):
    def build(r):
      equation, shapes = eq_fn(r), shapes_fn(r)
      inputs = [_array(s, seed=i) for i, s in enumerate(shapes)]
      if len(shapes) <= 2:  # As MeshImpl.einsum calls it.
        fn = lambda *xs: tf.raw_ops.Einsum(inputs=list(xs),
                                           equation=equation)
      else:
        fn = lambda *xs: tf.einsum(equation, *xs)
      return Case(fn, inputs, grad=grad, bare=None if grad else fn)
    return build

  s = _sizes
  cases = {
      # x[..., g, h] w[g, h, i]: a dense layer over the last two axes.
      "einsum_dense": einsum(
          lambda r: f"{letters[:r]},{letters[r - 2:r]}z->"
                    f"{letters[:r - 2]}z", lambda r: [s(r), s(r)[-2:] + [4]]),
      # Batch matmul with r - 2 batch axes (attention logits).
      "einsum_batch_matmul": einsum(
          lambda r: f"{letters[:r - 1]}y,{letters[:r - 2]}zy->"
                    f"{letters[:r - 1]}z",
          lambda r: [s(r - 1) + [3], s(r - 2) + [4, 3]]),
      # An outer product whose output interleaves the operands' axes.
      "einsum_outer_interleaved": einsum(
          lambda r: f"{letters[0:r:2]},{letters[1:r:2]}->{letters[:r]}",
          lambda r: [s(r)[0::2], s(r)[1::2]]),
      # A contraction whose output is a transposition of the matmul's.
      "einsum_contract_transposed": einsum(
          lambda r: f"{letters[:r]},{letters[1:r:2]}z->"
                    f"z{letters[0:r:2][::-1]}",
          lambda r: [s(r), s(r)[1::2] + [2]]),
      # mtf lowers a one-operand einsum to tf.reduce_sum, and mtf
      # differentiates einsums itself; TF's Einsum gradient (a broadcast)
      # is on record only.
      "einsum_sum_one_operand": einsum(
          lambda r: f"{letters[:r]}->{letters[0:r:2]}", lambda r: [s(r)],
          grad=False),
      "einsum_three_operands": einsum(
          lambda r: f"{letters[:r]},{letters[r - 1]}z,z->{letters[:r - 1]}",
          lambda r: [s(r), [s(r)[-1], 4], [4]]),
      "matmul_batch_broadcast": lambda r: Case(
          tf.linalg.matmul, [_array(s(r - 2) + [4, 3]), _array(
              [1] * (r - 3) + [s(r - 2)[-1], 3, 5], seed=1)]),
      # Grappler fuses MatMul/BatchMatMul with BiasAdd/Add and activations.
      "einsum_bias_relu": lambda r: Case(
          lambda x, w, b: tf.nn.relu(tf.raw_ops.Einsum(
              inputs=[x, w], equation=f"{letters[:r]},{letters[r - 1]}z->"
              f"{letters[:r - 1]}z") + b),
          [_array(s(r)), _array([s(r)[-1], 4], seed=1),
           _array([4], seed=2)]),
      "einsum_bias_gelu": lambda r: Case(
          lambda x, w, b: tf.nn.gelu(tf.raw_ops.Einsum(
              inputs=[x, w], equation=f"{letters[:r]},{letters[r - 1]}z->"
              f"{letters[:r - 1]}z") + b, approximate=True),
          [_array(s(r)), _array([s(r)[-1], 4], seed=1),
           _array([4], seed=2)]),
      "matmul_bias_add": lambda r: Case(
          lambda x, w, b: tf.linalg.matmul(x, w) + b,
          [_array(s(r - 1) + [3]), _array(s(r - 2) + [3, 4], seed=1),
           _array([4], seed=2)]),
  }
  return cases


def _normalization():
  def layer_norm(axes):
    def fn(x, scale, bias):
      mean = tf.reduce_mean(x, axis=axes, keepdims=True)
      variance = tf.reduce_mean(tf.square(x - mean), axis=axes,
                                keepdims=True)
      return (x - mean) * tf.math.rsqrt(variance + 1e-6) * scale + bias
    return fn

  def case(fn_of_rank):
    return lambda r: Case(fn_of_rank(r), [
        _array(_sizes(r)), _array(_sizes(r)[-1:], 0.5, 1.5, seed=1),
        _array(_sizes(r)[-1:], seed=2)])

  return {
      "layer_norm_last": case(lambda r: layer_norm([r - 1])),
      "layer_norm_middle": lambda r: Case(
          lambda x: layer_norm([2])(x, 1.0, 0.0), [_array(_sizes(r))]),
      "layer_norm_squared_difference": case(lambda r: (
          lambda x, scale, bias: (x - tf.reduce_mean(x, -1, keepdims=True))
          * tf.math.rsqrt(tf.reduce_mean(tf.math.squared_difference(
              x, tf.reduce_mean(x, -1, keepdims=True)), -1, keepdims=True)
                          + 1e-6) * scale + bias)),
      "moments_batch_normalization": case(lambda r: (
          lambda x, scale, bias: tf.nn.batch_normalization(
              x, *tf.nn.moments(x, list(range(r - 1)), keepdims=True),
              bias, scale, 1e-3))),
      "rms_norm": case(lambda r: (
          lambda x, scale, bias: x * tf.math.rsqrt(tf.reduce_mean(
              tf.square(x), -1, keepdims=True) + 1e-6) * scale)),
  }


def _layout():
  s = _sizes
  return {
      "transpose_reverse": _unary(lambda x: tf.transpose(
          x, list(range(x.shape.rank))[::-1])),
      "transpose_swap": _unary(lambda x: tf.transpose(
          x, [1, 0] + list(range(2, x.shape.rank)))),
      "reshape_merge_split": _unary(lambda x: tf.reshape(
          tf.reshape(x, [-1, 6]), x.shape)),
      "concat": lambda r: Case(lambda x, y: tf.concat([x, y, x], axis=r // 2),
                               [_array(s(r)), _array(s(r), seed=1)]),
      "split_sizes": _unary(lambda x: tf.split(x, [1, 2], axis=1)),
      "stack_unstack": _unary(lambda x: tf.stack(
          tf.unstack(x, axis=2)[::-1], axis=3)),
      "slice": _unary(lambda x: tf.slice(x, [0, 1] + [0] * (x.shape.rank - 2),
                                         [2, 2] + [-1] * (x.shape.rank - 2))),
      "strided_slice": _unary(lambda x: x[:, 1:, ..., ::2]),
      # The lowerings pad one axis at a time; Pad merges unpadded neighbours
      # and takes at most 6 groups (padding every axis is on record only).
      "pad_one_axis": lambda r: Case(
          lambda x: tf.pad(x, [[0, 0]] * 3 + [[1, 2]] + [[0, 0]] * (r - 4)),
          [_array(s(r))], bare=lambda x: tf.pad(x, [[1, 0]] * r)),
      "tile": _unary(lambda x: tf.tile(x, [2, 1] * (x.shape.rank // 2) +
                                       [1] * (x.shape.rank % 2))),
      "roll": _unary(lambda x: tf.roll(x, [1, -1], [1, 3])),
      "reverse": _unary(lambda x: tf.reverse(x, [0, 3])),
      "squeeze_expand_dims": _unary(lambda x: tf.squeeze(
          tf.expand_dims(x, 3), 3)),
      "broadcast_to_trailing": lambda r: Case(
          lambda x: tf.broadcast_to(x, s(r)), [_array([1] * 3 + s(r)[3:])]),
      "fill_zeros_like": _unary(lambda x: x + tf.fill(x.shape, 1.0) +
                                tf.zeros_like(x)),
  }


def _indexing():
  s = _sizes
  return {
      "gather_middle_axis": lambda r: Case(
          lambda x: tf.gather(x, tf.constant([[1, 0], [0, 0]]), axis=2),
          [_array(s(r))]),
      "gather_batch_dims": lambda r: Case(
          lambda x: tf.gather(x, tf.zeros(s(r)[:-1] + [2], tf.int32),
                              batch_dims=r - 1), [_array(s(r))]),
      "gather_nd_depth_2": _unary(lambda x: tf.gather_nd(
          x, tf.constant([[0, 1], [1, 2]]))),
      "scatter_nd": lambda r: Case(
          lambda x: tf.scatter_nd(tf.constant([[1], [0]]), x, [3] + s(r)[1:]),
          [_array(s(r))]),
      "one_hot": lambda r: Case(
          lambda i: tf.one_hot(i, 5, 1.0, 0.0), [_array(s(r - 1), 0, 5,
                                                        "int32")]),
      "top_k_last": _unary(lambda x: tf.math.top_k(x, 2)),
      # mtf.argmax lowers to top_k; ArgMax is on record only.
      "argmax_argmin": lambda r: Case(None, [_array(s(r))], bare=lambda x: (
          tf.argmax(x, axis=2), tf.argmin(x, axis=-1))),
      "cumsum": _unary(lambda x: tf.cumsum(x, axis=2)),
      "cumsum_exclusive_reverse": _unary(lambda x: tf.cumsum(
          x, axis=-1, exclusive=True, reverse=True)),
      "cumsum_int32": lambda r: Case(
          lambda x: tf.math.cumsum(x, axis=1), [_array(s(r), 0, 9, "int32")]),
      "range_equal": _unary(lambda x: tf.cast(tf.equal(
          tf.cast(tf.range(x.shape[-1]), tf.float32), x), tf.float32) * x),
  }


def _random():
  s = _sizes
  seed = [1, 2]
  return {
      "stateless_uniform": lambda r: Case(
          lambda x: x + tf.random.stateless_uniform(s(r), seed),
          [_array(s(r))]),
      "stateless_normal": lambda r: Case(
          lambda x: x + tf.random.stateless_normal(s(r), seed),
          [_array(s(r))]),
      "stateless_truncated_normal": lambda r: Case(
          lambda x: x + tf.random.stateless_truncated_normal(s(r), seed),
          [_array(s(r))]),
      "StatelessRandomUniformV2": lambda r: Case(
          lambda x: x + tf.raw_ops.StatelessRandomUniformV2(
              shape=s(r), key=tf.constant([7], tf.uint64),
              counter=tf.constant([0, 0], tf.uint64), alg=1), [_array(s(r))]),
      "random_uniform_normal": lambda r: Case(
          lambda x: x + tf.random.uniform(s(r)) + tf.random.normal(s(r)) +
          tf.random.truncated_normal(s(r)), [_array(s(r))]),
  }


def _conv_pool():
  # tf.nn.conv2d/conv3d take leading batch axes themselves; the mtf
  # lowerings merge them first (convolution._flatten_batch_dims), and the
  # pooling kernels take exactly 4 or 5 axes (see the mtf family).
  s = _sizes
  return {
      "conv2d_batch_axes": lambda r: Case(
          lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
          [_array(s(r - 3) + [4, 4, 2]), _array([2, 2, 2, 3], seed=1)]),
      "conv3d_batch_axes": lambda r: Case(
          lambda x, w: tf.nn.conv3d(x, w, [1] * 5, "SAME"),
          [_array(s(r - 4) + [2, 4, 4, 2]), _array([2, 2, 2, 2, 3], seed=1)]),
  }


def _mtf_program(build, names, layout):
  """fn(*tf tensors) lowering `build(*mtf tensors) -> mtf output` onto a
  PlacementMeshImpl, with mtf.gradients of sum(output^2) for float
  outputs. `names` are the inputs' dimension names."""
  mesh_shape, rules = layout

  def fn(*tf_inputs):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    xs = [mtf.import_tf_tensor(mesh, t, mtf.Shape(
        [mtf.Dimension(n, d) for n, d in zip(dims, t.shape.as_list())]))
          for t, dims in zip(tf_inputs, names)]
    y = build(*xs)
    outputs = [y]
    if y.dtype.is_floating:
      floats = [x for x in xs if x.dtype.is_floating]
      outputs += [g for g in mtf.gradients(
          [mtf.reduce_sum(mtf.square(y))], floats) if g is not None]
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in outputs]
  return fn


def _mtf_programs():
  """Small mtf programs on x[d0, ..., d(r-1)], lowered on one and on two
  processors (d0, of size 4, split), with mtf.gradients."""
  extra_sizes = {"m": 3, "v": 2, "o": 2, "fd": 2, "fh": 2, "fw": 2}

  def program(build, *extra):
    """build(d, x, *more) -> mtf Tensor, where d maps names to Dimensions
    (d0... and those of extra_sizes), x has dims d0..d(r-1) and `extra`
    are functions r -> the dimension names of further inputs."""
    def case(r, layout):
      sizes = dict(extra_sizes, **{f"d{i}": n for i, n in enumerate(
          [4] + _sizes(r)[1:])})
      names = [[f"d{i}" for i in range(r)]] + [e(r) for e in extra]
      dims = {n: mtf.Dimension(n, k) for n, k in sizes.items()}
      inputs = [_array([sizes[n] for n in ns], seed=k)
                for k, ns in enumerate(names)]
      return Case(_mtf_program(lambda *xs: build(dims, *xs), names, layout),
                  inputs, grad=False)
    return case

  def layer_norm(d, x, scale, bias):
    dim = x.shape.dims[-1]
    mean = mtf.reduce_mean(x, reduced_dim=dim)
    variance = mtf.reduce_mean(mtf.square(x - mean), reduced_dim=dim)
    return (x - mean) * mtf.rsqrt(variance + 1e-6) * scale + bias

  def attention(d, q, k, v):
    logits = mtf.einsum([q, k], reduced_dims=[q.shape.dims[-1]])
    weights = mtf.softmax(logits, d["m"])
    return mtf.einsum([weights, v], reduced_dims=[d["m"]])

  def top_k_argmax_one_hot(d, x):
    last, middle = x.shape.dims[-1], x.shape.dims[2]
    values = mtf.top_k(x, last, mtf.Dimension("k", 2))[0]
    hits = mtf.one_hot(mtf.argmax(x, middle), middle)
    return values + mtf.reduce_sum(hits * x, reduced_dim=middle)

  def cumsum_shift_pad_slice(d, x):
    a, b, c = x.shape.dims[1:4]
    y = mtf.shift(mtf.cumsum(x, c, exclusive=True), 1, b, wrap=False)
    return mtf.mtf_slice(mtf.pad(y, [1, 2], a.name), 2, a.size, a.name)

  def reshape_transpose(d, x):
    dims = x.shape.dims
    merged = mtf.Dimension("merged", dims[-1].size * dims[-2].size)
    return mtf.reshape(mtf.transpose(x, mtf.Shape(dims[::-1])),
                       mtf.Shape(dims[:-2][::-1] + [merged]))

  last = lambda r: [f"d{r - 1}"]
  even = lambda r: [f"d{i}" for i in range(0, r, 2)]
  odd = lambda r: [f"d{i}" for i in range(1, r, 2)]
  batch = lambda r: [f"d{i}" for i in range(r - 2)]
  return {
      "layer_norm": program(layer_norm, last, last),
      "attention": program(attention, lambda r: batch(r) + ["m", f"d{r-1}"],
                           lambda r: batch(r) + ["m", "v"]),
      "dense_gelu_relu": program(lambda d, x, w: mtf.relu(mtf.gelu(
          mtf.einsum([x, w], reduced_dims=[x.shape.dims[-1]]))),
                                 lambda r: [f"d{r - 1}", "o"]),
      "swish_sigmoid_tanh": program(
          lambda d, x: mtf.tanh(x * mtf.sigmoid(x))),
      "softmax_each_axis": program(lambda d, x: mtf.add_n(
          [mtf.softmax(x, dim) for dim in x.shape.dims])),
      "log_softmax_logsumexp": program(lambda d, x: mtf.log_softmax(
          x, x.shape.dims[2]) + mtf.reduce_logsumexp(x, x.shape.dims[-1])),
      "reduce_alternate_dims": program(lambda d, x: mtf.reduce_max(
          x, output_shape=mtf.Shape(x.shape.dims[1::2])) + mtf.reduce_mean(
              x, output_shape=mtf.Shape(x.shape.dims[1::2])) +
                                       mtf.reduce_logsumexp(
                                           x, x.shape.dims[0::2])),
      "where_interleaved": program(lambda d, x, a, b: mtf.where(
          mtf.greater(a, 0.0), a * x, b + x, output_shape=x.shape),
                                   even, odd),
      "multiply_interleaved": program(lambda d, x, a, b: mtf.multiply(
          a, b, output_shape=x.shape) * x, even, odd),
      "cumsum_shift_pad_slice": program(cumsum_shift_pad_slice),
      "concat_split": program(lambda d, x: mtf.concat(
          mtf.split(x, x.shape.dims[2], 2)[::-1], x.shape.dims[2].name)),
      "top_k_argmax_one_hot": program(top_k_argmax_one_hot),
      "gather": program(lambda d, x: mtf.gather(
          x, mtf.constant(x.mesh, 1, mtf.Shape([d["o"]]), tf.int32),
          x.shape.dims[2])),
      "reshape_transpose": program(reshape_transpose),
      # Convolutions and pooling merge the batch axes into one (4 or 5
      # axes reach the kernels, forward and backward).
      "conv2d_max_pool2d": program(lambda d, x, w: mtf.max_pool2d(
          mtf.conv2d(x, w, [1, 1], "SAME"), (1, 1)),
                                   lambda r: ["fh", "fw", f"d{r - 1}", "o"]),
      "conv3d_avg_pool3d": program(lambda d, x, w: mtf.avg_pool3d(
          mtf.conv3d(x, w, [1, 1, 1], "SAME"), (1, 1, 1)),
                                   lambda r: ["fd", "fh", "fw", f"d{r - 1}",
                                              "o"]),
      "conv2d_transpose": program(lambda d, x, w: mtf.conv2d_transpose(
          x, w, [1, 1], "SAME"), lambda r: ["fh", "fw", "o", f"d{r - 1}"]),
  }


def _families():
  return {
      "unary_math": _unary_math(), "activations": _activations(),
      "binary_same_shape": _binary_same_shape(),
      "broadcast_binary": _broadcast_binary(), "reductions": _reductions(),
      "softmax": _softmax(), "contractions": _contractions(),
      "normalization": _normalization(), "layout": _layout(),
      "indexing": _indexing(), "random": _random(),
      "conv_pool": _conv_pool(), "mtf_programs": _mtf_programs(),
  }


# Layout id -> (mesh shape, layout rules, modes). Grappler's rewrites do
# not depend on the layout, and tracing is most of the audit's time: the
# split layout (collectives at high rank) runs eagerly only.
MTF_LAYOUTS = {"1proc": ("all:1", "", ("eager", "graph")),
               "2proc": ("all:2", "d0:all", ("eager",))}


def _expand(family, cases, ranks):
  """[(label, Case)] for every case of `family` at every rank."""
  out = []
  for name, build in cases.items():
    for r in ranks:
      if family == "mtf_programs":
        for layout_id, (mesh_shape, rules, modes) in MTF_LAYOUTS.items():
          case = build(r, (mesh_shape, rules))
          case.modes = modes
          out.append((f"{name}[{layout_id}]", r, case))
      else:
        out.append((name, r, build(r)))
  return out


def _run(fn, grad, tensors):
  """Runs fn on tensors, with TF gradients if `grad`."""
  floats = [t for t in tensors if t.dtype.is_floating]
  with tf.GradientTape() as tape:
    tape.watch(floats)
    outputs = tf.nest.flatten(fn(*tensors))
    loss = [tf.reduce_sum(tf.square(y)) for y in outputs
            if y.dtype.is_floating]
  if grad and floats and loss:
    grads = tape.gradient(tf.add_n(loss), floats)
    outputs += [g for g in grads if g is not None]
  return outputs


def _summary(error):
  """'ErrorType (Op): the message', shapes elided so that ranks group."""
  message = getattr(error, "message", None) or str(error)
  ops = [name for name in re.findall(r"\{\{node (\w+)\}\}|\[Op:(\w+)\]",
                                     message) for name in name if name]
  op = next((name for name in ops if not name.startswith("__")), None)
  lines = [line.strip() for line in message.splitlines()]
  keep = [line for line in lines if line and not re.match(
      r"(Detected at node|File |Graph execution error|\[\[|\w+\.py|"
      r"self\.|return |<|\^|Traceback)", line)]
  text = next((line for line in keep if "{{function_node" in line),
              keep[-1] if keep else message)
  text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
  text = re.sub(r"\s*\[Op:[\w.]+\].*$", "", text)
  text = re.sub(r"\[[\d,]+\]", "[...]", text).strip()
  where = f" ({op})" if op else ""
  return f"{type(error).__name__}{where}: {text[:160]}"


def _run_mode(mode, cases, bare):
  """{(label, error summary): [ranks]} of what failed in `mode`: of the
  cases' fn (as the lowerings emit them), or with `bare`, of their bare
  forms (with TensorFlow gradients)."""
  failures = {}
  cases = [c for c in cases if mode in c[2].modes and (
      c[2].bare if bare else c[2].fn) is not None]

  def attempt(items):
    def call(*tensors):
      outputs, k = [], 0
      for _, _, case in items:
        n = len(case.inputs)
        outputs += _run(case.bare if bare else case.fn,
                        bare or case.grad, tensors[k:k + n])
        k += n
      return outputs
    tensors = [tf.constant(a) for _, _, c in items for a in c.inputs]
    if mode == "graph":
      call = tf.function(call, autograph=False)
    call(*tensors)

  if mode == "graph" and not bare:
    try:
      attempt(cases)
      return failures
    except Exception:  # pylint: disable=broad-except
      pass  # Find out which cases failed, one at a time.
  for item in cases:
    try:
      attempt([item])
    except Exception as e:  # pylint: disable=broad-except
      failures.setdefault((item[0], _summary(e)), []).append(item[1])
  return failures


def _describe(failures_by_mode):
  """'label rank 6,7,8 eager+graph: error; ...' from _run_mode's results."""
  by_case = {}
  for mode, failures in failures_by_mode.items():
    for (label, summary), ranks in failures.items():
      key = (label, ",".join(map(str, ranks)))
      by_case.setdefault(key, {}).setdefault(summary, []).append(mode)
  parts = []
  for (label, ranks), summaries in by_case.items():
    for summary, modes in summaries.items():
      parts.append(f"{label} rank {ranks} {'+'.join(modes)}: {summary}")
  return "; ".join(parts)


def _child(args):
  global np, tf, mtf, slice_utils  # pylint: disable=global-statement
  import numpy  # pylint: disable=g-import-not-at-top
  import tensorflow  # pylint: disable=g-import-not-at-top
  np, tf = numpy, tensorflow
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  import mesh_tensorflow
  from mesh_tensorflow.backend import slice_utils as su
  from tensorflow.python.util import _pywrap_util_port
  # pylint: enable=g-import-not-at-top,g-direct-tensorflow-import
  mtf, slice_utils = mesh_tensorflow, su

  ranks = [int(r) for r in args.ranks.split(",")]
  modes = args.modes.split(",")
  wanted = set(filter(None, args.family.split(",")))
  setting = f"onednn={args.onednn}"
  print(f"{setting}: oneDNN kernels "
        f"{'on' if _pywrap_util_port.IsMklEnabled() else 'off'}; "
        f"TensorFlow {tf.__version__}; ranks {args.ranks}", flush=True)
  families = _families()
  unknown = wanted - set(families)
  if unknown:
    print(f"unknown families {sorted(unknown)}; "
          f"known: {', '.join(families)}")
    return 2
  status = 0
  for family, cases in families.items():
    if wanted and family not in wanted:
      continue
    start = time.time()
    items = _expand(family, cases, ranks)
    failed = {m: _run_mode(m, items, bare=False) for m in modes}
    failed = {m: f for m, f in failed.items() if f}
    bare_items = [item for item in items
                  if args.bare and item[2].bare is not None]
    bare = {m: _run_mode(m, bare_items, bare=True) for m in modes}
    bare = {m: f for m, f in bare.items() if f}
    line = f"{setting} {family:<18} "
    if failed:
      status = 1
      line += "FAIL " + _describe(failed)
    else:
      line += "ok"
    if bare:
      line += f" | bare kernels: {_describe(bare)}"
    elif bare_items:
      line += " | bare kernels: ok"
    print(f"{line} [{time.time() - start:.1f}s]", flush=True)
  return status


if __name__ == "__main__":
  sys.exit(main())
