"""What do checkpoint checksums cost? A DCP save and load of a state of ``--gib`` GiB, with and
without them (components/checkpoint/checksums.py), in one process.

    python scripts/bench_checksums.py              # a 1 GiB state, 3 rounds
    python scripts/bench_checksums.py --gib 0.25 --rounds 5

The state is fp32 tensors of 16 MiB (the size of a large layer's shard), random. Each round
saves it with DCP's ``FileSystemWriter`` and with the ``ChecksumWriter`` (which sums the bytes
as DCP writes them), then loads each into a fresh state with ``FileSystemReader`` and the
``ChecksumReader`` (which reads each item into memory and checks it). The files stay in the
page cache between save and load, so the load times are those of a warm read (the checks'
share is larger than on a cold read from disk). Also timed: ``zlib.crc32`` alone over the same
bytes in memory, the floor of either side. Prints the median over rounds of each time, and the
checksums' cost in ms per GiB (checked minus plain), with the command.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from torchtitan_like.components.checkpoint.checksums import (
    ChecksumReader,
    ChecksumWriter,
    read_checksums,
)

ITEM_BYTES = 16 * 2**20


def state(gib: float, fill: bool) -> dict[str, torch.Tensor]:
    count = max(1, round(gib * 2**30 / ITEM_BYTES))
    make = torch.randn if fill else torch.empty
    return {f"layer{i}.weight": make(ITEM_BYTES // 4) for i in range(count)}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def one_round(saved: dict[str, torch.Tensor], folder: Path) -> dict[str, float]:
    plain, checked = folder / "plain", folder / "checked"
    for path in (plain, checked):
        shutil.rmtree(path, ignore_errors=True)
    times = {
        "save": timed(lambda: dcp.save(saved, storage_writer=FileSystemWriter(plain),
                                       no_dist=True)),
        "save_checked": timed(lambda: dcp.save(saved, storage_writer=ChecksumWriter(checked),
                                               no_dist=True)),
    }
    sums = read_checksums(checked)
    target = state(len(saved) * ITEM_BYTES / 2**30, fill=False)
    times["load"] = timed(lambda: dcp.load(target, storage_reader=FileSystemReader(plain),
                                           no_dist=True))
    target = state(len(saved) * ITEM_BYTES / 2**30, fill=False)
    times["load_checked"] = timed(lambda: dcp.load(
        target, storage_reader=ChecksumReader(checked, sums), no_dist=True))
    assert all(torch.equal(target[k], saved[k]) for k in saved)
    views = [t.view(torch.uint8).numpy() for t in saved.values()]
    times["crc32"] = timed(lambda: [zlib.crc32(v) for v in views])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the state")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="", help="where to write (default: a temp folder)")
    args = parser.parse_args()
    saved = state(args.gib, fill=True)
    gib = len(saved) * ITEM_BYTES / 2**30
    with tempfile.TemporaryDirectory(dir=args.dir or None) as tmp:
        rounds = [one_round(saved, Path(tmp)) for _ in range(args.rounds)]
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"command: python scripts/bench_checksums.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"state: {gib:.2f} GiB in {len(saved)} fp32 tensors; medians of {args.rounds} "
          f"rounds; torch threads {torch.get_num_threads()}")
    for name, seconds in median.items():
        print(f"  {name:13s} {seconds:7.3f} s  ({seconds / gib * 1000:7.0f} ms/GiB)")
    for side in ("save", "load"):
        extra = median[f"{side}_checked"] - median[side]
        print(f"checksums on {side}: +{extra / gib * 1000:.0f} ms/GiB "
              f"(+{100 * extra / median[side]:.0f}% of the plain {side})")


if __name__ == "__main__":
    main()
