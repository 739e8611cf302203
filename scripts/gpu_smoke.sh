#!/usr/bin/env bash
# Exercise every CUDA path once on this machine, then time the Llama 3.2 1B job (docs/gpu.md).
#
#   scripts/gpu_smoke.sh              logs under SMOKE_DIR (default ./outputs/gpu_smoke)
#   scripts/gpu_smoke.sh --dry-run    the whole control flow on a machine without a GPU: fake
#                                     checks (SMOKE_DRY_FAIL / SMOKE_DRY_TIMEOUT name ones that
#                                     fail / run past their cap), fake throughput figures
#
# Built to fit one short lease (under 8 minutes on one H200, its start included): phase 1 runs
# the independent checks concurrently (small models: they share the GPU), each under its own time
# cap; phase 2 runs the throughput jobs one at a time (scripts/gpu_throughput.py) in what is left
# of SMOKE_BUDGET_S (default 400 s, counted from the script's start). It continues past a failed
# check and always prints every row (ok / FAIL / TIMEOUT / skip, seconds, the check's last line),
# then the throughput table; exit 1 if any check failed or timed out. Every log lands in SMOKE_DIR;
# with SMOKE_ARCHIVE set, the summary, the table and a tar.gz of the logs are copied there (a
# lease's $OUT). SMOKE_ONLY=checks or =throughput runs one phase; SMOKE_THROUGHPUT_JOBS=a,b the
# named throughput jobs only. Python: $PYTHON (else ./.venv),
# the package imported from this checkout (PYTHONPATH), nothing installed.
#
# Checks on one GPU: versions; a baseline run with MFU from the GPU table; bf16 + compile + op
# SAC + float8 tensorwise + profiler + memory snapshot + pinned async checkpoints, then a resume;
# float8 rowwise + compile + full AC (SM 8.9+); each CUDA SDPA backend against the math backend;
# FlexAttention block_causal against dense SDPA, and a compiled block_causal run; the MoE grouped
# GEMMs in low precision (kernel check, a DeepSeek-V3 debug run); bf16 moments, fused (kernel
# check against the foreach step, a run); on Hopper, blockwise FP8 (kernel check, a cold and a
# warm run whose step 1 must be under 30 s, DeepSeek-V3's recipe with fused bf16 moments and
# MTP). More than one GPU adds, on 2 of them: FSDP, TP + float8, async TP, CP, PP.

set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
BUDGET="${SMOKE_BUDGET_S:-400}"
LOGS="${SMOKE_DIR:-./outputs/gpu_smoke}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ $DRY == 1 ]]; then
  PYTHON="${PYTHON:-python3}"
  ngpu=1 capability=9.0 rowwise_why=""
else
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [[ "${ngpu:-0}" -lt 1 ]]; then
    echo "gpu_smoke: no usable GPU on this machine (nvidia-smi lists none); nothing was checked" >&2
    exit 1
  fi
  source scripts/ensure_env.sh
  set +e  # ensure_env.sh sets -e: here a failing check must not end the script
  # GPUs listed that this torch cannot use: say so once; every check then fails fast on its own.
  "$PYTHON" -m torchtitan_like.distributed.gpu_check || echo "gpu_smoke: continuing; each check will fail" >&2
fi
export PYTHON
rm -rf "$LOGS" && mkdir -p "$LOGS"
# Kernel caches of this run (outside the logs): the warm blockwise run reads the cold one's.
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$LOGS/../gpu_smoke_cache/inductor}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$LOGS/../gpu_smoke_cache/triton}"
export TRITON_CACHE_AUTOTUNING=1 TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-4}"
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES="${TORCHAO_FORCE_SKIP_LOADING_SO_FILES:-1}"  # as run_train.sh
ROWS=()  # names in the order the summary shows them

# run_check NAME CAP COMMAND...: the command under a time cap, its output in $LOGS/NAME.log,
# "exit-code seconds" in $LOGS/NAME.rc. In a dry run a fake stands in for the command.
run_check() {
  local name=$1 cap=$2 start=$SECONDS rc=0
  shift 2
  if [[ $DRY == 1 ]]; then
    cap=2
    if [[ " ${SMOKE_DRY_TIMEOUT:-} " == *" $name "* ]]; then set -- sleep 30
    elif [[ " ${SMOKE_DRY_FAIL:-} " == *" $name "* ]]; then set -- bash -c "echo 'fake failure'; exit 1"
    else set -- echo "fake ok (dry run)"; fi
  fi
  if declare -F "$1" >/dev/null; then set -- bash -c '"$@"' _ "$@"; fi  # a function of this script
  timeout -k 10 "$cap" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - start))" >"$LOGS/$name.rc"
}
export -f run_check
export DRY LOGS

# queue NAME CAP COMMAND...: a check of phase 1 in the background; lane "A && B" in one call
# keeps an order where a check reads another's output (queue_lane).
queue() { ROWS+=("$1"); run_check "$@" & }
queue_lane() {  # queue_lane "NAME CAP COMMAND" ...: checks run one after another, in background
  local spec
  for spec in "$@"; do ROWS+=("${spec%% *}"); done
  ( for spec in "$@"; do eval "run_check $spec"; done ) &
}
skip() { ROWS+=("$1"); echo "$2" >"$LOGS/$1.skip"; }

