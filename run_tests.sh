#!/usr/bin/env bash
# Run the whole test suite (unit, multi-process parity on CPU/gloo, end-to-end).
# Creates ./.venv on first use (see scripts/ensure_env.sh). With no argument the suite runs in
# two lanes at once (below); any argument runs one pytest with it (a file, -k, -rP ...;
# `./run_tests.sh tests` is the whole suite in one lane).
set -euo pipefail
# The tests run on the CPU (gloo) even on a GPU machine: several test processes cannot share one
# GPU, and the parity bounds are derived for fp32 CPU kernels (tests/conftest.py hides them too).
export CUDA_VISIBLE_DEVICES=""
cd "$(dirname "$0")"
TT_EXTRAS="${TT_EXTRAS:-dev,hf,parquet,plot,wandb,mlflow,ft}" source scripts/ensure_env.sh
"$PYTHON" -m ruff check .
[[ $# -eq 0 ]] || exec "$PYTHON" -m pytest -q "$@"

# Two lanes (docs/testing.md, "Two lanes"): tests/e2e, whose launches spend most of their time
# starting and stopping processes (one core busy or none), beside the rest of tests/ (unit and
# parallel: in-process work and ranks that compute; a new folder joins this lane), one launch
# at a time in each lane. The e2e lane runs in a process group
# of its own (job control on), so an interrupt reaches it through the trap, and its output is
# printed when it ends.
log="$(mktemp -t ttl-e2e-lane.XXXXXX)"
set -m
"$PYTHON" -m pytest -q -p no:cacheprovider tests/e2e >"$log" 2>&1 &
e2e=$!
set +m
trap 'kill -INT -- "-$e2e" 2>/dev/null || true; wait "$e2e" 2>/dev/null || true; exit 130' INT TERM
echo "[run_tests] tests/e2e runs beside the rest of tests/; its output: $log"
start=$SECONDS
rest=0 && "$PYTHON" -m pytest -q tests --ignore=tests/e2e || rest=$?
e2e_rc=0 && wait "$e2e" || e2e_rc=$?
trap - INT TERM
echo "===== tests/e2e (the lane beside) ====="
cat "$log" && rm -f "$log"
echo "[run_tests] tests/ but e2e: exit $rest; tests/e2e: exit $e2e_rc;" \
     "$((SECONDS - start)) s for both lanes"
[[ $rest -eq 0 && $e2e_rc -eq 0 ]]
