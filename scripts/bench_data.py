"""Data loading at pre-training scale: per-rank cost of prepared shards vs tokenizing on the fly.

    python scripts/bench_data.py                       # a BPE trained here, CPython's docs x 4
    python scripts/bench_data.py --tokenizer byte      # the byte tokenizer
    python scripts/bench_data.py --tokenizer path/to/tokenizer.json --repeat 8

The default tokenizer is a byte-level BPE of 8192 tokens trained on the corpus with the
``tokenizers`` package (no download), as costly per byte as a real one.

1. ``prepare_data`` throughput: the corpus (CPython's documentation text, written ``--repeat``
   times into a JSONL file) tokenized once with 1 and with ``--workers`` processes.
2. Per-rank data loading at dp = 1, 2, 4: the seconds one rank spends getting ``--steps``
   local batches (``--batch`` x ``--seq-len``), and the bytes it reads from the token files,
   for prepared shards (``dataset = "tokenized"``) and for the on-the-fly path (which tokenizes
   the whole stream on every rank and keeps 1/dp of it). The last rank is measured.

Timings are wall-clock on a shared machine: compare the columns, not the absolute figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchtitan_like.components.data.datasets import PackedDataset
from torchtitan_like.components.data.sources import build_document_source, cpython_documents
from torchtitan_like.components.data.tokenized import TokenizedLoader
from torchtitan_like.components.data.tokenizer import build_tokenizer


def write_corpus(path: Path, repeat: int) -> None:
    with path.open("w") as f:
        for _ in range(repeat):
            for text in cpython_documents():
                f.write(json.dumps({"text": text}) + "\n")


def train_bpe(corpus: Path, folder: Path) -> str:
    """A byte-level BPE (8192 tokens) of the corpus, saved as a tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<s>", "</s>"])
    texts = (json.loads(line)["text"] for line in corpus.open())
    tok.train_from_iterator(texts, trainer)
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return str(folder)


def bench_prepare(corpus: Path, tokenizer: str, out: Path, workers: int) -> None:
    """scripts/prepare_data.py itself (its spawned processes import only what it imports)."""
    mib = corpus.stat().st_size / 2**20
    for n in sorted({1, workers}):
        cmd = [sys.executable, str(Path(__file__).parent / "prepare_data.py"), str(corpus),
               "--out", str(out / f"w{n}"), "--tokenizer", tokenizer, "--workers", str(n)]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        seconds = time.perf_counter() - start
        manifest = json.loads((out / f"w{n}" / "manifest.json").read_text())
        tokens = sum(s["tokens"] for s in manifest["splits"].values())
        print(f"prepare_data.py --workers {n}: {mib:.1f} MiB, {tokens:,} tokens in "
              f"{seconds:.2f} s (whole command) = {mib / seconds:.2f} MiB/s, "
              f"{tokens / seconds:,.0f} tokens/s")


def timed(batches, steps: int) -> float:
    start = time.perf_counter()
    for _ in itertools.islice(batches, steps):
        pass
    return time.perf_counter() - start


def bench_loading(corpus: Path, tokenizer: str, prepared: Path, args) -> None:
    print(f"\nper-rank data loading, {args.steps} steps of {args.batch} x {args.seq_len} tokens:")
    print("| dp | prepared: s/step | prepared: bytes read/step | on the fly: s/step |")
    print("|---|---|---|---|")
    for dp in (1, 2, 4):
        rank = dp - 1
        shards = TokenizedLoader({"data": prepared}, {"data": 1.0}, split="train",
                                 seq_len=args.seq_len, local_batch_size=args.batch,
                                 dp_rank=rank, dp_degree=dp, seed=0, shuffle=args.shuffle)
        batches = iter(shards)
        next(batches)  # start-up (first pages, workers) left out
        before = shards.bytes_read()
        shard_s = timed(batches, args.steps) / args.steps
        read = (shards.bytes_read() - before) // args.steps
        fly = PackedDataset(build_document_source("local", str(corpus), "text"),
                            build_tokenizer(tokenizer), seq_len=args.seq_len,
                            local_batch_size=args.batch, dp_rank=rank, dp_degree=dp)
        samples = iter(fly)
        next(samples)
        fly_s = timed(samples, args.steps * args.batch) / args.steps
        print(f"| {dp} | {shard_s * 1e3:.2f} ms | {read:,} | "
              f"{fly_s * 1e3:.1f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default="bpe",
                        help="bpe (trained here), byte, or a tokenizer.json / its folder")
    parser.add_argument("--repeat", type=int, default=4, help="copies of the corpus")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--shuffle", action="store_true", help="shuffle the prepared samples")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        write_corpus(corpus, args.repeat)
        tokenizer = {"bpe": "", "byte": ""}.get(args.tokenizer, args.tokenizer)
        if args.tokenizer == "bpe":
            tokenizer = train_bpe(corpus, Path(tmp) / "bpe")
        print(f"corpus: CPython's docs x {args.repeat}; tokenizer: {args.tokenizer}")
        bench_prepare(corpus, tokenizer, Path(tmp), args.workers)
        bench_loading(corpus, tokenizer, Path(tmp) / "w1", args)


if __name__ == "__main__":
    main()
