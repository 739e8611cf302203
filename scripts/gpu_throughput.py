"""Throughput of the Llama 3.2 1B job on one GPU, one job at a time, beside ttl-plan and HF.

    PYTHONPATH=$PWD python scripts/gpu_throughput.py --out DIR [--budget 240] [--jobs a,b]
    PYTHONPATH=$PWD python scripts/gpu_throughput.py --out DIR --dry-run   # no GPU: fake figures

The job (issue 37's, the HF peer's): Llama 3.2 1B (dim 2048, 16 layers, 32/8 heads, FFN 8192,
vocab 128,256, tied), seq 4096 x local batch 2, fp32 master weights with bf16 autocast, SDPA,
fused AdamW, CPython's documentation text (train_configs/debug_model.toml's dataset). Jobs, in this
order, each its own process, each with a time cap (TIMEOUT in the table when it runs over), the
next one skipped when the budget left is below its cap:

    compile, hf (HF transformers' LlamaForCausalLM built from a config, no download: the
    baseline), compile + float8 tensorwise, ckpt-stall (compile with an async checkpoint),
    eager, compile + float8 rowwise, blockwise FP8 (eager), 8B-bf16-ac (Llama 3.1 8B, seq
    4096 x 1, bf16 moments, full AC, compile: run only where ttl-plan says it fits)

The order puts first what the issue's bars compare (compiled bf16 against HF, float8 against
compiled bf16, the checkpoint stall), so a short budget drops the others.
ckpt-stall saves once asynchronously (pinned memory where /dev/shm holds the state) at step 5
and reports the loop's wait for it, as a share of a step and the checkpoint interval from which
that share stays under 5%.

Each row: median tokens/s over the steps after ``--warmup`` (metrics.jsonl), MFU against the
bf16 matmul peak measured here (8192^3, the best of 12) and against the datasheet peak (the
trainer's GPU table), peak memory, the first step's seconds (compile and autotuning), and
ttl-plan's prediction for the same job (``--config`` of the job's TOML) with its band. The
table goes to DIR/throughput.md and stdout, each row as soon as it is measured; the raw rows to
DIR/throughput.json. Every job's log stays in DIR/<job>/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASHEET_TFLOPS = {"H200": 989.0, "H100": 989.0}
BASE = {
    "model": {"name": "llama3", "flavor": "1B", "tokenizer_path": ""},
    "optimizer": {"name": "AdamW", "lr": 3e-4, "implementation": "fused"},
    "training": {"dataset": "cpython_docs", "seq_len": 4096, "local_batch_size": 2,
                 "global_batch_size": 2, "mixed_precision_param": "bfloat16", "max_norm": 1.0},
    "metrics": {"log_freq": 1, "enable_tensorboard": False},
    "validation": {"enable": False},
    "lr_scheduler": {"warmup_steps": 2},
}
COMPILE = {"compile": {"enable": True}}
JOBS = [  # name, extra TOML sections, cap in seconds; in the order of the bars
    ("compile", COMPILE, 110),
    ("hf", None, 75),
    ("f8-tensorwise", {**COMPILE, "float8": {"enable": True, "recipe_name": "tensorwise"}}, 110),
    ("ckpt-stall", {**COMPILE, "training": {"steps": 8},
                    "checkpoint": {"enable": True, "interval": 5, "keep_latest_k": 1,
                                   "async_mode": "async_with_pinned_mem",
                                   "last_save_model_only": True, "export_dtype": "bfloat16"}},
     100),
    ("eager", {}, 75),
    ("f8-rowwise", {**COMPILE, "float8": {"enable": True, "recipe_name": "rowwise"}}, 110),
    ("f8-blockwise", {"float8": {"enable": True, "recipe_name": "blockwise"}}, 150),
    ("8B-bf16-ac", {**COMPILE, "model": {"flavor": "8B"},
                    "training": {"local_batch_size": 1, "global_batch_size": 1},
                    "optimizer": {"state_dtype": "bfloat16"},
                    "activation_checkpoint": {"mode": "full"}}, 150),
]


def job_toml(extra: dict, dump_folder: Path, steps: int) -> str:
    """The job's TOML: BASE with ``extra``'s keys laid over it, section by section."""
    sections = {name: dict(values) for name, values in BASE.items()}
    sections["training"]["steps"] = steps
    for name, values in extra.items():
        sections.setdefault(name, {}).update(values)
    sections["job"] = {"dump_folder": str(dump_folder)}
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)


def summarize_metrics(folder: Path, warmup: int) -> dict:
    """tokens/s (median after warm-up), achieved TFLOP/s, peak memory, step 1's seconds."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    train = [r for r in records if "tokens_per_second" in r and "loss" in r]
    steady = [r for r in train if r["step"] > warmup] or train[-1:]
    first = train[0]
    tokens_per_step = BASE["training"]["seq_len"] * BASE["training"]["local_batch_size"]
    return {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in steady),
            "tflops": statistics.median(r["tflops"] for r in steady),
            "memory_gib": max(r["memory_gib"] for r in train),
            "step1_s": tokens_per_step / first["tokens_per_second"] if first["step"] == 1
            else None}


