"""Pipeline parallelism (PP): consecutive layers on different ranks, microbatches flowing through.

The model is cut into S stages of consecutive modules; rank r of the ``pp`` mesh holds
``v = S / p`` of them. Each step's local batch is cut into ``m`` microbatches
(``local_batch_size / pipeline_parallel_microbatch_size``); a stage forwards a microbatch, sends
its activations to the next stage and later receives the gradient of those activations back.
Only activations cross ranks (point to point), so PP suits the slowest links: the outermost mesh
dim. Schedules differ in the order of these forwards (F) and backwards (B) and so in the idle
time, the *bubble*. With one F + B of one microbatch on one stage taking t:

- **GPipe** (Huang et al., 2019, arXiv:1811.06965): all m forwards, then all m backwards. The
  pipeline fills and drains: of m + p - 1 slots of length t, each rank idles in p - 1, so the
  bubble fraction is (p - 1) / (m + p - 1), and a rank keeps the activations of all m
  microbatches.
- **1F1B** (PipeDream-Flush; Narayanan et al., 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473): after a warm-up of p - r
  forwards, rank r alternates one forward and one backward. Same bubble (p - 1) / (m + p - 1),
  but at most p microbatches' activations are alive, whatever m.
- **Interleaved1F1B** (same paper): v >= 2 non-contiguous stages per rank (rank r holds stages
  r, r + p, r + 2p, ...). Fill and drain now take slots of t / v, so the bubble becomes
  (p - 1) / (v m + p - 1), about the 1F1B bubble divided by v, for v times more
  point-to-point messages.
- **LoopedBFS** (Lamy-Poirier, 2023, "Breadth-First Pipeline Parallelism", arXiv:2211.05953):
  the interleaved placement, run breadth first (every microbatch through a rank's earlier stage
  before its later one), which overlaps data-parallel communication better.
- **InterleavedZeroBubble** and **ZBVZeroBubble** (Qi et al., 2024, "Zero Bubble Pipeline
  Parallelism", ICLR 2024, arXiv:2401.10241): the backward is split into B, the gradient with
  respect to the stage's input (on the critical path: the previous stage waits for it), and W,
  the gradient with respect to its weights (needed only by the optimizer step). W's are
  scheduled into the slots that would be bubbles, so with t_F ~ t_B ~ t_W the bubble approaches
  zero. ZBV places two stages per rank in a V: rank r holds stages r and 2p - 1 - r, so the first
  and the last stage share rank 0 and a microbatch turns around on rank p - 1.
- **DualPipeV** (DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437; the
  V-shaped "cut-in-half" DualPipe): the V placement with the B/W split, overlapping the forward
  of one microbatch with the backward of another on the same rank. Needs m >= 2p.

torch's requirements on m: 1F1B needs m >= p, DualPipeV m >= S, Interleaved1F1B and
InterleavedZeroBubble m divisible by max(1, m // p); the others accept any m (a bubble larger
than the formula when m < S). They are checked before any process group exists.

Stages are the plain model with the other stages' modules removed (``prune_to_stage``): layer
names and therefore parameter names (FQNs) stay those of the unsplit model, which checkpoints and
the layout-independent weight init rely on. Each stage then goes through the model's
parallelize plan like an unsplit model. The loss is the global-token normalised sum
(protocols/loss.py) computed on the last stage per microbatch, so the schedule's summed
microbatch losses are already the step's loss share and gradients are not rescaled
(``scale_grads=False``). ``split_model`` cuts the model, ``build_pipeline`` runs the stages under
the schedule (the runtime is pipeline_schedule.py's).
"""

from __future__ import annotations

import contextlib
import copy
import math
import typing
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from torchtitan_like.config.errors import require
from torchtitan_like.config.job_config import JobConfig, Parallelism
from torchtitan_like.distributed import layout_rules

if typing.TYPE_CHECKING:
    from torchtitan_like.distributed.pipeline_schedule import Pipeline
    from torchtitan_like.protocols.model_spec import PipeliningFn

SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""Schedules splitting each backward into an input-gradient and a weight-gradient pass, i.e.
two backward calls through one retained graph."""


def is_single_stage(schedule: str) -> bool:
    """GPipe and 1F1B run one stage per rank; the other schedules several. (torch's schedules
    are imported here, not with this module: see pipeline_schedule.py.)"""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    return issubclass(get_schedule_class(schedule), PipelineScheduleSingle)


def stages_per_rank(p: Parallelism) -> int:
    """Stages (virtual stages) on each PP rank: from the explicit split, else the field, else
    1 for single-stage schedules and 2 for the others."""
    if p.pipeline_parallel_module_fqns_per_stage:
        return len(p.pipeline_parallel_module_fqns_per_stage) // p.pipeline_parallel_degree
    if p.pipeline_parallel_stages_per_rank > 0:
        return p.pipeline_parallel_stages_per_rank
    return 1 if is_single_stage(p.pipeline_parallel_schedule) else 2


def num_stages(p: Parallelism) -> int:
    return p.pipeline_parallel_degree * stages_per_rank(p)


def stage_ids(pp_rank: int, p: Parallelism) -> list[int]:
    """The stages rank ``pp_rank`` holds, in execution order: looped (r, r + p, r + 2p, ...)
    or, for V-shaped schedules, r and 2p - 1 - r."""
    return layout_rules.stage_ids(pp_rank, p.pipeline_parallel_degree, stages_per_rank(p),
                                  p.pipeline_parallel_schedule)


def num_microbatches(config: JobConfig) -> int:
    return config.training.local_batch_size // config.parallelism.pipeline_parallel_microbatch_size


def validate_pipeline(config: JobConfig) -> None:
    """The schedule-level checks of a PP job (the split itself is checked by the model's
    ``module_fqns_per_stage``): stages per rank for the schedule, microbatches for torch."""
    p, t = config.parallelism, config.training
    pp, schedule = p.pipeline_parallel_degree, p.pipeline_parallel_schedule
    fqns = p.pipeline_parallel_module_fqns_per_stage
    require(p.pipeline_parallel_stages_per_rank >= 0,
            "[parallelism] pipeline_parallel_stages_per_rank: must be >= 1 (or 0 = automatic)")
    require(p.pipeline_parallel_embedding_weight >= 0 and p.pipeline_parallel_output_weight >= 0,
            "[parallelism] pipeline_parallel_embedding_weight and _output_weight: must be >= 0")
    if fqns:
        require(len(fqns) % pp == 0,
                f"[parallelism] pipeline_parallel_module_fqns_per_stage lists {len(fqns)} "
                f"stages: must be a multiple of pipeline_parallel_degree = {pp} (stages per rank)")
        require(p.pipeline_parallel_stages_per_rank in (0, len(fqns) // pp),
                f"[parallelism] pipeline_parallel_stages_per_rank = "
                f"{p.pipeline_parallel_stages_per_rank} contradicts the {len(fqns)} stages of "
                f"pipeline_parallel_module_fqns_per_stage over {pp} ranks; set it to 0")
    v = stages_per_rank(p)
    layout_rules.check_stages_per_rank(schedule, v, is_single_stage(schedule))
    where = f"[parallelism] pipeline_parallel_schedule = {schedule!r}"
    if schedule in SPLIT_BACKWARD:
        ac, compile_ = config.activation_checkpoint, config.compile
        split = (f"{where} splits each backward into input- and weight-gradient passes "
                 "(two backward calls through one graph)")
        other = "or a schedule without the split (GPipe, 1F1B, Interleaved1F1B, LoopedBFS)"
        require(not (ac.mode == "selective" and ac.selective_ac_option == "op"),
                f"{split}, but op-level selective activation checkpointing allows one backward "
                "per region; use [activation_checkpoint] mode = full or selective_ac_option = "
                f"N, {other}")
        require(not compile_.compiles_blocks,
                f"{split}, which compiled blocks do not support (torch 2.13 refuses the second "
                "call, and with donated buffers off the weight gradients come out wrong); "
                f"remove model from [compile] components, {other}")

    layout_rules.check_microbatches(pp, v, schedule, t.local_batch_size,
                                    p.pipeline_parallel_microbatch_size)


def balance_layers(
    n_layers: int, n_stages: int, first_weight: float, last_weight: float
) -> list[int]:
    """Layers per stage, at least one each, consecutive in model order.

    A stage weighs its layers plus ``first_weight`` (the embedding) on the first stage and
    ``last_weight`` (norm + head) on the last. The split minimises the heaviest stage (the
    pipeline runs at the pace of the slowest), then, among such splits, the sum of squared
    stage weights (the most even one). Exact, by dynamic programming over (stage, layers used).
    """
    layout_rules.check_stage_count(n_layers, n_stages)
    extra = [0.0] * n_stages
    extra[0] += first_weight
    extra[-1] += last_weight

    def solve(score: Callable[[float, float], float], bound: float) -> tuple[float, list[int]]:
        # best[s][used] = (score of stages < s holding `used` layers, layers of stage s - 1)
        best: list[dict[int, tuple[float, int]]] = [{0: (0.0, 0)}]
        for s in range(n_stages):
            row: dict[int, tuple[float, int]] = {}
            for used, (value, _) in best[s].items():
                for k in range(1, n_layers - used - (n_stages - s - 1) + 1):
                    if k + extra[s] > bound + 1e-9:
                        break
                    candidate = score(value, k + extra[s])
                    if candidate < row.get(used + k, (math.inf, 0))[0]:
                        row[used + k] = (candidate, k)
            best.append(row)
        sizes, used = [], n_layers
        for s in range(n_stages, 0, -1):
            k = best[s][used][1]
            sizes.append(k)
            used -= k
        return best[n_stages][n_layers][0], sizes[::-1]

    heaviest, _ = solve(max, math.inf)
    return solve(lambda total, w: total + w * w, heaviest)[1]


def module_fqns_per_stage(
    p: Parallelism, n_layers: int, *, first: list[str], last: list[str], blocks: str = "layers"
) -> list[list[str]]:
    """Module names of each stage for a model made of ``first`` modules, ``n_layers`` blocks in
    a ModuleDict named ``blocks`` (keys "0", "1", ...), then ``last`` modules.

    The explicit split of ``pipeline_parallel_module_fqns_per_stage`` is checked to list every
    module once, in model order; otherwise the blocks are balanced (``balance_layers``) with the
    ``first`` modules on the first stage and the ``last`` ones on the last.
    """
    order = [*first, *(f"{blocks}.{i}" for i in range(n_layers)), *last]
    explicit = [entry.split() for entry in p.pipeline_parallel_module_fqns_per_stage]
    if explicit:
        require(all(explicit) and [m for stage in explicit for m in stage] == order,
                "[parallelism] pipeline_parallel_module_fqns_per_stage must list every module "
                f"once, in model order, no stage empty: {' '.join(order)}; got "
                + " | ".join(" ".join(stage) for stage in explicit))
        return explicit
    n = num_stages(p)
    require(n_layers >= n,
            f"{n_layers} layers cannot fill {n} pipeline stages (pipeline_parallel_degree "
            f"{p.pipeline_parallel_degree} x {stages_per_rank(p)} stages per rank); lower "
            "either, or choose a deeper [model] flavor")
    sizes = balance_layers(n_layers, n, p.pipeline_parallel_embedding_weight,
                           p.pipeline_parallel_output_weight)
    stages, start = [], 0
    for s, size in enumerate(sizes):
        names = [f"{blocks}.{i}" for i in range(start, start + size)]
        stages.append((first if s == 0 else []) + names + (last if s == n - 1 else []))
        start += size
    return stages


def split_model(
    model: nn.Module, pipelining_fn: PipeliningFn | None, pp_rank: int, config: JobConfig
) -> tuple[list[int] | None, list[nn.Module]]:
    """This rank's stage indices and stage modules; ``(None, [model])`` without PP. (A model
    without ``pipelining_fn`` was refused by validation.)"""
    p = config.parallelism
    if p.pipeline_parallel_degree == 1:
        return None, [model]
    assert pipelining_fn is not None
    ids = stage_ids(pp_rank, p)
    return ids, pipelining_fn(model, ids, config)


def build_pipeline(
    model_parts: list[nn.Module], stage_ids: list[int], config: JobConfig, pp_mesh: DeviceMesh,
    device: torch.device, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    forward_context: Callable[[], contextlib.AbstractContextManager],
) -> Pipeline:
    """This rank's stages (``model_parts``, parallelized) under the configured schedule. torch's
    pipelining is imported here, by a PP job only (pipeline_schedule.py)."""
    from torchtitan_like.distributed.pipeline_schedule import Pipeline

    return Pipeline(model_parts, stage_ids, num_stages(config.parallelism),
                    config.parallelism.pipeline_parallel_schedule, num_microbatches(config),
                    pp_mesh, device, loss_fn, forward_context)


def prune_to_stage(model: nn.Module, fqns: list[str]) -> nn.Module:
    """A deep copy of ``model`` keeping only the modules named in ``fqns``: top-level modules
    not named become None, entries of a top-level ModuleDict not named are deleted (so the
    kept ones keep their keys, hence their parameter names). Cheap on ``meta``."""
    keep = set(fqns)
    stage = copy.deepcopy(model)
    for name, child in list(stage.named_children()):
        if isinstance(child, nn.ModuleDict):
            for key in list(child.keys()):
                if f"{name}.{key}" not in keep:
                    del child[key]
        elif name not in keep:
            setattr(stage, name, None)
    return stage
