"""Tests of the attention variants of `transformer_layers`.

Talking-heads, general-bilinear, branched, synthesizer and transparent
attention, and `relative_position_spans`: the same outputs, gradients and
variables under every layout (heads split on "model"), incremental decoding
equal to the full causal pass, and NumPy references for the talking-heads
math and the span positions.
"""

import functools
import string

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layers import dense_layers
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
from tests import mtf_testing
from tests.transformer import layer_testing

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 8)
MEMORY = mtf.Dimension("memory_length", 6)
ENCODER_LENGTH = mtf.Dimension("length", 6)
D_MODEL = 16
HEADS = ("heads", 8)
PREFIX = 5  # Positions decoded by "first_part"; the rest one by one.


def _array(seed, *sizes):
  return np.random.RandomState(seed).randn(*sizes).astype(np.float32)


def _talking_heads(**kwargs):
  return transformer_layers.TalkingHeadsSelfAttention(
      key_heads_dims=[HEADS, ("key_heads", 2)],
      softmax_heads_dims=[HEADS, ("softmax_heads", 3)],
      value_heads_dims=[HEADS, ("value_heads", 2)],
      key_size=4, value_size=4, **kwargs)


def _branched(cls, **kwargs):
  layer = cls(num_heads=8, key_value_size=4, **kwargs)
  layer.dense_layer = dense_layers.DenseReluDense(hidden_size=16)
  return layer


def _synthesizer(mode):
  # Tables for 16 positions rather than 512 keep the test small.
  return transformer_layers.Synthesizer(
      num_heads=8, key_value_size=4, synthesize_mode=mode,
      attention_kwargs={"max_length": 16})


SYNTHESIZE_MODES = ("random", "factorized", "dense_minus", "random_plus",
                    "random_plus_alpha", "dense_plus", "dense_plus_alpha")
# The layout tests (costly: every op lowered for 8 processors) take the
# learned tables (factorized, from two factors), the dense synthesizer and a
# learned mix with dot-product logits; the decoding tests take every mode.
LAYOUT_SYNTHESIZE_MODES = ("factorized", "dense_minus", "random_plus_alpha")


def _plain_talking_heads():
  """Talking-heads attention without projections (equal heads lists)."""
  return transformer_layers.TalkingHeadsSelfAttention(
      key_heads_dims=[HEADS], softmax_heads_dims=[HEADS],
      value_heads_dims=[HEADS], key_size=4, value_size=4)


def self_attention_layers(synthesize_modes=SYNTHESIZE_MODES, plain=True):
  """(scope name, layer) of the self-attention variants under test."""
  return [("th_plain", _plain_talking_heads())] * plain + [
      # With T5 relative position biases, one per softmax head, and
      # dropout on the attention weights (in training only).
      ("th", _talking_heads(relative_attention_type="bias",
                            dropout_rate=0.25)),
      ("th_dynamic", _talking_heads(
          dynamic_projections=["x2l", "m2l", "x2w", "m2w"])),
      ("gb", transformer_layers.GeneralBilinearSelfAttention(
          heads_dims=[HEADS], relative_attention_type="bias_shared")),
  ] + [(f"synth_{mode}", _synthesizer(mode)) for mode in synthesize_modes]


def enc_dec_layers():
  return [
      ("th", transformer_layers.TalkingHeadsEncDecAttention(
          key_heads_dims=[HEADS, ("key_heads", 2)],
          softmax_heads_dims=[HEADS, ("softmax_heads", 3)],
          value_heads_dims=[HEADS, ("value_heads", 2)],
          key_size=4, value_size=4)),
      ("gb", transformer_layers.GeneralBilinearEncDecAttention(
          heads_dims=[HEADS])),
  ]


def branched_layers():
  """Branched attention: self-attention, then over the encoder output."""
  return [
      ("branched", _branched(transformer_layers.BranchedSelfAttention)),
      ("branched_enc_dec",
       _branched(transformer_layers.BranchedEncDecAttention)),
  ]


def _without_d_ff(layout):
  """The layout rules but "d_ff". The branches' hidden layer has both heads
  and d_ff, which cannot both be split over one mesh dimension."""
  return ";".join(rule for rule in layout.split(";")
                  if rule and not rule.startswith("d_ff:"))


def _transparent(encoder_num_modules=2):
  return transformer_layers.TransparentEncDecAttention(
      layers_per_encoder_module=1, layers_per_decoder_module=1,
      encoder_num_modules=encoder_num_modules, decoder_num_modules=2,
      num_heads=8, key_value_size=4, dropout_rate=0.25)


def _model():
  return layer_testing.ModelStub(D_MODEL)


