"""Which source each sample of a weighted mixture comes from: a deterministic schedule.

Sample ``n`` (0-based) goes to the source with the largest *deficit* ``w_s (n + 1) - c_s(n)``
(its due share of the first n + 1 samples minus the samples it has had), ties broken by a
seeded order of the sources. This is Tijdeman's rule for the "chairman assignment" problem: it
keeps ``|c_s(n) - w_s n| <= 1 - 1 / (2k - 2) < 1`` for every prefix n and each of k >= 2
sources, so any prefix holds each source in proportion within one sample. A source of weight 0
has deficit 0 forever while the others' deficits sum to 1, so it is never chosen (and never
read). The arithmetic is in integers (weights as exact fractions over a common denominator),
so no rounding can tip a choice.

The schedule's state is ``n`` and the counts ``c_s``: the next choice depends on nothing else,
so a saved state continues the same sequence.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

from torchtitan_like.config.errors import ConfigError


class MixtureSchedule:
    """The source of each successive sample of the mixed stream, and the counts so far."""

    def __init__(self, weights: dict[str, float], seed: int):
        if not weights or any(not w >= 0 for w in weights.values()):
            raise ConfigError(f"[training] mixture = {weights}: weights must be >= 0")
        exact = {name: Fraction(str(w)) for name, w in weights.items()}
        total = sum(exact.values())
        if total == 0:
            raise ConfigError(f"[training] mixture = {weights}: at least one weight must be > 0")
        self.names = list(weights)
        shares = [exact[name] / total for name in self.names]
        self.denominator = math.lcm(*(s.denominator for s in shares))
        self.scaled = [int(s * self.denominator) for s in shares]  # sum to the denominator
        order = list(range(len(self.names)))
        random.Random(seed).shuffle(order)
        self._tie_rank = {source: -rank for rank, source in enumerate(order)}
        self._active = [s for s, w in enumerate(self.scaled) if w > 0]
        self.samples = 0
        self.counts = [0] * len(self.names)

    def next(self) -> int:
        """The source index of the next sample (counted as taken)."""
        due = self.samples + 1
        source = max(self._active, key=lambda s: (self.scaled[s] * due
                                                  - self.counts[s] * self.denominator,
                                                  self._tie_rank[s]))
        self.counts[source] += 1
        self.samples += 1
        return source

    def shares(self) -> dict[str, float]:
        """The configured weights, normalised to sum to 1."""
        return {name: w / self.denominator for name, w in zip(self.names, self.scaled,
                                                             strict=True)}

    def state_dict(self) -> dict[str, object]:
        return {"samples": self.samples, "counts": dict(zip(self.names, self.counts,
                                                           strict=True))}

    def load_state_dict(self, state: dict[str, object]) -> None:
        counts = state["counts"]
        assert isinstance(counts, dict)
        self.samples = int(state["samples"])  # type: ignore[arg-type]
        self.counts = [int(counts[name]) for name in self.names]
