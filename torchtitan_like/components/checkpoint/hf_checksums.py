"""HuggingFace safetensors files that prove their bytes.

Our exports (``save_hf``: ``last_save_in_hf``, scripts/convert_hf.py) put the CRC-32 of every
tensor's bytes into the file's own header metadata (``__metadata__["torchtitan_like.crc32"]``,
a JSON object; HuggingFace's loaders ignore unknown metadata), computed on the tensors in
memory before they are written. Every load of a safetensors folder by the platform checks
first that each file's header parses and its data is all there (an empty or truncated file is
one line, before DCP or safetensors reads it), then the CRC of every tensor that has one. A
folder written elsewhere (the Hub) has no CRCs: its headers and sizes are checked, its bytes
loaded unverified, said in one log line.

In a job (``initial_load_in_hf``) the ranks share the work: rank r checks every file's header
and the CRCs of the tensors r, r + world, ... (in name order), so the folder is read once
whatever the world size, and nothing is loaded from a damaged one. One process
(``load_verified``) checks each file's CRCs on the bytes it then loads.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import torch

from torchtitan_like.components.checkpoint.checksums import ChecksumMismatch

CRC_KEY = "torchtitan_like.crc32"


def tensor_crc(tensor: torch.Tensor) -> int:
    """CRC-32 of a (CPU, contiguous) tensor's bytes as safetensors stores them."""
    return zlib.crc32(tensor.reshape(-1).view(torch.uint8).numpy())


def checksum_metadata(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """The header metadata entry that carries ``tensors``' CRC-32s."""
    return {CRC_KEY: json.dumps({name: tensor_crc(t) for name, t in tensors.items()})}


class Header:
    """A safetensors file's header: where each tensor's bytes are, and their CRCs if any."""

    def __init__(self, file: Path):
        self.file = file
        size = file.stat().st_size
        with file.open("rb") as f:
            start = f.read(8)
            if len(start) < 8:
                raise ChecksumMismatch(f"{file.name} is truncated ({size} bytes: no header)")
            (length,) = struct.unpack("<Q", start)
            if 8 + length > size:
                raise ChecksumMismatch(f"{file.name} is truncated ({size} bytes, its header "
                                       f"alone takes {8 + length})")
            try:
                header = json.loads(f.read(length))
                meta = header.pop("__metadata__", None) or {}
                self.crcs = {k: int(v) for k, v in json.loads(meta[CRC_KEY]).items()} \
                    if CRC_KEY in meta else None
                self.ranges = {name: tuple(info["data_offsets"]) for name, info in header.items()}
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ChecksumMismatch(f"{file.name}: its header is damaged ({e})") from e
        self.data_start = 8 + length
        end = max((stop for _, stop in self.ranges.values()), default=0)
        if self.data_start + end > size:
            raise ChecksumMismatch(f"{file.name} is truncated ({size} bytes, "
                                   f"{self.data_start + end} needed)")
        if self.crcs is not None and set(self.crcs) != set(self.ranges):
            raise ChecksumMismatch(f"{file.name}: its checksums do not name its tensors")

    def check(self, name: str, data: Any) -> None:
        """``data`` (the bytes of tensor ``name``) against its CRC, if it has one."""
        if self.crcs is not None and zlib.crc32(data) != self.crcs[name]:
            start, stop = self.ranges[name]
            raise ChecksumMismatch(f"{self.file.name} bytes {self.data_start + start}-"
                                   f"{self.data_start + stop} ({name}) are not the bytes "
                                   "saved: their CRC-32 differs")


def check_folder(folder: Path, rank: int = 0, world: int = 1) -> bool:
    """Check a safetensors folder (module docstring): every header, and this rank's share of
    the tensors' CRCs. True when the files carry CRCs; ChecksumMismatch naming the damage."""
    headers = [Header(file) for file in sorted(folder.glob("*.safetensors"))]
    tensors = sorted((h.file.name, name) for h in headers for name in h.ranges)
    by_file = {h.file.name: h for h in headers}
    for file_name, name in tensors[rank::world]:
        header = by_file[file_name]
        if header.crcs is None:
            continue
        start, stop = header.ranges[name]
        with header.file.open("rb") as f:
            f.seek(header.data_start + start)
            header.check(name, f.read(stop - start))
    return bool(headers) and all(h.crcs is not None for h in headers)


def load_verified(file: Path) -> tuple[dict[str, torch.Tensor], bool]:
    """The tensors of one safetensors file, its header and CRCs checked on the bytes loaded,
    and whether it carries CRCs."""
    from safetensors.torch import load

    header = Header(file)
    raw = file.read_bytes()
    data = memoryview(raw)
    for name, (start, stop) in header.ranges.items():
        header.check(name, data[header.data_start + start: header.data_start + stop])
    return load(raw), header.crcs is not None
