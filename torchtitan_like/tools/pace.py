"""The machine's pace against its profile's: calibrate.py's fixed probe (``measure_pace``), read
at the start and the end of ``ttl-plan --calibrate`` and before and after ``--verify``'s
steps, set reading against reading. On a shared host the same code runs 1.5-3x slower for an
hour at a time (docs/measurements.md); a prediction from a profile measured in the other state
cannot know it, and a profile measured while the pace moved is itself of no one state.
"""

from __future__ import annotations

import math

PACE_TOLERANCE = 0.10
"""A pace further than this from the profile's is flagged: by itself it could move the
comparison by the planner's whole 10% bar; the probe repeats within 3% (matmul) and 6%
(dispatch) on a steady machine (calibrate.py: ``measure_pace``)."""


def pace_ratios(profile: dict[str, list[float]], measured: dict[str, list[float]]
                ) -> dict[str, float]:
    """Per probe figure both have, the machine's speed in the verify run over its speed in
    the profile (above 1: faster; a matmul's rate, a dispatch's inverse time), the pair of
    readings (the profile's start and end, the run's before and after) furthest from 1."""
    ratios = {}
    for key in profile.keys() & measured.keys():
        pairs = [now / then if key.endswith("tflops") else then / now
                 for then in profile[key] for now in measured[key]]
        ratios[key] = max(pairs, key=lambda r: abs(math.log(r)))
    return ratios


def paced(ratios: dict[str, float]) -> bool:
    """Whether the machine ran within ``PACE_TOLERANCE`` of its profile's pace."""
    return all(abs(r - 1) <= PACE_TOLERANCE for r in ratios.values())


def pace_lines(ratios: dict[str, float], profile: str) -> list[str]:
    """The printed pace, and a warning when it moved."""
    if not ratios:
        return []
    figures = ", ".join(f"{key.split('_')[0]} {r:.2f}" for key, r in sorted(ratios.items()))
    lines = [f"Pace against {profile} (its fixed probe, read before and after the steps; 1 = "
             f"as calibrated): {figures}"]
    if not paced(ratios):
        lines.append(f"warning: this machine no longer runs at the pace {profile} measured "
                     f"(beyond {PACE_TOLERANCE:.0%}): predicted/measured above compares two "
                     "states of the machine, not only the plan; calibrate again (--calibrate "
                     "with --verify measures both in one launch) when the machine is steady")
    return lines


def drift_lines(pace: dict[str, list[float]]) -> list[str]:
    """A warning when the probe moved between the start and the end of one calibration."""
    ratios = pace_ratios(pace, pace)
    if paced(ratios):
        return []
    moved = ", ".join(f"{key.split('_')[0]} {r:.2f}" for key, r in sorted(ratios.items()))
    return [f"warning: the machine's pace moved during the calibration (its fixed probe, end "
            f"against start or start against end: {moved}): the profile is of no one state "
            "of the machine; calibrate again when it is steady"]
