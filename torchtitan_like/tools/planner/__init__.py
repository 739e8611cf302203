"""The parallelism planner: memory per GPU, communication, step time, throughput and cost of a
training layout, and a search over layouts. Everything is arithmetic on the model's shapes;
nothing is allocated.

    calibration.py    the fitted numbers, passed as one value (each fitted on named published
                      runs and judged on the others: holdout.py)
    inputs.py         GPU presets (with their sourced matmul efficiency), cluster, workload,
                      layout, model shapes
    moe.py            mixture-of-experts shapes (total vs active parameters) and the EP
                      all-to-all volume
    rules.py          whether a layout can run: the trainer's own rules
                      (distributed/layout_rules.py) plus the cluster's
    schedule.py       pipeline stages, placement, schedule order, in-flight microbatches, bubble
    activations.py    activation bytes per block (Korthikanti et al., 2022, applied to Llama)
    attention.py      what each attention family keeps (Qwen3's q/k norms, DeepSeek's MLA)
    mixed_precision.py  the dtype each kept tensor has (autocast without FSDP, FSDP's mixed
                      precision, the composite RMSNorm's and the CPU attention's fp32 copies)
    memory.py         the peak per pipeline rank, walked through its schedule
    communication.py  bytes per step per parallel dimension, and the link each uses
    ring.py           ring attention under CP: steps, exposed K/V traffic, merges, memory
    step_time.py      the step time in named parts, tokens/s per GPU and MFU
    overheads.py      thin matmul shapes, the optimizer step, FSDP's copies, host dispatch
    hardware.py       a hardware profile (ttl-plan --calibrate) as the GPU the planner reads
    layout_plan.py    one layout, planned (and ``plan_fitting``: the least AC that fits)
    search.py         ranked layouts honouring pinned degrees and options
    from_config.py    the inputs of a training config

The command line is tools/plan_cli.py; docs/planner-throughput.md holds the step-time model
against published runs.
"""

from torchtitan_like.tools.planner.activations import korthikanti_layer_bytes, layer_elements
from torchtitan_like.tools.planner.calibration import CALIBRATION, Calibration
from torchtitan_like.tools.planner.communication import communication
from torchtitan_like.tools.planner.from_config import (
    ac_of,
    from_job_config,
    predict_peak,
    predict_stage_peaks,
)
from torchtitan_like.tools.planner.inputs import (
    CPU,
    GPU,
    GPUS,
    Cluster,
    GiB,
    Layout,
    LayoutError,
    ModelShape,
    Precision,
    Workload,
    check_ac,
)
from torchtitan_like.tools.planner.layout_plan import Plan, plan, plan_fitting
from torchtitan_like.tools.planner.links import Comm, ring_volume
from torchtitan_like.tools.planner.memory import Memory, stage_memory
from torchtitan_like.tools.planner.rules import validate_layout
from torchtitan_like.tools.planner.schedule import (
    bubble_formula,
    bubble_fraction,
    in_flight_peak,
    rank_stages,
    schedule_order,
    stage_split,
)
from torchtitan_like.tools.planner.search import search, why_better
from torchtitan_like.tools.planner.step_time import StepTime, estimate_step_time

__all__ = [
    "CALIBRATION",
    "CPU",
    "GPU",
    "GPUS",
    "Calibration",
    "Cluster",
    "Comm",
    "GiB",
    "Layout",
    "LayoutError",
    "Memory",
    "ModelShape",
    "Plan",
    "Precision",
    "StepTime",
    "Workload",
    "ac_of",
    "bubble_formula",
    "bubble_fraction",
    "check_ac",
    "communication",
    "estimate_step_time",
    "from_job_config",
    "in_flight_peak",
    "korthikanti_layer_bytes",
    "layer_elements",
    "plan",
    "plan_fitting",
    "predict_peak",
    "predict_stage_peaks",
    "rank_stages",
    "ring_volume",
    "schedule_order",
    "search",
    "stage_memory",
    "stage_split",
    "validate_layout",
    "why_better",
]
