"""Replica groups that survive a failure: ``[fault_tolerance]`` through torchft.

Under ``enable`` the data-parallel replicate dimension becomes *replica groups*: each group is
its own torchrun job (``dp_replicate = 1`` inside, every other dimension as usual) and rank r
of every group meets rank r of the others in torchft's managed process group, reconfigured at
every step by a quorum that the lighthouse (``TORCHFT_LIGHTHOUSE``) forms of the groups alive.
One step of a group lives in the objects it concerns; the trainer's loop never branches on it:

1. ``quorum``, the context around the step: first the quorum (``start_step``). A group behind
   the others (restarted after a failure) *heals* there: it receives model, optimizer, LR
   schedule, train state (step, RNG) and data position from a live peer over the managed
   process group (torchft's PGTransport, straight into its own tensors) instead of reading
   storage, and then attempts the step after its peer's;
2. ``sum_over_groups``: the step's labelled tokens summed over the participating groups, the
   loss normaliser, so that the groups' gradients *add up* to the gradient of their joint
   global batch (as HSDP's do);
3. ``reduce_gradients``: after backward, the gradient shards (and the loss share) summed over
   the participating groups in one flat all-reduce per dtype;
4. ``commit``, the first gate of the optimizer step (components/optimizer.py): the optimizer
   steps only when every rank of the group saw every collective succeed. Otherwise it raises
   ``StepDropped``, which ends the step in ``quorum`` (its record logged): the step is not
   counted, and the next batch retries it.

A failed collective (a peer died) leaves the gradients as they were and the step uncommitted;
the next quorum forms without the dead group once the lighthouse misses its heartbeats.

The persistent (DCP) checkpoint of a step, in the shared ``<dump_folder>/<checkpoint folder>``,
is written by the *writer* of that step: the group of rank 0 in the step's quorum (torchft
orders a quorum's groups by replica id, ``replica_<i>`` compared as strings: the lowest live
group for up to 10 groups), if it committed the step. Every rank of a group reads its rank
from the same quorum (its group's manager asked the lighthouse once for all of them), so the
group's ranks agree and enter DCP's collective save together, and one quorum has one rank 0,
so no two groups write one step. A writer that dies, even inside its save, leaves at most a
``step-<N>.replica_<i>.partial`` folder that nobody loads (checkpoint/folder.py); the next
quorum without it has another rank 0, which writes the next due checkpoint. Retention
(``keep_latest_k``) is judged from the folder's contents, not a writer's memory, so it holds
across a change of writer. Each group logs into ``<dump_folder>/replica_<id>`` (its own
folder lock).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.logging import logger

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""The lighthouse's address (``http://host:29510``), read by torchft's Manager."""

EXTRA_HINT = "pip install -e '.[ft]'"


def validate(config: JobConfig, device_type: str) -> None:
    """ConfigError for a ``[fault_tolerance]`` section that cannot run (one line each)."""
    ft = config.fault_tolerance
    if not ft.enable:  # its fields are then settings without effect (config/switches.py)
        return
    if importlib.util.find_spec("torchft") is None:
        raise ConfigError(f"[fault_tolerance] enable needs torchft (the ft extra): {EXTRA_HINT}")
    if not os.environ.get(LIGHTHOUSE_ENV):
        raise ConfigError(f"[fault_tolerance] enable: set {LIGHTHOUSE_ENV}=http://<host>:29510, "
                          "the address of a running torchft_lighthouse (docs/fault-tolerance.md)")
    if config.parallelism.data_parallel_replicate_degree != 1:
        raise ConfigError("[fault_tolerance] enable: the replica groups are the dp_replicate "
                          "dimension, so set [parallelism] data_parallel_replicate_degree = 1 "
                          "(each group is its own torchrun job; group_size says how many)")
    if not 0 <= ft.replica_id < ft.group_size:
        raise ConfigError(f"[fault_tolerance] replica_id = {ft.replica_id}: must be in "
                          f"0..{ft.group_size - 1} (group_size = {ft.group_size})")
    if ft.min_replica_size > ft.group_size:
        raise ConfigError(f"[fault_tolerance] min_replica_size = {ft.min_replica_size} exceeds "
                          f"group_size = {ft.group_size}: no quorum could ever commit a step")
    if ft.process_group == "nccl" and device_type != "cuda":
        raise ConfigError(f'[fault_tolerance] process_group = "nccl" needs CUDA; this job runs on '
                          f'{device_type}: use "gloo"')
    if config.validation.enable:
        raise ConfigError("[validation] enable is not supported with [fault_tolerance] enable "
                          "(each group holds only its share of the data): turn one off")
    if config.checkpoint.enable and config.checkpoint.keep_latest_k == 1:
        raise ConfigError("[checkpoint] keep_latest_k = 1 with [fault_tolerance] enable: a "
                          "group starting again may be reading the one checkpoint while a live "
                          "group's next save deletes it; keep at least 2 (or 0: all)")


