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

# The static performance report of the Triton kernel (no GPU needed; tools/static_report,
# not installed): compiles every shipped configuration for sm_80 and sm_90, writes
# bench/results/static/, fails on spills, duplicated work or an instr/score above its
# budget. Resumed by source key: a row is recompiled only when the code it is compiled
# from (the kernels, limits.py, the SASS analysis, the tool's compile functions) or its
# own tile changed, so a comment, a host-code edit or a new tile recompiles nothing else;
# a killed run resumes from bench/results/static/rows.partial.jsonl. From nothing: 3 to 4
# hours on two cores; Ctrl-C or SIGTERM still writes a report, marked partial.
inspect: $(VENV)/.setup-test
	$(PY) -m tools.static_report --resume $(INSPECT_ARGS)

info: $(VENV)/.setup-test
	$(PY) -m attnkit info

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Everything for a CUDA machine in one run: tables 1-5 + kernel microbenchmarks.
OUT ?= bench/out/gpu
bench-gpu: $(VENV)/.setup-bench
	PYTHON=$(abspath $(PY)) bench/gpu_suite.sh $(OUT)
