# make test  : run the test suite (creates .venv on first use) with oneDNN's
#              kernels on, then the tests of rank-limited kernels again with
#              them off (ONEDNN=0 swaps the two settings)
# make demo  : train, evaluate, decode and export a Transformer on the embedded
#              addition task through the binary, on 8 logical CPUs, then serve
#              the SavedModel
# make demo-mlp : train the README's MLP data- and model-parallel
# make bench : run the benchmarks (one JSON line per case)

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo demo-mlp bench clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,auto_mtf]"
	touch $(STAMP)

# T5's MtfModel for tests/transformer/test_t5_client.py: pinned, with
# --no-deps (t5 and seqio declare the original mesh-tensorflow, which would
# replace this package). Only `make test` needs it.
T5_CLIENT := tools/t5_client_requirements.txt
T5_STAMP := $(VENV)/.t5_client_installed

$(T5_STAMP): $(STAMP) $(T5_CLIENT)
	$(PY) -m pip install --quiet --no-deps -r $(T5_CLIENT)
	touch $(T5_STAMP)

# TensorFlow picks its CPU kernels by the CPU: oneDNN's are on by default on
# AVX-512 servers and off elsewhere, with other limits (softmax rank <= 5)
# and summation orders. The whole suite runs in one setting (on by default:
# the stricter one, and what most servers run) and these tests, which cover
# the rank-limited kernels (and the padding of uneven splits, whose pad
# and select kernels meet the same limits, as do slices, pads, pooling and
# convolutions along split dimensions), 2-D local attention, a
# pipelined binary run, the funnel's pooling (against NumPy, and its stack
# on the 2-D layouts) and BERT (each config, tiny, mixture-of-experts and
# relative-attention, on the 2-D layout, and against NumPy), in the
# other: one case per kernel-sensitive feature, as the first run covers
# the rest.
ONEDNN ?= 1
ONEDNN_OTHER := $(if $(filter 0,$(ONEDNN)),1,0)
BOTH_SETTINGS_TESTS := \
	tests/ops/test_high_rank.py \
	tests/ops/test_rank_beyond_eight.py \
	tests/ops/test_uneven_movement.py::test_rank_7_with_three_padded_dimensions \
	"tests/ops/test_uneven_movement.py::test_slice_and_pad_along_a_split_dimension[all8_b-eager]" \
	"tests/ops/test_uneven_movement.py::test_slice_and_pad_along_a_split_dimension[b2m4-simd]" \
	"tests/ops/test_spatial_splits.py::test_pooling_and_convolution_along_split_spatial_dimensions[b2m4-eager]" \
	"tests/ops/test_spatial_splits.py::test_pooling_and_convolution_along_split_spatial_dimensions[b2m4-simd]" \
	tests/test_uneven_mechanism.py \
	tests/test_local_attention_layers.py \
	tests/transformer/test_funnel_transformer.py::test_pooling_matches_numpy \
	"tests/transformer/test_funnel_transformer.py::test_same_under_layouts[graph-layouts1]" \
	"tests/test_random_programs.py::test_random_programs_agree_with_one_processor[0]" \
	tests/transformer/test_pipelined_run_modes.py::test_perplexity_eval_is_the_plain_models \
	tests/bert/test_bert.py::test_tiny_model_matches_numpy_bert \
	tests/bert/test_bert.py::test_relative_attention_matches_numpy_bert \
	"tests/bert/test_bert.py::test_losses_and_gradients_are_the_same_under_every_layout[2d-eager-tiny]" \
	"tests/bert/test_bert.py::test_losses_and_gradients_are_the_same_under_every_layout[2d-eager-moe]" \
	"tests/bert/test_bert.py::test_losses_and_gradients_are_the_same_under_every_layout[2d-eager-relative]"
PYTEST := TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m pytest -n 2 --dist loadgroup -q

test: $(STAMP) $(T5_STAMP)
	TF_ENABLE_ONEDNN_OPTS=$(ONEDNN) $(PYTEST) --durations=60 tests
	TF_ENABLE_ONEDNN_OPTS=$(ONEDNN_OTHER) $(PYTEST) $(BOTH_SETTINGS_TESTS)

demo: $(STAMP)
	$(PY) examples/transformer_demo.py

demo-mlp: $(STAMP)
	$(PY) examples/mlp.py

bench: $(STAMP)
	$(PY) benchmarks/mlp_stack.py
	$(PY) benchmarks/recompute_memory.py
	$(PY) benchmarks/checkpoint_memory.py
	$(PY) benchmarks/autostack.py
	$(PY) benchmarks/lowering_scale.py
	$(PY) benchmarks/random_programs.py
	$(PY) benchmarks/transformer_step.py
	$(PY) benchmarks/zero_memory.py
	$(PY) benchmarks/pipeline.py

clean:
	rm -rf $(VENV) *.egg-info
