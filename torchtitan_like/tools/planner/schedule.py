"""Pipelines as the planner walks them: the stages each rank holds, the order of its
forwards and backwards, the microbatches in flight, and the bubble.

Stages are the trainer's split (``balance_layers``: embedding and head weigh one block each by
default), placed as the trainer places them (``layout_rules.stage_ids``: rank r holds stage r
under 1F1B and GPipe, stages r, r + pp, ... under the looped multi-stage schedules, r and
2pp - 1 - r under the V-shaped ones). The order is torch's (``schedule_order``): 1F1B keeps at
most pp - r microbatches in flight on rank r, GPipe all m, interleaved 1F1B (v - 1) k +
2 (pp - 1 - r) + 1 model chunks (k = microbatches per round, pp when m is a multiple of pp;
Narayanan et al., 2021). The zero-bubble and V-shaped schedules are walked and timed as
interleaved 1F1B (their split backward is not modelled).
"""

from __future__ import annotations

import functools

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.layout_rules import stage_ids
from torchtitan_like.distributed.pipeline import balance_layers
from torchtitan_like.tools.planner.inputs import Layout, LayoutError, ModelShape


def bubble_fraction(pp: int, microbatches: int, schedule: str = "1F1B",
                    virtual_stages: int = 2) -> float:
    """Idle share of a pipelined step: (pp - 1)/(m + pp - 1); interleaved with v chunks per
    rank, (pp - 1)/(v m + pp - 1)."""
    if pp == 1:
        return 0.0
    m = microbatches * (virtual_stages if schedule == "Interleaved1F1B" else 1)
    return (pp - 1) / (m + pp - 1)


def bubble_formula(layout: Layout, microbatches: int) -> str:
    """The formula ``bubble_fraction`` applies to ``layout``, with its numbers."""
    if layout.pp == 1:
        return ""
    if layout.modelled_schedule == "Interleaved1F1B":
        return (f"(pp-1)/(v*m+pp-1) with pp {layout.pp}, v {layout.stages_per_rank}, "
                f"m {microbatches}")
    return f"(pp-1)/(m+pp-1) with pp {layout.pp}, m {microbatches}"


def stage_split(n_layers: int, layout: Layout) -> list[int]:
    """Blocks of each of the pp x v pipeline stages, as the trainer cuts them
    (distributed/pipeline.py: ``balance_layers``, the embedding and the head weighing
    ``pp_embedding_weight`` and ``pp_output_weight`` blocks)."""
    try:
        return list(_balanced(n_layers, layout.pp * layout.stages_per_rank,
                              layout.pp_embedding_weight, layout.pp_output_weight))
    except ConfigError as e:  # more stages than layers: the trainer's rule
        raise LayoutError(str(e)) from None


@functools.lru_cache(maxsize=1024)
def _balanced(n_layers: int, stages: int, first: float, last: float) -> tuple[int, ...]:
    return tuple(balance_layers(n_layers, stages, first, last)) if stages > 1 else (n_layers,)


def rank_layers(m: ModelShape, layout: Layout, rank: int) -> int:
    """Blocks PP rank ``rank`` holds, over its stages."""
    split = stage_split(m.n_layers, layout)
    return sum(split[i] for i in rank_stages(layout, rank))


def busiest_rank_layers(m: ModelShape, layout: Layout) -> int:
    """Blocks of the PP rank holding the most: the pipeline runs at its pace."""
    return _busiest(m.n_layers, layout)


@functools.lru_cache(maxsize=1024)
def _busiest(n_layers: int, layout: Layout) -> int:
    split = stage_split(n_layers, layout)
    return max(sum(split[i] for i in rank_stages(layout, r)) for r in range(layout.pp))


def rank_stages(layout: Layout, rank: int) -> list[int]:
    """The stages PP rank ``rank`` holds, in the trainer's placement."""
    return stage_ids(rank, layout.pp, layout.stages_per_rank, layout.pp_schedule)


def schedule_order(layout: Layout, rank: int, microbatches: int) -> list[tuple[str, int]]:
    """The forwards ("F") and full backwards ("B") PP rank ``rank`` runs in one step, in
    order, each with the index of the local stage it runs (0 .. v-1), as
    torch.distributed.pipelining's schedules order them (Narayanan et al., 2021):

    - without PP, gradient accumulation: F B, m times;
    - GPipe: m forwards, then m backwards;
    - 1F1B: w = min(m, pp - r) warm-up forwards, then B F pairs, then the last w backwards,
      so rank r holds at most pp - r microbatches;
    - Interleaved1F1B with v stages per rank: microbatches go in rounds of
      k = m / max(1, m // pp); forward i runs local stage (i // k) mod v, backward j local stage
      v - 1 - (j // k) mod v; w = min((v - 1) k + 2 (pp - 1 - r), m v) warm-up forwards, then
      F B pairs, then the last w backwards.
    """
    m, pp = microbatches, layout.pp
    if pp == 1:
        return [("F", 0), ("B", 0)] * m
    if layout.modelled_schedule == "GPipe":
        return [("F", 0)] * m + [("B", 0)] * m
    if layout.stages_per_rank == 1:  # 1F1B
        warmup = min(m, pp - rank)
        return [("F", 0)] * warmup + [("B", 0), ("F", 0)] * (m - warmup) + [("B", 0)] * warmup
    v = layout.stages_per_rank
    per_round = m // max(1, m // pp)
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)
    order = [("F", (i // per_round) % v) for i in range(warmup)]
    for i in range(warmup, total):
        order += [("F", (i // per_round) % v), ("B", v - 1 - ((i - warmup) // per_round) % v)]
    return order + [("B", v - 1 - (j // per_round) % v) for j in range(total - warmup, total)]


def in_flight_peak(layout: Layout, rank: int, microbatches: int) -> list[int]:
    """Per local stage, the microbatches it holds when this rank holds the most in all."""
    counts = [0] * layout.stages_per_rank
    best = list(counts)
    for kind, chunk in schedule_order(layout, rank, microbatches):
        counts[chunk] += 1 if kind == "F" else -1
        if sum(counts) > sum(best):
            best = list(counts)
    return best


@functools.lru_cache(maxsize=256)
def checkpointed(ac: str, layers: int) -> tuple[bool, ...]:
    """Which of ``layers`` consecutive blocks are fully checkpointed under ``ac``."""
    if ac == "full":
        return (True,) * layers
    if ac.isdigit():
        return tuple(i % int(ac) == 0 for i in range(layers))
    return (False,) * layers
