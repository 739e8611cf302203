"""The trainer: builds everything in the documented order, then runs the loop.

Run it through ``./run_train.sh`` (torchrun), or ``python -m torchtitan_like.train`` for one
process. Build order (docs/design.md, "Data flow"): mesh -> data -> model on meta -> converters ->
pipeline split -> parallelize plan -> materialise -> optimizer/scheduler -> checkpoint
load -> metrics -> loop.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from torchtitan_like.components import run_folder
from torchtitan_like.components.checkpoint import CheckpointManager
from torchtitan_like.components.checkpoint.folder import finished_run
from torchtitan_like.components.converters import build_converters
from torchtitan_like.components.data.checks import describe_data
from torchtitan_like.components.data.dataloader import build_dataloader, data_epoch
from torchtitan_like.components.data.tokenized import report_mixture
from torchtitan_like.components.data.tokenizer import build_tokenizer
from torchtitan_like.components.fault_injection import FaultInjector
from torchtitan_like.components.first_step import announce_first_step
from torchtitan_like.components.hf_export import export_last_save, exports_last_save
from torchtitan_like.components.lr_scheduler import LRSchedulersContainer
from torchtitan_like.components.metrics import MetricsLogger, peak_tflops
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.components.profiling import Profiler
from torchtitan_like.components.run_summary import describe_run, settings_without_effect
from torchtitan_like.components.spikes import SpikeDetector, TrainingDiverged
from torchtitan_like.components.stragglers import StepClock
from torchtitan_like.components.trackers import build_trackers
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.manager import did_you_mean, import_user_module, to_toml
from torchtitan_like.distributed import context_parallel, fault_tolerance, lifecycle, pipeline
from torchtitan_like.distributed import utils as dist_utils
from torchtitan_like.distributed.compile import maybe_compile_loss, set_inductor_cache
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.plan_check import check_plan_applied, checked_loss
from torchtitan_like.distributed.tied_weights import TiedWeights, tied_aliases
from torchtitan_like.exit_codes import ExitCode
from torchtitan_like.failure_report import report_failure
from torchtitan_like.logging import init_logger, logger
from torchtitan_like.models import stage_inputs
from torchtitan_like.models.registry import model_spec_and_args
from torchtitan_like.protocols.loss import count_labelled_tokens, cross_entropy_sum
from torchtitan_like.protocols.model_spec import ModelSpec
from torchtitan_like.protocols.step_hooks import StepHooks, attach_step_hooks
from torchtitan_like.validate import grad_accumulation_steps, parse_args

Batch = tuple[torch.Tensor, torch.Tensor]


class Trainer:
    """Builds the job (``__init__``) and runs it (``train``).

    A fork subclasses it and passes the subclass to ``main(trainer_cls=...)`` instead of
    copying this file. Documented override points, each called once per microbatch or step:

    - ``post_dataloading_process(inputs, labels)``: a microbatch right after loading, before
      the labelled tokens are counted (e.g. mask labels, build extra inputs);
    - ``model_inputs(inputs, labels)``: the model's keyword inputs beside the tokens, handed
      to every pipeline stage (default: what ``ModelSpec.stage_inputs`` declares, and the
      document ids under block-causal attention; models/stage_inputs.py);
    - ``forward_backward(inputs, labels, global_tokens)``: forward and backward of one
      microbatch (one schedule step under PP), returning its share of the step's loss;
    - ``train_step(microbatches)``: a whole optimizer step.
    Model-side loss terms and metrics need no override: protocols/step_hooks.py.
    """

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
        logger.info(
            f"{config.model.name} {config.model.flavor}: {self.model_args.num_params():,} "
            f"parameters ({n_params:,} on this rank); layout {self.parallel_dims}; "
            f"{self.grad_accumulation_steps} microbatch(es) of {config.training.local_batch_size}"
            f" x {config.training.seq_len} tokens per step"
        )
        logger.info(describe_run(config, self.parallel_dims, self.model_parts, self.data_text))
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
        tokenizer = config.model.tokenizer_path or "byte-level"
        self.data_text = (f"{describe_data(training)}; tokenizer {tokenizer} "
                          f"({self.tokenizer.vocab_size:,} tokens)")

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
        stage_ids, parts = pipeline.split_model(
            model, spec.pipelining_fn, self.meshes.pp.get_local_rank(), config
        )
        self.model_parts = [
            spec.parallelize_fn(part, self.parallel_dims, self.meshes, config) for part in parts
        ]
        check_plan_applied(spec.name, self.model_parts, self.parallel_dims, config)
        self.step_hooks = StepHooks()  # loss terms and metrics of the model's own modules
        self.step_hooks.split_sequences(self.meshes.cp)
        for part in self.model_parts:
            attach_step_hooks(part, self.step_hooks)

        # 7. Materialise and initialise identically under every layout.
        for part in self.model_parts:
            part.to_empty(device=device)
        dist_utils.init_weights(
            self.model_parts, lambda: spec.model_cls(self.model_args), config.debug.seed, stage_ids
        )
        self.tied = TiedWeights(spec.name, aliases, self.model_parts, stage_ids or [0],
                                self.meshes.pp, self.meshes.dense)  # the materialised copies
        self.tied.sync_weights()
        for part in self.model_parts:
            part.train()
        self.loss_fn = checked_loss(maybe_compile_loss(cross_entropy_sum, config.compile),
                                    spec.name, self.parallel_dims.loss_parallel_enabled)
        self.pipeline = None if stage_ids is None else pipeline.Pipeline(
            self.model_parts, stage_ids, config, self.meshes.pp, device, self.loss_fn,
            forward_context=self.step_hooks.recording,
        )
        return spec

    def _build_optimizers(self, config: JobConfig, spec: ModelSpec) -> None:
        # 8. Optimizer and LR schedule.
        self.optimizers = OptimizersContainer(self.model_parts, config.optimizer)
        self.lr_schedulers = LRSchedulersContainer(
            self.optimizers, config.lr_scheduler, config.training.steps
        )
        self.converters.register_optimizer_hooks(self.optimizers, self.model_parts)
        if spec.register_optimizer_hooks is not None:
            spec.register_optimizer_hooks(self.model_parts, self.optimizers,
                                          self.parallel_dims, self.meshes)
        self.step = 0
        self.tokens_seen = 0
        self.spikes = SpikeDetector(  # its baseline is part of the checkpoint
            config.spike, self.grad_accumulation_steps * config.training.local_batch_size
            * self.parallel_dims.dp)

    def _load_checkpoint(self, config: JobConfig, spec: ModelSpec) -> None:
        # 9. Resume from the latest complete checkpoint, if there is one.
        self.faults = FaultInjector(config, dist.get_rank())
        self.checkpointer = CheckpointManager(
            config, parallel_dims=self.parallel_dims, model_parts=self.model_parts,
            optimizers=self.optimizers, lr_schedulers=self.lr_schedulers,
            dataloader=self.dataloader, train_state=self, device=self.device, faults=self.faults,
            hf_adapter=spec.hf_adapter(self.model_args) if spec.hf_adapter else None,
            tied_aliases=self.tied.aliases,
        )
        self.checkpointer.load()
        group_tokens = self.tokens_per_rank_step * self.parallel_dims.dp  # one group's step
        self.ft = fault_tolerance.build(config, self.checkpointer.states, self.step, self.device,
                                        batches_committed=self.tokens_seen // group_tokens)

    def _build_metrics_and_contexts(self, config: JobConfig, spec: ModelSpec) -> None:
        # 10. Metrics (a resumed run continues its metrics.jsonl), autocast, CP, profiler.
        device, training = self.device, config.training
        compute_dtype = DTYPES[training.mixed_precision_param]
        self.metrics = MetricsLogger(
            dump_folder=config.job.dump_folder,
            writer=dist.get_rank() == 0,
            enable_tensorboard=config.metrics.enable_tensorboard,
            tb_folder=config.metrics.save_tb_folder,
            device=device,
            flops_per_token=self.model_args.flops_per_token(training.seq_len),
            peak=peak_tflops(device, config.metrics.peak_tflops, compute_dtype),
            replica_devices=self.parallel_dims.non_data_parallel_size,
            world_size=self.parallel_dims.world_size,
            resume_step=self.step,
            total_steps=training.steps,
            trackers=build_trackers(config, self.step) if dist.get_rank() == 0 else [],
            config_toml=to_toml(config),
        )
        self.step_clock = StepClock(dist.get_world_size(), config.metrics.straggler_threshold)
        self.autocast = dist_utils.maybe_autocast(
            self.parallel_dims.fsdp_enabled, compute_dtype, device
        )
        self.train_context = dist_utils.train_context(
            self.parallel_dims.loss_parallel_enabled,
            context_parallel.build_context(
                self.parallel_dims, self.meshes.cp, config, spec, self.model_parts
            ),
        )
        self.profiler = Profiler(config.profiling, config.job.dump_folder, dist.get_rank(),
                                 device, start_step=self.step)

    def state_dict(self) -> dict[str, int | str]:
        """The trainer's own part of a checkpoint (checkpoint/states.py adds RNG states)."""
        return {"step": self.step, "tokens_seen": self.tokens_seen, **self.spikes.state_dict()}

    def load_state_dict(self, state: dict[str, int | str]) -> None:
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.spikes.load_state_dict(state)

    def post_dataloading_process(self, inputs: torch.Tensor, labels: torch.Tensor) -> Batch:
        """One loaded microbatch (on the CPU), as the step will use it; the default keeps it."""
        return inputs, labels

    def model_inputs(self, inputs: torch.Tensor, labels: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
        """The model's keyword inputs beside the tokens, passed to every pipeline stage: those
        ``ModelSpec.stage_inputs`` declares, and the document ids under ``[model]
        attn_mask_type = "block_causal"`` (models/stage_inputs.py)."""
        return stage_inputs.batch_inputs(self.stage_inputs, inputs, labels,
                                         self.tokenizer.eos_id)

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

    def train_step(self, microbatches: list[Batch]) -> tuple[torch.Tensor, float]:
        self.optimizers.zero_grad()
        labelled = sum(count_labelled_tokens(labels) for _, labels in microbatches)
        global_tokens = self.faults.spike(self.step, self.ft.sum_over_groups(
            dist_utils.all_reduce_sum(labelled.to(self.device), self.meshes.dp)))
        self.step_hooks.begin_step(global_tokens)
        loss = sum(
            self.forward_backward(inputs.to(self.device), labels.to(self.device), global_tokens)
            for inputs, labels in microbatches
        )
        self.step_hooks.end_step()
        loss = self.ft.reduce_gradients(self.model_parts, loss)  # over the replica groups
        self.tied.reduce_gradients()  # weights tied across pipeline stages
        grad_norm = dist_utils.clip_grad_norm_(
            [p for part in self.model_parts for p in part.parameters()],
            self.config.training.max_norm,
            self.meshes.pp,
            uncounted=self.tied.copies,
        ).item()
        if not math.isfinite(grad_norm):
            raise TrainingDiverged(
                f"step {self.step}: gradient norm is {grad_norm} (local loss share "
                f"{loss.item():.4g}); stopped before the optimizer step, weights untouched. "
                "Lower [optimizer] lr, raise warmup, or check the data."
            )
        if not self.ft.should_commit():  # a replica group failed in this step
            return loss, grad_norm
        if self.spikes.enabled and self.spikes.skips_update(
                self.step, self.global_sum(loss).item(), grad_norm, self.metrics.log_event):
            return loss, grad_norm  # a spike's update is discarded (components/spikes.py)
        self.optimizers.step()
        self.lr_schedulers.step()
        return loss, grad_norm

    def global_sum(self, loss: torch.Tensor) -> torch.Tensor:
        """Sum loss shares over the ranks that hold them: data/context-parallel ranks, then the
        pipeline ranks (only the last stage has a nonzero share)."""
        return dist_utils.all_reduce_sum(
            dist_utils.all_reduce_sum(loss, self.meshes.dp_cp), self.meshes.pp
        )

    @torch.no_grad()
    def validate(self) -> float:
        """Mean loss over a fixed global held-out set: the first ``[validation] steps`` global
        batches of the validation split, the same sequences whatever the layout.

        A global batch is ``global_batch_size`` sequences, dealt out like a training step's:
        in rounds of ``dp x local_batch_size`` consecutive samples, rank r taking the r-th
        block (components/data/datasets.py). So each rank reads ``steps x accumulation
        steps`` local batches, and together the data-parallel ranks read exactly the first
        ``steps x global_batch_size`` sequences, under any dp, local batch size, TP, CP or PP
        (which share their rank's batches). Every pass reads the same ones, so passes compare.
        """
        for part in self.model_parts:
            part.eval()
        batches = build_dataloader(self.config.training, self.tokenizer, dp_rank=self.dp_rank,
                                   dp_degree=self.parallel_dims.dp, split="validation",
                                   seed=self.config.debug.seed)
        local_batches = self.config.validation.steps * self.grad_accumulation_steps
        loss_sum = torch.zeros((), device=self.device)
        tokens = torch.zeros((), device=self.device, dtype=torch.long)
        for inputs, labels in itertools.islice(batches, local_batches):
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            tokens += count_labelled_tokens(labels)  # before CP shards the labels
            extra = self.model_inputs(inputs, labels)
            with self.train_context(inputs, labels), self.autocast:
                loss_sum += (self.pipeline.loss_sum(inputs, labels, **extra)
                             if self.pipeline is not None
                             else self.loss_fn(self.model_parts[0](inputs, **extra), labels))
        for part in self.model_parts:
            part.train()
        loss_sum = self.global_sum(loss_sum)
        return (loss_sum / dist_utils.all_reduce_sum(tokens, self.meshes.dp)).item()

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
                and self.ft.saves_checkpoints and not self.spikes.holds_checkpoint(self.step)):
            export_last_save(self.config, self.checkpointer.folder, self.step)
        self.metrics.close()
        self.profiler.close()
        folder, metrics = self.config.job.dump_folder, self.config.metrics
        tensorboard = f"{folder}/{metrics.save_tb_folder}"
        logger.info(f"done: metrics in {folder}/metrics.jsonl" + (
            f", TensorBoard: tensorboard --logdir {tensorboard}" if metrics.enable_tensorboard
            else ""))

    @property
    def tokens_per_rank_step(self) -> int:
        """Tokens one data-parallel rank trains on in one step (all its microbatches)."""
        t = self.config.training
        return self.grad_accumulation_steps * t.local_batch_size * t.seq_len

    def train_steps(self) -> None:
        """The loop: data, step, metrics, faults, checkpoint, validation, until the last step."""
        training, validation = self.config.training, self.config.validation
        data = iter(self.dataloader)
        tokens_per_step = self.tokens_per_rank_step
        while self.step < training.steps:
            if self.ft.start_step():  # healed from a peer: its data position too
                data = iter(self.dataloader)
            self.step += 1
            with self.step_clock.phase("data"):  # each rank times its own (stragglers.py)
                self.faults.slow_down()
                microbatches = [self.post_dataloading_process(*next(data))
                                for _ in range(self.grad_accumulation_steps)]
            self.metrics.add_step(tokens_per_step, self.step_clock.last("data"))
            self.tokens_seen += tokens_per_step * self.parallel_dims.dp * self.ft.participants
            lr = self.lr_schedulers.last_lr
            self.step_clock.sync()
            with self.step_clock.phase("compute"):
                loss, grad_norm = self.train_step(microbatches)
            self.profiler.step(self.step)
            if not self.ft.committed:  # its batch is skipped, the next one retries the step
                self.metrics.log_event({"step": self.step, **self.ft.record()})
                self.step -= 1
                self.tokens_seen -= tokens_per_step * self.parallel_dims.dp * self.ft.participants
                continue

            last = self.step == training.steps
            if self.step == 1 or self.step % self.config.metrics.log_freq == 0 or last:
                global_loss = self.global_sum(loss).item()
                model_values, console = self.step_hooks.reduce(self.meshes.dp_cp, self.meshes.pp)
                self.metrics.log(self.step, {
                    "loss": global_loss, "grad_norm": grad_norm, "lr": lr,
                    "epoch": data_epoch(self.dataloader), "tokens_seen": self.tokens_seen,
                    **report_mixture(self.dataloader), **model_values,
                    **self.step_clock.window_stats(), **self.ft.record()}, console=console)
            self.faults.after_step(self.step)
            with self.metrics.paused("checkpoint"):  # never from a spike's state; the writer's
                if self.ft.saves_checkpoints:
                    self.checkpointer.save(self.step, last, self.spikes.holds_checkpoint(self.step))
            if validation.enable and (self.step % validation.freq == 0 or last):
                with self.metrics.paused("validation"):
                    self.metrics.log_validation(self.step, self.validate())


