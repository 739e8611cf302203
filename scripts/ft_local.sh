#!/usr/bin/env bash
# Fault-tolerant training on one machine, for trials (docs/fault-tolerance.md): a torchft
# lighthouse and FT_GROUPS replica groups, each its own run_train.sh (torchrun) job of NPROC
# processes. Arguments are config overrides for every group.
#
#   FT_GROUPS=2 NPROC=2 scripts/ft_local.sh --training.steps=200 --checkpoint.enable=true
#
#   FT_GROUPS        replica groups; default 2
#   NPROC            processes per group; default 1
#   LIGHTHOUSE_PORT  the lighthouse's port on 127.0.0.1; default 29510
#   FT_RESTARTS      how often a group that failed (e.g. killed: kill its run_train.sh) is
#                    started again; it then heals from a live group. Default 3
#   FT_LOGS          folder of the logs (lighthouse.log, group<i>.log); default ./outputs/ft_logs
#
# A group ending with a failure that would repeat (exit codes 2-6: config, diverged, checkpoint,
# data, dump folder in use) is not started again. Ends with the first group's exit code.
set -euo pipefail  # (ensure_env.sh sets it too): failures are caught with || below
source "$(dirname "$0")/user_paths.sh"
user_args "$@"
logs="$(user_path "${FT_LOGS:-outputs/ft_logs}")"
cd "$(dirname "$0")/.."
TT_EXTRAS="${TT_EXTRAS:-dev,ft}" source scripts/ensure_env.sh
lighthouse="$(dirname "$PYTHON")/torchft_lighthouse"
if [[ ! -x "$lighthouse" ]]; then
  echo "scripts/ft_local.sh: torchft is not installed in $PYTHON's environment: pip install -e '.[ft]'" >&2
  exit 2
fi
groups="${FT_GROUPS:-2}"
port="${LIGHTHOUSE_PORT:-29510}"
mkdir -p "$logs"

"$lighthouse" --min_replicas 1 --bind "127.0.0.1:$port" > "$logs/lighthouse.log" 2>&1 &
lighthouse_pid=$!
trap 'kill "$lighthouse_pid" 2>/dev/null' EXIT
export TORCHFT_LIGHTHOUSE="http://127.0.0.1:$port" NPROC="${NPROC:-1}" PYTHON

run_group() {  # replica id; restarts a group that failed, with --job.overwrite (its folder's
  local id=$1 tries=0 code again=()  # earlier outputs are archived unless it resumes)
  while true; do
    code=0
    ./run_train.sh --fault_tolerance.enable=true --fault_tolerance.replica_id="$id" \
      --fault_tolerance.group_size="$groups" --fault_tolerance.manager_hostname=localhost \
      "${USER_ARGS[@]}" "${again[@]}" || code=$?
    if [[ $code -eq 0 || ( $code -ge 2 && $code -le 6 ) || $tries -ge ${FT_RESTARTS:-3} ]]; then
      return "$code"
    fi
    tries=$((tries + 1)) again=(--job.overwrite=true)
    echo "ft_local.sh: group $id ended with exit $code; starting it again ($tries)" >&2
  done
}

pids=()
for ((i = 0; i < groups; i++)); do
  run_group "$i" > "$logs/group$i.log" 2>&1 &
  pids+=($!)
  echo "replica group $i: pid $!, log $logs/group$i.log"
done
first=0
for i in "${!pids[@]}"; do
  code=0
  wait "${pids[$i]}" || code=$?
  [[ $i -eq 0 ]] && first=$code
  echo "replica group $i ended with exit $code"
done
exit "$first"
