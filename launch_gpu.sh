#!/usr/bin/env bash
# The two GPU jobs, one command each, at most 9 minutes each (a lent GPU
# gives 15 minutes in all, start-up included; docs/accelerator.md).
#
#   bash launch_gpu.sh accel   the accelerator bench, then the accel tests
#                              (carry .whl: `make accel-wheels` here)
#   bash launch_gpu.sh train   the demo pair trained (carry .whl and .gpu:
#                              `make train-gpu-pack` here)
#
# Run from the repository root with OUT set (the device tool's $OUT). Every
# result is written under $OUT as it is measured. The exit status is the
# first failing step's. Settings (environment):
#   PY        the Python (default python3)
#   PLATFORM  JAX_PLATFORMS (default cuda; cpu for the rehearsal)
#   FLAGS     extra flags of the job (--tiny for the rehearsal)
#   BUDGET    seconds of the bench or of training (default 360 / 540; the
#             job ends within it, the kill at +45 s only catches a hang)
#   TESTS     the accel test files (default: every file with accel tests)
#   TEST_S    seconds for the accel tests (default 120)
#   PACK      the training data pack (default .gpu/demo_train.tar.xz)
# CPU rehearsals (`make test` runs both: tests/test_launch_gpu.py and
# tests/train/test_pair_job.py):
#   OUT=/tmp/o PY=.venv/bin/python PLATFORM=cpu FLAGS=--tiny \
#     bash launch_gpu.sh accel
#   OUT=/tmp/o PY=.venv/bin/python PLATFORM=cpu FLAGS=--tiny BUDGET=180 \
#     bash launch_gpu.sh train
set -uo pipefail

job=${1:-}
if [[ "$job" != accel && "$job" != train ]]; then
  echo "usage: OUT=<dir> bash launch_gpu.sh accel|train" >&2
  exit 2
fi
if [[ -z "${OUT:-}" ]]; then
  echo "launch_gpu.sh: set OUT=<directory> (the device tool's \$OUT)" >&2
  exit 2
fi
PY=${PY:-python3}
PLATFORM=${PLATFORM:-cuda,cpu}
FLAGS=${FLAGS:-}
mkdir -p "$OUT"
t_start=$(date +%s)
say() { echo "launch_gpu [$(( $(date +%s) - t_start )) s] $*"; }

# What the device image lacks travels as wheels; name a missing carry
# before anything imports.
if ! "$PY" -c 'from gin import config_parser' 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "launch_gpu.sh: gin-config is not installed and .whl/ holds no" \
      "wheels: run 'make accel-wheels' here and carry [\".whl\"]" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
PACK=${PACK:-.gpu/demo_train.tar.xz}
if [[ "$job" == train && ! -f "$PACK" ]]; then
  echo "launch_gpu.sh: $PACK is missing: run 'make train-gpu-pack'" \
    "here and carry [\".whl\", \".gpu\"]" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=$PLATFORM SPEC_DECODE_KERNEL=0
say "$job on $PLATFORM: $("$PY" -c 'import sys, jax; print(sys.version.split()[0], "jax", jax.__version__)')"

if [[ "$job" == train ]]; then
  BUDGET=${BUDGET:-540}
  timeout $(( BUDGET + 45 )) "$PY" -m spec_decode.main train pair \
    --pack "$PACK" --out_dir "$OUT" --budget_s "$BUDGET" $FLAGS
  rc=$?
  say "train exit status $rc"
  exit $rc
fi

BUDGET=${BUDGET:-360}
TEST_S=${TEST_S:-120}
TESTS=${TESTS:-tests/parallel/test_one_device_mesh.py tests/chain/test_loops.py tests/tree/test_loop.py tests/beam/test_speculative.py tests/chain/test_distribution.py}
# The bench writes $OUT/accel/accel.{json,md} after every measurement; the
# kill margin covers the process's start and its last item's overrun.
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout $(( BUDGET + 45 )) \
  "$PY" -m spec_decode.main bench accel --out_dir "$OUT/accel" \
  --budget "$BUDGET" $FLAGS 2>&1 | tee "$OUT/accel.log"
bench_rc=${PIPESTATUS[0]}
say "bench exit status $bench_rc"
if (( bench_rc == 3 )); then
  # The smoke step failed: nothing else can work; keep the device time for
  # a fixed retry.
  say "smoke step failed: tests not run (see $OUT/accel.log)"
  exit 3
fi
# The accel tests: listed files (no collection of the whole suite), the
# kernel off, float32 products where the tests mean float32, each test
# timed out on its own, verbose so the log names each result.
JAX_DEFAULT_MATMUL_PRECISION=float32 timeout "$TEST_S" \
  "$PY" -m pytest -v -p no:cacheprovider -m accel --timeout=60 \
  -o addopts="" $TESTS 2>&1 | tee "$OUT/accel_tests.log"
test_rc=${PIPESTATUS[0]}
say "tests exit status $test_rc"
if (( bench_rc != 0 )); then exit "$bench_rc"; fi
exit "$test_rc"
