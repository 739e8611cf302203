"""The ablation runner: train one variant per parallelism/memory/speed choice and compare.

A sweep is a TOML file (train_configs/ablations/*.toml)::

    [sweep]
    base_config = "../debug_model.toml"   # relative to the sweep file
    steps = 8                             # training steps of every variant
    nproc = 2                             # processes of every variant (a variant may override)
    baseline = "FSDP"                     # the variant losses are compared to; default: the first
    output_folder = "outputs/ablations/x" # relative to the working directory
    overrides = ["--training.seq_len=128"] # applied to every variant, before its own
    timeout_s = 1800                      # per variant

    [[variants]]
    name = "FSDP"
    overrides = []

    [[variants]]
    name = "+AC full"
    overrides = ["--activation_checkpoint.mode=full"]

Each variant is first checked in this process like run_train.sh's preflight (the config, the
data and ``[job] trainer``, for the variant's world size): a variant that cannot start is
recorded as failed (exit 2) with its one ``config error`` line, and no torchrun starts. The
others run as their own torchrun job of ``torchtitan_like.train`` (which runs ``[job]
trainer`` when set), launched by the interpreter running the sweep (``python -m
torchtitan_like.launch``: no checkout needed, and a crash or a hang ends only that variant),
with its own dump folder ``{output_folder}/{variant}``, where its log (``train.log``) and
``metrics.jsonl`` land (tools/ablate_sweep.py reads the sweep file and builds each command).
The runner reads every metrics.jsonl and writes ``results.csv``,
``results.md`` and ``results.png`` (tools/ablate_report.py: the columns; the chart needs
matplotlib, the ``plot`` extra) into the output folder; a failed variant keeps its status and
the last meaningful line of its log.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import tomllib
from torchtitan_like.entry import trainer_class
from torchtitan_like.tools.ablate_report import Result, read_metrics, write_results
from torchtitan_like.tools.ablate_sweep import Sweep, SweepError, Variant, load_sweep
from torchtitan_like.tools.planner import LayoutError
from torchtitan_like.tools.planner.hardware import load_profile
from torchtitan_like.validate import parse_args

LAUNCH_ENV = {"TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
"""What run_train.sh sets for the trainer, set here too unless the caller's environment has it."""


# ---------------------------------------------------------------------------- one variant


# Lines of torchrun's failure report and of tracebacks: never the error line itself.
_NOISE = re.compile(
    r"torch\.distributed\.elastic|ChildFailedError|Root Cause|^Failures:|NO_OTHER_FAILURES|"
    r"^[=\-*]{5,}|^\[\d+\]:$|Traceback \(most recent call last\)|^\S+ FAILED$|"
    r"OMP_NUM_THREADS|^W\d{4} |^E\d{4} "
)
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_TIMESTAMP = re.compile(r"^\d\d:\d\d:\d\d ")
_ERROR = re.compile(r"error|exception|diverged|killed|out of memory|segmentation fault|"
                    r"timed out|not found", re.IGNORECASE)


def error_line(log: str) -> str:
    """The last meaningful line of a failed run's log: the last line that names an error,
    skipping torchrun's failure report and traceback frames (indented), else the last line."""
    meaningful = []
    for raw in log.splitlines():
        line = _RANK_PREFIX.sub("", raw.rstrip())
        if not line.strip() or line[0].isspace() or _NOISE.search(line):
            continue
        meaningful.append(_TIMESTAMP.sub("", line))
    for line in reversed(meaningful):
        if _ERROR.search(line):
            return line
    return meaningful[-1] if meaningful else "(the log is empty)"


def _launch(command: list[str], env: dict[str, str], log: Any, timeout_s: float) -> int | None:
    """Run the variant's torchrun to its end: its exit code, or None after ``timeout_s``."""
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return None


