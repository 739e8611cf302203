"""Pipeline split (balancing, placement, pruning) and every PP config error, in one process."""

import itertools

import pytest
import torch
from layouts import PP2

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed import pipeline
from torchtitan_like.models.llama3 import Transformer, llama3_flavors, pipeline_llama
from torchtitan_like.validate import parse_args

TINY_PP2 = ["--model.flavor=tiny", *PP2]


def pp_config(*args: str, world_size: int = 2):
    return parse_args([*TINY_PP2, *args], world_size)


def brute_force_heaviest(n_layers, n_stages, first, last):
    """The lightest possible heaviest stage, over every split into non-empty stages."""
    best = float("inf")
    for cuts in itertools.combinations(range(1, n_layers), n_stages - 1):
        sizes = [b - a for a, b in itertools.pairwise((0, *cuts, n_layers))]
        weights = [s + (first if i == 0 else 0) + (last if i == n_stages - 1 else 0)
                   for i, s in enumerate(sizes)]
        best = min(best, max(weights))
    return best


@pytest.mark.parametrize(
    ("n_layers", "n_stages", "first", "last", "expected"),
    [
        (4, 2, 1.0, 1.0, [2, 2]),
        (6, 2, 1.0, 1.0, [3, 3]),
        (4, 4, 1.0, 1.0, [1, 1, 1, 1]),
        (9, 2, 0.0, 3.0, [6, 3]),  # a heavy head leaves the last stage fewer layers
        (8, 2, 0.0, 0.0, [4, 4]),
        (16, 4, 2.0, 2.0, [3, 5, 5, 3]),
    ],
)
def test_balance_layers(n_layers, n_stages, first, last, expected):
    assert pipeline.balance_layers(n_layers, n_stages, first, last) == expected


@pytest.mark.parametrize("n_layers", [5, 7, 10, 13])
@pytest.mark.parametrize("n_stages", [2, 3, 4])
@pytest.mark.parametrize(("first", "last"), [(1.0, 1.0), (0.5, 2.5), (0.0, 1.5)])
def test_balance_layers_minimises_the_heaviest_stage(n_layers, n_stages, first, last):
    sizes = pipeline.balance_layers(n_layers, n_stages, first, last)
    assert sum(sizes) == n_layers and min(sizes) >= 1
    weights = [s + (first if i == 0 else 0) + (last if i == n_stages - 1 else 0)
               for i, s in enumerate(sizes)]
    assert max(weights) == pytest.approx(brute_force_heaviest(n_layers, n_stages, first, last))


def test_stage_placement_looped_and_v_shaped():
    looped = pp_config("--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                       "--parallelism.pipeline_parallel_stages_per_rank=3",
                       "--model.flavor=debugmodel", "--training.local_batch_size=6").parallelism
    assert [pipeline.stage_ids(r, looped) for r in range(2)] == [[0, 2, 4], [1, 3, 5]]
    v = pp_config("--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
                  "--training.local_batch_size=4").parallelism
    assert [pipeline.stage_ids(r, v) for r in range(2)] == [[0, 3], [1, 2]]
    single = pp_config("--training.local_batch_size=2").parallelism
    assert [pipeline.stage_ids(r, single) for r in range(2)] == [[0], [1]]


def test_stages_keep_the_unsplit_parameter_names():
    config = pp_config("--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                       "--training.local_batch_size=4")
    with torch.device("meta"):
        model = Transformer(llama3_flavors["tiny"])
    stages = pipeline_llama(model, [0, 1, 2, 3], config)
    keys = [set(stage.state_dict()) for stage in stages]
    assert set().union(*keys) == set(model.state_dict())
    assert sum(map(len, keys)) == len(model.state_dict())  # each parameter on one stage only
    assert list(stages[1].layers) == ["1"] and stages[1].tok_embeddings is None
    assert stages[0].tok_embeddings is not None and stages[3].output is not None
    assert len(model.layers) == 4  # the original is untouched


def test_automatic_and_explicit_split():
    auto = pp_config("--training.local_batch_size=2")
    assert pipeline.module_fqns_per_stage(
        auto.parallelism, 4, first=["tok_embeddings"], last=["norm", "output"]
    ) == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "output"]]
    explicit = pp_config("--training.local_batch_size=2",
                         "--parallelism.pipeline_parallel_module_fqns_per_stage="
                         "tok_embeddings layers.0,layers.1 layers.2 layers.3 norm output")
    assert pipeline.module_fqns_per_stage(
        explicit.parallelism, 4, first=["tok_embeddings"], last=["norm", "output"]
    ) == [["tok_embeddings", "layers.0"], ["layers.1", "layers.2", "layers.3", "norm", "output"]]


