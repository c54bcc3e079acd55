# The README's commands. Everything runs inside .venv (created on demand).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# `make demo` installs the library and the metric it reports (DEMO_EXTRAS: no
# TensorFlow, no torch). `make test` and CI install EXTRAS: the test tools,
# Hugging Face (torch) and seqio (with TensorFlow, ~2.5 GB: the seqio-task
# tests; EXTRAS=test,hf,metrics leaves it out, and tests/data/test_seqio.py
# skips). README "Install" gives both installs' size and time.
DEMO_EXTRAS ?= metrics
EXTRAS ?= test,hf,metrics,seqio
# A new setup.py or other extras reinstall.
stamp = $(VENV)/.installed-$(shell (cat setup.py; echo '$(1)') | cksum | cut -d' ' -f1)
STAMP := $(call stamp,$(EXTRAS))
DEMO_STAMP := $(call stamp,$(DEMO_EXTRAS))

export JAX_PLATFORMS ?= cpu

.PHONY: install install-demo test test-slow test-accel demo demo-random figure notebooks bench accel-tiny accel-wheels accel-gpu train-gpu-pack train-gpu train-gpu-unpack lint format clean

install: $(STAMP)
install-demo: $(DEMO_STAMP)

# pip_install(extras): a venv with the package (editable) and those extras.
define pip_install
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "spec_decode needs Python >= 3.11 (its pinned JAX does), e.g. make $(or $(MAKECMDGOALS),install) PYTHON=python3.12"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(1)]'
	$(PY) -m spec_decode.main build-kernel || echo "small-M CPU kernel not built: dense layers use jnp.dot"
endef

$(STAMP): setup.py
	$(call pip_install,$(EXTRAS))
	rm -f $(VENV)/.installed-*
	touch $@ $(DEMO_STAMP)

# The full install holds the demo's; a demo install leaves the full stamp.
$(DEMO_STAMP): setup.py
	$(call pip_install,$(DEMO_EXTRAS))
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

# The default eval run: the committed demo pair on the first 50 examples of
# the Debian EnDe test split, which ship in data/demo (no root, no apt).
DEMO_OUT := eval_results/demo_debian_ende
# The whole Debian data (`spec-decode data build --out_dir $(DATA_DIR) --fetch`,
# root and apt): training and longer runs (--gin.DATA_DIR=None reads it).
DATA_DIR ?= data/debian
demo: install-demo
	$(PY) -m spec_decode.main eval --output_dir $(DEMO_OUT)
	@echo "Figure 1 for every example: $(DEMO_OUT)/examples.html"

# The README's picture (docs/figure1_demo.png): the top of the demo's
# examples.html in headless Chromium, reduced to 64 colours (after `make demo`).
FIGURE := docs/figure1_demo.png
CHROMIUM ?= chromium
figure:
	$(CHROMIUM) --headless --no-sandbox --disable-gpu --hide-scrollbars \
	  --window-size=960,600 --screenshot=$(CURDIR)/$(FIGURE) \
	  file://$(CURDIR)/$(DEMO_OUT)/examples.html
	$(PY) -c "from PIL import Image; Image.open('$(FIGURE)').convert('RGB').quantize(64).save('$(FIGURE)', optimize=True)"

# The notebooks run top to bottom with their default settings, outputs stored
# (committed, so GitHub shows them; tests/test_notebooks.py runs them again
# with small settings).
notebooks: install
	env $$(env | grep -o '^NB_[A-Z_]*' | sed 's/^/-u /') $(PY) -c "import glob, nbclient, nbformat; \
	  [nbformat.write(nbclient.NotebookClient(nbformat.read(p, 4), timeout=1800, \
	  kernel_name='python3', resources={'metadata': {'path': 'notebooks'}}).execute(), p) \
	  for p in sorted(glob.glob('notebooks/*.ipynb'))]"

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
	$(PY) -m spec_decode.main bench on_target --out bench_on_target.json
	$(PY) -m spec_decode.main bench sum_blocks --out bench_sum_blocks.json
	$(PY) -m spec_decode.main bench infer --out bench_infer.json

