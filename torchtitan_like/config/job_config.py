"""The job configuration: one dataclass per TOML section, one documented field per key.

This file (with config/optimization.py's sections) is the single source of truth for every
option the trainer reads. The string under
each field is its documentation: ``--help`` and docs/config_reference.md are generated from it,
so a field without one fails the unit tests. ``Literal`` types list the accepted values.
Section and key names follow TorchTitan's TOML era; add fields freely, rename none.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

from torchtitan_like.config.fields import DTypeName, PipelineScheduleName, ranged
from torchtitan_like.config.optimization import LRScheduler, Muon, Optimizer


@dataclass
class Job:
    config_file: str = ""
    """TOML file this job was read from (set with --job.config_file)."""

    dump_folder: str = "./outputs"
    """Folder for everything a run writes: metrics.jsonl, TensorBoard events, checkpoints."""

    description: str = "default job"
    """Free text shown at start-up."""

    custom_import: list[str] = field(default_factory=list)
    """Modules imported at start-up (dotted names or .py paths), e.g. one that registers a model."""

    overwrite: bool = False
    """A fresh run: the folder's earlier outputs, checkpoints too, go to dump_folder/archive."""

    trainer: str = ""
    """Trainer subclass to run, "module:Class" (a dotted name or .py path); empty = Trainer."""


@dataclass
class Model:
    name: str = "llama3"
    """Model family, a name in the model registry (see models/registry.py)."""

    flavor: str = "debugmodel"
    """Size preset of the model family, e.g. debugmodel, tiny, 1B, 8B, 70B, 405B for llama3."""

    tokenizer_path: str = ""
    """HuggingFace tokenizer.json (or a folder holding it); empty = byte-level, needs no file."""

    converters: list[str] = field(default_factory=list)
    """Model converters by registered name, applied in order before the plan, e.g. float8."""

    overrides: dict[str, Any] = field(default_factory=dict)
    """Flavor args fields to replace, e.g. { n_layers = 8 }, or --model.overrides.n_layers=8."""

    attn_mask_type: Literal["causal", "block_causal"] = "causal"
    """causal, or block_causal: tokens attend only within their document (EOS-separated)."""


