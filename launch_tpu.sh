#!/usr/bin/env bash
# Launches a spec_decode eval run on a Cloud TPU VM (single host or pod).
#
# Creates the TPU VM (or reuses it when it exists), copies this checkout to
# every worker (or clones a git repository there), installs the package and
# runs `spec-decode eval` with the given gin file on all workers at once
# (`gcloud compute tpus tpu-vm ssh --worker=I`, one per worker, in parallel).
# Every worker runs the same program; on a slice of several hosts each gets
# the coordinator settings `spec_decode.parallel.multihost.initialize()`
# reads: JAX_COORDINATOR_ADDRESS (worker 0's internal IP, port 8476),
# JAX_NUM_PROCESSES and its own JAX_PROCESS_ID. NUM_PARTITIONS (the mesh's
# model axis, from the config file) is passed as --gin.NUM_PARTITIONS.
#
# Examples:
#   ./launch_tpu.sh --config configs/tpu/v4-8.env \
#       --gin_file configs/table2_ende_small_t0.gin --gin 'GAMMA=7'
#   ./launch_tpu.sh --name my-tpu --zone us-central2-b \
#       --accelerator-type v4-8 --version tpu-ubuntu2204-base \
#       --gin_file configs/table2_ende_base_t0.gin --dry-run
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch_tpu.sh [options] [-- extra spec-decode eval arguments]

