"""The checks of scripts/gpu_smoke.sh that read outputs or run a kernel (one job each).

    python scripts/gpu_smoke_checks.py metrics DUMP_FOLDER [--mfu] [--steps N]
                                               [--first-step-under SECONDS]
        metrics.jsonl holds step N (default: any), every loss finite, the last below the first,
        with --mfu an MFU in (0, 100] (the peak from the GPU table), and with
        --first-step-under step 1 (compile, autotuning) took less than SECONDS: its tokens
        (local batch x seq_len of the run's config.toml) over its tokens/s
    python scripts/gpu_smoke_checks.py sdpa
        each CUDA SDPA backend (flash, efficient, cuDNN) forward + backward in bf16, causal,
        against the math backend; bf16 rounds each output to 8 bits of mantissa, so the bound is
        a few units of bf16's epsilon (2^-8) on O(1) values: 2e-2
    python scripts/gpu_smoke_checks.py block_causal
        document masking's CUDA path (models/attention_masks.py): FlexAttention with the
        block-causal BlockMask, forward + backward in bf16, against fp32 SDPA with the same
        mask as a dense boolean tensor; the same bound, 2e-2
    python scripts/gpu_smoke_checks.py moe_grouped_mm [--device cpu]
        the routed experts' low-precision grouped GEMMs (components/moe_low_precision.py): emulated
        MXFP8, and each recipe this GPU runs natively (float8_rowwise on SM 9.0, mxfp8 on SM
        10.x), converted experts forward + backward in bf16 against the bf16 experts, relative
        (norm) error of the output and of each gradient: each quantized GEMM adds ~4% rms (two
        e4m3 roundings per product, measured 3.6-4.0% per GEMM on CPU), independently, and
        each result depends on at most four of them (the input gradient: w2's input gradient,
        times the w1 and w3 outputs, through w1/w3's input gradient): sqrt(4) x 4% = 8%, bound
        0.15 (2x; measured 6.6-6.7% emulated); --device cpu: emulated MXFP8 only
    python scripts/gpu_smoke_checks.py blockwise
        blockwise float8 (components/blockwise_fp8.py) on Hopper: torchao's Float8BlockwiseLinear
        forward + backward in bf16 against the emulated path on the same GPU (the same
        quantization; fp32 sums in another order and bf16 outputs: relative norm difference
        of output and gradients below 2^-6), and against the bf16 linear (each GEMM ~3.5% rms
        from high precision, measured on CPU: bound (0.005, 0.1))
    python scripts/gpu_smoke_checks.py bf16_moments
        implementation = "fused" with bf16 moments (components/bf16_moments.py: torch's fused
        AdamW on torch >= 2.13, the compiled step before) against the foreach bf16-moment step,
        10 steps of fixed gradients: the states stay bf16, and the parameters agree within
        twice the module's derived bound (moment_deviation_bound: each is within it of fp32
        moments)
Exit 1 with one line saying what failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def first_step_seconds(folder: Path, record: dict) -> float:
    """Step 1's seconds: its tokens on this rank (no accumulation) over its tokens/s."""
    import tomllib

    training = tomllib.loads((folder / "config.toml").read_text())["training"]
    return training["local_batch_size"] * training["seq_len"] / record["tokens_per_second"]


def check_metrics(folder: Path, mfu: bool, steps: int | None,
                  first_step_under: float | None = None) -> str:
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    train = [r for r in records if "loss" in r and "tokens_per_second" in r]
    if not train:
        raise AssertionError(f"{folder}/metrics.jsonl has no training record")
    losses = [r["loss"] for r in train]
    if not all(math.isfinite(x) for x in losses) or losses[-1] >= losses[0]:
        raise AssertionError(f"losses not finite and falling: {losses}")
    if steps is not None and train[-1]["step"] != steps:
        raise AssertionError(f"last step {train[-1]['step']}, expected {steps}")
    if mfu and not (train[-1].get("mfu") and 0 < train[-1]["mfu"] <= 100):
        raise AssertionError(f"MFU missing or out of range: {train[-1].get('mfu')}")
    first = ""
    if first_step_under is not None:
        seconds = first_step_seconds(folder, train[0])
        if train[0]["step"] != 1 or seconds >= first_step_under:
            raise AssertionError(f"step 1 took {seconds:.1f} s, not under {first_step_under} s")
        first = f", step 1 {seconds:.1f} s"
    return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, mfu {train[-1].get('mfu')}{first}"


