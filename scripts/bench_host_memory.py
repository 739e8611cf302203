"""What a CPU training step pays for memory the allocator gave back: page faults and system time.

    torchrun --nproc_per_node=2 scripts/bench_host_memory.py [--steps 8] [--section.key=value ...]
    GLIBC_TUNABLES=glibc.malloc.tcache_count=7 torchrun --nproc_per_node=2 \\
        scripts/bench_host_memory.py ...       (glibc's own behaviour, for comparison)

A CPU process keeps the memory it frees (distributed/host_memory.py) unless the user set glibc's
allocator themselves; any ``GLIBC_TUNABLES`` (the one above only restates glibc's default)
leaves glibc as it is. Defaults to the 100M flavor at seq 1024, microbatch 1, FSDP over every
process: 28 MiB units, whose gathered parameters and reduce-scatter buffers FSDP allocates at
every use. Trains ``steps`` steps of the real Trainer on one batch (a fresh copy each, between
barriers) and prints, per step and rank: the wall seconds, the main thread's user and system
CPU seconds and minor page faults, and the whole process's system seconds and minor faults
(gloo's threads included).
"""

from __future__ import annotations

import argparse
import copy
import resource
import sys
import tempfile
import time

import torch.distributed as dist

from torchtitan_like.distributed.host_memory import users_own_allocator
from torchtitan_like.distributed.utils import init_distributed
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args

JOB = ["--job.config_file", "train_configs/debug_model.toml", "--model.flavor", "100M",
       "--training.seq_len", "1024", "--training.local_batch_size", "1"]


def _usage() -> tuple[float, float, int, float, int]:
    thread, process = (resource.getrusage(who) for who in
                       (resource.RUSAGE_THREAD, resource.RUSAGE_SELF))
    return (thread.ru_utime, thread.ru_stime, thread.ru_minflt, process.ru_stime,
            process.ru_minflt)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args, overrides = parser.parse_known_args()
    device = init_distributed()
    with tempfile.TemporaryDirectory(prefix="ttl-host-memory-") as tmp:
        config = parse_args([*JOB, *overrides, "--job.dump_folder", tmp],
                            dist.get_world_size())
        trainer = Trainer(config, device)
        data = iter(trainer.dataloader)
        batches = [next(data) for _ in range(trainer.grad_accumulation_steps)]
        rows = []
        for _ in range(args.steps):
            fresh = copy.deepcopy(batches)
            dist.barrier()
            before, start = _usage(), time.perf_counter()
            trainer.train_step(fresh)
            dist.barrier()
            wall, after = time.perf_counter() - start, _usage()
            rows.append((wall, *(b - a for a, b in zip(before, after, strict=True))))
        trainer.metrics.close()
    freed = "as glibc does by itself" if users_own_allocator() else "kept (host_memory.py)"
    lines = [f"rank {dist.get_rank()}, freed memory {freed}; command: torchrun "
             f"--nproc_per_node={dist.get_world_size()} {' '.join(sys.argv)}",
             "step  wall s  main user s  main sys s  main faults  process sys s  process faults"]
    lines += [f"{i + 1:4d} {w:7.3f} {u:12.3f} {s:11.3f} {f:12.0f} {ps:14.2f} {pf:15.0f}"
              for i, (w, u, s, f, ps, pf) in enumerate(rows)]
    for rank in range(dist.get_world_size()):  # one rank's table at a time
        if rank == dist.get_rank():
            print("\n".join(lines), flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
