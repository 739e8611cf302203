#!/usr/bin/env bash
# Exercise every CUDA path once on this machine and check its output (docs/gpu.md).
#
#   scripts/gpu_smoke.sh            outputs under ./outputs/gpu_smoke (SMOKE_DIR to change)
#
# One GPU (under 10 minutes on one H100-class GPU, estimated; not yet run): preflight; a baseline
# run with MFU from the GPU table; bf16 + compile + op SAC + float8 tensorwise + profiler + memory
# snapshot + pinned async checkpoints; resume from them; float8 rowwise (SM 8.9+); bench.py; each
# CUDA SDPA backend (the kernels CP's ring attention runs) against the math backend; document
# masking's FlexAttention against dense SDPA, and a compiled block_causal run; the MoE experts'
# low-precision grouped GEMMs (kernel check, then a deepseek_v3 debug run); fused AdamW with bf16
# moments; on Hopper, blockwise FP8 (kernel check, a Llama run, DeepSeek-V3's recipe with MTP).
# More than one GPU adds, on 2 of them: FSDP, TP + float8, async TP (compiled), CP, PP.
# (Async TP and CP need a TP/CP group of two ranks, and NCCL cannot put two ranks on one GPU, so
# they run only there.) Stops at the first failed check, printing its log's tail; always prints
# the summary table. On a machine without a usable GPU it exits 1 with one line.

set -uo pipefail
cd "$(dirname "$0")/.."

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [[ "${ngpu:-0}" -lt 1 ]]; then
  echo "gpu_smoke: no usable GPU on this machine (nvidia-smi lists none); nothing was checked" >&2
  exit 1
fi
source scripts/ensure_env.sh
OUT="${SMOKE_DIR:-./outputs/gpu_smoke}"
rm -rf "$OUT" && mkdir -p "$OUT"
SUMMARY=()

summary() {
  printf '\n%-24s %-6s %7s  %s\n' CHECK RESULT SECONDS DETAIL
  for row in "${SUMMARY[@]}"; do printf '%s\n' "$row"; done
}

# check NAME COMMAND...: run it (output in $OUT/NAME.log); stop everything on failure.
check() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" >"$OUT/$name.log" 2>&1 || status=$?
  local detail
  detail=$(tail -n 1 "$OUT/$name.log" | cut -c1-90)
  if [[ $status -ne 0 ]]; then
    SUMMARY+=("$(printf '%-24s %-6s %7d  %s' "$name" FAIL $((SECONDS - start)) "$detail")")
    echo "gpu_smoke: $name failed (exit $status); last lines of $OUT/$name.log:" >&2
    tail -n 25 "$OUT/$name.log" >&2
    summary
    exit 1
  fi
  SUMMARY+=("$(printf '%-24s %-6s %7d  %s' "$name" ok $((SECONDS - start)) "$detail")")
}

skip() { SUMMARY+=("$(printf '%-24s %-6s %7s  %s' "$1" skip - "$2")"); }

COMMON=(--training.steps=20 --metrics.log_freq=5 --validation.enable=false)
train() {  # train NPROC FOLDER OVERRIDES...: a run of the debug model, then its metrics check
  local nproc=$1 folder=$OUT/$2
  shift 2
  NPROC=$nproc ./run_train.sh --job.dump_folder="$folder" "${COMMON[@]}" "$@" &&
    "$PYTHON" scripts/gpu_smoke_checks.py metrics "$folder"
}
exists() { compgen -G "$1" >/dev/null || { echo "missing: $1"; return 1; }; }

