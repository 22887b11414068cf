# make test  : run the test suite (creates .venv on first use)
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

test: $(STAMP) $(T5_STAMP)
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m pytest -n 2 -q --durations=25 tests

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
