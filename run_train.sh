#!/usr/bin/env bash
# Train with torchrun. Every argument is passed on as a config override (--section.key=value).
#
# It runs from any directory: relative paths, given here (CONFIG_FILE, PYTHON, path overrides)
# or inside a TOML, mean paths from where you stand (scripts/user_paths.sh,
# torchtitan_like/config/paths.py); `extends` names files relative to the TOML.
#
#   NPROC (alias NGPU)  processes on this node; default: the number of GPUs, or 1 without one
#   CONFIG_FILE         TOML config; default train_configs/debug_model.toml of the checkout
#   LOG_RANK            ranks whose output is shown (comma-separated); default 0
#   MAX_RESTARTS        restarts of the whole job after a failure a restart can cure; default 0
#   PYTHON              interpreter to use (default: ./.venv, created on first run)
#
# Multi-node: run the same command on every node with torchrun's rendezvous set, e.g.
#   NNODES=4 NODE_RANK=<0..3> RDZV_ENDPOINT=<host of node 0>:29500 ./run_train.sh
# (see scripts/multinode.slurm).

set -euo pipefail
source "$(dirname "$0")/scripts/user_paths.sh"
user_args "$@"
[[ -z "${CONFIG_FILE:-}" ]] || CONFIG_FILE="$(user_path "$CONFIG_FILE")"
[[ "${PYTHON:-}" != */* ]] || PYTHON="$(user_path "$PYTHON")"
cd "$(dirname "$0")"
source scripts/ensure_env.sh
# No silent CPU fallback: GPUs listed but unusable by this torch stop here with one line.
if command -v nvidia-smi >/dev/null 2>&1; then "$PYTHON" -m torchtitan_like.distributed.gpu_check; fi

if [[ -z "${NPROC:-${NGPU:-}}" ]]; then
  NPROC=$(nvidia-smi -L 2>/dev/null | wc -l || true)
  [[ "${NPROC:-0}" -gt 0 ]] || NPROC=1
  export NPROC
fi
CONFIG_FILE="${CONFIG_FILE:-$PWD/train_configs/debug_model.toml}"  # of the checkout

# Check the job in one process first: a bad config, dataset or launcher variable (NPROC,
# NNODES, NODE_RANK, RDZV_ENDPOINT, MAX_RESTARTS, LOG_RANK: torchtitan_like/config/
# launcher_env.py) is one line and exit code 2 (a dump folder a running job holds: 6), before
# torchrun starts and before this script computes with them; --help and --print_config are
# answered there too.
preflight=("$PYTHON" -m torchtitan_like.preflight --job.config_file "$CONFIG_FILE" "${USER_ARGS[@]}")
for arg in "$@"; do
  case "$arg" in -h|--help|--print_config) exec "${preflight[@]}" ;; esac
done
"${preflight[@]}" || exit $?

NPROC="${NPROC:-$NGPU}"
LOG_RANK="${LOG_RANK:-0}"
NNODES="${NNODES:-1}"
rdzv=(--standalone)
if [[ "$NNODES" -gt 1 ]]; then
  rdzv=(--nnodes="$NNODES" --node_rank="$NODE_RANK" --rdzv_backend=c10d
        --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="${RDZV_ID:-torchtitan_like}")
fi

export TORCHAO_FORCE_SKIP_LOADING_SO_FILES="${TORCHAO_FORCE_SKIP_LOADING_SO_FILES:-1}"
# On one node the workers meet in the agent's rendezvous store, bound before they start (no
# port picked free and taken by another job first). On several nodes each agent counts its own
# restarts (the counts can differ), so restarted workers could not agree on a fresh namespace
# of the shared store: torch's store of rank 0 per attempt instead (docs/operating-a-run.md).
if [[ "$NNODES" -gt 1 ]]; then
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
fi

# torchrun, ending like a job: the first failing rank's line and exit code (2 config, 3 diverged,
# 4 checkpoint, 5 data, 6 dump folder in use), no restart of a failure that would repeat
# (torchtitan_like/launch.py, docs/operating-a-run.md).
exec "$PYTHON" -m torchtitan_like.launch "${rdzv[@]}" --nproc_per_node="$NPROC" \
  --max-restarts="${MAX_RESTARTS:-0}" --local-ranks-filter="$LOG_RANK" --role=rank --tee=3 \
  -m torchtitan_like.train --job.config_file "$CONFIG_FILE" "${USER_ARGS[@]}"
