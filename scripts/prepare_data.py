"""Tokenize a corpus once into memory-mapped token shards that training reads by offset.

    python scripts/prepare_data.py corpus/ more.jsonl --tokenizer path/to/tokenizer.json \\
        --out data/web
    # then train with: --training.dataset tokenized --training.dataset_path data/web

Inputs are .txt/.jsonl/.json (JSON lines)/.parquet files or folders searched for them (read
in the order the on-the-fly path reads them). ``--tokenizer`` is what ``[model]
tokenizer_path`` will be at training time (empty: the byte tokenizer). Re-running with the
same inputs is a no-op. See docs/data.md for the format, mixtures and resume.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchtitan_like.components.data.prepare import prepare
from torchtitan_like.components.data.sources import DataError
from torchtitan_like.config.errors import ConfigError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path,
                        help=".txt/.jsonl/.json/.parquet files or folders")
    parser.add_argument("--out", type=Path, required=True, help="the prepared folder to write")
    parser.add_argument("--tokenizer", default="",
                        help="tokenizer.json (or its folder), as [model] tokenizer_path; "
                             "default: the byte tokenizer")
    parser.add_argument("--text-field", default="text",
                        help="JSON-lines field / Parquet column holding the text (default: text)")
    parser.add_argument("--holdout-every", type=int, default=50,
                        help="every Nth document goes to the validation split; 0 = none "
                             "(default 50, as [training] holdout_every)")
    parser.add_argument("--decode-errors", choices=("strict", "replace"), default="strict",
                        help="bytes that are not UTF-8: stop naming file and line (strict, the "
                             "default), or read them as U+FFFD (as [training] decode_errors)")
    parser.add_argument("--workers", type=int, default=None,
                        help="tokenizing processes (default: os.cpu_count())")
    args = parser.parse_args(argv)
    try:
        result = prepare(args.inputs, args.tokenizer, args.out, text_field=args.text_field,
                         holdout_every=args.holdout_every, workers=args.workers,
                         decode_errors=args.decode_errors)
    except (DataError, ConfigError, OSError) as e:
        print(f"prepare_data: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    splits = result.manifest["splits"]
    what = "up to date, nothing to do" if result.skipped else f"written in {result.seconds:.1f} s"
    print(f"{args.out}: {what}; " + "; ".join(
        f"{split} {c['documents']:,} documents, {c['tokens']:,} tokens" for split, c in
        splits.items()) + f" ({result.manifest['dtype']})")


if __name__ == "__main__":
    main()
