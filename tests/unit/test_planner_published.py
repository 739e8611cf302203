"""The planner against published training runs (docs/planner-throughput.md).

Each row is a real run with the inputs its source states (sequence length, batch, AC mode,
kernels: see ``inputs`` in tools/planner/published.py). Three rows (TorchTitan's Llama 3.1 8B on
8 H100, eager / compiled / Float8) fix the step-time model's three fitted constants; every
other row is a prediction and must be within 25% of the published tokens/s per GPU, unless the
row states why the model misses it (then the docs say so). Memory is held within 15% where the
memory model claims to count what the run allocates (eager runs: it was never validated on
compiled or Float8 ones). The docs' table must be the one the planner prints today.
"""

from pathlib import Path

import pytest

from torchtitan_like.tools.planner.published import PUBLISHED_RUNS, compare, markdown_table

ROOT = Path(__file__).resolve().parents[2]
COMPARISONS = [compare(run) for run in PUBLISHED_RUNS]


@pytest.mark.parametrize("c", COMPARISONS, ids=[run.name for run in PUBLISHED_RUNS])
def test_throughput_within_25_percent(c):
    if c.run.miss:
        assert not 0.75 <= c.throughput_ratio <= 1.25, "a known miss now passes: update docs"
        return
    assert 0.75 <= c.throughput_ratio <= 1.25, c.run.inputs
    if c.run.fitted:
        assert c.throughput_ratio == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("c", [c for c in COMPARISONS if c.run.memory_modelled],
                         ids=lambda c: c.run.name)
def test_memory_within_15_percent(c):
    assert c.memory_ratio is not None and 0.85 <= c.memory_ratio <= 1.15, c.run.inputs


def test_every_row_states_its_source_and_inputs():
    for run in PUBLISHED_RUNS:
        assert run.source and run.inputs and f"seq {run.work.seq_len}" in run.inputs
        assert bool(run.tokens_per_second_per_gpu) != bool(run.mfu)


def test_docs_table_is_current():
    docs = (ROOT / "docs" / "planner-throughput.md").read_text()
    assert markdown_table() in docs, "regenerate with python scripts/plan_published.py"