def group_name(config: JobConfig) -> str:
    """This replica group's name: its torchft replica id, its dump sub-folder and, as a
    checkpoint writer, the tag of its cut-short saves."""
    return f"replica_{config.fault_tolerance.replica_id}"


def place_group(config: JobConfig) -> None:
    """Under ``enable``: this group's outputs go to ``<dump_folder>/replica_<id>`` (its own
    lock, metrics and traces), the checkpoints of the job to the shared
    ``<dump_folder>/<checkpoint folder>`` (written by each step's writer, read by every
    group)."""
    ft = config.fault_tolerance
    dump = Path(config.job.dump_folder)
    if not ft.enable or dump.name == group_name(config):  # placed already (config.toml)
        return
    config.checkpoint.folder = str(dump / config.checkpoint.folder)
    config.job.dump_folder = str(dump / group_name(config))


def data_share(config: JobConfig, dp_rank: int, dp_degree: int) -> tuple[int, int]:
    """(rank, degree) among the data readers of the whole job: group ``replica_id`` reads the
    ``replica_id``-th of ``group_size`` shares of every global batch, each of its data-parallel
    ranks a part of that share (the layout HSDP's dp_replicate x dp_shard ranks read)."""
    ft = config.fault_tolerance
    if not ft.enable:
        return dp_rank, dp_degree
    return ft.replica_id * dp_degree + dp_rank, ft.group_size * dp_degree


def attempt_store(hostname: str, timeout: datetime.timedelta) -> tuple[Any, str, int]:
    """A fresh store for this torchrun attempt's torchft Manager: (the store, its host, port).

    The Manager meets its group's ranks in the TCPStore at the address it is given, under
    fixed keys (the manager server's address, the replica id). torchrun's own store outlives
    the attempts of a restarted group (``MAX_RESTARTS`` > 0): the restarted ranks would read
    the previous attempt's keys, and a rank that reads the dead manager's address before the
    new rank 0 overwrites it never joins (rank 0's quorum times out). So rank 0 of every
    attempt serves a new store on a free port (bound before its port is published: no race)
    and publishes it in torchrun's store under the attempt's prefix, the prefix the job's
    process group already meets under (distributed/utils.py)."""
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"/attempt_{attempt}/torchft_store"
    job = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        is_master=False, timeout=timeout, wait_for_workers=False)
    own = None
    if int(os.environ["RANK"]) == 0:
        host = hostname or socket.gethostname()
        own = dist.TCPStore(host, 0, is_master=True, timeout=timeout, wait_for_workers=False)
        job.set(key, f"{host}:{own.port}")
    host, port = job.get(key).decode().rsplit(":", 1)
    return own, host, int(port)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's shard), sharing its storage."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.detach()


class StepDropped(Exception):
    """A replica group failed in this step: no update, and the step is not counted (raised by
    the commit gate of the optimizer step, caught by ``quorum``)."""