def trainer_class(config: JobConfig, default: type[Trainer] | None = None) -> type[Trainer]:
    """The class ``[job] trainer`` names ("module:Class", the module a dotted name or a .py
    path), else ``default`` (else ``Trainer``); ConfigError when the module or the class does
    not exist, the class is not a ``Trainer``, or it contradicts ``default``."""
    named = config.job.trainer
    if not named:
        return default or Trainer
    module_name, colon, class_name = named.rpartition(":")
    if not (colon and module_name and class_name.isidentifier()):
        raise ConfigError(f"[job] trainer = {named!r}: expected \"module:Class\", e.g. "
                          "\"my_train.py:MyTrainer\" or \"my_package.train:MyTrainer\"")
    module = import_user_module(module_name, "[job] trainer")
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if isinstance(v, type)]
        raise ConfigError(f"[job] trainer = {named!r}: {module_name} has no {class_name!r}"
                          + did_you_mean(class_name, classes))
    if not (isinstance(cls, type) and issubclass(cls, Trainer)):
        raise ConfigError(f"[job] trainer = {named!r}: {class_name} is not a subclass of "
                          "torchtitan_like.train.Trainer")
    if default is not None and default is not cls:
        raise ConfigError(f"[job] trainer = {named!r}, but main() was given trainer_cls="
                          f"{default.__name__}; keep one of them")
    return cls


