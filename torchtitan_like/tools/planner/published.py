"""Published training runs the step-time and memory models are fitted on and held against
(tools/planner/holdout.py; docs/planner-throughput.md; tests/unit/test_planner_published.py).

Every figure is copied from its source with the inputs the source states (``inputs``); where a
source does not state an input the planner needs, the row says what it assumes (``assumed``).
Each row's own policies (AC policy, microbatches, schedule, precision, overlap, CP rotation)
are ``Layout`` fields, which ttl-plan takes as flags too.
"""

from __future__ import annotations

import dataclasses

from torchtitan_like.tools.planner.inputs import GPUS, Cluster, Layout, Precision, Workload

TORCHTITAN = ("TorchTitan docs/performance.md = benchmarks/llama3_h100_202412_torchtitan.md "
              "(Llama 3.1, torch/torchao/torchtitan of 2024-12; H100 96 GB HBM2e at 500 W)")
LLAMA3 = "Llama 3 Herd of Models (Meta, 2024), Table 4 and section 3.3.2"
DEEPSEEK_V3 = "DeepSeek-V3 Technical Report (DeepSeek-AI, 2024), sections 3.1-3.3 and Table 1"

H100_96GB = dataclasses.replace(GPUS["H100"], name="H100 SXM 96GB HBM2e 500W", memory_gib=94.5,
                                hbm_tbps=2.4, peak_tflops=912.0, fp8_tflops=1824.0)
"""TorchTitan's Grand Teton hosts: 96 GB H100s (94.5 GiB visible), 400 Gb/s per GPU between
nodes. Their 500 W limit lowers the clocks (the source says the real peak lies between the
SXM's and the NVL's); the rows assume the midpoint, 912 TFLOP/s (an assumption every
TorchTitan row shares)."""


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    flavor: str
    cluster: Cluster
    work: Workload
    layout: Layout
    tokens_per_second_per_gpu: float = 0.0
    """Published tokens/s per GPU (0: the source gives MFU instead)."""
    mfu: float = 0.0
    """Published MFU (0: the source gives tokens/s)."""
    memory_gib: float = 0.0
    """Published peak memory per GPU (0: not published): TorchTitan's logged
    ``max_reserved_gib``, the caching allocator's reserved peak
    (``Calibration.allocator_reserve``)."""
    inputs: str = ""
    """What the source states."""
    assumed: str = ""
    """The planner inputs the source does not state, and what the row assumes for them."""
    model: str = "llama3"
    """Registry name of the model (``flavor`` is one of its flavors)."""


def _tt(name: str, nodes: int, global_batch: int, layout: Layout, tps: float, mem: float,
        inputs: str, assumed: str, flavor: str = "8B", seq_len: int = 8192) -> PublishedRun:
    return PublishedRun(name, TORCHTITAN, flavor, Cluster(H100_96GB, 8, nodes),
                        Workload(seq_len=seq_len, global_batch=global_batch), layout,
                        tokens_per_second_per_gpu=tps, memory_gib=mem, inputs=inputs,
                        assumed=assumed)


DEEPSEEK_V3_TOKENS = 14.8e12
DEEPSEEK_V3_GPU_HOURS = 2.664e6
"""Pre-training: 14.8T tokens in 2.664M H800 GPU-hours (DeepSeek-V3 report, Table 1)."""

_PEAK = "the 500 W H100's bf16 peak, 912 TFLOP/s (the source gives a range)"
_8B = ("Table 1 (8 GPUs) / Table 3 (128 GPUs): seq 8192, local batch 2, selective (op) AC "
       "(TorchTitan's policy: every other matmul output saved, op_sac_every_other_matmul)")
_70B = "Table 4: seq 8192, local batch 16 (one microbatch), full AC, compile, Float8"
_405B = ("Table 5: seq 8192, local batch 32, full AC, compile, Float8, async TP; torch of "
         "2024-12, whose pipeline stages reduce their FSDP gradients inside the last "
         "backward, before sending it on (pp_reduce_before_send)")
_405B_ASSUMED = (f"{_PEAK}; microbatches: torchtitan's default at the benchmarked commit, one "
                 "per stage (pp x stages per rank: 8 of 4 sequences under 1F1B, 16 of 2 "
                 "interleaved), 2 stages per rank (its default split for multi-stage "
                 "schedules)")
_8B_CP = ("Table 2: FSDP x CP on 8 GPUs, local batch 1 sequence, full AC, compile, Float8; "
          "ring attention on torch of 2024-12")
