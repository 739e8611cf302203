"""A model's own loss term and metrics (protocols/step_hooks.py) are layout-independent.

The tiny Llama of zloss_llama.py adds a z-loss-like term on every block's output through the
loss hook and records metrics (sum, max, mean, and a derived one that under PP only the last
stage can derive). One launch of 2 processes trains it under FSDP=2 (with and without
gradient accumulation and full activation checkpointing) and PP=2 (1F1B and GPipe, full AC);
one launch of 1 process gives the reference, plus the plain model to show the term matters.

Tolerance: fp32 and deterministic kernels; the layouts compute the same sums of the same
per-token values cut into other microbatches and reduced in another order, so the losses and
the logged values differ by rounding only: a few ulp of fp32 per reduction, ~1e-6 relative
(measured: loss <= 1.7e-7 relative, logged values <= 7e-8). 1e-5 (absolute on the loss,
relative on the logged values) still catches a wrong normalisation: a term counted once per
rank or twice under recomputation moves aux_loss/z by ~50% and the loss by > 1e-3.
"""

from pathlib import Path

import pytest
from harness import assert_close, launch_layouts, losses
from layouts import PP2_MICROBATCHES as PP2

TOL = 1e-5
ZLOSS = ["--job.custom_import", str(Path(__file__).parent / "zloss_llama.py"),
         "--model.name", "llama3_zloss"]
FULL_AC = ["--activation_checkpoint.mode=full"]
METRICS = ["aux_loss/z", "z/tokens", "z/max", "z/mean", "z/last_mean"]

LAYOUTS = {
    1: {"reference": [*ZLOSS, "--training.local_batch_size=4",
                      "--metrics.enable_tensorboard=true"],
        "plain": ["--training.local_batch_size=4"]},
    2: {"fsdp2": ZLOSS,
        "fsdp2_accumulation_full_ac": [*ZLOSS, "--training.local_batch_size=1", *FULL_AC],
        "pp2_full_ac": [*ZLOSS, *PP2, *FULL_AC],
        "pp2_gpipe": [*ZLOSS, *PP2, "--parallelism.pipeline_parallel_schedule=GPipe"]},
}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("model_hooks")
    results = launch_layouts(LAYOUTS, root, corpus)
    results["_root"] = root
    return results


def series(records: list[dict], name: str) -> list[float]:
    return [r[name] for r in records if "loss" in r]


def test_the_term_changes_training_and_is_logged(runs):
    reference = runs["reference"]
    assert abs(losses(reference)[-1] - losses(runs["plain"])[-1]) > 1e-3
    assert all(name not in runs["plain"][0] for name in METRICS)
    # 4 blocks x 4 sequences x 64 tokens per step, in every layout
    assert series(reference, "z/tokens") == [4 * 4 * 64.0] * 5
    assert all(0 < m <= x for m, x in zip(series(reference, "z/mean"), series(reference, "z/max"),
                                           strict=True))
    assert all(value > 0.1 for value in series(reference, "aux_loss/z"))
    events = next((runs["_root"] / "1" / "reference" / "tb").iterdir())
    assert b"aux_loss/z" in events.read_bytes() and b"z/last_mean" in events.read_bytes()


@pytest.mark.parametrize("case", list(LAYOUTS[2]))
def test_layout_matches_one_process(runs, case):
    assert_close(losses(runs[case]), losses(runs["reference"]), TOL)
    for name in METRICS:
        expected = series(runs["reference"], name)
        actual = series(runs[case], name)
        assert_close([a / e for a, e in zip(actual, expected, strict=True)], [1.0] * 5, TOL)
