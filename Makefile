# The README's commands. Everything runs inside .venv (created on demand).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# seqio (with TensorFlow, ~2.5 GB) runs the seqio-task tests; EXTRAS=test,hf,metrics
# leaves it out (seqio tasks then cannot be used; tests/data/test_seqio.py skips).
EXTRAS ?= test,hf,metrics,seqio
# A new setup.py or another EXTRAS reinstalls.
STAMP := $(VENV)/.installed-$(shell (cat setup.py; echo '$(EXTRAS)') | cksum | cut -d' ' -f1)

export JAX_PLATFORMS ?= cpu

.PHONY: install test test-slow demo demo-random bench lint format clean

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	$(PY) -m spec_decode.main build-kernel || echo "small-M CPU kernel not built: dense layers use jnp.dot"
	rm -f $(VENV)/.installed-*
	touch $@

# `multiprocess` tests start several spec-decode processes (partitioned and
# multi-process eval runs, minutes on two cores); `slow` tests are the
# heavier variants of properties that `make test` checks in a fast variant
# (other samplers, measured costs, the end-to-end CLI run). `make test`
# leaves both out; `make test-slow` runs exactly them. `make test` spreads
# the test files over up to TEST_WORKERS processes (pytest-xdist, one file
# per process at a time: a file's compiled models stay shared); the suite
# is mostly single-threaded XLA compiling, so 2 cores take about half the
# time of one process. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 4
test: install
	$(PY) -m pytest -q -m "not multiprocess and not slow" \
	  $(if $(filter 0,$(TEST_WORKERS)),,-n auto --maxprocesses=$(TEST_WORKERS) --dist loadfile) tests

test-slow: install
	$(PY) -m pytest -q -m "slow or multiprocess" tests

# The default eval run: the committed demo pair on the offline Debian EnDe
# task (the data is built from apt's translation lists on first use).
DATA_DIR ?= data/debian
demo: install
	test -f $(DATA_DIR)/manifest.json || $(PY) -m spec_decode.main data build --out_dir $(DATA_DIR) --fetch
	$(PY) -m spec_decode.main eval

# Mechanics only, on random tiny models (no data, no checkpoints).
demo-random: install
	$(PY) -m spec_decode.main demo

bench: install
	$(PY) -m spec_decode.main bench --out bench.json
	$(PY) -m spec_decode.main bench load --out load_bench.json
	$(PY) -m spec_decode.main bench draft_dtype --out bench_draft_dtype.json
	$(PY) -m spec_decode.main bench trees --out bench_trees.json
	$(PY) -m spec_decode.main bench memory --out bench_memory.json
	$(PY) -m spec_decode.main bench beam --out bench_beam.json

lint: install
	$(VENV)/bin/ruff check spec_decode tests
	$(VENV)/bin/ruff format --check spec_decode tests

format: install
	$(VENV)/bin/ruff format spec_decode tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
