"""Process group, determinism, layout-independent weight init, gradient clipping."""

from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.distributed.tensor.parallel
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from torchtitan_like.distributed.host_memory import keep_freed_memory
from torchtitan_like.distributed.tied_weights import plain_name, tied_aliases


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


PROCESS_GROUP_TIMEOUT_S = 300
"""How long a collective may wait before the job fails, unless the job sets [comm] timeouts."""


def _store(timeout: datetime.timedelta) -> dist.Store | None:
    """The store the process group meets in; None for torch's default (``env://``).

    A world of one (plain ``python -m torchtitan_like.train``, or one process under torchrun):
    an in-memory store, so no port is picked and bound later by someone else. Under torchrun
    with the agent's store shared (``TORCHELASTIC_USE_AGENT_STORE``, torch's default): the
    agent bound that store's port before any worker started, so there is no window in which
    another job can take the port (the EADDRINUSE that ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    allows: a port picked free, then bound by rank 0 seconds later). Every attempt of a
    restarted job meets under its own prefix: the shared store outlives the attempts and still
    holds the previous attempt's gloo addresses, which restarted workers would otherwise read
    and fail to connect to
    ("Gloo connectFullMesh failed ... Connection refused"). The prefix is torchrun's restart
    count, which one agent keeps consistently; agents of several nodes count apart (pytorch
    issues 108158, 135712), so run_train.sh turns the sharing off for multi-node jobs.
    """
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return dist.HashStore()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
                            client)


def init_distributed(timeout_s: int = PROCESS_GROUP_TIMEOUT_S) -> torch.device:
    """Join the torchrun job (or a world of one without torchrun): NCCL for CUDA tensors (plus
    gloo for CPU ones) on GPUs, gloo on CPU (CPU builds of torch have no NCCL), where the
    process keeps the memory it frees (host_memory.py). Returns this rank's device."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _store(timeout)
    if "RANK" not in os.environ:  # plain `python -m torchtitan_like.train`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # DCP's writer process reads it
    if device_type() == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        keep_freed_memory()  # before gloo starts its threads (host_memory.py says why)
    if not dist.is_initialized():
        ranks = {} if store is None else {"store": store, "rank": int(os.environ["RANK"]),
                                          "world_size": int(os.environ["WORLD_SIZE"])}
        dist.init_process_group(backend, timeout=timeout, **ranks)
    return device


def mesh_groups(meshes: Iterable[DeviceMesh]) -> list[dist.ProcessGroup]:
    """The process groups behind every dim of ``meshes``, each once."""
    groups: dict[int, dist.ProcessGroup] = {}
    for mesh in meshes:
        for dim in range(mesh.ndim):
            group = mesh.get_group(dim)
            groups.setdefault(id(group), group)
    return list(groups.values())


def set_timeout(timeout_s: int, groups: Iterable[dist.ProcessGroup | None]) -> None:
    """Give ``groups`` (None: the world group) a collective timeout of ``timeout_s``."""
    timeout = datetime.timedelta(seconds=timeout_s)
    for group in groups:
        dist.distributed_c10d._set_pg_timeout(timeout, group)


def follow_world_timeout(meshes: Iterable[DeviceMesh],
                         timeout_s: int = PROCESS_GROUP_TIMEOUT_S) -> None:
    """Give every process group of ``meshes`` the world group's timeout. DeviceMesh creates
    its subgroups with the backend's default (NCCL 10 min, gloo 30 min), so without this a hang
    in a TP, FSDP or PP collective would outwait the timeout the job asked for."""
    set_timeout(timeout_s, mesh_groups(meshes))


def set_determinism(seed: int, deterministic: bool) -> None:
    """Same seed on every rank; with ``deterministic`` only deterministic kernels run."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(deterministic, warn_only=False)
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@torch.no_grad()
def init_weights(
    model_parts: list[nn.Module],
    build_reference: Callable[[], nn.Module],
    seed: int,
    stage_ids: Sequence[int] | None = None,
) -> None:
    """Initialise sharded parts so that their weights equal a single-device init with ``seed``.

    Every part runs its own ``init_weights`` (buffers, and parameters on GPUs); pipeline stages
    (``stage_ids`` given) are seeded with ``seed + stage`` so that no two stages draw the same
    numbers. That equals the single-device init only without PP and where DTensor randomness
    is layout-independent (GPUs). Otherwise, on a CPU, the parameters are then overwritten
    from one full reference model initialised on this CPU: affordable for the model sizes a CPU
    trains, and it makes every layout start from the same weights as the one-process run. (A
    pipelined GPU model keeps its per-stage init: a full reference of a model that needs PP
    would not fit in host memory.)
    """
    with warnings.catch_warnings():  # the CPU case below is the one this warning is about
        warnings.filterwarnings("ignore", "DTensor random operators may not have complete")
        for part, stage in zip(model_parts, stage_ids or [0] * len(model_parts), strict=True):
            torch.manual_seed(seed + stage)
            part.init_weights()
    parameters = [p for part in model_parts for p in part.parameters()]
    # DTensor's random ops give each shard its slice of the unsharded random stream only with
    # an offset-based (Philox) generator; on CPU every shard draws the same numbers.
    sharded_or_split = stage_ids is not None or any(isinstance(p, DTensor) for p in parameters)
    if not (sharded_or_split and all(p.device.type == "cpu" for p in parameters)):
        return
    with torch.device("cpu"):
        reference = build_reference()
    torch.manual_seed(seed)
    reference.init_weights()
    full = reference.state_dict()
    for part in model_parts:  # a pipeline stage takes the entries of the modules it kept
        further = {plain_name(name) for name in tied_aliases(part)}  # one Parameter, set once
        own = {k: full[k] for k in get_model_state_dict(part) if k not in further}
        set_model_state_dict(part, own, options=StateDictOptions(full_state_dict=True,
                                                                 strict=not further))