def _decoder_context(mesh, mode, **kwargs):
  """A context of causal self-attention over LENGTH (as a decoder's)."""
  position = mtf.range(mesh, LENGTH, tf.int32)
  return layer_testing.make_context(
      mesh, _model(), BATCH, LENGTH, mode=mode, position=position,
      position_is_default=True, read_priority=position,
      write_priority=position, new_states=[], constant_states=[], **kwargs)


def _encoder_outputs(mesh):
  """The encoder's output and its three layer outputs."""
  outputs = [mtf_testing.import_array(
      mesh, _array(10 + i, BATCH.size, ENCODER_LENGTH.size, D_MODEL),
      [BATCH, ENCODER_LENGTH, mtf.Dimension("d_model", D_MODEL)])
             for i in range(3)]
  return mtf.replace_dimensions(outputs[-1], ENCODER_LENGTH, MEMORY), outputs


def _input(mesh):
  return mtf_testing.import_array(
      mesh, _array(0, BATCH.size, LENGTH.size, D_MODEL),
      [BATCH, LENGTH, mtf.Dimension("d_model", D_MODEL)])


def _with_loss(mesh, x, outputs):
  """(outputs, loss, wrt): a loss from every output, differentiated with
  respect to the input and every variable."""
  loss = mtf.add_n([
      mtf.reduce_sum(y * mtf_testing.import_array(
          mesh, _array(100 + i, *y.shape.to_integer_list), y.shape.dims))
      for i, y in enumerate(outputs.values())])
  wrt = {"x": x}
  wrt.update({v.name: v.outputs[0] for v in mesh.graph.trainable_variables})
  return outputs, loss, wrt


def build_self_attention(mesh):
  x = _input(mesh)
  context = _decoder_context(mesh, "train")
  outputs = {}
  for scope, layer in self_attention_layers(LAYOUT_SYNTHESIZE_MODES,
                                            plain=False):
    with tf.compat.v1.variable_scope(scope):
      outputs[scope] = layer.call(context, x)
  return _with_loss(mesh, x, outputs)


def build_enc_dec(mesh):
  x = _input(mesh)
  encoder_output, layer_outputs = _encoder_outputs(mesh)
  context = _decoder_context(mesh, "train", encoder_output=encoder_output,
                             encoder_layer_outputs=layer_outputs)
  outputs = {}
  for scope, layer in enc_dec_layers():
    with tf.compat.v1.variable_scope(scope):
      outputs[scope] = layer.call(context, x)
  for index in range(2):
    context.layer_index = index
    with tf.compat.v1.variable_scope(f"transparent_{index}"):
      outputs[f"transparent_{index}"] = _transparent().call(context, x)
  return _with_loss(mesh, x, outputs)


def build_branched(mesh):
  x = _input(mesh)
  encoder_output, _ = _encoder_outputs(mesh)
  context = _decoder_context(mesh, "train", encoder_output=encoder_output)
  outputs = {}
  for scope, layer in branched_layers():
    with tf.compat.v1.variable_scope(scope):
      outputs[scope] = layer.call(context, x)
  return _with_loss(mesh, x, outputs)


PROGRAMS = {"self": build_self_attention, "enc_dec": build_enc_dec,
            "branched": build_branched}


@functools.lru_cache(maxsize=None)
def _reference_run(program):
  """(values, mtf Graph) of `program` on one processor."""
  return mtf_testing.run_program(layer_testing.ONE_PROCESSOR[1],
                                 layer_testing.ONE_PROCESSOR[2], "function",
                                 PROGRAMS[program])


def _reference(program):
  return _reference_run(program)[0]


# Every layout in tf.function; graph mode (a separate lowering path of the
# same ops) under the 2-D layout, which splits both batch and heads.
LAYOUT_CASES = [
    pytest.param(case_id, mesh_shape, layout, mode, id=f"{case_id}-{mode}")
    for (case_id, mesh_shape, layout), mode in
    [(case, "function") for case in layer_testing.LAYOUTS[1:]] +
    [(layer_testing.LAYOUTS[3], "graph")]]


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("case_id,mesh_shape,layout,mode", LAYOUT_CASES)
def test_same_under_layouts(program, case_id, mesh_shape, layout, mode):
  want = _reference(program)
  if program == "branched":
    layout = _without_d_ff(layout)
  got = layer_testing.run_under(mesh_shape, layout, mode, PROGRAMS[program])
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_allclose(
        got[key], value, rtol=1e-5, atol=1e-5,
        err_msg=f"{key} differs under {case_id} ({layout!r}) in {mode}")