capability=$("$PYTHON" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
rowwise_why=$("$PYTHON" -c "
import torch; from torchtitan_like.components.float8 import rowwise_unsupported_reason as r
print(r(torch.cuda.get_device_capability()) or '')")

# --- one GPU ---
check preflight "$PYTHON" -c "
import torch, torchao; assert torch.cuda.is_available(), 'torch sees no GPU'
print(torch.__version__, 'CUDA', torch.version.cuda, torchao.__version__,
      torch.cuda.get_device_name(), 'SM', '$capability')"
check baseline train 1 baseline
check baseline-mfu "$PYTHON" scripts/gpu_smoke_checks.py metrics "$OUT/baseline" --mfu --steps 20
FULL=(--training.mixed_precision_param=bfloat16 --compile.enable=true
      --activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=op
      --float8.enable=true --float8.recipe_name=tensorwise
      --profiling.enable_profiling=true --profiling.enable_memory_snapshot=true
      --profiling.profile_freq=10
      --checkpoint.enable=true --checkpoint.interval=10 --checkpoint.async_mode=async_with_pinned_mem)
check full-stack train 1 full "${FULL[@]}"
check full-outputs bash -c "
  $(declare -f exists)
  exists '$OUT/full/profile_traces/iteration_10/rank0_trace.json' &&
  exists '$OUT/full/memory_snapshot/iteration_10/rank0_memory_snapshot.pickle' &&
  exists '$OUT/full/checkpoint/step-20/checkpoint.json' && echo 'trace, snapshot, step-20 there'"
check resume train 1 full "${FULL[@]}" --training.steps=30
check resume-log bash -c "grep -h 'checkpoint: loaded' '$OUT/resume.log' | tail -n 1 | grep 'step 20'"
if [[ -z "$rowwise_why" ]]; then
  check float8-rowwise train 1 rowwise --training.mixed_precision_param=bfloat16 \
    --compile.enable=true --activation_checkpoint.mode=full \
    --float8.enable=true --float8.recipe_name=rowwise
else
  skip float8-rowwise "$rowwise_why"
fi
check bench "$PYTHON" scripts/bench.py --steps 3 --warmup 2
check sdpa-backends "$PYTHON" scripts/gpu_smoke_checks.py sdpa
check block-causal-flex "$PYTHON" scripts/gpu_smoke_checks.py block_causal
check block-causal train 1 block_causal --model.attn_mask_type=block_causal \
  --training.mixed_precision_param=bfloat16 --compile.enable=true
check moe-grouped-mm "$PYTHON" scripts/gpu_smoke_checks.py moe_grouped_mm
# The routed experts in the low-precision recipe this GPU runs natively, else emulated MXFP8.
read -ra moe_flags <<<"$("$PYTHON" -c "
import torch; from torchao.prototype.moe_training.mxfp8_grouped_mm import _SM100_KERNELS_AVAILABLE
from torchtitan_like.components.moe_low_precision import device_unsupported_reason as why
c = torch.cuda.get_device_capability()
print(next((f'--float8.moe_grouped_mm={r}' for r in ('mxfp8', 'float8_rowwise')
            if not why(r, False, 'cuda', '', c, _SM100_KERNELS_AVAILABLE)),
           '--float8.moe_grouped_mm=mxfp8 --float8.emulate=true'))")"
check moe-low-precision train 1 moe_low_precision --model.name=deepseek_v3 \
  --model.flavor=debugmodel --training.mixed_precision_param=bfloat16 "${moe_flags[@]}"
# DeepSeek-V3's recipe: blockwise FP8 (Hopper only), bf16 Adam moments (fused), MTP.
check bf16-moments-kernel "$PYTHON" scripts/gpu_smoke_checks.py bf16_moments
check bf16-moments train 1 bf16_moments --optimizer.implementation=fused_opt_states_bf16
if [[ "${capability%%.*}" == 9 ]]; then
  check blockwise-kernel "$PYTHON" scripts/gpu_smoke_checks.py blockwise
  check blockwise-fp8 train 1 blockwise --training.mixed_precision_param=bfloat16 \
    --float8.enable=true --float8.recipe_name=blockwise
  check deepseek-recipe train 1 deepseek_recipe --model.name=deepseek_v3 \
    --model.flavor=debugmodel --model.overrides.mtp_depth=1 \
    --training.mixed_precision_param=bfloat16 --float8.enable=true \
    --float8.recipe_name=blockwise --optimizer.implementation=fused_opt_states_bf16
else
  skip blockwise-fp8 "SM $capability: torchao's Float8BlockwiseLinear runs on SM 9.x only"
fi

# --- two GPUs ---
if [[ "$ngpu" -ge 2 ]]; then
  check fsdp2 train 2 fsdp --parallelism.data_parallel_shard_degree=2
  check tp2-float8 train 2 tp --parallelism.tensor_parallel_degree=2 \
    --training.mixed_precision_param=bfloat16 --compile.enable=true --float8.enable=true
  check async-tp2 train 2 async_tp --parallelism.tensor_parallel_degree=2 \
    --parallelism.enable_async_tensor_parallel=true --compile.enable=true
  check cp2 train 2 cp --parallelism.context_parallel_degree=2
  check pp2 train 2 pp --parallelism.pipeline_parallel_degree=2
else
  skip multi-gpu "one GPU: FSDP, TP + float8, async TP, CP, PP not run"
fi
summary
echo "gpu_smoke: all checks passed ($((SECONDS))s)"
