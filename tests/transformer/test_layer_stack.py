"""LayerStack, its sublayers and make_layer_stack, against NumPy.

Each program runs on a one-processor mesh in eager mode (the stack
under layouts is covered by the model tests), fetching outputs, gradients
and variables (see `mtf_testing.run_program`).
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests.transformer import layer_testing

B, L, D = 8, 4, 16
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)
MODEL = mtf.Dimension("d_model", D)
X = np.random.RandomState(1).normal(size=(B, L, D)).astype(np.float32)


class Linear(transformer.TransformerLayer):
  """y = x W (W [d_model, d_model], variable "w")."""

  def call(self, context, x):
    w = mtf.get_variable(context.mesh, "w",
                         mtf.Shape([MODEL, mtf.Dimension("d_out", D)]))
    y = mtf.einsum([x, w], reduced_dims=[MODEL])
    return mtf.rename_dimension(y, "d_out", "d_model")


class Misshaped(transformer.TransformerLayer):

  def call(self, context, x):
    return mtf.reduce_sum(x, reduced_dim=MODEL)


def _run(fn, mode="train", sequence_id=None, wrt_x=False, **context_kwargs):
  """Runs fn(context, x) -> y; returns the fetched dict (y, d_x, vars)."""
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X), [BATCH, LENGTH, MODEL])
    seq = None
    if sequence_id is not None:
      seq = mtf.import_tf_tensor(mesh, tf.constant(sequence_id),
                                 [BATCH, LENGTH])
    context = layer_testing.make_context(
        mesh, layer_testing.ModelStub(D), BATCH, LENGTH, mode=mode,
        sequence_id=seq, layer_outputs=[], **context_kwargs)
    y = fn(context, x)
    outputs = {"y": y}
    if wrt_x:
      cot = mtf.import_tf_tensor(
          mesh, tf.constant(np.random.RandomState(2).normal(
              size=(B, L, D)).astype(np.float32) * 10), y.shape)
      return outputs, mtf.reduce_sum(y * cot), {"x": x}
    return outputs, None, {}
  return layer_testing.run_under("all:1", "", "eager", build)


def _rms_norm(x, eps=1e-6):
  return x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + eps)


def test_rms_norm_is_scale_only():
  got = _run(lambda c, x: transformer.sublayer_rms_norm(x, None, c))
  np.testing.assert_allclose(got["y"], _rms_norm(X), rtol=1e-5, atol=1e-5)
  assert got["rms_norm/scale"].shape == (D,)
  assert set(got) == {"y", "rms_norm/scale"}


@pytest.mark.parametrize("fn,name", [
    (transformer.sublayer_legacy_rms_norm, "layer_norm/scale"),
    (transformer.sublayer_legacy_final_rms_norm, "final_layer_norm/scale"),
])
def test_legacy_rms_norm_names(fn, name):
  got = _run(lambda c, x: fn(x, None, c))
  np.testing.assert_allclose(got["y"], _rms_norm(X), rtol=1e-5, atol=1e-5)
  assert name in got


def test_rms_norm_subsampled():
  got = _run(lambda c, x: transformer.sublayer_rms_norm_subsampled(
      x, None, c, percentage=50.))
  want = X / np.sqrt(np.mean(X[..., :D // 2] ** 2, axis=-1,
                             keepdims=True) + 1e-6)
  np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
  assert got["layer_norm_subsampled/scale"].shape == (D,)


def test_scale_norm_has_one_scalar_scale():
  got = _run(lambda c, x: transformer.sublayer_scale_norm(x, None, c))
  np.testing.assert_allclose(got["y"], _rms_norm(X), rtol=1e-5, atol=1e-5)
  assert got["scale_norm/scale"].shape == ()


def test_true_layer_norm():
  got = _run(lambda c, x: transformer.sublayer_true_layer_norm(x, None, c))
  mean = X.mean(-1, keepdims=True)
  var = ((X - mean) ** 2).mean(-1, keepdims=True)
  np.testing.assert_allclose(got["y"], (X - mean) / np.sqrt(var + 1e-6),
                             rtol=1e-5, atol=1e-5)


def test_residual_adds_the_layer_input():
  def fn(context, x):
    context.current_layer_input = x * 3.0
    return transformer.sublayer_residual(x, None, context)
  np.testing.assert_allclose(_run(fn)["y"], 4 * X, rtol=1e-6)


def test_rezero_scales_by_a_learned_scalar():
  got = _run(lambda c, x: transformer.sublayer_rezero(
      x, None, c, initial_value=0.5))
  np.testing.assert_allclose(got["y"], 0.5 * X, rtol=1e-6)
  assert got["rezero_weight"] == 0.5


def test_mask_padding():
  seq = np.ones((B, L), np.int32)
  seq[:, -1] = 0
  got = _run(lambda c, x: transformer.sublayer_mask_padding(x, None, c),
             sequence_id=seq)
  np.testing.assert_allclose(got["y"], X * seq[..., None])
  # No sequence_id tensor: unchanged.
  np.testing.assert_allclose(
      _run(lambda c, x: transformer.sublayer_mask_padding(x, None, c))["y"], X)


def test_dropout_mask_is_broadcast_over_length():
  got = _run(lambda c, x: transformer.sublayer_dropout(
      x, None, c, dropout_rate=0.5))["y"]
  kept = got != 0
  # The same d_model elements are dropped at every position of an example.
  assert (kept == kept[:, :1, :]).all()
  assert 0.2 < kept.mean() < 0.8
  np.testing.assert_allclose(got[kept], 2 * X[kept], rtol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda c, x: transformer.sublayer_dropout(x, None, c, dropout_rate=0.5),
    lambda c, x: transformer.sublayer_annealed_dropout(
        x, None, c, init_dropout_rate=0.5, start_step=0, end_step=10),
])
def test_dropout_only_in_training(fn):
  np.testing.assert_allclose(_run(fn, mode="eval")["y"], X)


def _build_only(fn):
  """Builds fn(context, x) in an mtf graph (no lowering)."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, MODEL])
  return fn(layer_testing.make_context(
      mesh, layer_testing.ModelStub(D), BATCH, LENGTH, layer_outputs=[]), x)


