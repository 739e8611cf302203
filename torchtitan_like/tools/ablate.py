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

Each variant runs as its own torchrun job of ``torchtitan_like.train``, launched by the
interpreter running the sweep (``python -m torchtitan_like.launch``: no checkout needed, and a
crash or a hang ends only that variant), with its own dump folder ``{output_folder}/{variant}``,
where its log (``train.log``) and ``metrics.jsonl`` land. The runner reads every metrics.jsonl
and writes ``results.csv``, ``results.md`` and ``results.png`` (matplotlib, the ``plot``
extra) into the output folder. Throughput and MFU are means over the logged steps after the
first (which carries start-up and compilation); memory is the largest logged peak; a failed
variant keeps its status and the last meaningful line of its log.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from torchtitan_like.config.manager import build_job_config, tomllib
from torchtitan_like.tools.planner import CPU, predict_peak

LAUNCH_ENV = {"TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
"""What run_train.sh sets for the trainer, set here too unless the caller's environment has it."""


class SweepError(ValueError):
    """A sweep file that cannot run; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...] = ()
    nproc: int | None = None

    @property
    def folder_name(self) -> str:
        """The name as a folder: letters, digits, '-', '_' and '.' kept, the rest '_'."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.name).strip("_") or "variant"


@dataclasses.dataclass(frozen=True)
class Sweep:
    base_config: Path
    variants: tuple[Variant, ...]
    steps: int = 10
    nproc: int = 1
    baseline: str = ""
    output_folder: Path = Path("outputs/ablations")
    overrides: tuple[str, ...] = ()
    timeout_s: float = 1800.0

    @property
    def baseline_name(self) -> str:
        return self.baseline or self.variants[0].name

    def command(self, variant: Variant, folder: Path) -> list[str]:
        """The launch command of one variant, as run_train.sh would build it on one node
        (torchtitan_like.launch: its last line is the first failing rank's error); the
        variant's overrides win over the sweep's. Every rank's output reaches the log
        (prefixed with its rank). A re-run of the sweep archives a variant's earlier outputs
        (``[job] overwrite``, components/run_folder.py)."""
        return [sys.executable, "-m", "torchtitan_like.launch", "--standalone",
                f"--nproc_per_node={self.nproc_of(variant)}", "--max-restarts=0",
                "--role=rank", "--tee=3",
                "-m", "torchtitan_like.train", "--job.config_file", str(self.base_config),
                *self.overrides, f"--training.steps={self.steps}",
                f"--job.dump_folder={folder}", "--job.overwrite=true", *variant.overrides]

    def nproc_of(self, variant: Variant) -> int:
        return variant.nproc or self.nproc

    def planned_memory_gib(self, variant: Variant) -> float | None:
        """The planner's peak tensor memory per rank for the variant (None when the planner
        cannot model its config): on CUDA comparable with the logged peak; on CPU, where the
        logged peak is the process's RSS, the only view of activation memory."""
        argv = ["--job.config_file", str(self.base_config), *self.overrides, *variant.overrides]
        device = dataclasses.replace(CPU, fused_rms_norm=torch.cuda.is_available())
        try:
            peak = predict_peak(build_job_config(argv), self.nproc_of(variant), device)
        except ValueError:  # a config error (the run will say so) or a model without shapes
            return None
        return peak.total / 2**30


_SWEEP_KEYS = {"base_config", "steps", "nproc", "baseline", "output_folder", "overrides",
               "timeout_s"}
_VARIANT_KEYS = {"name", "overrides", "nproc"}


def _overrides(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SweepError(f"{where}: overrides must be a list of strings like "
                         '"--section.key=value"')
    for item in value:
        if not item.startswith("--"):
            raise SweepError(f"{where}: override {item!r} must look like --section.key=value")
    return tuple(value)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file not found: {path}")
    data = tomllib.loads(path.read_text())
    unknown_sections = set(data) - {"sweep", "variants"}
    if unknown_sections:
        raise SweepError(f"{path}: unknown sections {sorted(unknown_sections)}; a sweep has "
                         "[sweep] and [[variants]]")
    head = data.get("sweep", {})
    unknown = set(head) - _SWEEP_KEYS
    if unknown:
        raise SweepError(f"{path}: unknown [sweep] keys {sorted(unknown)}; known: "
                         f"{', '.join(sorted(_SWEEP_KEYS))}")
    if "base_config" not in head:
        raise SweepError(f"{path}: [sweep] base_config is required (a training TOML)")
    base = (path.parent / head["base_config"]).resolve()
    if not base.is_file():
        raise SweepError(f"{path}: base_config {base} does not exist")

    variants = []
    for i, raw in enumerate(data.get("variants", [])):
        where = f"{path} variant {i + 1}"
        unknown = set(raw) - _VARIANT_KEYS
        if unknown or "name" not in raw:
            raise SweepError(f"{where}: needs a name, may have overrides and nproc "
                             f"(unknown: {sorted(unknown)})")
        variants.append(Variant(str(raw["name"]), _overrides(raw.get("overrides", []), where),
                                raw.get("nproc")))
    if not variants:
        raise SweepError(f"{path}: no [[variants]]")
    names = [v.folder_name for v in variants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SweepError(f"{path}: variant names must differ as folder names: {duplicates}")
    sweep = Sweep(
        base_config=base,
        variants=tuple(variants),
        steps=int(head.get("steps", 10)),
        nproc=int(head.get("nproc", 1)),
        baseline=str(head.get("baseline", "")),
        output_folder=Path(head.get("output_folder", f"outputs/ablations/{path.stem}")),
        overrides=_overrides(head.get("overrides", []), f"{path} [sweep]"),
        timeout_s=float(head.get("timeout_s", 1800)),
    )
    if sweep.baseline_name not in {v.name for v in variants}:
        raise SweepError(f"{path}: baseline {sweep.baseline!r} is not a variant name")
    return sweep


# ---------------------------------------------------------------------------- one variant


@dataclasses.dataclass
class Result:
    variant: Variant
    nproc: int
    status: str
    """ok, failed (exit N), timeout, or incomplete (fewer steps logged than asked)."""
    wall_seconds: float
    records: list[dict[str, Any]]
    error: str = ""
    planned_memory_gib: float | None = None

    @property
    def training(self) -> list[dict[str, Any]]:
        return [r for r in self.records if "loss" in r]

    def _steady_mean(self, key: str) -> float | None:
        values = [r[key] for r in self.training[1:] or self.training if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    @property
    def tokens_per_second(self) -> float | None:
        return self._steady_mean("tokens_per_second")

    @property
    def mfu(self) -> float | None:
        return self._steady_mean("mfu")

    @property
    def memory_gib(self) -> float | None:
        values = [r["memory_gib"] for r in self.training if r.get("memory_gib") is not None]
        return max(values) if values else None

    @property
    def final_loss(self) -> float | None:
        return self.training[-1]["loss"] if self.training else None

    @property
    def validation_loss(self) -> float | None:
        values = [r["validation_loss"] for r in self.records if "validation_loss" in r]
        return values[-1] if values else None


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


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            break
    return records


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


def run_variant(sweep: Sweep, variant: Variant, folder: Path) -> Result:
    """Train one variant in its own torchrun; its output goes to ``folder/train.log``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").unlink(missing_ok=True)  # never read a previous run's records
    nproc = sweep.nproc_of(variant)
    env = {**LAUNCH_ENV, **os.environ}
    start = time.perf_counter()
    log_path = folder / "train.log"
    with log_path.open("w") as log:
        log.write(f"$ {' '.join(sweep.command(variant, folder))}\n")
        log.flush()
        proc = subprocess.Popen(sweep.command(variant, folder), env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=sweep.timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = None
    wall = time.perf_counter() - start
    records = read_metrics(folder)
    result = Result(variant, nproc, "ok", wall, records,
                    planned_memory_gib=sweep.planned_memory_gib(variant))
    steps = [r["step"] for r in result.training]
    if rc is None:
        result.status = "timeout"
        result.error = f"stopped after {sweep.timeout_s:.0f} s ([sweep] timeout_s)"
    elif rc != 0:
        result.status = f"failed (exit {rc})"
        result.error = error_line(log_path.read_text(errors="replace"))
    elif not steps or steps[-1] != sweep.steps:
        result.status = "incomplete"
        result.error = f"logged {steps[-1] if steps else 0} of {sweep.steps} steps"
    return result


# -------------------------------------------------------------------------------- outputs


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else \
        format(value, spec)


def _loss_delta(result: Result, baseline: Result | None) -> float | None:
    if baseline is None or result.final_loss is None or baseline.final_loss is None:
        return None
    return result.final_loss - baseline.final_loss


CSV_COLUMNS = ["variant", "status", "nproc", "steps_logged", "tokens_per_second", "mfu_percent",
               "peak_memory_gib", "planned_memory_gib", "final_loss", "loss_delta",
               "validation_loss", "wall_seconds", "error", "overrides"]


def write_csv(path: Path, results: list[Result], baseline: Result | None) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in results:
            training = r.training
            writer.writerow([
                r.variant.name, r.status, r.nproc, training[-1]["step"] if training else 0,
                _fmt(r.tokens_per_second, ".6g"), _fmt(r.mfu, ".6g"), _fmt(r.memory_gib, ".6g"),
                _fmt(r.planned_memory_gib, ".6g"), _fmt(r.final_loss, ".6g"),
                _fmt(_loss_delta(r, baseline), ".6g"),
                _fmt(r.validation_loss, ".6g"), f"{r.wall_seconds:.1f}", r.error,
                " ".join(r.variant.overrides),
            ])


def write_markdown(path: Path, sweep: Sweep, results: list[Result], baseline: Result | None,
                   chart_note: str) -> None:
    lines = [
        f"# Ablation: {sweep.base_config.name}, {sweep.steps} steps",
        "",
        f"Base config `{sweep.base_config}`; common overrides "
        f"`{' '.join(sweep.overrides) or '(none)'}`; baseline: **{sweep.baseline_name}**. "
        "tokens/s is per device (TorchTitan's tps) and with MFU the mean over the logged steps "
        "after the first; peak memory is the largest logged (CUDA: allocated by tensors; CPU: "
        "the process's peak RSS, torch's own memory included); planned is the planner's peak "
        "tensor memory per rank for the variant's config; Δ loss is the final loss minus the "
        "baseline's.",
        "",
        "| variant | procs | status | tokens/s | MFU % | peak memory GiB | planned GiB "
        "| final loss | Δ loss | wall s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        delta = _loss_delta(r, baseline)
        lines.append(
            f"| {r.variant.name} | {r.nproc} | {r.status} | {_fmt(r.tokens_per_second, ',.0f')} "
            f"| {_fmt(r.mfu, '.2f')} | {_fmt(r.memory_gib, '.3f')} "
            f"| {_fmt(r.planned_memory_gib, '.3f')} | {_fmt(r.final_loss, '.4f')} "
            f"| {_fmt(delta, '+.4f')} | {r.wall_seconds:.0f} |"
        )
    failed = [r for r in results if r.status != "ok"]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- **{r.variant.name}** ({r.status}): `{r.error}`; log: "
                  f"`{r.variant.folder_name}/train.log`" for r in failed]
    lines += ["", "## Variants", ""]
    lines += [f"- **{r.variant.name}**: `{' '.join(r.variant.overrides) or '(no overrides)'}`"
              for r in results]
    lines += ["", chart_note, ""]
    path.write_text("\n".join(lines))


def write_chart(path: Path, results: list[Result], baseline_name: str) -> str:
    """results.png: throughput, MFU, memory and loss curves; returns a line for results.md."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ("No chart: matplotlib is not installed (`pip install -e .[plot]`); the table "
                "above has every figure.")
    ok = [r for r in results if r.training]
    names = [r.variant.name for r in ok]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    bars = [("tokens/s per device", [r.tokens_per_second or 0 for r in ok]),
            ("MFU %", [r.mfu or 0 for r in ok]),
            ("peak memory GiB", [r.memory_gib or 0 for r in ok])]
    for ax, (title, values) in zip(axes.flat, bars, strict=False):
        colors = ["tab:orange" if n == baseline_name else "tab:blue" for n in names]
        ax.barh(names, values, color=colors)
        ax.set_title(title)
        ax.invert_yaxis()
    planned = [(n, r.planned_memory_gib) for n, r in zip(names, ok, strict=True)
               if r.planned_memory_gib is not None]
    if planned:
        axes.flat[2].plot([p for _, p in planned], [n for n, _ in planned], "kx",
                          label="planned (tensors)")
        axes.flat[2].legend(fontsize="small")
    loss_ax = axes.flat[3]
    for r in ok:
        loss_ax.plot([x["step"] for x in r.training], [x["loss"] for x in r.training],
                     label=r.variant.name, marker=".")
    loss_ax.set_title("training loss")
    loss_ax.set_xlabel("step")
    loss_ax.legend(fontsize="small")
    failed = [r.variant.name for r in results if r.status != "ok"]
    title = "baseline (orange): " + baseline_name
    fig.suptitle(title + (f"; not ok: {', '.join(failed)}" if failed else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"![results](results.png)\n\nChart: `{path.name}`."


def write_results(sweep: Sweep, results: list[Result], folder: Path) -> None:
    """results.csv, results.md and results.png (when matplotlib is there) into ``folder``."""
    baseline = next((r for r in results if r.variant.name == sweep.baseline_name
                     and r.status == "ok"), None)
    write_csv(folder / "results.csv", results, baseline)
    note = write_chart(folder / "results.png", results, sweep.baseline_name)
    write_markdown(folder / "results.md", sweep, results, baseline, note)


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
    n = len(sweep.variants)
    for i, variant in enumerate(sweep.variants, 1):
        elapsed = time.perf_counter() - start
        eta = f"ETA {_clock(elapsed / (i - 1) * (n - i + 1))}" if i > 1 else "ETA ?"
        log(f"[{i}/{n}] {variant.name}: {sweep.nproc_of(variant)} process(es) "
            f"(elapsed {_clock(elapsed)}, {eta})")
        result = run_variant(sweep, variant, folder / variant.folder_name)
        results.append(result)
        if result.status == "ok":
            log(f"[{i}/{n}] {variant.name}: ok in {result.wall_seconds:.0f} s, "
                f"{_fmt(result.tokens_per_second, ',.0f')} tokens/s, "
                f"final loss {_fmt(result.final_loss, '.4f')}")
        else:
            log(f"[{i}/{n}] {variant.name}: {result.status.upper()}: {result.error}")
        write_results(sweep, results, folder)  # a sweep cut short still leaves its table
    log(f"done in {_clock(time.perf_counter() - start)}: {folder / 'results.md'}")
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