@dataclass
class Training:
    dataset: Literal["cpython_docs", "local", "tokenized"] = "cpython_docs"
    """cpython_docs: CPython's docs (no download); local: dataset_path; tokenized: prepared."""

    dataset_path: str = ""
    """local: a .txt/.jsonl/.json/.parquet file or folder; tokenized: a prepare_data.py folder."""

    mixture: dict[str, float] = field(default_factory=dict, metadata={"range": {"ge": 0}})
    """tokenized: source name -> weight, each source the prepared folder dataset_path/<name>."""

    shuffle: bool = False
    """tokenized: seeded ([debug] seed) global shuffle of samples, the same under every layout."""

    num_workers: int = 0
    """tokenized: data-loading worker processes (0 = read in the training process)."""

    dataset_text_field: str = "text"
    """local: the field holding the document text in .jsonl/.json records and .parquet columns."""

    decode_errors: Literal["strict", "replace"] = "strict"
    """local: bytes not UTF-8 stop the job naming file and line (strict), or read as U+FFFD."""

    holdout_every: int = 50
    """Every Nth document is kept out of training for validation; 0 = no held-out split."""

    local_batch_size: int = ranged(8, ge=1)
    """Sequences per microbatch on each data-parallel rank."""

    global_batch_size: int = -1
    """Sequences per optimizer step over all ranks; a multiple of local x DP gives accumulation."""

    seq_len: int = ranged(2048, ge=1)
    """Tokens per sequence."""

    steps: int = ranged(10000, ge=1, le=10**9)
    """Optimizer steps to train for."""

    max_norm: float = ranged(1.0, ge=0)
    """Gradient-norm clipping threshold; 0 disables clipping (the norm is still reported)."""

    dtype: DTypeName = "float32"
    """Dtype of the parameters the optimizer updates (master weights) and its states."""

    mixed_precision_param: DTypeName = "bfloat16"
    """Compute dtype of parameters in forward/backward (FSDP all-gathers in it; else autocast)."""

    mixed_precision_reduce: DTypeName = "float32"
    """Dtype of FSDP's gradient reduce-scatter/all-reduce."""


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = 1
    """Replicas of the model across groups of ranks (the replicate dim of HSDP)."""

    data_parallel_shard_degree: int = -1
    """Ranks FSDP shards parameters over; -1 = whatever the other degrees leave of the world."""

    fsdp_reshard_after_forward: Literal["default", "always", "never"] = "default"
    """Free all-gathered parameters after forward: always, never, or default (yes unless PP)."""

    tensor_parallel_degree: int = 1
    """Ranks splitting each layer's matmuls (Megatron-style TP with sequence parallel); 1 = off."""

    disable_loss_parallel: bool = False
    """Under TP, compute the loss on gathered full-vocabulary logits, not vocab-sharded ones."""

    enable_async_tensor_parallel: bool = False
    """Overlap TP's all-gather/reduce-scatter with the matmuls (CUDA + compile.enable only)."""

    context_parallel_degree: int = 1
    """Ranks splitting every sequence (ring attention, for long contexts); 1 = off."""

    context_parallel_rotate_method: Literal["allgather", "alltoall"] = "allgather"
    """How ring attention passes K/V between CP ranks: one all-gather, or a shift per step."""

    context_parallel_load_balancer: Literal["headtail", "none"] = "headtail"
    """CP layout: headtail (rank r holds chunks r and 2cp-1-r, equal causal work) or none."""

    expert_parallel_degree: int = 1
    """Ranks splitting a MoE layer's routed experts (borrowed from dp_shard x cp); 1 = off."""

    expert_tensor_parallel_degree: int = 1
    """TP inside each expert: 1 (EP also borrows the TP ranks) or tensor_parallel_degree."""

    pipeline_parallel_degree: int = 1
    """Ranks along the pipeline: consecutive layers cut into stages on separate ranks; 1 = no PP."""

    pipeline_parallel_schedule: PipelineScheduleName = "1F1B"
    """torch.distributed.pipelining schedule; GPipe/1F1B: one stage per rank, the others several."""

    pipeline_parallel_microbatch_size: int = 1
    """Sequences per pipeline microbatch; local_batch_size / this = microbatches per schedule."""

    pipeline_parallel_stages_per_rank: int = 0
    """Stages (virtual stages) each PP rank holds; 0 = 1 for GPipe/1F1B, 2 for the others."""

    pipeline_parallel_embedding_weight: float = ranged(1.0, ge=0)
    """Cost of the token embedding in transformer layers, when balancing layers over stages."""

    pipeline_parallel_output_weight: float = ranged(1.0, ge=0)
    """Cost of the final norm + output head in transformer layers, when balancing stages."""

    pipeline_parallel_module_fqns_per_stage: list[str] = field(default_factory=list)
    """One entry per stage: its module names in model order, space-separated; empty = automatic."""


@dataclass
class ActivationCheckpoint:
    mode: Literal["none", "full", "selective"] = "none"
    """Recompute activations in backward: none, full (every block) or selective."""

    selective_ac_option: str = "op"
    """For selective: "op" (save matmul/attention outputs) or N (checkpoint every N-th block)."""


@dataclass
class Compile:
    enable: bool = False
    """torch.compile the components below."""

    components: list[Literal["model", "loss"]] = field(default_factory=lambda: ["model", "loss"])
    """What to compile: model (each transformer block) and/or loss."""

    cache_dir: str = ""
    """Kernel cache folder to keep: inductor's, Triton's in <dir>/triton; empty = their defaults."""

    @property
    def compiles_blocks(self) -> bool:
        """The model's blocks are compiled: enabled, with "model" among the components."""
        return self.enable and "model" in self.components


@dataclass
class Float8:
    enable: bool = False
    """Train the blocks' linears in float8 (torchao); same as [model] converters = ["float8"]."""

    recipe_name: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"] = (
        "tensorwise")
    """Scales per tensor, per row, per row with hp grad_weight, or DeepSeek-V3's 1x128/128x128."""

    enable_fsdp_float8_all_gather: bool = False
    """FSDP all-gathers weights in float8 (half the bf16 bytes); tensorwise recipe only."""

    precompute_float8_dynamic_scale_for_fsdp: bool = False
    """Compute all weight scales in one all-reduce after each optimizer step; needs the above."""

    emulate: bool = False
    """Emulate float8 matmuls (and mxfp8 expert GEMMs) in high precision: any device, no speed."""

    filter_fqns: list[str] = field(default_factory=list)
    """Linears whose name contains any of these strings stay in high precision, e.g. wk,wv."""

    moe_grouped_mm: Literal["none", "float8_rowwise", "mxfp8"] = "none"
    """Routed experts' grouped GEMMs in low precision: float8_rowwise (SM 9.0), mxfp8 (SM 10.x)."""


