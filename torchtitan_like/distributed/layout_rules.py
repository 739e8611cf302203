"""Which parallel layouts can run: the rules, as plain functions of integers and names.

One copy of each rule, called by both the trainer's start-up validation (validate.py at the
package top, the ``validate`` functions of distributed/, the model's ``args.validate``) and the
planner
(tools/planner/rules.py), so that a layout the planner accepts is one the trainer accepts and
the other way round; tests/unit/test_layout_rules.py runs both over a grid of layouts. Each rule
raises ConfigError naming the field and the fix. Nothing here touches torch or a process group.

A new parallel dimension adds its rules here beside the others (e.g. expert parallelism: the
experts divisible by its degree) and calls them from both sides.
"""

from __future__ import annotations

from torchtitan_like.config.errors import require

V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
"""Schedules placing exactly two stages on each rank, stage r and stage 2p - 1 - r."""


# ------------------------------------------------------------------------------- batch


def global_batch(global_batch_size: int, local_batch_size: int, dp: int) -> int:
    """Sequences per optimizer step: ``global_batch_size``, or local x dp when it is -1."""
    return local_batch_size * dp if global_batch_size == -1 else global_batch_size


def accumulation_steps(global_batch_size: int, local_batch_size: int, dp: int) -> int:
    """Microbatches (local batches) per optimizer step on each rank: global / (local x dp)."""
    per_microbatch = local_batch_size * dp
    total = global_batch(global_batch_size, local_batch_size, dp)
    require(
        total % per_microbatch == 0,
        f"[training] global_batch_size = {total} must be a multiple of "
        f"local_batch_size x data-parallel degree = {local_batch_size} x {dp} = "
        f"{per_microbatch} (the multiple is the number of accumulated microbatches)",
    )
    return total // per_microbatch


# ----------------------------------------------------------------------- tensor parallel


def check_sequence_parallel(tp: int, seq_len: int) -> None:
    """Sequence parallelism gives each TP rank seq_len / tp tokens between the TP regions."""
    require(tp == 1 or seq_len % tp == 0,
            f"[training] seq_len = {seq_len} must be divisible by [parallelism] "
            f"tensor_parallel_degree = {tp}: sequence parallel gives each TP rank seq_len / "
            f"{tp} tokens between the TP regions")


def check_tensor_parallel_shapes(tp: int, n_heads: int, kv_heads: int, vocab_size: int,
                                 where: str) -> None:
    """Whole attention heads per TP rank; the embedding and head split by vocabulary rows.
    (The FFN width need not divide: DTensor shards it unevenly.) ``where`` names the model."""
    degree = f"[parallelism] tensor_parallel_degree = {tp}"
    for name, count in (("n_heads", n_heads), ("n_kv_heads", kv_heads)):
        require(count % tp == 0,
                f"{where}: {name} = {count} is not divisible by {degree} (each TP rank "
                f"computes whole attention heads); choose a degree that divides {count}")
    require(vocab_size % tp == 0,
            f"{where}: vocab_size = {vocab_size} is not divisible by {degree} (the embedding "
            "and the output head are split by vocabulary rows); choose a degree that divides it")


def check_moe_tensor_parallel(tp: int, *, float8: bool, where: str) -> None:
    """Under TP a MoE layer is one TP region whose ranks each hold a partial sum of its output
    (distributed/local_tp.py). Float8 linears inside such a region would scale each rank's
    shard on its own (torchao's float8 TP styles do not apply there). (A loss term computed
    inside the region, the auxiliary balance loss, is exact: each TP rank adds 1/tp of its
    gradient, protocols/step_hooks.py.) The model's args and the planner both call it."""
    require(tp == 1 or not float8,
            f"{where}: [float8] enable with [parallelism] tensor_parallel_degree = {tp} is not "
            "supported for mixture-of-experts models (their attention/MoE layers run as local "
            "TP regions, where float8 would scale each shard on its own); set one of them off")


def check_multi_token_prediction(cp: int, compiled_blocks: bool, where: str) -> None:
    """DeepSeek-V3's MTP modules (models/deepseek_v3/mtp.py) shift whole token sequences left:
    not under CP (each rank holds chunks of every sequence: the tokens a depth reads and the
    labels it is scored on lie on another rank), nor compiled (the depths would run eager
    beside compiled blocks). Under PP they sit on the last stage with a tied copy of the
    embedding (models/deepseek_v3/pipeline.py). The model's args and the planner call it."""
    require(cp == 1,
            f"{where}: mtp_depth > 0 with [parallelism] context_parallel_degree = {cp} is not "
            "supported (a CP rank holds chunks of each sequence, and MTP shifts whole "
            "sequences); set one of them off")
    require(not compiled_blocks,
            f"{where}: mtp_depth > 0 with [compile] enable (components model) is not built "
            "(the MTP depths would run eager beside compiled blocks); compile the loss only, "
            "or set mtp_depth = 0")