def _nothing_left_to_do(config: JobConfig) -> str | None:
    """The line a finished run prints when restarted: the checkpoint it would resume from is
    at its last step already."""
    c = config.checkpoint
    if not c.enable or c.create_seed_checkpoint or "train_state" in c.exclude_from_loading:
        return None
    return finished_run(Path(config.job.dump_folder) / c.folder, c.load_step,
                        config.training.steps)


def run(argv: list[str], trainer_cls: type[Trainer] | None = None) -> int:
    """The job from its command line to its exit code: parse and check the config, join the
    process group, hold the dump folder (components/run_folder.py), build ``[job] trainer``
    (or ``trainer_cls``; default ``Trainer``) and train. After the first step every training
    process group gets ``[comm] train_timeout_seconds``."""
    trainer = None
    try:
        config = parse_args(argv, int(os.environ.get("WORLD_SIZE", 1)))
        trainer_cls = trainer_class(config, trainer_cls)
        if done := _nothing_left_to_do(config):  # before any process group, file or model
            logger.info(done)
            return ExitCode.OK
        device = dist_utils.init_distributed(config.comm.init_timeout_seconds)
        with run_folder.claimed(config):
            trainer = trainer_cls(config, device)
            groups = [None, *dist_utils.mesh_groups(trainer.meshes.all())]
            after_first_step(trainer.optimizers, lambda: dist_utils.set_timeout(
                config.comm.train_timeout_seconds, groups))
            trainer.train()
    except BaseException as e:  # every way out gets its line and its code
        return report_failure(e)
    finally:
        if trainer is not None:
            trainer.metrics.close()  # TensorBoard's buffered events, also after a failure
    return ExitCode.OK


def after_first_step(optimizers: OptimizersContainer, fn: Callable[[], None]) -> None:
    """Call ``fn`` once, right after the first optimizer step."""
    handles = []

    def once(*_: object) -> None:
        for handle in handles:
            handle.remove()
        fn()

    handles.extend(opt.register_step_post_hook(once) for opt in optimizers.optimizers[:1])


def main(argv: list[str] | None = None, trainer_cls: type[Trainer] | None = None) -> NoReturn:
    """The trainer's entry point: runs ``[job] trainer`` (or ``trainer_cls``, a fork's own
    ``Trainer`` subclass; default ``Trainer``). Ends the
    process (distributed/lifecycle.py: with the torchrun agent, and without gloo's exit
    race) with the job's exit code (exit_codes.py)."""
    lifecycle.die_with_agent()
    init_logger()
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata 0.11
    lifecycle.exit_process(run(sys.argv[1:] if argv is None else argv, trainer_cls))


if __name__ == "__main__":
    # The importable module's main: a trainer module that imports torchtitan_like.train then
    # subclasses the very Trainer that trainer_class checks against (not __main__'s copy).
    from torchtitan_like.train import main as importable_main

    importable_main()
