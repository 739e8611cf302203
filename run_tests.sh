#!/usr/bin/env bash
# Run the whole test suite (unit, multi-process parity on CPU/gloo, end-to-end).
# Creates ./.venv on first use (see scripts/ensure_env.sh); extra arguments go to pytest.
set -euo pipefail
# The tests run on the CPU (gloo) even on a GPU machine: several test processes cannot share one
# GPU, and the parity bounds are derived for fp32 CPU kernels (tests/conftest.py hides them too).
export CUDA_VISIBLE_DEVICES=""
cd "$(dirname "$0")"
TT_EXTRAS="${TT_EXTRAS:-dev,hf,parquet,plot,wandb,mlflow,ft}" source scripts/ensure_env.sh
"$PYTHON" -m ruff check .
exec "$PYTHON" -m pytest -q "$@"