_CP_ASSUMED = ("torch's defaults for what the source does not state: K/V rotated by one "
               "all-gather (cp_rotate_method allgather), headtail load balancing")
_405B_CP = ("Table 6: TP 8 x PP 8 x FSDP x CP on 512 GPUs, 1F1B, local batch 8 sequences, "
            "full AC, compile, Float8, async TP; torch of 2024-12 (pp_reduce_before_send)")
_405B_CP_ASSUMED = (f"{_PEAK}; {_CP_ASSUMED}; microbatches: torchtitan's default, one per "
                    "stage: 8 of 1 sequence")
_LLAMA3_ASSUMED = ("virtual stages and kernels not stated: interleaved 1F1B with 2 stages per "
                   "rank and fused (compiled-class) kernels; MFU counted as the planner "
                   "counts it (6 per weight + 12 x layers x dim x seq per token, full scores)")


def _fsdp8b(nodes: int, **options: bool) -> Layout:
    return Layout(dp_shard=8 * nodes, local_batch_size=2, ac="op",
                  op_sac_every_other_matmul=True, **options)


_70B_LAYOUT = Layout(dp_shard=32, tp=8, local_batch_size=16, ac="full", compile=True,
                     float8=True)
_405B_LAYOUT = Layout(dp_shard=8, tp=8, pp=8, local_batch_size=4, ac="full", compile=True,
                      float8=True, async_tp=True, pp_reduce_before_send=True)
"""torchtitan (9dec370, torchtitan/parallelisms/pipelining_utils.py: build_pipeline_schedule)
splits the local batch into pp x stages-per-rank microbatches unless told otherwise, and
generate_split_points gives multi-stage schedules 2 stages per rank. The torch nightly of
2024-12 ran FSDP's post-backward inside a stage's last backward
(``_PipelineStageBase.backward_maybe_with_nosync``, ``last_backward``), before the gradient
send; the REDUCE_GRAD action that moved it after the send came in 2025-10
(pytorch/pytorch#166449)."""


def _8b_cp(cp: int, tps: float, mem: float) -> PublishedRun:
    seq = 32768 * cp
    return _tt(f"8B, 8 GPUs, FSDP {8 // cp} x CP {cp}, seq {seq:,}", 1, 8 // cp,
               Layout(dp_shard=8 // cp, cp=cp, local_batch_size=1, ac="full", compile=True,
                      float8=True), tps, mem, f"seq {seq}; {_8B_CP}", f"{_PEAK}; {_CP_ASSUMED}",
               seq_len=seq)


def _405b_cp(cp: int, tps: float, mem: float) -> PublishedRun:
    seq = 32768 * cp
    return _tt(f"405B, 512 GPUs, TP 8 x PP 8 x FSDP {8 // cp} x CP {cp}, seq {seq:,}", 64,
               8 * 8 // cp, dataclasses.replace(_405B_LAYOUT, dp_shard=8 // cp, cp=cp,
                                                local_batch_size=1),
               tps, mem, f"seq {seq}; {_405B_CP}", _405B_CP_ASSUMED, "405B", seq)