def train_context(
    loss_parallel: bool,
    context_parallel: Callable[[torch.Tensor, torch.Tensor],
                               contextlib.AbstractContextManager] | None = None,
) -> Callable[[torch.Tensor, torch.Tensor], contextlib.AbstractContextManager]:
    """The context every forward + backward (and validation forward) runs in, built once and
    entered per microbatch with its ``(inputs, labels)``.

    Context parallel (distributed/context_parallel.py) shards the microbatch along the sequence
    and swaps attention for ring attention, for forward and backward. Loss parallel
    (vocab-sharded cross-entropy under TP) must cover the loss's forward and its backward.
    Further job-wide contexts join here, so the trainer enters exactly one.
    """

    @contextlib.contextmanager
    def context(inputs: torch.Tensor, labels: torch.Tensor):
        with contextlib.ExitStack() as stack:
            if context_parallel is not None:
                stack.enter_context(context_parallel(inputs, labels))
            if loss_parallel:
                stack.enter_context(torch.distributed.tensor.parallel.loss_parallel())
            yield

    return context


def local_numel(parameters: Iterable[nn.Parameter]) -> int:
    """Elements this rank stores (a DTensor's ``numel()`` is that of the full tensor)."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in parameters)


def maybe_autocast(fsdp_enabled: bool, param_dtype: torch.dtype, device: torch.device):
    """Mixed precision without FSDP: autocast (FSDP casts its all-gathered parameters itself)."""
    if fsdp_enabled or param_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=param_dtype)


def clip_grad_norm_(
    parameters: Iterable[nn.Parameter], max_norm: float, pp_mesh: DeviceMesh | None = None,
    uncounted: Collection[nn.Parameter] = (),
) -> torch.Tensor:
    """Total gradient 2-norm over all ranks, clipped to ``max_norm`` when it is > 0.

    DTensor gradients (FSDP/TP shards) yield the norm of the full gradient after one
    all-reduce per mesh: dense and expert-parallel weights live on different meshes (one op
    cannot mix them), so each mesh's squared norm is computed apart and the squares added.
    Under pipeline parallelism each stage holds different parameters, so the squared norms of
    the stages are summed over the ``pp`` mesh as well. ``uncounted`` parameters (copies of a
    weight tied across stages, distributed/tied_weights.py) are clipped but left out of the
    norm, which counts their weight once.
    """
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    skipped = {id(p) for p in uncounted}
    by_mesh: dict[DeviceMesh | None, list[torch.Tensor]] = {}
    for grad in (p.grad for p in parameters if p.grad is not None and id(p) not in skipped):
        by_mesh.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
    norms = [torch.nn.utils.get_total_norm(group, foreach=True) for group in by_mesh.values()]
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms] or [torch.zeros(())]
    total = norms[0] if len(norms) == 1 else torch.stack(norms).square().sum().sqrt()
    if pp_mesh is not None and pp_mesh.size() > 1:
        total = total**2
        dist.all_reduce(total, group=pp_mesh.get_group())
        total = total.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(grads, max_norm, total, foreach=True)
    return total


def all_reduce_sum(value: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Sum a tensor over one (possibly flattened) mesh dim; a no-op on a size-1 dim."""
    if mesh.size() > 1:
        value = value.clone()
        dist.all_reduce(value, group=mesh.get_group())
    return value
