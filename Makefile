# Two commands do everything on a fresh machine:
#   make test    # virtual environment + install + the linter, formatter check + the test suite (CPU)
#   make bench   # same setup + the main benchmark job
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
BENCH_ARGS ?=
# e.g. INSPECT_ARGS="--reference /path/to/06-fused-attention.py" (Triton's tutorial kernel, not shipped)
INSPECT_ARGS ?=

.PHONY: setup setup-bench test lint bench bench-kernels bench-gpu inspect info clean diffusers-tests .diffusers-tests-var

$(VENV)/.setup-test: pyproject.toml constraints.txt scripts/setup-env.sh
	scripts/setup-env.sh $(VENV) test
	touch $@

$(VENV)/.setup-bench: pyproject.toml constraints.txt scripts/setup-env.sh
	scripts/setup-env.sh $(VENV) bench,triton
	touch $@

setup: $(VENV)/.setup-test

test: $(VENV)/.setup-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

lint: $(VENV)/.setup-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench: $(VENV)/.setup-bench
	$(PY) -m attnkit bench $(BENCH_ARGS)

bench-kernels: $(VENV)/.setup-test
	$(PY) -m pytest bench/ --benchmark-only $(PYTEST_ARGS)

# The static performance report of the Triton kernel (no GPU needed; tools/static_report,
# not installed): compiles every shipped configuration for sm_80 and sm_90, writes
# bench/results/static/, fails on spills, duplicated work or an instr/score above its
# budget. Resumed by source key, then by code key: a row is recompiled only when the code
# it compiles to (Triton's IR, the target, the options, the SASS analysis) or its own
# tile changed, so a comment, a host-code edit, a new tile or a refactor that compiles
# to the same code recompiles nothing else (Triton's front end checks the code: minutes);
# a killed run resumes from bench/results/static/rows.partial.jsonl. From nothing: 3 to 4
# hours on two cores; Ctrl-C or SIGTERM still writes a report, marked partial.
inspect: $(VENV)/.setup-test
	$(PY) -m tools.static_report --resume $(INSPECT_ARGS)

info: $(VENV)/.setup-test
	$(PY) -m attnkit info

clean:
	rm -rf $(VENV) $(DT_VENV) build *.egg-info .pytest_cache

# Everything for a CUDA machine in one run: tables 1-5 + kernel microbenchmarks.
OUT ?= bench/out/gpu
bench-gpu: $(VENV)/.setup-bench
	PYTHON=$(abspath $(PY)) bench/gpu_suite.sh $(OUT)

# diffusers' own model and pipeline tests, stock and with attnkit.auto() set on every
# attention module at construction, compared per family (tools/diffusers_tests, not
# installed): make diffusers-tests DIFFUSERS_TESTS=/path/to/diffusers/tests
# Uses $(DIFFUSERS_TESTS)/../src when it holds diffusers. Runs in $(DT_VENV): the project's
# venv plus what diffusers' tests import. Writes bench/results/cpu/diffusers-tests/report.md
# (and .json); logs in bench/out/diffusers-tests/. With --jobs 2 on 2 cores: stock 65 min
# (15,000 tests), attnkit 27 min (the 4,650 that pass stock). DIFFUSERS_TESTS_ARGS="--jobs 2",
# "--files 'models/unets/*'" runs a part, "--reuse-stock" only the attnkit run again.
DIFFUSERS_TESTS ?=
DIFFUSERS_TESTS_ARGS ?=
DT_VENV ?= .venv-diffusers-tests

$(DT_VENV)/.setup-diffusers-tests: $(VENV)/.setup-test tools/diffusers_tests/requirements.txt tools/diffusers_tests/setup-env.sh
	tools/diffusers_tests/setup-env.sh $(VENV) $(DT_VENV)
	touch $@

.diffusers-tests-var:
	@test -n "$(DIFFUSERS_TESTS)" || { echo "usage: make diffusers-tests DIFFUSERS_TESTS=/path/to/diffusers/tests" >&2; exit 2; }

diffusers-tests: .diffusers-tests-var $(DT_VENV)/.setup-diffusers-tests
	$(DT_VENV)/bin/python -m tools.diffusers_tests $(DIFFUSERS_TESTS) $(DIFFUSERS_TESTS_ARGS)