class SingleGroup:
    """The job without fault tolerance: one group, every step committed, nothing reduced."""

    participants = 1
    committed = True
    saves_checkpoints = True

    @contextlib.contextmanager
    def quorum(self, next_step: Callable[[], int],
               log_event: Callable[[dict[str, Any]], None]) -> Iterator[int]:
        """Around the attempt of a step: its quorum first (``start_step``: a group behind heals
        here, its step count replaced by a peer's), then the number of the step to attempt
        (``next_step()``, read after healing); a step the groups failed (``StepDropped``) ends
        here, uncounted, its record written through ``log_event``."""
        self.start_step()
        step = next_step()
        try:
            yield step
        except StepDropped:
            log_event({"step": step, **self.record()})

    def start_step(self) -> bool:
        """Ready a step; True when this group's state was replaced (healed) by a peer's."""
        return False

    def sum_over_groups(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def reduce_gradients(self, parts: list[nn.Module], loss: torch.Tensor) -> torch.Tensor:
        """Sum gradients and the loss share over the groups; returns the summed loss share."""
        return loss

    def commit(self) -> bool:
        """The optimizer step's gate: True, or ``StepDropped`` when a group failed the step."""
        return True

    def record(self) -> dict[str, Any]:
        """The step's fields for metrics.jsonl."""
        return {}

    def close(self) -> None:
        pass


class ReplicaGroups(SingleGroup):
    """This group's torchft Manager; ``states`` are the Stateful parts of the trainer's state
    (the checkpoint's: model, optimizer, lr_scheduler, dataloader, train_state) sent to and
    received from a peer when healing. ``step`` is the trainer's (loaded from a checkpoint),
    ``batches_committed`` the replica-group batches committed up to it (torchft's count: the
    participants summed over the committed steps; healing replaces both by the peer's)."""

    def __init__(self, config: JobConfig, states: dict[str, Any], step: int,
                 device: torch.device, batches_committed: int = 0):
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
        from torchft.checkpointing.pg_transport import PGTransport

        ft = config.fault_tolerance
        if "MASTER_PORT" not in os.environ:
            raise ConfigError("[fault_tolerance] enable runs under torchrun (run_train.sh), "
                              "whose store the group's torchft manager meets in")
        self.states = states
        self.replica_id, self.group_size = ft.replica_id, ft.group_size
        self.start_timeout_s = 60.0  # torchft's default quorum timeout
        timeout = datetime.timedelta(milliseconds=ft.process_group_timeout_ms)
        pg_cls = ProcessGroupGloo if ft.process_group == "gloo" else ProcessGroupNCCL
        pg = pg_cls(timeout=timeout)
        host = {"hostname": ft.manager_hostname} if ft.manager_hostname else {}
        self._store, store_addr, store_port = attempt_store(  # rank 0 may arrive late
            ft.manager_hostname, datetime.timedelta(seconds=self.start_timeout_s))
        self.manager = Manager(
            pg=pg, load_state_dict=self._load, state_dict=self._local_state,
            min_replica_size=ft.min_replica_size, use_async_quorum=False, timeout=timeout,
            replica_id=group_name(config),
            checkpoint_transport=PGTransport(pg, timeout, device, state_dict=self._local_state),
            init_sync=False,  # every group initialises the same weights from the same seed
            store_addr=store_addr, store_port=store_port, **host,
        )
        self.manager.load_state_dict({"step": step, "batches_committed": batches_committed})
        self.participants, self.committed, self.healed = 0, True, False
        self.quorum_rank: int | None = None  # this group's rank in the step's quorum
        self.heal_record: dict[str, float] = {}
        self.first_step = True
        self.received_mib = 0.0

    def _local_state(self) -> dict[str, dict[str, Any]]:
        """What a healing peer receives: every state's tensors as this rank's shards (sharing
        storage, so that a receiving peer writes straight into them)."""
        return {name: {key: _local(value) if isinstance(value, torch.Tensor) else value
                       for key, value in state.state_dict().items()}
                for name, state in self.states.items()}

    def _load(self, received: dict[str, dict[str, Any]]) -> None:
        self.received_mib = sum(v.numel() * v.element_size() for part in received.values()
                                for v in part.values() if isinstance(v, torch.Tensor)) / 2**20
        for name, state in self.states.items():
            own = state.state_dict()
            for key, value in received[name].items():
                if isinstance(value, torch.Tensor):
                    _local(own[key]).copy_(value)  # a no-op where received in place
                else:
                    own[key] = value
            state.load_state_dict(own)
        self.healed = True

    def start_step(self) -> bool:
        self.healed, self.heal_record = False, {}
        start = time.perf_counter()
        self.manager.start_quorum()  # synchronous: heals here when behind
        self.participants = self.manager.num_participants()
        if self.first_step and not self.healed and self.participants < self.group_size:
            self._wait_for_all_groups()
        self.first_step = False
        self.quorum_rank = self.manager.participating_rank()
        if self.healed:
            seconds = time.perf_counter() - start
            self.heal_record = {"heal_seconds": seconds, "heal_mib": self.received_mib}
            logger.info(f"replica group {self.replica_id} healed from a peer at step "
                        f"{self.manager.current_step()}: {self.received_mib:.2f} MiB of state "
                        f"on this rank in {seconds:.3f} s (quorum and transfer)")
        return self.healed

    @property
    def saves_checkpoints(self) -> bool:
        """Whether this group writes the checkpoint of the step just trained: rank 0 of the
        step's quorum. torchft 0.2.0's ``participating_rank()`` under a synchronous quorum that
        may heal (``use_async_quorum=False``, ``allow_heal``) is the quorum's ``replica_rank``,
        None only for a spare of a fixed-size quorum (not used here); it stays that of the
        step's quorum until the next ``start_quorum``, which the trainer calls after the save.
        Read at the end of ``start_step`` (``quorum_rank``): the step's state is that quorum's
        commit."""
        return self.quorum_rank == 0

    def _wait_for_all_groups(self, poll_s: float = 0.2) -> None:
        """A job's first step (a fresh start, or a whole-job restart from a checkpoint: no
        live group is ahead to heal from) waits, up to the quorum timeout, for all
        ``group_size`` groups: a group that started first would otherwise train steps alone,
        on data the others then never see, and a restart would not be exact. Later steps,
        and a group rejoining a running job, take whoever is alive."""
        deadline = time.monotonic() + self.start_timeout_s
        while self.participants < self.group_size and time.monotonic() < deadline:
            time.sleep(poll_s)
            self.manager.start_quorum()
            self.participants = self.manager.num_participants()
        if self.participants < self.group_size:
            logger.warning(f"starting with {self.participants} of {self.group_size} replica "
                           f"groups: the others did not join in {self.start_timeout_s:.0f} s")

    def sum_over_groups(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the participating groups (this group's own value when a
        collective failed: the step will not commit)."""
        summed = value.clone()
        self._all_reduce_sum([summed])
        return value if self.manager.errored() else summed

    def reduce_gradients(self, parts: list[nn.Module], loss: torch.Tensor) -> torch.Tensor:
        grads = [_local(p.grad) for part in parts for p in part.parameters()
                 if p.grad is not None]
        summed_loss = loss.detach().clone()
        self._all_reduce_sum([*grads, summed_loss])
        return loss if self.manager.errored() else summed_loss

    def _all_reduce_sum(self, tensors: Iterable[torch.Tensor]) -> None:
        """Sum ``tensors`` in place over the groups, one flat buffer per dtype; on a failure
        they are left as they were."""
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        from torch.distributed import ReduceOp

        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        flats = []
        for group in by_dtype.values():
            flat = _flatten_dense_tensors(group)
            self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
            flats.append((flat, group))
        if self.manager.errored():
            return
        for flat, group in flats:
            for tensor, summed in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
                tensor.copy_(summed)

    def commit(self) -> bool:
        """torchft's ``should_commit``: every rank of this group saw every collective of the
        step succeed (a collective of the group's ranks)."""
        self.committed = self.manager.should_commit()
        if not self.committed:
            raise StepDropped(f"replica group {self.replica_id}: step not committed")
        return True

    def record(self) -> dict[str, Any]:
        return {"participants": self.participants, "committed": self.committed,
                "replica_id": self.replica_id, "quorum_rank": self.quorum_rank,
                **self.heal_record}

    def close(self) -> None:
        self.manager.shutdown(wait=False)


def build(config: JobConfig, states: dict[str, Any], step: int, device: torch.device,
          batches_committed: int = 0) -> SingleGroup:
    """This group's side of the fault-tolerant job, or ``SingleGroup`` without it.

    ``batches_committed`` (torchft's count of replica-group batches committed) is not in the
    checkpoint of its own: the trainer derives it from the checkpoint's ``tokens_seen``, which
    adds one group's share of tokens per participant of each committed step, so
    batches_committed = tokens_seen / (one group's tokens per step), exact while the batch
    shape of the job stays the one it was trained with."""
    if not config.fault_tolerance.enable:
        return SingleGroup()
    return ReplicaGroups(config, states, step, device, batches_committed)

