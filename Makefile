# Two commands do everything on a fresh machine:
#   make test    # virtual environment + install + the linter + the test suite (CPU)
#   make bench   # same setup + the main benchmark job
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
BENCH_ARGS ?=
# e.g. INSPECT_ARGS="--reference /path/to/06-fused-attention.py" (Triton's tutorial kernel, not shipped)
INSPECT_ARGS ?=

.PHONY: setup setup-bench test lint bench bench-kernels bench-gpu inspect info clean

$(VENV)/.setup-test: pyproject.toml constraints.txt scripts/setup-env.sh
	scripts/setup-env.sh $(VENV) test
	touch $@

$(VENV)/.setup-bench: pyproject.toml constraints.txt scripts/setup-env.sh
	scripts/setup-env.sh $(VENV) bench,triton
	touch $@

setup: $(VENV)/.setup-test

test: $(VENV)/.setup-test
	$(PY) -m ruff check .
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

lint: $(VENV)/.setup-test
	$(PY) -m ruff check .

bench: $(VENV)/.setup-bench
	$(PY) -m attnkit bench $(BENCH_ARGS)

bench-kernels: $(VENV)/.setup-test
	$(PY) -m pytest bench/ --benchmark-only $(PYTEST_ARGS)

# The static performance report of the Triton kernel (no GPU needed): compiles every
# shipped configuration for sm_80 and sm_90, writes bench/results/static/, fails on
# spills, duplicated work or an instr/score above its budget. 3 to 4 hours on two cores
# without Triton's cache (about half an hour with it); the targets' rows compile first, and an
# interrupted run (Ctrl-C, SIGTERM) still writes a report, marked partial.
inspect: $(VENV)/.setup-test
	$(PY) -m attnkit.kernels.inspect $(INSPECT_ARGS)

info: $(VENV)/.setup-test
	$(PY) -m attnkit info

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Everything for a CUDA machine in one run: tables 1-5 + kernel microbenchmarks.
OUT ?= bench/out/gpu
bench-gpu: $(VENV)/.setup-bench
	PYTHON=$(abspath $(PY)) bench/gpu_suite.sh $(OUT)
