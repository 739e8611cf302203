"""Loss/grad-norm spikes: injected ones are caught under each policy, the shipped default job's
normal curve raises none, and the baseline is deterministic state.

The spike is ``[debug] spike_step``: that step's loss, hence its gradients, times 1e4. Runs of
the tiny model in this process (8 steps, baseline window 4, spike at step 6):

- ``warn``: the spike is logged (console and a metrics.jsonl event) and its update kept, so
  the run goes on, on weights the spike moved;
- ``skip``: its update is discarded (no optimizer or LR-schedule step). The run then equals,
  bitwise (class (a): the same kernels on the same weights and batches), a run whose data
  stream lacks step 6's batches: its steps 7-8 are that run's steps 6-7.

``stop`` ends the run at the ``max_consecutive``-th spike in a row (a unit test below; exit
code 3 with the checkpoints untouched, through ``main``: tests/e2e/test_divergence.py). The
baseline resuming exactly from a checkpoint: tests/unit/test_trackers.py.
"""

import json
import re

import pytest
from harness import ROOT, OmittedStep, build_trainer, read_metrics

from torchtitan_like.components.spikes import SpikeDetector, TrainingDiverged
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Spike
from torchtitan_like.config.manager import build_job_config

SPIKE = ["--training.steps=8", "--spike.window=4", "--debug.spike_step=6"]


def train(overrides, folder, corpus, device, omit_step=0):
    trainer = build_trainer(overrides, folder, corpus, device)
    if omit_step:
        trainer.dataloader = OmittedStep(trainer.dataloader, omit_step,
                                         trainer.grad_accumulation_steps)
    trainer.train()
    records = read_metrics(folder)
    return [r for r in records if "loss" in r], [r for r in records if r.get("spike")]


@pytest.fixture(scope="module")
def runs(one_process_group, corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("spikes")
    return {
        "warn": train([*SPIKE, "--spike.policy=warn"], root / "warn", corpus, one_process_group),
        "skip": train([*SPIKE, "--spike.policy=skip"], root / "skip", corpus, one_process_group),
        "omit": train(["--training.steps=8", "--spike.policy=off"], root / "omit", corpus,
                      one_process_group, omit_step=6),
    }


def test_warn_reports_the_spike_and_keeps_its_update(runs):
    steps, events = runs["warn"]
    assert [r["step"] for r in steps] == list(range(1, 9))  # it went on
    assert [(e["step"], e["spike_update_skipped"]) for e in events] == [(6, False)]
    assert events[0]["spike_loss"] > events[0]["spike_loss_limit"]
    assert steps[6]["loss"] != runs["skip"][0][6]["loss"]  # the spike's update was applied


def test_skip_equals_a_run_without_that_steps_batches(runs):
    (skipped, events), (omitted, none) = runs["skip"], runs["omit"]
    assert [(e["step"], e["spike_update_skipped"]) for e in events] == [(6, True)] and not none
    assert [r["loss"] for r in skipped[:5]] == [r["loss"] for r in omitted[:5]]
    assert [(r["loss"], r["lr"]) for r in skipped[6:]] == [
        (r["loss"], r["lr"]) for r in omitted[5:7]]
    assert skipped[5]["loss"] > 1e3 * omitted[4]["loss"]  # the spike itself, 1e4 x


def test_the_default_jobs_normal_curve_has_no_spike():
    """The default job's recorded per-step curve (tests/assets/debug_model_curve.json, how it
    was made is in the file) under the default [spike] settings: nothing is flagged."""
    curve = json.loads((ROOT / "tests/assets/debug_model_curve.json").read_text())
    config = build_job_config(["--job.config_file", str(ROOT / "train_configs/debug_model.toml")])
    detector = SpikeDetector(config.spike, samples_per_step=8)
    flagged = [step for step, values in enumerate(zip(curve["loss"], curve["grad_norm"],
                                                      strict=True), 1)
               if detector.check(step, dict(zip(("loss", "grad_norm"), values, strict=True))
                                 ).spiked]
    assert len(curve["loss"]) == config.training.steps and flagged == []


def test_the_baseline_round_trips_exactly():
    detector = SpikeDetector(Spike(window=3), samples_per_step=4)
    for step, loss in enumerate([3.0, 2.9, 2.95, 2.7, 40.0], 1):
        detector.check(step, {"loss": loss, "grad_norm": 1 / step})
    again = SpikeDetector(Spike(window=3), samples_per_step=4)
    again.load_state_dict(detector.state_dict())
    assert again.state_dict() == detector.state_dict() and again.holds_checkpoint(5)
    verdicts = [d.check(6, {"loss": 2.8, "grad_norm": 0.2}) for d in (detector, again)]
    assert verdicts[0] == verdicts[1]


def test_stop_ends_the_run_at_the_nth_spike_in_a_row():
    detector = SpikeDetector(Spike(policy="stop", window=3, max_consecutive=2), samples_per_step=4)
    events = []
    for step in (1, 2, 3, 4):
        assert not detector.skips_update(step, 3.0 - step / 10, 1.0, events.append)
    assert detector.skips_update(5, 1e4, 1.0, events.append)  # the first: skipped, runs on
    with pytest.raises(TrainingDiverged, match="step 6: 2 loss/grad-norm spike"):
        detector.skips_update(6, 1e4, 1.0, events.append)
    assert [(e["step"], e["spike_streak"]) for e in events] == [(5, 1), (6, 2)]


@pytest.mark.parametrize(("args", "message"), [
    (["--debug.slow_rank=2"], "[debug] slow_rank = 2: must be -1 (off) or a rank in 0..1"),
])
def test_a_fault_that_can_never_fire_is_refused(args, message):
    """(Fields of spikes, faults and trackers whose switch is off are settings without
    effect, named at start-up: tests/unit/test_switches.py.)"""
    from torchtitan_like.components.fault_injection import validate_faults

    config = build_job_config(args)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_faults(config, 2)