def test_microbatches_and_accepted_layouts():
    config = pp_config("--parallelism.pipeline_parallel_schedule=DualPipeV",
                       "--training.local_batch_size=8",
                       "--parallelism.pipeline_parallel_microbatch_size=2")
    assert pipeline.num_microbatches(config) == 4
    assert pipeline.num_stages(config.parallelism) == 4
    # GPipe and the looped schedules run with fewer microbatches than stages (a larger bubble).
    for schedule in ("GPipe", "LoopedBFS", "ZBVZeroBubble", "Interleaved1F1B"):
        pp_config(f"--parallelism.pipeline_parallel_schedule={schedule}",
                  "--training.local_batch_size=1")


EXPLICIT = "--parallelism.pipeline_parallel_module_fqns_per_stage="


@pytest.mark.parametrize(
    ("args", "world_size", "message"),
    [
        # layers fewer than stages
        (["--training.local_batch_size=8",
          "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"], 4,
         r"4 layers cannot fill 8 pipeline stages \(pipeline_parallel_degree 4 x 2 stages"),
        # microbatches fewer than stages, per torch's requirements
        (["--training.local_batch_size=2", "--parallelism.pipeline_parallel_microbatch_size=2"],
         2, r"'1F1B' needs at least as many microbatches as stages \(2\), but local_batch_size "
            r"2 / pipeline_parallel_microbatch_size 2 = 1"),
        (["--parallelism.pipeline_parallel_schedule=DualPipeV", "--training.local_batch_size=2"],
         2, r"'DualPipeV' needs at least as many microbatches as stages \(4 = 2 x 2\)"),
        (["--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
          "--training.local_batch_size=5"], 2,
         r"= 2 equal rounds, but .* = 5 microbatch\(es\) do not divide"),
        (["--parallelism.pipeline_parallel_schedule=InterleavedZeroBubble",
          "--training.local_batch_size=7"], 2, r"= 3 equal rounds"),
        # local batch not divisible by the microbatch size
        (["--training.local_batch_size=6", "--parallelism.pipeline_parallel_microbatch_size=4"],
         2, r"local_batch_size = 6 must be divisible by .*pipeline_parallel_microbatch_size = 4"),
        (["--parallelism.pipeline_parallel_microbatch_size=0"], 2, r"microbatch_size = 0"),
        # unknown schedule: the valid ones are listed
        (["--parallelism.pipeline_parallel_schedule=ZeroBubble"], 2,
         r"expected one of 'GPipe', '1F1B', 'Interleaved1F1B', 'LoopedBFS', "
         r"'InterleavedZeroBubble', 'ZBVZeroBubble', 'DualPipeV'"),
        # stages per rank against the schedule
        (["--parallelism.pipeline_parallel_schedule=ZBVZeroBubble", "--training.local_batch_size=8",
          "--parallelism.pipeline_parallel_stages_per_rank=3", "--model.flavor=debugmodel"], 2,
         r"'ZBVZeroBubble' needs exactly 2 stages per rank .* but 3"),
        (["--parallelism.pipeline_parallel_stages_per_rank=2"], 2,
         r"'1F1B' runs one stage per rank, but 2 are configured"),
        (["--parallelism.pipeline_parallel_schedule=LoopedBFS",
          "--parallelism.pipeline_parallel_stages_per_rank=1"], 2,
         r"'LoopedBFS' interleaves several stages per rank, but 1"),
        (["--parallelism.pipeline_parallel_stages_per_rank=-1"], 2, r"stages_per_rank: must be"),
        (["--parallelism.pipeline_parallel_output_weight=-1"], 2, r"weight = -1.0: must be >= 0"),
        # what cannot run two backward passes through one graph (zero-bubble schedules)
        (["--parallelism.pipeline_parallel_schedule=ZBVZeroBubble", "--training.local_batch_size=4",
          "--activation_checkpoint.mode=selective"], 2, r"op-level selective activation"),
        (["--parallelism.pipeline_parallel_schedule=InterleavedZeroBubble",
          "--compile.enable=true"], 2, r"remove model from \[compile\] components"),
        # tied embeddings are refused
        (["--model.flavor=1B"], 2, r"ties the output head to the embedding"),
        # explicit splits
        ([EXPLICIT + "tok_embeddings layers.0 layers.1,layers.3 layers.2 norm output"], 2,
         r"every module once, in model order.*tok_embeddings layers.0 layers.1 layers.2"),
        ([EXPLICIT + "tok_embeddings layers.0,layers.1,layers.2 layers.3 norm output"], 2,
         r"lists 3 stages: must be a multiple of pipeline_parallel_degree = 2"),
        ([EXPLICIT + "tok_embeddings layers.0,layers.1 layers.2 layers.3 norm output",
          "--parallelism.pipeline_parallel_stages_per_rank=2"], 2, r"set it to 0"),
        # a model without a pipeline split
        (["--job.custom_import=tests/parallel/plan_models.py", "--model.name=llama3_lazy_plan",
          "--model.flavor=tiny"], 2, r"'llama3_lazy_plan' has no pipeline split"),
    ],
)
def test_config_errors(args, world_size, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(["--model.flavor=tiny",
                    f"--parallelism.pipeline_parallel_degree={world_size}", *args], world_size)
