"""Helpers for Transformer tests: a model stand-in, a context, layouts.

A layer's answer must not depend on the layout, so the tests run one program
on a one-processor mesh and under data-, model- and 2-D-parallel layouts and
compare every output, gradient and variable.
"""

import weakref

import numpy as np

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from tests import mtf_testing

# (id, mesh shape, layout rules) for Transformer dimensions. Tests use sizes
# these divide: batch and heads and d_ff and vocab by 8 where "all:8" splits
# them.
ONE_PROCESSOR = ("1proc", "all:1", "")
LAYOUTS = (
    ONE_PROCESSOR,
    ("dp", "batch:8", "batch:batch"),
    ("mp", "model:8", "d_ff:model;heads:model;vocab:model;experts:model"),
    ("2d", "batch:2;model:4",
     "batch:batch;d_ff:model;heads:model;vocab:model;experts:batch"),
)


class ModelStub:
  """What layers read from `context.model` when there is no Unitransformer."""

  def __init__(self, d_model, autoregressive=True):
    self.model_dim = mtf.Dimension("d_model", d_model)
    self.autoregressive = autoregressive
    self.fully_autoregressive = autoregressive
    self.ensemble_dims = []


def make_context(mesh, model, batch_dim, length_dim, mode="train",
                 variable_dtype=None, **kwargs):
  """A Context for calling one layer outside a Unitransformer."""
  return transformer.Context(
      model=model, mesh=mesh, batch_dims=[batch_dim], length_dim=length_dim,
      variable_dtype=variable_dtype or mtf.VariableDType(),
      mode=mode, losses=[], **kwargs)


def run_under(mesh_shape, layout, mode, build):
  """`mtf_testing.run_program` (outputs, gradients, variables) as a dict."""
  values, _ = mtf_testing.run_program(mesh_shape, layout, mode, build)
  return values


# build -> its one-processor answer (assert_same_under_layouts).
_REFERENCES = weakref.WeakKeyDictionary()


def assert_same_under_layouts(build, layouts=LAYOUTS, modes=("function",),
                              rtol=1e-5, atol=1e-5):
  """Runs `build` (see run_program) under each layout and mode, and checks
  that everything it fetches equals the one-processor answer.

  The answer is `build` run on one processor in tf.function, once per
  `build` (a test may check one build in several calls: tf.function on
  every layout, then graph mode on the 2-D one); that run is not repeated
  as a case of its own.
  """
  try:
    reference = _REFERENCES.get(build)
  except TypeError:  # Not weakly referable: not remembered.
    reference = None
  if reference is None:
    reference = run_under(ONE_PROCESSOR[1], ONE_PROCESSOR[2], "function",
                          build)
    try:
      _REFERENCES[build] = reference
    except TypeError:
      pass
  for case_id, mesh_shape, layout in layouts:
    for mode in modes:
      if (mesh_shape, layout, mode) == (ONE_PROCESSOR[1], ONE_PROCESSOR[2],
                                        "function"):
        continue  # The reference run itself.
      got = run_under(mesh_shape, layout, mode, build)
      assert set(got) == set(reference), (case_id, mode)
      for key, want in reference.items():
        np.testing.assert_allclose(
            got[key], want, rtol=rtol, atol=atol,
            err_msg=f"{key} differs under {case_id} ({layout!r}) in {mode}")
  return reference


def weighted_sum_builder(layer, x, loss_weights, batch_dim, length_dim,
                         mode="eval", wrt_variables=False):
  """build(mesh) for run_program: `layer` called on the array `x`
  [batch, length, d_model], the loss sum(y * loss_weights), gradients by x
  (and by every variable with `wrt_variables`)."""

  def build(mesh):
    model = ModelStub(x.shape[-1])
    context = make_context(mesh, model, batch_dim, length_dim, mode=mode)
    dims = [batch_dim, length_dim, model.model_dim]
    xt = mtf_testing.import_array(mesh, x, dims)
    y = layer.call(context, xt)
    w = mtf_testing.import_array(mesh, loss_weights, dims)
    wrt = {"x": xt}
    if wrt_variables:
      wrt.update({v.name: v.outputs[0]
                  for v in mesh.graph.trainable_variables})
    return {"y": y}, mtf.reduce_sum(y * w), wrt

  return build