row() {  # the summary line of one check
  local name=$1 status seconds detail rc
  if [[ -f "$LOGS/$name.skip" ]]; then
    printf '%-22s %-7s %7s  %s\n' "$name" skip - "$(cut -c1-90 "$LOGS/$name.skip")"; return
  fi
  if [[ ! -f "$LOGS/$name.rc" ]]; then
    printf '%-22s %-7s %7s  %s\n' "$name" skip - "not reached"; return
  fi
  read -r rc seconds <"$LOGS/$name.rc"
  case $rc in 0) status=ok ;; 124|137) status=TIMEOUT ;; *) status=FAIL ;; esac
  detail=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c1-90)
  [[ $status == TIMEOUT ]] && detail="over its cap; last line: $detail"
  printf '%-22s %-7s %7s  %s\n' "$name" "$status" "$seconds" "$detail"
}

train() {  # train NPROC FOLDER [--first-step-under S] OVERRIDES...: a debug run, then its metrics
  local nproc=$1 folder=$LOGS/$2 extra=()
  shift 2
  if [[ "${1:-}" == --first-step-under ]]; then extra=(--first-step-under "$2"); shift 2; fi
  # shellcheck disable=SC2086  # the common flags are words
  NPROC=$nproc ./run_train.sh --job.dump_folder="$folder" --training.steps=20 \
    --metrics.log_freq=5 --validation.enable=false --metrics.enable_tensorboard=false "$@" &&
    "$PYTHON" scripts/gpu_smoke_checks.py metrics "$folder" "${extra[@]}"
}
exists() { compgen -G "$1" >/dev/null || { echo "missing: $1"; return 1; }; }
full_outputs() {  # the full-stack run's trace, memory snapshot and last checkpoint
  exists "$LOGS/full/profile_traces/iteration_10/rank0_trace.json" &&
    exists "$LOGS/full/memory_snapshot/iteration_10/rank0_memory_snapshot.pickle" &&
    exists "$LOGS/full/checkpoint/step-20/checkpoint.json" && echo "trace, snapshot, step-20 there"
}
resume_log() {  # the resumed run loaded step 20
  grep -m1 'checkpoint: loaded.*(step 20' "$LOGS/resume.log" ||
    { echo "no 'checkpoint: loaded ... (step 20' in $LOGS/resume.log"; return 1; }
}
export -f train exists full_outputs resume_log

