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


INT_LIMIT = 2**63
"""Integers must fit 64 bits (torch's int64, TOML's integers): larger ones overflow later."""


def _value_problem(value: Any, bounds: dict[str, float]) -> str | None:
    """Why one number is out of range, or None."""
    if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
        return "must fit in a 64-bit integer"
    if not math.isfinite(value):
        return "must be a finite number"
    if any(not check(value, bounds[name]) for name, (check, _) in _CHECKS.items()
           if name in bounds):
        return "must be " + " and ".join(f"{symbol} {bound}" for name, (_, symbol)
                                         in _CHECKS.items() if (bound := bounds.get(name))
                                         is not None)
    return None


def _numbers(value: Any) -> list[Any]:
    """The numbers of a field's value: itself, or the items of a list or table of numbers."""
    items = value.values() if isinstance(value, dict) else value if isinstance(
        value, list) else [value]
    return [v for v in items if isinstance(v, int | float) and not isinstance(v, bool)]


def _section_problems(section: str, values: Any) -> list[str]:
    problems = []
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        if isinstance(value, dict | list) and "range" not in f.metadata:
            continue  # free-form tables ([model] overrides) are checked by their consumer
        for number in _numbers(value):
            if problem := _value_problem(number, f.metadata.get("range", {})):
                problems.append(f"[{section}] {f.name} = {value!r}: {problem}")
                break
    return problems


def out_of_range(config: Any) -> list[str]:
    """One line per numeric field of ``config`` (a JobConfig) outside its declared range."""
    return [problem for section in dataclasses.fields(config)
            for problem in _section_problems(section.name, getattr(config, section.name))]