# The decoding checks that matter on a new backend (greedy identity of chains,
# trees and beams, a whole-sequence distribution test, a one-device mesh).
test-accel: install
	SPEC_DECODE_KERNEL=0 JAX_DEFAULT_MATMUL_PRECISION=float32 \
	  $(PY) -m pytest -v -m accel tests

# The accelerator bench's CPU rehearsal (toy sizes; `make test` runs it too).
accel-tiny: install
	$(PY) -m spec_decode.main bench accel --tiny --out_dir accel_tiny

# The GPU jobs, prepared here and run there as one script each
# (launch_gpu.sh; docs/accelerator.md). `make accel-wheels` here fetches what
# the GPU image lacks (gin-config) into .whl/; there, with .whl carried,
#   bash launch_gpu.sh accel        (or: make accel-gpu PY=python3 OUT=$$OUT)
# runs the smoke step, `spec-decode bench accel` within ACCEL_BUDGET seconds
# (results in $(OUT)/accel/, rewritten after every measurement) and the
# accel tests, at most 9 minutes in all. Rehearsed on the CPU (make test
# runs it, tests/test_launch_gpu.py) with
#   make accel-gpu PY=.venv/bin/python OUT=/tmp/accel ACCEL_PLATFORM=cpu \
#     ACCEL_FLAGS=--tiny
ACCEL_BUDGET ?= 360
ACCEL_FLAGS ?=
ACCEL_PLATFORM ?= cuda,cpu
ACCEL_WHEELS := gin-config==0.5.0
accel-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation py --abi none --platform any \
	  -d .whl $(ACCEL_WHEELS)
	grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude

accel-gpu:
	OUT=$(OUT) PY=$(PY) PLATFORM=$(ACCEL_PLATFORM) BUDGET=$(ACCEL_BUDGET) \
	  FLAGS='$(ACCEL_FLAGS)' bash launch_gpu.sh accel

# The demo pair trained on a GPU in one go (docs/accelerator.md, "The second
# job"). Here: `make train-gpu-pack` packs the train and validation splits
# into .gpu/demo_train.tar.xz (about 7 MiB) and fetches the gin-config wheel.
# There, with .whl and .gpu carried:
#   bash launch_gpu.sh train        (or: make train-gpu PY=python3 OUT=$$OUT)
# trains the target, then distils the draft, within PAIR_BUDGET seconds,
# writing summary.json, pair.log and models.tar.NN into $(OUT). Back here:
#   make train-gpu-unpack FROM=<folder of the returned files>
# reassembles the models into $(PAIR_TO)/{target,draft}_gpu/model. Rehearsed
# on the CPU with PAIR_PLATFORM=cpu PAIR_FLAGS=--tiny (tests/train/
# test_pair_job.py runs the same job).
PAIR_BUDGET ?= 540
PAIR_FLAGS ?=
PAIR_PLATFORM ?= cuda,cpu
PAIR_TO ?= runs/demo
train-gpu-pack: accel-wheels
	$(PY) -m spec_decode.main data pack --data_dir $(DATA_DIR) --out .gpu/demo_train.tar.xz

train-gpu:
	OUT=$(OUT) PY=$(PY) PLATFORM=$(PAIR_PLATFORM) BUDGET=$(PAIR_BUDGET) \
	  FLAGS='$(PAIR_FLAGS)' bash launch_gpu.sh train

train-gpu-unpack:
	@test -n "$(FROM)" || { echo 'make train-gpu-unpack: set FROM=<directory>'; exit 2; }
	$(PY) -m spec_decode.main train pair-unpack --from_dir $(FROM) --to_dir $(PAIR_TO)

lint: install
	$(VENV)/bin/ruff check spec_decode tests
	$(VENV)/bin/ruff format --check spec_decode tests

format: install
	$(VENV)/bin/ruff format spec_decode tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