def test_variable_names_are_the_originals():
  names = set().union(*[_reference(program) for program in PROGRAMS])
  for name in ["th/q/kernel", "th/k/kernel", "th/v/kernel", "th/y/kernel",
               "th/logits/kernel", "th/weights/kernel",
               "th/relative_attention_bias", "gb/relative_attention_bias",
               "th_dynamic/logits/kernel", "th_dynamic/logits/logits_dynamic_0/"
               "kernel", "gb/q/kernel", "gb/y/kernel", "branched/kappa",
               "branched/alpha", "branched/wi/kernel", "branched/wo/kernel",
               "synth_random_plus_alpha/R", "synth_factorized/R1",
               "synth_factorized/R2", "synth_random_plus_alpha/alpha",
               "synth_dense_minus/pi/kernel", "transparent_0/w"]:
    assert name in names, sorted(names)
  # The transparent mixture is made once for all decoder modules.
  assert "transparent_1/w" not in names


# NumPy references. Tensors are (array, dimension names) pairs.


def _einsum(output_names, *operands):
  letters = {}
  for _, names in operands:
    for n in names:
      letters.setdefault(n, string.ascii_letters[len(letters)])
  equation = ",".join("".join(letters[n] for n in names)
                      for _, names in operands)
  equation += "->" + "".join(letters[n] for n in output_names)
  return np.einsum(equation, *[a for a, _ in operands]), list(output_names)


def _softmax(a, axis):
  a = a - a.max(axis=axis, keepdims=True)
  e = np.exp(a)
  return e / e.sum(axis=axis, keepdims=True)


def _project(t, kernel, from_heads, to_heads):
  """The talking-heads projection of `t` from one heads list to another."""
  if from_heads == to_heads:
    return t
  names = t[1]
  out = [n for n in names if n not in from_heads or n in to_heads] + [
      n for n in to_heads if n not in from_heads]
  return _einsum(out, t, kernel)


def _numpy_talking_heads(x, variables, scope, key_heads, softmax_heads,
                         value_heads):
  """Talking-heads self-attention with a causal mask, in NumPy."""
  x = (x, ["batch", "length", "d_model"])
  m = (x[0], ["batch", "memory_length", "d_model"])
  var = lambda n: variables[f"{scope}/{n}/kernel"]
  q = _einsum(["batch", "length"] + key_heads + ["d_k"], x, var("q"))
  k = _einsum(["batch", "memory_length"] + key_heads + ["d_k"], m, var("k"))
  v = _einsum(["batch", "memory_length"] + value_heads + ["d_v"], m,
              var("v"))
  p = _einsum(["batch", "length", "memory_length"] + key_heads, q, k)
  logits = _project(p, var("logits") if key_heads != softmax_heads else None,
                    key_heads, softmax_heads)
  array, names = logits
  mask = np.tril(np.ones([LENGTH.size, LENGTH.size]))[None, :, :]
  mask = mask.reshape(mask.shape + (1,) * (len(names) - 3))
  array = np.where(mask > 0, array, array - 1e9)
  h = (_softmax(array, names.index("memory_length")), names)
  weights = _project(h, var("weights") if softmax_heads != value_heads
                     else None, softmax_heads, value_heads)
  u = _einsum(["batch", "length"] + value_heads + ["d_v"], weights, v)
  return _einsum(["batch", "length", "d_model"], u, var("y"))[0]


@functools.lru_cache(maxsize=None)
def _talking_heads_run():
  """Plain and projected talking-heads attention on one processor."""
  def build(mesh):
    x = _input(mesh)
    context = _decoder_context(mesh, "train")
    outputs = {}
    for name, layer in [("th_plain", _plain_talking_heads()),
                        ("th", _talking_heads())]:
      with tf.compat.v1.variable_scope(name):
        outputs[name] = layer.call(context, x)
    return outputs, None, {}

  return mtf_testing.run_program("all:1", "", "function", build)


@pytest.mark.parametrize("scope,heads", [
    ("th_plain", (["heads"], ["heads"], ["heads"])),
    ("th", (["heads", "key_heads"], ["heads", "softmax_heads"],
            ["heads", "value_heads"]))])
def test_talking_heads_against_numpy(scope, heads):
  """Plain (equal heads lists: ordinary multi-head attention) and projected
  talking-heads attention equal a NumPy computation from their variables."""
  values, graph = _talking_heads_run()
  variables = {}
  for var in graph.trainable_variables:
    if var.name.startswith(scope + "/"):
      variables[var.name] = (values[var.name],
                             [d.name for d in var.shape.dims])
  if scope == "th_plain":
    # Equal heads lists: no projections, only q, k, v and y.
    assert sorted(variables) == [f"th_plain/{n}/kernel" for n in "kqvy"]
  x = _array(0, BATCH.size, LENGTH.size, D_MODEL)
  want = _numpy_talking_heads(x, variables, scope, *heads)
  np.testing.assert_allclose(values[scope], want, rtol=1e-4, atol=1e-5)


