#!/usr/bin/env bash
# Sourced by run_train.sh and run_tests.sh: pick the Python to run with, creating .venv if needed.
#   PYTHON=/path/to/python   use that interpreter as is (your own environment; nothing installed)
#   otherwise                 ./.venv, created on first use and refreshed when pyproject.toml changes
# TT_EXTRAS (comma-separated; default dev) names the extras the command needs: run_train.sh
# needs dev, run_tests.sh every extra. One marker, .venv/.installed-<checksum of pyproject.toml>,
# lists the extras installed with that pyproject.toml; a command whose extras are all there
# installs nothing, one that needs more installs the union (extras only grow), so the two
# commands share one .venv without reinstalling each other's (tests/unit/test_ensure_env.py).
# torch: an existing install is kept. A new .venv without a GPU gets torch==2.13.0 (the CPU build
# the CPU notes were measured with); with a GPU (nvidia-smi present), the tested pair
# torch==2.13.0 and torchao==0.18.0, as CUDA builds from TORCH_INDEX_URL when set (choose the
# index for the machine's driver, e.g. https://download.pytorch.org/whl/cu126 for a driver older
# than the default wheel's CUDA needs; docs/gpu.md), else from PyPI (its default CUDA build).
# TORCH_SPEC / TORCHAO_SPEC override the versions, e.g. TORCH_SPEC="torch==2.14.1".

set -euo pipefail
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ -n "${PYTHON:-}" ]]; then
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "config error: PYTHON=$PYTHON is not an interpreter that can be run; unset PYTHON to" \
         "use ./.venv" >&2
    exit 2
  fi
  return 0 2>/dev/null || exit 0
fi

_extras() {  # comma-separated lists -> their union, sorted, comma-separated
  printf '%s\n' "$@" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -
}

_venv="$_root/.venv"
_stamp="$_venv/.installed-$(cksum < "$_root/pyproject.toml" | cut -d' ' -f1)"
_want="$(_extras "${TT_EXTRAS:-dev}")"
_have="$(cat "$_stamp" 2>/dev/null || true)"
if [[ ! -f "$_stamp" || "$(_extras "$_have" "$_want")" != "$_have" ]]; then
  if [[ ! -x "$_venv/bin/python" ]]; then
    _why="first run"
  elif [[ ! -f "$_stamp" ]]; then  # keep what the older pyproject.toml's marker listed
    _why="no marker of this pyproject.toml"
    _have="$(_extras $(cat "$_venv"/.installed-* 2>/dev/null || true))"
  else
    _why="extras $(comm -13 <(tr ',' '\n' <<< "$_have") <(tr ',' '\n' <<< "$_want") \
      | paste -sd, -) not installed yet"
  fi
  _all="$(_extras "$_have" "$_want")"
  echo "[ensure_env] preparing $_venv ($_why; extras $_all) ..." >&2
  [[ -x "$_venv/bin/python" ]] || python3 -m venv "$_venv"
  "$_venv/bin/python" -m pip install -q --upgrade pip >&2
  if ! "$_venv/bin/python" -c "import torch" 2>/dev/null; then
    _specs=("${TORCH_SPEC:-torch==2.13.0}")
    command -v nvidia-smi >/dev/null 2>&1 && _specs+=("${TORCHAO_SPEC:-torchao==0.18.0}")
    "$_venv/bin/python" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
      "${_specs[@]}" >&2
  fi
  "$_venv/bin/python" -m pip install -q -e "$_root[$_all]" >&2
  rm -f "$_venv"/.installed-*
  echo "$_all" > "$_stamp"
fi
PYTHON="$_venv/bin/python"
