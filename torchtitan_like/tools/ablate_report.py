"""The results of a sweep (tools/ablate_sweep.py, run by tools/ablate.py): what each
variant's metrics.jsonl says, and the table, CSV and chart written from them.

Columns: throughput and MFU are means over the logged steps after the first (which carries
start-up and compilation); memory is the largest logged peak; the final and validation losses
are the last logged; the model's own metrics (``record_metric`` and the ``aux_loss/<name>``
terms of protocols/step_hooks.py) are their last logged values, one column each, for every
name any variant logged. The chart needs matplotlib (the ``plot`` extra); without it the table
says so and the runner prints one line.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchtitan_like.components import stragglers

if TYPE_CHECKING:
    from torchtitan_like.tools.ablate_sweep import Sweep, Variant

TRAINER_KEYS = stragglers.RECORD_KEYS | frozenset({
    "step", "loss", "grad_norm", "lr", "epoch", "tokens_seen", "resumed",  # the loop's
    "tokens_per_second", "tokens_per_second_total", "tflops", "mfu", "mfu_peak_tflops",
    "memory_gib", "data_loading_percent", "checkpoint_seconds", "validation_seconds",
    "elapsed_seconds", "eta_seconds",  # components/metrics.py and progress.py
})  # and each rank's step times (components/stragglers.py)
"""Keys of a training record that are the trainer's own; the others are the model's."""
TRAINER_PREFIXES = ("data_tokens/", "data_share/")
"""The data mixture's per-source keys (components/data/tokenized.py)."""
NO_CHART = ("No chart: matplotlib is not installed (the `plot` extra: pip install "
            "'torchtitan_like[plot]'); the table above has every figure.")


def model_metric_names(records: list[dict[str, Any]]) -> list[str]:
    """The model's own metrics in training records, sorted: numeric values under keys that
    are neither the trainer's (``TRAINER_KEYS``) nor the data mixture's."""
    return sorted({key for record in records if "loss" in record
                   for key, value in record.items()
                   if key not in TRAINER_KEYS and not key.startswith(TRAINER_PREFIXES)
                   and isinstance(value, (int, float)) and not isinstance(value, bool)})


@dataclasses.dataclass
class Result:
    """One variant's run: its status and metrics.jsonl records."""

    variant: Variant
    nproc: int
    status: str
    """ok, failed (exit N), timeout, or incomplete (fewer steps logged than asked)."""
    wall_seconds: float
    records: list[dict[str, Any]]
    error: str = ""
    planned_memory_gib: float | None = None
    planned_tokens_per_second: float | None = None
    """The planner's tokens/s per device, with a hardware profile (ttl-ablate --hardware)."""

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

    def model_metric(self, name: str) -> float | None:
        """The last logged value of one of the model's own metrics."""
        values = [r[name] for r in self.training if isinstance(r.get(name), (int, float))]
        return values[-1] if values else None


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """A run's metrics.jsonl records, up to a line a crash cut short."""
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


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else \
        format(value, spec)


def _loss_delta(result: Result, baseline: Result | None) -> float | None:
    if baseline is None or result.final_loss is None or baseline.final_loss is None:
        return None
    return result.final_loss - baseline.final_loss


CSV_COLUMNS = ["variant", "status", "nproc", "steps_logged", "tokens_per_second", "mfu_percent",
               "peak_memory_gib", "planned_memory_gib", "planned_tokens_per_second",
               "final_loss", "loss_delta",
               "validation_loss", "wall_seconds", "error", "overrides"]


def _model_metrics(results: list[Result]) -> list[str]:
    """Every model metric any variant logged (one column each)."""
    return sorted({name for r in results for name in model_metric_names(r.records)})


def write_csv(path: Path, results: list[Result], baseline: Result | None) -> None:
    """One row per variant: ``CSV_COLUMNS``, then the model metrics' columns."""
    metrics = _model_metrics(results)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*CSV_COLUMNS, *metrics])
        for r in results:
            training = r.training
            writer.writerow([
                r.variant.name, r.status, r.nproc, training[-1]["step"] if training else 0,
                _fmt(r.tokens_per_second, ".6g"), _fmt(r.mfu, ".6g"), _fmt(r.memory_gib, ".6g"),
                _fmt(r.planned_memory_gib, ".6g"), _fmt(r.planned_tokens_per_second, ".6g"),
                _fmt(r.final_loss, ".6g"),
                _fmt(_loss_delta(r, baseline), ".6g"),
                _fmt(r.validation_loss, ".6g"), f"{r.wall_seconds:.1f}", r.error,
                " ".join(r.variant.overrides), *(_fmt(r.model_metric(m), ".6g") for m in metrics),
            ])


def write_markdown(path: Path, sweep: Sweep, results: list[Result], baseline: Result | None,
                   chart_note: str) -> None:
    """The table (model metrics as the last columns), the failures, the variants, the chart."""
    metrics = _model_metrics(results)
    lines = [
        f"# Ablation: {sweep.base_config.name}, {sweep.steps} steps",
        "",
        f"Base config `{sweep.base_config}`; common overrides "
        f"`{' '.join(sweep.overrides) or '(none)'}`; baseline: **{sweep.baseline_name}**. "
        "tokens/s is per device (TorchTitan's tps) and with MFU the mean over the logged steps "
        "after the first; peak memory is the largest logged (CUDA: allocated by tensors; CPU: "
        "the process's peak RSS, torch's own memory included); planned is the planner's peak "
        "tensor memory per rank for the variant's config (and, with ttl-ablate --hardware, its "
        "tokens/s per device on that measured machine); Δ loss is the final loss minus the "
        "baseline's; val loss is the last validation loss (the same held-out sequences under "
        "every layout); the model's own metrics, if any, follow with their last logged value.",
        "",
        "| variant | procs | status | tokens/s | planned tokens/s | MFU % | peak memory GiB "
        "| planned GiB | final loss | Δ loss | val loss | wall s |"
        + "".join(f" {m} |" for m in metrics),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(metrics),
    ]
    for r in results:
        delta = _loss_delta(r, baseline)
        lines.append(
            f"| {r.variant.name} | {r.nproc} | {r.status} | {_fmt(r.tokens_per_second, ',.0f')} "
            f"| {_fmt(r.planned_tokens_per_second, ',.0f')} "
            f"| {_fmt(r.mfu, '.2f')} | {_fmt(r.memory_gib, '.3f')} "
            f"| {_fmt(r.planned_memory_gib, '.3f')} | {_fmt(r.final_loss, '.4f')} "
            f"| {_fmt(delta, '+.4f')} | {_fmt(r.validation_loss, '.4f')} "
            f"| {r.wall_seconds:.0f} |" + "".join(f" {_fmt(r.model_metric(m), '.4g')} |"
                                                  for m in metrics)
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
        return NO_CHART
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


def write_results(sweep: Sweep, results: list[Result], folder: Path) -> bool:
    """results.csv, results.md and results.png (when matplotlib is there) into ``folder``;
    whether the chart was drawn."""
    baseline = next((r for r in results if r.variant.name == sweep.baseline_name
                     and r.status == "ok"), None)
    write_csv(folder / "results.csv", results, baseline)
    note = write_chart(folder / "results.png", results, sweep.baseline_name)
    write_markdown(folder / "results.md", sweep, results, baseline, note)
    return note != NO_CHART