# Incremental decoding.


def _decode(mesh, layers, encoder=False):
  """Full causal outputs and first_part + incremental outputs, by position."""
  x = _input(mesh)
  kwargs = {}
  if encoder:
    kwargs["encoder_output"], kwargs["encoder_layer_outputs"] = (
        _encoder_outputs(mesh))
  full_context = _decoder_context(mesh, "eval", **kwargs)
  position = mtf.range(mesh, LENGTH, tf.int32)
  prefix = mtf.cast(mtf.less(position, PREFIX), x.dtype)
  first_context = _decoder_context(
      mesh, transformer.FIRST_PART, initial_position=PREFIX, **kwargs)
  outputs = {}
  for scope, layer in layers:
    with tf.compat.v1.variable_scope(scope):
      outputs[f"{scope}/full"] = layer.call(full_context, x)
      # Positions from PREFIX on are not known yet.
      layer.call(first_context, x * prefix)
  states = first_context.new_states
  for step in range(PREFIX, LENGTH.size):
    step_position = mtf.constant(mesh, step, mtf.Shape([]), tf.int32)
    context = layer_testing.make_context(
        mesh, _model(), BATCH, LENGTH, mode=transformer.INCREMENTAL,
        position=step_position, states=states, new_states=[],
        constant_states=first_context.constant_states,
        write_priority=position, read_priority=step_position, **kwargs)
    x_step = mtf.gather(x, step, LENGTH)
    for scope, layer in layers:
      with tf.compat.v1.variable_scope(scope):
        outputs[f"{scope}/step_{step}"] = layer.call(context, x_step)
    states = context.new_states
  return outputs


def _check_decoding(values, layers):
  for scope, _ in layers:
    for step in range(PREFIX, LENGTH.size):
      np.testing.assert_allclose(
          values[f"{scope}/step_{step}"], values[f"{scope}/full"][:, step],
          rtol=1e-5, atol=1e-5, err_msg=f"{scope} at step {step}")


def _decodable_self_attention_layers():
  # Dynamic projections from the memory see only the current position when
  # decoding, in the original as here: leave "m2l" and "m2w" out.
  return [(scope, layer) for scope, layer in self_attention_layers()
          if scope != "th_dynamic"] + [
              ("th_dynamic_x", _talking_heads(
                  dynamic_projections=["x2l", "x2w"]))]


def _decoding_layers(subset):
  """(self-attention layers, encoder-decoder layers) for decoding tests."""
  self_layers = _decodable_self_attention_layers() + branched_layers()[:1]
  cross_layers = [("enc_dec_" + scope, layer)
                  for scope, layer in enc_dec_layers() + branched_layers()[1:]]
  if subset:
    self_layers = [(scope, layer) for scope, layer in self_layers
                   if scope in ("th_dynamic_x", "synth_random_plus_alpha")]
    cross_layers = cross_layers[:1]
  return self_layers, cross_layers


@pytest.mark.parametrize("mesh_shape,layout,subset", [
    ("all:1", "", False),
    (layer_testing.LAYOUTS[3][1], _without_d_ff(layer_testing.LAYOUTS[3][2]),
     True)])
def test_incremental_decoding_equals_full_pass(mesh_shape, layout, subset):
  """Every variant on one processor; some of them under the 2-D layout."""
  self_layers, cross_layers = _decoding_layers(subset)

  def build(mesh):
    outputs = _decode(mesh, self_layers)
    outputs.update(_decode(mesh, cross_layers, encoder=True))
    return outputs, None, {}

  values = layer_testing.run_under(mesh_shape, layout, "function", build)
  _check_decoding(values, self_layers + cross_layers)


# relative_position_spans.


class _SpanModel(layer_testing.ModelStub):
  input_vocab_size_unpadded = 32