# ---------------------------------------------------------------------- context parallel


def check_context_parallel(cp: int, tp: int, seq_len: int, load_balancer: str) -> None:
    """The sequence splits into cp chunks (2 cp with the head-tail balancer), then over TP."""
    if cp == 1:
        return
    degree = f"[parallelism] context_parallel_degree = {cp}"
    chunks = 2 * cp if load_balancer == "headtail" else cp
    require(seq_len % chunks == 0,
            f"[training] seq_len = {seq_len} must be divisible by {chunks} for {degree}"
            + (f" with the headtail load balancer (2 x {cp} chunks of equal length)"
                if chunks > cp else ""))
    require(tp == 1 or (seq_len // cp) % tp == 0,
            f"[training] seq_len = {seq_len}: each of the {cp} CP ranks holds {seq_len // cp} "
            f"tokens, which sequence parallel splits over [parallelism] tensor_parallel_degree "
            f"= {tp}; choose seq_len divisible by {cp} x {tp} (and by {chunks})")


def check_attention_mask(cp: int, attn_mask_type: str) -> None:
    """Context parallelism swaps attention for ring attention, which knows causal masking only
    (no per-document mask over a sequence split across ranks)."""
    require(cp == 1 or attn_mask_type == "causal",
            f"[model] attn_mask_type = {attn_mask_type!r} cannot run under [parallelism] "
            f"context_parallel_degree = {cp}: context parallelism runs ring attention, which "
            "masks causally only; set context_parallel_degree = 1 or attn_mask_type = "
            "\"causal\"")


# --------------------------------------------------------------------- pipeline parallel


def check_stage_count(n_layers: int, n_stages: int) -> None:
    """Every pipeline stage holds at least one block."""
    require(n_layers >= n_stages, f"{n_layers} layers cannot fill {n_stages} pipeline stages")


def check_stages_per_rank(schedule: str, stages_per_rank: int, single_stage: bool) -> None:
    """GPipe and 1F1B run one stage per rank, V-shaped schedules two, the others several."""
    v, where = stages_per_rank, f"[parallelism] pipeline_parallel_schedule = {schedule!r}"
    if single_stage:
        require(v == 1, f"{where} runs one stage per rank, but {v} are configured; use a "
                "multi-stage schedule (e.g. Interleaved1F1B) or one stage per rank")
    elif schedule in V_SHAPED:
        require(v == 2, f"{where} needs exactly 2 stages per rank (stages r and 2p-1-r on "
                f"rank r), but {v} are configured")
    else:
        require(v >= 2, f"{where} interleaves several stages per rank, but 1 is configured; "
                "use 1F1B for one stage per rank")


def check_microbatches(pp: int, stages_per_rank: int, schedule: str, local_batch_size: int,
                       microbatch_size: int) -> int:
    """torch's requirements on m = local / microbatch size: 1F1B m >= pp, DualPipeV m >=
    stages, the interleaved schedules m in max(1, m // pp) equal rounds; returns m."""
    where = f"[parallelism] pipeline_parallel_schedule = {schedule!r}"
    require(microbatch_size >= 1,
            f"[parallelism] pipeline_parallel_microbatch_size = {microbatch_size}: must be >= 1")
    require(local_batch_size % microbatch_size == 0,
            f"[training] local_batch_size = {local_batch_size} must be divisible by "
            f"[parallelism] pipeline_parallel_microbatch_size = {microbatch_size} (each "
            "pipeline step cuts the local batch into microbatches of that size)")
    m, stages = local_batch_size // microbatch_size, pp * stages_per_rank
    counts = (f"local_batch_size {local_batch_size} / pipeline_parallel_microbatch_size "
              f"{microbatch_size} = {m} microbatch(es)")
    fix = "raise [training] local_batch_size or lower the microbatch size"
    if schedule == "1F1B":
        require(m >= pp, f"{where} needs at least as many microbatches as stages "
                f"({pp}), but {counts}; {fix}")
    elif schedule == "DualPipeV":
        require(m >= stages, f"{where} needs at least as many microbatches as stages "
                f"({stages} = 2 x {pp}), but {counts}; {fix}")
    elif schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, m // pp)
        require(m % rounds == 0, f"{where} runs the microbatches in max(1, m // "
                f"pipeline_parallel_degree) = {rounds} equal rounds, but {counts} do not "
                f"divide into them; use a multiple of {pp} microbatches")
    return m


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int, schedule: str) -> list[int]:
    """The stages rank ``pp_rank`` holds, in execution order: looped (r, r + p, r + 2p, ...)
    or, for V-shaped schedules, r and 2p - 1 - r."""
    if schedule in V_SHAPED:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + i * pp for i in range(stages_per_rank)]
