"""The planner against published runs, held out (docs/planner-throughput.md).

Each row is a real run with the inputs its source states and says which it assumes
(tools/planner/published.py). The planner's fitted numbers (tools/planner/calibration.py) are
each fitted on named rows (holdout.FIT_ROWS); leave-one-out predicts every row with every
number refitted without it. The tests hold those held-out predictions, not the in-sample ones:
tokens/s (or MFU) within 25% of the published figure, the reserved memory within 15%; every
fitted number must improve the held-out table more than it harms it against its null
(calibration.NULLS: what the model would use without it), so a number the held-out rows
cannot justify goes; the shipped numbers are the fit on every row; the docs' tables and the
record ttl-plan reads its error band from are the ones the planner prints today.
"""

import math
from pathlib import Path

import pytest

from torchtitan_like.tools.planner import holdout
from torchtitan_like.tools.planner.calibration import CALIBRATION, NULLS
from torchtitan_like.tools.planner.heldout_record import HELD_OUT
from torchtitan_like.tools.planner.holdout_tables import LIMIT, MEMORY_LIMIT, all_tables, record
from torchtitan_like.tools.planner.published import PUBLISHED_RUNS

ROOT = Path(__file__).resolve().parents[2]
ROWS = holdout.published_rows()
TABLE = holdout.held_out(ROWS)
NAMES = [run.name for run in PUBLISHED_RUNS]


@pytest.mark.parametrize("held", TABLE, ids=NAMES)
def test_every_held_out_prediction_within_its_limit(held):
    r = held.row.run
    assert abs(held.throughput - 1) <= LIMIT, (r.name, held.throughput, r.assumed)
    if held.memory is not None:
        assert abs(held.memory - 1) <= MEMORY_LIMIT, (r.name, held.memory)


@pytest.fixture(scope="module")
def judged():
    return holdout.justifications(ROWS, TABLE)


def test_every_fitted_number_improves_the_held_out_table_more_than_it_harms_it(judged):
    """Against its null with the other numbers refitted: the summed |log error| it removes
    from the rows it improves exceeds what it adds to the rows it harms."""
    assert [j.name for j in judged] == list(NULLS)
    for j in judged:
        assert j.improves > j.harms, j


def test_the_shipped_numbers_are_the_fit_on_every_row():
    fitted = holdout.fit(ROWS)
    for name in NULLS:
        assert getattr(fitted, name) == pytest.approx(getattr(CALIBRATION, name), rel=2e-3), name


def test_no_row_is_judged_by_a_number_fitted_to_it():
    """Refitting without a row changes the numbers it is fitted to (so the held-out figure is
    a prediction), and each number is fitted on published rows only, two at least."""
    for name, rows in holdout.FIT_ROWS.items():
        assert len(rows) >= 2 and set(rows) <= set(NAMES), name
    first = next(r for r in ROWS if r.run.name == holdout.FIT_ROWS["eager_passes"][0])
    without = holdout.fit([r for r in ROWS if r is not first])
    assert without.eager_passes != pytest.approx(CALIBRATION.eager_passes, rel=1e-4)


def test_every_row_states_its_source_and_inputs():
    for run in PUBLISHED_RUNS:
        assert run.source and run.inputs and f"seq {run.work.seq_len}" in run.inputs
        assert bool(run.tokens_per_second_per_gpu) != bool(run.mfu)


def test_docs_tables_and_the_ttl_plan_record_are_current(judged):
    docs = (ROOT / "docs" / "planner-throughput.md").read_text()
    for table in all_tables(TABLE, judged).split("\n\n"):
        assert table in docs, "regenerate: python scripts/plan_published.py"
    fresh = record(TABLE)
    assert fresh.keys() == HELD_OUT.keys(), "python scripts/plan_published.py --record"
    for name, (throughput, memory, shares) in fresh.items():
        kept = HELD_OUT[name]
        assert throughput == pytest.approx(kept[0], abs=1e-3), name
        assert (memory is None) == (kept[1] is None), name
        assert memory is None or memory == pytest.approx(kept[1], abs=1e-3), name
        assert shares.keys() == kept[2].keys() and all(
            math.isclose(v, kept[2][k], abs_tol=0.011) for k, v in shares.items()), name
