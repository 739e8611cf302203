#!/usr/bin/env bash
# Sourced by run_train.sh and run_tests.sh: pick the Python to run with, creating .venv if needed.
#   PYTHON=/path/to/python   use that interpreter as is (your own environment; nothing installed)
#   otherwise                 ./.venv, created on first use and refreshed when pyproject.toml changes
# torch: an existing install is kept. A new .venv without a GPU gets torch==2.13.0 (the CPU build
# the CPU notes were measured with); with a GPU (nvidia-smi present), the tested pair
# torch==2.13.0 and torchao==0.18.0, as CUDA builds from TORCH_INDEX_URL when set (choose the
# index for the machine's driver, e.g. https://download.pytorch.org/whl/cu126 for a driver older
# than the default wheel's CUDA needs; docs/gpu.md), else from PyPI (its default CUDA build).
# TORCH_SPEC / TORCHAO_SPEC override the versions, e.g. TORCH_SPEC="torch==2.14.1".

set -euo pipefail
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ -n "${PYTHON:-}" ]]; then
  return 0 2>/dev/null || exit 0
fi

_venv="$_root/.venv"
_stamp="$_venv/.installed-$(cksum < "$_root/pyproject.toml" | cut -d' ' -f1)-${TT_EXTRAS:-dev}"
if [[ ! -f "$_stamp" ]]; then
  echo "[ensure_env] preparing $_venv (first run, or pyproject.toml changed) ..." >&2
  [[ -x "$_venv/bin/python" ]] || python3 -m venv "$_venv"
  "$_venv/bin/python" -m pip install -q --upgrade pip >&2
  if ! "$_venv/bin/python" -c "import torch" 2>/dev/null; then
    _specs=("${TORCH_SPEC:-torch==2.13.0}")
    command -v nvidia-smi >/dev/null 2>&1 && _specs+=("${TORCHAO_SPEC:-torchao==0.18.0}")
    "$_venv/bin/python" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
      "${_specs[@]}" >&2
  fi
  "$_venv/bin/python" -m pip install -q -e "$_root[${TT_EXTRAS:-dev}]" >&2
  rm -f "$_venv"/.installed-*
  touch "$_stamp"
fi
PYTHON="$_venv/bin/python"