Where (flags override the values of a --config file):
  --config FILE            env file setting TPU_NAME, ZONE, ACCELERATOR_TYPE,
                           RUNTIME_VERSION and optionally PROJECT, GIN_FILE,
                           EXTRAS, REPO, BRANCH, SPOT, NUM_PARTITIONS,
                           NUM_WORKERS (see configs/tpu/*.env)
  --name NAME              TPU VM name (default: spec-decode)
  --zone ZONE              zone (default: us-central2-b)
  --accelerator-type TYPE  e.g. v4-8, v4-32, v5litepod-16 (default: v4-8)
  --version VERSION        TPU VM runtime (default: tpu-ubuntu2204-base)
  --project PROJECT        Google Cloud project (default: gcloud's)
  --spot                   create a Spot TPU VM
  --num-workers N          hosts of the slice (default: 1)
  --num-partitions M       the mesh's model axis (--gin.NUM_PARTITIONS)
What:
  --gin_file FILE          gin file for spec-decode eval (required)
  --gin NAME=VALUE         gin binding, passed as --gin.NAME=VALUE
                           (repeatable)
How:
  --repo URL               git clone URL on the workers instead of copying
                           this checkout (with --branch BRANCH)
  --branch BRANCH          branch or tag to clone (default: main)
  --extras EXTRAS          pip extras to install (default: all)
  --skip-create            assume the TPU VM exists
  --skip-install           reuse the code and install already on the VM
  --delete-after           delete the TPU VM when the run ends
  --dry-run                print every command instead of running it
  -h, --help               this message
EOF
}

die() {
  echo "launch_tpu.sh: $*" >&2
  exit 2
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Defaults, then a --config file, then flags.
TPU_NAME="spec-decode"
ZONE="us-central2-b"
ACCELERATOR_TYPE="v4-8"
RUNTIME_VERSION="tpu-ubuntu2204-base"
PROJECT=""
GIN_FILE=""
EXTRAS="all"
REPO=""
BRANCH="main"
SPOT=0
NUM_WORKERS=1
NUM_PARTITIONS=""
COORDINATOR_PORT=8476

CONFIG=""
DRY_RUN=0
SKIP_CREATE=0
SKIP_INSTALL=0
DELETE_AFTER=0
declare -A FLAG=()
GIN_BINDINGS=()
EXTRA_ARGS=()

need_value() {
  [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --config) need_value "$@"; CONFIG="$2"; shift 2 ;;
    --name) need_value "$@"; FLAG[TPU_NAME]="$2"; shift 2 ;;
    --zone) need_value "$@"; FLAG[ZONE]="$2"; shift 2 ;;
    --accelerator-type | --accelerator_type)
      need_value "$@"; FLAG[ACCELERATOR_TYPE]="$2"; shift 2 ;;
    --version | --runtime-version)
      need_value "$@"; FLAG[RUNTIME_VERSION]="$2"; shift 2 ;;
    --project) need_value "$@"; FLAG[PROJECT]="$2"; shift 2 ;;
    --spot) FLAG[SPOT]=1; shift ;;
    --num-workers | --num_workers)
      need_value "$@"; FLAG[NUM_WORKERS]="$2"; shift 2 ;;
    --num-partitions | --num_partitions)
      need_value "$@"; FLAG[NUM_PARTITIONS]="$2"; shift 2 ;;
    --gin_file | --gin-file) need_value "$@"; FLAG[GIN_FILE]="$2"; shift 2 ;;
    --gin_file=* | --gin-file=*) FLAG[GIN_FILE]="${1#*=}"; shift ;;
    --gin) need_value "$@"; GIN_BINDINGS+=("$2"); shift 2 ;;
    --gin.*) GIN_BINDINGS+=("${1#--gin.}"); shift ;;
    --repo) need_value "$@"; FLAG[REPO]="$2"; shift 2 ;;
    --branch) need_value "$@"; FLAG[BRANCH]="$2"; shift 2 ;;
    --extras) need_value "$@"; FLAG[EXTRAS]="$2"; shift 2 ;;
    --skip-create) SKIP_CREATE=1; shift ;;
    --skip-install) SKIP_INSTALL=1; shift ;;
    --delete-after) DELETE_AFTER=1; shift ;;
    --dry-run | --dry_run) DRY_RUN=1; shift ;;
    --)
      shift
      EXTRA_ARGS=("$@")
      break
      ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

if [[ -n "$CONFIG" ]]; then
  [[ -f "$CONFIG" ]] || die "config file not found: $CONFIG"
  # shellcheck source=/dev/null
  source "$CONFIG"
fi
for key in "${!FLAG[@]}"; do
  printf -v "$key" '%s' "${FLAG[$key]}"
done

[[ -n "$GIN_FILE" ]] || die "--gin_file is required (see --help)"
[[ "$NUM_WORKERS" =~ ^[1-9][0-9]*$ ]] ||
  die "NUM_WORKERS must be a positive integer, got '$NUM_WORKERS'"
[[ -z "$NUM_PARTITIONS" || "$NUM_PARTITIONS" =~ ^[1-9][0-9]*$ ]] ||
  die "NUM_PARTITIONS must be a positive integer, got '$NUM_PARTITIONS'"
for binding in "${GIN_BINDINGS[@]+"${GIN_BINDINGS[@]}"}"; do
  [[ "$binding" == *=* ]] || die "--gin expects NAME=VALUE, got '$binding'"
done

GCLOUD_SCOPE=(--zone "$ZONE")
if [[ -n "$PROJECT" ]]; then
  GCLOUD_SCOPE+=(--project "$PROJECT")
fi
REMOTE_DIR="spec_decode"
TARBALL="${TMPDIR:-/tmp}/spec_decode-${TPU_NAME}.tar.gz"
JAX_VERSION="$(sed -n "s/.*'jax==\([0-9.]*\)'.*/\1/p" "$ROOT/setup.py")"
[[ -n "$JAX_VERSION" ]] || die "no jax==VERSION pin found in setup.py"

# One word, single-quoted unless it needs no quoting.
shq() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Joins arguments into one shell-quoted command line.
quote() {
  local word out=""
  for word in "$@"; do
    out+="${out:+ }$(shq "$word")"
  done
  printf '%s' "$out"
}

# Prints a command (shell-quoted), then runs it unless --dry-run.
run() {
  printf '+ %s\n' "$(quote "$@")"
  if [[ "$DRY_RUN" -eq 0 ]]; then
    "$@"
  fi
}

# Runs a shell command line on every worker.
on_all_workers() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_SCOPE[@]}" \
    --worker=all --command "$1"
}

tpu_exists() {
  gcloud compute tpus tpu-vm describe "$TPU_NAME" "${GCLOUD_SCOPE[@]}" \
    --format='value(state)' >/dev/null 2>&1
}

create_tpu() {
  local create=(gcloud compute tpus tpu-vm create "$TPU_NAME"
    "${GCLOUD_SCOPE[@]}" --accelerator-type "$ACCELERATOR_TYPE"
    --version "$RUNTIME_VERSION")
  if [[ "$SPOT" == 1 ]]; then
    create+=(--spot)
  fi
  if [[ "$DRY_RUN" -eq 1 ]]; then
    echo "# create unless it exists (checked with: gcloud compute tpus" \
      "tpu-vm describe $TPU_NAME)"
    run "${create[@]}"
  elif tpu_exists; then
    echo "# reusing TPU VM $TPU_NAME in $ZONE"
  else
    run "${create[@]}"
  fi
}