@dataclass
class Profiling:
    enable_profiling: bool = False
    """Write torch.profiler traces (one per rank) every profile_freq steps."""

    save_traces_folder: str = "profile_traces"
    """Trace folder, relative to dump_folder: iteration_<step>/rank<r>_trace.json."""

    profile_freq: int = 10
    """Profile the last profiler_active steps of every profile_freq steps."""

    profiler_warmup: int = 3
    """Steps traced but discarded before the active ones (the profiler's own warm-up)."""

    profiler_active: int = 1
    """Steps recorded in each trace."""

    enable_memory_snapshot: bool = False
    """CUDA only: record allocator history and dump a snapshot every profile_freq steps."""

    save_memory_snapshot_folder: str = "memory_snapshot"
    """Snapshot folder, relative to dump_folder; open the pickles at pytorch.org/memory_viz."""


@dataclass
class Checkpoint:
    enable: bool = False
    """Save checkpoints to dump_folder/folder, and resume from the latest complete one there."""

    folder: str = "checkpoint"
    """Checkpoint folder, relative to dump_folder; each save is a subfolder step-N."""

    interval: int = 500
    """Save every this many steps; the last step is always saved."""

    async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
    """Write in the loop (disabled), from a thread (async) or a process (async_with_pinned_mem)."""

    keep_latest_k: int = 10
    """Keep this many newest resumable checkpoints, delete older ones after each save; 0 = all."""

    load_step: int = -1
    """Step to resume from; -1 = the latest complete checkpoint in the folder."""

    exclude_from_loading: list[
        Literal["model", "optimizer", "lr_scheduler", "dataloader", "train_state"]
    ] = field(default_factory=list)
    """States not restored on resume, e.g. dataloader to restart the data stream."""

    last_save_model_only: bool = False
    """Save only the model weights (in export_dtype) after the last step, not a resumable state."""

    last_save_in_hf: bool = False
    """Also write the last save as a HuggingFace folder step-N-hf (weights in export_dtype)."""

    export_dtype: DTypeName = "float32"
    """Dtype of the weights of a model-only or HuggingFace last save (needs one of them)."""

    create_seed_checkpoint: bool = False
    """Save the initial weights as step-0 and exit (NPROC=1): every layout then starts alike."""

    initial_load_path: str = ""
    """Weights to start from when there is nothing to resume: a DCP step folder or HF folder."""

    initial_load_in_hf: bool = False
    """initial_load_path is a HuggingFace folder (config.json + *.safetensors)."""

    fallback_on_damage: bool = False
    """Resume from the newest earlier checkpoint when the one to resume is damaged (else exit 4)."""


@dataclass
class Metrics:
    log_freq: int = ranged(10, ge=1)
    """Log (console, TensorBoard, metrics.jsonl) every this many steps; the first step always."""

    enable_tensorboard: bool = False
    """Write TensorBoard events (rank 0) under dump_folder/save_tb_folder."""

    save_tb_folder: str = "tb"
    """TensorBoard folder, relative to dump_folder."""

    peak_tflops: float = ranged(0.0, ge=0)
    """Peak dense TFLOP/s of one device for MFU; 0 = GPU from the known table, CPU measured."""

    enable_wandb: bool = False
    """Send every metrics.jsonl record to Weights & Biases (rank 0; extra wandb; WANDB_MODE)."""

    enable_mlflow: bool = False
    """Send every metrics.jsonl record to MLflow (rank 0; extra mlflow)."""

    project: str = ""
    """W&B project and MLflow experiment; empty = WANDB_PROJECT, else torchtitan_like."""

    run_name: str = ""
    """Trackers' run name and group (a resume is a new run of it); empty = dump folder name."""

    wandb_entity: str = ""
    """W&B team or user the runs go to; empty = WANDB_ENTITY, else the account's default."""

    mlflow_tracking_uri: str = ""
    """MLflow tracking URI; empty = MLFLOW_TRACKING_URI, else a file store dump_folder/mlruns."""

    straggler_threshold: float = ranged(0.2, ge=0)
    """Warn when a rank's median step time in a log window is this fraction over the others'."""