def check_sdpa() -> str:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))

    def run(backend: SDPBackend) -> list[torch.Tensor]:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        return [out.float(), *(g.float() for g in grads)]

    reference = run(SDPBackend.MATH)
    done = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):
        got = run(backend)
        error = max((a - b).abs().max().item() / max(1.0, b.abs().max().item())
                    for a, b in zip(got, reference, strict=True))
        if error > 2e-2:
            raise AssertionError(f"{backend.name}: relative error {error:.3g} > 2e-2")
        done.append(f"{backend.name} {error:.1e}")
    return ", ".join(done)


def check_block_causal() -> str:
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    from torchtitan_like.models.attention_masks import (
        attention,
        build_mask,
        dense_block_causal_mask,
        document_ids,
    )

    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 512), device="cuda")  # id 0 as EOS: ~8 documents a row
    ids = document_ids(tokens, eos_id=0)
    mask = build_mask(ids)
    if not isinstance(mask, BlockMask):
        raise AssertionError(f"build_mask on CUDA gave {type(mask).__name__}, not a BlockMask")
    q, k, v = (torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    flex = attention(q, k, v, mask)
    got = [flex.float(), *(g.float() for g in torch.autograd.grad(flex.sum(), (q, k, v)))]
    dense = attention(q.float(), k.float(), v.float(), dense_block_causal_mask(ids))
    reference = [dense, *torch.autograd.grad(dense.sum(), (q, k, v))]
    error = max((a - b.float()).abs().max().item() / max(1.0, b.float().abs().max().item())
                for a, b in zip(got, reference, strict=True))
    if error > 2e-2:
        raise AssertionError(f"FlexAttention block_causal: relative error {error:.3g} > 2e-2")
    return f"FlexAttention block_causal vs dense SDPA {error:.1e}, {int(ids.max()) + 1} documents"


def check_moe_grouped_mm(device: str) -> str:
    import copy

    import torch
    from torchao.prototype.moe_training.mxfp8_grouped_mm import _SM100_KERNELS_AVAILABLE

    from torchtitan_like.components.moe_low_precision import (
        MoEGroupedMMConverter,
        device_unsupported_reason,
    )
    from torchtitan_like.components.versions import GATES, refusal, torch_version, torchao_version
    from torchtitan_like.config.job_config import Float8
    from torchtitan_like.models.moe.experts import GroupedExperts

    capability = torch.cuda.get_device_capability() if device == "cuda" else (0, 0)
    mxfp8_gate = GATES[0]  # emulated MXFP8 needs what torchao probes for (components/versions.py)
    mxfp8_why = refusal(mxfp8_gate, torch_version(), bool(mxfp8_gate.probe and mxfp8_gate.probe()),
                        torchao_version())
    recipes = ([] if mxfp8_why else [("mxfp8", True)]) + [
        (recipe, False) for recipe in ("float8_rowwise", "mxfp8")
        if device_unsupported_reason(recipe, False, device, "", capability,
                                     _SM100_KERNELS_AVAILABLE) is None
        and not (recipe == "mxfp8" and mxfp8_why)]
    if not recipes:
        raise AssertionError(f"no recipe runs here: mxfp8 {mxfp8_why}")
    torch.manual_seed(0)
    reference = GroupedExperts(dim=512, hidden_dim=256, num_experts=4).to(device)
    reference.init_weights(0.02)
    reference.to(torch.bfloat16)
    counts = torch.tensor([300, 0, 517, 207], device=device)  # uneven, one expert idle
    x = torch.randn(int(counts.sum()), 512, device=device, dtype=torch.bfloat16)
    upstream = torch.randn_like(x)

    def run(experts: GroupedExperts) -> list[torch.Tensor]:
        x_in = x.clone().requires_grad_()
        out = experts(x_in, counts)
        grads = torch.autograd.grad(out, [x_in, *experts.parameters()], upstream)
        return [out.float(), *(g.float() for g in grads)]

    expected = run(reference)
    done = []
    for recipe, emulate in recipes:
        experts = copy.deepcopy(reference)
        MoEGroupedMMConverter(Float8(moe_grouped_mm=recipe, emulate=emulate)).convert(experts)
        errors = [((a - b).norm() / b.norm()).item()
                  for a, b in zip(run(experts), expected, strict=True)]
        name = recipe + (" emulated" if emulate else "")
        if not 0 < max(errors) <= 0.15:
            raise AssertionError(f"{name}: relative errors {errors} not in (0, 0.15]")
        done.append(f"{name} " + " ".join(f"{e:.1e}" for e in errors))
    return ", ".join(done + ([f"mxfp8 not checked: {mxfp8_why}"] if mxfp8_why else []))


def check_blockwise() -> str:
    import torch
    from torch import nn

    from torchtitan_like.components.blockwise_fp8 import EmulatedBlockwiseLinear, _gpu_linear

    torch.manual_seed(0)
    reference = nn.Linear(1024, 768, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    upstream = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)

    def run(linear: nn.Module) -> list[torch.Tensor]:
        x_in = x.clone().requires_grad_()
        out = linear(x_in)
        grads = torch.autograd.grad(out, [x_in, linear.weight], upstream)
        return [out.float(), *(g.float() for g in grads)]

    def relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
        return [((p - q).norm() / q.norm()).item() for p, q in zip(a, b, strict=True)]

    expected = run(reference)
    real = run(_gpu_linear(reference))
    emulated = run(EmulatedBlockwiseLinear.from_linear(reference))
    to_emulated, to_bf16 = relative(real, emulated), relative(real, expected)
    if max(to_emulated) >= 2**-6 or not 0.005 < max(to_bf16) < 0.1:
        raise AssertionError(f"blockwise: vs emulated {to_emulated}, vs bf16 {to_bf16}")
    return (f"Float8BlockwiseLinear vs emulated {max(to_emulated):.1e}, "
            f"vs bf16 {max(to_bf16):.1e} (output, input grad, weight grad)")


def check_bf16_moments() -> str:
    import torch

    from torchtitan_like.components import bf16_moments
    from torchtitan_like.components.optimizer import build_optimizer
    from torchtitan_like.components.versions import torch_version
    from torchtitan_like.config.optimization import Optimizer

    torch.manual_seed(0)
    start = torch.randn(4096, 256, device="cuda") * 0.02
    grads = [torch.randn_like(start) * 1e-2 for _ in range(10)]
    results = []
    for implementation in ("fused_opt_states_bf16", "foreach"):
        p = torch.nn.Parameter(start.clone())
        config = Optimizer(implementation=implementation, state_dtype="bfloat16")
        optimizer = build_optimizer([p], config)
        for g in grads:
            p.grad = g.clone()
            optimizer.step()
        dtypes = {optimizer.state[p][k].dtype for k in ("exp_avg", "exp_avg_sq")}
        if dtypes != {torch.bfloat16}:
            raise AssertionError(f"{implementation}: moments in {dtypes}, not bf16")
        results.append(p.detach())
    c = Optimizer()
    bound = 2 * bf16_moments.moment_deviation_bound(grads, start, c.lr, (c.beta1, c.beta2), c.eps)
    margin = ((results[0] - results[1]).abs().double() / bound).max().item()
    if margin > 1:
        raise AssertionError(f"fused vs foreach bf16 moments: {margin:.3g} of the bound")
    path = bf16_moments.fused_path("cuda", torch_version())
    return f"fused ({path} path) vs foreach bf16 moments: {margin:.2g} of twice the bound"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="check", required=True)
    metrics = sub.add_parser("metrics")
    metrics.add_argument("folder", type=Path)
    metrics.add_argument("--mfu", action="store_true")
    metrics.add_argument("--steps", type=int)
    metrics.add_argument("--first-step-under", type=float)
    sub.add_parser("sdpa")
    sub.add_parser("block_causal")
    sub.add_parser("moe_grouped_mm").add_argument("--device", default="cuda")
    sub.add_parser("blockwise")
    sub.add_parser("bf16_moments")
    args = parser.parse_args(argv)
    kernels = {"sdpa": check_sdpa, "block_causal": check_block_causal,
               "moe_grouped_mm": lambda: check_moe_grouped_mm(args.device),
               "blockwise": check_blockwise, "bf16_moments": check_bf16_moments}
    if args.check != "metrics" and not (args.check == "moe_grouped_mm" and args.device == "cpu"):
        import torch

        if not torch.cuda.is_available():
            print(f"{args.check}: torch sees no GPU (torch {torch.__version__})", file=sys.stderr)
            sys.exit(1)
    try:
        result = (check_metrics(args.folder, args.mfu, args.steps, args.first_step_under)
                  if args.check == "metrics"
                  else kernels[args.check]())
    except (AssertionError, OSError, ValueError, KeyError) as e:
        print(f"{args.check}: {e}", file=sys.stderr)
        sys.exit(1)
    print(result)


if __name__ == "__main__":
    main(sys.argv[1:])
