"""Optimizer-state memory of AdamW with fp32 and with bf16 moments ([optimizer] state_dtype),
measured with MemTracker (torch.distributed._tools.mem_tracker) over one optimizer step.

    python scripts/bench_optimizer_states.py [--flavor 100M] [--model llama3]

One process, fp32 parameters and gradients of the flavor's model on the CPU. For each
``state_dtype`` the first step (which allocates the states) and a second one are tracked;
printed: the persistent bytes of the moments after the step, and the step's peak of the
"Optstate" and "Temp" categories (the bf16 step works on fp32 copies of one chunk of
parameters at a time, components/bf16_moments.py), per parameter.
"""

from __future__ import annotations

import argparse

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from torchtitan_like.components.optimizer import build_optimizer
from torchtitan_like.config.optimization import Optimizer
from torchtitan_like.models.registry import get_model_args, get_model_spec

MiB = 2**20


def measure(model: torch.nn.Module, state_dtype: str) -> dict[str, float]:
    params = list(model.parameters())
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    optimizer = build_optimizer(params, Optimizer(state_dtype=state_dtype))
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        optimizer.step()
        optimizer.step()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    moments = sum(s[k].nbytes for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))
    return {"moments": moments, "peak_states": peak.get("Optstate", 0),
            "peak_temp": peak.get("Temp", 0), "peak_total": peak.get("Total", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3")
    parser.add_argument("--flavor", default="100M")
    args = parser.parse_args()
    spec = get_model_spec(args.model)
    model = spec.model_cls(get_model_args(spec, args.flavor))
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.model} {args.flavor}: {n:,} parameters; "
          f"command: python scripts/bench_optimizer_states.py --model {args.model} "
          f"--flavor {args.flavor}")
    print("| state_dtype | moments (MiB, B/param) | step peak: Optstate | Temp | Total (MiB) |")
    print("|---|---|---|---|---|")
    for state_dtype in ("float32", "bfloat16"):
        m = measure(model, state_dtype)
        print(f"| {state_dtype} | {m['moments'] / MiB:.1f} ({m['moments'] / n:.1f}) | "
              f"{m['peak_states'] / MiB:.1f} | {m['peak_temp'] / MiB:.1f} | "
              f"{m['peak_total'] / MiB:.1f} |")


if __name__ == "__main__":
    main()
