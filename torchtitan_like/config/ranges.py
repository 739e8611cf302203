"""Range checks of numeric fields, from the bounds declared next to each field (``ranged``).

A number out of range would otherwise fail later and far away (``eps = -1`` as NaN losses,
``lr = inf`` after the first step); here it is one line at start-up naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

_CHECKS = {
    "ge": (operator.ge, ">="),
    "gt": (operator.gt, ">"),
    "le": (operator.le, "<="),
    "lt": (operator.lt, "<"),
}


def _section_problems(section: str, values: Any) -> list[str]:
    problems = []
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        where = f"[{section}] {f.name} = {value!r}"
        if not math.isfinite(value):
            problems.append(f"{where}: must be a finite number")
            continue
        bounds = f.metadata.get("range", {})
        if any(not check(value, bounds[name]) for name, (check, _) in _CHECKS.items()
               if name in bounds):
            allowed = " and ".join(f"{symbol} {bound}" for name, (_, symbol) in _CHECKS.items()
                                   if (bound := bounds.get(name)) is not None)
            problems.append(f"{where}: must be {allowed}")
    return problems


def out_of_range(config: Any) -> list[str]:
    """One line per numeric field of ``config`` (a JobConfig) outside its declared range."""
    return [problem for section in dataclasses.fields(config)
            for problem in _section_problems(section.name, getattr(config, section.name))]