def _numpy_spans(decoder_ids, encoder_ids, decoder_seq, encoder_seq,
                 num_sentinels):
  def segments(ids):
    return np.cumsum(ids >= 32 - num_sentinels, axis=-1)
  multiplier = max(decoder_ids.shape[-1], encoder_ids.shape[-1])
  enc = segments(encoder_ids) + encoder_seq * multiplier
  dec = segments(decoder_ids) + decoder_seq * multiplier
  dec_to_enc = (enc[:, None, :] < dec[:, :, None]).sum(axis=-1)
  return dec_to_enc[:, :, None] - np.arange(encoder_ids.shape[-1])


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), (layer_testing.LAYOUTS[1][1], layer_testing.LAYOUTS[1][2])])
def test_relative_position_spans_against_numpy(mesh_shape, layout):
  rng = np.random.RandomState(3)
  # Sentinels are ids 28..31; about one token in four is a sentinel.
  encoder_ids = np.where(rng.rand(8, 6) < 0.25, 30,
                         rng.randint(1, 28, [8, 6])).astype(np.int32)
  decoder_ids = np.where(rng.rand(8, 8) < 0.25, 31,
                         rng.randint(1, 28, [8, 8])).astype(np.int32)
  encoder_seq = np.repeat([[1, 1, 1, 2, 2, 2]], 8, axis=0).astype(np.int32)
  decoder_seq = np.repeat([[1, 1, 1, 1, 2, 2, 2, 2]], 8, axis=0).astype(
      np.int32)

  def build(mesh):
    def imported(array, length):
      return mtf_testing.import_array(mesh, array, [BATCH, length])
    context = layer_testing.make_context(
        mesh, _SpanModel(D_MODEL), BATCH, LENGTH,
        inputs=imported(decoder_ids, LENGTH),
        encoder_inputs=imported(encoder_ids, MEMORY),
        sequence_id=imported(decoder_seq, LENGTH),
        encoder_sequence_id=imported(encoder_seq, MEMORY),
        encoder_output=mtf.zeros(mesh, [BATCH, MEMORY]))
    spans = transformer_layers.relative_position_spans(context,
                                                       num_sentinels=4)
    # Decoding one position: every target is placed at the input's start.
    context.inputs = mtf.gather(context.inputs, 2, LENGTH)
    decoding = transformer_layers.relative_position_spans(context,
                                                          num_sentinels=4)
    return {"spans": mtf.transpose(spans, [BATCH, LENGTH, MEMORY]),
            "decoding": decoding}, None, {}

  values = layer_testing.run_under(mesh_shape, layout, "function", build)
  want = _numpy_spans(decoder_ids, encoder_ids, decoder_seq, encoder_seq, 4)
  np.testing.assert_array_equal(values["spans"], want)
  np.testing.assert_array_equal(values["decoding"], -np.arange(MEMORY.size))


# Construction and gin.


def test_gin_binds_the_originals_names():
  gin.clear_config()
  try:
    gin.parse_config("""
        import mesh_tensorflow.transformer.transformer_layers
        transformer_layers.TalkingHeadsSelfAttention.key_size = 4
        transformer_layers.Synthesizer.synthesize_mode = "dense_minus"
        mesh_tensorflow.transformer.transformer_layers.\
GeneralBilinearSelfAttention.heads_dims = [("heads", 2)]
        transformer_layers.relative_position_spans.num_sentinels = 7
        """)
    assert transformer_layers.TalkingHeadsSelfAttention().key_dim.size == 4
    synthesizer = transformer_layers.Synthesizer()
    assert (synthesizer.shared_kv, synthesizer.no_query) == (True, False)
    assert transformer_layers.GeneralBilinearSelfAttention().heads_dims == [
        mtf.Dimension("heads", 2)]
  finally:
    gin.clear_config()


@pytest.mark.parametrize("mode,shared_kv,no_query", [
    ("random", True, True), ("factorized", True, True),
    ("dense_minus", True, False), ("random_plus", False, False),
    ("dense_plus_alpha", False, False)])
def test_synthesizer_modes_choose_projections(mode, shared_kv, no_query):
  layer = transformer_layers.Synthesizer(synthesize_mode=mode)
  assert (layer.shared_kv, layer.no_query) == (shared_kv, no_query)


def test_transparent_attention_checks_the_encoder_modules():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  encoder_output, layer_outputs = _encoder_outputs(mesh)
  context = _decoder_context(mesh, "train", encoder_output=encoder_output,
                             encoder_layer_outputs=layer_outputs)
  with pytest.raises(ValueError, match="3 layer outputs.*encoder_num_modules"
                     "=3 needs 4"):
    _transparent(encoder_num_modules=3).call(context, _input(mesh))


def test_bad_arguments_name_the_layer():
  with pytest.raises(ValueError, match="BranchedSelfAttention.*num_memory"):
    transformer_layers.BranchedSelfAttention(num_memory_heads=1)
  with pytest.raises(ValueError, match="dynamic projection 'x2y'"):
    transformer_layers.TalkingHeadsSelfAttention(dynamic_projections=["x2y"])