copy_code() {
  if [[ -n "$REPO" ]]; then
    on_all_workers "rm -rf $(quote "$REMOTE_DIR") && git clone --depth 1 \
--branch $(quote "$BRANCH") $(quote "$REPO") $(quote "$REMOTE_DIR")"
    return
  fi
  # The checkout's tracked and untracked-but-not-ignored files.
  echo "+ git -C $(quote "$ROOT") ls-files -z --cached --others" \
    "--exclude-standard | tar -czf $(quote "$TARBALL") -C $(quote "$ROOT")" \
    "--null -T -"
  if [[ "$DRY_RUN" -eq 0 ]]; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
      tar -czf "$TARBALL" -C "$ROOT" --null -T -
  fi
  run gcloud compute tpus tpu-vm scp "$TARBALL" "$TPU_NAME:spec_decode.tar.gz" \
    "${GCLOUD_SCOPE[@]}" --worker=all
  on_all_workers "rm -rf $(quote "$REMOTE_DIR") && mkdir -p \
$(quote "$REMOTE_DIR") && tar -xzf spec_decode.tar.gz -C $(quote "$REMOTE_DIR")"
}

install() {
  on_all_workers "cd $(quote "$REMOTE_DIR") && python3 -m pip install \
--user --upgrade pip && python3 -m pip install --user -e $(quote ".[$EXTRAS]") \
$(quote "jax[tpu]==$JAX_VERSION")"
}

run_eval() {
  local eval_cmd=(spec-decode eval "--gin_file=$GIN_FILE")
  local binding has_partitions=0
  for binding in "${GIN_BINDINGS[@]+"${GIN_BINDINGS[@]}"}"; do
    eval_cmd+=("--gin.$binding")
    [[ "$binding" == NUM_PARTITIONS=* ]] && has_partitions=1
  done
  if [[ -n "$NUM_PARTITIONS" && "$has_partitions" -eq 0 ]]; then
    eval_cmd+=("--gin.NUM_PARTITIONS=$NUM_PARTITIONS")
  fi
  eval_cmd+=("${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}")
  local prefix="cd $(quote "$REMOTE_DIR") && export PATH=\"\$HOME/.local/\
bin:\$PATH\""
  if [[ "$NUM_WORKERS" -eq 1 ]]; then
    run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_SCOPE[@]}" \
      --worker=0 --command "$prefix && $(quote "${eval_cmd[@]}")"
    return
  fi
  # Worker 0's internal IP is the coordinator's address.
  local describe=(gcloud compute tpus tpu-vm describe "$TPU_NAME"
    "${GCLOUD_SCOPE[@]}" --format='value(networkEndpoints[0].ipAddress)')
  local ip='$COORDINATOR_IP'
  printf '+ COORDINATOR_IP=$(%s)\n' "$(quote "${describe[@]}")"
  if [[ "$DRY_RUN" -eq 0 ]]; then
    ip="$("${describe[@]}")"
    [[ -n "$ip" ]] || die "no internal IP for worker 0 of $TPU_NAME"
  fi
  local worker pid pids=() status=0
  for ((worker = 0; worker < NUM_WORKERS; worker++)); do
    local env="JAX_COORDINATOR_ADDRESS=$ip:$COORDINATOR_PORT \
JAX_NUM_PROCESSES=$NUM_WORKERS JAX_PROCESS_ID=$worker"
    local cmd=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_SCOPE[@]}"
      --worker="$worker" --command "$prefix $env && $(quote "${eval_cmd[@]}")")
    if [[ "$DRY_RUN" -eq 1 ]]; then
      run "${cmd[@]}"
    else
      # All workers at once: each waits for the others at start-up.
      run "${cmd[@]}" &
      pids+=("$!")
    fi
  done
  for pid in "${pids[@]+"${pids[@]}"}"; do
    wait "$pid" || status=$?
  done
  return "$status"
}

delete_tpu() {
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${GCLOUD_SCOPE[@]}" \
    --quiet
}

echo "# TPU VM $TPU_NAME: $ACCELERATOR_TYPE ($RUNTIME_VERSION) in $ZONE"
if [[ "$SKIP_CREATE" -eq 0 ]]; then
  create_tpu
fi
if [[ "$SKIP_INSTALL" -eq 0 ]]; then
  copy_code
  install
fi
status=0
run_eval || status=$?
if [[ "$DELETE_AFTER" -eq 1 ]]; then
  delete_tpu
fi
exit "$status"