def checkpoint_stall(log: Path) -> float | None:
    """The loop's wait for the first (asynchronous) save, from the checkpoint manager's "the
    loop waited X s" line (the run's last save is synchronous in every mode)."""
    waits = [float(line.split("the loop waited ")[1].split(" s")[0])
             for line in log.read_text(errors="replace").splitlines()
             if "the loop waited " in line]
    return waits[0] if len(waits) > 1 else None


def pinned_or_plain(extra: dict, state_gib: float = 16.0) -> dict:
    """The checkpoint job in pinned-memory async mode where /dev/shm holds the 1B job's state
    (fp32 weights and Adam moments: 15 GiB), else plain async (a thread's copy)."""
    if "checkpoint" not in extra or not Path("/dev/shm").exists():
        return extra
    if shutil.disk_usage("/dev/shm").free >= state_gib * 2**30:
        return extra
    return {**extra, "checkpoint": {**extra["checkpoint"], "async_mode": "async"}}


def planner(toml: Path, gpu: str) -> dict | None:
    """ttl-plan's tokens/s per GPU, its band and its memory verdict for the job's TOML."""
    done = subprocess.run([sys.executable, "-m", "torchtitan_like.tools.plan_cli", "--config",
                           str(toml), "--gpu", gpu, "--num_gpus", "1", "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    if done.returncode:
        return None
    plan = json.loads(done.stdout)
    band = plan.get("expected_error", {}).get("tokens_per_second_per_gpu", [None, None])
    return {"tokens_per_second": plan["tokens_per_second_per_gpu"], "band": band,
            "fits": plan["fits"], "memory_gib": plan["memory_gib"]["total"]}


def run_capped(command: list[str], log: Path, cap: float, env: dict) -> tuple[str, float]:
    """Run ``command`` with its output in ``log``: ("ok" | "FAIL" | "TIMEOUT", seconds)."""
    start = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=env, start_new_session=True)
        try:
            status = "ok" if process.wait(timeout=cap) == 0 else "FAIL"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            status = "TIMEOUT"
    return status, time.monotonic() - start


def trainer_command(toml: Path) -> list[str]:
    """torchrun of the trainer on one process (the checks of run_train.sh's preflight run in
    the trainer too; skipping its second process saves a start per job)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
            "-m", "torchtitan_like.train", "--job.config_file", str(toml)]


def measure_matmul_tflops(dry_run: bool) -> float:
    """The best of 10 bf16 8192^3 matmuls, in TFLOP/s (the peak this GPU reaches)."""
    if dry_run:
        return 780.0
    import torch

    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    best = float("inf")
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * 8192**3 / best / 1e12


def hf_worker(steps: int, warmup: int) -> None:
    """The baseline: HF LlamaForCausalLM with the 1B shape (no download), fp32 weights, bf16
    autocast, SDPA, fused AdamW, the same tokens per step; prints one JSON line."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    tokens = torch.randint(0, 128256, (2, 4096), device="cuda")
    times, first = [], None
    for step in range(1, steps + 1):
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        first = first or seconds
        if step > warmup:
            times.append(seconds)
    print(json.dumps({"tokens_per_second": tokens.numel() / statistics.median(times),
                      "memory_gib": torch.cuda.max_memory_allocated() / 2**30,
                      "step1_s": first}))


def fake_job(name: str, folder: Path, log: Path, cap: float) -> tuple[str, float]:
    """--dry-run: the control flow with fake figures; a name in SMOKE_DRY_TIMEOUT runs past
    its (shortened) cap, one in SMOKE_DRY_FAIL fails."""
    if name in os.environ.get("SMOKE_DRY_TIMEOUT", "").split():
        return run_capped([sys.executable, "-c", "import time; time.sleep(60)"], log,
                          min(cap, 1.0), dict(os.environ))
    if name in os.environ.get("SMOKE_DRY_FAIL", "").split():
        log.write_text("dry run: a failing job\n")
        return "FAIL", 0.0
    folder.mkdir(parents=True, exist_ok=True)
    records = [{"step": s, "loss": 10.0 - s, "tokens_per_second": 4e4 + 1e3 * s,
                "tflops": 360.0, "memory_gib": 40.0} for s in range(1, 7)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    log.write_text("dry run\ncheckpoint: saved step 5; the loop waited 0.020 s\n"
                   "checkpoint: saved step 6; the loop waited 3.000 s\n")
    if name == "hf":
        log.write_text(json.dumps({"tokens_per_second": 4.1e4, "memory_gib": 45.8,
                                   "step1_s": 2.0}) + "\n")
    return "ok", 0.0


def run_job(name: str, extra: dict | None, cap: float, args: argparse.Namespace) -> dict:
    """One job: its TOML, the planner's view, the run, its figures."""
    folder = args.out / name
    shutil.rmtree(folder, ignore_errors=True)  # a rerun starts clean (one run per dump folder)
    folder.mkdir(parents=True)
    log, row = folder / "run.log", {"job": name}
    env = {"TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1", **os.environ,  # as run_train.sh
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if extra is not None:
        toml = folder / "job.toml"
        toml.write_text(job_toml(pinned_or_plain(extra), folder / "dump", args.steps))
        row["plan"] = planner(toml, args.gpu)
        if name.startswith("8B") and not (row["plan"] and row["plan"]["fits"]):
            why = "does not fit one GPU" if row["plan"] else "failed (see the log)"
            return {**row, "status": "skip", "note": f"ttl-plan: {why}"}
        command = trainer_command(toml)
    else:
        command = [sys.executable, str(Path(__file__)), "--hf-worker", "--steps",
                   str(args.steps), "--warmup", str(args.warmup)]
    status, seconds = (fake_job(name, folder / "dump", log, cap) if args.dry_run
                       else run_capped(command, log, cap, env))
    row.update(status=status, seconds=round(seconds, 1))
    if status != "ok":
        lines = log.read_text(errors="replace").strip().splitlines()
        return {**row, "note": lines[-1][:100] if lines else ""}
    if extra is None:  # the worker's JSON line, whatever else the libraries printed
        row.update(next(json.loads(line) for line in reversed(log.read_text().splitlines())
                        if line.startswith('{"tokens_per_second"')))
    else:
        row.update(summarize_metrics(folder / "dump", args.warmup))
    if name == "ckpt-stall":
        row["stall_s"] = checkpoint_stall(log)
    return row


def table_lines(rows: list[dict], measured: float, datasheet: float) -> list[str]:
    head = ("| job | status | tokens/s | MFU (measured peak) | MFU (datasheet) | peak GiB | "
            "step 1 s | ttl-plan tokens/s [band] | vs hf |")
    lines = [f"bf16 matmul peak measured {measured:.0f} TFLOP/s, datasheet {datasheet:.0f}", "",
             head, "|" + "---|" * 9]
    hf = next((r.get("tokens_per_second") for r in rows if r["job"] == "hf"), None)
    for r in rows:
        tps = r.get("tokens_per_second")
        plan = r.get("plan") or {}
        band = plan.get("band") or [None, None]
        cells = [r["job"], r["status"] + (f" ({r['note']})" if r.get("note") else ""),
                 f"{tps:,.0f}" if tps else "",
                 f"{100 * r['tflops'] / measured:.1f}%" if r.get("tflops") else "",
                 f"{100 * r['tflops'] / datasheet:.1f}%" if r.get("tflops") else "",
                 f"{r['memory_gib']:.1f}" if r.get("memory_gib") else "",
                 f"{r['step1_s']:.1f}" if r.get("step1_s") else "",
                 (f"{plan['tokens_per_second']:,.0f} [{band[0]:,.0f}-{band[1]:,.0f}]"
                  + ("" if not tps else " in band" if band[0] <= tps <= band[1] else " OUT")
                  if plan and band[0] else ""),
                 f"{tps / hf:.2f}x" if tps and hf and not r["job"].startswith("8B") else ""]
        if r.get("stall_s") is not None and tps:
            step = BASE["training"]["seq_len"] * BASE["training"]["local_batch_size"] / tps
            interval = max(1, -(-r["stall_s"] // (0.05 * step)))
            cells[1] += (f"; a save stalls the loop {r['stall_s']:.3f} s = "
                         f"{100 * r['stall_s'] / step:.0f}% of a step: < 5% from an interval "
                         f"of {interval:.0f} steps")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu_throughput")
    parser.add_argument("--budget", type=float, default=900.0, help="seconds for all jobs")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--gpu", default="H200", help="ttl-plan's GPU preset and datasheet")
    parser.add_argument("--jobs", default="", help="comma-separated subset of the jobs")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hf_worker:
        hf_worker(args.steps, args.warmup)
        return 0
    if not args.dry_run and not _cuda_available():
        print("gpu_throughput: torch sees no GPU here; --dry-run runs the control flow with "
              "fake figures", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    measured = measure_matmul_tflops(args.dry_run)
    datasheet = DATASHEET_TFLOPS.get(args.gpu, measured)
    chosen = set(filter(None, args.jobs.split(",")))
    rows = []
    for name, extra, cap in JOBS:
        if chosen and name not in chosen:
            continue
        cap = min(cap, 2.0) if args.dry_run else cap  # fake jobs take no time
        left = deadline - time.monotonic()
        rows.append(run_job(name, extra, cap, args) if left >= cap else
                    {"job": name, "status": "skip", "note": f"budget: {left:.0f} s left"})
        (args.out / "throughput.json").write_text(json.dumps(rows, indent=1))
        (args.out / "throughput.md").write_text("\n".join(table_lines(rows, measured,
                                                                     datasheet)) + "\n")
    print("\n".join(table_lines(rows, measured, datasheet)))
    return 0 if all(r["status"] in ("ok", "skip") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