def test_context_collects_layer_outputs_by_default():
  """As the original: a Context made without layer_outputs starts one."""
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  context = transformer.Context(
      model=layer_testing.ModelStub(D), mesh=mesh, batch_dims=[BATCH],
      length_dim=LENGTH, variable_dtype=mtf.VariableDType())
  assert context.layer_outputs == []
  _stack().call(context, mtf.zeros(mesh, [BATCH, LENGTH, MODEL]))
  assert len(context.layer_outputs) == 3
  other = transformer.Context(
      model=layer_testing.ModelStub(D), mesh=mesh, batch_dims=[BATCH],
      length_dim=LENGTH, variable_dtype=mtf.VariableDType())
  assert other.layer_outputs == []  # Not shared between contexts.


def test_annealed_dropout_needs_its_steps():
  with pytest.raises(ValueError, match="start_step and end_step"):
    _build_only(lambda c, x: transformer.sublayer_annealed_dropout(
        x, None, c, init_dropout_rate=0.5))


def test_clip_activation_gradient():
  got = _run(lambda c, x: transformer.sublayer_clip_activation_gradient(
      x, None, c, rms_norm=1.0), wrt_x=True)
  np.testing.assert_allclose(got["y"], X)
  cot = np.random.RandomState(2).normal(size=(B, L, D)).astype(np.float32) * 10
  rms = np.sqrt(np.mean(cot ** 2))
  np.testing.assert_allclose(got["d_x"], cot / rms, rtol=1e-5)


def _np_stack(x, weights, num_layers):
  """The default pipeline with Linear layers and unit norm scales."""
  for i in range(num_layers):
    x = x + _rms_norm(x) @ weights[i]
  return _rms_norm(x)


def _stack(num_layers=2, cls=transformer.LayerStack, **kwargs):
  return transformer.make_layer_stack(
      [Linear], layer_stack_cls=lambda layers: cls(layers, **kwargs),
      num_layers=num_layers)


def test_layer_stack_default_pipeline():
  stack = _stack()
  outputs = {}

  def fn(context, x):
    y = stack.call(context, x)
    outputs["n"] = len(context.layer_outputs)
    return y
  got = _run(fn)
  weights = [got[f"block_{i:03d}/layer_000/Linear/w"] for i in range(2)]
  np.testing.assert_allclose(got["y"], _np_stack(X, weights, 2),
                             rtol=1e-5, atol=1e-5)
  # The embeddings, each layer but the last, and the final output.
  assert outputs["n"] == 3
  assert "block_000/layer_000/rms_norm/scale" in got
  assert "rms_norm/scale" in got
  assert stack.num_layers == 2 and len(stack.layers) == 2


def test_recompute_grads_changes_nothing():
  plain = _run(lambda c, x: _stack().call(c, x), wrt_x=True)
  recomputed = _run(lambda c, x: _stack(recompute_grads=True).call(c, x),
                    wrt_x=True)
  assert set(plain) == set(recomputed)
  for key in plain:
    np.testing.assert_allclose(recomputed[key], plain[key], rtol=1e-5,
                               atol=1e-5, err_msg=key)


def test_legacy_layer_stack():
  stack = _stack(dropout_rate=0.0, norm_epsilon=1e-6)
  got = _run(lambda c, x: stack.call(c, x))
  assert "block_000/layer_000/layer_norm/scale" in got
  assert "final_layer_norm/scale" in got
  weights = [got[f"block_{i:03d}/layer_000/Linear/w"] for i in range(2)]
  np.testing.assert_allclose(got["y"], _np_stack(X, weights, 2),
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="both dropout_rate and norm_epsilon"):
    transformer.LayerStack([], dropout_rate=0.1)


def test_layer_stack_checks_output_shape():
  stack = transformer.LayerStack(
      [Misshaped()], sublayers_per_layer=[transformer.sublayer_call_layer])
  with pytest.raises(ValueError, match="Misshaped.*misshaped"):
    _build_only(lambda c, x: stack.call(c, x))


