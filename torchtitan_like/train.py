"""The trainer: builds everything in the documented order, then runs the loop.

Run it through ``./run_train.sh`` (torchrun), or ``python -m torchtitan_like.train`` for one
process (the entry point, ``main``, is entry.py's). Build order (docs/design.md, "Data flow"):
mesh -> data -> model on meta -> converters -> pipeline split -> parallelize plan ->
materialise -> optimizer/scheduler -> checkpoint load -> metrics -> loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_like.components.checkpoint import CheckpointManager
from torchtitan_like.components.converters import ModelConverters, build_converters
from torchtitan_like.components.data.checks import describe_data
from torchtitan_like.components.data.dataloader import StepBatches, build_dataloader, data_epoch
from torchtitan_like.components.data.tokenized import TokenizedLoader, report_mixture
from torchtitan_like.components.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_like.components.fault_injection import FaultInjector
from torchtitan_like.components.first_step import announce_first_step
from torchtitan_like.components.hf_export import export_last_save, exports_last_save
from torchtitan_like.components.lr_scheduler import LRSchedulersContainer
from torchtitan_like.components.metrics import MetricsLogger, build_metrics
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.components.profiling import Profiler
from torchtitan_like.components.run_summary import describe_run, settings_without_effect
from torchtitan_like.components.spikes import SpikeDetector, TrainingDiverged
from torchtitan_like.components.step_watch import StepWatch
from torchtitan_like.components.stragglers import StepClock
from torchtitan_like.components.validation import held_out_batches, held_out_loss
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed import context_parallel, fault_tolerance, pipeline
from torchtitan_like.distributed import utils as dist_utils
from torchtitan_like.distributed.compile import maybe_compile_loss, set_inductor_cache
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.plan_check import check_plan_applied, checked_loss
from torchtitan_like.distributed.tied_weights import TiedWeights, tied_aliases
from torchtitan_like.logging import logger
from torchtitan_like.models import stage_inputs
from torchtitan_like.models.registry import model_spec_and_args
from torchtitan_like.protocols.loss import count_labelled_tokens, cross_entropy_sum
from torchtitan_like.protocols.model_args import BaseModelArgs
from torchtitan_like.protocols.model_spec import ModelSpec
from torchtitan_like.protocols.step_hooks import StepHooks, attach_step_hooks
from torchtitan_like.validate import grad_accumulation_steps

if TYPE_CHECKING:
    from torchtitan_like.distributed.pipeline_schedule import Pipeline

Batch = tuple[torch.Tensor, torch.Tensor]


class Trainer:
    """Builds the job (``__init__``) and runs it (``train``).

    A fork subclasses it and names the subclass in ``[job] trainer`` (or passes it to entry.py's
    ``main(trainer_cls=...)``) instead of copying this file. The documented override points
    (docs/extending.md): ``post_dataloading_process``, ``model_inputs``, ``forward_backward``
    and ``train_step``, each called once per microbatch or step, and ``validate``. Model-side
    loss terms and metrics need no override: protocols/step_hooks.py.
    """

    # configs
    config: JobConfig  # the job as the user wrote it (validated; config/derived.py reads it)
    device: torch.device  # this rank's device
    parallel_dims: ParallelDims  # the degree of every parallel dimension
    model_args: BaseModelArgs  # the model's flavor, with [model] overrides

    # swappable components (a fork may replace one before train())
    tokenizer: Tokenizer
    dataloader: StatefulDataLoader | TokenizedLoader  # this rank's training batches
    model_parts: list[nn.Module]  # the model, or this rank's pipeline stages, parallelized
    converters: ModelConverters  # [model] converters (Float8, ...), applied on meta
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # summed cross-entropy
    pipeline: Pipeline | None  # the PP schedule over model_parts (None without PP)
    optimizers: OptimizersContainer  # one per model part; gated by ft and the spike policy
    lr_schedulers: LRSchedulersContainer  # one per optimizer, stepped with each update
    checkpointer: CheckpointManager  # saves and resumes every Stateful below
    metrics: MetricsLogger  # metrics.jsonl, console, TensorBoard and trackers

    # runtime utilities
    meshes: Meshes  # the named device meshes (dp, dp_cp, fsdp, tp, pp, cp, ...)
    dp_rank: int  # this rank's data-parallel index
    grad_accumulation_steps: int  # microbatches per step
    stage_inputs: list[str]  # the model's keyword inputs beside the tokens
    step_hooks: StepHooks  # the model's own loss terms and metrics
    tied: TiedWeights  # weights tied across pipeline stages: one weight, copies kept equal
    batches: StepBatches  # each step's microbatches from dataloader (its resumable position)
    faults: FaultInjector  # [debug] faults: a killed rank, a dying save, a spike, a slow rank
    ft: fault_tolerance.SingleGroup  # replica groups (torchft): quorum, sums, commit gate
    watch: StepWatch  # stragglers, spikes and injected faults, around every step
    autocast: contextlib.AbstractContextManager  # mixed precision without FSDP
    train_context: Callable  # per microbatch: context parallel, loss parallel
    profiler: Profiler  # traces and memory snapshots

    # state (the checkpoint's train_state)
    step: int  # steps committed; the one in progress is step + 1
    tokens_seen: int  # tokens trained on by the whole job
    spikes: SpikeDetector  # the loss and gradient-norm baseline of the spike policy

    def __init__(self, config: JobConfig, device: torch.device):
        """The build, in the documented order (module docstring), one method per stage."""
        self.config = config
        self.device = device
        self._build_mesh_and_data(config)  # 1-2
        spec = self._build_model(config)  # 3-7
        self._build_optimizers(config, spec)  # 8
        self._load_checkpoint(config, spec)  # 9
        self._build_metrics_and_contexts(config, spec)  # 10
        n_params = dist_utils.local_numel(p for part in self.model_parts for p in part.parameters())
        m, t = config.model, config.training
        logger.info(f"{m.name} {m.flavor}: {self.model_args.num_params():,} parameters "
                    f"({n_params:,} on this rank); layout {self.parallel_dims}; "
                    f"{self.grad_accumulation_steps} microbatch(es) of {t.local_batch_size} x "
                    f"{t.seq_len} tokens per step")
        data = (f"{describe_data(t)}; tokenizer {m.tokenizer_path or 'byte-level'} "
                f"({self.tokenizer.vocab_size:,} tokens)")
        logger.info(describe_run(config, self.parallel_dims, self.model_parts, data))
        if unused := settings_without_effect(config, self.parallel_dims):
            logger.warning(unused)

    def _build_mesh_and_data(self, config: JobConfig) -> None:
        training = config.training
        # 1. Mesh, then the same seed everywhere.
        self.parallel_dims = ParallelDims.from_config(config, dist.get_world_size())
        self.meshes = self.parallel_dims.build_meshes(self.device.type,
                                                      config.comm.init_timeout_seconds)
        dist_utils.set_determinism(config.debug.seed, config.debug.deterministic)
        set_inductor_cache(config.compile, self.meshes)
        announce_first_step(config, self.device.type, self.parallel_dims.ep)

        # 2. Data for this rank's data-parallel index.
        self.tokenizer = build_tokenizer(config.model.tokenizer_path)
        self.dp_rank = self.meshes.dp.get_local_rank()
        data_rank, data_degree = fault_tolerance.data_share(config, self.dp_rank,
                                                            self.parallel_dims.dp)
        self.dataloader = build_dataloader(training, self.tokenizer, dp_rank=data_rank,
                                           dp_degree=data_degree, seed=config.debug.seed)
        self.grad_accumulation_steps = grad_accumulation_steps(config, self.parallel_dims.dp)
        self.batches = StepBatches(lambda: self.dataloader, self.grad_accumulation_steps)

    def _build_model(self, config: JobConfig) -> ModelSpec:
        """Steps 3-7; the model's spec, which the later steps read."""
        device, training = self.device, config.training
        # 3-6. The plain model on meta, converters (Float8), split into this rank's pipeline
        # stages (or kept whole), then the parallelization plan on each part.
        spec, self.model_args = model_spec_and_args(config)
        self.stage_inputs = stage_inputs.required_inputs(spec, config.model.attn_mask_type)
        with torch.device("meta"):
            model = spec.model_cls(self.model_args).to(DTYPES[training.dtype])
        self.converters = build_converters(config, self.parallel_dims, device.type)
        self.converters.convert(model)
        aliases = tied_aliases(model)  # a weight shared by modules that stages may split
        stage_ids, parts = pipeline.split_model(model, spec.pipelining_fn,
                                                self.meshes.pp.get_local_rank(), config)
        self.model_parts = [spec.parallelize_fn(part, self.parallel_dims, self.meshes, config)
                            for part in parts]
        check_plan_applied(spec.name, self.model_parts, self.parallel_dims, config)
        self.step_hooks = StepHooks()  # loss terms and metrics of the model's own modules
        self.step_hooks.split_sequences(self.meshes.cp)
        for part in self.model_parts:
            attach_step_hooks(part, self.step_hooks)

        # 7. Materialise and initialise identically under every layout.
        for part in self.model_parts:
            part.to_empty(device=device)
        dist_utils.init_weights(self.model_parts, lambda: spec.model_cls(self.model_args),
                                config.debug.seed, stage_ids)
        self.tied = TiedWeights(spec.name, aliases, self.model_parts, stage_ids or [0],
                                self.meshes.pp, self.meshes.dense)  # the materialised copies
        self.tied.sync_weights()
        for part in self.model_parts:
            part.train()
        self.loss_fn = checked_loss(maybe_compile_loss(cross_entropy_sum, config.compile),
                                    spec.name, self.parallel_dims.loss_parallel_enabled)
        self.pipeline = None if stage_ids is None else pipeline.build_pipeline(
            self.model_parts, stage_ids, config, self.meshes.pp, device, self.loss_fn,
            forward_context=self.step_hooks.recording)
        return spec

    def _build_optimizers(self, config: JobConfig, spec: ModelSpec) -> None:
        # 8. Optimizer and LR schedule.
        self.optimizers = OptimizersContainer(self.model_parts, config)
        self.lr_schedulers = LRSchedulersContainer(self.optimizers, config.lr_scheduler,
                                                   config.training.steps)
        self.converters.register_optimizer_hooks(self.optimizers, self.model_parts)
        if spec.register_optimizer_hooks is not None:
            spec.register_optimizer_hooks(self.model_parts, self.optimizers,
                                          self.parallel_dims, self.meshes)
        self.step = self.tokens_seen = 0
        self.spikes = SpikeDetector(  # its baseline is part of the checkpoint
            config.spike, self.grad_accumulation_steps * config.training.local_batch_size
            * self.parallel_dims.dp)

    def _load_checkpoint(self, config: JobConfig, spec: ModelSpec) -> None:
        # 9. Resume from the latest complete checkpoint, if there is one.
        self.faults = FaultInjector(config, dist.get_rank())
        self.checkpointer = CheckpointManager(
            config, parallel_dims=self.parallel_dims, model_parts=self.model_parts,
            optimizers=self.optimizers, lr_schedulers=self.lr_schedulers,
            dataloader=self.batches, train_state=self, device=self.device, faults=self.faults,
            hf_adapter=spec.hf_adapter(self.model_args) if spec.hf_adapter else None,
            tied_aliases=self.tied.aliases,
        )
        self.checkpointer.load()
        group_tokens = self.tokens_per_rank_step * self.parallel_dims.dp  # one group's step
        self.ft = fault_tolerance.build(config, self.checkpointer.states, self.step, self.device,
                                        batches_committed=self.tokens_seen // group_tokens)

    def _build_metrics_and_contexts(self, config: JobConfig, spec: ModelSpec) -> None:
        # 10. Metrics (a resumed run continues its metrics.jsonl), autocast, CP, profiler.
        device, rank = self.device, dist.get_rank()
        self.metrics = build_metrics(config, self.parallel_dims, self.model_args, device, rank,
                                     self.step)
        self.watch = StepWatch(StepClock(dist.get_world_size(), config.metrics.straggler_threshold),
                               self.spikes, self.faults, self.global_sum, self.metrics.log_event)
        self.optimizers.gates += [self.ft.commit, self.watch.keeps_update]  # in this order
        self.autocast = dist_utils.maybe_autocast(
            self.parallel_dims.fsdp_enabled, DTYPES[config.training.mixed_precision_param], device)
        self.train_context = dist_utils.train_context(
            self.parallel_dims.loss_parallel_enabled, context_parallel.build_context(
                self.parallel_dims, self.meshes.cp, config, spec, self.model_parts))
        self.profiler = Profiler(config.profiling, config.job.dump_folder, rank, device,
                                 start_step=self.step)

    def state_dict(self) -> dict[str, int | str]:
        """The trainer's own part of a checkpoint (checkpoint/states.py adds RNG states)."""
        return {"step": self.step, "tokens_seen": self.tokens_seen, **self.spikes.state_dict()}

    def load_state_dict(self, state: dict[str, int | str]) -> None:
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.spikes.load_state_dict(state)

    def post_dataloading_process(self, inputs: torch.Tensor, labels: torch.Tensor) -> Batch:
        """One loaded microbatch (on the CPU), as the step will use it; the default keeps it."""
        return inputs, labels

    def model_inputs(self, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's keyword inputs beside the tokens, passed to every pipeline stage: those
        ``ModelSpec.stage_inputs`` declares, and the document ids under ``[model]
        attn_mask_type = "block_causal"`` (models/stage_inputs.py)."""
        return stage_inputs.batch_inputs(self.stage_inputs, inputs, labels, self.tokenizer.eos_id)

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor,
                         global_tokens: torch.Tensor) -> torch.Tensor:
        """One microbatch (one schedule step under PP); returns its share of the step's global
        mean loss (under PP: on the last stage, 0 on the other ranks)."""
        extra = self.model_inputs(inputs, labels)
        if self.pipeline is not None:  # the schedule runs forward and backward of every stage
            with self.train_context(inputs, labels), self.autocast:
                return self.pipeline.forward_backward(inputs, labels, global_tokens, **extra)
        (model,) = self.model_parts
        with self.train_context(inputs, labels):  # under CP: shards inputs and labels in place
            with self.autocast, self.step_hooks.recording():
                loss = self.loss_fn(model(inputs, **extra), labels) / global_tokens
            loss.backward()
        return loss.detach()

    def global_tokens(self, microbatches: list[Batch]) -> torch.Tensor:
        """The step's loss normaliser: its labelled tokens summed over the data-parallel ranks
        and the replica groups (the spike_step fault scales it)."""
        labelled = sum(count_labelled_tokens(labels) for _, labels in microbatches)
        summed = dist_utils.all_reduce_sum(labelled.to(self.device), self.meshes.dp)
        return self.watch.loss_normaliser(self.ft.sum_over_groups(summed))

    def train_step(self, microbatches: list[Batch]) -> tuple[torch.Tensor, float]:
        """One optimizer step: this rank's share of the loss, and the global gradient norm.
        The update is gated (``optimizers.gates``): a step the replica groups failed raises
        fault_tolerance.StepDropped, a spike's update is withheld (components/step_watch.py)."""
        self.optimizers.zero_grad()
        global_tokens = self.global_tokens(microbatches)
        self.step_hooks.begin_step(global_tokens)
        loss = sum(
            self.forward_backward(inputs.to(self.device), labels.to(self.device), global_tokens)
            for inputs, labels in microbatches
        )
        self.step_hooks.end_step()
        loss = self.ft.reduce_gradients(self.model_parts, loss)  # over the replica groups
        self.tied.reduce_gradients()  # weights tied across pipeline stages
        params = [p for part in self.model_parts for p in part.parameters()]
        grad_norm = dist_utils.clip_grad_norm_(params, self.config.training.max_norm,
                                               self.meshes.pp, uncounted=self.tied.copies).item()
        self.watch.check(loss, grad_norm)  # not finite: stops here, weights untouched
        if self.optimizers.step():  # unless a gate withheld the update
            self.lr_schedulers.step()
        return loss, grad_norm

    def global_sum(self, loss: torch.Tensor) -> torch.Tensor:
        """Sum loss shares over the ranks that hold them: data/context-parallel ranks, then the
        pipeline ranks (only the last stage has a nonzero share)."""
        over_dp_cp = dist_utils.all_reduce_sum(loss, self.meshes.dp_cp)
        return dist_utils.all_reduce_sum(over_dp_cp, self.meshes.pp)

    def validate(self) -> float:
        """Mean loss over the fixed global held-out set (components/validation.py)."""
        batches = held_out_batches(self.config, self.tokenizer, dp_rank=self.dp_rank,
                                   dp_degree=self.parallel_dims.dp,
                                   microbatches=self.grad_accumulation_steps)
        return held_out_loss(self.model_parts, batches, self.loss_sum, self.global_sum,
                             self.meshes.dp, self.device)

    def loss_sum(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One microbatch's summed loss, forward only (under PP: on the last stage)."""
        extra = self.model_inputs(inputs, labels)
        with self.train_context(inputs, labels), self.autocast:
            if self.pipeline is not None:
                return self.pipeline.loss_sum(inputs, labels, **extra)
            return self.loss_fn(self.model_parts[0](inputs, **extra), labels)

    def train(self) -> None:
        if self.checkpointer.create_seed():  # [checkpoint] create_seed_checkpoint: no training
            self.metrics.close()
            return
        logger.info(f"training {self.config.training.steps} steps; writing to "
                    f"{self.config.job.dump_folder}")
        try:
            self.train_steps()
            self.ft.close()
        except TrainingDiverged:  # a save in flight completes: the latest checkpoint stays good
            self.checkpointer.close()
            self.metrics.close()
            raise
        self.checkpointer.close()
        if (exports_last_save(self.config) and dist.get_rank() == 0
                and self.ft.saves_checkpoints and not self.watch.holds_checkpoint(self.step)):
            export_last_save(self.config, self.checkpointer.folder, self.step)
        self.metrics.close()
        self.profiler.close()
        logger.info(f"done: {self.metrics.where()}")

    @property
    def tokens_per_rank_step(self) -> int:
        """Tokens one data-parallel rank trains on in one step (all its microbatches)."""
        t = self.config.training
        return self.grad_accumulation_steps * t.local_batch_size * t.seq_len

    def train_steps(self) -> None:
        """The loop, until the last step: data, step, metrics, faults, checkpoint, validation.
        ``self.step`` counts a step once committed: one the replica groups failed ends in
        ``ft.quorum``, uncounted, and the next batch retries it."""
        while self.step < self.config.training.steps:  # the quorum may heal: step is after it
            with self.ft.quorum(lambda: self.step + 1, self.metrics.log_event) as step:
                with self.watch.loading(step):  # each rank times its own (stragglers.py)
                    microbatches = [self.post_dataloading_process(*batch)
                                    for batch in self.batches.next_step()]
                self.metrics.add_step(self.tokens_per_rank_step, self.watch.data_seconds)
                lr = self.lr_schedulers.last_lr
                with self.profiler.stepping(step), self.watch.computing():
                    loss, grad_norm = self.train_step(microbatches)
                self.step = step
                self.tokens_seen += (self.tokens_per_rank_step * self.parallel_dims.dp
                                     * self.ft.participants)
                self.log_step(loss, grad_norm, lr)
                self.watch.after_step(step)  # the fault point "step", before the checkpoint
                self.save_checkpoint()
                self.validate_when_due()

    def log_step(self, loss: torch.Tensor, grad_norm: float, lr: float) -> None:
        """The step's record (metrics.jsonl, console, trackers): the first step, every
        ``[metrics] log_freq`` steps and the last."""
        step, last = self.step, self.step == self.config.training.steps
        if not (step == 1 or step % self.config.metrics.log_freq == 0 or last):
            return
        global_loss = self.global_sum(loss).item()
        model_values, console = self.step_hooks.reduce(self.meshes.dp_cp, self.meshes.pp)
        self.metrics.log(step, {
            "loss": global_loss, "grad_norm": grad_norm, "lr": lr,
            "epoch": data_epoch(self.dataloader), "tokens_seen": self.tokens_seen,
            **report_mixture(self.dataloader), **model_values,
            **self.watch.window_stats(), **self.ft.record()}, console=console)

    def save_checkpoint(self) -> None:
        """The step's checkpoint when due: written by this step's writer (the one group, or
        rank 0 of the quorum's), never from a spike's state (postponed to the next step)."""
        with self.metrics.paused("checkpoint"):
            if self.ft.saves_checkpoints:
                self.checkpointer.save(self.step, self.step == self.config.training.steps,
                                       self.watch.holds_checkpoint(self.step))

    def validate_when_due(self) -> None:
        """``validate`` every ``[validation] freq`` steps and at the last."""
        v = self.config.validation
        if v.enable and (self.step % v.freq == 0 or self.step == self.config.training.steps):
            with self.metrics.paused("validation"):
                self.metrics.log_validation(self.step, self.validate())


if __name__ == "__main__":  # entry.py's main checks [job] trainer against the importable Trainer
    from torchtitan_like.entry import main

    main()