if [[ $DRY == 0 ]]; then
  capability=$("$PYTHON" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" \
    2>/dev/null || echo unknown)
  rowwise_why=$("$PYTHON" -c "
import torch; from torchtitan_like.components.float8 import rowwise_unsupported_reason as r
print(r(torch.cuda.get_device_capability()) or '')" 2>/dev/null || true)
fi
FULL="--training.mixed_precision_param=bfloat16 --compile.enable=true
  --activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=op
  --float8.enable=true --float8.recipe_name=tensorwise --profiling.enable_profiling=true
  --profiling.enable_memory_snapshot=true --profiling.profile_freq=10 --checkpoint.enable=true
  --checkpoint.interval=10 --checkpoint.async_mode=async_with_pinned_mem"
FULL=$(echo $FULL)
BLOCKWISE="--training.mixed_precision_param=bfloat16 --float8.enable=true --float8.recipe_name=blockwise"

# --- phase 1: every check at once, each under its cap ---
phase1() {
  ROWS+=(preflight)
  run_check preflight 90 "$PYTHON" -c "
import torch, torchao; assert torch.cuda.is_available(), 'torch sees no GPU'
print(torch.__version__, 'CUDA', torch.version.cuda, torchao.__version__,
      torch.cuda.get_device_name(), 'SM', '%d.%d' % torch.cuda.get_device_capability())"
  queue sdpa-backends 120 "$PYTHON" scripts/gpu_smoke_checks.py sdpa
  queue block-causal-flex 150 "$PYTHON" scripts/gpu_smoke_checks.py block_causal
  queue bf16-moments-kernel 150 "$PYTHON" scripts/gpu_smoke_checks.py bf16_moments
  queue moe-grouped-mm 200 "$PYTHON" scripts/gpu_smoke_checks.py moe_grouped_mm
  queue_lane "baseline 150 train 1 baseline" \
    "baseline-mfu 30 \"\$PYTHON\" scripts/gpu_smoke_checks.py metrics '$LOGS/baseline' --mfu --steps 20"
  queue_lane "full-stack 150 train 1 full $FULL" \
    "resume 120 train 1 full $FULL --training.steps=30" \
    "full-outputs 10 full_outputs" \
    "resume-log 10 resume_log"
  if [[ -z "$rowwise_why" ]]; then
    queue float8-rowwise 200 train 1 rowwise --training.mixed_precision_param=bfloat16 \
      --compile.enable=true --activation_checkpoint.mode=full --float8.enable=true \
      --float8.recipe_name=rowwise
  else
    skip float8-rowwise "$rowwise_why"
  fi
  queue block-causal 200 train 1 block_causal --model.attn_mask_type=block_causal \
    --training.mixed_precision_param=bfloat16 --compile.enable=true
  queue bf16-moments 150 train 1 bf16_moments --optimizer.implementation=fused_opt_states_bf16
  # The routed experts in the recipe this GPU runs natively, else emulated MXFP8.
  local moe=(--float8.moe_grouped_mm=mxfp8 --float8.emulate=true)
  case "${capability%%.*}" in 9) moe=(--float8.moe_grouped_mm=float8_rowwise) ;;
                              10) moe=(--float8.moe_grouped_mm=mxfp8) ;; esac
  queue moe-low-precision 220 train 1 moe_low_precision --model.name=deepseek_v3 \
    --model.flavor=debugmodel --training.mixed_precision_param=bfloat16 "${moe[@]}"
  if [[ "${capability%%.*}" == 9 ]]; then
    queue blockwise-kernel 200 "$PYTHON" scripts/gpu_smoke_checks.py blockwise
    queue_lane "blockwise-cold 200 train 1 blockwise_cold $BLOCKWISE" \
      "blockwise-warm 90 train 1 blockwise_warm --first-step-under 30 $BLOCKWISE"
    queue deepseek-recipe 220 train 1 deepseek_recipe --model.name=deepseek_v3 \
      --model.flavor=debugmodel --model.overrides.mtp_depth=1 \
      --training.mixed_precision_param=bfloat16 --float8.enable=true \
      --float8.recipe_name=blockwise --optimizer.implementation=fused_opt_states_bf16
  else
    skip blockwise-fp8 "SM $capability: torchao's Float8BlockwiseLinear runs on SM 9.x only"
  fi
  wait
  if [[ "$ngpu" -ge 2 ]]; then  # one at a time: each takes two GPUs
    local spec
    for spec in "fsdp2 --parallelism.data_parallel_shard_degree=2" \
        "tp2-float8 --parallelism.tensor_parallel_degree=2 --training.mixed_precision_param=bfloat16 --compile.enable=true --float8.enable=true" \
        "async-tp2 --parallelism.tensor_parallel_degree=2 --parallelism.enable_async_tensor_parallel=true --compile.enable=true" \
        "cp2 --parallelism.context_parallel_degree=2" "pp2 --parallelism.pipeline_parallel_degree=2"; do
      ROWS+=("${spec%% *}")
      eval "run_check ${spec%% *} 150 train 2 ${spec%% *} ${spec#* }"
    done
  else
    skip multi-gpu "one GPU: FSDP, TP + float8, async TP, CP, PP not run"
  fi
}

summary() {
  printf '\n%-22s %-7s %7s  %s\n' CHECK RESULT SECONDS "DETAIL (the check's last line)"
  local name
  for name in "${ROWS[@]}"; do row "$name"; done
}

[[ "${SMOKE_ONLY:-}" == throughput ]] || phase1
summary | tee "$LOGS/summary.txt"
failed=$(grep -cE '^\S+ +(FAIL|TIMEOUT) ' "$LOGS/summary.txt" || true)

# --- phase 2: the 1B throughput table, one job at a time, in the budget left ---
if [[ "${SMOKE_ONLY:-}" != checks ]]; then
  left=$((BUDGET - SECONDS))
  dry=(); [[ $DRY == 1 ]] && dry=(--dry-run)
  echo
  echo "throughput (Llama 3.2 1B, seq 4096 x 2, bf16 autocast, one GPU; ${left} s left):"
  timeout -k 10 $((left > 30 ? left : 30)) "$PYTHON" scripts/gpu_throughput.py \
    --out "$LOGS/throughput" --budget "$((left > 0 ? left : 0))" "${dry[@]}" \
    --jobs "${SMOKE_THROUGHPUT_JOBS:-}" >"$LOGS/throughput.log" 2>&1
  tp=$?
  if [[ -f "$LOGS/throughput/throughput.md" ]]; then cat "$LOGS/throughput/throughput.md"
  else tail -n 5 "$LOGS/throughput.log"; fi
  [[ $tp == 0 ]] || { echo "gpu_throughput exited $tp (log: $LOGS/throughput.log)"; failed=$((failed + 1)); }
fi

if [[ -n "${SMOKE_ARCHIVE:-}" ]]; then
  mkdir -p "$SMOKE_ARCHIVE"
  cp "$LOGS/summary.txt" "$SMOKE_ARCHIVE/" 2>/dev/null
  cp "$LOGS/throughput/throughput.md" "$LOGS/throughput/throughput.json" "$SMOKE_ARCHIVE/" 2>/dev/null
  tar -czf "$SMOKE_ARCHIVE/smoke_logs.tar.gz" --exclude='checkpoint' --exclude='profile_traces' \
    --exclude='memory_snapshot' --exclude='*.pt' --exclude='*.distcp' -C "$LOGS" . 2>/dev/null
fi
echo "gpu_smoke: $failed check(s) failed or timed out ($SECONDS s in all)"
[[ $failed == 0 ]]