@pytest.mark.parametrize("recompute", [False, True])
def test_reversible_layer_stack(recompute):
  per_layer = [transformer.sublayer_rms_norm, transformer.sublayer_call_layer]
  stack = _stack(cls=transformer.ReversibleLayerStack,
                 sublayers_per_layer=per_layer, recompute_grads=recompute)
  got = _run(lambda c, x: stack.call(c, x), wrt_x=True)
  weights = [got[f"block_{i:03d}/layer_000/Linear/w"] for i in range(2)]
  x1, x2 = X, X
  for w in weights:
    x1, x2 = x2, x1 + _rms_norm(x2) @ w
  np.testing.assert_allclose(got["y"], _rms_norm(x1 + x2), rtol=1e-5,
                             atol=1e-5)
  if recompute:
    plain = _run(lambda c, x: _stack(
        cls=transformer.ReversibleLayerStack,
        sublayers_per_layer=per_layer).call(c, x), wrt_x=True)
    np.testing.assert_allclose(got["d_x"], plain["d_x"], rtol=1e-4,
                               atol=1e-4)


class Recorder(transformer.TransformerLayer):

  def __init__(self, size=1):
    self.size = size


def test_make_layer_stack_specs_and_names():
  stack = transformer.make_layer_stack(
      [Recorder, [Recorder, "ffn", {"size": 3}]], num_layers=2)
  assert [l.name for l in stack.layers] == [
      "block_000/layer_000", "block_000/ffn",
      "block_001/layer_000", "block_001/ffn"]
  assert [l.size for l in stack.layers] == [1, 3, 1, 3]
  flat = transformer.make_layer_stack(
      [Recorder, [Recorder, {"size": 2}]], num_layers=2, block_scope=False)
  assert [l.name for l in flat.layers] == [
      "layer_000", "layer_001", "layer_002", "layer_003"]
  assert isinstance(flat, transformer.LayerStack)


def _recompute_operations(graph):
  """The CustomGradientOperations of mtf.recompute_grad in `graph`."""
  return [op for op in graph.operations
          if isinstance(op, mtf.CustomGradientOperation) and
          getattr(op, "_grad_fn").__qualname__.startswith("recompute_grad.")]


def test_recompute_grads_of_listed_layers_only():
  """recompute_grads=[0]: the first layer's activations are recomputed
  (one recompute operation), the gradients are those without."""
  plain = _run(lambda c, x: _stack(num_layers=3).call(c, x), wrt_x=True)
  listed = _run(lambda c, x: _stack(num_layers=3, recompute_grads=[0]).call(
      c, x), wrt_x=True)
  assert set(plain) == set(listed)
  for key in plain:
    np.testing.assert_allclose(listed[key], plain[key], rtol=1e-5,
                               atol=1e-5, err_msg=key)
  for recompute, count in (([0], 1), ((0, 2), 2), ([], 0), (True, 3),
                           (False, 0), (range(3), 3)):
    y = _build_only(lambda c, x, r=recompute: _stack(
        num_layers=3, recompute_grads=r).call(c, x))
    assert len(_recompute_operations(y.graph)) == count, recompute


@pytest.mark.parametrize("recompute,match", [
    ([3], r"LayerStack.*index 3.*3 layers"),
    ([0, -1], r"LayerStack.*index -1.*3 layers"),
    (["0"], r"LayerStack.*index '0'.*3 layers"),
    (2, r"LayerStack.*recompute_grads.*2"),
])
def test_recompute_grads_bad_indices(recompute, match):
  with pytest.raises(ValueError, match=match):
    _stack(num_layers=3, recompute_grads=recompute)


def test_reversible_stack_recomputes_listed_layers():
  per_layer = [transformer.sublayer_rms_norm, transformer.sublayer_call_layer]
  plain = _stack(cls=transformer.ReversibleLayerStack,
                 sublayers_per_layer=per_layer)
  listed = _stack(cls=transformer.ReversibleLayerStack,
                  sublayers_per_layer=per_layer, recompute_grads=[1])
  want = _run(lambda c, x: plain.call(c, x), wrt_x=True)
  got = _run(lambda c, x: listed.call(c, x), wrt_x=True)
  np.testing.assert_allclose(got["d_x"], want["d_x"], rtol=1e-4, atol=1e-4)


def test_pipelined_stack_recomputes_all_layers_or_none():
  layers = _stack(num_layers=4).layers
  with pytest.raises(ValueError, match=r"PipelinedLayerStack.*2 of the 4 "
                     r"layers.*all its layers or none"):
    transformer.PipelinedLayerStack(layers, num_stages=2,
                                    recompute_grads=[0, 1])
  every = transformer.PipelinedLayerStack(layers, num_stages=2,
                                          recompute_grads=[3, 2, 1, 0])
  assert every._recompute_grads is True  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=r"PipelinedLayerStack.*index 4"):
    transformer.PipelinedLayerStack(layers, num_stages=2,
                                    recompute_grads=[4])