def _stop(proc: subprocess.Popen) -> None:
    """End the variant's process group (torchrun and its workers), politely first."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def preflight(sweep: Sweep, variant: Variant, folder: Path) -> str | None:
    """The variant's ``config error`` line if it cannot start (torchtitan_like/preflight.py's
    checks, in this process, for its world size), else None."""
    try:
        trainer_class(parse_args(sweep.trainer_args(variant, folder), sweep.nproc_of(variant)))
    except ConfigError as e:
        return f"config error: {e}"
    return None


def run_variant(sweep: Sweep, variant: Variant, folder: Path) -> Result:
    """Train one variant in its own torchrun (after its preflight); its output goes to
    ``folder/train.log``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").unlink(missing_ok=True)  # never read a previous run's records
    nproc = sweep.nproc_of(variant)
    env = {**LAUNCH_ENV, **os.environ}
    start = time.perf_counter()
    log_path = folder / "train.log"
    with log_path.open("w") as log:
        log.write(f"$ {' '.join(sweep.command(variant, folder))}\n")
        refused = preflight(sweep, variant, folder)
        log.write(f"{refused} (refused before torchrun)\n" if refused else "")
        log.flush()
        rc = 2 if refused else _launch(sweep.command(variant, folder), env, log,
                                       sweep.timeout_s)
    wall = time.perf_counter() - start
    records = read_metrics(folder)
    memory, speed = sweep.planned(variant)
    result = Result(variant, nproc, "ok", wall, records, planned_memory_gib=memory,
                    planned_tokens_per_second=speed)
    steps = [r["step"] for r in result.training]
    if rc is None:
        result.status = "timeout"
        result.error = f"stopped after {sweep.timeout_s:.0f} s ([sweep] timeout_s)"
    elif rc != 0:
        result.status = f"failed (exit {rc})"
        result.error = refused or error_line(log_path.read_text(errors="replace"))
    elif not steps or steps[-1] != sweep.steps:
        result.status = "incomplete"
        result.error = f"logged {steps[-1] if steps else 0} of {sweep.steps} steps"
    return result


# ---------------------------------------------------------------------------------- sweep


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def run_sweep(sweep: Sweep, log=print) -> list[Result]:
    """Run every variant in turn, whatever happens to the others; write the results."""
    folder = sweep.output_folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    start = time.perf_counter()
    n, charted = len(sweep.variants), True
    for i, variant in enumerate(sweep.variants, 1):
        elapsed = time.perf_counter() - start
        eta = f"ETA {_clock(elapsed / (i - 1) * (n - i + 1))}" if i > 1 else "ETA ?"
        log(f"[{i}/{n}] {variant.name}: {sweep.nproc_of(variant)} process(es) "
            f"(elapsed {_clock(elapsed)}, {eta})")
        result = run_variant(sweep, variant, folder / variant.folder_name)
        results.append(result)
        if result.status == "ok":
            log(f"[{i}/{n}] {variant.name}: ok in {result.wall_seconds:.0f} s, "
                f"{result.tokens_per_second or 0:,.0f} tokens/s, "
                f"final loss {result.final_loss:.4f}")
        else:
            log(f"[{i}/{n}] {variant.name}: {result.status.upper()}: {result.error}")
        charted = write_results(sweep, results, folder)  # a sweep cut short keeps its table
    log(f"done in {_clock(time.perf_counter() - start)}: {folder / 'results.md'}")
    if not charted:
        log("no chart: matplotlib is missing; install the plot extra "
            "(pip install 'torchtitan_like[plot]') for results.png")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ttl-ablate", description="Run a sweep of training variants and compare them "
        "(see train_configs/ablations/). Exit status 1 when a variant did not finish.")
    parser.add_argument("sweep", help="sweep TOML file")
    parser.add_argument("--output", help="output folder (default: the sweep's output_folder)")
    parser.add_argument("--steps", type=int, help="steps per variant (overrides the sweep's)")
    parser.add_argument("--nproc", type=int, help="processes of the variants that do not set "
                        "their own (overrides the sweep's)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these variants")
    parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--hardware", metavar="PROFILE", help="a hardware profile (ttl-plan "
                        "--calibrate) for the planned memory and tokens/s columns")
    args = parser.parse_args(argv)
    try:
        sweep = load_sweep(args.sweep)
    except (SweepError, tomllib.TOMLDecodeError) as e:
        print(f"sweep error: {e}", file=sys.stderr)
        return 2
    changes: dict[str, Any] = {}
    if args.output:
        changes["output_folder"] = Path(args.output)
    if args.steps:
        changes["steps"] = args.steps
    if args.nproc:
        changes["nproc"] = args.nproc
    if args.hardware:
        try:
            load_profile(args.hardware)
        except LayoutError as e:
            print(f"sweep error: {e}", file=sys.stderr)
            return 2
        changes["hardware"] = Path(args.hardware)
    if args.only:
        unknown = set(args.only) - {v.name for v in sweep.variants}
        if unknown:
            print(f"sweep error: --only names no variant: {sorted(unknown)}", file=sys.stderr)
            return 2
        changes["variants"] = tuple(v for v in changes.get("variants", sweep.variants)
                                    if v.name in args.only)
        if sweep.baseline_name not in args.only:
            changes["baseline"] = changes["variants"][0].name
    sweep = dataclasses.replace(sweep, **changes)
    if args.dry_run:
        for v in sweep.variants:
            folder = sweep.output_folder / v.folder_name
            print(" ".join(sweep.command(v, folder)))
        return 0
    results = run_sweep(sweep)
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
