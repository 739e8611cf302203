"""The machine's pace against its profile's: calibrate.py's fixed probe (``measure_pace``), read
at the start and the end of ``ttl-plan --calibrate`` and before and after ``--verify``'s
steps. On a shared host the same code runs 1.5-3x slower for an hour at a time
(docs/measurements.md); a prediction from a profile measured in the other state cannot know it.

The readings become one figure per probe (``pace_ratios``: the run's speed over the profile's,
geometric means of each side's readings), and those one figure for the job (``step_shift``):
how much they alone move its predicted step, each term at the pace of the probe that stands for
it (the device's compute at the matmul's, the host's dispatch at the dispatch's; the
communication and the bubble as predicted). A job of large matmuls is not flagged for a
dispatch that moved, a tiny job is.
"""

from __future__ import annotations

import math
import statistics

PACE_TOLERANCE = 0.10
"""A step shift beyond this is flagged: by itself it could move the comparison by the
planner's whole 10% bar. The probe's own noise stays under it: ten readings in a row on two
processes spread 2.8% (matmul) and 5.3% (dispatch) in one hour of the unsteady 2-core Xeon,
6.4% and 14.5% in another, and a shift weighs each figure by its share of the step
(docs/measurements.md, 2026-12-05 fourth session)."""
PROBED_BY = {"gemm": "matmul_tflops", "attention": "matmul_tflops",
             "memory_bound": "matmul_tflops", "recompute": "matmul_tflops",
             "grad_accumulation": "matmul_tflops", "optimizer": "matmul_tflops",
             "host": "dispatch_us"}
"""The probe figure each step term moves with (StepTime's names); the rest do not move."""


def pace_ratios(profile: dict[str, list[float]], measured: dict[str, list[float]]
                ) -> dict[str, float]:
    """Per probe figure both have, the machine's speed in the run over its speed in the
    profile (above 1: faster; a matmul's rate, a dispatch's inverse time), each side the
    geometric mean of its readings."""
    ratios = {}
    for key in sorted(profile.keys() & measured.keys()):
        log_speed = statistics.fmean(map(math.log, measured[key])) \
            - statistics.fmean(map(math.log, profile[key]))
        ratios[key] = math.exp(log_speed if key.endswith("tflops") else -log_speed)
    return ratios


def step_shift(ratios: dict[str, float], parts: dict[str, float]) -> float:
    """The relative change of a predicted step (``parts``: StepTime's, seconds) when each
    term runs at the pace its probe moved by (``PROBED_BY``); 0 without readings."""
    total = sum(parts.values())
    moved = sum(seconds / ratios.get(PROBED_BY.get(name, ""), 1.0)
                for name, seconds in parts.items())
    return moved / total - 1 if total > 0 else 0.0


def paced(shift: float) -> bool:
    """Whether the machine's pace moved the step by no more than ``PACE_TOLERANCE``."""
    return abs(shift) <= PACE_TOLERANCE


def pace_lines(ratios: dict[str, float], shift: float, profile: str) -> list[str]:
    """The printed pace and its shift of the step, and a warning beyond the tolerance."""
    if not ratios:
        return []
    figures = ", ".join(f"{key.split('_')[0]} {r:.2f}" for key, r in ratios.items())
    lines = [f"Pace against {profile} (its fixed probe, before and after the steps; 1 = as "
             f"calibrated): {figures}; at these paces the predicted step moves by "
             f"{shift:+.1%}"]
    if not paced(shift):
        lines.append(f"warning: this machine no longer runs at the pace {profile} measured "
                     f"(beyond {PACE_TOLERANCE:.0%} of the step): predicted/measured above "
                     "compares two states of the machine, not only the plan; calibrate "
                     "again (--calibrate with --verify measures both in one launch) when the "
                     "machine is steady")
    return lines