@dataclass
class Comm:
    init_timeout_seconds: int = ranged(300, ge=1)
    """Collective timeout until the first step ends, and of checkpoint loads and saves."""

    train_timeout_seconds: int = ranged(100, ge=1)
    """Collective timeout of every training process group after the first step."""


@dataclass
class Validation:
    enable: bool = False
    """Evaluate on the held-out split (see training.holdout_every)."""

    freq: int = ranged(100, ge=1)
    """Validate every this many steps (and after the last step)."""

    steps: int = ranged(10, ge=1)
    """Global batches per pass: one fixed held-out set of sequences, whatever the layout."""


@dataclass
class Spike:
    policy: Literal["off", "warn", "skip", "stop"] = "warn"
    """On a loss/grad-norm spike: warn, skip (drop its update), stop (exit 3 on a streak), off."""

    factor: float = ranged(15.0, gt=0)
    """A spike: log(value) over the window's median log by factor x 1.4826 x MAD of the logs."""

    window: int = ranged(50, ge=3)
    """Steps in the running baseline (median and MAD); checks begin once it is full."""

    max_consecutive: int = ranged(3, ge=1)
    """stop: spikes in a row that end the run (earlier ones in the streak are skipped)."""


@dataclass
class Debug:
    seed: int = 42
    """Seed for weight init and every random op; the same seed gives the same run."""

    deterministic: bool = False
    """Use deterministic algorithms only (slower; needed for bitwise reproducibility)."""

    fault_rank: int = -1
    """Fault injection: the rank to kill (SIGKILL) once at fault_step; -1 = none."""

    fault_step: int = 0
    """Fault injection: the step at which fault_rank dies (once per dump folder)."""

    fault_point: Literal["step", "save"] = "step"
    """Fault injection: die after the step (step) or in the middle of its checkpoint (save)."""

    spike_step: int = 0
    """Fault injection: multiply this step's loss (so its gradients) by spike_scale; 0 = none."""

    spike_scale: float = ranged(1e4, gt=0)
    """Fault injection: the factor of spike_step's loss."""

    slow_rank: int = -1
    """Fault injection: this rank sleeps slow_rank_seconds in each data loading; -1 = none."""

    slow_rank_seconds: float = ranged(0.2, gt=0)
    """Fault injection: slow_rank's extra data-loading time per step."""


@dataclass
class FaultTolerance:
    enable: bool = False
    """Run as one replica group of a torchft job (docs/fault-tolerance.md); needs the ft extra."""

    replica_id: int = 0
    """This group's index in [0, group_size): its data share; the lowest live group saves."""

    group_size: int = ranged(1, ge=1)
    """Replica groups in the job, each its own torchrun job (the dp_replicate dimension)."""

    min_replica_size: int = ranged(1, ge=1)
    """Fewest live groups that may commit a step; fewer wait for a quorum (<= group_size)."""

    process_group: Literal["gloo", "nccl"] = "gloo"
    """Backend of torchft's managed process group across groups (nccl needs CUDA)."""

    process_group_timeout_ms: int = ranged(10000, ge=1)
    """Timeout of a collective across groups; a group not answering in it drops out."""

    manager_hostname: str = ""
    """Name the other groups reach this group's torchft manager by; empty = this host's name."""


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    optimizer: Optimizer = field(default_factory=Optimizer)
    muon: Muon = field(default_factory=Muon)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    training: Training = field(default_factory=Training)
    parallelism: Parallelism = field(default_factory=Parallelism)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    compile: Compile = field(default_factory=Compile)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    float8: Float8 = field(default_factory=Float8)
    profiling: Profiling = field(default_factory=Profiling)
    metrics: Metrics = field(default_factory=Metrics)
    comm: Comm = field(default_factory=Comm)
    validation: Validation = field(default_factory=Validation)
    spike: Spike = field(default_factory=Spike)
    fault_tolerance: FaultTolerance = field(default_factory=FaultTolerance)
    debug: Debug = field(default_factory=Debug)
