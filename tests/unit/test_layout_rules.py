"""The trainer's start-up validation and the planner give the same verdict on every layout.

Both call the same rule functions (distributed/layout_rules.py); this runs both over a grid of
layouts of the debug model (6 layers, 16 heads, vocab 2048) that crosses every rule: TP that
does or does not divide the heads and the sequence, CP with and without the head-tail balancer,
every pipeline schedule family with microbatch counts below, at and above what torch requires,
more stages than layers, and global batches that do or do not divide. The runtime side is
``parse_args`` (the trainer's front door); the planner side reads the same config and checks
the layout (``from_job_config`` + ``validate_layout``). A layout refused by one and accepted by
the other fails the test, naming the layout and the message.
"""

import itertools
import random

import pytest
from layouts import CP2, ETP2, PP2, TP2

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import build_job_config
from torchtitan_like.distributed import cp_cpu_sdpa, layout_rules
from torchtitan_like.tools.planner import (
    CPU,
    Cluster,
    LayoutError,
    from_job_config,
    validate_layout,
)
from torchtitan_like.validate import parse_args

BASE = ["--job.config_file", "train_configs/debug_model.toml"]
SCHEDULES = ["1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "ZBVZeroBubble", "DualPipeV"]


def grid() -> list[dict]:
    """About 200 layouts: a fixed-seed sample of the full product (which is 20,736)."""
    cps = [1, 2] if cp_cpu_sdpa.check_supported() is None else [1]
    full = [dict(zip(("tp", "cp", "pp", "schedule", "seq", "balancer", "local", "mbs",
                      "global_batch"), values, strict=True))
            for values in itertools.product([1, 2, 3, 4], cps, [1, 2, 4, 8], SCHEDULES,
                                            [256, 250, 96], ["headtail", "none"], [2, 4, 8],
                                            [1, 2, 3], [-1, 16, 24])]
    return random.Random(0).sample(full, 200)


def argv(case: dict) -> list[str]:
    return [*BASE, "--parallelism.tensor_parallel_degree", str(case["tp"]),
            "--parallelism.context_parallel_degree", str(case["cp"]),
            "--parallelism.context_parallel_load_balancer", case["balancer"],
            "--parallelism.pipeline_parallel_degree", str(case["pp"]),
            "--parallelism.pipeline_parallel_schedule", case["schedule"],
            "--parallelism.pipeline_parallel_microbatch_size", str(case["mbs"]),
            "--training.seq_len", str(case["seq"]),
            "--training.local_batch_size", str(case["local"]),
            "--training.global_batch_size", str(case["global_batch"])]


def runtime_verdict(args: list[str], world: int) -> str | None:
    try:
        parse_args(args, world)
    except ConfigError as e:
        return str(e)
    return None


def planner_verdict(args: list[str], world: int) -> str | None:
    try:
        model, work, layout = from_job_config(build_job_config(args), world)
        validate_layout(model, Cluster(CPU, gpus_per_node=world), work, layout)
    except (ConfigError, LayoutError) as e:
        return str(e)
    return None


def test_runtime_and_planner_agree_on_every_layout():
    cases = grid()
    refused = 0
    for case in cases:
        world = 2 * case["tp"] * case["cp"] * case["pp"]  # FSDP over 2 ranks
        runtime = runtime_verdict(argv(case), world)
        planner = planner_verdict(argv(case), world)
        assert (runtime is None) == (planner is None), (case, runtime, planner)
        refused += runtime is not None
    # The grid exercises both verdicts.
    assert 0.2 * len(cases) < refused < 0.95 * len(cases)


def test_the_rules_the_planner_used_to_get_wrong():
    # vocab_size % tp is a rule; the FFN width is not (DTensor shards it unevenly).
    with pytest.raises(ConfigError, match="vocab_size = 2049"):
        layout_rules.check_tensor_parallel_shapes(2, 16, 16, 2049, "model")
    layout_rules.check_tensor_parallel_shapes(2, 16, 16, 2048, "model")
    # seq_len % 2cp only with the head-tail balancer.
    layout_rules.check_context_parallel(2, 1, 250, "none")
    with pytest.raises(ConfigError, match="headtail"):
        layout_rules.check_context_parallel(2, 1, 250, "headtail")
    # microbatches >= pp only for 1F1B (GPipe and looped schedules take fewer).
    layout_rules.check_microbatches(4, 1, "GPipe", 2, 1)
    layout_rules.check_microbatches(4, 2, "LoopedBFS", 2, 1)
    with pytest.raises(ConfigError, match="at least as many microbatches"):
        layout_rules.check_microbatches(4, 1, "1F1B", 2, 1)
    # Stage placement: looped, or V-shaped.
    assert layout_rules.stage_ids(1, 4, 2, "Interleaved1F1B") == [1, 5]
    assert layout_rules.stage_ids(1, 4, 2, "ZBVZeroBubble") == [1, 6]
    # The global batch defaults to local x dp.
    assert layout_rules.global_batch(-1, 4, 8) == 32
    assert layout_rules.accumulation_steps(64, 4, 8) == 2


MOE_BASE = ["--job.config_file", "train_configs/deepseek_v3_debug.toml"]

MTP = ["--model.overrides.mtp_depth", "1"]
PP2_MB1 = [*PP2, "--training.local_batch_size=2",
           "--parallelism.pipeline_parallel_microbatch_size=1"]


@pytest.mark.parametrize(("flavor", "dims", "accepted"), [
    ("debugmodel", CP2, True),  # MLA under CP: values padded for the ring
    ("debugmodel_aux", CP2, True),  # whole-sequence expert counts summed over the CP ranks
    ("debugmodel_aux", [*TP2, *ETP2], True),  # each TP rank adds 1/tp of the aux gradient
    ("debugmodel", [*MTP, *CP2], False),  # MTP shifts whole sequences: not under CP
    ("debugmodel", [*MTP, "--compile.enable", "true"], False),  # nor beside compiled blocks
    ("debugmodel", [*MTP, *PP2_MB1], True),  # on the last stage, the embedding tied to it
])
def test_runtime_and_planner_agree_on_moe_layouts(flavor, dims, accepted):
    args = [*MOE_BASE, "--model.flavor", flavor, *dims]
    runtime, planner = runtime_verdict(args, 2), planner_verdict(args, 2)
    assert (runtime is None) == (planner is None) == accepted, (runtime, planner)