def _llama3(name: str, gpus: int, cp: int, dp: int, seq: int, per_dp: int, mfu: float,
            inputs: str, assumed: str, **options: object) -> PublishedRun:
    return PublishedRun(name, LLAMA3, "405B", Cluster(GPUS["H100"], 8, gpus // 8),
                        Workload(seq_len=seq, global_batch=dp * per_dp),
                        Layout(tp=8, cp=cp, pp=16, dp_shard=dp, ac="none", compile=True,
                               pp_schedule="Interleaved1F1B", **options),  # type: ignore[arg-type]
                        mfu=mfu, inputs=inputs, assumed=assumed)


_LLAMA3_8K = ("seq 8192, {per_dp} sequences per DP rank (16M tokens a step), bf16, no "
              "activation checkpointing (section 3.3.2: with its pipeline memory "
              "optimizations Llama 3 pre-trained at 8K tokens without it)")

PUBLISHED_RUNS: list[PublishedRun] = [
    _tt("8B, 8 GPUs, FSDP", 1, 16, _fsdp8b(1), 5762, 82.4, _8B, _PEAK),
    _tt("8B, 8 GPUs, FSDP + compile", 1, 16, _fsdp8b(1, compile=True), 6667, 77.0, _8B, _PEAK),
    _tt("8B, 8 GPUs, FSDP + compile + Float8", 1, 16, _fsdp8b(1, compile=True, float8=True),
        8532, 76.8, _8B, _PEAK),
    _tt("8B, 128 GPUs, FSDP", 16, 256, _fsdp8b(16), 5605, 67.0, _8B, _PEAK),
    _tt("8B, 128 GPUs, FSDP + compile", 16, 256, _fsdp8b(16, compile=True), 6514, 62.0, _8B,
        _PEAK),
    _tt("8B, 128 GPUs, FSDP + compile + Float8", 16, 256,
        _fsdp8b(16, compile=True, float8=True), 8380, 61.8, _8B, _PEAK),
    _8b_cp(1, 3890, 83.9),
    _8b_cp(2, 2540, 84.2),
    _8b_cp(4, 1071, 84.0),
    _8b_cp(8, 548, 84.5),
    _tt("70B, 256 GPUs, FSDP 32 x TP 8", 32, 512, _70B_LAYOUT, 829, 71.9, _70B, _PEAK, "70B"),
    _tt("70B, 256 GPUs, FSDP 32 x TP 8, async TP", 32, 512,
        dataclasses.replace(_70B_LAYOUT, async_tp=True), 876, 67.6, _70B, _PEAK, "70B"),
    _tt("405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, 1F1B", 64, 256, _405B_LAYOUT, 100, 82.5,
        _405B, _405B_ASSUMED, "405B"),
    _tt("405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, interleaved 1F1B", 64, 256,
        dataclasses.replace(_405B_LAYOUT, pp_schedule="Interleaved1F1B", local_batch_size=2),
        128, 72.7, _405B, _405B_ASSUMED, "405B"),
    _405b_cp(1, 76, 75.3),
    _405b_cp(2, 47, 75.9),
    _405b_cp(4, 31, 77.1),
    _405b_cp(8, 16, 84.9),
    _llama3("Llama 3 405B, 8,192 GPUs, TP 8 x PP 16 x DP 64", 8192, 1, 64, 8192, 32, 0.43,
            "TP 8, CP 1, PP 16, DP 64, " + _LLAMA3_8K.format(per_dp=32), _LLAMA3_ASSUMED),
    _llama3("Llama 3 405B, 16,384 GPUs, TP 8 x PP 16 x DP 128", 16384, 1, 128, 8192, 16, 0.41,
            "TP 8, CP 1, PP 16, DP 128, " + _LLAMA3_8K.format(per_dp=16), _LLAMA3_ASSUMED),
    _llama3("Llama 3 405B, 16,384 GPUs, TP 8 x CP 16 x PP 16 x DP 8, seq 131,072", 16384, 16,
            8, 131072, 16, 0.38,
            "TP 8, CP 16, PP 16, DP 8, seq 131072, 16 sequences per DP rank (16M tokens a "
            "step), bf16 (the long-context phase); CP all-gathers K and V, grouped-query "
            "(unrepeated) heads, over 2 x CP load-balanced chunks (section 3.3.2)",
            _LLAMA3_ASSUMED + "; no activation checkpointing, as at 8K",
            cp_algorithm="gathered_kv"),
    PublishedRun("DeepSeek-V3 671B, 2,048 H800, PP 16 x EP 64, no TP", DEEPSEEK_V3, "671B",
                 Cluster(GPUS["H800"], 8, 256),
                 Workload(seq_len=4096, global_batch=15360, precision=Precision(state_bytes=2)),
                 Layout(pp=16, dp_shard=128, ep=64, local_batch_size=1, ac="op", float8=True,
                        pp_schedule="DualPipeV", ep_overlapped=True),
                 tokens_per_second_per_gpu=DEEPSEEK_V3_TOKENS / (DEEPSEEK_V3_GPU_HOURS * 3600),
                 model="deepseek_v3",
                 inputs="seq 4096, global batch 15360 sequences (its value after the first 469B "
                 "tokens), PP 16 (DualPipe: 2 chunks per rank, timed as DualPipeV) x EP 64 "
                 "over 8 nodes, ZeRO-1 data parallelism (modelled as FSDP: same time, less "
                 "memory), no TP, FP8 GEMMs (as Float8), bf16 Adam moments (2 + 2 bytes per "
                 "parameter, section 3.3.1), RMSNorm and MLA up-projections "
                 "recomputed (as op-level AC); DualPipe hides the all-to-all behind another "
                 "microbatch's compute (section 3.2.1: near-zero all-to-all overhead), which "
                 "this platform does not do (ep_overlapped); published: 14.8T tokens in "
                 "2.664M H800 GPU-hours",
                 assumed="microbatch size not stated: 1 sequence"),
]
